package dispatcher

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/nats-io/nats.go/jetstream"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"

	"github.com/metabus/metabus/pkg/api/v1alpha1"
	"github.com/metabus/metabus/pkg/bus"
	"github.com/metabus/metabus/pkg/hookapi"
	"github.com/metabus/metabus/pkg/hooks"
	"github.com/metabus/metabus/pkg/kinds"
	"github.com/metabus/metabus/pkg/kindtable"
	"github.com/metabus/metabus/pkg/snapshot"
)

// keyedKind is a test kind whose unit of work is (parent, map key), as
// MapController's is, written against the kinds seam only: the dispatcher
// must serve it without knowing its name.
const keyedKind = "KeyedTestController"

// keyedController is keyedKind's core. A keyed snapshot with an input gets
// the map hook; a detached key (no input) is answered locally with the
// deletion of its outputs (no tombstone hook); the per-parent item is
// answered locally with the snapshot's summary as the status. The
// dispatcher never watches nor applies, so Watching and Applying are not
// expected (calling one panics on the nil embedded interface).
type keyedController struct {
	kinds.Watching
	kinds.Applying
	obj  *unstructured.Unstructured
	hook *v1alpha1.Hook
}

// withKeyedKind serves keyedKind for the test: a row without a finalizer.
func withKeyedKind(t *testing.T) {
	t.Helper()
	saved := kindtable.Kinds
	kindtable.Kinds = append(slices.Clone(saved), kinds.Kind{
		Name: keyedKind,
		GVR:  schema.GroupVersionResource{Group: v1alpha1.Group, Version: v1alpha1.Version, Resource: "keyedtestcontrollers"},
		Decode: func(obj *unstructured.Unstructured) (kinds.Controller, error) {
			url, _, err := unstructured.NestedString(obj.Object, "spec", "mapHookURL")
			if err != nil || url == "" {
				return nil, fmt.Errorf("%s %s: no spec.mapHookURL", keyedKind, obj.GetName())
			}
			return &keyedController{obj: obj, hook: &v1alpha1.Hook{Webhook: &v1alpha1.Webhook{URL: &url}}}, nil
		},
		Finalizer: func(string) string { return "" },
	})
	t.Cleanup(func() { kindtable.Kinds = saved })
}

func (c *keyedController) Object() *unstructured.Unstructured { return c.obj }
func (c *keyedController) Ref() bus.ControllerRef {
	return bus.ControllerRef{Kind: keyedKind, Name: c.obj.GetName(), UID: string(c.obj.GetUID())}
}
func (c *keyedController) FinalizerName() string                           { return "" }
func (c *keyedController) Finalizer() string                               { return "" }
func (c *keyedController) ResyncPeriodSeconds() *int32                     { return nil }
func (c *keyedController) SyncEndpoints() []v1alpha1.EndpointConfig        { return nil }
func (c *keyedController) SyncCustomizeHook() *v1alpha1.Hook               { return nil }
func (c *keyedController) SyncGate(*snapshot.Response) (kinds.Gate, error) { return kinds.Gate{}, nil }
func (c *keyedController) SyncEchoable() bool                              { return true }
func (c *keyedController) SyncInputsComplete() bool                        { return true }

func (c *keyedController) SyncHook(snap *snapshot.Response, _ string) (kinds.HookChoice, error) {
	switch {
	case snap.MapKey == "":
		return kinds.HookChoice{Local: true, Kind: bus.HookStatus}, nil
	case snap.Input == nil:
		return kinds.HookChoice{Local: true, Kind: bus.HookTombstone}, nil
	default:
		return kinds.HookChoice{Hook: c.hook, Kind: bus.HookMap}, nil
	}
}

// mapCall is a map hook call's answer, with the input it was made for.
type mapCall struct {
	input string
	hookapi.MapResponse
}

// presetAnswer is a local answer: what the desired state will say.
type presetAnswer struct {
	status map[string]any
}

