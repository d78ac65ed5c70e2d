package watcher

import (
	"context"
	"errors"
	"sort"
	"testing"

	"github.com/google/go-cmp/cmp"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"

	"github.com/metabus/metabus/pkg/apiresource"
	"github.com/metabus/metabus/pkg/bus"
	"github.com/metabus/metabus/pkg/kinds"
	"github.com/metabus/metabus/pkg/snapshot"
)

// A fake keyed kind: Things are parents, Widgets inputs, ConfigMaps
// outputs. A widget's key is "key-<name>"; an output's key is its "key"
// label; a thing selects the widgets of its namespace its
// spec.selector.matchLabels matches (spec.selector "bad": unusable).

var (
	widgetsGVR = schema.GroupVersionResource{Group: "example.com", Version: "v1", Resource: "widgets"}
	widgetsRes = &apiresource.Resource{GVR: widgetsGVR, Kind: "Widget", Namespaced: true}
	cmRes      = &apiresource.Resource{GVR: configmapsGVR, Kind: "ConfigMap", Namespaced: true}
	keyedRef   = bus.ControllerRef{Kind: "KeyedController", Name: "kc", UID: "kc-uid"}
)

func init() {
	fakeListKinds[widgetsGVR] = "WidgetList"
}

type fakeKeyedRules struct{}

func (fakeKeyedRules) Selects(*unstructured.Unstructured) bool { return true }

func (fakeKeyedRules) OwnerRef(obj *unstructured.Unstructured) *metav1.OwnerReference {
	return metav1.GetControllerOfNoCopy(obj)
}

func (fakeKeyedRules) WantsOrphan(_, _ *unstructured.Unstructured) bool { return false }

// Observe shows every output of the parent, whatever its key.
func (fakeKeyedRules) Observe(_ *apiresource.Resource, parent *unstructured.Unstructured, caches []kinds.WatchCache) ([]snapshot.Group, string) {
	groups := make([]snapshot.Group, len(caches))
	for i, c := range caches {
		groups[i] = snapshot.GroupOf(cmRes)
		groups[i].Objects = append(groups[i].Objects, c.OwnedBy(string(parent.GetUID()))...)
	}
	return groups, ""
}

func (fakeKeyedRules) ReleaseOnReplace(*kinds.WatchPlan) []bool { return nil }

func (fakeKeyedRules) InputKey(_ *apiresource.Resource, in *unstructured.Unstructured) (string, bool) {
	return "key-" + in.GetName(), in.GetUID() != ""
}

func (fakeKeyedRules) InputSelector(parent *unstructured.Unstructured) (kinds.InputSelector, error) {
	if s, _, _ := unstructured.NestedString(parent.Object, "spec", "selector"); s == "bad" {
		return nil, errors.New("spec.selector is bad")
	}
	m, _, _ := unstructured.NestedStringMap(parent.Object, "spec", "selector", "matchLabels")
	return fakeSelector{ns: parent.GetNamespace(), parent: parent.GetUID(), sel: labels.SelectorFromSet(m)}, nil
}

func (fakeKeyedRules) OutputKey(owned *unstructured.Unstructured) (string, bool) {
	k, ok := owned.GetLabels()["key"]
	return k, ok
}

// Summarize lists the names it was given, per group.
func (fakeKeyedRules) Summarize(_ *unstructured.Unstructured, inputs, outputs []snapshot.Group) map[string]any {
	names := func(groups []snapshot.Group) []any {
		out := []any{}
		for _, g := range groups {
			var ns []string
			for _, o := range g.Objects {
				ns = append(ns, o.GetName())
			}
			sort.Strings(ns)
			out = append(out, ns)
		}
		return out
	}
	return map[string]any{"inputs": names(inputs), "outputs": names(outputs)}
}

type fakeSelector struct {
	ns     string
	parent types.UID
	sel    labels.Selector
}

func (s fakeSelector) Namespace() string { return s.ns }

func (s fakeSelector) Selects(in *unstructured.Unstructured) bool {
	ref := metav1.GetControllerOfNoCopy(in)
	return s.sel.Matches(labels.Set(in.GetLabels())) && (ref == nil || ref.UID != s.parent)
}

