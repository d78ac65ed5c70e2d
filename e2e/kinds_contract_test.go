package e2e

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"

	"github.com/metabus/metabus/internal/allinone"
)

// The contract tests: behaviour every controller kind owes its users the
// same way (customize and related objects, finalizers, resyncs). Each
// scenario is written once and run for every row of controllerKinds, so a
// kind added to the product is held to the same contract by adding a row
// here, and the per-kind copies these tests replace cannot drift apart.
//
// Every row drives the same shape: Widgets selected by a label are the
// kind's parents (a DecoratorController's targets), and ConfigMaps
// labelled app=<parent name> are the objects it owns (children,
// attachments). What differs per kind is only how a spec says that, where
// a hook request carries the parent and the owned objects, and where a
// response puts them.

// kindFixture is one controller kind as the contract tests drive it.
type kindFixture struct {
	kind string
	// spec is a controller spec whose parents are the Widgets matching
	// the label selector sel, which own ConfigMaps (updated InPlace), with
	// hooks. Fields every kind shares (resyncPeriodSeconds) are added by
	// the tests.
	spec func(sel, hooks map[string]any) map[string]any
	// finalizer is what a controller of this kind named name puts on its
	// parents when it has a finalize hook.
	finalizer func(name string) string
	// createParent creates the parent w in ns. A kind whose hook is only
	// called for some other object as well (a MapController's inputs)
	// creates that here too.
	createParent func(t *testing.T, ns string, w *unstructured.Unstructured)
	// optOut makes the parent name in ns stop matching the controller's
	// selector; optIn makes it match again.
	optOut, optIn func(ctx context.Context, ns, name string) error
	// parent is the object a sync or finalize request is about.
	parent func(req map[string]any) *unstructured.Unstructured
	// owned is the request's observed ConfigMaps, by key.
	owned func(req map[string]any) map[string]any
	// respond is a sync or finalize response desiring objs as the owned
	// objects, and nothing else.
	respond func(objs []any) map[string]any
}

// controllerKinds is the contract's table, one row per kind. A
// MapController row fills the same fields from its inputs and outputs.
var controllerKinds = []kindFixture{
	{
		kind: compositeKind,
		spec: func(sel, hooks map[string]any) map[string]any {
			return map[string]any{
				"parentResource": map[string]any{"apiVersion": "test.metabus.dev/v1", "resource": "widgets", "labelSelector": sel},
				"childResources": []any{map[string]any{"apiVersion": "v1", "resource": "configmaps", "updateStrategy": map[string]any{"method": "InPlace"}}},
				"hooks":          hooks,
			}
		},
		finalizer:    func(name string) string { return "metacontroller.io/compositecontroller-" + name },
		createParent: createWidget,
		optOut:       dropLabel,
		optIn:        setLabel,
		parent:       requestObject("parent"),
		owned:        requestOwned("children"),
		respond:      func(objs []any) map[string]any { return map[string]any{"children": nonNil(objs)} },
	},
	{
		kind: decoratorKind,
		spec: func(sel, hooks map[string]any) map[string]any {
			return map[string]any{
				"resources":   []any{map[string]any{"apiVersion": "test.metabus.dev/v1", "resource": "widgets", "labelSelector": sel}},
				"attachments": []any{map[string]any{"apiVersion": "v1", "resource": "configmaps", "updateStrategy": map[string]any{"method": "InPlace"}}},
				"hooks":       hooks,
			}
		},
		finalizer:    decoratorFinalizer,
		createParent: createWidget,
		optOut:       dropLabel,
		optIn:        setLabel,
		parent:       requestObject("object"),
		owned:        requestOwned("attachments"),
		respond:      func(objs []any) map[string]any { return map[string]any{"attachments": nonNil(objs)} },
	},
}

func createWidget(t *testing.T, ns string, w *unstructured.Unstructured) {
	t.Helper()
	if _, err := dyn.Resource(widgetsGVR).Namespace(ns).Create(context.Background(), w, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create widget %s: %v", w.GetName(), err)
	}
}

