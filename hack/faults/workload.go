package main

import (
	"cmp"
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"github.com/metabus/metabus/internal/testing/kubeenv"
	"github.com/metabus/metabus/pkg/bus"
)

const (
	ns          = "faults"
	ctrlName    = "faults"
	parentLabel = "faults.metabus.dev/parent"
	finalizer   = "metacontroller.io/compositecontroller-" + ctrlName
)

var (
	parentGVR = schema.GroupVersionResource{Group: "faults.metabus.dev", Version: "v1", Resource: "churns"}
	ccGVR     = schema.GroupVersionResource{Group: "metacontroller.k8s.io", Version: "v1alpha1", Resource: "compositecontrollers"}
	cmGVR     = schema.GroupVersionResource{Version: "v1", Resource: "configmaps"}
)

// parentCRD is the parent type: a namespaced Churn with the status
// subresource.
var parentCRD = kubeenv.FreeformCRD("faults.metabus.dev", "Churn", "churns")

// compositeController is the controller under test: Churns with one InPlace
// ConfigMap each, a sync hook and (optionally) a finalize hook, both with a
// short timeout, under upstream's calling contract unless suppressEchoes
// opts it into echo suppression (then the appliers broadcast Applied notes,
// which the order check reads too).
func compositeController(url string, timeout time.Duration, finalize, suppressEchoes bool) *unstructured.Unstructured {
	webhook := map[string]any{"webhook": map[string]any{"url": url, "timeout": timeout.String()}}
	hooks := map[string]any{"sync": webhook}
	if finalize {
		hooks["finalize"] = webhook
	}
	cc := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "metacontroller.k8s.io/v1alpha1",
		"kind":       "CompositeController",
		"metadata":   map[string]any{"name": ctrlName},
		"spec": map[string]any{
			"generateSelector": true,
			"parentResource":   map[string]any{"apiVersion": "faults.metabus.dev/v1", "resource": "churns"},
			"childResources": []any{map[string]any{
				"apiVersion":     "v1",
				"resource":       "configmaps",
				"updateStrategy": map[string]any{"method": "InPlace"},
			}},
			"hooks": hooks,
		},
	}}
	if suppressEchoes {
		// The hook's answer is a fixpoint of its own writes.
		cc.SetAnnotations(map[string]string{bus.SuppressEchoesAnnotation: "true"})
	}
	return cc
}

func parentName(i int) string { return fmt.Sprintf("p-%05d", i) }

// workload creates, updates, deletes and recreates parents.
type workload struct {
	dyn   dynamic.Interface
	names []string
	logf  func(string, ...any)

	locks []sync.Mutex // one per name: one operation on a name at a time
	gen   []atomic.Int64

	creates, updates, deletes, recreates, failed atomic.Int64
	lastOp                                       atomic.Int64 // unix nanos of the last successful write
}

func newWorkload(dyn dynamic.Interface, n int, logf func(string, ...any)) *workload {
	w := &workload{dyn: dyn, logf: logf, locks: make([]sync.Mutex, n), gen: make([]atomic.Int64, n)}
	for i := range n {
		w.names = append(w.names, parentName(i))
	}
	return w
}

func (w *workload) touched() { w.lastOp.Store(time.Now().UnixNano()) }

func value(gen int64) string { return fmt.Sprintf("v%d-%d", gen, rand.IntN(1e6)) }

// create creates parent i at its next gen. AlreadyExists (the previous
// incarnation is still being finalized) and transient errors are retried
// until ctx ends.
func (w *workload) create(ctx context.Context, i int) error {
	g := w.gen[i].Add(1)
	obj := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "faults.metabus.dev/v1",
		"kind":       "Churn",
		"metadata":   map[string]any{"name": w.names[i]},
		"spec":       map[string]any{"gen": g, "value": value(g)},
	}}
	return retryUntil(ctx, func(ctx context.Context) error {
		_, err := w.dyn.Resource(parentGVR).Namespace(ns).Create(ctx, obj, metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) && w.ours(ctx, i, g) {
			// An earlier attempt was stored but its answer lost (an API
			// server restart): the parent is this create's.
			err = nil
		}
		if err == nil {
			w.creates.Add(1)
			w.touched()
		}
		return err
	})
}

