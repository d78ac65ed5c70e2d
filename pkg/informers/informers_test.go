package informers

import (
	"context"
	"slices"
	"sort"
	"strconv"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	"k8s.io/client-go/tools/cache"
)

var (
	cmGVR   = schema.GroupVersionResource{Version: "v1", Resource: "configmaps"}
	nsGVR   = schema.GroupVersionResource{Version: "v1", Resource: "namespaces"}
	ptGVR   = schema.GroupVersionResource{Version: "v1", Resource: "podtemplates"}
	waitFor = 20 * time.Second
)

func dynClient(t *testing.T) dynamic.Interface {
	t.Helper()
	c, err := dynamic.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func testCtx(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 25*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// nsRuns makes namespace names unique per run: -count=N reuses the cluster.
var nsRuns int

// createNamespace creates a namespace named after prefix and returns its
// name.
func createNamespace(t *testing.T, dyn dynamic.Interface, prefix string) string {
	t.Helper()
	nsRuns++
	name := prefix + "-" + strconv.Itoa(nsRuns)
	ns := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "v1", "kind": "Namespace", "metadata": map[string]any{"name": name},
	}}
	if _, err := dyn.Resource(nsGVR).Create(testCtx(t), ns, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create namespace %s: %v", name, err)
	}
	return name
}

// controllerRef returns an ownerReference; controller marks it as the
// controller reference.
func controllerRef(uid string, controller bool) map[string]any {
	return map[string]any{
		"apiVersion": "example.com/v1", "kind": "Parent", "name": "owner-" + uid,
		"uid": uid, "controller": controller,
	}
}

func createConfigMap(t *testing.T, dyn dynamic.Interface, ns, name string, owners ...map[string]any) *unstructured.Unstructured {
	t.Helper()
	meta := map[string]any{"name": name, "namespace": ns}
	if len(owners) > 0 {
		refs := make([]any, 0, len(owners))
		for _, o := range owners {
			refs = append(refs, o)
		}
		meta["ownerReferences"] = refs
	}
	cm := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta,
		"data": map[string]any{"k": "v"},
	}}
	out, err := dyn.Resource(cmGVR).Namespace(ns).Create(testCtx(t), cm, metav1.CreateOptions{FieldManager: "informers-test"})
	if err != nil {
		t.Fatalf("create configmap %s/%s: %v", ns, name, err)
	}
	if len(out.GetManagedFields()) == 0 {
		t.Fatalf("the API server set no managedFields on %s/%s: the stripping test would prove nothing", ns, name)
	}
	return out
}

// recorder is an event handler that records what it receives.
type recorder struct {
	mu      sync.Mutex
	adds    map[string]int
	updates map[string]int
	deletes map[string]int
}

func newRecorder() *recorder {
	return &recorder{adds: map[string]int{}, updates: map[string]int{}, deletes: map[string]int{}}
}

func key(obj any) string {
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		return d.Key
	}
	u := obj.(*unstructured.Unstructured)
	return u.GetNamespace() + "/" + u.GetName()
}

func (r *recorder) handler() cache.ResourceEventHandler {
	return cache.ResourceEventHandlerFuncs{
		AddFunc: func(obj any) {
			r.mu.Lock()
			r.adds[key(obj)]++
			r.mu.Unlock()
		},
		UpdateFunc: func(_, obj any) {
			r.mu.Lock()
			r.updates[key(obj)]++
			r.mu.Unlock()
		},
		DeleteFunc: func(obj any) {
			r.mu.Lock()
			r.deletes[key(obj)]++
			r.mu.Unlock()
		},
	}
}

func (r *recorder) counts(k string) (adds, updates, deletes int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.adds[k], r.updates[k], r.deletes[k]
}

// eventually polls cond until it holds or the timeout passes.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(waitFor)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func names(objs []*unstructured.Unstructured) []string {
	out := make([]string, 0, len(objs))
	for _, o := range objs {
		out = append(out, o.GetNamespace()+"/"+o.GetName())
	}
	sort.Strings(out)
	return out
}

