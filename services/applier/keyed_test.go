package applier

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/zap"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/metabus/metabus/internal/testing/natstest"
	"github.com/metabus/metabus/pkg/api/v1alpha1"
	"github.com/metabus/metabus/pkg/bus"
	"github.com/metabus/metabus/pkg/children"
	"github.com/metabus/metabus/pkg/composite"
	"github.com/metabus/metabus/pkg/echo"
	"github.com/metabus/metabus/pkg/events"
	"github.com/metabus/metabus/pkg/jsbus"
	"github.com/metabus/metabus/pkg/kinds"
	"github.com/metabus/metabus/pkg/kindtable"
	busoutcome "github.com/metabus/metabus/pkg/outcome"
	"github.com/metabus/metabus/pkg/snapshot"
)

// keyedKind is a test kind whose unit of work is (parent, map key), as
// MapController's is, written against the kinds seam only: the applier
// must serve it without knowing its name.
const keyedKind = "KeyedTestController"

// keyedController is keyedKind's core: a composite's child rules and
// owner (its spec is a CompositeController's), without adoption, and the
// keyed kinds' split of the parent's writes: a keyed desired state writes
// nothing on the parent, the per-parent one only the status. A per-parent
// desired state owns nothing, so asking it for an owner is an error: the
// applier must not need one to apply it.
type keyedController struct {
	kinds.Controller
}

// withKeyedKind serves keyedKind for the test.
func withKeyedKind(t *testing.T) {
	t.Helper()
	saved := kindtable.Kinds
	kindtable.Kinds = append(slices.Clone(saved), kinds.Kind{
		Name: keyedKind,
		GVR:  schema.GroupVersionResource{Group: v1alpha1.Group, Version: v1alpha1.Version, Resource: "keyedtestcontrollers"},
		Decode: func(obj *unstructured.Unstructured) (kinds.Controller, error) {
			c, err := composite.New(obj)
			if err != nil {
				return nil, err
			}
			return keyedController{c}, nil
		},
		Finalizer: func(string) string { return "" },
	})
	t.Cleanup(func() { kindtable.Kinds = saved })
}

func (c keyedController) Ref() bus.ControllerRef {
	return bus.ControllerRef{Kind: keyedKind, Name: c.Object().GetName(), UID: string(c.Object().GetUID())}
}
func (c keyedController) FinalizerName() string { return "" }
func (c keyedController) Finalizer() string     { return "" }
func (c keyedController) ApplyClaims() bool     { return false }

func (c keyedController) ApplyOwner(parent *unstructured.Unstructured, ds *bus.DesiredState) (children.Owner, error) {
	if ds.MapKey == "" {
		return children.Owner{}, errors.New("a per-parent desired state owns no outputs")
	}
	return c.Controller.ApplyOwner(parent, ds)
}

func (c keyedController) ApplyParent(in kinds.ApplyInput) (kinds.ApplyParentPlan, error) {
	if in.Desired.MapKey != "" {
		return kinds.ApplyParentPlan{}, nil
	}
	return c.Controller.ApplyParent(in)
}

// keyedControllerObject is a keyedKind object (a composite's spec).
func keyedControllerObject() *unstructured.Unstructured {
	o := compositeController(false)
	o.SetKind(keyedKind)
	o.SetName("kc")
	o.SetUID("kc-uid")
	return o
}

// recordedSnapshots answers every request with answer, recording the map
// keys asked for.
type recordedSnapshots struct {
	asked  []string
	answer func(req snapshot.Request) *snapshot.Response
}

func (s *recordedSnapshots) Snapshot(_ context.Context, req snapshot.Request) (*snapshot.Response, error) {
	s.asked = append(s.asked, req.MapKey)
	return s.answer(req), nil
}

