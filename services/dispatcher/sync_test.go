package dispatcher

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"

	"github.com/metabus/metabus/internal/testing/natstest"
	"github.com/metabus/metabus/pkg/api/v1alpha1"
	"github.com/metabus/metabus/pkg/bus"
	"github.com/metabus/metabus/pkg/echo"
	"github.com/metabus/metabus/pkg/events/recorder"
	"github.com/metabus/metabus/pkg/hooks"
	"github.com/metabus/metabus/pkg/jsbus"
	"github.com/metabus/metabus/pkg/kindtable"
	"github.com/metabus/metabus/pkg/outcome"
	"github.com/metabus/metabus/pkg/related"
	"github.com/metabus/metabus/pkg/revstore"
	"github.com/metabus/metabus/pkg/snapshot"
)

// hookServer is a sync/finalize/customize hook. Its answer depends on the
// path: /sync and /finalize answer from the request (children "c-<x>",
// status {x: <x>} where x is the parent's spec.x, labels for a decorator
// target; finalize says finalized), /resync as /sync with a
// resyncAfterSeconds of 5, /fail answers 500, /throttle 429 with
// Retry-After, /customize asks for ConfigMaps.
type hookServer struct {
	srv   *httptest.Server
	mu    sync.Mutex
	calls []string
}

func newHookServer(t *testing.T) *hookServer {
	h := &hookServer{}
	h.srv = httptest.NewServer(http.HandlerFunc(h.serve))
	t.Cleanup(h.srv.Close)
	return h
}

func (h *hookServer) serve(w http.ResponseWriter, r *http.Request) {
	data, _ := io.ReadAll(r.Body)
	var body struct {
		Parent     *unstructured.Unstructured `json:"parent"`
		Object     *unstructured.Unstructured `json:"object"`
		Related    map[string]map[string]any  `json:"related"`
		Finalizing bool                       `json:"finalizing"`
	}
	_ = json.Unmarshal(data, &body)
	p := body.Parent
	if p == nil {
		p = body.Object
	}
	x, _, _ := unstructured.NestedString(p.Object, "spec", "x")
	kind := strings.TrimSuffix(strings.TrimPrefix(r.Header.Get("Ce-Type"), hooks.EventTypePrefix), ".v1")
	call := fmt.Sprintf("%s %s x=%s", kind, p.GetName(), x)
	if body.Finalizing {
		call += " finalizing"
	}
	if n := len(body.Related["ConfigMap.v1"]); n > 0 {
		call += fmt.Sprintf(" related=%d", n)
	}
	h.mu.Lock()
	h.calls = append(h.calls, call)
	h.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	switch r.URL.Path {
	case "/resync":
		child := map[string]any{"apiVersion": "v1", "kind": "ConfigMap", "metadata": map[string]any{"name": "c-" + x}}
		_ = json.NewEncoder(w).Encode(map[string]any{"status": map[string]any{"x": x}, "children": []any{child}, "resyncAfterSeconds": 5})
	case "/fail":
		w.WriteHeader(http.StatusInternalServerError)
	case "/throttle":
		w.Header().Set("Retry-After", "7")
		w.WriteHeader(http.StatusTooManyRequests)
	case "/customize":
		_, _ = w.Write([]byte(`{"relatedResources":[{"apiVersion":"v1","resource":"configmaps"}]}`))
	default:
		child := map[string]any{"apiVersion": "v1", "kind": "ConfigMap", "metadata": map[string]any{"name": "c-" + x}}
		resp := map[string]any{"status": map[string]any{"x": x}, "finalized": body.Finalizing}
		if body.Object != nil {
			resp["attachments"] = []any{child}
			resp["labels"] = map[string]any{"decorated": "yes"}
		} else {
			resp["children"] = []any{child}
		}
		_ = json.NewEncoder(w).Encode(resp)
	}
}

// taken returns and forgets the calls so far, sorted (revisions are called
// concurrently).
func (h *hookServer) taken() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	c := h.calls
	h.calls = nil
	sort.Strings(c)
	return c
}

func (h *hookServer) hook(path string) *v1alpha1.Hook {
	url := h.srv.URL + path
	return &v1alpha1.Hook{Webhook: &v1alpha1.Webhook{URL: &url}}
}

// scriptedSnapshots answers every request with answer, counting them.
type scriptedSnapshots struct {
	mu     sync.Mutex
	asked  int
	answer func(req snapshot.Request) (*snapshot.Response, error)
}

func (s *scriptedSnapshots) Snapshot(_ context.Context, req snapshot.Request) (*snapshot.Response, error) {
	s.mu.Lock()
	s.asked++
	answer := s.answer
	s.mu.Unlock()
	return answer(req)
}

// fakeRevisions serves a fixed set of ControllerRevisions.
type fakeRevisions struct{ revisions []v1alpha1.ControllerRevision }

func (f fakeRevisions) Revisions(_ context.Context, req revstore.Request) (*revstore.Response, error) {
	if req.Op != revstore.OpLoad || !req.AllowStale {
		return nil, fmt.Errorf("unexpected %s request (stale %v)", req.Op, req.AllowStale)
	}
	return &revstore.Response{Result: revstore.OK, Revisions: f.revisions}, nil
}