// dropLabel and setLabel opt a Widget out of and back into the
// contract's selector (contractSelector).
func dropLabel(ctx context.Context, ns, name string) error {
	_, err := dyn.Resource(widgetsGVR).Namespace(ns).Patch(ctx, name, types.MergePatchType,
		[]byte(fmt.Sprintf(`{"metadata":{"labels":{%q:null}}}`, contractLabel)), metav1.PatchOptions{})
	return err
}

func setLabel(ctx context.Context, ns, name string) error {
	_, err := dyn.Resource(widgetsGVR).Namespace(ns).Patch(ctx, name, types.MergePatchType,
		[]byte(fmt.Sprintf(`{"metadata":{"labels":{%q:%q}}}`, contractLabel, ns)), metav1.PatchOptions{})
	return err
}

func requestObject(key string) func(map[string]any) *unstructured.Unstructured {
	return func(req map[string]any) *unstructured.Unstructured {
		obj, _ := req[key].(map[string]any)
		return &unstructured.Unstructured{Object: obj}
	}
}

func requestOwned(key string) func(map[string]any) map[string]any {
	return func(req map[string]any) map[string]any {
		all, _ := req[key].(map[string]any)
		cms, _ := all["ConfigMap.v1"].(map[string]any)
		return cms
	}
}

// nonNil keeps "no owned objects" an empty list rather than null.
func nonNil(objs []any) []any {
	if objs == nil {
		return []any{}
	}
	return objs
}

// ownedConfigMap is the owned object the contract's hooks desire.
func ownedConfigMap(name, app string, data map[string]any) map[string]any {
	cm := map[string]any{
		"apiVersion": "v1", "kind": "ConfigMap",
		"metadata": map[string]any{"name": name, "labels": map[string]any{"app": app}},
	}
	if data != nil {
		cm["data"] = data
	}
	return cm
}

// contractLabel is the label the contract's controllers select their
// parents by: one value per test namespace, so that no controller of one
// test sees another test's Widgets.
const contractLabel = "e2e.metabus.dev/contract"

// contractWidget is a Widget selected by the contract's controllers in ns.
func contractWidget(ns, name string, items []string) *unstructured.Unstructured {
	w := newWidget(name, items, 1)
	w.SetLabels(map[string]string{contractLabel: ns, "app": name})
	return w
}

func contractSelector(ns string) map[string]any {
	return map[string]any{"matchLabels": map[string]any{contractLabel: ns}}
}

func getWidget(ctx context.Context, ns, name string) (*unstructured.Unstructured, error) {
	return dyn.Resource(widgetsGVR).Namespace(ns).Get(ctx, name, metav1.GetOptions{})
}