func keyedPlan() *kinds.WatchPlan {
	return &kinds.WatchPlan{
		Parents: []kinds.WatchParent{{Res: thingsRes, IgnoreStatusChanges: true}},
		Owned:   []*apiresource.Resource{cmRes},
		Rules:   fakeKeyedRules{},
		Keyed:   &kinds.KeyedPlan{Inputs: []*apiresource.Resource{widgetsRes}, Rules: fakeKeyedRules{}},
	}
}

func wiredKeyed(t *testing.T, objs ...runtime.Object) (*Watcher, *wiring) {
	t.Helper()
	return wiredPlan(t, keyedRef, controllerObj("KeyedController", "kc", map[string]any{}), keyedPlan(), objs...)
}

// widget is an input in namespace ns.
func widget(ns, name, rv string, lbls map[string]string) *unstructured.Unstructured {
	u := testObject("example.com/v1", "Widget", ns, name, name+"-uid", rv)
	u.SetLabels(lbls)
	return u
}

// output is a ConfigMap owned by owner (a Thing), tagged with key
// (none if "").
func output(name, rv, owner, key string) *unstructured.Unstructured {
	var lbls map[string]string
	if key != "" {
		lbls = map[string]string{"key": key}
	}
	return configMap(name, rv, lbls, nil, owner)
}

// keyedItem is a pending work item in comparable form.
type keyedItem struct {
	Parent, Key, Reason string
	Echo                bool // caused by update events only
	Prompt              bool // waiting in the resync lanes' prompt lane
}

func keyedItems(w *Watcher) []keyedItem {
	w.out.mu.Lock()
	defer w.out.mu.Unlock()
	w.out.resyncs.mu.Lock()
	defer w.out.resyncs.mu.Unlock()
	var out []keyedItem
	for key, item := range w.out.pending {
		s := w.out.suspects[key]
		slot := w.out.resyncs.queued[key]
		out = append(out, keyedItem{Parent: item.Parent.Name, Key: item.MapKey, Reason: item.Reason,
			Echo: s != nil && !s.news, Prompt: slot != nil && slot.parent != nil})
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Parent != out[j].Parent {
			return out[i].Parent < out[j].Parent
		}
		return out[i].Key < out[j].Key
	})
	return out
}

// resetOutbox drops what is pending.
func resetOutbox(w *Watcher) {
	w.out.shutDown()
	w.out = newOutbox(w.log, nil, nil, 0)
	w.out.metrics = w.metrics
}

// The fake cluster of the keyed event tests: p selects app=x, q app=y, r
// has an unusable selector, s selects app=x in another namespace. Widget
// w1 (app=x) is p's; output old is p's output of a key whose input is
// gone.
func keyedCluster() []runtime.Object {
	s := thing("s", "13", nil, map[string]any{"app": "x"})
	s.SetNamespace("other")
	r := thing("r", "12", nil, nil)
	r.Object["spec"] = map[string]any{"selector": "bad"}
	return []runtime.Object{
		thing("p", "10", nil, map[string]any{"app": "x"}),
		thing("q", "11", nil, map[string]any{"app": "y"}),
		r, s,
		widget("ns", "w1", "20", map[string]string{"app": "x"}),
		output("old", "30", "p", "key-gone"),
	}
}

// TestKeyedStart: a keyed wiring's start resyncs every parent and every
// key of it: its selected inputs' keys and its outputs' keys.
func TestKeyedStart(t *testing.T) {
	w, _ := wiredKeyed(t, keyedCluster()...)
	want := []keyedItem{
		{Parent: "p", Reason: bus.ReasonResync},
		{Parent: "p", Key: "key-gone", Reason: bus.ReasonResync},
		{Parent: "p", Key: "key-w1", Reason: bus.ReasonResync},
		{Parent: "q", Reason: bus.ReasonResync},
		{Parent: "r", Reason: bus.ReasonResync},
		{Parent: "s", Reason: bus.ReasonResync},
	}
	if diff := cmp.Diff(want, keyedItems(w)); diff != "" {
		t.Errorf("pending work items (-want +got):\n%s", diff)
	}
}

