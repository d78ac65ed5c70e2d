package composite

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/metabus/metabus/pkg/api/v1alpha1"
	"github.com/metabus/metabus/pkg/bus"
	"github.com/metabus/metabus/pkg/hookapi"
	"github.com/metabus/metabus/pkg/kinds"
	"github.com/metabus/metabus/pkg/snapshot"
)

func syncHook(url string) *v1alpha1.Hook {
	return &v1alpha1.Hook{Webhook: &v1alpha1.Webhook{URL: &url}}
}

// syncController is a decoded CompositeController named "cc" with the
// given hooks and child update method ("" for none).
func syncController(hooks *v1alpha1.CompositeControllerHooks, method v1alpha1.ChildUpdateMethod) *Controller {
	cc := &v1alpha1.CompositeController{Spec: v1alpha1.CompositeControllerSpec{Hooks: hooks}}
	cc.Name = "cc"
	child := v1alpha1.CompositeControllerChildResourceRule{ResourceRule: v1alpha1.ResourceRule{APIVersion: "v1", Resource: "configmaps"}}
	if method != "" {
		child.UpdateStrategy = &v1alpha1.CompositeControllerChildUpdateStrategy{Method: method}
	}
	cc.Spec.ChildResources = []v1alpha1.CompositeControllerChildResourceRule{child}
	obj := &unstructured.Unstructured{}
	obj.SetName("cc")
	return &Controller{CC: cc, obj: obj}
}

func deleting(u *unstructured.Unstructured, finalizers ...string) *unstructured.Unstructured {
	now := metav1.Now()
	u.SetDeletionTimestamp(&now)
	u.SetFinalizers(finalizers)
	return u
}

func TestSyncGate(t *testing.T) {
	withFinalize := &v1alpha1.CompositeControllerHooks{Sync: syncHook("http://h/sync"), Finalize: syncHook("http://h/fin")}
	syncOnly := &v1alpha1.CompositeControllerHooks{Sync: syncHook("http://h/sync")}
	type result struct {
		Gate kinds.Gate
		Err  string
	}
	for _, tc := range []struct {
		reason string
		hooks  *v1alpha1.CompositeControllerHooks
		snap   *snapshot.Response
		want   result
	}{
		{reason: "a plain parent goes on", hooks: syncOnly, snap: &snapshot.Response{Parent: parent("ns", "p", "u", nil, nil)}},
		{reason: "the finalizer of a removed finalize hook is released",
			hooks: syncOnly,
			snap:  &snapshot.Response{Parent: withFinalizers(false, Finalizer("cc"))},
			want:  result{Gate: kinds.Gate{Release: Finalizer("cc")}}},
		{reason: "the finalizer of a present finalize hook is kept",
			hooks: withFinalize,
			snap:  &snapshot.Response{Parent: withFinalizers(false, Finalizer("cc"))}},
		{reason: "a parent whose dependents the collector is deleting waits",
			hooks: withFinalize,
			snap:  &snapshot.Response{Parent: deleting(parent("ns", "p", "u", nil, nil), metav1.FinalizerDeleteDependents)},
			want:  result{Gate: kinds.Gate{Skip: true}}},
		{reason: "a stale finalizer is released even while the collector works",
			hooks: syncOnly,
			snap:  &snapshot.Response{Parent: deleting(parent("ns", "p", "u", nil, nil), metav1.FinalizerDeleteDependents, Finalizer("cc"))},
			want:  result{Gate: kinds.Gate{Release: Finalizer("cc")}}},
		{reason: "a selector error fails the sync: the hook would be shown no children",
			hooks: syncOnly,
			snap:  &snapshot.Response{Parent: parent("ns", "p", "u", nil, nil), SelectorError: "no spec.selector"},
			want:  result{Err: "cannot sync: no spec.selector"}},
	} {
		t.Run(tc.reason, func(t *testing.T) {
			g, err := syncController(tc.hooks, "").SyncGate(tc.snap)
			got := result{Gate: g, Err: errText(err)}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("SyncGate (-want +got):\n%s", diff)
			}
		})
	}
}

