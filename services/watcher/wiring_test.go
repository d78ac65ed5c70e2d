package watcher

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/zap"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	dynamicfake "k8s.io/client-go/dynamic/fake"

	"github.com/metabus/metabus/pkg/api/v1alpha1"
	"github.com/metabus/metabus/pkg/apiresource"
	"github.com/metabus/metabus/pkg/bus"
	"github.com/metabus/metabus/pkg/decorator"
	"github.com/metabus/metabus/pkg/informers"
	"github.com/metabus/metabus/pkg/kinds"
	"github.com/metabus/metabus/pkg/kindtable"
	"github.com/metabus/metabus/pkg/snapshot"
)

func TestSameOwner(t *testing.T) {
	ref := func(uid string) *metav1.OwnerReference { return &metav1.OwnerReference{UID: types.UID(uid)} }
	cases := []struct {
		reason    string
		old, cur  *metav1.OwnerReference
		adopts    bool
		wantSame  bool
		wantEvent string
	}{
		{reason: "same owner before and after: possibly our own write", old: ref("a"), cur: ref("a"), wantSame: true},
		{reason: "re-owned: the old owner hears of it", old: ref("a"), cur: ref("b")},
		{reason: "released: the old owner hears of it", old: ref("a")},
		{reason: "adopted, for a kind that adopts: possibly our own adoption", cur: ref("a"), adopts: true, wantSame: true},
		{reason: "an orphan staying an orphan, for a kind that adopts", adopts: true, wantSame: true},
		{reason: "marked as an attachment, for a kind that never adopts: news to the new owner", cur: ref("a")},
	}
	for _, tc := range cases {
		t.Run(tc.reason, func(t *testing.T) {
			if got := sameOwner(tc.old, tc.cur, tc.adopts); got != tc.wantSame {
				t.Errorf("sameOwner = %v, want %v", got, tc.wantSame)
			}
		})
	}
}

// The fake cluster of the wiring tests: Things (the parents and decorator
// targets) and ConfigMaps (children and attachments).
var (
	fakeResources = map[string]*apiresource.Resource{
		"example.com/v1/things": thingsRes,
		"v1/configmaps":         {GVR: configmapsGVR, Kind: "ConfigMap", Namespaced: true},
	}
	fakeListKinds = map[schema.GroupVersionResource]string{thingsGVR: "ThingList", configmapsGVR: "ConfigMapList"}
)

func fakeResolve(apiVersion, resource string) (*apiresource.Resource, error) {
	if r, ok := fakeResources[apiVersion+"/"+resource]; ok {
		return r, nil
	}
	return nil, fmt.Errorf("%s %s is not served", apiVersion, resource)
}

// thing is a parent; selector, if set, is its spec.selector.matchLabels.
func thing(name, rv string, lbls map[string]string, selector map[string]any) *unstructured.Unstructured {
	u := testObject("example.com/v1", "Thing", "ns", name, name+"-uid", rv)
	if lbls != nil {
		u.SetLabels(lbls)
	}
	if selector != nil {
		u.Object["spec"] = map[string]any{"selector": map[string]any{"matchLabels": selector}}
	}
	return u
}

// configMap is a child or attachment; owner names its controller Thing.
func configMap(name, rv string, lbls, anns map[string]string, owner string) *unstructured.Unstructured {
	u := testObject("v1", "ConfigMap", "ns", name, name+"-uid", rv)
	if lbls != nil {
		u.SetLabels(lbls)
	}
	if anns != nil {
		u.SetAnnotations(anns)
	}
	if owner != "" {
		yes := true
		u.SetOwnerReferences([]metav1.OwnerReference{{APIVersion: "example.com/v1", Kind: "Thing", Name: owner, UID: types.UID(owner + "-uid"), Controller: &yes}})
	}
	return u
}

