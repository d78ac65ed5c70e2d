package decorator_test

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/metabus/metabus/pkg/api/v1alpha1"
	"github.com/metabus/metabus/pkg/bus"
	"github.com/metabus/metabus/pkg/decorator"
	"github.com/metabus/metabus/pkg/kinds"
)

// applyController decodes a DecoratorController of pods labelled
// decorate=yes, with a finalize hook if asked.
func applyController(t *testing.T, finalize bool) kinds.Controller {
	t.Helper()
	hooks := map[string]any{"sync": map[string]any{"webhook": map[string]any{"url": "http://hook/sync"}}}
	if finalize {
		hooks["finalize"] = map[string]any{"webhook": map[string]any{"url": "http://hook/finalize"}}
	}
	obj := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "metacontroller.k8s.io/v1alpha1", "kind": "DecoratorController",
		"metadata": map[string]any{"name": "deco", "uid": "dc-uid", "resourceVersion": "1"},
		"spec": map[string]any{
			"resources": []any{map[string]any{"apiVersion": "v1", "resource": "pods",
				"labelSelector": map[string]any{"matchLabels": map[string]any{"decorate": "yes"}}}},
			"attachments": []any{
				map[string]any{"apiVersion": "v1", "resource": "configmaps", "updateStrategy": map[string]any{"method": "InPlace"}},
				map[string]any{"apiVersion": "v1", "resource": "services"},
			},
			"hooks": hooks,
		},
	}}
	c, err := decorator.New(obj)
	if err != nil {
		t.Fatalf("decode: %v", err)
	}
	return c
}

// applyTarget is a selected pod; mutate adjusts it.
func applyTarget(mutate func(p *unstructured.Unstructured)) *unstructured.Unstructured {
	p := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "v1", "kind": "Pod",
		"metadata": map[string]any{"name": "p", "namespace": "ns", "uid": "p-uid", "resourceVersion": "9",
			"labels": map[string]any{"decorate": "yes", "team": "a"}},
		"status": map[string]any{"phase": "Running"},
	}}
	if mutate != nil {
		mutate(p)
	}
	return p
}

func applyStr(s string) *string { return &s }