func syncHandle(t *testing.T, h *Handle) {
	t.Helper()
	if !h.WaitForSync(testCtx(t)) {
		t.Fatalf("%s informer did not sync", h.GVR())
	}
	if !h.HasSynced() {
		t.Fatalf("%s: HasSynced false after WaitForSync", h.GVR())
	}
}

func TestSharedInformerIndexesAndRefcounts(t *testing.T) {
	requireEnv(t)
	dyn := dynClient(t)
	ns, other := createNamespace(t, dyn, "inf-shared"), createNamespace(t, dyn, "inf-shared-other")
	// Owner UIDs unique to this run (-count=N reuses the cluster).
	pa, pb, pc := "parent-a-"+ns, "parent-b-"+ns, "parent-c-"+ns

	plain := createConfigMap(t, dyn, ns, "plain")
	ownedA := createConfigMap(t, dyn, ns, "owned-a", controllerRef(pa, true))
	ownedB := createConfigMap(t, dyn, ns, "owned-b", controllerRef(pb, true))
	// Owned by parent-a, but not as its controller: an orphan as far as
	// adoption goes, and not one of parent-a's children.
	nonCtrl := createConfigMap(t, dyn, ns, "non-controller", controllerRef(pa, false))
	// Several owners, one of them the controller.
	multi := createConfigMap(t, dyn, ns, "multi", controllerRef(pc, false), controllerRef(pa, true))
	elsewhere := createConfigMap(t, dyn, other, "elsewhere", controllerRef(pa, true))

	reg := newRegistry(t)
	h1 := reg.Acquire(cmGVR)
	defer h1.Release()
	h2 := reg.Acquire(cmGVR)
	defer h2.Release()

	if h1.Informer() != h2.Informer() {
		t.Fatal("two Acquires of the same resource got different informers")
	}
	if h1.GVR() != cmGVR || h2.GVR() != cmGVR {
		t.Fatalf("GVR() = %v, %v", h1.GVR(), h2.GVR())
	}
	syncHandle(t, h1)

	// Handlers added after the initial list get synthetic adds for what is
	// cached.
	rec1, rec2 := newRecorder(), newRecorder()
	if err := h1.AddHandler(rec1.handler()); err != nil {
		t.Fatal(err)
	}
	if err := h2.AddHandler(rec2.handler()); err != nil {
		t.Fatal(err)
	}
	all := []*unstructured.Unstructured{plain, ownedA, ownedB, nonCtrl, multi, elsewhere}
	for _, rec := range []*recorder{rec1, rec2} {
		eventually(t, "synthetic adds for existing objects", func() bool {
			for _, o := range all {
				if a, _, _ := rec.counts(o.GetNamespace() + "/" + o.GetName()); a != 1 {
					return false
				}
			}
			return true
		})
	}

	t.Run("indexes", func(t *testing.T) {
		cases := []struct {
			reason string
			got    []*unstructured.Unstructured
			want   []string
		}{
			{reason: "OwnedBy follows controller references only, in every namespace", got: h1.OwnedBy(pa), want: []string{ns + "/multi", ns + "/owned-a", other + "/elsewhere"}},
			{reason: "OwnedBy another parent", got: h2.OwnedBy(pb), want: []string{ns + "/owned-b"}},
			{reason: "a non-controller owner has no children", got: h1.OwnedBy(pc), want: []string{}},
			{reason: "an unknown UID has no children", got: h1.OwnedBy("nobody"), want: []string{}},
			{reason: "Orphans: no controller reference, in that namespace", got: h1.Orphans(ns), want: []string{ns + "/non-controller", ns + "/plain"}},
			{reason: "no orphans in the other namespace", got: h1.Orphans(other), want: []string{}},
			{reason: "InNamespace", got: h1.InNamespace(ns), want: []string{ns + "/multi", ns + "/non-controller", ns + "/owned-a", ns + "/owned-b", ns + "/plain"}},
			{reason: "InNamespace other", got: h2.InNamespace(other), want: []string{other + "/elsewhere"}},
			{reason: "InNamespace of an unknown namespace", got: h2.InNamespace("no-such-ns"), want: []string{}},
			{reason: "ControlledByName: by the controller's kind and name, whatever its UID, in that namespace", got: h1.ControlledByName("example.com", "Parent", ns, "owner-"+pa), want: []string{ns + "/multi", ns + "/owned-a"}},
			{reason: "ControlledByName ignores non-controller references", got: h1.ControlledByName("example.com", "Parent", ns, "owner-"+pc), want: []string{}},
			{reason: "ControlledByName of another group", got: h1.ControlledByName("other.example.com", "Parent", ns, "owner-"+pa), want: []string{}},
		}
		for _, tc := range cases {
			sort.Strings(tc.want)
			if got := names(tc.got); !slices.Equal(got, tc.want) {
				t.Errorf("%s: got %v, want %v", tc.reason, got, tc.want)
			}
		}
		for _, o := range all {
			got, ok := h1.ByUID(string(o.GetUID()))
			if !ok || got.GetName() != o.GetName() || got.GetNamespace() != o.GetNamespace() {
				t.Errorf("ByUID(%s) = %v, %v; want %s/%s", o.GetUID(), got, ok, o.GetNamespace(), o.GetName())
			}
		}
		if got, ok := h1.ByUID("no-such-uid"); ok {
			t.Errorf("ByUID(unknown) = %v", got)
		}
		listed := map[string]bool{}
		for _, n := range names(h2.List()) {
			listed[n] = true
		}
		for _, o := range all {
			if !listed[o.GetNamespace()+"/"+o.GetName()] {
				t.Errorf("List lacks %s/%s", o.GetNamespace(), o.GetName())
			}
		}
	})

	t.Run("managedFields are stripped", func(t *testing.T) {
		for _, o := range h1.List() {
			if _, found, _ := unstructured.NestedFieldNoCopy(o.Object, "metadata", "managedFields"); found {
				t.Errorf("cached %s/%s keeps managedFields", o.GetNamespace(), o.GetName())
			}
		}
		got, _ := h1.ByUID(string(plain.GetUID()))
		if got == nil || got.Object["data"] == nil || got.GetResourceVersion() == "" {
			t.Errorf("stripping dropped more than managedFields: %v", got)
		}
	})

	t.Run("updates move objects between indexes once seen", func(t *testing.T) {
		cur, err := dyn.Resource(cmGVR).Namespace(ns).Get(testCtx(t), "plain", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		cur.SetOwnerReferences([]metav1.OwnerReference{{APIVersion: "example.com/v1", Kind: "Parent", Name: pb, UID: types.UID(pb), Controller: new(true)}})
		upd, err := dyn.Resource(cmGVR).Namespace(ns).Update(testCtx(t), cur, metav1.UpdateOptions{FieldManager: "informers-test"})
		if err != nil {
			t.Fatal(err)
		}
		if !h1.WaitSeen(testCtx(t), upd.GetResourceVersion()) {
			t.Fatalf("WaitSeen(%s) = false", upd.GetResourceVersion())
		}
		// Seen never runs ahead of the indexes.
		if got := names(h1.OwnedBy(pb)); !slices.Equal(got, []string{ns + "/owned-b", ns + "/plain"}) {
			t.Errorf("after adoption OwnedBy(parent-b) = %v", got)
		}
		if got := names(h1.Orphans(ns)); !slices.Equal(got, []string{ns + "/non-controller"}) {
			t.Errorf("after adoption Orphans = %v", got)
		}
		if c, _ := strconv.ParseInt(h1.Seen(), 10, 64); c == 0 {
			t.Errorf("Seen() = %q", h1.Seen())
		}
		for _, rec := range []*recorder{rec1, rec2} {
			eventually(t, "update event", func() bool { _, u, _ := rec.counts(ns + "/plain"); return u == 1 })
		}
	})

	t.Run("deletes leave the indexes", func(t *testing.T) {
		if err := dyn.Resource(cmGVR).Namespace(ns).Delete(testCtx(t), "owned-b", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		eventually(t, "deletion of owned-b in the cache", func() bool {
			_, ok := h1.ByUID(string(ownedB.GetUID()))
			return !ok
		})
		if got := names(h1.OwnedBy(pb)); !slices.Equal(got, []string{ns + "/plain"}) {
			t.Errorf("after delete OwnedBy(parent-b) = %v", got)
		}
		for _, rec := range []*recorder{rec1, rec2} {
			eventually(t, "delete event", func() bool { _, _, d := rec.counts(ns + "/owned-b"); return d == 1 })
		}
	})

	t.Run("release of one handle keeps the informer for the other", func(t *testing.T) {
		inf := h1.Informer()
		h1.Release()
		h1.Release() // safe twice, and must not drop h2's reference
		if err := h1.AddHandler(newRecorder().handler()); err == nil {
			t.Error("AddHandler on a released handle succeeded")
		}
		fresh := createConfigMap(t, dyn, ns, "after-release")
		if !h2.WaitSeen(testCtx(t), fresh.GetResourceVersion()) {
			t.Fatal("the informer stopped while h2 still holds it")
		}
		if inf.IsStopped() {
			t.Fatal("informer stopped after releasing one of two handles")
		}
		if _, ok := h2.ByUID(string(fresh.GetUID())); !ok {
			t.Error("h2 does not see a new object")
		}
		eventually(t, "h2's handler sees the new object", func() bool { a, _, _ := rec2.counts(ns + "/after-release"); return a == 1 })
		// h1's handler was removed: it got nothing for the new object.
		if a, _, _ := rec1.counts(ns + "/after-release"); a != 0 {
			t.Errorf("released handle's handler still called (%d adds)", a)
		}
		// A new Acquire still shares the running informer.
		h3 := reg.Acquire(cmGVR)
		if h3.Informer() != inf {
			t.Error("Acquire while h2 holds the informer created a new one")
		}
		h3.Release()
		if inf.IsStopped() {
			t.Fatal("informer stopped although h2 still holds it")
		}
	})

	t.Run("release of the last handle stops the informer", func(t *testing.T) {
		inf := h2.Informer()
		h2.Release()
		eventually(t, "the informer to stop", inf.IsStopped)
		h4 := reg.Acquire(cmGVR)
		defer h4.Release()
		if h4.Informer() == inf {
			t.Fatal("Acquire after the last Release reused the stopped informer")
		}
		syncHandle(t, h4)
		if _, ok := h4.ByUID(string(plain.GetUID())); !ok {
			t.Error("the new informer does not list existing objects")
		}
	})
}

func TestWaitSeen(t *testing.T) {
	requireEnv(t)
	dyn := dynClient(t)
	ns := createNamespace(t, dyn, "inf-waitseen")
	first := createConfigMap(t, dyn, ns, "first")

	reg := newRegistry(t)
	h := reg.Acquire(cmGVR)
	defer h.Release()
	syncHandle(t, h)

	t.Run("an RV already delivered", func(t *testing.T) {
		if !h.WaitSeen(testCtx(t), first.GetResourceVersion()) {
			t.Fatalf("WaitSeen(%s) = false, Seen = %s", first.GetResourceVersion(), h.Seen())
		}
	})
	t.Run("empty RV", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		if !h.WaitSeen(ctx, "") {
			t.Fatal("WaitSeen(\"\") = false")
		}
	})
	t.Run("an unparseable RV is satisfied once something was seen", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		if !h.WaitSeen(ctx, "not-a-number") {
			t.Fatal("WaitSeen(not-a-number) = false")
		}
	})
	t.Run("HasSeen answers the same without waiting", func(t *testing.T) {
		for rv, want := range map[string]bool{first.GetResourceVersion(): true, "": true, "not-a-number": true, "999999999": false} {
			if got := h.HasSeen(rv); got != want {
				t.Errorf("HasSeen(%q) = %v, want %v (Seen = %s)", rv, got, want, h.Seen())
			}
		}
	})
	t.Run("an RV far in the future times out", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		defer cancel()
		begin := time.Now()
		if h.WaitSeen(ctx, "999999999") {
			t.Fatalf("WaitSeen(999999999) = true, Seen = %s", h.Seen())
		}
		if d := time.Since(begin); d < 300*time.Millisecond || d > 5*time.Second {
			t.Errorf("WaitSeen returned after %s, want at the 300ms deadline", d)
		}
	})
	t.Run("a waiter wakes up when a newer RV arrives", func(t *testing.T) {
		seen, err := strconv.ParseInt(h.Seen(), 10, 64)
		if err != nil {
			t.Fatalf("Seen() = %q: %v", h.Seen(), err)
		}
		want := strconv.FormatInt(seen+1, 10)
		res := make(chan bool, 1)
		go func() { res <- h.WaitSeen(testCtx(t), want) }()
		select {
		case r := <-res:
			t.Fatalf("WaitSeen(%s) returned %v before anything changed", want, r)
		case <-time.After(200 * time.Millisecond):
		}
		later := createConfigMap(t, dyn, ns, "later")
		select {
		case r := <-res:
			if !r {
				t.Fatal("WaitSeen = false")
			}
		case <-time.After(waitFor):
			t.Fatal("WaitSeen did not wake up")
		}
		if _, ok := h.ByUID(string(later.GetUID())); !ok {
			t.Error("WaitSeen returned before the object was in the cache")
		}
	})
}