func (c *keyedController) SyncCalls(in kinds.SyncInput) ([]kinds.HookCall, error) {
	snap := in.Snapshot
	switch in.Hook.Kind {
	case bus.HookStatus:
		return []kinds.HookCall{{Response: &presetAnswer{status: snap.Summary}}}, nil
	case bus.HookTombstone:
		return []kinds.HookCall{{Response: &presetAnswer{}}}, nil
	case bus.HookMap:
		outputs, _, err := kinds.ObjectMaps(in.Hook.Hook, true, snap)
		if err != nil {
			return nil, err
		}
		input := fmt.Sprintf("/%s/%s/%s/%s", snap.Input.GetKind(), snap.Input.GetNamespace(), snap.Input.GetName(), snap.Input.GetUID())
		return []kinds.HookCall{{
			Request:  hookapi.MapRequest{Controller: snap.Controller, Parent: snap.Parent, MapKey: snap.MapKey, Input: snap.Input, Outputs: outputs},
			Response: &mapCall{input: input},
		}}, nil
	}
	return nil, fmt.Errorf("unexpected hook %q", in.Hook.Kind)
}

func (c *keyedController) SyncRevisions(*unstructured.Unstructured) (*kinds.Revisions, error) {
	return nil, nil
}

func (c *keyedController) SyncAsOf(kinds.HookCall, *unstructured.Unstructured) (kinds.HookCall, error) {
	return kinds.HookCall{}, errors.New("keyed calls keep no revisions")
}

func (c *keyedController) SyncDesired(calls []kinds.HookCall) (bus.DesiredState, error) {
	call, err := kinds.OneCall(calls)
	if err != nil {
		return bus.DesiredState{}, err
	}
	switch r := call.Response.(type) {
	case *mapCall:
		return bus.DesiredState{Children: r.Outputs, ResyncAfterSeconds: r.ResyncAfterSeconds, MapInput: r.input}, nil
	case *presetAnswer:
		return bus.DesiredState{Status: r.status}, nil
	}
	return bus.DesiredState{}, fmt.Errorf("unexpected answer %T", call.Response)
}

// mapHookServer is a map hook: it records each call as "<hook kind>
// key=<mapKey> input=<input name> partition=<ce-partitionkey>" and answers
// one output "out-<input name>"; input "bad" gets a 500, input "b" also
// asks for a resync in 30 s.
type mapHookServer struct {
	srv   *httptest.Server
	mu    sync.Mutex
	calls []string
}

func newMapHookServer(t *testing.T) *mapHookServer {
	h := &mapHookServer{}
	h.srv = httptest.NewServer(http.HandlerFunc(h.serve))
	t.Cleanup(h.srv.Close)
	return h
}

func (h *mapHookServer) serve(w http.ResponseWriter, r *http.Request) {
	data, _ := io.ReadAll(r.Body)
	var body struct {
		MapKey string                     `json:"mapKey"`
		Input  *unstructured.Unstructured `json:"input"`
	}
	if err := json.Unmarshal(data, &body); err != nil || body.Input == nil {
		w.WriteHeader(http.StatusBadRequest)
		return
	}
	name := body.Input.GetName()
	kind := strings.TrimSuffix(strings.TrimPrefix(r.Header.Get("Ce-Type"), hooks.EventTypePrefix), ".v1")
	h.mu.Lock()
	h.calls = append(h.calls, fmt.Sprintf("%s key=%s input=%s partition=%s", kind, body.MapKey, name, r.Header.Get("Ce-Partitionkey")))
	h.mu.Unlock()
	if name == "bad" {
		w.WriteHeader(http.StatusInternalServerError)
		return
	}
	resp := map[string]any{"outputs": []any{map[string]any{"apiVersion": "v1", "kind": "ConfigMap", "metadata": map[string]any{"name": "out-" + name}}}}
	if name == "b" {
		resp["resyncAfterSeconds"] = 30
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(resp)
}

func (h *mapHookServer) taken() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	c := h.calls
	h.calls = nil
	return c
}

// keyedDesired is what a test checks of a keyed kind's desired state.
type keyedDesired struct {
	Hook     string
	MapKey   string
	MapInput string
	Children []string
	Status   map[string]any
	Echoable bool
	Resync   float64
}