func errText(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

func TestSyncHook(t *testing.T) {
	sync, fin := syncHook("http://h/sync"), syncHook("http://h/fin")
	type result struct {
		Kind       string
		Finalizing bool
		Hook       *v1alpha1.Hook
		Err        string
	}
	deselecting := &v1alpha1.CompositeControllerHooks{Sync: sync, Finalize: fin}
	for _, tc := range []struct {
		reason   string
		hooks    *v1alpha1.CompositeControllerHooks
		selector *metav1.LabelSelector
		parent   *unstructured.Unstructured
		want     result
	}{
		{reason: "a live parent gets sync", hooks: &v1alpha1.CompositeControllerHooks{Sync: sync},
			parent: parent("ns", "p", "u", nil, nil), want: result{Kind: "sync", Hook: sync}},
		{reason: "a deleted parent gets finalize", hooks: deselecting,
			parent: deleting(parent("ns", "p", "u", nil, nil)), want: result{Kind: "finalize", Finalizing: true, Hook: fin}},
		{reason: "a deselected parent gets finalize", hooks: deselecting,
			selector: &metav1.LabelSelector{MatchLabels: map[string]string{"on": "yes"}},
			parent:   parent("ns", "p", "u", map[string]string{"on": "no"}, nil), want: result{Kind: "finalize", Finalizing: true, Hook: fin}},
		{reason: "a deleted parent without a finalize hook: nothing to call",
			hooks: &v1alpha1.CompositeControllerHooks{Sync: sync}, parent: deleting(parent("ns", "p", "u", nil, nil))},
		{reason: "a live parent without a sync hook fails", hooks: &v1alpha1.CompositeControllerHooks{},
			parent: parent("ns", "p", "u", nil, nil), want: result{Err: "CompositeController cc has no sync hook"}},
	} {
		t.Run(tc.reason, func(t *testing.T) {
			c := syncController(tc.hooks, "")
			c.CC.Spec.ParentResource.LabelSelector = tc.selector
			choice, err := c.SyncHook(&snapshot.Response{Parent: tc.parent}, "things")
			got := result{Kind: choice.Kind, Finalizing: choice.Finalizing, Hook: choice.Hook, Err: errText(err)}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("SyncHook (-want +got):\n%s", diff)
			}
		})
	}
}

// TestSyncCalls: the request carries the controller object as read, the
// parent, every child group (even empty) keyed as the hook version wants,
// and the related objects; the answer is decoded into a fresh response.
func TestSyncCalls(t *testing.T) {
	v2 := v1alpha1.HookVersionV2
	object := func(kind, ns, name string) *unstructured.Unstructured {
		u := &unstructured.Unstructured{}
		u.SetAPIVersion("v1")
		u.SetKind(kind)
		u.SetNamespace(ns)
		u.SetName(name)
		return u
	}
	ctrlObj := &unstructured.Unstructured{Object: map[string]any{"kind": "CompositeController"}}
	snap := func(p *unstructured.Unstructured) *snapshot.Response {
		return &snapshot.Response{
			Controller: ctrlObj, Parent: p,
			Children: []snapshot.Group{
				{APIVersion: "v1", Kind: "ConfigMap", Namespaced: true, Objects: []*unstructured.Unstructured{object("ConfigMap", "ns", "a")}},
				{APIVersion: "apps/v1", Kind: "Deployment", Namespaced: true},
			},
			Related: []snapshot.Group{{APIVersion: "v1", Kind: "Secret", Namespaced: true, Objects: []*unstructured.Unstructured{object("Secret", "other", "s")}}},
		}
	}
	type result struct {
		Request string
		Err     bool
	}
	for _, tc := range []struct {
		reason string
		hook   *v1alpha1.Hook
		snap   *snapshot.Response
		final  bool
		want   result
	}{
		{reason: "v1 keys objects of a namespaced parent by name",
			hook: syncHook("http://h"), snap: snap(parent("ns", "p", "u", nil, nil)),
			want: result{Request: `{"controller":{"kind":"CompositeController"},"parent":{"apiVersion":"example.com/v1","kind":"Thing","metadata":{"name":"p","namespace":"ns","uid":"u"}},` +
				`"children":{"ConfigMap.v1":{"a":{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"a","namespace":"ns"}}},"Deployment.apps/v1":{}},` +
				`"related":{"Secret.v1":{"s":{"apiVersion":"v1","kind":"Secret","metadata":{"name":"s","namespace":"other"}}}},"finalizing":false}`}},
		{reason: "v2 keys every object by namespace/name; finalize says so",
			hook: &v1alpha1.Hook{Version: &v2}, snap: snap(parent("ns", "p", "u", nil, nil)), final: true,
			want: result{Request: `{"controller":{"kind":"CompositeController"},"parent":{"apiVersion":"example.com/v1","kind":"Thing","metadata":{"name":"p","namespace":"ns","uid":"u"}},` +
				`"children":{"ConfigMap.v1":{"ns/a":{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"a","namespace":"ns"}}},"Deployment.apps/v1":{}},` +
				`"related":{"Secret.v1":{"other/s":{"apiVersion":"v1","kind":"Secret","metadata":{"name":"s","namespace":"other"}}}},"finalizing":true}`}},
		{reason: "objects the hook could not tell apart fail the request",
			hook: syncHook("http://h"),
			snap: &snapshot.Response{Controller: ctrlObj, Parent: parent("ns", "p", "u", nil, nil), Children: []snapshot.Group{
				{APIVersion: "v1", Kind: "ConfigMap", Namespaced: true, Objects: []*unstructured.Unstructured{object("ConfigMap", "ns", "a"), object("ConfigMap", "ns2", "a")}}}},
			want: result{Err: true}},
	} {
		t.Run(tc.reason, func(t *testing.T) {
			calls, err := syncController(nil, "").SyncCalls(kinds.SyncInput{Snapshot: tc.snap, Hook: kinds.HookChoice{Hook: tc.hook, Kind: "sync", Finalizing: tc.final}})
			var got result
			if got.Err = err != nil; err == nil {
				if len(calls) != 1 {
					t.Fatalf("%d calls, want 1", len(calls))
				}
				if _, ok := calls[0].Response.(*hookapi.CompositeSyncResponse); !ok {
					t.Errorf("the answer decodes into a %T", calls[0].Response)
				}
				data, err := json.Marshal(calls[0].Request)
				if err != nil {
					t.Fatal(err)
				}
				got.Request = string(data)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("SyncCalls (-want +got):\n%s", diff)
			}
		})
	}
}

