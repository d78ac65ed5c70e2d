package decorator

import (
	"encoding/json"
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

// syncController is a decoded DecoratorController named "dc" decorating
// pods labelled decorate=yes.
func syncController(hooks *v1alpha1.DecoratorControllerHooks) *Controller {
	dc := &v1alpha1.DecoratorController{Spec: v1alpha1.DecoratorControllerSpec{
		Resources: []v1alpha1.DecoratorControllerResourceRule{{
			ResourceRule:  v1alpha1.ResourceRule{APIVersion: "v1", Resource: "pods"},
			LabelSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"decorate": "yes"}},
		}},
		Hooks: hooks,
	}}
	dc.Name = "dc"
	obj := &unstructured.Unstructured{}
	obj.SetName("dc")
	return &Controller{DC: dc, obj: obj}
}

// pod is a target; selected gives it the label the controller selects.
func pod(selected, deleting bool, finalizers ...string) *unstructured.Unstructured {
	lbls := map[string]string{"decorate": "no"}
	if selected {
		lbls["decorate"] = "yes"
	}
	u := object("v1", "Pod", "ns", "p", lbls, nil)
	u.SetFinalizers(finalizers)
	if deleting {
		now := metav1.Now()
		u.SetDeletionTimestamp(&now)
	}
	return u
}

func errText(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

func TestSyncGate(t *testing.T) {
	withFinalize := &v1alpha1.DecoratorControllerHooks{Sync: syncHook("http://h/sync"), Finalize: syncHook("http://h/fin")}
	syncOnly := &v1alpha1.DecoratorControllerHooks{Sync: syncHook("http://h/sync")}
	for _, tc := range []struct {
		reason string
		hooks  *v1alpha1.DecoratorControllerHooks
		snap   *snapshot.Response
		want   kinds.Gate
	}{
		{reason: "a plain target goes on", hooks: syncOnly, snap: &snapshot.Response{Parent: pod(true, false)}},
		{reason: "the finalizer of a removed finalize hook is released", hooks: syncOnly,
			snap: &snapshot.Response{Parent: pod(true, false, Finalizer("dc"))}, want: kinds.Gate{Release: Finalizer("dc")}},
		{reason: "the finalizer of a present finalize hook is kept", hooks: withFinalize,
			snap: &snapshot.Response{Parent: pod(true, false, Finalizer("dc"))}},
		{reason: "a target whose dependents the collector is deleting waits", hooks: withFinalize,
			snap: &snapshot.Response{Parent: pod(true, true, metav1.FinalizerOrphanDependents)}, want: kinds.Gate{Skip: true}},
		{reason: "targets have no selector error to report", hooks: syncOnly,
			snap: &snapshot.Response{Parent: pod(true, false), SelectorError: "ignored"}},
	} {
		t.Run(tc.reason, func(t *testing.T) {
			g, err := syncController(tc.hooks).SyncGate(tc.snap)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, g); diff != "" {
				t.Errorf("SyncGate (-want +got):\n%s", diff)
			}
		})
	}
}

func TestSyncHook(t *testing.T) {
	sync, fin := syncHook("http://h/sync"), syncHook("http://h/fin")
	both := &v1alpha1.DecoratorControllerHooks{Sync: sync, Finalize: fin}
	type result struct {
		Kind       string
		Finalizing bool
		Hook       *v1alpha1.Hook
		Err        string
	}
	for _, tc := range []struct {
		reason   string
		hooks    *v1alpha1.DecoratorControllerHooks
		target   *unstructured.Unstructured
		resource string
		want     result
	}{
		{reason: "a selected target gets sync", hooks: both, target: pod(true, false), resource: "pods",
			want: result{Kind: HookSync, Hook: sync}},
		{reason: "an opted-out target holding the finalizer gets finalize", hooks: both, target: pod(false, false, Finalizer("dc")), resource: "pods",
			want: result{Kind: HookFinalize, Finalizing: true, Hook: fin}},
		{reason: "a deleted target holding the finalizer gets finalize", hooks: both, target: pod(true, true, Finalizer("dc")), resource: "pods",
			want: result{Kind: HookFinalize, Finalizing: true, Hook: fin}},
		{reason: "an opted-out target without the finalizer: nothing to call", hooks: both, target: pod(false, false), resource: "pods"},
		{reason: "a target of another resource is not selected", hooks: both, target: pod(true, false), resource: "services"},
		{reason: "a selected target without a sync hook fails", hooks: &v1alpha1.DecoratorControllerHooks{Finalize: fin}, target: pod(true, false), resource: "pods",
			want: result{Err: "DecoratorController dc has no sync hook"}},
	} {
		t.Run(tc.reason, func(t *testing.T) {
			choice, err := syncController(tc.hooks).SyncHook(&snapshot.Response{Parent: tc.target}, tc.resource)
			got := result{Kind: choice.Kind, Finalizing: choice.Finalizing, Hook: choice.Hook, Err: errText(err)}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("SyncHook (-want +got):\n%s", diff)
			}
		})
	}
}