// lastKeyedDesired is the desired state the sync of item at seq published
// on the item's own subject, nil if it published none.
func lastKeyedDesired(t *testing.T, js jetstream.JetStream, item bus.WorkItem, seq uint64) *keyedDesired {
	t.Helper()
	ctx := context.Background()
	st, err := js.Stream(ctx, bus.DesiredStream)
	if err != nil {
		t.Fatal(err)
	}
	m, err := st.GetLastMsgForSubject(ctx, bus.StoredDesiredSubjectKey(item.Controller.ID(), item.Parent.UID, item.MapKey))
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	var ds bus.DesiredState
	if err := json.Unmarshal(m.Data, &ds); err != nil {
		t.Fatal(err)
	}
	if ds.WorkSeq != seq {
		return nil // an earlier step's
	}
	got := &keyedDesired{Hook: ds.Hook, MapKey: ds.MapKey, MapInput: ds.MapInput, Status: ds.Status,
		Echoable: ds.Inputs != nil, Resync: ds.ResyncAfterSeconds}
	for _, c := range ds.Children {
		got.Children = append(got.Children, c.GetName())
	}
	return got
}

// keyedSchedule is what a test checks of an item's pending schedule.
type keyedSchedule struct {
	Reason  string
	MapKey  string
	Attempt int
}

func lastKeyedSchedule(t *testing.T, js jetstream.JetStream, item bus.WorkItem) *keyedSchedule {
	t.Helper()
	ctx := context.Background()
	st, err := js.Stream(ctx, bus.SchedStream)
	if err != nil {
		t.Fatal(err)
	}
	subject, err := bus.SchedSubject(item.Controller.ID(), bus.ParentToken(item.Parent.UID, item.MapKey))
	if err != nil {
		t.Fatal(err)
	}
	m, err := st.GetLastMsgForSubject(ctx, subject)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	var next bus.WorkItem
	if err := json.Unmarshal(m.Data, &next); err != nil {
		t.Fatal(err)
	}
	return &keyedSchedule{Reason: next.Reason, MapKey: next.MapKey, Attempt: next.Attempt}
}