// TestKeyedEvents drives a keyed wiring with informer events and checks
// which (parent, key) units get a work item.
func TestKeyedEvents(t *testing.T) {
	x, y := map[string]string{"app": "x"}, map[string]string{"app": "y"}
	w1 := widget("ns", "w1", "20", x)
	o1 := output("o1", "40", "p", "key-w1")
	at := func(u *unstructured.Unstructured, rv string, edit func(*unstructured.Unstructured)) *unstructured.Unstructured {
		c := u.DeepCopy()
		c.SetResourceVersion(rv)
		if edit != nil {
			edit(c)
		}
		return c
	}
	p := keyedCluster()[0].(*unstructured.Unstructured)
	type event struct {
		source   string // "input", "output", "parent"
		ch       change
		old, obj *unstructured.Unstructured
	}
	cases := []struct {
		reason string
		events []event
		want   []keyedItem
	}{
		{
			reason: "an input created: its key of the one parent selecting it, and that parent's per-parent item (membership)",
			events: []event{{source: "input", ch: added, obj: widget("ns", "w2", "21", x)}},
			want:   []keyedItem{{Parent: "p", Reason: bus.ReasonEvent}, {Parent: "p", Key: "key-w2", Reason: bus.ReasonEvent}},
		},
		{
			reason: "an input in the cache at start: the same as resyncs",
			events: []event{{source: "input", ch: listed, obj: widget("ns", "w2", "21", x)}},
			want:   []keyedItem{{Parent: "p", Reason: bus.ReasonResync}, {Parent: "p", Key: "key-w2", Reason: bus.ReasonResync}},
		},
		{
			reason: "an input updated and still selected: its key only",
			events: []event{{source: "input", ch: updated, old: w1, obj: at(w1, "22", func(u *unstructured.Unstructured) { u.Object["spec"] = "new" })}},
			want:   []keyedItem{{Parent: "p", Key: "key-w1", Reason: bus.ReasonEvent}},
		},
		{
			reason: "an input moving from one parent's selector to another's: both keys and both per-parent items",
			events: []event{{source: "input", ch: updated, old: w1, obj: at(w1, "22", func(u *unstructured.Unstructured) { u.SetLabels(y) })}},
			want: []keyedItem{
				{Parent: "p", Reason: bus.ReasonEvent}, {Parent: "p", Key: "key-w1", Reason: bus.ReasonEvent},
				{Parent: "q", Reason: bus.ReasonEvent}, {Parent: "q", Key: "key-w1", Reason: bus.ReasonEvent},
			},
		},
		{
			reason: "an input deleted: its key and the per-parent item",
			events: []event{{source: "input", ch: deleted, old: w1}},
			want:   []keyedItem{{Parent: "p", Reason: bus.ReasonEvent}, {Parent: "p", Key: "key-w1", Reason: bus.ReasonEvent}},
		},
		{
			reason: "an input nobody selects, one in a namespace without parents, one its parent controls: nothing",
			events: []event{
				{source: "input", ch: added, obj: widget("ns", "w2", "21", map[string]string{"app": "z"})},
				{source: "input", ch: added, obj: widget("elsewhere", "w3", "22", x)},
				{source: "input", ch: added, obj: func() *unstructured.Unstructured {
					u := widget("ns", "w4", "23", x)
					yes := true
					u.SetOwnerReferences([]metav1.OwnerReference{{APIVersion: "example.com/v1", Kind: "Thing", Name: "p", UID: "p-uid", Controller: &yes}})
					return u
				}()},
			},
		},
		{
			reason: "an output created: its owner's key and per-parent item",
			events: []event{{source: "output", ch: added, obj: o1}},
			want:   []keyedItem{{Parent: "p", Reason: bus.ReasonEvent}, {Parent: "p", Key: "key-w1", Reason: bus.ReasonEvent}},
		},
		{
			reason: "an output in the cache at start: resyncs",
			events: []event{{source: "output", ch: listed, obj: o1}},
			want:   []keyedItem{{Parent: "p", Reason: bus.ReasonResync}, {Parent: "p", Key: "key-w1", Reason: bus.ReasonResync}},
		},
		{
			reason: "an output updated under the same owner and key: its key, as a possible echo; the summary has nothing to count",
			events: []event{{source: "output", ch: updated, old: o1, obj: at(o1, "41", func(u *unstructured.Unstructured) { u.Object["data"] = map[string]any{"a": "b"} })}},
			want:   []keyedItem{{Parent: "p", Key: "key-w1", Reason: bus.ReasonEvent, Echo: true}},
		},
		{
			reason: "an output's conditions changed: the per-parent item too, as news",
			events: []event{{source: "output", ch: updated, old: o1, obj: at(o1, "41", func(u *unstructured.Unstructured) {
				u.Object["status"] = map[string]any{"conditions": []any{map[string]any{"type": "Ready", "status": "True"}}}
			})}},
			want: []keyedItem{{Parent: "p", Reason: bus.ReasonEvent}, {Parent: "p", Key: "key-w1", Reason: bus.ReasonEvent, Echo: true}},
		},
		{
			reason: "an output being deleted: the per-parent item too",
			events: []event{{source: "output", ch: updated, old: o1, obj: at(o1, "41", func(u *unstructured.Unstructured) {
				now := metav1.Now()
				u.SetDeletionTimestamp(&now)
			})}},
			want: []keyedItem{{Parent: "p", Reason: bus.ReasonEvent}, {Parent: "p", Key: "key-w1", Reason: bus.ReasonEvent, Echo: true}},
		},
		{
			reason: "an output re-keyed: both keys and the per-parent item hear of it as news",
			events: []event{{source: "output", ch: updated, old: o1, obj: at(o1, "41", func(u *unstructured.Unstructured) { u.SetLabels(map[string]string{"key": "key-w9"}) })}},
			want: []keyedItem{
				{Parent: "p", Reason: bus.ReasonEvent},
				{Parent: "p", Key: "key-w1", Reason: bus.ReasonEvent},
				{Parent: "p", Key: "key-w9", Reason: bus.ReasonEvent},
			},
		},
		{
			reason: "an output moving to another owner: both owners' keys and per-parent items",
			events: []event{{source: "output", ch: updated, old: o1, obj: output("o1", "41", "q", "key-w1")}},
			want: []keyedItem{
				{Parent: "p", Reason: bus.ReasonEvent}, {Parent: "p", Key: "key-w1", Reason: bus.ReasonEvent},
				{Parent: "q", Reason: bus.ReasonEvent}, {Parent: "q", Key: "key-w1", Reason: bus.ReasonEvent},
			},
		},
		{
			reason: "an output deleted: its key and the per-parent item",
			events: []event{{source: "output", ch: deleted, obj: o1}},
			want:   []keyedItem{{Parent: "p", Reason: bus.ReasonEvent}, {Parent: "p", Key: "key-w1", Reason: bus.ReasonEvent}},
		},
		{
			reason: "an output without a key: only counted",
			events: []event{{source: "output", ch: added, obj: output("o2", "42", "p", "")}},
			want:   []keyedItem{{Parent: "p", Reason: bus.ReasonEvent}},
		},
		{
			reason: "an output of no cached parent: nothing",
			events: []event{
				{source: "output", ch: added, obj: output("o2", "42", "nobody", "key-w1")},
			},
		},
		{
			reason: "a parent created: its per-parent item, and every key of it (selected inputs, outputs) as prompt resyncs",
			events: []event{{source: "parent", ch: added, obj: p}},
			want: []keyedItem{
				{Parent: "p", Reason: bus.ReasonEvent},
				{Parent: "p", Key: "key-gone", Reason: bus.ReasonResync, Prompt: true},
				{Parent: "p", Key: "key-w1", Reason: bus.ReasonResync, Prompt: true},
			},
		},
		{
			reason: "a parent's spec changed: the same, its per-parent item as a possible echo",
			events: []event{{source: "parent", ch: updated, old: p, obj: at(p, "14", func(u *unstructured.Unstructured) { u.SetGeneration(2) })}},
			want: []keyedItem{
				{Parent: "p", Reason: bus.ReasonEvent, Echo: true},
				{Parent: "p", Key: "key-gone", Reason: bus.ReasonResync, Prompt: true},
				{Parent: "p", Key: "key-w1", Reason: bus.ReasonResync, Prompt: true},
			},
		},
		{
			reason: "a parent's status written (the controller's own aggregation): nothing, no fan-out",
			events: []event{{source: "parent", ch: updated, old: p, obj: at(p, "14", func(u *unstructured.Unstructured) { u.Object["status"] = map[string]any{"widgets": int64(1)} })}},
		},
	}
	for _, tc := range cases {
		t.Run(tc.reason, func(t *testing.T) {
			w, wr := wiredKeyed(t, keyedCluster()...)
			resetOutbox(w)
			for _, e := range tc.events {
				switch e.source {
				case "input":
					wr.onInput(0, e.old, e.obj, e.ch)
				case "output":
					wr.onOutput(0, e.old, e.obj, e.ch)
				case "parent":
					var old any
					if e.old != nil {
						old = e.old
					}
					wr.onParent(&wr.plan.Parents[0], old, e.obj)
				}
			}
			if diff := cmp.Diff(tc.want, keyedItems(w)); diff != "" {
				t.Errorf("pending work items (-want +got):\n%s", diff)
			}
		})
	}
}