// testDispatcher is a dispatcher on an embedded JetStream with fake
// snapshots, revisions and Event recorder.
func testDispatcher(t *testing.T, snaps snapshot.Source, revs revstore.Store) (*Dispatcher, jetstream.JetStream, *record.FakeRecorder) {
	nc, js := natstest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := jsbus.Ensure(ctx, js, bus.Options{}); err != nil {
		t.Fatal(err)
	}
	policy, err := related.ParsePolicy(related.DefaultPolicy)
	if err != nil {
		t.Fatal(err)
	}
	rec := record.NewFakeRecorder(100)
	d := &Dispatcher{
		cfg: Config{SnapshotWait: 50 * time.Millisecond}, log: zap.NewNop(), js: js, pub: jsbus.Publisher{JS: js},
		snaps: snaps, revs: revs, hooks: hooks.New(hooks.Options{}), rec: &recorder.Recorder{EventRecorder: rec},
		metrics: newMetrics(nil), timers: map[string]*time.Timer{}, customize: map[string]customizeEntry{},
		relatedPolicy: policy, echoes: echo.NewBook(0), nc: nc,
	}
	return d, js, rec
}

// controllerObject encodes a controller as the API serves it.
func controllerObject(t *testing.T, kind, name, uid string, spec any) *unstructured.Unstructured {
	data, err := json.Marshal(map[string]any{
		"apiVersion": v1alpha1.GroupVersion.String(), "kind": kind,
		"metadata": map[string]any{"name": name, "uid": uid, "resourceVersion": "1"}, "spec": spec,
	})
	if err != nil {
		t.Fatal(err)
	}
	u := &unstructured.Unstructured{}
	if err := u.UnmarshalJSON(data); err != nil {
		t.Fatal(err)
	}
	return u
}

func thing(uid, x string) *unstructured.Unstructured {
	u := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "example.com/v1", "kind": "Thing", "spec": map[string]any{"x": x}}}
	u.SetNamespace("ns")
	u.SetName("p-" + uid)
	u.SetUID(types.UID(uid))
	u.SetResourceVersion("10")
	return u
}

func deletingWith(u *unstructured.Unstructured, finalizers ...string) *unstructured.Unstructured {
	now := metav1.Now()
	u.SetDeletionTimestamp(&now)
	u.SetFinalizers(finalizers)
	return u
}

// desired is what a test checks of a published desired state.
type desired struct {
	Hook           string
	Parent         string
	Children       []string
	Status         map[string]any
	StatusSet      bool
	Labels         map[string]*string
	Finalizer      string
	Finalized      bool
	Echoable       bool // Inputs were sent: a later sync may be an echo
	LatestRevision bool
	Revisions      []string
	Attempt        int
	MinRVs         map[string]string
}

// scheduled is what a test checks of a scheduled retry.
type scheduled struct {
	Reason  string
	Attempt int
}

type syncResult struct {
	Result string
	// Nak: the work item's outcome is not Done (it is retried in place).
	Nak     bool
	Hooks   []string
	Desired *desired
	Retry   *scheduled
	Events  []string
	// Failures is the parent's count of consecutive failures afterwards.
	Failures int
}

func lastDesired(t *testing.T, js jetstream.JetStream, item bus.WorkItem) *desired {
	ctx := context.Background()
	st, err := js.Stream(ctx, bus.DesiredStream)
	if err != nil {
		t.Fatal(err)
	}
	m, err := st.GetLastMsgForSubject(ctx, bus.StoredDesiredSubject(item.Controller.ID(), item.Parent.UID))
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
	got := &desired{Hook: ds.Hook, Parent: ds.Parent.Name, Status: ds.Status, StatusSet: ds.StatusSet, Labels: ds.Labels,
		Finalizer: ds.Finalizer, Finalized: ds.Finalized, Echoable: ds.Inputs != nil, LatestRevision: ds.LatestRevision != "",
		Attempt: ds.Attempt, MinRVs: ds.MinResourceVersions}
	for _, c := range ds.Children {
		got.Children = append(got.Children, c.GetName())
	}
	for _, r := range ds.Revisions {
		for _, c := range r.Children {
			got.Revisions = append(got.Revisions, r.Name+":"+c.GetName())
		}
	}
	return got
}

func lastRetry(t *testing.T, js jetstream.JetStream, item bus.WorkItem) *scheduled {
	ctx := context.Background()
	st, err := js.Stream(ctx, bus.SchedStream)
	if err != nil {
		t.Fatal(err)
	}
	subject, err := bus.SchedSubject(item.Controller.ID(), item.Parent.UID)
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
	return &scheduled{Reason: next.Reason, Attempt: next.Attempt}
}

// takeEvents returns the Events recorded so far as "<type> <reason>".
func takeEvents(rec *record.FakeRecorder) []string {
	var out []string
	for {
		select {
		case e := <-rec.Events:
			f := strings.Fields(e)
			out = append(out, f[0]+" "+f[1])
		default:
			return out
		}
	}
}