// ours reports whether parent i exists at gen g and is not being deleted:
// then a create that met AlreadyExists had in fact succeeded.
func (w *workload) ours(ctx context.Context, i int, g int64) bool {
	p, err := w.dyn.Resource(parentGVR).Namespace(ns).Get(ctx, w.names[i], metav1.GetOptions{})
	if err != nil || p.GetDeletionTimestamp() != nil {
		return false
	}
	gen, _, _ := unstructured.NestedInt64(p.Object, "spec", "gen")
	return gen == g
}

// update moves parent i to its next gen and a new value. NotFound means it
// is gone: nothing to do.
func (w *workload) update(ctx context.Context, i int) error {
	g := w.gen[i].Add(1)
	patch := fmt.Sprintf(`{"spec":{"gen":%d,"value":%q}}`, g, value(g))
	return retryUntil(ctx, func(ctx context.Context) error {
		_, err := w.dyn.Resource(parentGVR).Namespace(ns).Patch(ctx, w.names[i], types.MergePatchType, []byte(patch), metav1.PatchOptions{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		if err == nil {
			w.updates.Add(1)
			w.touched()
		}
		return err
	})
}

// remove deletes parent i (foreground is not needed: the garbage collector
// removes its child once it is gone).
func (w *workload) remove(ctx context.Context, i int) error {
	return retryUntil(ctx, func(ctx context.Context) error {
		err := w.dyn.Resource(parentGVR).Namespace(ns).Delete(ctx, w.names[i], metav1.DeleteOptions{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		if err == nil {
			w.deletes.Add(1)
			w.touched()
		}
		return err
	})
}

// retryUntil calls f until it succeeds or ctx ends, waiting a second after
// each failure (the API server may be restarting).
func retryUntil(ctx context.Context, f func(context.Context) error) error {
	for {
		cctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		err := f(cctx)
		cancel()
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w (last error: %v)", ctx.Err(), err)
		case <-time.After(time.Second):
		}
	}
}

// createAll creates every parent, from 50 concurrent clients.
func (w *workload) createAll(ctx context.Context) error {
	work := make(chan int)
	var wg sync.WaitGroup
	var firstErr atomic.Value
	for range 50 {
		wg.Go(func() {
			for i := range work {
				if err := w.create(ctx, i); err != nil {
					firstErr.CompareAndSwap(nil, err)
				}
			}
		})
	}
	for i := range w.names {
		work <- i
	}
	close(work)
	wg.Wait()
	if err, _ := firstErr.Load().(error); err != nil {
		return err
	}
	return nil
}

// churn runs random operations at rate per second until ctx ends: 70%
// spec updates, 15% deletes followed by a recreate under the same name
// after up to 3s, 15% deletes (a later operation on a deleted name creates
// it again). It returns once every started operation finished; a recreate
// still waiting for its predecessor's finalization gets until opCtx ends.
func (w *workload) churn(ctx, opCtx context.Context, rate float64) {
	var (
		wg     sync.WaitGroup
		mu     sync.Mutex
		absent = map[int]bool{}
	)
	sem := make(chan struct{}, 64)
	tick := time.NewTicker(time.Duration(float64(time.Second) / rate))
	defer tick.Stop()
	defer wg.Wait()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		i := rand.IntN(len(w.names))
		if !w.locks[i].TryLock() {
			continue
		}
		select {
		case sem <- struct{}{}:
		default:
			w.locks[i].Unlock()
			continue
		}
		wg.Go(func() {
			defer func() { <-sem; w.locks[i].Unlock() }()
			mu.Lock()
			gone := absent[i]
			mu.Unlock()
			var err error
			switch p := rand.IntN(100); {
			case gone:
				if err = w.create(opCtx, i); err == nil {
					mu.Lock()
					delete(absent, i)
					mu.Unlock()
				}
			case p < 70:
				err = w.update(opCtx, i)
			case p < 85:
				if err = w.remove(opCtx, i); err == nil {
					time.Sleep(time.Duration(rand.IntN(3000)) * time.Millisecond)
					if err = w.create(opCtx, i); err == nil {
						w.recreates.Add(1)
					} else {
						mu.Lock()
						absent[i] = true
						mu.Unlock()
					}
				}
			default:
				if err = w.remove(opCtx, i); err == nil {
					mu.Lock()
					absent[i] = true
					mu.Unlock()
				}
			}
			if err != nil {
				w.failed.Add(1)
				w.logf("churn: %s: %v", w.names[i], err)
			}
		})
	}
}

// childTracker watches the workload's ConfigMaps and parents. It
// remembers, for each parent UID named by a controllerRef, every ConfigMap
// UID it ever controlled: more than one means a child was replaced
// (deleted and created again) although InPlace updates never need that.
// And it follows, per parent UID, the gen that its child's data and its
// status's observedGen show, in the order the API server stored them (a
// watch delivers an object's versions in resourceVersion order): a gen
// going back means an older desired state was applied after a newer one.
type childTracker struct {
	factory informers.SharedInformerFactory
	parents dynamicinformer.DynamicSharedInformerFactory
	stop    chan struct{}

	mu       sync.Mutex
	children map[types.UID]map[types.UID]*childLife // parent UID -> child UID -> its life
	// deleting is when each parent UID was first seen being deleted.
	deleting map[types.UID]time.Time
	// gens is the last gen seen per parent UID, in the child and in the
	// status; regressions are the gens that went back.
	gens        map[genKey]genSeen
	regressions []string
	observed    int
}

// childLife is what the tracker saw of one ConfigMap: enough to tell, for
// a parent that controlled more than one, which write made and which
// removed each (the data gen names the answer that created it).
type childLife struct {
	parent  string // the parent's name
	created time.Time
	gen     string // data.gen when first seen
	rv      string // resourceVersion when first seen
	deleted time.Time
}

// genKey is where a parent's gen shows: "child", "status" (the hook's
// observedGen: the spec gen it answered) or "observedGeneration" (the
// parent generation the applied answer was computed from, which the
// applier writes with every status; the only one a finalize answer shows).
type genKey struct {
	parent types.UID
	where  string
}

type genSeen struct {
	gen int64
	rv  string
}

func startChildTracker(cs kubernetes.Interface, dyn dynamic.Interface) (*childTracker, error) {
	t := &childTracker{stop: make(chan struct{}), children: map[types.UID]map[types.UID]*childLife{},
		deleting: map[types.UID]time.Time{}, gens: map[genKey]genSeen{}}
	t.factory = informers.NewSharedInformerFactoryWithOptions(cs, 0, informers.WithNamespace(ns),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = parentLabel }))
	inf := t.factory.Core().V1().ConfigMaps().Informer()
	record := func(obj any) {
		cm, ref := controlledChild(obj)
		if ref == nil {
			return
		}
		t.mu.Lock()
		defer t.mu.Unlock()
		m := t.children[ref.UID]
		if m == nil {
			m = map[types.UID]*childLife{}
			t.children[ref.UID] = m
		}
		if m[cm.UID] == nil {
			m[cm.UID] = &childLife{parent: ref.Name, created: cm.CreationTimestamp.Time, gen: cm.Data["gen"], rv: cm.ResourceVersion}
		}
		if gen, err := strconv.ParseInt(cm.Data["gen"], 10, 64); err == nil {
			t.sawGen(genKey{ref.UID, "child"}, ref.Name, gen, cm.ResourceVersion)
		}
	}
	gone := func(obj any) {
		if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
			obj = d.Obj
		}
		cm, ref := controlledChild(obj)
		if ref == nil {
			return
		}
		t.mu.Lock()
		defer t.mu.Unlock()
		if c := t.children[ref.UID][cm.UID]; c != nil {
			c.deleted = time.Now()
		}
	}
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    record,
		UpdateFunc: func(_, obj any) { record(obj) },
		DeleteFunc: gone,
	}); err != nil {
		return nil, err
	}
	t.parents = dynamicinformer.NewFilteredDynamicSharedInformerFactory(dyn, 0, ns, nil)
	status := func(obj any) {
		p, ok := obj.(*unstructured.Unstructured)
		if !ok {
			return
		}
		t.mu.Lock()
		defer t.mu.Unlock()
		if ts := p.GetDeletionTimestamp(); ts != nil {
			if _, seen := t.deleting[p.GetUID()]; !seen {
				t.deleting[p.GetUID()] = ts.Time
			}
		}
		if gen, found, err := unstructured.NestedInt64(p.Object, "status", "observedGen"); err == nil && found {
			t.sawGen(genKey{p.GetUID(), "status"}, p.GetName(), gen, p.GetResourceVersion())
		}
		if gen, found, err := unstructured.NestedInt64(p.Object, "status", "observedGeneration"); err == nil && found {
			t.sawGen(genKey{p.GetUID(), "observedGeneration"}, p.GetName(), gen, p.GetResourceVersion())
		}
	}
	if _, err := t.parents.ForResource(parentGVR).Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    status,
		UpdateFunc: func(_, obj any) { status(obj) },
	}); err != nil {
		return nil, err
	}
	t.factory.Start(t.stop)
	t.parents.Start(t.stop)
	t.factory.WaitForCacheSync(t.stop)
	t.parents.WaitForCacheSync(t.stop)
	return t, nil
}