// TestKindsCustomizeRelated: the customize hook (called with the parent
// as "parent", whatever the kind) names a related ConfigMap; the sync
// hook sees it under `related` and derives an owned ConfigMap from it;
// the owned object follows the related ConfigMap's changes (a related
// change resyncs the parent); customize is called exactly once while the
// parent's generation stays the same, and again for a new generation.
func TestKindsCustomizeRelated(t *testing.T) {
	for _, k := range controllerKinds {
		t.Run(k.kind, func(t *testing.T) {
			ctx := context.Background()
			inst := startMetabus(t, allinone.Config{}, nil)
			ns := newNamespace(t)
			var mu sync.Mutex
			customizeCalls := 0
			customizeURL := hookServer(t, jsonHook(func(req map[string]any) (int, any) {
				mu.Lock()
				customizeCalls++
				mu.Unlock()
				source := req["parent"].(map[string]any)["spec"].(map[string]any)["source"]
				return 200, map[string]any{"relatedResources": []any{map[string]any{
					"apiVersion": "v1", "resource": "configmaps", "names": []any{source},
				}}}
			}))
			syncURL := hookServer(t, jsonHook(func(req map[string]any) (int, any) {
				parent := k.parent(req)
				source := nestedString(parent, "spec", "source")
				rel, _ := req["related"].(map[string]any)["ConfigMap.v1"].(map[string]any)
				src, ok := rel[source].(map[string]any)
				if !ok {
					return 200, k.respond(nil)
				}
				data, _ := src["data"].(map[string]any)
				return 200, k.respond([]any{ownedConfigMap(parent.GetName()+"-derived", parent.GetName(),
					map[string]any{"value": data["value"]})})
			}))
			createController(t, inst, k.kind, "contract-customize", k.spec(contractSelector(ns), map[string]any{
				"sync":      map[string]any{"webhook": map[string]any{"url": syncURL}},
				"customize": map[string]any{"webhook": map[string]any{"url": customizeURL}},
			}))
			if _, err := kube.CoreV1().ConfigMaps(ns).Create(ctx, &corev1.ConfigMap{
				ObjectMeta: metav1.ObjectMeta{Name: "settings"}, Data: map[string]string{"value": "one"},
			}, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			w := contractWidget(ns, "cw", nil)
			w.Object["spec"].(map[string]any)["source"] = "settings"
			k.createParent(t, ns, w)
			derived := func(want string) func() error {
				return func() error {
					cm, err := kube.CoreV1().ConfigMaps(ns).Get(ctx, "cw-derived", metav1.GetOptions{})
					if err != nil {
						return err
					}
					if cm.Data["value"] != want {
						return fmt.Errorf("derived value %q, want %q", cm.Data["value"], want)
					}
					return nil
				}
			}
			calls := func() int {
				mu.Lock()
				defer mu.Unlock()
				return customizeCalls
			}
			eventually(t, 30*time.Second, "the owned object derived from the related ConfigMap", derived("one"))
			if n := calls(); n != 1 {
				t.Errorf("customize called %d times for one generation, want 1", n)
			}

			start := time.Now()
			if _, err := kube.CoreV1().ConfigMaps(ns).Patch(ctx, "settings", types.MergePatchType,
				[]byte(`{"data":{"value":"two"}}`), metav1.PatchOptions{}); err != nil {
				t.Fatal(err)
			}
			eventually(t, 30*time.Second, "the owned object following the related ConfigMap", derived("two"))
			t.Logf("a related-object change reached the owned object in %s", time.Since(start).Round(time.Millisecond))
			if n := calls(); n != 1 {
				t.Errorf("customize called %d times although the parent's generation did not change, want 1", n)
			}

			// A new generation re-runs customize.
			if _, err := dyn.Resource(widgetsGVR).Namespace(ns).Patch(ctx, "cw", types.MergePatchType,
				[]byte(`{"spec":{"version":2}}`), metav1.PatchOptions{}); err != nil {
				t.Fatal(err)
			}
			eventually(t, 30*time.Second, "customize to run for the new generation", func() error {
				if n := calls(); n < 2 {
					return fmt.Errorf("called %d times", n)
				}
				return nil
			})
		})
	}
}

// TestKindsControllerDeletionReleasesFinalizers: a controller with a
// finalize hook puts its finalizer (and nothing else) on every parent;
// deleting the controller removes it from all of them (upstream leaves
// them stuck: #1062 for decorators), and the controller stops: a new
// matching parent gets no finalizer and no hook call, and deleting a
// former parent is not held up.
func TestKindsControllerDeletionReleasesFinalizers(t *testing.T) {
	for _, k := range controllerKinds {
		t.Run(k.kind, func(t *testing.T) {
			ctx := context.Background()
			inst := startMetabus(t, allinone.Config{}, nil)
			ns := newNamespace(t)
			var mu sync.Mutex
			calls := map[string]int{}
			url := hookServer(t, jsonHook(func(req map[string]any) (int, any) {
				mu.Lock()
				calls[k.parent(req).GetName()]++
				mu.Unlock()
				resp := k.respond(nil)
				finalizing, _ := req["finalizing"].(bool)
				resp["finalized"] = finalizing
				return 200, resp
			}))
			const name = "contract-release"
			fin := k.finalizer(name)
			createController(t, inst, k.kind, name, k.spec(contractSelector(ns), map[string]any{
				"sync":     map[string]any{"webhook": map[string]any{"url": url}},
				"finalize": map[string]any{"webhook": map[string]any{"url": url}},
			}))
			for _, n := range []string{"r1", "r2"} {
				k.createParent(t, ns, contractWidget(ns, n, nil))
			}
			// held checks that each of names holds exactly the finalizer,
			// or holds none.
			held := func(want bool, names ...string) func() error {
				return func() error {
					for _, n := range names {
						w, err := getWidget(ctx, ns, n)
						if err != nil {
							return err
						}
						f := w.GetFinalizers()
						if has := len(f) == 1 && f[0] == fin; has != want || (!want && len(f) != 0) {
							return fmt.Errorf("%s finalizers %v", n, f)
						}
					}
					return nil
				}
			}
			eventually(t, 30*time.Second, "the finalizer on both parents", held(true, "r1", "r2"))

			if err := dyn.Resource(controllerGVRs[k.kind]).Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
				t.Fatal(err)
			}
			eventually(t, 30*time.Second, "the finalizer released from both parents", held(false, "r1", "r2"))

			// Stopped: a new matching parent is left alone, and deleting a
			// former parent is not held up.
			k.createParent(t, ns, contractWidget(ns, "r3", nil))
			if err := dyn.Resource(widgetsGVR).Namespace(ns).Delete(ctx, "r1", metav1.DeleteOptions{}); err != nil {
				t.Fatal(err)
			}
			eventually(t, 10*time.Second, "r1 deleted without waiting for anyone", func() error {
				_, err := getWidget(ctx, ns, "r1")
				if apierrors.IsNotFound(err) {
					return nil
				}
				return fmt.Errorf("still there (err=%v)", err)
			})
			// Nothing is to happen to r3, so there is no event to wait
			// for: give a live controller ample time to have acted.
			time.Sleep(2 * time.Second)
			if err := held(false, "r3")(); err != nil {
				t.Errorf("a deleted controller still manages new parents: %v", err)
			}
			mu.Lock()
			defer mu.Unlock()
			if calls["r3"] != 0 {
				t.Errorf("a deleted controller's hook was called %d times for a new parent", calls["r3"])
			}
		})
	}
}