// TestKeyedResync: a resync (cache flush, resync period, new leader)
// fans out to the keys of each parent like the start does, and a key whose
// outputs are all gone is no key any more.
func TestKeyedResync(t *testing.T) {
	w, wr := wiredKeyed(t, keyedCluster()...)
	wr.onOutput(0, nil, output("old", "31", "p", "key-gone"), deleted)
	wr.onOutput(0, nil, output("o5", "32", "s", "key-s"), added)
	resetOutbox(w)
	wr.resync(bus.ReasonResync)
	want := []keyedItem{
		{Parent: "p", Reason: bus.ReasonResync},
		{Parent: "p", Key: "key-w1", Reason: bus.ReasonResync},
		{Parent: "q", Reason: bus.ReasonResync},
		{Parent: "r", Reason: bus.ReasonResync},
		{Parent: "s", Reason: bus.ReasonResync},
		{Parent: "s", Key: "key-s", Reason: bus.ReasonResync},
	}
	if diff := cmp.Diff(want, keyedItems(w)); diff != "" {
		t.Errorf("pending work items (-want +got):\n%s", diff)
	}
}

// TestKeyedFollower: a replica that does not lead publishes nothing but
// keeps its indexes, so it can serve snapshots once it leads.
func TestKeyedFollower(t *testing.T) {
	w, wr := wiredKeyed(t, keyedCluster()...)
	resetOutbox(w)
	w.leader.Store(false)
	wr.onInput(0, nil, widget("ns", "w2", "21", map[string]string{"app": "x"}), added)
	wr.onOutput(0, nil, output("o2", "42", "p", "key-w2"), added)
	wr.onParent(&wr.plan.Parents[0], nil, keyedCluster()[0])
	if got := keyedItems(w); len(got) != 0 {
		t.Errorf("a follower enqueued %v", got)
	}
	if _, ok := wr.keyed.input("key-w2"); !ok {
		t.Error("a follower's input index missed an added input")
	}
	if got := wr.keyed.outputsOf("p-uid", "key-w2")[0]; len(got) != 1 {
		t.Errorf("a follower's output index has %d outputs of the added one's key, want 1", len(got))
	}
}

