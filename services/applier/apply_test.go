package applier

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/zap"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/record"

	"github.com/metabus/metabus/pkg/apply"
	"github.com/metabus/metabus/pkg/bus"
	"github.com/metabus/metabus/pkg/discovery"
	"github.com/metabus/metabus/pkg/events"
	"github.com/metabus/metabus/pkg/events/recorder"
	"github.com/metabus/metabus/pkg/kinds"
	"github.com/metabus/metabus/pkg/kindtable"
	"github.com/metabus/metabus/pkg/revstore"
	"github.com/metabus/metabus/pkg/snapshot"
)

// testApplier is an Applier on a fake API server serving things
// (example.com/v1), configmaps and pods.
func testApplier(t *testing.T, objs ...runtime.Object) (*Applier, *dynamicfake.FakeDynamicClient) {
	t.Helper()
	m := discovery.New(discovery.SourceFunc(func(context.Context) ([]*metav1.APIResourceList, error) {
		return []*metav1.APIResourceList{
			{GroupVersion: "v1", APIResources: []metav1.APIResource{
				{Name: "configmaps", Kind: "ConfigMap", Namespaced: true},
				{Name: "pods", Kind: "Pod", Namespaced: true},
			}},
			{GroupVersion: "example.com/v1", APIResources: []metav1.APIResource{{Name: "things", Kind: "Thing", Namespaced: true}}},
		}, nil
	}))
	if err := m.Refresh(context.Background()); err != nil {
		t.Fatal(err)
	}
	dyn := dynamicfake.NewSimpleDynamicClient(runtime.NewScheme(), objs...)
	return &Applier{
		log: zap.NewNop(), dyn: dyn, disc: m, metrics: newMetrics(nil), written: map[string]ownWrite{},
		rec: &recorder.Recorder{EventRecorder: record.NewFakeRecorder(16)},
	}, dyn
}

// calls lists the API calls made, as "verb resource[/subresource] name".
func calls(dyn *dynamicfake.FakeDynamicClient) []string {
	var out []string
	for _, a := range dyn.Actions() {
		name := ""
		switch a := a.(type) {
		case k8stesting.GetAction:
			name = a.GetName()
		case k8stesting.PatchAction:
			name = a.GetName()
		case k8stesting.DeleteAction:
			name = a.GetName()
		case k8stesting.CreateAction:
			name = a.GetObject().(*unstructured.Unstructured).GetName()
		case k8stesting.UpdateAction:
			name = a.GetObject().(*unstructured.Unstructured).GetName()
		}
		res := a.GetResource().Resource
		if a.GetSubresource() != "" {
			res += "/" + a.GetSubresource()
		}
		out = append(out, a.GetVerb()+" "+res+" "+name)
	}
	return out
}

// outcome names how an apply ended, as settle would label it.
func outcome(err error) string {
	var (
		d   done
		rq  *requeueError
		app *applyError
	)
	switch {
	case err == nil:
		return resultOK
	case errors.As(err, &d):
		return string(d)
	case errors.As(err, &rq):
		return fmt.Sprintf("conflict (attempt %d)", rq.attempt)
	case errors.As(err, &app):
		return "error " + app.reason
	}
	return "error: " + err.Error()
}

func compositeController(finalize bool) *unstructured.Unstructured {
	hooks := map[string]any{"sync": map[string]any{"webhook": map[string]any{"url": "http://hook/sync"}}}
	if finalize {
		hooks["finalize"] = map[string]any{"webhook": map[string]any{"url": "http://hook/finalize"}}
	}
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "metacontroller.k8s.io/v1alpha1", "kind": "CompositeController",
		"metadata": map[string]any{"name": "things", "uid": fmt.Sprintf("cc-uid-%v", finalize), "resourceVersion": "1"},
		"spec": map[string]any{
			"parentResource": map[string]any{"apiVersion": "example.com/v1", "resource": "things"},
			"childResources": []any{map[string]any{"apiVersion": "v1", "resource": "configmaps"}},
			"hooks":          hooks,
		},
	}}
}