// TestSyncKeyed drives the items of one keyed parent through syncParent
// and settle, in order (each step sees what the earlier ones left: echo
// references, failures, schedules): every item asks for its own key's
// snapshot, calls the map hook at most once, and publishes on its own
// subject; the kind's local answers call nothing; the keys' echo
// references, failures and schedules never mix.
func TestSyncKeyed(t *testing.T) {
	withKeyedKind(t)
	h := newMapHookServer(t)
	ctrlObj := controllerObject(t, keyedKind, "kc", "kc-uid", map[string]any{"mapHookURL": h.srv.URL + "/map"})
	parent := thing("p1", "a")
	input := func(name string) *unstructured.Unstructured {
		u := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "v1", "kind": "Secret"}}
		u.SetNamespace("ns")
		u.SetName(name)
		u.SetUID(types.UID("in-" + name))
		u.SetResourceVersion("3")
		return u
	}
	output := func(name string) *unstructured.Unstructured {
		u := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "v1", "kind": "ConfigMap"}}
		u.SetNamespace("ns")
		u.SetName(name)
		u.SetUID(types.UID("uid-" + name))
		u.SetResourceVersion("4")
		return u
	}
	outputs := func(objs ...*unstructured.Unstructured) []snapshot.Group {
		return []snapshot.Group{{APIVersion: "v1", Kind: "ConfigMap", Resource: "configmaps", Namespaced: true, Objects: objs}}
	}
	// The watcher's answers: per key, the parent, the key's input (none
	// for the detached key) and only the key's outputs; per parent, the
	// summary and no children. Parent p2's controller is gone.
	var (
		amu   sync.Mutex
		asked []string
	)
	snaps := &scriptedSnapshots{answer: func(req snapshot.Request) (*snapshot.Response, error) {
		amu.Lock()
		asked = append(asked, req.MapKey)
		amu.Unlock()
		if req.ParentUID == "p2" {
			return &snapshot.Response{Result: snapshot.ControllerGone, Message: "scripted"}, nil
		}
		s := &snapshot.Response{Result: snapshot.OK, Controller: ctrlObj, Parent: parent, ParentResource: "things", MapKey: req.MapKey}
		switch req.MapKey {
		case "":
			s.Summary = map[string]any{"inputs": int64(3)}
		case "ka":
			s.Input, s.Children = input("a"), outputs(output("out-a"))
		case "kb":
			s.Input, s.Children = input("b"), outputs()
		case "kbad":
			s.Input, s.Children = input("bad"), outputs()
		case "kgone":
			s.Children = outputs(output("out-gone"))
		}
		return s, nil
	}}
	d, js, _ := testDispatcher(t, snaps, nil)

	type result struct {
		Result   string
		Asked    []string
		Hooks    []string
		Desired  *keyedDesired
		Schedule *keyedSchedule
		Failures int
	}
	partition := func(key string) string { return bus.ItemKey(bus.ControllerID(keyedKind, "kc"), "p1", key) }
	steps := []struct {
		reason string
		parent string
		key    string
		why    string
		want   result
	}{
		{
			reason: "a keyed event asks for its key's snapshot and calls the map hook once, partitioned by the item",
			parent: "p1", key: "ka", why: bus.ReasonEvent,
			want: result{Result: "ok", Asked: []string{"ka"}, Hooks: []string{"map key=ka input=a partition=" + partition("ka")},
				Desired: &keyedDesired{Hook: bus.HookMap, MapKey: "ka", MapInput: "/Secret/ns/a/in-a", Children: []string{"out-a"}, Echoable: true}},
		},
		{
			reason: "another key of the parent is its own call; its resyncAfterSeconds re-enqueues that same key",
			parent: "p1", key: "kb", why: bus.ReasonEvent,
			want: result{Result: "ok", Asked: []string{"kb"}, Hooks: []string{"map key=kb input=b partition=" + partition("kb")},
				Desired:  &keyedDesired{Hook: bus.HookMap, MapKey: "kb", MapInput: "/Secret/ns/b/in-b", Children: []string{"out-b"}, Echoable: true, Resync: 30},
				Schedule: &keyedSchedule{Reason: bus.ReasonResyncAfter, MapKey: "kb"}},
		},
		{
			reason: "the first key again, unchanged: an echo of its own last call, which the other key's call did not replace",
			parent: "p1", key: "ka", why: bus.ReasonEvent,
			want: result{Result: "echo", Asked: []string{"ka"}},
		},
		{
			reason: "the per-parent item is answered by the kind: no hook call, the summary as status, no children, never an echo",
			parent: "p1", key: "", why: bus.ReasonEvent,
			want: result{Result: "ok", Asked: []string{""},
				Desired: &keyedDesired{Hook: bus.HookStatus, Status: map[string]any{"inputs": float64(3)}}},
		},
		{
			reason: "the first key is still an echo after the per-parent item's answer",
			parent: "p1", key: "ka", why: bus.ReasonEvent,
			want: result{Result: "echo", Asked: []string{"ka"}},
		},
		{
			reason: "a detached key without a tombstone hook is answered by the kind: its outputs go, nothing is called",
			parent: "p1", key: "kgone", why: bus.ReasonEvent,
			want: result{Result: "ok", Asked: []string{"kgone"},
				Desired: &keyedDesired{Hook: bus.HookTombstone, MapKey: "kgone", Echoable: true}},
		},
		{
			reason: "a failing key is retried with backoff on its own schedule, counted against it alone",
			parent: "p1", key: "kbad", why: bus.ReasonEvent,
			want: result{Result: "error", Asked: []string{"kbad"}, Hooks: []string{"map key=kbad input=bad partition=" + partition("kbad")},
				Schedule: &keyedSchedule{Reason: bus.ReasonRetry, MapKey: "kbad", Attempt: 1}, Failures: 1},
		},
		{
			reason: "the first key is still an echo: another key's failure is not its own",
			parent: "p1", key: "ka", why: bus.ReasonEvent,
			want: result{Result: "echo", Asked: []string{"ka"}},
		},
		{
			reason: "a resync of the first key calls its hook again, once",
			parent: "p1", key: "ka", why: bus.ReasonResync,
			want: result{Result: "ok", Asked: []string{"ka"}, Hooks: []string{"map key=ka input=a partition=" + partition("ka")},
				Desired: &keyedDesired{Hook: bus.HookMap, MapKey: "ka", MapInput: "/Secret/ns/a/in-a", Children: []string{"out-a"}, Echoable: true}},
		},
		{
			reason: "the controller is gone and its kind puts no finalizer on parents: nothing to release, nothing published",
			parent: "p2", key: "", why: bus.ReasonEvent,
			want: result{Result: "skipped", Asked: []string{""}},
		},
	}
	for i, st := range steps {
		t.Run(st.reason, func(t *testing.T) {
			seq := uint64(100 + i)
			item := bus.WorkItem{
				Controller: bus.ControllerRef{Kind: keyedKind, Name: "kc", UID: "kc-uid"},
				Parent: bus.ObjectRef{APIVersion: "example.com/v1", Kind: "Thing", Resource: "things", Namespace: "ns",
					Name: "p-" + st.parent, UID: st.parent},
				MapKey: st.key, Reason: st.why,
			}
			amu.Lock()
			asked = nil
			amu.Unlock()
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			var got result
			got.Result, _ = d.resolve(ctx, item, d.syncParent(ctx, item, seq))
			amu.Lock()
			got.Asked = asked
			amu.Unlock()
			got.Hooks = h.taken()
			got.Desired = lastKeyedDesired(t, js, item, seq)
			got.Schedule = lastKeyedSchedule(t, js, item)
			got.Failures = d.failures.get(d.failureKey(item))
			if diff := cmp.Diff(st.want, got); diff != "" {
				t.Errorf("sync (-want +got):\n%s", diff)
			}
			if st.parent == "p2" {
				// Not even a per-parent release (the applier would GET
				// the parent for nothing).
				if rel := lastDesired(t, js, item); rel != nil {
					t.Errorf("published %+v for a kind without a finalizer", rel)
				}
			}
		})
	}
}