func TestApplyParent(t *testing.T) {
	const fin = "metacontroller.io/decoratorcontroller-deco"
	deleting := func(p *unstructured.Unstructured) {
		now := metav1.Now()
		p.SetDeletionTimestamp(&now)
	}
	holding := func(p *unstructured.Unstructured) { p.SetFinalizers([]string{fin}) }
	tests := []struct {
		reason    string
		finalize  bool
		target    *unstructured.Unstructured
		hasStatus bool
		ds        bus.DesiredState
		want      kinds.ApplyParentPlan
	}{
		{
			reason: "labels already as asked, status left alone: nothing to write",
			target: applyTarget(nil),
			ds:     bus.DesiredState{Hook: "sync", Labels: map[string]*string{"team": applyStr("a"), "gone": nil}},
			want:   kinds.ApplyParentPlan{},
		},
		{
			reason: "changed labels and annotations: one patch with the observed resourceVersion",
			target: applyTarget(nil),
			ds: bus.DesiredState{Hook: "sync", Labels: map[string]*string{"team": applyStr("b"), "decorate": applyStr("yes")},
				Annotations: map[string]*string{"note": applyStr("x")}},
			want: kinds.ApplyParentPlan{Patch: map[string]any{"metadata": map[string]any{
				"labels": map[string]any{"team": "b"}, "annotations": map[string]any{"note": "x"}, "resourceVersion": "9",
			}}},
		},
		{
			reason:    "status set and different, with a status subresource: written through /status",
			target:    applyTarget(nil),
			hasStatus: true,
			ds:        bus.DesiredState{Hook: "sync", Status: map[string]any{"phase": "Done"}, StatusSet: true},
			want:      kinds.ApplyParentPlan{Status: map[string]any{"phase": "Done"}},
		},
		{
			reason: "status set and different, no status subresource: a merge diff in the patch",
			target: applyTarget(nil),
			ds:     bus.DesiredState{Hook: "sync", Status: map[string]any{"phase": "Done"}, StatusSet: true},
			want: kinds.ApplyParentPlan{Patch: map[string]any{
				"metadata": map[string]any{"resourceVersion": "9"}, "status": map[string]any{"phase": "Done"},
			}},
		},
		{
			reason:    "status not set by the hook: left alone",
			target:    applyTarget(nil),
			hasStatus: true,
			ds:        bus.DesiredState{Hook: "sync", Status: map[string]any{"phase": "Done"}},
			want:      kinds.ApplyParentPlan{},
		},
		{
			reason:   "first sync with a finalize hook: the finalizer joins the patch",
			finalize: true,
			target:   applyTarget(nil),
			ds:       bus.DesiredState{Hook: "sync", Labels: map[string]*string{"team": applyStr("b")}},
			want: kinds.ApplyParentPlan{
				Patch: map[string]any{"metadata": map[string]any{
					"labels": map[string]any{"team": "b"}, "finalizers": []string{fin}, "resourceVersion": "9",
				}},
				AddsFinalizer: fin,
			},
		},
		{
			reason: "a target that opted out since the sync hook answered: sync again, write nothing",
			target: applyTarget(func(p *unstructured.Unstructured) { p.SetLabels(map[string]string{"decorate": "no"}) }),
			ds:     bus.DesiredState{Hook: "sync", Labels: map[string]*string{"team": applyStr("b")}},
			want:   kinds.ApplyParentPlan{Gate: kinds.ApplyStale},
		},
		{
			reason:   "a finalize answer for a target that opted out is applied",
			finalize: true,
			target: applyTarget(func(p *unstructured.Unstructured) {
				p.SetLabels(map[string]string{"decorate": "no"})
				holding(p)
			}),
			ds:   bus.DesiredState{Hook: "finalize", Finalized: true},
			want: kinds.ApplyParentPlan{RemoveFinalizer: fin},
		},
		{
			reason: "being deleted without our finalizer: the garbage collector's",
			target: applyTarget(deleting),
			ds:     bus.DesiredState{Hook: "sync"},
			want:   kinds.ApplyParentPlan{Gate: kinds.ApplyParentDeleting},
		},
		{
			reason:   "finalize hook removed meanwhile: the finalizer still held is released by a final answer",
			finalize: false,
			target:   applyTarget(func(p *unstructured.Unstructured) { deleting(p); holding(p) }),
			ds:       bus.DesiredState{Hook: "finalize", Finalized: true},
			want:     kinds.ApplyParentPlan{RemoveFinalizer: fin},
		},
		{
			reason:   "finalize not done yet: the finalizer stays",
			finalize: true,
			target:   applyTarget(func(p *unstructured.Unstructured) { deleting(p); holding(p) }),
			ds:       bus.DesiredState{Hook: "finalize"},
			want:     kinds.ApplyParentPlan{},
		},
	}
	for _, tt := range tests {
		t.Run(tt.reason, func(t *testing.T) {
			c := applyController(t, tt.finalize)
			before := tt.target.DeepCopy()
			got, err := c.ApplyParent(kinds.ApplyInput{Desired: &tt.ds, Parent: tt.target, ParentResource: "pods", ParentHasStatus: tt.hasStatus})
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("plan (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(before, tt.target); diff != "" {
				t.Errorf("the observed target was modified (-before +after):\n%s", diff)
			}
		})
	}
}

func TestApplyOwnerAndRules(t *testing.T) {
	c := applyController(t, false)
	owner, err := c.ApplyOwner(applyTarget(nil), &bus.DesiredState{})
	if err != nil {
		t.Fatal(err)
	}
	if owner.Selector != nil || owner.ExtraLabels != nil {
		t.Errorf("attachments have no selector nor extra labels: %+v", owner)
	}
	if diff := cmp.Diff(map[string]string{decorator.ControllerAnnotation: "deco"}, owner.ExtraAnnotations); diff != "" {
		t.Errorf("extra annotations (-want +got):\n%s", diff)
	}
	if owner.UID != "p-uid" || owner.Kind != "Pod" || owner.APIVersion != "v1" || !owner.Namespaced {
		t.Errorf("owner %+v is not the target", owner)
	}
	want := kinds.ApplyChildRules{
		Field: "spec.attachments", Noun: "attachments",
		Rules: []kinds.ApplyChildRule{
			{ResourceRule: v1alpha1.ResourceRule{APIVersion: "v1", Resource: "configmaps"}, Method: v1alpha1.ChildUpdateInPlace},
			{ResourceRule: v1alpha1.ResourceRule{APIVersion: "v1", Resource: "services"}},
		},
	}
	if diff := cmp.Diff(want, c.ApplyChildRules()); diff != "" {
		t.Errorf("child rules (-want +got):\n%s", diff)
	}
	if c.ApplyClaims() {
		t.Error("a decorator never adopts nor releases")
	}
	if _, rolls := c.ApplyRollout(applyTarget(nil), "pods"); rolls {
		t.Error("attachments never roll out")
	}
}