// controlledChild is an informer's ConfigMap and its controllerRef (nil
// for anything else, or a ConfigMap without one).
func controlledChild(obj any) (*corev1.ConfigMap, *metav1.OwnerReference) {
	cm, ok := obj.(*corev1.ConfigMap)
	if !ok {
		return nil, nil
	}
	return cm, metav1.GetControllerOf(cm)
}

// sawGen records a gen shown at resourceVersion rv (t.mu held).
func (t *childTracker) sawGen(k genKey, name string, gen int64, rv string) {
	t.observed++
	last, ok := t.gens[k]
	if ok && gen < last.gen {
		t.regressions = append(t.regressions, fmt.Sprintf("%s (uid %s): the %s showed gen %d at resourceVersion %s, after gen %d at %s",
			name, k.parent, k.where, gen, rv, last.gen, last.rv))
	}
	if !ok || gen >= last.gen {
		t.gens[k] = genSeen{gen, rv}
	}
}

// genRegressions returns the gens that went back, and how many versions
// were looked at.
func (t *childTracker) genRegressions() ([]string, int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return append([]string(nil), t.regressions...), t.observed
}

func (t *childTracker) close() {
	close(t.stop)
	t.factory.Shutdown()
	t.parents.Shutdown()
}

// replaced returns, for each parent incarnation that controlled more than
// one ConfigMap over the run, "name (uid): n children" and each child's
// life: when it was created and with which gen (the answer that wrote
// it), when it was seen deleted, and when the parent's deletion began.
func (t *childTracker) replaced() []string {
	t.mu.Lock()
	defer t.mu.Unlock()
	var out []string
	for puid, m := range t.children {
		if len(m) < 2 {
			continue
		}
		uids := make([]types.UID, 0, len(m))
		for uid := range m {
			uids = append(uids, uid)
		}
		// Creation times have whole seconds: resourceVersions break ties.
		slices.SortFunc(uids, func(a, b types.UID) int {
			if c := m[a].created.Compare(m[b].created); c != 0 {
				return c
			}
			ra, _ := strconv.ParseInt(m[a].rv, 10, 64)
			rb, _ := strconv.ParseInt(m[b].rv, 10, 64)
			return cmp.Compare(ra, rb)
		})
		var lives []string
		for _, uid := range uids {
			c := m[uid]
			life := fmt.Sprintf("%s created %s with gen %s (resourceVersion %s)", uid, clock(c.created), c.gen, c.rv)
			if !c.deleted.IsZero() {
				life += ", deleted by " + clock(c.deleted)
			}
			lives = append(lives, life)
		}
		line := fmt.Sprintf("%s (uid %s) controlled %d different ConfigMaps over its life: %s", m[uids[0]].parent, puid, len(m), strings.Join(lives, "; "))
		if ts, ok := t.deleting[puid]; ok {
			line += "; the parent was being deleted from " + clock(ts)
		}
		out = append(out, line)
	}
	return out
}

// clock is a time of day as the suite's violations show it.
func clock(t time.Time) string { return t.UTC().Format("15:04:05.000") }