func decoratorController(finalize bool) *unstructured.Unstructured {
	hooks := map[string]any{"sync": map[string]any{"webhook": map[string]any{"url": "http://hook/sync"}}}
	if finalize {
		hooks["finalize"] = map[string]any{"webhook": map[string]any{"url": "http://hook/finalize"}}
	}
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "metacontroller.k8s.io/v1alpha1", "kind": "DecoratorController",
		"metadata": map[string]any{"name": "deco", "uid": fmt.Sprintf("dc-uid-%v", finalize), "resourceVersion": "1"},
		"spec": map[string]any{
			"resources": []any{map[string]any{"apiVersion": "example.com/v1", "resource": "things",
				"labelSelector": map[string]any{"matchLabels": map[string]any{"decorate": "yes"}}}},
			"attachments": []any{map[string]any{"apiVersion": "v1", "resource": "configmaps"}},
			"hooks":       hooks,
		},
	}}
}

const (
	ccFinalizer = "metacontroller.io/compositecontroller-things"
	dcFinalizer = "metacontroller.io/decoratorcontroller-deco"
)

// thing is the parent: ns/web, selector app=web, labelled decorate=yes,
// generation 2, status {ready: 1, observedGeneration: 2}.
func thing(mutate ...func(*unstructured.Unstructured)) *unstructured.Unstructured {
	p := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "example.com/v1", "kind": "Thing",
		"metadata": map[string]any{"name": "web", "namespace": "ns", "uid": "p-uid", "resourceVersion": "41",
			"generation": int64(2), "labels": map[string]any{"decorate": "yes"}},
		"spec":   map[string]any{"selector": map[string]any{"matchLabels": map[string]any{"app": "web"}}},
		"status": map[string]any{"ready": int64(1), "observedGeneration": int64(2)},
	}}
	for _, m := range mutate {
		m(p)
	}
	return p
}

func deletingNow(p *unstructured.Unstructured) {
	now := metav1.Now()
	p.SetDeletionTimestamp(&now)
}

func holding(f string) func(*unstructured.Unstructured) {
	return func(p *unstructured.Unstructured) { p.SetFinalizers([]string{f}) }
}

// configMap is a child of the parent (owned: with its controller
// reference, as a composite child or a decorator attachment).
func configMap(name string, owned bool, extra ...func(*unstructured.Unstructured)) *unstructured.Unstructured {
	o := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "v1", "kind": "ConfigMap",
		"metadata": map[string]any{"name": name, "namespace": "ns", "uid": "uid-" + name, "resourceVersion": "5",
			"labels": map[string]any{"app": "web"}},
		"data": map[string]any{"k": "v"},
	}}
	if owned {
		yes := true
		o.SetOwnerReferences([]metav1.OwnerReference{{APIVersion: "example.com/v1", Kind: "Thing", Name: "web", UID: "p-uid", Controller: &yes, BlockOwnerDeletion: &yes}})
	}
	for _, e := range extra {
		e(o)
	}
	return o
}

// desiredCM is a hook's desired ConfigMap.
func desiredCM(name string) *unstructured.Unstructured {
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "v1", "kind": "ConfigMap",
		"metadata": map[string]any{"name": name, "labels": map[string]any{"app": "web"}},
		"data":     map[string]any{"k": "v"},
	}}
}

// thingApply is ds of controller for the parent thing, and the snapshot
// of parent with its children.
func thingApply(ds bus.DesiredState, controller, parent *unstructured.Unstructured, hasStatus bool, children []snapshot.Group) (bus.DesiredState, *snapshot.Response) {
	ds.Controller = bus.ControllerRef{Kind: controller.GetKind(), Name: controller.GetName(), UID: string(controller.GetUID())}
	ds.Parent = bus.ObjectRef{APIVersion: "example.com/v1", Kind: "Thing", Resource: "things", Namespace: "ns", Name: "web", UID: "p-uid", Generation: 2}
	return ds, &snapshot.Response{Result: snapshot.OK, Controller: controller, Parent: parent,
		ParentResource: "things", ParentHasStatus: hasStatus, Children: children}
}