// WaitSeen documents that an unparseable resourceVersion never blocks; on a
// resource whose informer has delivered nothing yet it does.
func TestWaitSeenUnparseableOnEmptyResource(t *testing.T) {
	requireEnv(t)
	reg := newRegistry(t)
	h := reg.Acquire(ptGVR) // no PodTemplates exist in a fresh cluster
	defer h.Release()
	syncHandle(t, h)
	if len(h.List()) != 0 {
		t.Fatalf("test assumes no PodTemplates, found %v", names(h.List()))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	if !h.WaitSeen(ctx, "not-a-number") {
		t.Error("WaitSeen(not-a-number) = false on an empty resource: it blocked until the deadline")
	}
}

func TestConcurrentAcquireSharesOneInformer(t *testing.T) {
	requireEnv(t)
	reg := newRegistry(t)
	const n = 8
	hs := make([]*Handle, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { hs[i] = reg.Acquire(cmGVR) })
	}
	wg.Wait()
	inf := hs[0].Informer()
	for i, h := range hs {
		if h.Informer() != inf {
			t.Fatalf("handle %d got a different informer", i)
		}
	}
	syncHandle(t, hs[0])
	for _, h := range hs[:n-1] {
		wg.Go(h.Release)
	}
	wg.Wait()
	if inf.IsStopped() {
		t.Fatal("informer stopped with one handle left")
	}
	hs[n-1].Release()
	eventually(t, "the informer to stop", inf.IsStopped)

	// Different resources get different informers.
	a, b := reg.Acquire(cmGVR), reg.Acquire(ptGVR)
	defer a.Release()
	defer b.Release()
	if a.Informer() == b.Informer() {
		t.Fatal("configmaps and podtemplates share an informer")
	}
}