// TestSyncEchoable: upstream's contract (every change reaches the hook) is
// the default; only the opt-in annotation lets a sync be skipped as an
// echo, and never for a controller with rolling children.
func TestSyncEchoable(t *testing.T) {
	for _, tc := range []struct {
		reason     string
		method     v1alpha1.ChildUpdateMethod
		annotation string // "" leaves it out
		want       bool
	}{
		{reason: "no annotation: every change calls the hook, as upstream", method: v1alpha1.ChildUpdateInPlace},
		{reason: "opted in: own writes may be skipped", method: v1alpha1.ChildUpdateInPlace, annotation: "true", want: true},
		{reason: "opted out explicitly", method: v1alpha1.ChildUpdateInPlace, annotation: "false"},
		{reason: "an invalid value is the contract's default", method: v1alpha1.ChildUpdateInPlace, annotation: "yes please"},
		{reason: "rolling children veto the opt-in (revisions are inputs too)", method: v1alpha1.ChildUpdateRollingRecreate, annotation: "true"},
	} {
		t.Run(tc.reason, func(t *testing.T) {
			c := syncController(nil, tc.method)
			if tc.annotation != "" {
				c.obj.SetAnnotations(map[string]string{bus.SuppressEchoesAnnotation: tc.annotation})
			}
			if diff := cmp.Diff(tc.want, c.SyncEchoable()); diff != "" {
				t.Errorf("SyncEchoable (-want +got):\n%s", diff)
			}
		})
	}
}

func TestSyncRevisions(t *testing.T) {
	type result struct {
		Revisions *kinds.Revisions
		Err       string
	}
	for _, tc := range []struct {
		reason string
		method v1alpha1.ChildUpdateMethod
		paths  []string
		parent *unstructured.Unstructured
		want   result
	}{
		{reason: "no rolling child: one call", method: v1alpha1.ChildUpdateInPlace,
			parent: parent("ns", "p", "u", nil, map[string]any{"x": "1"}), want: result{}},
		{reason: "a rolling child: the parent keeps revisions of spec by default", method: v1alpha1.ChildUpdateRollingRecreate,
			parent: parent("ns", "p", "u", nil, map[string]any{"x": "1"}),
			want:   result{Revisions: &kinds.Revisions{Patch: map[string]any{"spec": map[string]any{"x": "1"}}}}},
		{reason: "revisionHistory.fieldPaths choose the fields", method: v1alpha1.ChildUpdateRollingInPlace, paths: []string{"spec.x"},
			parent: parent("ns", "p", "u", nil, map[string]any{"x": "1", "y": "2"}),
			want:   result{Revisions: &kinds.Revisions{FieldPaths: []string{"spec.x"}, Patch: map[string]any{"spec": map[string]any{"x": "1"}}}}},
		{reason: "a cluster-scoped parent has nowhere to keep revisions", method: v1alpha1.ChildUpdateRollingInPlace,
			parent: parent("", "p", "u", nil, map[string]any{"x": "1"}),
			want:   result{Err: "CompositeController cc: RollingRecreate and RollingInPlace need a namespaced parent resource (ControllerRevisions are namespaced); use Recreate or InPlace"}},
		{reason: "a bad field path fails", method: v1alpha1.ChildUpdateRollingInPlace, paths: []string{""},
			parent: parent("ns", "p", "u", nil, map[string]any{"x": "1"}),
			want:   result{Err: "revisionHistory.fieldPaths: "}},
	} {
		t.Run(tc.reason, func(t *testing.T) {
			c := syncController(nil, tc.method)
			if tc.paths != nil {
				c.CC.Spec.ParentResource.RevisionHistory = &v1alpha1.CompositeControllerRevisionHistory{FieldPaths: tc.paths}
			}
			revs, err := c.SyncRevisions(tc.parent)
			got := result{Revisions: revs, Err: errText(err)}
			if strings.HasPrefix(got.Err, "revisionHistory.fieldPaths: ") {
				got.Err = "revisionHistory.fieldPaths: "
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("SyncRevisions (-want +got):\n%s", diff)
			}
		})
	}
}