// TestApplyKeyed applies desired states of a keyed kind's parent, from the
// snapshot request to the settled message: a keyed one is planned against
// its own key's snapshot (only that key's outputs) and requeues, retries
// and notes its own key; the per-parent one writes the parent's status and
// touches no output, whatever the cluster holds.
func TestApplyKeyed(t *testing.T) {
	withKeyedKind(t)
	outputs := func(objs ...*unstructured.Unstructured) []snapshot.Group {
		return []snapshot.Group{{APIVersion: "v1", Resource: "configmaps", Kind: "ConfigMap", Namespaced: true, Objects: objs}}
	}
	inputs := map[string]string{"kc-uid": "1", "in-a": "3"}
	type result struct {
		Asked    []string
		Outcome  string
		Calls    []string
		Settled  busoutcome.Outcome
		Sched    []string
		NotedFor []string // the items whose echo reference the applied note set
	}
	tests := []struct {
		reason     string
		controller *unstructured.Unstructured
		key        string
		hook       string
		desired    []*unstructured.Unstructured
		status     map[string]any
		// snapshot answers for the key asked (every output of the parent
		// is in the cluster: out-a of key ka, out-b of key kb).
		snapshot func(key string) *snapshot.Response
		reactor  func(*dynamicfake.FakeDynamicClient)
		want     result
	}{
		{
			reason:     "a keyed desired state is planned against its key's outputs only: another key's output is never deleted",
			controller: keyedControllerObject(), key: "ka", hook: bus.HookMap,
			desired: []*unstructured.Unstructured{desiredCM("out-a2")},
			snapshot: func(key string) *snapshot.Response {
				return &snapshot.Response{MapKey: key, Children: outputs(configMap("out-a", true))}
			},
			want: result{Asked: []string{"ka"}, Outcome: resultOK, Calls: []string{"delete configmaps out-a", "create configmaps out-a2"},
				Settled: busoutcome.Done(), NotedFor: []string{"ka"}},
		},
		{
			reason:     "a keyed apply that conflicts requeues its own key, naming the sync it repeats",
			controller: keyedControllerObject(), key: "ka", hook: bus.HookMap,
			snapshot: func(key string) *snapshot.Response {
				return &snapshot.Response{MapKey: key, Children: outputs(configMap("out-a", true))}
			},
			reactor: func(dyn *dynamicfake.FakeDynamicClient) {
				dyn.PrependReactor("delete", "configmaps", func(k8stesting.Action) (bool, runtime.Object, error) {
					return true, nil, apierrors.NewConflict(schema.GroupResource{Resource: "configmaps"}, "out-a", errors.New("uid changed"))
				})
			},
			want: result{Asked: []string{"ka"}, Outcome: "conflict (attempt 0)", Calls: []string{"delete configmaps out-a"},
				Settled: busoutcome.Done(), Sched: []string{"conflict attempt=0 in=0s after=7 key=ka"}},
		},
		{
			reason:     "the per-parent desired state writes the status alone: no owner asked, nothing planned, no output deleted",
			controller: keyedControllerObject(), key: "", hook: bus.HookStatus, status: map[string]any{"inputs": float64(2)},
			snapshot: func(string) *snapshot.Response {
				return &snapshot.Response{Summary: map[string]any{"inputs": int64(2)}}
			},
			want: result{Asked: []string{""}, Outcome: resultOK, Calls: []string{"update things/status web"}, Settled: busoutcome.Done(), NotedFor: []string{""}},
		},
		{
			reason:     "a per-parent desired state naming outputs is refused before any write, and retried on the parent's own schedule",
			controller: keyedControllerObject(), key: "", hook: bus.HookStatus, status: map[string]any{"inputs": float64(2)},
			desired: []*unstructured.Unstructured{desiredCM("out-x")},
			snapshot: func(string) *snapshot.Response {
				return &snapshot.Response{Summary: map[string]any{"inputs": int64(2)}}
			},
			want: result{Asked: []string{""}, Outcome: "error " + events.ReasonApplyError, Settled: busoutcome.Done(), Sched: []string{"retry attempt=1 in=1s"}},
		},
		{
			reason:     "composite: a snapshot without child groups plans nothing to delete, whatever the cluster holds",
			controller: compositeController(false), key: "", hook: bus.HookSync, status: map[string]any{"inputs": float64(2)},
			snapshot: func(string) *snapshot.Response { return &snapshot.Response{} },
			want:     result{Asked: []string{""}, Outcome: resultOK, Calls: []string{"update things/status web"}, Settled: busoutcome.Done(), NotedFor: []string{""}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.reason, func(t *testing.T) {
			parent := thing()
			a, dyn := testApplier(t, parent.DeepCopy(), configMap("out-a", true), configMap("out-b", true))
			if tt.reactor != nil {
				tt.reactor(dyn)
			}
			snaps := &recordedSnapshots{answer: func(req snapshot.Request) *snapshot.Response {
				s := tt.snapshot(req.MapKey)
				s.Result, s.Controller, s.Parent, s.ParentResource, s.ParentHasStatus = snapshot.OK, tt.controller, parent, "things", true
				return s
			}}
			sched := &schedules{}
			book := echo.NewBook(0)
			a.snaps, a.sched, a.echoes, a.log = snaps, sched, book, zap.NewNop()
			ds := &bus.DesiredState{
				Controller: bus.ControllerRef{Kind: tt.controller.GetKind(), Name: tt.controller.GetName(), UID: string(tt.controller.GetUID())},
				Parent:     bus.ObjectRef{APIVersion: "example.com/v1", Kind: "Thing", Resource: "things", Namespace: "ns", Name: "web", UID: "p-uid", Generation: 2},
				MapKey:     tt.key, WorkSeq: 7, Hook: tt.hook, Children: tt.desired, Status: tt.status, Inputs: inputs,
			}
			ctx := context.Background()
			wl := a.newWriteLog(ds)
			err := a.apply(withWriteLog(ctx, wl), ds)
			got := result{Asked: snaps.asked, Outcome: outcome(err), Calls: calls(dyn)}
			got.Settled, got.Sched = a.settle(ctx, ds, wl, time.Now(), err), sched.items
			for _, key := range []string{"", "ka", "kb"} {
				if book.Echo(ds.Controller.ID(), ds.Parent.UID, key, inputs) {
					got.NotedFor = append(got.NotedFor, key)
				}
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("apply (-want +got):\n%s", diff)
			}
		})
	}
}

// TestSupersededPerItem: only a later desired state of the same item (the
// same map key, or the per-parent one) supersedes one; the parent's other
// keys are independent units.
func TestSupersededPerItem(t *testing.T) {
	_, js := natstest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := jsbus.Ensure(ctx, js, bus.Options{}); err != nil {
		t.Fatal(err)
	}
	a := &Applier{js: js}
	pub := jsbus.Publisher{JS: js}
	state := func(key string, seq uint64) bus.DesiredState {
		return bus.DesiredState{
			Controller: bus.ControllerRef{Kind: v1alpha1.MapControllerKind, Name: "m"},
			Parent:     bus.ObjectRef{APIVersion: "example.com/v1", Kind: "Thing", Resource: "things", Namespace: "ns", Name: "web", UID: "p-uid"},
			MapKey:     key, WorkSeq: seq, Hook: bus.HookMap, Children: []*unstructured.Unstructured{},
		}
	}
	// stored publishes ds and returns its MC_DESIRED sequence.
	stored := func(ds bus.DesiredState) uint64 {
		t.Helper()
		if err := pub.PublishDesired(ctx, ds); err != nil {
			t.Fatal(err)
		}
		st, err := js.Stream(ctx, bus.DesiredStream)
		if err != nil {
			t.Fatal(err)
		}
		m, err := st.GetLastMsgForSubject(ctx, bus.StoredDesiredSubjectKey(ds.Controller.ID(), ds.Parent.UID, ds.MapKey))
		if err != nil {
			t.Fatal(err)
		}
		return m.Sequence
	}
	ka := state("ka", 1)
	kaSeq := stored(ka)
	stored(state("kb", 2))
	perParent := state("", 3)
	perParentSeq := stored(perParent)
	type verdicts struct{ KeyA, PerParent bool }
	check := func(reason string, want verdicts) {
		t.Run(reason, func(t *testing.T) {
			got := verdicts{KeyA: a.superseded(ctx, &ka, kaSeq), PerParent: a.superseded(ctx, &perParent, perParentSeq)}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("superseded (-want +got):\n%s", diff)
			}
		})
	}
	check("later states of other keys and of the parent supersede nothing", verdicts{})
	stored(state("ka", 4))
	check("a later state of the same key supersedes it", verdicts{KeyA: true})
}