// TestManySubscribersShareOneHandler: hundreds of subscribers on one
// resource (the watcher's controllers) each get the cached objects replayed
// and every later event, even when their handlers take a lock the
// subscribing code holds (as the related-rule index does); a released
// subscriber hears nothing more while the others still do.
func TestManySubscribersShareOneHandler(t *testing.T) {
	requireEnv(t)
	dyn := dynClient(t)
	ns := createNamespace(t, dyn, "fanout")
	cm := func(name string) *unstructured.Unstructured {
		return &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "v1", "kind": "ConfigMap", "metadata": map[string]any{"name": name, "namespace": ns},
		}}
	}
	for i := range 3 {
		if _, err := dyn.Resource(cmGVR).Namespace(ns).Create(testCtx(t), cm("before-"+strconv.Itoa(i)), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	reg := newRegistry(t)
	first := reg.Acquire(cmGVR)
	defer first.Release()
	syncHandle(t, first)

	type seen struct {
		mu      sync.Mutex
		adds    map[string]int
		deletes map[string]int
	}
	var held sync.Mutex // a lock the subscribing code holds and the handlers take
	const n = 300
	subs := make([]*seen, n)
	handles := make([]*Handle, n)
	held.Lock()
	for i := range n {
		s := &seen{adds: map[string]int{}, deletes: map[string]int{}}
		subs[i] = s
		handles[i] = reg.Acquire(cmGVR)
		inNS := func(obj any) (string, bool) {
			if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = d.Obj
			}
			u, ok := obj.(*unstructured.Unstructured)
			return u.GetName(), ok && u.GetNamespace() == ns
		}
		if err := handles[i].AddHandler(cache.ResourceEventHandlerFuncs{
			AddFunc: func(obj any) {
				held.Lock()
				held.Unlock()
				if name, ok := inNS(obj); ok {
					s.mu.Lock()
					s.adds[name]++
					s.mu.Unlock()
				}
			},
			DeleteFunc: func(obj any) {
				if name, ok := inNS(obj); ok {
					s.mu.Lock()
					s.deletes[name]++
					s.mu.Unlock()
				}
			},
		}); err != nil {
			t.Fatal(err)
		}
	}
	held.Unlock() // AddHandler returned while the handlers could not run
	all := func(what string, ok func(s *seen) bool, among []*seen) {
		t.Helper()
		eventually(t, what, func() bool {
			for _, s := range among {
				s.mu.Lock()
				good := ok(s)
				s.mu.Unlock()
				if !good {
					return false
				}
			}
			return true
		})
	}
	all("every subscriber to get the cached objects", func(s *seen) bool {
		return s.adds["before-0"] > 0 && s.adds["before-1"] > 0 && s.adds["before-2"] > 0
	}, subs)
	if _, err := dyn.Resource(cmGVR).Namespace(ns).Create(testCtx(t), cm("after"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	all("every subscriber to get the new object", func(s *seen) bool { return s.adds["after"] > 0 }, subs)

	for _, h := range handles[:n/2] {
		h.Release()
	}
	if err := dyn.Resource(cmGVR).Namespace(ns).Delete(testCtx(t), "after", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	all("the remaining subscribers to get the delete", func(s *seen) bool { return s.deletes["after"] == 1 }, subs[n/2:])
	for i, s := range subs[:n/2] {
		s.mu.Lock()
		if s.deletes["after"] != 0 {
			t.Errorf("released subscriber %d still got the delete", i)
		}
		s.mu.Unlock()
	}
	for _, h := range handles[n/2:] {
		h.Release()
	}
}

// TestHandlersSynced: a handle's handlers count as synced only once each
// has been replayed the cached objects, whatever the informer says; runs
// on a fake client, without a control plane.
func TestHandlersSynced(t *testing.T) {
	objs := make([]runtime.Object, 3)
	for i := range objs {
		objs[i] = &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "v1", "kind": "ConfigMap",
			"metadata": map[string]any{"name": "cm-" + strconv.Itoa(i), "namespace": "ns", "uid": "u" + strconv.Itoa(i), "resourceVersion": strconv.Itoa(10 + i)},
		}}
	}
	dyn := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(), map[schema.GroupVersionResource]string{cmGVR: "ConfigMapList"}, objs...)
	reg := New(dyn, 0) // a fake cluster: the dynamic client's informers
	first := reg.Acquire(cmGVR)
	defer first.Release()
	syncHandle(t, first)
	eventually := func(what string, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(waitFor)
		for !cond() {
			if time.Now().After(deadline) {
				t.Fatal(what)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	// The shared handler's registration syncs just after the informer.
	eventually("a handle without handlers never synced", first.HandlersSynced)

	h := reg.Acquire(cmGVR)
	defer h.Release()
	gate := make(chan struct{})
	var mu sync.Mutex
	adds := 0
	if err := h.AddHandler(cache.ResourceEventHandlerFuncs{AddFunc: func(any) {
		<-gate // a slow handler: the replay is still going on
		mu.Lock()
		adds++
		mu.Unlock()
	}}); err != nil {
		t.Fatal(err)
	}
	if !h.HasSynced() {
		t.Fatal("the shared informer synced before: HasSynced says so")
	}
	if h.HandlersSynced() {
		t.Error("HandlersSynced while the handler's replay has not begun")
	}
	close(gate)
	eventually("HandlersSynced never became true after the replay", h.HandlersSynced)
	mu.Lock()
	defer mu.Unlock()
	if adds != len(objs) {
		t.Errorf("HandlersSynced after %d of %d replayed adds", adds, len(objs))
	}
}