// teardown is a sync and finalize hook for any kind: a sync desires one
// owned ConfigMap per spec.items entry; a finalize call tears them down
// one at a time, last name first, and reports finalized once it observes
// none. It records what each finalize call observed, per parent.
type teardown struct {
	k        kindFixture
	mu       sync.Mutex
	observed map[string][][]string
}

func newTeardown(k kindFixture) *teardown {
	return &teardown{k: k, observed: map[string][][]string{}}
}

func (h *teardown) handle(req map[string]any) (int, any) {
	parent := h.k.parent(req)
	var names []string
	for _, v := range h.k.owned(req) {
		names = append(names, nestedString(&unstructured.Unstructured{Object: v.(map[string]any)}, "metadata", "name"))
	}
	sort.Strings(names)
	finalizing, _ := req["finalizing"].(bool)
	var objs []any
	if !finalizing {
		items, _, _ := unstructured.NestedStringSlice(parent.Object, "spec", "items")
		for _, it := range items {
			objs = append(objs, ownedConfigMap(parent.GetName()+"-"+it, parent.GetName(), nil))
		}
		return 200, h.k.respond(objs)
	}
	h.mu.Lock()
	h.observed[parent.GetName()] = append(h.observed[parent.GetName()], names)
	h.mu.Unlock()
	for _, n := range names[:max(len(names)-1, 0)] {
		objs = append(objs, ownedConfigMap(n, parent.GetName(), nil))
	}
	resp := h.k.respond(objs)
	resp["finalized"] = len(names) == 0
	return 200, resp
}

// order returns the distinct sets the finalize calls for parent observed,
// in order, and forgets them.
func (h *teardown) order(parent string) string {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []string
	for _, o := range h.observed[parent] {
		s := strings.Join(o, ",")
		if len(out) == 0 || out[len(out)-1] != s {
			out = append(out, s)
		}
	}
	delete(h.observed, parent)
	return strings.Join(out, "|")
}