func controllerObj(kind, name string, spec map[string]any) *unstructured.Unstructured {
	u := &unstructured.Unstructured{Object: map[string]any{"spec": spec}}
	u.SetAPIVersion(v1alpha1.GroupVersion.String())
	u.SetKind(kind)
	u.SetName(name)
	u.SetUID(types.UID(name + "-uid"))
	u.SetResourceVersion("1")
	return u
}

var (
	compositeObj = controllerObj(v1alpha1.CompositeControllerKind, "comp", map[string]any{
		"parentResource": map[string]any{"apiVersion": "example.com/v1", "resource": "things", "ignoreStatusChanges": true,
			"labelSelector": map[string]any{"matchLabels": map[string]any{"deco": "yes"}}},
		"childResources": []any{map[string]any{"apiVersion": "v1", "resource": "configmaps"}},
	})
	decoratorObj = controllerObj(v1alpha1.DecoratorControllerKind, "deco", map[string]any{
		"resources":   []any{map[string]any{"apiVersion": "example.com/v1", "resource": "things", "labelSelector": map[string]any{"matchLabels": map[string]any{"deco": "yes"}}}},
		"attachments": []any{map[string]any{"apiVersion": "v1", "resource": "configmaps"}},
	})
)

// wired returns a leading watcher over a fake cluster holding objs, with
// the controller wired and its caches synced.
func wired(t testing.TB, ctrlObj *unstructured.Unstructured, objs ...runtime.Object) (*Watcher, *wiring) {
	t.Helper()
	ctrl, err := kindtable.Decode(ctrlObj)
	if err != nil {
		t.Fatal(err)
	}
	plan, err := ctrl.WatchPlan(fakeResolve)
	if err != nil {
		t.Fatal(err)
	}
	return wiredPlan(t, ctrl.Ref(), ctrlObj, plan, objs...)
}

// wiredPlan is wired for a plan built by the test (a fake kind).
func wiredPlan(t testing.TB, ref bus.ControllerRef, ctrlObj *unstructured.Unstructured, plan *kinds.WatchPlan, objs ...runtime.Object) (*Watcher, *wiring) {
	t.Helper()
	w := leadingWatcher(dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(), fakeListKinds, objs...))
	wr := w.newWiring(ref, ctrlObj, "", nil, plan)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(func() {
		wr.stop()
		cancel()
		w.out.shutDown()
	})
	if err := wr.start(ctx); err != nil {
		t.Fatal(err)
	}
	for _, h := range slices.Concat(wr.parents, wr.owned, wr.inputs) {
		sctx, scancel := context.WithTimeout(ctx, 10*time.Second)
		ok := h.WaitForSync(sctx)
		// The handlers' replay too: the start's items (and a keyed
		// plan's indexes) are complete once it is done.
		for ok && !h.HandlersSynced() {
			select {
			case <-sctx.Done():
				ok = false
			case <-time.After(2 * time.Millisecond):
			}
		}
		scancel()
		if !ok {
			t.Fatalf("cache of %s did not sync", h.GVR())
		}
	}
	w.wirings[ref.ID()] = wr
	return w, wr
}

// leadingWatcher is a leading watcher with no wirings yet, its informers
// on dyn, its outbox publishing nowhere.
func leadingWatcher(dyn dynamic.Interface) *Watcher {
	w := &Watcher{
		cfg:         Config{SnapshotWait: time.Second},
		log:         zap.NewNop(),
		registry:    informers.New(dyn, 0),
		wirings:     map[string]*wiring{},
		ctrlHandles: map[string]*informers.Handle{},
	}
	w.out = newOutbox(w.log, nil, nil, 0)
	w.metrics = newMetrics(nil, w)
	w.out.metrics = w.metrics
	w.leader.Store(true)
	return w
}

// pendingItem is a pending work item in comparable form.
type pendingItem struct {
	Parent, Reason string
	Echo           bool // caused by update events only
}