// TestKeyedSnapshot: what a keyed plan's snapshots hold, per map key and
// for the parent as a whole.
func TestKeyedSnapshot(t *testing.T) {
	r := thing("r", "12", nil, nil)
	r.Object["spec"] = map[string]any{"selector": "bad"}
	objs := []runtime.Object{
		thing("p", "10", nil, map[string]any{"app": "x"}),
		r,
		widget("ns", "w1", "20", map[string]string{"app": "x"}),
		widget("ns", "w2", "21", map[string]string{"app": "y"}),
		widget("other", "w3", "22", map[string]string{"app": "x"}),
		output("o1", "30", "p", "key-w1"),
		output("o2", "31", "p", "key-w1"),
		output("o3", "32", "p", "key-w2"),
		output("o4", "33", "p", "key-gone"),
		output("o5", "34", "p", ""),
		output("o6", "35", "r", "key-w1"),
	}
	type summary struct {
		Result, Message, Parent, MapKey, Input, SelectorError string
		Children                                              [][]string // nil: no children at all
		Summary                                               map[string]any
	}
	names := func(objs []*unstructured.Unstructured) []string {
		out := []string{}
		for _, o := range objs {
			out = append(out, o.GetName())
		}
		return out
	}
	cases := []struct {
		reason    string
		parentUID string
		mapKey    string
		want      summary
	}{
		{
			reason:    "a key whose input the parent selects: the input and only the key's outputs",
			parentUID: "p-uid", mapKey: "key-w1",
			want: summary{Result: snapshot.OK, Parent: "p", MapKey: "key-w1", Input: "w1", Children: [][]string{{"o1", "o2"}}},
		},
		{
			reason:    "a key whose input exists but is not selected: detached, no input",
			parentUID: "p-uid", mapKey: "key-w2",
			want: summary{Result: snapshot.OK, Parent: "p", MapKey: "key-w2", Children: [][]string{{"o3"}}},
		},
		{
			reason:    "a key whose input is gone: detached, its outputs still shown",
			parentUID: "p-uid", mapKey: "key-gone",
			want: summary{Result: snapshot.OK, Parent: "p", MapKey: "key-gone", Children: [][]string{{"o4"}}},
		},
		{
			reason:    "a key of an input in another namespace: not the parent's",
			parentUID: "p-uid", mapKey: "key-w3",
			want: summary{Result: snapshot.OK, Parent: "p", MapKey: "key-w3", Children: [][]string{{}}},
		},
		{
			reason:    "the parent as a whole: its summary of selected inputs and every output, no children",
			parentUID: "p-uid",
			want: summary{Result: snapshot.OK, Parent: "p", Summary: map[string]any{
				"inputs": []any{[]string{"w1"}}, "outputs": []any{[]string{"o1", "o2", "o3", "o4", "o5"}},
			}},
		},
		{
			reason:    "a key of a parent whose selector is unusable: the error, no input",
			parentUID: "r-uid", mapKey: "key-w1",
			want: summary{Result: snapshot.OK, Parent: "r", MapKey: "key-w1", SelectorError: "spec.selector is bad", Children: [][]string{{"o6"}}},
		},
		{
			reason:    "the parent as a whole with an unusable selector: the error, no inputs counted",
			parentUID: "r-uid",
			want: summary{Result: snapshot.OK, Parent: "r", SelectorError: "spec.selector is bad", Summary: map[string]any{
				"inputs": []any{[]string(nil)}, "outputs": []any{[]string{"o6"}},
			}},
		},
		{
			reason:    "an unknown parent is not found",
			parentUID: "nope", mapKey: "key-w1",
			want: summary{Result: snapshot.NotFound, Message: "parent nope not found"},
		},
	}
	w, wr := wiredKeyed(t, objs...)
	for _, tc := range cases {
		t.Run(tc.reason, func(t *testing.T) {
			resp, err := w.Snapshot(context.Background(), snapshot.Request{Controller: wr.ref, ParentUID: tc.parentUID, MapKey: tc.mapKey,
				MinResourceVersions: map[string]string{"/configmaps": "35", "example.com/widgets": "22"}})
			if err != nil {
				t.Fatal(err)
			}
			got := summary{Result: resp.Result, Message: resp.Message, MapKey: resp.MapKey, SelectorError: resp.SelectorError, Summary: resp.Summary}
			if resp.Parent != nil {
				got.Parent = resp.Parent.GetName()
			}
			if resp.Input != nil {
				got.Input = resp.Input.GetName()
			}
			for _, g := range resp.Children {
				if g.Resource != "configmaps" || g.Kind != "ConfigMap" || g.APIVersion != "v1" || !g.Namespaced {
					t.Errorf("group %+v does not describe the owned resource", g)
				}
				got.Children = append(got.Children, names(g.Objects))
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("snapshot (-want +got):\n%s", diff)
			}
		})
	}
}