// TestLocalAnswer: a kind's local answer is its SyncDesired of the preset
// calls; a choice that would leave a built request unsent is refused.
func TestLocalAnswer(t *testing.T) {
	k := &keyedController{}
	url := "http://hook"
	status := map[string]any{"inputs": 2}
	for _, tc := range []struct {
		reason  string
		choice  kinds.HookChoice
		calls   []kinds.HookCall
		want    bus.DesiredState
		wantErr string
	}{
		{reason: "preset answers become the desired state",
			choice: kinds.HookChoice{Local: true, Kind: bus.HookStatus},
			calls:  []kinds.HookCall{{Response: &presetAnswer{status: status}}},
			want:   bus.DesiredState{Status: status}},
		{reason: "a call with a request would never be sent",
			choice:  kinds.HookChoice{Local: true, Kind: bus.HookStatus},
			calls:   []kinds.HookCall{{Request: map[string]any{}, Response: &presetAnswer{}}},
			wantErr: "status: the kind answers by itself but built a hook request (call 0)"},
		{reason: "a hook and a local answer at once is ambiguous",
			choice:  kinds.HookChoice{Local: true, Hook: &v1alpha1.Hook{Webhook: &v1alpha1.Webhook{URL: &url}}, Kind: bus.HookMap},
			calls:   []kinds.HookCall{{Response: &presetAnswer{}}},
			wantErr: "map: the kind chose both a hook and its own answer"},
		{reason: "the kind's own error is reported",
			choice:  kinds.HookChoice{Local: true, Kind: bus.HookTombstone},
			wantErr: "tombstone: 0 hook answers for a parent, want 1"},
	} {
		t.Run(tc.reason, func(t *testing.T) {
			got, err := localAnswer(k, tc.choice, tc.calls)
			gotErr := ""
			if err != nil {
				gotErr = err.Error()
			}
			if diff := cmp.Diff(tc.wantErr, gotErr); diff != "" {
				t.Errorf("error (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("desired state (-want +got):\n%s", diff)
			}
		})
	}
}

// TestCacheKey: the hook response caches of two keys of one parent, or of
// a parent's revisions, never share an entry; a keyless parent's entry is
// what it always was.
func TestCacheKey(t *testing.T) {
	for _, tc := range []struct {
		reason           string
		mapKey, revision string
		want             string
	}{
		{reason: "a parent", want: "u"},
		{reason: "an older revision of a parent", revision: "r1", want: "u/r1"},
		{reason: "a map key", mapKey: "k1", want: "u~k1"},
		{reason: "another map key of the same parent", mapKey: "k2", want: "u~k2"},
	} {
		t.Run(tc.reason, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, cacheKey("u", tc.mapKey, tc.revision)); diff != "" {
				t.Errorf("cacheKey (-want +got):\n%s", diff)
			}
		})
	}
}