func pendingItems(w *Watcher) []pendingItem {
	w.out.mu.Lock()
	defer w.out.mu.Unlock()
	var out []pendingItem
	for key, item := range w.out.pending {
		s := w.out.suspects[key]
		out = append(out, pendingItem{Parent: item.Parent.Name, Reason: item.Reason, Echo: s != nil && !s.news})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Parent < out[j].Parent })
	return out
}

// TestWiringEvents drives the generic wiring of each kind with informer
// events and checks which parents get a work item.
func TestWiringEvents(t *testing.T) {
	app := map[string]string{"app": "x"}
	mark := map[string]string{decorator.ControllerAnnotation: "deco"}
	withStatus := func(u *unstructured.Unstructured, rv string, status string) *unstructured.Unstructured {
		c := u.DeepCopy()
		c.SetResourceVersion(rv)
		c.Object["status"] = map[string]any{"phase": status}
		return c
	}
	withLabels := func(u *unstructured.Unstructured, rv string, lbls map[string]string) *unstructured.Unstructured {
		c := u.DeepCopy()
		c.SetResourceVersion(rv)
		c.SetLabels(lbls)
		return c
	}
	p := thing("p", "10", map[string]string{"deco": "yes"}, map[string]any{"app": "x"})
	q := thing("q", "11", map[string]string{"deco": "yes"}, map[string]any{"app": "y"})
	unselected := thing("u", "12", nil, map[string]any{"app": "x"})
	type event struct {
		parent   bool // a parent-source event, else an owned-source one
		old, obj *unstructured.Unstructured
	}
	cases := []struct {
		reason string
		ctrl   *unstructured.Unstructured
		events []event
		want   []pendingItem
	}{
		{
			reason: "composite: a child created for its owner",
			ctrl:   compositeObj,
			events: []event{{obj: configMap("c", "20", app, nil, "p")}},
			want:   []pendingItem{{Parent: "p", Reason: bus.ReasonEvent}},
		},
		{
			reason: "composite: a child updated under the same owner may be our own write",
			ctrl:   compositeObj,
			events: []event{{old: configMap("c", "20", app, nil, "p"), obj: configMap("c", "21", app, nil, "p")}},
			want:   []pendingItem{{Parent: "p", Reason: bus.ReasonEvent, Echo: true}},
		},
		{
			reason: "composite: an informer resync (same resourceVersion) is nothing",
			ctrl:   compositeObj,
			events: []event{{old: configMap("c", "20", app, nil, "p"), obj: configMap("c", "20", app, nil, "p")}},
		},
		{
			reason: "composite: a child moving to another parent tells both",
			ctrl:   compositeObj,
			events: []event{{old: configMap("c", "20", app, nil, "p"), obj: configMap("c", "21", app, nil, "q")}},
			want:   []pendingItem{{Parent: "p", Reason: bus.ReasonEvent}, {Parent: "q", Reason: bus.ReasonEvent}},
		},
		{
			reason: "composite: an orphan goes to every selected parent whose selector matches it",
			ctrl:   compositeObj,
			events: []event{{obj: configMap("o", "22", app, nil, "")}},
			want:   []pendingItem{{Parent: "p", Reason: bus.ReasonEvent}},
		},
		{
			reason: "composite: a child of a parent of another kind is nobody's business",
			ctrl:   compositeObj,
			events: []event{{obj: func() *unstructured.Unstructured {
				c := configMap("c", "20", app, nil, "")
				yes := true
				c.SetOwnerReferences([]metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "Thing", Name: "p", UID: "p-uid", Controller: &yes}})
				return c
			}()}},
		},
		{
			reason: "composite: a status-only parent change is ignored under ignoreStatusChanges; a label change is not",
			ctrl:   compositeObj,
			events: []event{
				{parent: true, old: p, obj: withStatus(p, "13", "done")},
				{parent: true, old: q, obj: withLabels(q, "14", map[string]string{"deco": "yes", "new": "1"})},
			},
			want: []pendingItem{{Parent: "q", Reason: bus.ReasonEvent, Echo: true}},
		},
		{
			reason: "decorator: an attachment created for its target",
			ctrl:   decoratorObj,
			events: []event{{obj: configMap("a", "20", nil, mark, "p")}},
			want:   []pendingItem{{Parent: "p", Reason: bus.ReasonEvent}},
		},
		{
			reason: "decorator: an unmarked object or an orphan is nobody's business (no adoption)",
			ctrl:   decoratorObj,
			events: []event{{obj: configMap("a", "20", nil, nil, "p")}, {obj: configMap("o", "21", app, mark, "")}},
		},
		{
			reason: "decorator: an attachment updated under the same target may be our own write",
			ctrl:   decoratorObj,
			events: []event{{old: configMap("a", "20", nil, mark, "p"), obj: configMap("a", "21", app, mark, "p")}},
			want:   []pendingItem{{Parent: "p", Reason: bus.ReasonEvent, Echo: true}},
		},
		{
			reason: "decorator: an object newly marked is news to its target",
			ctrl:   decoratorObj,
			events: []event{{old: configMap("a", "20", nil, nil, "p"), obj: configMap("a", "21", nil, mark, "p")}},
			want:   []pendingItem{{Parent: "p", Reason: bus.ReasonEvent}},
		},
		{
			reason: "decorator: an attachment of a target the selectors no longer select is ignored",
			ctrl:   decoratorObj,
			events: []event{{obj: configMap("a", "20", nil, mark, "u")}},
		},
		{
			reason: "decorator: a target status change is an event (no ignoreStatusChanges)",
			ctrl:   decoratorObj,
			events: []event{{parent: true, old: p, obj: withStatus(p, "13", "done")}},
			want:   []pendingItem{{Parent: "p", Reason: bus.ReasonEvent, Echo: true}},
		},
	}
	for _, tc := range cases {
		t.Run(tc.reason, func(t *testing.T) {
			w, wr := wired(t, tc.ctrl, p.DeepCopy(), q.DeepCopy(), unselected.DeepCopy())
			// The parents listed at start were resynced; start afresh.
			if got, want := len(pendingItems(w)), 2; got != want {
				t.Errorf("%d parents resynced at start, want the %d selected ones", got, want)
			}
			w.out.shutDown()
			w.out = newOutbox(w.log, nil, nil, 0)
			w.out.metrics = w.metrics
			for _, e := range tc.events {
				var old any
				if e.old != nil {
					old = e.old
				}
				if e.parent {
					wr.onParent(&wr.plan.Parents[0], old, e.obj)
					continue
				}
				before := pendingItems(w)
				wr.onOwned(configmapsGVR, old, e.obj)
				// The registry routes owned events by ownedInterest: it
				// may leave out only events that change nothing.
				var oldMeta metav1.Object
				if e.old != nil {
					oldMeta = e.old
				}
				if !cmp.Equal(before, pendingItems(w)) && !ownedInterest(wr.plan).Matches(oldMeta, e.obj) {
					t.Errorf("an event that enqueues work would not be routed to the wiring: %s", e.obj.GetName())
				}
			}
			if diff := cmp.Diff(tc.want, pendingItems(w)); diff != "" {
				t.Errorf("pending work items (-want +got):\n%s", diff)
			}
		})
	}
}