// TestWriteFreshnessPerParent: this replica's own parent writes raise the
// snapshot floor of every item of the parent (the parent is one object),
// and keys applied in parallel never lower it.
func TestWriteFreshnessPerParent(t *testing.T) {
	ds := func(key string) *bus.DesiredState {
		return &bus.DesiredState{
			Controller: bus.ControllerRef{Kind: v1alpha1.MapControllerKind, Name: "m"},
			Parent:     bus.ObjectRef{APIVersion: "example.com/v1", Kind: "Thing", Resource: "things", Namespace: "ns", Name: "web", UID: "p-uid"},
			MapKey:     key,
		}
	}
	written := func(rv string) *unstructured.Unstructured {
		u := thing()
		u.SetResourceVersion(rv)
		return u
	}
	for _, tc := range []struct {
		reason string
		writes []string // "<key>=<rv>", in the order reported
		asker  string
		want   map[string]string
	}{
		{reason: "the per-parent item's status write is the floor of a key's snapshot",
			writes: []string{"=42"}, asker: "ka", want: map[string]string{"example.com/things": "42"}},
		{reason: "a key's write is the floor of the per-parent item's snapshot",
			writes: []string{"ka=42"}, asker: "", want: map[string]string{"example.com/things": "42"}},
		{reason: "an older write reported last does not lower the floor",
			writes: []string{"kb=45", "ka=43"}, asker: "", want: map[string]string{"example.com/things": "45"}},
		{reason: "no write: the hook's floor alone",
			asker: "ka", want: nil},
	} {
		t.Run(tc.reason, func(t *testing.T) {
			a := &Applier{written: map[string]ownWrite{}}
			for _, w := range tc.writes {
				key, rv, _ := strings.Cut(w, "=")
				a.wrote(ds(key), written(rv))
			}
			if diff := cmp.Diff(tc.want, a.freshness(ds(tc.asker))); diff != "" {
				t.Errorf("freshness floor (-want +got):\n%s", diff)
			}
		})
	}
}