// TestSyncParent drives syncParent and settle's resolution for both kinds
// through the seams: a scripted snapshot source, a fake revisions store, a
// real hook server and an embedded JetStream for what is published.
func TestSyncParent(t *testing.T) {
	h := newHookServer(t)
	snaps := &scriptedSnapshots{}
	older := v1alpha1.ControllerRevision{ParentPatch: json.RawMessage(`{"spec":{"x":"old"}}`),
		Children: []v1alpha1.ControllerRevisionChildren{{Kind: "ConfigMap", Names: []string{"c-old"}}}}
	older.Name = "older"
	d, js, rec := testDispatcher(t, snaps, fakeRevisions{revisions: []v1alpha1.ControllerRevision{older}})

	composite := func(t *testing.T, uid string, hooks map[string]string, rolling bool) *unstructured.Unstructured {
		hs := map[string]any{}
		for k, path := range hooks {
			hs[k] = map[string]any{"webhook": map[string]any{"url": h.srv.URL + path}}
		}
		child := map[string]any{"apiVersion": "v1", "resource": "configmaps"}
		if rolling {
			child["updateStrategy"] = map[string]any{"method": "RollingRecreate"}
		}
		return controllerObject(t, v1alpha1.CompositeControllerKind, "cc-"+uid, "ctrl-"+uid, map[string]any{
			"parentResource": map[string]any{"apiVersion": "example.com/v1", "resource": "things"},
			"childResources": []any{child}, "hooks": hs,
		})
	}
	decorator := func(t *testing.T, uid string, hooks map[string]string) *unstructured.Unstructured {
		hs := map[string]any{}
		for k, path := range hooks {
			hs[k] = map[string]any{"webhook": map[string]any{"url": h.srv.URL + path}}
		}
		return controllerObject(t, v1alpha1.DecoratorControllerKind, "dc-"+uid, "ctrl-"+uid, map[string]any{
			"resources": []any{map[string]any{"apiVersion": "example.com/v1", "resource": "things",
				"labelSelector": map[string]any{"matchLabels": map[string]any{"decorate": "yes"}}}},
			"hooks": hs,
		})
	}
	selected := func(u *unstructured.Unstructured) *unstructured.Unstructured {
		u.SetLabels(map[string]string{"decorate": "yes"})
		return u
	}
	// echoing opts a controller into echo suppression (the metabus
	// extension; without it every change calls the hook).
	echoing := func(u *unstructured.Unstructured) *unstructured.Unstructured {
		u.SetAnnotations(map[string]string{bus.SuppressEchoesAnnotation: "true"})
		return u
	}
	ok := func(ctrl, parent *unstructured.Unstructured) func(snapshot.Request) (*snapshot.Response, error) {
		return func(snapshot.Request) (*snapshot.Response, error) {
			return &snapshot.Response{Result: snapshot.OK, Controller: ctrl, Parent: parent, ParentResource: "things",
				Children: []snapshot.Group{{APIVersion: "v1", Kind: "ConfigMap", Resource: "configmaps", Namespaced: true}}}, nil
		}
	}
	result := func(r string) func(snapshot.Request) (*snapshot.Response, error) {
		return func(snapshot.Request) (*snapshot.Response, error) {
			return &snapshot.Response{Result: r, Message: "scripted"}, nil
		}
	}
	fresh := func(uid string) map[string]string { return map[string]string{"example.com/things": "10"} }
	type syncCase struct {
		reason string
		kind   string // controller kind of the work item
		why    string // work item reason (event if empty)
		after  uint64 // work item AfterSeq (conflict requeues)
		// attempt is the work item's Attempt (failed syncs before it).
		attempt int
		// snapshot answers the snapshot requests; uid is the case's parent.
		snapshot func(t *testing.T, uid string) func(snapshot.Request) (*snapshot.Response, error)
		// before runs ahead of the sync (e.g. to record a previous answer).
		before    func(t *testing.T, item bus.WorkItem, snap func(snapshot.Request) (*snapshot.Response, error))
		cancelled bool
		want      func(uid string) syncResult
	}
	// compositeA is a composite controller with a sync hook and its parent
	// at spec.x "a"; syncedA the hook's answer for it, published.
	compositeA := func(t *testing.T, uid string) func(snapshot.Request) (*snapshot.Response, error) {
		return ok(composite(t, uid, map[string]string{"sync": "/sync"}, false), thing(uid, "a"))
	}
	syncedA := func(uid string) syncResult {
		return syncResult{Result: "ok", Hooks: []string{"sync p-" + uid + " x=a"}, Desired: &desired{
			Hook: "sync", Parent: "p-" + uid, Children: []string{"c-a"}, Status: map[string]any{"x": "a"}, MinRVs: fresh(uid)}}
	}
	// shownBefore records the case's snapshot as what item's latest hook
	// call was shown.
	shownBefore := func(t *testing.T, item bus.WorkItem, snap func(snapshot.Request) (*snapshot.Response, error)) {
		s, _ := snap(snapshot.Request{})
		d.echoes.Called(item.Controller.ID(), item.Parent.UID, item.MapKey, 1, echo.Inputs(s))
	}
	// repeatCalls is an item of the given reason whose snapshot is exactly
	// what the latest call was shown: only an event's is merged.
	repeatCalls := func(why string) syncCase {
		return syncCase{
			reason:   "composite: a " + why + " whose snapshot is what the latest call was shown still calls the hook",
			kind:     v1alpha1.CompositeControllerKind,
			why:      why,
			snapshot: compositeA,
			before:   shownBefore,
			want:     syncedA,
		}
	}

	tests := []syncCase{
		{
			reason:   "composite: the sync hook's answer is published",
			kind:     v1alpha1.CompositeControllerKind,
			snapshot: compositeA,
			want:     syncedA,
		},
		{
			reason: "composite: a deleted parent is finalized",
			kind:   v1alpha1.CompositeControllerKind,
			snapshot: func(t *testing.T, uid string) func(snapshot.Request) (*snapshot.Response, error) {
				return ok(composite(t, uid, map[string]string{"sync": "/sync", "finalize": "/finalize"}, false),
					deletingWith(thing(uid, "a"), "metacontroller.io/compositecontroller-cc-"+uid))
			},
			want: func(uid string) syncResult {
				return syncResult{Result: "ok", Hooks: []string{"finalize p-" + uid + " x=a finalizing"}, Desired: &desired{
					Hook: "finalize", Parent: "p-" + uid, Children: []string{"c-a"}, Status: map[string]any{"x": "a"}, Finalized: true, MinRVs: fresh(uid)}}
			},
		},
		{
			reason: "composite: a deleted parent without a finalize hook is skipped",
			kind:   v1alpha1.CompositeControllerKind,
			snapshot: func(t *testing.T, uid string) func(snapshot.Request) (*snapshot.Response, error) {
				return ok(composite(t, uid, map[string]string{"sync": "/sync"}, false), deletingWith(thing(uid, "a")))
			},
			want: func(string) syncResult { return syncResult{Result: "skipped"} },
		},
		{
			reason: "composite: the finalizer of a removed finalize hook is released, no hook called",
			kind:   v1alpha1.CompositeControllerKind,
			snapshot: func(t *testing.T, uid string) func(snapshot.Request) (*snapshot.Response, error) {
				p := thing(uid, "a")
				p.SetFinalizers([]string{"metacontroller.io/compositecontroller-cc-" + uid})
				return ok(composite(t, uid, map[string]string{"sync": "/sync"}, false), p)
			},
			want: func(uid string) syncResult {
				return syncResult{Result: "release", Desired: &desired{Hook: bus.HookRelease, Parent: "p-" + uid, Finalizer: "metacontroller.io/compositecontroller-cc-" + uid}}
			},
		},
		{
			reason: "composite: the garbage collector is waited for",
			kind:   v1alpha1.CompositeControllerKind,
			snapshot: func(t *testing.T, uid string) func(snapshot.Request) (*snapshot.Response, error) {
				return ok(composite(t, uid, map[string]string{"sync": "/sync", "finalize": "/finalize"}, false),
					deletingWith(thing(uid, "a"), metav1.FinalizerDeleteDependents))
			},
			want: func(string) syncResult { return syncResult{Result: "skipped"} },
		},
		{
			reason: "composite: a selector error fails with an Event and a retry",
			kind:   v1alpha1.CompositeControllerKind,
			snapshot: func(t *testing.T, uid string) func(snapshot.Request) (*snapshot.Response, error) {
				inner := ok(composite(t, uid, map[string]string{"sync": "/sync"}, false), thing(uid, "a"))
				return func(r snapshot.Request) (*snapshot.Response, error) {
					s, _ := inner(r)
					s.SelectorError = "parent has no spec.selector"
					return s, nil
				}
			},
			want: func(string) syncResult {
				return syncResult{Result: "error", Events: []string{"Warning SyncError"}, Retry: &scheduled{Reason: bus.ReasonRetry, Attempt: 1}, Failures: 1}
			},
		},
		{
			reason: "composite: a failing hook is reported and retried with backoff",
			kind:   v1alpha1.CompositeControllerKind,
			snapshot: func(t *testing.T, uid string) func(snapshot.Request) (*snapshot.Response, error) {
				return ok(composite(t, uid, map[string]string{"sync": "/fail"}, false), thing(uid, "a"))
			},
			want: func(uid string) syncResult {
				return syncResult{Result: "error", Hooks: []string{"sync p-" + uid + " x=a"}, Events: []string{"Warning SyncError"},
					Retry: &scheduled{Reason: bus.ReasonRetry, Attempt: 1}, Failures: 1}
			},
		},
		{
			reason: "composite: a throttled hook is retried after Retry-After, not counted as a failure",
			kind:   v1alpha1.CompositeControllerKind,
			snapshot: func(t *testing.T, uid string) func(snapshot.Request) (*snapshot.Response, error) {
				return ok(composite(t, uid, map[string]string{"sync": "/throttle"}, false), thing(uid, "a"))
			},
			want: func(uid string) syncResult {
				return syncResult{Result: "throttled", Hooks: []string{"sync p-" + uid + " x=a"}, Retry: &scheduled{Reason: bus.ReasonRetry}}
			},
		},
		{
			reason: "composite: an echo of our own writes calls no hook",
			kind:   v1alpha1.CompositeControllerKind,
			snapshot: func(t *testing.T, uid string) func(snapshot.Request) (*snapshot.Response, error) {
				return ok(echoing(composite(t, uid, map[string]string{"sync": "/sync"}, false)), thing(uid, "a"))
			},
			before: shownBefore,
			want:   func(string) syncResult { return syncResult{Result: "echo"} },
		},
		{
			reason: "composite: a retry is never an echo",
			kind:   v1alpha1.CompositeControllerKind,
			why:    bus.ReasonRetry,
			snapshot: func(t *testing.T, uid string) func(snapshot.Request) (*snapshot.Response, error) {
				return ok(echoing(composite(t, uid, map[string]string{"sync": "/sync"}, false)), thing(uid, "a"))
			},
			before: shownBefore,
			want: func(uid string) syncResult {
				return syncResult{Result: "ok", Hooks: []string{"sync p-" + uid + " x=a"}, Desired: &desired{
					Hook: "sync", Parent: "p-" + uid, Children: []string{"c-a"}, Status: map[string]any{"x": "a"}, Echoable: true, MinRVs: fresh(uid)}}
			},
		},
		{
			reason: "composite: a conflict requeue after a later hook call, applied completely, whose inputs still hold is an echo",
			kind:   v1alpha1.CompositeControllerKind,
			why:    bus.ReasonConflict, after: 1,
			snapshot: func(t *testing.T, uid string) func(snapshot.Request) (*snapshot.Response, error) {
				return ok(echoing(composite(t, uid, map[string]string{"sync": "/sync"}, false)), thing(uid, "a"))
			},
			before: func(t *testing.T, item bus.WorkItem, snap func(snapshot.Request) (*snapshot.Response, error)) {
				s, _ := snap(snapshot.Request{})
				d.echoes.Called(item.Controller.ID(), item.Parent.UID, item.MapKey, 2, echo.Inputs(s))
				d.echoes.Record(&bus.Applied{Controller: item.Controller, ParentUID: item.Parent.UID, WorkSeq: 2, Inputs: echo.Inputs(s)})
			},
			want: func(string) syncResult { return syncResult{Result: "echo"} },
		},
		{
			reason: "composite: a conflict requeue after a later hook call not known to be applied calls the hook (that apply may have conflicted too)",
			kind:   v1alpha1.CompositeControllerKind,
			why:    bus.ReasonConflict, after: 1,
			snapshot: func(t *testing.T, uid string) func(snapshot.Request) (*snapshot.Response, error) {
				return ok(echoing(composite(t, uid, map[string]string{"sync": "/sync"}, false)), thing(uid, "a"))
			},
			before: func(t *testing.T, item bus.WorkItem, snap func(snapshot.Request) (*snapshot.Response, error)) {
				s, _ := snap(snapshot.Request{})
				d.echoes.Called(item.Controller.ID(), item.Parent.UID, item.MapKey, 2, echo.Inputs(s))
			},
			want: func(uid string) syncResult {
				return syncResult{Result: "ok", Hooks: []string{"sync p-" + uid + " x=a"}, Desired: &desired{
					Hook: "sync", Parent: "p-" + uid, Children: []string{"c-a"}, Status: map[string]any{"x": "a"}, Echoable: true, MinRVs: fresh(uid)}}
			},
		},
		{
			reason: "composite: a conflict requeue of the latest hook call calls the hook again",
			kind:   v1alpha1.CompositeControllerKind,
			why:    bus.ReasonConflict, after: 2,
			snapshot: func(t *testing.T, uid string) func(snapshot.Request) (*snapshot.Response, error) {
				return ok(echoing(composite(t, uid, map[string]string{"sync": "/sync"}, false)), thing(uid, "a"))
			},
			before: func(t *testing.T, item bus.WorkItem, snap func(snapshot.Request) (*snapshot.Response, error)) {
				s, _ := snap(snapshot.Request{})
				d.echoes.Called(item.Controller.ID(), item.Parent.UID, item.MapKey, 2, echo.Inputs(s))
			},
			want: func(uid string) syncResult {
				return syncResult{Result: "ok", Hooks: []string{"sync p-" + uid + " x=a"}, Desired: &desired{
					Hook: "sync", Parent: "p-" + uid, Children: []string{"c-a"}, Status: map[string]any{"x": "a"}, Echoable: true, MinRVs: fresh(uid)}}
			},
		},
		{
			reason: "composite: a conflict requeue after a later call, with the parent changed since, calls the hook",
			kind:   v1alpha1.CompositeControllerKind,
			why:    bus.ReasonConflict, after: 1,
			snapshot: func(t *testing.T, uid string) func(snapshot.Request) (*snapshot.Response, error) {
				return ok(echoing(composite(t, uid, map[string]string{"sync": "/sync"}, false)), thing(uid, "b"))
			},
			before: func(t *testing.T, item bus.WorkItem, snap func(snapshot.Request) (*snapshot.Response, error)) {
				older := map[string]string{item.Parent.UID: "older"}
				d.echoes.Called(item.Controller.ID(), item.Parent.UID, item.MapKey, 2, older)
				d.echoes.Record(&bus.Applied{Controller: item.Controller, ParentUID: item.Parent.UID, WorkSeq: 2, Inputs: older})
			},
			want: func(uid string) syncResult {
				return syncResult{Result: "ok", Hooks: []string{"sync p-" + uid + " x=b"}, Desired: &desired{
					Hook: "sync", Parent: "p-" + uid, Children: []string{"c-b"}, Status: map[string]any{"x": "b"}, Echoable: true, MinRVs: fresh(uid)}}
			},
		},
		{
			reason: "composite: a rolling parent is synced once per live revision and never an echo",
			kind:   v1alpha1.CompositeControllerKind,
			snapshot: func(t *testing.T, uid string) func(snapshot.Request) (*snapshot.Response, error) {
				return ok(composite(t, uid, map[string]string{"sync": "/sync"}, true), thing(uid, "new"))
			},
			want: func(uid string) syncResult {
				return syncResult{Result: "ok", Hooks: []string{"sync p-" + uid + " x=new", "sync p-" + uid + " x=old"}, Desired: &desired{
					Hook: "sync", Parent: "p-" + uid, Children: []string{"c-new"}, Status: map[string]any{"x": "new"},
					LatestRevision: true, Revisions: []string{"older:c-old"}, MinRVs: fresh(uid)}}
			},
		},
		{
			reason: "composite: the customize hook's related objects are observed and shown",
			kind:   v1alpha1.CompositeControllerKind,
			snapshot: func(t *testing.T, uid string) func(snapshot.Request) (*snapshot.Response, error) {
				inner := ok(composite(t, uid, map[string]string{"sync": "/sync", "customize": "/customize"}, false), thing(uid, "a"))
				return func(r snapshot.Request) (*snapshot.Response, error) {
					s, _ := inner(r)
					if r.Related != nil {
						cm := &unstructured.Unstructured{}
						cm.SetAPIVersion("v1")
						cm.SetKind("ConfigMap")
						cm.SetNamespace("ns")
						cm.SetName("rel")
						s.Related = []snapshot.Group{{APIVersion: "v1", Kind: "ConfigMap", Namespaced: true, Objects: []*unstructured.Unstructured{cm}}}
					}
					return s, nil
				}
			},
			want: func(uid string) syncResult {
				return syncResult{Result: "ok", Hooks: []string{"customize p-" + uid + " x=a", "sync p-" + uid + " x=a related=1"}, Desired: &desired{
					Hook: "sync", Parent: "p-" + uid, Children: []string{"c-a"}, Status: map[string]any{"x": "a"}, MinRVs: fresh(uid)}}
			},
		},
		{
			reason: "the parent is gone",
			kind:   v1alpha1.CompositeControllerKind,
			snapshot: func(*testing.T, string) func(snapshot.Request) (*snapshot.Response, error) {
				return result(snapshot.NotFound)
			},
			want: func(string) syncResult { return syncResult{Result: "notfound"} },
		},
		{
			reason: "the controller is gone: its finalizer is released",
			kind:   v1alpha1.DecoratorControllerKind,
			snapshot: func(*testing.T, string) func(snapshot.Request) (*snapshot.Response, error) {
				return result(snapshot.ControllerGone)
			},
			want: func(uid string) syncResult {
				return syncResult{Result: "release", Desired: &desired{Hook: bus.HookRelease, Parent: "p-" + uid, Finalizer: "metacontroller.io/decoratorcontroller-ctrl"}}
			},
		},
		{
			reason: "a snapshot that is not fresh yet is retried quietly",
			kind:   v1alpha1.CompositeControllerKind,
			snapshot: func(*testing.T, string) func(snapshot.Request) (*snapshot.Response, error) {
				return result(snapshot.Retry)
			},
			want: func(string) syncResult {
				return syncResult{Result: "error", Retry: &scheduled{Reason: bus.ReasonRetry, Attempt: 1}, Failures: 1}
			},
		},
		{
			reason:  "metabus's own failure raises the parent's backoff while it is short",
			kind:    v1alpha1.CompositeControllerKind,
			attempt: 3,
			snapshot: func(*testing.T, string) func(snapshot.Request) (*snapshot.Response, error) {
				return func(snapshot.Request) (*snapshot.Response, error) { return nil, errors.New("no responders") }
			},
			want: func(string) syncResult {
				return syncResult{Result: "error", Retry: &scheduled{Reason: bus.ReasonRetry, Attempt: 4}, Failures: 4}
			},
		},
		{
			reason:  "metabus's own failures raise the parent's backoff no further than 16 s (a watcher outage left parents 5 minutes apart)",
			kind:    v1alpha1.CompositeControllerKind,
			attempt: bus.OwnFailureAttempts,
			snapshot: func(*testing.T, string) func(snapshot.Request) (*snapshot.Response, error) {
				return func(snapshot.Request) (*snapshot.Response, error) { return nil, errors.New("no responders") }
			},
			want: func(string) syncResult {
				return syncResult{Result: "error", Retry: &scheduled{Reason: bus.ReasonRetry, Attempt: bus.OwnFailureAttempts}, Failures: bus.OwnFailureAttempts}
			},
		},
		{
			reason: "an unreachable snapshot service while shutting down leaves the item for redelivery",
			kind:   v1alpha1.CompositeControllerKind,
			snapshot: func(*testing.T, string) func(snapshot.Request) (*snapshot.Response, error) {
				return func(snapshot.Request) (*snapshot.Response, error) { return nil, errors.New("no responders") }
			},
			cancelled: true,
			want:      func(string) syncResult { return syncResult{Result: "cancelled", Nak: true} },
		},
		{
			reason: "a controller that does not decode is invalid",
			kind:   v1alpha1.CompositeControllerKind,
			snapshot: func(t *testing.T, uid string) func(snapshot.Request) (*snapshot.Response, error) {
				return ok(controllerObject(t, v1alpha1.CompositeControllerKind, "cc", "ctrl-"+uid, map[string]any{"parentResource": "nope"}), thing(uid, "a"))
			},
			want: func(string) syncResult { return syncResult{Result: "invalid"} },
		},
		{
			reason: "an unknown kind is dropped",
			kind:   "FooController",
			snapshot: func(*testing.T, string) func(snapshot.Request) (*snapshot.Response, error) {
				return result(snapshot.OK)
			},
			want: func(string) syncResult { return syncResult{Result: "unsupported"} },
		},
		{
			reason:   "a release item is forwarded without a snapshot or hook",
			kind:     v1alpha1.CompositeControllerKind,
			why:      bus.ReasonRelease,
			snapshot: func(*testing.T, string) func(snapshot.Request) (*snapshot.Response, error) { return nil },
			want: func(uid string) syncResult {
				return syncResult{Result: "release", Desired: &desired{Hook: bus.HookRelease, Parent: "p-" + uid, Finalizer: "some/finalizer"}}
			},
		},
		{
			reason: "decorator: the sync hook's attachments, labels and status are published",
			kind:   v1alpha1.DecoratorControllerKind,
			snapshot: func(t *testing.T, uid string) func(snapshot.Request) (*snapshot.Response, error) {
				return ok(decorator(t, uid, map[string]string{"sync": "/sync"}), selected(thing(uid, "a")))
			},
			want: func(uid string) syncResult {
				yes := "yes"
				return syncResult{Result: "ok", Hooks: []string{"sync p-" + uid + " x=a"}, Desired: &desired{
					Hook: "sync", Parent: "p-" + uid, Children: []string{"c-a"}, Status: map[string]any{"x": "a"}, StatusSet: true,
					Labels: map[string]*string{"decorated": &yes}, MinRVs: fresh(uid)}}
			},
		},
		{
			reason: "decorator: an opted-out target holding the finalizer is finalized",
			kind:   v1alpha1.DecoratorControllerKind,
			snapshot: func(t *testing.T, uid string) func(snapshot.Request) (*snapshot.Response, error) {
				p := thing(uid, "a")
				p.SetFinalizers([]string{"metacontroller.io/decoratorcontroller-dc-" + uid})
				return ok(decorator(t, uid, map[string]string{"sync": "/sync", "finalize": "/finalize"}), p)
			},
			want: func(uid string) syncResult {
				yes := "yes"
				return syncResult{Result: "ok", Hooks: []string{"finalize p-" + uid + " x=a finalizing"}, Desired: &desired{
					Hook: "finalize", Parent: "p-" + uid, Children: []string{"c-a"}, Status: map[string]any{"x": "a"}, StatusSet: true,
					Labels: map[string]*string{"decorated": &yes}, Finalized: true, MinRVs: fresh(uid)}}
			},
		},
		{
			reason: "decorator: an opted-out target without the finalizer is skipped",
			kind:   v1alpha1.DecoratorControllerKind,
			snapshot: func(t *testing.T, uid string) func(snapshot.Request) (*snapshot.Response, error) {
				return ok(decorator(t, uid, map[string]string{"sync": "/sync", "finalize": "/finalize"}), thing(uid, "a"))
			},
			want: func(string) syncResult { return syncResult{Result: "skipped"} },
		},
		{
			reason: "decorator: an echo of our own writes calls no hook",
			kind:   v1alpha1.DecoratorControllerKind,
			snapshot: func(t *testing.T, uid string) func(snapshot.Request) (*snapshot.Response, error) {
				return ok(echoing(decorator(t, uid, map[string]string{"sync": "/sync"})), selected(thing(uid, "a")))
			},
			before: shownBefore,
			want:   func(string) syncResult { return syncResult{Result: "echo"} },
		},
		{
			reason:   "composite: without the opt-in, a sync that sees only our own writes calls the hook (upstream's contract)",
			kind:     v1alpha1.CompositeControllerKind,
			snapshot: compositeA,
			before: func(t *testing.T, item bus.WorkItem, snap func(snapshot.Request) (*snapshot.Response, error)) {
				// As if the hook had been shown the parent at "9" and
				// the applier had noted its write from "9" to "10": the
				// opted-in path would skip.
				ownWriteSince(d.echoes, item, snap)
			},
			want: syncedA,
		},
		{
			reason:   "composite: an event whose snapshot is exactly what the latest call was shown is merged into that call",
			kind:     v1alpha1.CompositeControllerKind,
			snapshot: compositeA,
			before:   shownBefore,
			want:     func(string) syncResult { return syncResult{Result: "merged"} },
		},
		repeatCalls(bus.ReasonRetry),
		repeatCalls(bus.ReasonResync),
		repeatCalls(bus.ReasonResyncAfter),
		{
			reason:   "composite: an event after a failed call is never merged, even when the snapshot is what the last answered call was shown",
			kind:     v1alpha1.CompositeControllerKind,
			snapshot: compositeA,
			before: func(t *testing.T, item bus.WorkItem, snap func(snapshot.Request) (*snapshot.Response, error)) {
				s, _ := snap(snapshot.Request{})
				d.echoes.Called(item.Controller.ID(), item.Parent.UID, item.MapKey, 1, echo.Inputs(s))
				d.failures.record(d.failureKey(item), 1, time.Now())
			},
			want: func(uid string) syncResult {
				return syncResult{Result: "ok", Hooks: []string{"sync p-" + uid + " x=a"}, Desired: &desired{
					Hook: "sync", Parent: "p-" + uid, Children: []string{"c-a"}, Status: map[string]any{"x": "a"}, MinRVs: fresh(uid), Attempt: 1}}
			},
		},
		{
			reason: "composite: a rolling parent is never merged: its requests also depend on revisions",
			kind:   v1alpha1.CompositeControllerKind,
			snapshot: func(t *testing.T, uid string) func(snapshot.Request) (*snapshot.Response, error) {
				return ok(composite(t, uid, map[string]string{"sync": "/sync"}, true), thing(uid, "a"))
			},
			before: shownBefore,
			want: func(uid string) syncResult {
				return syncResult{Result: "ok", Hooks: []string{"sync p-" + uid + " x=a", "sync p-" + uid + " x=old"}, Desired: &desired{
					Hook: "sync", Parent: "p-" + uid, Children: []string{"c-a"}, Status: map[string]any{"x": "a"},
					LatestRevision: true, Revisions: []string{"older:c-old"}, MinRVs: fresh(uid)}}
			},
		},
		{
			reason: "decorator: without the opt-in, a sync that sees only our own writes calls the hook (upstream's contract)",
			kind:   v1alpha1.DecoratorControllerKind,
			snapshot: func(t *testing.T, uid string) func(snapshot.Request) (*snapshot.Response, error) {
				return ok(decorator(t, uid, map[string]string{"sync": "/sync"}), selected(thing(uid, "a")))
			},
			before: func(t *testing.T, item bus.WorkItem, snap func(snapshot.Request) (*snapshot.Response, error)) {
				ownWriteSince(d.echoes, item, snap)
			},
			want: func(uid string) syncResult {
				yes := "yes"
				return syncResult{Result: "ok", Hooks: []string{"sync p-" + uid + " x=a"}, Desired: &desired{
					Hook: "sync", Parent: "p-" + uid, Children: []string{"c-a"}, Status: map[string]any{"x": "a"}, StatusSet: true,
					Labels: map[string]*string{"decorated": &yes}, MinRVs: fresh(uid)}}
			},
		},
	}
	for i, tc := range tests {
		t.Run(tc.reason, func(t *testing.T) {
			uid := fmt.Sprintf("u%d", i)
			why := tc.why
			if why == "" {
				why = bus.ReasonEvent
			}
			item := bus.WorkItem{
				Controller: bus.ControllerRef{Kind: tc.kind, Name: "ctrl", UID: "ctrl-" + uid},
				Parent: bus.ObjectRef{APIVersion: "example.com/v1", Kind: "Thing", Resource: "things", Namespace: "ns",
					Name: "p-" + uid, UID: uid},
				Reason: why, Finalizer: "some/finalizer", AfterSeq: tc.after, Attempt: tc.attempt,
			}
			snap := tc.snapshot(t, uid)
			snaps.mu.Lock()
			snaps.answer = snap
			snaps.mu.Unlock()
			if tc.before != nil {
				tc.before(t, item, snap)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			if tc.cancelled {
				cancel()
			}
			var got syncResult
			var out outcome.Outcome
			got.Result, out = d.resolve(ctx, item, d.syncParent(ctx, item, 42))
			got.Nak = out != outcome.Done()
			got.Hooks = h.taken()
			got.Desired = lastDesired(t, js, item)
			got.Retry = lastRetry(t, js, item)
			got.Events = takeEvents(rec)
			got.Failures = d.failures.get(d.failureKey(item))
			if diff := cmp.Diff(tc.want(uid), got); diff != "" {
				t.Errorf("sync (-want +got):\n%s", diff)
			}
		})
	}
}

// ownWriteSince records, as the latest hook call of item, its snapshot
// with the parent at resourceVersion "9", and the applier's note of its
// own write of the parent from "9" to the snapshot's version: the sync
// that follows sees nothing but that write.
func ownWriteSince(b *echo.Book, item bus.WorkItem, snap func(snapshot.Request) (*snapshot.Response, error)) {
	s, _ := snap(snapshot.Request{})
	before := echo.Inputs(s)
	uid := string(s.Parent.GetUID())
	now := before[uid]
	before[uid] = "9"
	b.Called(item.Controller.ID(), item.Parent.UID, item.MapKey, 1, before)
	b.Record(&bus.Applied{Controller: item.Controller, ParentUID: item.Parent.UID, WorkSeq: 1, Inputs: before,
		Writes: []bus.Write{{UID: uid, From: "9", To: now}}, Done: true})
}

// TestFinalizerOfDeletedController: every kind's row names the finalizer
// of a deleted controller from its name alone, as upstream names it, or ""
// for a kind that puts none on parents (then nothing is released).
func TestFinalizerOfDeletedController(t *testing.T) {
	want := map[string]string{
		v1alpha1.CompositeControllerKind: "metacontroller.io/compositecontroller-gone.example",
		v1alpha1.DecoratorControllerKind: "metacontroller.io/decoratorcontroller-gone.example",
		// MapController has no finalize hook: the garbage collector
		// deletes a parent's outputs with it (package mapctl).
		v1alpha1.MapControllerKind: "",
	}
	for _, k := range kindtable.Kinds {
		t.Run(k.Name, func(t *testing.T) {
			got := k.Finalizer("gone.example")
			w, known := want[k.Name]
			switch {
			case known && got != w:
				t.Errorf("finalizer %q, want %q (upstream's name, which existing parents carry)", got, w)
			case !known && got != "" && !strings.Contains(got, "gone.example"):
				t.Errorf("finalizer %q does not name the controller: parents of two controllers would share it", got)
			}
		})
	}
}
