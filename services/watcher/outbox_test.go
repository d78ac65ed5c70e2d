package watcher

import (
	"strconv"
	"testing"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/zap"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"

	"github.com/metabus/metabus/pkg/apiresource"
	"github.com/metabus/metabus/pkg/bus"
	"github.com/metabus/metabus/pkg/echo"
)

var (
	thingsGVR     = schema.GroupVersionResource{Group: "example.com", Version: "v1", Resource: "things"}
	configmapsGVR = schema.GroupVersionResource{Version: "v1", Resource: "configmaps"}
	thingsRes     = &apiresource.Resource{GVR: thingsGVR, Kind: "Thing", Namespaced: true, HasStatus: true}
)

func testObject(apiVersion, kind, ns, name, uid, rv string) *unstructured.Unstructured {
	u := &unstructured.Unstructured{Object: map[string]any{}}
	u.SetAPIVersion(apiVersion)
	u.SetKind(kind)
	u.SetNamespace(ns)
	u.SetName(name)
	u.SetUID(types.UID(uid))
	u.SetResourceVersion(rv)
	return u
}

// TestOutboxMerge: how what happens to one parent merges into its one
// pending item, and which queue publishes it.
func TestOutboxMerge(t *testing.T) {
	ref := bus.ControllerRef{Kind: "CompositeController", Name: "c", UID: "cu"}
	parent := testObject("example.com/v1", "Thing", "ns", "p", "pu", "10")
	child := testObject("v1", "ConfigMap", "ns", "k", "ku", "21")
	event := func(gvr schema.GroupVersionResource, rv string) entry {
		return entry{ref: ref, parentRes: thingsRes, parent: parent, reason: bus.ReasonEvent, gvr: gvr, rv: rv}
	}
	update := func(obj *unstructured.Unstructured, gvr schema.GroupVersionResource) entry {
		e := event(gvr, obj.GetResourceVersion())
		e.update = obj
		return e
	}
	resync := func(rv string) entry {
		return entry{ref: ref, parentRes: thingsRes, parent: parent, reason: bus.ReasonResync, gvr: thingsGVR, rv: rv}
	}
	release := func(f string) entry {
		return entry{ref: ref, parentRes: thingsRes, parent: parent, reason: bus.ReasonRelease, gvr: thingsGVR, finalizer: f}
	}
	manyUpdates := make([]entry, maxSuspects+1)
	for i := range manyUpdates {
		manyUpdates[i] = update(testObject("v1", "ConfigMap", "ns", "k", "ku", strconv.Itoa(30+i)), configmapsGVR)
	}
	type state struct {
		Reason, Finalizer   string
		MinResourceVersions map[string]string
		Attempt             int
		News                bool
		Updates             int
		Published, Resyncs  int // keys in the publish and resync queues
	}
	cases := []struct {
		reason  string
		entries []entry
		want    state
	}{
		{
			reason:  "a lone change: an event item with its freshness requirement, published at once",
			entries: []entry{event(thingsGVR, "10")},
			want:    state{Reason: bus.ReasonEvent, MinResourceVersions: map[string]string{"example.com/things": "10"}, News: true, Published: 1},
		},
		{
			reason:  "a resync waits in the resync queue, paced by the backlog",
			entries: []entry{resync("")},
			want:    state{Reason: bus.ReasonResync, MinResourceVersions: map[string]string{}, News: true, Resyncs: 1},
		},
		{
			reason:  "a real change outranks a pending resync: the publish queue takes it",
			entries: []entry{resync("10"), event(configmapsGVR, "21")},
			want: state{Reason: bus.ReasonEvent, MinResourceVersions: map[string]string{"example.com/things": "10", "/configmaps": "21"},
				News: true, Published: 1, Resyncs: 1},
		},
		{
			reason:  "a resync does not demote a pending change",
			entries: []entry{event(thingsGVR, "10"), resync("")},
			want:    state{Reason: bus.ReasonEvent, MinResourceVersions: map[string]string{"example.com/things": "10"}, News: true, Published: 1},
		},
		{
			reason:  "a release stays a release whatever changes after it",
			entries: []entry{release("f"), event(configmapsGVR, "21"), resync("")},
			want: state{Reason: bus.ReasonRelease, Finalizer: "f", MinResourceVersions: map[string]string{"/configmaps": "21"},
				News: true, Published: 1},
		},
		{
			reason:  "a release takes over a pending change",
			entries: []entry{event(thingsGVR, "10"), release("f")},
			want: state{Reason: bus.ReasonRelease, Finalizer: "f", MinResourceVersions: map[string]string{"example.com/things": "10"},
				News: true, Published: 1},
		},
		{
			reason:  "a release takes over a pending resync and leaves the resync queue for the publish queue",
			entries: []entry{resync(""), release("f")},
			want:    state{Reason: bus.ReasonRelease, Finalizer: "f", MinResourceVersions: map[string]string{}, News: true, Published: 1, Resyncs: 1},
		},
		{
			reason:  "freshness keeps the highest resourceVersion per resource",
			entries: []entry{event(configmapsGVR, "27"), event(configmapsGVR, "25"), event(thingsGVR, "11")},
			want: state{Reason: bus.ReasonEvent, MinResourceVersions: map[string]string{"/configmaps": "27", "example.com/things": "11"},
				News: true, Published: 1},
		},
		{
			reason:  "update events alone may be echoes: listed, not news",
			entries: []entry{update(parent, thingsGVR), update(child, configmapsGVR)},
			want: state{Reason: bus.ReasonEvent, MinResourceVersions: map[string]string{"example.com/things": "10", "/configmaps": "21"},
				Updates: 2, Published: 1},
		},
		{
			reason:  "an update merged with a create (no update object) is news",
			entries: []entry{update(child, configmapsGVR), event(configmapsGVR, "22")},
			want: state{Reason: bus.ReasonEvent, MinResourceVersions: map[string]string{"/configmaps": "22"},
				News: true, Updates: 1, Published: 1},
		},
		{
			reason:  "past maxSuspects updates the item is simply news",
			entries: manyUpdates,
			want: state{Reason: bus.ReasonEvent, MinResourceVersions: map[string]string{"/configmaps": strconv.Itoa(30 + maxSuspects)},
				News: true, Updates: maxSuspects, Published: 1},
		},
	}
	for _, tc := range cases {
		t.Run(tc.reason, func(t *testing.T) {
			o := newOutbox(zap.NewNop(), nil, nil, 0)
			defer o.shutDown()
			for _, e := range tc.entries {
				o.add(e)
			}
			key := workKey(ref, "pu", "")
			item, sus := o.pending[key], o.suspects[key]
			if item == nil || sus == nil {
				t.Fatalf("no pending item for %s", key)
			}
			got := state{
				Reason: item.Reason, Finalizer: item.Finalizer, MinResourceVersions: item.MinResourceVersions, Attempt: item.Attempt,
				News: sus.news, Updates: len(sus.updates), Published: o.queue.Len(), Resyncs: o.resyncs.len(),
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
			wantParent := bus.ObjectRef{APIVersion: "example.com/v1", Kind: "Thing", Resource: "things", Namespace: "ns", Name: "p", UID: "pu"}
			if diff := cmp.Diff(wantParent, item.Parent); diff != "" {
				t.Errorf("the item names its parent by the parent source (-want +got):\n%s", diff)
			}
		})
	}
}

// TestMergeFailed: an item whose publish failed goes back into the newer
// pending item of its parent.
func TestMergeFailed(t *testing.T) {
	item := func(reason, finalizer string, attempt int, mrv map[string]string) *bus.WorkItem {
		return &bus.WorkItem{Reason: reason, Finalizer: finalizer, Attempt: attempt, MinResourceVersions: mrv}
	}
	cases := []struct {
		reason        string
		newer, failed *bus.WorkItem
		want          *bus.WorkItem
	}{
		{
			reason: "both freshness requirements hold, the highest per resource",
			newer:  item(bus.ReasonEvent, "", 0, map[string]string{"/configmaps": "5", "g/r": "9"}),
			failed: item(bus.ReasonEvent, "", 0, map[string]string{"/configmaps": "7", "g/s": "1"}),
			want:   item(bus.ReasonEvent, "", 0, map[string]string{"/configmaps": "7", "g/r": "9", "g/s": "1"}),
		},
		{
			reason: "a failed release stays a release, with its finalizer",
			newer:  item(bus.ReasonEvent, "", 0, map[string]string{}),
			failed: item(bus.ReasonRelease, "f", 0, map[string]string{}),
			want:   item(bus.ReasonRelease, "f", 0, map[string]string{}),
		},
		{
			reason: "otherwise the newer item keeps its reason (and its attempt count)",
			newer:  item(bus.ReasonResync, "", 2, map[string]string{}),
			failed: item(bus.ReasonEvent, "", 0, map[string]string{"/configmaps": "3"}),
			want:   item(bus.ReasonResync, "", 2, map[string]string{"/configmaps": "3"}),
		},
		{
			reason: "a newer release keeps its finalizer over a failed change",
			newer:  item(bus.ReasonRelease, "f", 0, map[string]string{}),
			failed: item(bus.ReasonEvent, "", 0, map[string]string{}),
			want:   item(bus.ReasonRelease, "f", 0, map[string]string{}),
		},
	}
	for _, tc := range cases {
		t.Run(tc.reason, func(t *testing.T) {
			mergeFailed(tc.newer, tc.failed)
			if diff := cmp.Diff(tc.want, tc.newer); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}

// TestPutBack: a failed item with nothing newer is pending again as it
// was.
func TestPutBack(t *testing.T) {
	o := newOutbox(zap.NewNop(), nil, nil, 0)
	defer o.shutDown()
	failed := &bus.WorkItem{Reason: bus.ReasonRelease, Finalizer: "f", MinResourceVersions: map[string]string{}}
	o.putBack("k", failed)
	if o.pending["k"] != failed {
		t.Errorf("pending = %+v, want the failed item back", o.pending["k"])
	}
}

func TestEchoOnly(t *testing.T) {
	ctrl := bus.ControllerRef{Kind: "CompositeController", Name: "c"}
	book := echo.NewBook(0)
	book.Record(&bus.Applied{Controller: ctrl, ParentUID: "p", Writes: []bus.Write{
		{UID: "p", From: "1", To: "2"}, {UID: "k", From: "5", To: "6"},
	}})
	o := &outbox{echoes: book}
	cases := []struct {
		reason string
		ctrl   string
		sus    *suspects
		want   bool
	}{
		{"every event behind the item was our write", ctrl.ID(),
			&suspects{updates: [][2]string{{"p", "2"}, {"k", "6"}}}, true},
		{"one event is a version we did not write", ctrl.ID(),
			&suspects{updates: [][2]string{{"p", "2"}, {"k", "7"}}}, false},
		{"a create, delete, resync or mapped change is always published", ctrl.ID(),
			&suspects{news: true, updates: [][2]string{{"p", "2"}}}, false},
		{"one controller's write is news to another", bus.ControllerID("DecoratorController", "d"),
			&suspects{updates: [][2]string{{"p", "2"}}}, false},
		{"no suspects at all: publish", ctrl.ID(), nil, false},
		{"an empty record is not an echo", ctrl.ID(), &suspects{}, false},
	}
	for _, tc := range cases {
		t.Run(tc.reason, func(t *testing.T) {
			if got := o.echoOnly(tc.ctrl, tc.sus); got != tc.want {
				t.Errorf("echoOnly = %v, want %v", got, tc.want)
			}
		})
	}
}

// TestOutboxItemKeys: a keyed kind's units of work are (parent, map key):
// entries of one key merge into its one item, which names the key; two
// keys of a parent, and a key and the parent's per-parent item, never
// merge.
func TestOutboxItemKeys(t *testing.T) {
	ref := bus.ControllerRef{Kind: "MapLikeController", Name: "m", UID: "mu"}
	parent := testObject("example.com/v1", "Thing", "ns", "p", "pu", "10")
	at := func(mapKey, reason, rv string, prompt bool) entry {
		return entry{ref: ref, parentRes: thingsRes, parent: parent, mapKey: mapKey, reason: reason, gvr: configmapsGVR, rv: rv, prompt: prompt}
	}
	type item struct {
		MapKey, Reason      string
		MinResourceVersions map[string]string
	}
	cases := []struct {
		reason             string
		entries            []entry
		want               map[string]item // by outbox key
		published, resyncs int
	}{
		{
			reason:  "two keys of a parent and its per-parent item are three items",
			entries: []entry{at("k1", bus.ReasonEvent, "20", false), at("k2", bus.ReasonEvent, "21", false), at("", bus.ReasonEvent, "22", false)},
			want: map[string]item{
				bus.ItemKey(ref.ID(), "pu", "k1"): {MapKey: "k1", Reason: bus.ReasonEvent, MinResourceVersions: map[string]string{"/configmaps": "20"}},
				bus.ItemKey(ref.ID(), "pu", "k2"): {MapKey: "k2", Reason: bus.ReasonEvent, MinResourceVersions: map[string]string{"/configmaps": "21"}},
				bus.ItemKey(ref.ID(), "pu", ""):   {Reason: bus.ReasonEvent, MinResourceVersions: map[string]string{"/configmaps": "22"}},
			},
			published: 3,
		},
		{
			reason:  "entries of one key merge, with the usual rules (a change outranks a resync)",
			entries: []entry{at("k1", bus.ReasonResync, "", true), at("k1", bus.ReasonEvent, "20", false), at("k1", bus.ReasonEvent, "23", false)},
			want: map[string]item{
				bus.ItemKey(ref.ID(), "pu", "k1"): {MapKey: "k1", Reason: bus.ReasonEvent, MinResourceVersions: map[string]string{"/configmaps": "23"}},
			},
			published: 1, resyncs: 1,
		},
		{
			reason:  "a fan-out's resyncs wait in the resync lanes, one per key",
			entries: []entry{at("k1", bus.ReasonResync, "", true), at("k2", bus.ReasonResync, "", true), at("k1", bus.ReasonResync, "", false)},
			want: map[string]item{
				bus.ItemKey(ref.ID(), "pu", "k1"): {MapKey: "k1", Reason: bus.ReasonResync, MinResourceVersions: map[string]string{}},
				bus.ItemKey(ref.ID(), "pu", "k2"): {MapKey: "k2", Reason: bus.ReasonResync, MinResourceVersions: map[string]string{}},
			},
			resyncs: 2,
		},
	}
	for _, tc := range cases {
		t.Run(tc.reason, func(t *testing.T) {
			o := newOutbox(zap.NewNop(), nil, nil, 0)
			defer o.shutDown()
			for _, e := range tc.entries {
				o.add(e)
			}
			got := map[string]item{}
			for key, it := range o.pending {
				got[key] = item{MapKey: it.MapKey, Reason: it.Reason, MinResourceVersions: it.MinResourceVersions}
				wi := bus.WorkItem{Controller: it.Controller, Parent: it.Parent, MapKey: it.MapKey}
				if wi.Key() != key {
					t.Errorf("item under %s has ItemKey %s", key, wi.Key())
				}
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("pending items (-want +got):\n%s", diff)
			}
			if o.queue.Len() != tc.published || o.resyncs.len() != tc.resyncs {
				t.Errorf("queued %d to publish and %d to resync, want %d and %d", o.queue.Len(), o.resyncs.len(), tc.published, tc.resyncs)
			}
		})
	}
}