// TestWiringSnapshot: the snapshot of a parent of each kind, through the
// watcher's snapshot.Source.
func TestWiringSnapshot(t *testing.T) {
	app := map[string]string{"app": "x"}
	mark := map[string]string{decorator.ControllerAnnotation: "deco"}
	objs := []runtime.Object{
		thing("p", "10", map[string]string{"deco": "yes"}, map[string]any{"app": "x"}),
		configMap("kept", "20", app, mark, "p"),
		configMap("strayed", "21", map[string]string{"app": "y"}, nil, "p"),
		configMap("orphan", "22", app, nil, ""),
	}
	type group struct{ Objects, Adopt, Release []string }
	type summary struct {
		Result, Message, Parent, ParentResource string
		ParentHasStatus                         bool
		Controller                              string
		Children                                []group
	}
	names := func(objs []*unstructured.Unstructured) []string {
		var out []string
		for _, o := range objs {
			out = append(out, o.GetName())
		}
		sort.Strings(out)
		return out
	}
	cases := []struct {
		reason    string
		ctrl      *unstructured.Unstructured
		parentUID string
		want      summary
	}{
		{
			reason: "composite: kept and adopted children shown, the strayed one released",
			ctrl:   compositeObj, parentUID: "p-uid",
			want: summary{Result: snapshot.OK, Parent: "p", ParentResource: "things", ParentHasStatus: true, Controller: "comp",
				Children: []group{{Objects: []string{"kept", "orphan"}, Adopt: []string{"orphan"}, Release: []string{"strayed"}}}},
		},
		{
			reason: "decorator: only the marked attachment",
			ctrl:   decoratorObj, parentUID: "p-uid",
			want: summary{Result: snapshot.OK, Parent: "p", ParentResource: "things", ParentHasStatus: true, Controller: "deco",
				Children: []group{{Objects: []string{"kept"}}}},
		},
		{
			reason: "an unknown parent is not found",
			ctrl:   compositeObj, parentUID: "nope",
			want: summary{Result: snapshot.NotFound, Message: "parent nope not found"},
		},
	}
	for _, tc := range cases {
		t.Run(tc.reason, func(t *testing.T) {
			w, wr := wired(t, tc.ctrl, objs...)
			var src snapshot.Source = w
			resp, err := src.Snapshot(context.Background(), snapshot.Request{Controller: wr.ref, ParentUID: tc.parentUID,
				MinResourceVersions: map[string]string{"/configmaps": "22"}})
			if err != nil {
				t.Fatal(err)
			}
			got := summary{Result: resp.Result, Message: resp.Message, ParentResource: resp.ParentResource, ParentHasStatus: resp.ParentHasStatus}
			if resp.Parent != nil {
				got.Parent = resp.Parent.GetName()
			}
			if resp.Controller != nil {
				got.Controller = resp.Controller.GetName()
			}
			for _, g := range resp.Children {
				got.Children = append(got.Children, group{Objects: names(g.Objects), Adopt: names(g.Adopt), Release: names(g.Release)})
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("snapshot (-want +got):\n%s", diff)
			}
		})
	}
}