// finalizeSetup starts metabus with a controller of kind k whose sync and
// finalize hooks are a teardown, and creates the Widget name with items
// a, b and c; it returns once the parent holds the finalizer and its
// three owned ConfigMaps exist.
func finalizeSetup(t *testing.T, k kindFixture, ctrl, name string) (ns string, h *teardown, converged func() error) {
	t.Helper()
	ctx := context.Background()
	inst := startMetabus(t, allinone.Config{}, nil)
	ns = newNamespace(t)
	h = newTeardown(k)
	url := hookServer(t, jsonHook(h.handle))
	fin := k.finalizer(ctrl)
	createController(t, inst, k.kind, ctrl, k.spec(contractSelector(ns), map[string]any{
		"sync":     map[string]any{"webhook": map[string]any{"url": url}},
		"finalize": map[string]any{"webhook": map[string]any{"url": url}},
	}))
	k.createParent(t, ns, contractWidget(ns, name, []string{"a", "b", "c"}))
	converged = func() error {
		w, err := getWidget(ctx, ns, name)
		if err != nil {
			return err
		}
		if !hasFinalizer(w, fin) {
			return fmt.Errorf("finalizers %v", w.GetFinalizers())
		}
		names, err := configMapNames(ctx, ns, name)
		if err != nil || len(names) != 3 {
			return fmt.Errorf("owned objects %v %v", names, err)
		}
		return nil
	}
	eventually(t, 30*time.Second, "the owned objects and the finalizer", converged)
	return ns, h, converged
}

// TestKindsFinalizeOnOptOut: a parent that stops matching the controller's
// label selector is finalized: the finalize hook runs until finalized,
// tearing the owned objects down in the hook's order, then the finalizer
// goes and the parent stays. Matching again brings the owned objects and
// the finalizer back.
func TestKindsFinalizeOnOptOut(t *testing.T) {
	for _, k := range controllerKinds {
		t.Run(k.kind, func(t *testing.T) {
			ctx := context.Background()
			const ctrl = "contract-optout"
			ns, h, converged := finalizeSetup(t, k, ctrl, "ow")
			fin := k.finalizer(ctrl)
			if err := k.optOut(ctx, ns, "ow"); err != nil {
				t.Fatal(err)
			}
			eventually(t, 60*time.Second, "finalize on opt-out", func() error {
				w, err := getWidget(ctx, ns, "ow")
				if err != nil {
					return fmt.Errorf("the parent must stay: %w", err)
				}
				if hasFinalizer(w, fin) {
					return fmt.Errorf("finalizer still present")
				}
				names, err := configMapNames(ctx, ns, "ow")
				if err != nil || len(names) != 0 {
					return fmt.Errorf("owned objects left: %v %v", names, err)
				}
				return nil
			})
			if got, want := h.order("ow"), "ow-a,ow-b,ow-c|ow-a,ow-b|ow-a|"; got != want {
				t.Errorf("opt-out teardown observed %q, want %q", got, want)
			}

			if err := k.optIn(ctx, ns, "ow"); err != nil {
				t.Fatal(err)
			}
			eventually(t, 30*time.Second, "the owned objects and the finalizer back after opting in again", converged)
		})
	}
}

// TestKindsFinalizeOnDelete: deleting a parent runs the finalize hook
// until finalized, tearing the owned objects down in the hook's order,
// and then the parent goes away.
func TestKindsFinalizeOnDelete(t *testing.T) {
	for _, k := range controllerKinds {
		t.Run(k.kind, func(t *testing.T) {
			ctx := context.Background()
			ns, h, _ := finalizeSetup(t, k, "contract-delete", "fw")
			if err := dyn.Resource(widgetsGVR).Namespace(ns).Delete(ctx, "fw", metav1.DeleteOptions{}); err != nil {
				t.Fatal(err)
			}
			eventually(t, 60*time.Second, "the parent to be finalized and deleted", func() error {
				_, err := getWidget(ctx, ns, "fw")
				if apierrors.IsNotFound(err) {
					return nil
				}
				return fmt.Errorf("parent still there (err=%v)", err)
			})
			if got, want := h.order("fw"), "fw-a,fw-b,fw-c|fw-a,fw-b|fw-a|"; got != want {
				t.Errorf("teardown order %q, want %q", got, want)
			}
		})
	}
}