// TestKeyedSnapshotOfPerParentKind: a per-parent kind has no map keys.
func TestKeyedSnapshotOfPerParentKind(t *testing.T) {
	w, wr := wired(t, compositeObj, thing("p", "10", map[string]string{"deco": "yes"}, nil))
	resp, _ := w.Snapshot(context.Background(), snapshot.Request{Controller: wr.ref, ParentUID: "p-uid", MapKey: "key-w1"})
	if resp.Result != snapshot.Invalid {
		t.Errorf("result %q (%s), want %q", resp.Result, resp.Message, snapshot.Invalid)
	}
}

// TestKeyedOutputIndex: the (owner, key) index of outputs follows their
// owner and key through updates and deletes.
func TestKeyedOutputIndex(t *testing.T) {
	type op struct {
		res            int
		name, owner    string
		key            string
		del, unindexed bool // delete; put without a key or owner
	}
	type view map[string]map[string][][]string // owner → key → names per resource
	cases := []struct {
		reason string
		ops    []op
		want   view
	}{
		{
			reason: "outputs grouped by owner, key and resource",
			ops:    []op{{name: "a", owner: "p", key: "k1"}, {name: "b", owner: "p", key: "k1"}, {res: 1, name: "c", owner: "p", key: "k1"}, {name: "d", owner: "q", key: "k1"}},
			want:   view{"p": {"k1": {{"a", "b"}, {"c"}}}, "q": {"k1": {{"d"}, {}}}},
		},
		{
			reason: "a re-keyed output moves; an emptied key disappears",
			ops:    []op{{name: "a", owner: "p", key: "k1"}, {name: "a", owner: "p", key: "k2"}},
			want:   view{"p": {"k2": {{"a"}, {}}}},
		},
		{
			reason: "a re-owned output moves; an emptied owner disappears",
			ops:    []op{{name: "a", owner: "p", key: "k1"}, {name: "a", owner: "q", key: "k1"}},
			want:   view{"q": {"k1": {{"a"}, {}}}},
		},
		{
			reason: "an output losing its key or owner leaves the index",
			ops:    []op{{name: "a", owner: "p", key: "k1"}, {name: "b", owner: "p", key: "k1"}, {name: "a", unindexed: true}},
			want:   view{"p": {"k1": {{"b"}, {}}}},
		},
		{
			reason: "a deleted output leaves the index; one of another resource with the same UID is another object",
			ops:    []op{{name: "a", owner: "p", key: "k1"}, {res: 1, name: "a", owner: "p", key: "k1"}, {name: "a", del: true}},
			want:   view{"p": {"k1": {{}, {"a"}}}},
		},
		{
			reason: "deleting what is not indexed is nothing",
			ops:    []op{{name: "a", del: true}},
			want:   view{},
		},
	}
	for _, tc := range cases {
		t.Run(tc.reason, func(t *testing.T) {
			s := newKeyedState(2)
			for _, o := range tc.ops {
				obj := testObject("v1", "ConfigMap", "ns", o.name, o.name+"-uid", "1")
				if o.del {
					s.removeOutput(o.res, obj.GetUID())
					continue
				}
				s.putOutput(o.res, obj, outputPlace{owner: types.UID(o.owner), key: o.key}, !o.unindexed)
			}
			got := view{}
			for owner := range s.outputs {
				got[string(owner)] = map[string][][]string{}
				for _, key := range s.outputKeys(owner) {
					var groups [][]string
					for _, g := range s.outputsOf(owner, key) {
						n := []string{}
						for _, o := range g {
							n = append(n, o.GetName())
						}
						groups = append(groups, n)
					}
					got[string(owner)][key] = groups
				}
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("index (-want +got):\n%s", diff)
			}
		})
	}
}

// TestKeyedInputIndex: the map-key index of inputs.
func TestKeyedInputIndex(t *testing.T) {
	a := widget("ns", "a", "1", nil)
	other := widget("ns", "b", "1", nil)
	s := newKeyedState(1)
	s.setInput(0, nil, "", false, a, "k-a", true)
	if in, ok := s.input("k-a"); !ok || in.obj != a {
		t.Fatalf("added input not indexed: %v %v", in, ok)
	}
	// A stale delete of another object under the same key keeps it.
	s.setInput(0, other, "k-a", true, nil, "", false)
	if _, ok := s.input("k-a"); !ok {
		t.Error("a delete of another object dropped the input")
	}
	s.setInput(0, a, "k-a", true, nil, "", false)
	if _, ok := s.input("k-a"); ok {
		t.Error("a deleted input is still indexed")
	}
}