// TestSyncAsOf: an older revision's call shows the same children and
// related objects with the parent as of that revision, and decodes into
// its own answer.
func TestSyncAsOf(t *testing.T) {
	c := syncController(nil, v1alpha1.ChildUpdateRollingRecreate)
	children := hookapi.ObjectMap{"ConfigMap.v1": {}}
	latest := kinds.HookCall{
		Request:  hookapi.CompositeSyncRequest{Parent: parent("ns", "p", "u", nil, map[string]any{"x": "new"}), Children: children},
		Response: &hookapi.CompositeSyncResponse{},
	}
	old := parent("ns", "p", "u", nil, map[string]any{"x": "old"})
	got, err := c.SyncAsOf(latest, old)
	if err != nil {
		t.Fatal(err)
	}
	req := got.Request.(hookapi.CompositeSyncRequest)
	if req.Parent != old || req.Children == nil || latest.Request.(hookapi.CompositeSyncRequest).Parent == old {
		t.Errorf("as-of request %+v: want the old parent with the same children, and the latest call unchanged", req)
	}
	if got.Response == latest.Response {
		t.Error("the older revision's answer would overwrite the latest's")
	}
	if _, err := c.SyncAsOf(kinds.HookCall{Request: "not a request"}, old); err == nil {
		t.Error("a foreign request was re-targeted")
	}
}

func TestSyncDesired(t *testing.T) {
	cm := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "v1", "kind": "ConfigMap", "metadata": map[string]any{"name": "a"}}}
	type result struct {
		Desired bus.DesiredState
		Err     bool
	}
	for _, tc := range []struct {
		reason string
		calls  []kinds.HookCall
		want   result
	}{
		{reason: "the answer's children, status, resync and finalized",
			calls: []kinds.HookCall{{Response: &hookapi.CompositeSyncResponse{
				Children: hookapi.ChildList{cm}, Status: map[string]any{"ok": true}, ResyncAfterSeconds: 2, Finalized: true}}},
			want: result{Desired: bus.DesiredState{Children: []*unstructured.Unstructured{cm}, Status: map[string]any{"ok": true}, ResyncAfterSeconds: 2, Finalized: true}}},
		{reason: "no status is no status (StatusSet is a decorator's)",
			calls: []kinds.HookCall{{Response: &hookapi.CompositeSyncResponse{}}},
			want:  result{Desired: bus.DesiredState{}}},
		{reason: "two answers for one parent are an error", calls: []kinds.HookCall{{}, {}}, want: result{Err: true}},
		{reason: "a foreign answer is an error", calls: []kinds.HookCall{{Response: &hookapi.DecoratorSyncResponse{}}}, want: result{Err: true}},
	} {
		t.Run(tc.reason, func(t *testing.T) {
			ds, err := syncController(nil, "").SyncDesired(tc.calls)
			got := result{Desired: ds, Err: err != nil}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("SyncDesired (-want +got):\n%s", diff)
			}
		})
	}
}

func TestSyncCustomizeAndEndpoints(t *testing.T) {
	customize := syncHook("http://h/customize")
	c := syncController(&v1alpha1.CompositeControllerHooks{Customize: customize}, "")
	c.CC.Spec.EndpointConfigs = []v1alpha1.EndpointConfig{{Host: "h"}}
	if c.SyncCustomizeHook() != customize {
		t.Error("the customize hook is not the controller's")
	}
	if diff := cmp.Diff(c.CC.Spec.EndpointConfigs, c.SyncEndpoints()); diff != "" {
		t.Errorf("endpoints (-want +got):\n%s", diff)
	}
	if syncController(nil, "").SyncCustomizeHook() != nil {
		t.Error("a controller without hooks has a customize hook")
	}
}