// TestKindsResyncPeriodSeconds: resyncPeriodSeconds calls the sync hook
// again and again for a parent nothing changes, and those syncs, whose
// desired state is the one already applied, write nothing.
func TestKindsResyncPeriodSeconds(t *testing.T) {
	for _, k := range controllerKinds {
		t.Run(k.kind, func(t *testing.T) {
			ctx := context.Background()
			inst := startMetabus(t, allinone.Config{}, nil)
			ns := newNamespace(t)
			var mu sync.Mutex
			calls := 0
			url := hookServer(t, jsonHook(func(req map[string]any) (int, any) {
				mu.Lock()
				calls++
				mu.Unlock()
				parent := k.parent(req)
				return 200, k.respond([]any{ownedConfigMap(parent.GetName()+"-a", parent.GetName(), map[string]any{"item": "a"})})
			}))
			count := func() int {
				mu.Lock()
				defer mu.Unlock()
				return calls
			}
			spec := k.spec(contractSelector(ns), map[string]any{"sync": map[string]any{"webhook": map[string]any{"url": url}}})
			spec["resyncPeriodSeconds"] = int64(1)
			createController(t, inst, k.kind, "contract-resync-period", spec)
			k.createParent(t, ns, contractWidget(ns, "rp", nil))
			eventually(t, 30*time.Second, "the first sync applied", func() error {
				_, err := kube.CoreV1().ConfigMaps(ns).Get(ctx, "rp-a", metav1.GetOptions{})
				return err
			})

			// Settled: a sync ran after the owned object appeared (its own
			// event, at the latest the next resync) and wrote nothing.
			writes := func() float64 { return inst.counter(t, "metabus_applier_api_writes_total", nil) }
			eventually(t, 20*time.Second, "a sync that writes nothing", func() error {
				w0, c0 := writes(), count()
				deadline := time.Now().Add(3 * time.Second)
				for count() < c0+2 && time.Now().Before(deadline) {
					time.Sleep(50 * time.Millisecond)
				}
				if count() < c0+2 {
					return fmt.Errorf("no resync in 3s")
				}
				if w := writes(); w != w0 {
					return fmt.Errorf("%v writes", w-w0)
				}
				return nil
			})

			parent, err := getWidget(ctx, ns, "rp")
			if err != nil {
				t.Fatal(err)
			}
			owned, err := kube.CoreV1().ConfigMaps(ns).Get(ctx, "rp-a", metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			w0, before := writes(), count()
			if w0 == 0 {
				t.Fatal("metabus_applier_api_writes_total counted no write, not even the owned object's creation")
			}
			eventually(t, 10*time.Second, "periodic resyncs of an unchanged parent", func() error {
				if n := count() - before; n < 3 {
					return fmt.Errorf("%d resyncs", n)
				}
				return nil
			})
			// The last resync's desired state may still be on its way to
			// the applier: give it one more resync period to arrive.
			last := count()
			eventually(t, 5*time.Second, "one more resync", func() error {
				if count() == last {
					return fmt.Errorf("not yet")
				}
				return nil
			})
			if w := writes(); w != w0 {
				t.Errorf("no-op resyncs wrote %v times to the API", w-w0)
			}
			p1, err := getWidget(ctx, ns, "rp")
			if err != nil {
				t.Fatal(err)
			}
			o1, err := kube.CoreV1().ConfigMaps(ns).Get(ctx, "rp-a", metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if p1.GetResourceVersion() != parent.GetResourceVersion() || o1.ResourceVersion != owned.ResourceVersion {
				t.Errorf("no-op resyncs changed objects: parent rv %s→%s, owned rv %s→%s",
					parent.GetResourceVersion(), p1.GetResourceVersion(), owned.ResourceVersion, o1.ResourceVersion)
			}
		})
	}
}