// TestInstallReleases: replacing a controller's wiring releases the
// finalizer from the parents the new spec leaves nobody to finalize.
func TestInstallReleases(t *testing.T) {
	const f = "metacontroller.io/compositecontroller-comp"
	withFinalize := compositeObj.DeepCopy()
	withFinalize.SetResourceVersion("2") // decoded controllers are shared per version
	withFinalize.Object["spec"].(map[string]any)["hooks"] = map[string]any{"finalize": map[string]any{"webhook": map[string]any{"url": "http://x"}}}
	carrying := thing("p", "10", nil, map[string]any{"app": "x"})
	carrying.SetFinalizers([]string{f})
	w, old := wired(t, withFinalize, carrying, thing("q", "11", nil, map[string]any{"app": "y"}))
	ctrl, err := kindtable.Decode(compositeObj)
	if err != nil {
		t.Fatal(err)
	}
	plan, err := ctrl.WatchPlan(fakeResolve)
	if err != nil {
		t.Fatal(err)
	}
	w.out.shutDown()
	w.out = newOutbox(w.log, nil, nil, 0)
	w.out.metrics = w.metrics
	old.releaseFinalizers(old.plan.Rules.ReleaseOnReplace(plan), "test")
	w.out.mu.Lock()
	defer w.out.mu.Unlock()
	var got []string
	for _, item := range w.out.pending {
		got = append(got, item.Parent.Name+" "+item.Reason+" "+item.Finalizer)
	}
	if diff := cmp.Diff([]string{"p release " + f}, got); diff != "" {
		t.Errorf("releases (-want +got):\n%s", diff)
	}
}