func TestSyncHookBrokenSelector(t *testing.T) {
	c := syncController(&v1alpha1.DecoratorControllerHooks{Sync: syncHook("http://h")})
	c.DC.Spec.Resources[0].LabelSelector = &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "a", Operator: "Bogus"}}}
	if _, err := c.SyncHook(&snapshot.Response{Parent: pod(true, false)}, "pods"); err == nil {
		t.Error("a selector that does not parse chose a hook")
	}
}

func TestSyncCalls(t *testing.T) {
	ctrlObj := &unstructured.Unstructured{Object: map[string]any{"kind": "DecoratorController"}}
	att := object("v1", "Service", "ns", "svc", nil, nil)
	snap := &snapshot.Response{Controller: ctrlObj, Parent: object("v1", "Pod", "ns", "p", nil, nil),
		Children: []snapshot.Group{{APIVersion: "v1", Kind: "Service", Namespaced: true, Objects: []*unstructured.Unstructured{att}}}}
	calls, err := syncController(nil).SyncCalls(kinds.SyncInput{Snapshot: snap, Hook: kinds.HookChoice{Hook: syncHook("http://h"), Kind: HookFinalize, Finalizing: true}})
	if err != nil {
		t.Fatal(err)
	}
	if len(calls) != 1 {
		t.Fatalf("%d calls, want 1", len(calls))
	}
	if _, ok := calls[0].Response.(*hookapi.DecoratorSyncResponse); !ok {
		t.Errorf("the answer decodes into a %T", calls[0].Response)
	}
	data, err := json.Marshal(calls[0].Request)
	if err != nil {
		t.Fatal(err)
	}
	want := `{"controller":{"kind":"DecoratorController"},"object":{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p","namespace":"ns","resourceVersion":"7","uid":"uid-p"}},` +
		`"attachments":{"Service.v1":{"svc":{"apiVersion":"v1","kind":"Service","metadata":{"name":"svc","namespace":"ns","resourceVersion":"7","uid":"uid-svc"}}}},"related":{},"finalizing":true}`
	if diff := cmp.Diff(want, string(data)); diff != "" {
		t.Errorf("request (-want +got):\n%s", diff)
	}
}

func TestSyncDesired(t *testing.T) {
	svc := object("v1", "Service", "ns", "svc", nil, nil)
	type result struct {
		Desired bus.DesiredState
		Err     bool
	}
	for _, tc := range []struct {
		reason string
		calls  []kinds.HookCall
		want   result
	}{
		{reason: "attachments, labels, annotations and a status to set",
			calls: []kinds.HookCall{{Response: &hookapi.DecoratorSyncResponse{
				Attachments: hookapi.AttachmentList{svc}, Labels: map[string]*string{"a": str("1"), "gone": nil},
				Annotations: map[string]*string{"b": str("2")}, Status: map[string]any{}, ResyncAfterSeconds: 1, Finalized: true}}},
			want: result{Desired: bus.DesiredState{Children: []*unstructured.Unstructured{svc}, Labels: map[string]*string{"a": str("1"), "gone": nil},
				Annotations: map[string]*string{"b": str("2")}, Status: map[string]any{}, StatusSet: true, ResyncAfterSeconds: 1, Finalized: true}}},
		{reason: "a null status leaves the target's alone",
			calls: []kinds.HookCall{{Response: &hookapi.DecoratorSyncResponse{}}}, want: result{}},
		{reason: "two answers for one target are an error", calls: []kinds.HookCall{{}, {}}, want: result{Err: true}},
		{reason: "a foreign answer is an error", calls: []kinds.HookCall{{Response: &hookapi.CompositeSyncResponse{}}}, want: result{Err: true}},
	} {
		t.Run(tc.reason, func(t *testing.T) {
			ds, err := syncController(nil).SyncDesired(tc.calls)
			got := result{Desired: ds, Err: err != nil}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("SyncDesired (-want +got):\n%s", diff)
			}
		})
	}
}

// TestSyncNoRevisions: targets keep no revisions, so a sync may be an echo
// once the controller opts in.
func TestSyncNoRevisions(t *testing.T) {
	c := syncController(nil)
	if revs, err := c.SyncRevisions(pod(true, false)); revs != nil || err != nil {
		t.Errorf("SyncRevisions = %v, %v; want none", revs, err)
	}
	if _, err := c.SyncAsOf(kinds.HookCall{}, pod(true, false)); err == nil {
		t.Error("SyncAsOf re-targeted a decorator's request")
	}
	if c.SyncEchoable() {
		t.Error("a decorator's sync is echo-checked without the opt-in annotation")
	}
	c.obj.SetAnnotations(map[string]string{bus.SuppressEchoesAnnotation: "true"})
	if !c.SyncEchoable() {
		t.Error("a decorator that opted into echo suppression is never echo-checked")
	}
	if c.SyncCustomizeHook() != nil {
		t.Error("a controller without hooks has a customize hook")
	}
}