func TestApplyParent(t *testing.T) {
	group := func(objs ...*unstructured.Unstructured) []snapshot.Group {
		return []snapshot.Group{{APIVersion: "v1", Resource: "configmaps", Kind: "ConfigMap", Namespaced: true, Objects: objs}}
	}
	secret := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "v1", "kind": "Secret", "metadata": map[string]any{"name": "s"}}}
	tests := []struct {
		reason     string
		controller *unstructured.Unstructured
		parent     *unstructured.Unstructured
		children   []snapshot.Group
		hasStatus  bool
		ds         bus.DesiredState
		reactor    func(*dynamicfake.FakeDynamicClient)
		want       string
		wantCalls  []string
		// wantFinalizers, if set, are the parent's finalizers afterwards.
		wantFinalizers []string
	}{
		{
			reason:     "composite: children and status as observed: no API call at all",
			controller: compositeController(false), parent: thing(), children: group(configMap("a", true)),
			ds:   bus.DesiredState{Hook: "sync", Children: []*unstructured.Unstructured{desiredCM("a")}, Status: map[string]any{"ready": float64(1)}},
			want: resultNoop,
		},
		{
			reason:     "composite: only the status changed: one status write",
			controller: compositeController(false), parent: thing(), children: group(configMap("a", true)),
			ds:        bus.DesiredState{Hook: "sync", Children: []*unstructured.Unstructured{desiredCM("a")}, Status: map[string]any{"ready": float64(2)}},
			want:      resultOK,
			wantCalls: []string{"update things/status web"},
		},
		{
			reason:     "composite: a new child is created; an unchanged status is not written",
			controller: compositeController(false), parent: thing(), children: group(),
			ds:        bus.DesiredState{Hook: "sync", Children: []*unstructured.Unstructured{desiredCM("a")}, Status: map[string]any{"ready": float64(1)}},
			want:      resultOK,
			wantCalls: []string{"create configmaps a"},
		},
		{
			reason:     "composite: a new child is created and the answer's status written, as upstream (a hook may read it back)",
			controller: compositeController(false), parent: thing(), children: group(),
			ds:        bus.DesiredState{Hook: "sync", Children: []*unstructured.Unstructured{desiredCM("a")}, Status: map[string]any{"ready": float64(0)}},
			want:      resultOK,
			wantCalls: []string{"create configmaps a", "update things/status web"},
		},
		{
			reason:     "composite, opted into echo suppression (Inputs sent): the changed status is left to the sync the creation causes",
			controller: compositeController(false), parent: thing(), children: group(),
			ds: bus.DesiredState{Hook: "sync", Children: []*unstructured.Unstructured{desiredCM("a")}, Status: map[string]any{"ready": float64(0)},
				Inputs: map[string]string{"uid-web": "1"}},
			want:      resultOK,
			wantCalls: []string{"create configmaps a"},
		},
		{
			reason:     "composite: a finalize answer that creates a child still writes its status (finalizing is not left to a later sync)",
			controller: compositeController(true), parent: thing(deletingNow, holding(ccFinalizer)), children: group(),
			ds:        bus.DesiredState{Hook: "finalize", Children: []*unstructured.Unstructured{desiredCM("a")}, Status: map[string]any{"ready": float64(0)}},
			want:      resultOK,
			wantCalls: []string{"create configmaps a", "update things/status web"},
		},
		{
			reason:     "composite: a child no longer desired is deleted",
			controller: compositeController(false), parent: thing(), children: group(configMap("a", true)),
			ds:        bus.DesiredState{Hook: "sync", Status: map[string]any{"ready": float64(1)}},
			want:      resultOK,
			wantCalls: []string{"delete configmaps a"},
		},
		{
			reason:     "composite with a finalize hook: the finalizer is in place before the first child",
			controller: compositeController(true), parent: thing(), children: group(),
			ds:             bus.DesiredState{Hook: "sync", Children: []*unstructured.Unstructured{desiredCM("a")}, Status: map[string]any{"ready": float64(1)}},
			want:           resultOK,
			wantCalls:      []string{"patch things web", "create configmaps a"},
			wantFinalizers: []string{ccFinalizer},
		},
		{
			reason:     "composite: a response naming an undeclared kind is rejected as a whole; nothing is written, not even the finalizer",
			controller: compositeController(true), parent: thing(), children: group(configMap("a", true)),
			ds:   bus.DesiredState{Hook: "sync", Children: []*unstructured.Unstructured{desiredCM("b"), secret}, Status: map[string]any{"ready": float64(5)}},
			want: "error " + events.ReasonInvalidDesired,
		},
		{
			reason:     "composite: a parent without a selector cannot own children",
			controller: compositeController(false), parent: thing(func(p *unstructured.Unstructured) { delete(p.Object, "spec") }),
			ds:   bus.DesiredState{Hook: "sync", Status: map[string]any{"ready": float64(2)}},
			want: "error " + events.ReasonSyncError,
		},
		{
			reason:     "composite: a parent being deleted without our finalizer is the garbage collector's",
			controller: compositeController(false), parent: thing(deletingNow), children: group(configMap("a", true)),
			ds:   bus.DesiredState{Hook: "sync", Status: map[string]any{"ready": float64(2)}},
			want: resultParentDeleting,
		},
		{
			reason:     "composite: a final finalize answer releases the finalizer after the last child write",
			controller: compositeController(true), parent: thing(deletingNow, holding(ccFinalizer)), children: group(configMap("a", true)),
			ds:             bus.DesiredState{Hook: "finalize", Finalized: true, Status: map[string]any{"ready": float64(1)}},
			want:           resultFinalized,
			wantCalls:      []string{"delete configmaps a", "patch things web"},
			wantFinalizers: []string{},
		},
		{
			reason:     "composite: a finalize answer not done yet keeps the finalizer",
			controller: compositeController(true), parent: thing(deletingNow, holding(ccFinalizer)), children: group(configMap("a", true)),
			ds:        bus.DesiredState{Hook: "finalize", Status: map[string]any{"ready": float64(1)}},
			want:      resultOK,
			wantCalls: []string{"delete configmaps a"},
		},
		{
			reason:     "composite: a conflict on a child write requeues, and the status is still written",
			controller: compositeController(false), parent: thing(), children: group(configMap("a", true)),
			ds: bus.DesiredState{Hook: "sync", Attempt: 2, Status: map[string]any{"ready": float64(2)}},
			reactor: func(dyn *dynamicfake.FakeDynamicClient) {
				dyn.PrependReactor("delete", "configmaps", func(k8stesting.Action) (bool, runtime.Object, error) {
					return true, nil, apierrors.NewConflict(schema.GroupResource{Resource: "configmaps"}, "a", errors.New("uid changed"))
				})
			},
			want:      "conflict (attempt 2)",
			wantCalls: []string{"delete configmaps a", "update things/status web"},
		},
		{
			reason:     "composite: a failed child write is retried with an ApplyError, after the status write",
			controller: compositeController(false), parent: thing(), children: group(),
			ds: bus.DesiredState{Hook: "sync", Children: []*unstructured.Unstructured{desiredCM("a")}, Status: map[string]any{"ready": float64(2)}},
			reactor: func(dyn *dynamicfake.FakeDynamicClient) {
				dyn.PrependReactor("create", "configmaps", func(k8stesting.Action) (bool, runtime.Object, error) {
					return true, nil, apierrors.NewInternalError(errors.New("boom"))
				})
			},
			want:      "error " + events.ReasonApplyError,
			wantCalls: []string{"create configmaps a", "update things/status web"},
		},
		{
			reason:     "composite: a conflict on the finalizer patch requeues before any child",
			controller: compositeController(true), parent: thing(), children: group(),
			ds: bus.DesiredState{Hook: "sync", Children: []*unstructured.Unstructured{desiredCM("a")}},
			reactor: func(dyn *dynamicfake.FakeDynamicClient) {
				dyn.PrependReactor("patch", "things", func(k8stesting.Action) (bool, runtime.Object, error) {
					return true, nil, apierrors.NewConflict(schema.GroupResource{Resource: "things"}, "web", errors.New("changed"))
				})
			},
			want:      "conflict (attempt 0)",
			wantCalls: []string{"patch things web"},
		},
		{
			reason:     "composite: an orphan the selector matches is adopted (after a live recheck of the parent), then planned as ours",
			controller: compositeController(false), parent: thing(),
			children: []snapshot.Group{{APIVersion: "v1", Resource: "configmaps", Kind: "ConfigMap", Namespaced: true,
				Objects: []*unstructured.Unstructured{configMap("a", true), configMap("orphan", false)},
				Adopt:   []*unstructured.Unstructured{configMap("orphan", false)}}},
			ds:        bus.DesiredState{Hook: "sync", Children: []*unstructured.Unstructured{desiredCM("a"), desiredCM("orphan")}, Status: map[string]any{"ready": float64(1)}},
			want:      resultOK,
			wantCalls: []string{"get things web", "patch configmaps orphan"},
		},
		{
			reason:     "composite: a child that stopped matching is released",
			controller: compositeController(false), parent: thing(),
			children: []snapshot.Group{{APIVersion: "v1", Resource: "configmaps", Kind: "ConfigMap", Namespaced: true,
				Objects: []*unstructured.Unstructured{configMap("a", true)},
				Release: []*unstructured.Unstructured{configMap("stray", true)}}},
			ds:        bus.DesiredState{Hook: "sync", Children: []*unstructured.Unstructured{desiredCM("a")}, Status: map[string]any{"ready": float64(1)}},
			want:      resultOK,
			wantCalls: []string{"patch configmaps stray"},
		},
		{
			reason:     "decorator: labels, annotations and attachments as observed: no API call at all",
			controller: decoratorController(false), parent: thing(func(p *unstructured.Unstructured) { p.SetLabels(map[string]string{"decorate": "yes", "team": "a"}) }),
			children: group(configMap("a", true, func(o *unstructured.Unstructured) {
				o.SetAnnotations(map[string]string{"metacontroller.k8s.io/decorator-controller": "deco"})
			})),
			ds:   bus.DesiredState{Hook: "sync", Labels: map[string]*string{"team": ptr("a")}, Children: []*unstructured.Unstructured{desiredCM("a")}},
			want: resultNoop,
		},
		{
			reason:     "decorator with a finalize hook: labels and finalizer in one patch, before the attachment",
			controller: decoratorController(true), parent: thing(), children: group(), hasStatus: true,
			ds: bus.DesiredState{Hook: "sync", Labels: map[string]*string{"team": ptr("b")}, Children: []*unstructured.Unstructured{desiredCM("a")},
				Status: map[string]any{"ready": float64(1), "observedGeneration": float64(2)}, StatusSet: true},
			want:           resultOK,
			wantCalls:      []string{"patch things web", "create configmaps a"},
			wantFinalizers: []string{dcFinalizer},
		},
		{
			reason:     "decorator: a changed status goes through /status",
			controller: decoratorController(false), parent: thing(), children: group(), hasStatus: true,
			ds:        bus.DesiredState{Hook: "sync", Status: map[string]any{"decorated": true}, StatusSet: true},
			want:      resultOK,
			wantCalls: []string{"update things/status web"},
		},
		{
			reason:     "decorator: a new attachment is created and the answer's status written, as upstream",
			controller: decoratorController(false), parent: thing(), children: group(), hasStatus: true,
			ds:        bus.DesiredState{Hook: "sync", Children: []*unstructured.Unstructured{desiredCM("a")}, Status: map[string]any{"decorated": true}, StatusSet: true},
			want:      resultOK,
			wantCalls: []string{"create configmaps a", "update things/status web"},
		},
		{
			reason:     "decorator, opted into echo suppression (Inputs sent): the changed status is left to the sync the creation causes",
			controller: decoratorController(false), parent: thing(), children: group(), hasStatus: true,
			ds: bus.DesiredState{Hook: "sync", Children: []*unstructured.Unstructured{desiredCM("a")}, Status: map[string]any{"decorated": true}, StatusSet: true,
				Inputs: map[string]string{"uid-web": "1"}},
			want:      resultOK,
			wantCalls: []string{"create configmaps a"},
		},
		{
			reason:     "decorator: a sync answer for a target that opted out meanwhile is not applied: sync again",
			controller: decoratorController(true), parent: thing(func(p *unstructured.Unstructured) { p.SetLabels(nil) }), children: group(),
			ds:   bus.DesiredState{Hook: "sync", Attempt: 1, Labels: map[string]*string{"team": ptr("b")}, Children: []*unstructured.Unstructured{desiredCM("a")}},
			want: "conflict (attempt 1)",
		},
		{
			reason:     "decorator: a final finalize answer releases the finalizer last",
			controller: decoratorController(true), parent: thing(func(p *unstructured.Unstructured) { p.SetLabels(nil) }, holding(dcFinalizer)),
			children: group(configMap("a", true, func(o *unstructured.Unstructured) {
				o.SetAnnotations(map[string]string{"metacontroller.k8s.io/decorator-controller": "deco"})
			})),
			ds:             bus.DesiredState{Hook: "finalize", Finalized: true},
			want:           resultFinalized,
			wantCalls:      []string{"delete configmaps a", "patch things web"},
			wantFinalizers: []string{},
		},
		{
			reason:     "decorator: attachments are never adopted, whatever the snapshot says",
			controller: decoratorController(false), parent: thing(),
			children: []snapshot.Group{{APIVersion: "v1", Resource: "configmaps", Kind: "ConfigMap", Namespaced: true,
				Objects: []*unstructured.Unstructured{configMap("orphan", false)},
				Adopt:   []*unstructured.Unstructured{configMap("orphan", false)}}},
			ds:   bus.DesiredState{Hook: "sync"},
			want: resultNoop,
		},
	}
	for _, tt := range tests {
		t.Run(tt.reason, func(t *testing.T) {
			objs := []runtime.Object{tt.parent.DeepCopy()}
			for _, g := range tt.children {
				for _, o := range g.Objects {
					objs = append(objs, o.DeepCopy())
				}
				for _, o := range g.Release {
					objs = append(objs, o.DeepCopy())
				}
			}
			a, dyn := testApplier(t, objs...)
			if tt.reactor != nil {
				tt.reactor(dyn)
			}
			ds, snap := thingApply(tt.ds, tt.controller, tt.parent, tt.hasStatus, tt.children)
			before := tt.parent.DeepCopy()
			// The dispatcher's judgment on the same snapshot
			// (kinds.WritesNothing), made before the apply (which may add
			// to ds), must agree with it: never a no-op where the applier
			// writes, and every sync answer the applier finds a no-op here
			// judged one.
			ctrl, err := kindtable.Decode(tt.controller)
			if err != nil {
				t.Fatal(err)
			}
			judged := ds
			nothing := kinds.WritesNothing(ctrl, &judged, snap, apply.DynamicApply)

			got := outcome(a.applyParent(context.Background(), &ds, snap))
			wrote := calls(dyn)
			if nothing && (got != resultNoop || len(wrote) > 0) {
				t.Errorf("kinds.WritesNothing says nothing is written, but the apply ended %s with %v", got, wrote)
			}
			if !nothing && got == resultNoop && len(wrote) == 0 && ds.Hook == bus.HookSync {
				t.Errorf("the apply wrote nothing, but kinds.WritesNothing did not say so (the dispatcher would publish it)")
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("outcome (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tt.wantCalls, wrote); diff != "" {
				t.Errorf("API calls (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(before, tt.parent); diff != "" {
				t.Errorf("the snapshot's parent was modified (-before +after):\n%s", diff)
			}
			if tt.wantFinalizers != nil {
				live, err := dyn.Resource(schema.GroupVersionResource{Group: "example.com", Version: "v1", Resource: "things"}).Namespace("ns").Get(context.Background(), "web", metav1.GetOptions{})
				if err != nil {
					t.Fatal(err)
				}
				got := live.GetFinalizers()
				if got == nil {
					got = []string{}
				}
				if diff := cmp.Diff(tt.wantFinalizers, got); diff != "" {
					t.Errorf("parent finalizers (-want +got):\n%s", diff)
				}
			}
		})
	}
}

// A parent write is remembered (read your writes: the next snapshot must
// be at least that fresh), and announced to the write log with the
// resourceVersion it was made against.
func TestParentWriteIsNoted(t *testing.T) {
	parent := thing()
	a, dyn := testApplier(t, parent.DeepCopy())
	dyn.PrependReactor("update", "things", func(act k8stesting.Action) (bool, runtime.Object, error) {
		out := act.(k8stesting.UpdateAction).GetObject().(*unstructured.Unstructured).DeepCopy()
		out.SetResourceVersion("42")
		return true, out, nil
	})
	ds := &bus.DesiredState{
		Controller: bus.ControllerRef{Kind: "CompositeController", Name: "things"},
		Parent:     bus.ObjectRef{APIVersion: "example.com/v1", Kind: "Thing", Resource: "things", Namespace: "ns", Name: "web", UID: "p-uid"},
	}
	wl := &writeLog{}
	out, err := a.writeParent(withWriteLog(context.Background(), wl), ds, parent, parentWrite{verb: verbUpdateStatus, status: map[string]any{"ready": float64(2)}})
	if err != nil {
		t.Fatal(err)
	}
	if out.GetResourceVersion() != "42" {
		t.Errorf("returned object at %q, want the written one (42)", out.GetResourceVersion())
	}
	if diff := cmp.Diff([]bus.Write{{UID: "p-uid", From: "41", To: "42"}}, wl.writes); diff != "" {
		t.Errorf("write log (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(map[string]string{"example.com/things": "42"}, a.freshness(ds)); diff != "" {
		t.Errorf("freshness floor (-want +got):\n%s", diff)
	}
}

func TestPatchWriteVerb(t *testing.T) {
	patch := func(meta map[string]any, status bool) map[string]any {
		p := map[string]any{"metadata": meta}
		if status {
			p["status"] = map[string]any{"a": 1}
		}
		return p
	}
	tests := []struct {
		reason string
		plan   kinds.ApplyParentPlan
		want   string
	}{
		{reason: "only the finalizer",
			plan: kinds.ApplyParentPlan{AddsFinalizer: "f", Patch: patch(map[string]any{"finalizers": []string{"f"}, "resourceVersion": "1"}, false)},
			want: verbAddFinalizer},
		{reason: "the finalizer with labels",
			plan: kinds.ApplyParentPlan{AddsFinalizer: "f", Patch: patch(map[string]any{"finalizers": []string{"f"}, "labels": map[string]any{"a": "b"}}, false)},
			want: verbPatchParent},
		{reason: "the finalizer with a status (no subresource)",
			plan: kinds.ApplyParentPlan{AddsFinalizer: "f", Patch: patch(map[string]any{"finalizers": []string{"f"}}, true)},
			want: verbPatchParent},
		{reason: "labels only",
			plan: kinds.ApplyParentPlan{Patch: patch(map[string]any{"labels": map[string]any{"a": "b"}}, false)},
			want: verbPatchParent},
	}
	for _, tt := range tests {
		t.Run(tt.reason, func(t *testing.T) {
			if got := patchWrite(tt.plan).verb; got != tt.want {
				t.Errorf("verb %q, want %q", got, tt.want)
			}
		})
	}
}

// revisions is a revstore.Store that answers loads with no revision and
// records the requests.
type revisions struct {
	ops    []string
	result string
	err    error
}

func (r *revisions) Revisions(_ context.Context, req revstore.Request) (*revstore.Response, error) {
	r.ops = append(r.ops, req.Op)
	if r.err != nil {
		return nil, r.err
	}
	return &revstore.Response{Result: r.result}, nil
}

// The rolling path ends through the same typed outcomes: a desired state
// rendered for another revision syncs again at once (a few times, then
// with backoff), and a revisions service that fails retries without an
// Event; no child is touched either way.
func TestApplyRollingOutcomes(t *testing.T) {
	rollingCC := compositeController(false)
	// Another object than compositeController's: kindtable.Decode caches
	// decoded controllers by UID and resourceVersion.
	rollingCC.SetUID("cc-uid-rolling")
	rollingCC.Object["spec"].(map[string]any)["childResources"] = []any{map[string]any{
		"apiVersion": "v1", "resource": "configmaps", "updateStrategy": map[string]any{"method": "RollingRecreate"},
	}}
	tests := []struct {
		reason  string
		attempt int
		store   *revisions
		want    string
		wantOps []string
	}{
		{reason: "rendered for another revision: sync again now, counting the attempt",
			store: &revisions{result: revstore.OK}, want: "conflict (attempt 1)", wantOps: []string{revstore.OpLoad}},
		{reason: "still another revision after a few tries: back off",
			attempt: 3, store: &revisions{result: revstore.OK}, want: "error ", wantOps: []string{revstore.OpLoad}},
		{reason: "the revisions service failed: retry without an Event",
			store: &revisions{err: errors.New("no responders")}, want: "error ", wantOps: []string{revstore.OpLoad}},
		{reason: "the revisions service refused the load: retry without an Event",
			store: &revisions{result: "error"}, want: "error ", wantOps: []string{revstore.OpLoad}},
	}
	for _, tt := range tests {
		t.Run(tt.reason, func(t *testing.T) {
			parent := thing()
			a, dyn := testApplier(t, parent.DeepCopy(), configMap("a", true))
			a.revs = tt.store
			ds := &bus.DesiredState{
				Hook: "sync", Attempt: tt.attempt, LatestRevision: "web-0123456789",
				Children:   []*unstructured.Unstructured{desiredCM("a")},
				Controller: bus.ControllerRef{Kind: "CompositeController", Name: "things", UID: "cc-rolling"},
				Parent:     bus.ObjectRef{APIVersion: "example.com/v1", Kind: "Thing", Resource: "things", Namespace: "ns", Name: "web", UID: "p-uid", Generation: 2},
			}
			snap := &snapshot.Response{Result: snapshot.OK, Controller: rollingCC, Parent: parent, ParentResource: "things", ParentHasStatus: true,
				Children: []snapshot.Group{{APIVersion: "v1", Resource: "configmaps", Kind: "ConfigMap", Namespaced: true,
					Objects: []*unstructured.Unstructured{configMap("a", true)}}}}
			if diff := cmp.Diff(tt.want, outcome(a.applyParent(context.Background(), ds, snap))); diff != "" {
				t.Errorf("outcome (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tt.wantOps, tt.store.ops); diff != "" {
				t.Errorf("revisions requests (-want +got):\n%s", diff)
			}
			if got := calls(dyn); len(got) != 0 {
				t.Errorf("API calls %v, want none", got)
			}
		})
	}
}
