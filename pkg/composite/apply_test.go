package composite_test

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/metabus/metabus/pkg/api/v1alpha1"
	"github.com/metabus/metabus/pkg/bus"
	"github.com/metabus/metabus/pkg/composite"
	"github.com/metabus/metabus/pkg/kinds"
)

// applyController decodes a CompositeController with the given spec.
func applyController(t *testing.T, spec map[string]any) kinds.Controller {
	t.Helper()
	obj := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "metacontroller.k8s.io/v1alpha1", "kind": "CompositeController",
		"metadata": map[string]any{"name": "things", "uid": "cc-uid", "resourceVersion": "1"},
		"spec":     spec,
	}}
	c, err := composite.New(obj)
	if err != nil {
		t.Fatalf("decode: %v", err)
	}
	return c
}

func applySpec(finalize bool, generate bool) map[string]any {
	spec := map[string]any{
		"parentResource": map[string]any{"apiVersion": "example.com/v1", "resource": "things"},
		"childResources": []any{
			map[string]any{"apiVersion": "v1", "resource": "pods", "updateStrategy": map[string]any{"method": "Recreate"}},
			map[string]any{"apiVersion": "v1", "resource": "configmaps"},
		},
		"hooks": map[string]any{"sync": map[string]any{"webhook": map[string]any{"url": "http://hook/sync"}}},
	}
	if finalize {
		spec["hooks"].(map[string]any)["finalize"] = map[string]any{"webhook": map[string]any{"url": "http://hook/finalize"}}
	}
	if generate {
		spec["generateSelector"] = true
	}
	return spec
}

// applyParentObj is a parent at generation 2 with a selector; mutate
// adjusts it.
func applyParentObj(mutate func(p *unstructured.Unstructured)) *unstructured.Unstructured {
	p := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "example.com/v1", "kind": "Thing",
		"metadata": map[string]any{"name": "web", "namespace": "ns", "uid": "p-uid", "resourceVersion": "41", "generation": int64(2)},
		"spec":     map[string]any{"selector": map[string]any{"matchLabels": map[string]any{"app": "web"}}},
	}}
	if mutate != nil {
		mutate(p)
	}
	return p
}

func TestApplyParent(t *testing.T) {
	const fin = "metacontroller.io/compositecontroller-things"
	deleting := func(p *unstructured.Unstructured) {
		now := metav1.Now()
		p.SetDeletionTimestamp(&now)
	}
	holding := func(p *unstructured.Unstructured) { p.SetFinalizers([]string{"other", fin}) }
	withStatus := func(st map[string]any) func(p *unstructured.Unstructured) {
		return func(p *unstructured.Unstructured) { p.Object["status"] = st }
	}
	same := withStatus(map[string]any{"ready": int64(1), "observedGeneration": int64(2)})
	// at sets the parent's generation and the observedGeneration its
	// status records.
	at := func(gen, observed any) func(p *unstructured.Unstructured) {
		return func(p *unstructured.Unstructured) {
			p.SetGeneration(gen.(int64))
			p.Object["status"] = map[string]any{"ready": int64(1), "observedGeneration": observed}
		}
	}
	tests := []struct {
		reason   string
		finalize bool
		parent   *unstructured.Unstructured
		ds       bus.DesiredState
		// dsGen, if set, is the parent generation the hook saw (else the
		// parent's own).
		dsGen int64
		want  kinds.ApplyParentPlan
	}{
		{
			reason: "unchanged status (int64 observed, float64 from the hook): nothing to write",
			parent: applyParentObj(same),
			ds:     bus.DesiredState{Hook: "sync", Status: map[string]any{"ready": float64(1)}},
			want:   kinds.ApplyParentPlan{},
		},
		{
			reason: "changed status: replaced, with observedGeneration",
			parent: applyParentObj(same),
			ds:     bus.DesiredState{Hook: "sync", Status: map[string]any{"ready": float64(2)}},
			want:   kinds.ApplyParentPlan{Status: map[string]any{"ready": float64(2), "observedGeneration": int64(2)}},
		},
		{
			reason: "no status from the hook still records observedGeneration",
			parent: applyParentObj(nil),
			ds:     bus.DesiredState{Hook: "sync"},
			want:   kinds.ApplyParentPlan{Status: map[string]any{"observedGeneration": int64(2)}},
		},
		{
			reason:   "first sync with a finalize hook: the finalizer is added (keeping the others) before any child",
			finalize: true,
			parent:   applyParentObj(func(p *unstructured.Unstructured) { same(p); p.SetFinalizers([]string{"other"}) }),
			ds:       bus.DesiredState{Hook: "sync", Status: map[string]any{"ready": 1}},
			want: kinds.ApplyParentPlan{
				Patch:         map[string]any{"metadata": map[string]any{"finalizers": []string{"other", fin}, "resourceVersion": "41"}},
				AddsFinalizer: fin,
			},
		},
		{
			reason:   "sync of a parent already holding the finalizer: no patch",
			finalize: true,
			parent:   applyParentObj(func(p *unstructured.Unstructured) { same(p); holding(p) }),
			ds:       bus.DesiredState{Hook: "sync", Status: map[string]any{"ready": 1}},
			want:     kinds.ApplyParentPlan{},
		},
		{
			reason: "no finalize hook: no finalizer",
			parent: applyParentObj(same),
			ds:     bus.DesiredState{Hook: "sync", Status: map[string]any{"ready": 1}},
			want:   kinds.ApplyParentPlan{},
		},
		{
			reason: "being deleted without our finalizer: the garbage collector's",
			parent: applyParentObj(deleting),
			ds:     bus.DesiredState{Hook: "sync"},
			want:   kinds.ApplyParentPlan{Gate: kinds.ApplyParentDeleting},
		},
		{
			reason:   "finalize hook lost: a finalizer still held counts as none",
			finalize: false,
			parent:   applyParentObj(func(p *unstructured.Unstructured) { deleting(p); holding(p) }),
			ds:       bus.DesiredState{Hook: "finalize", Finalized: true},
			want:     kinds.ApplyParentPlan{Gate: kinds.ApplyParentDeleting},
		},
		{
			reason:   "finalized: the finalizer goes once everything else is written",
			finalize: true,
			parent:   applyParentObj(func(p *unstructured.Unstructured) { deleting(p); holding(p); same(p) }),
			ds:       bus.DesiredState{Hook: "finalize", Finalized: true, Status: map[string]any{"ready": 1}},
			want:     kinds.ApplyParentPlan{RemoveFinalizer: fin},
		},
		{
			reason:   "finalize not done yet: the finalizer stays",
			finalize: true,
			parent:   applyParentObj(func(p *unstructured.Unstructured) { deleting(p); holding(p); same(p) }),
			ds:       bus.DesiredState{Hook: "finalize", Status: map[string]any{"ready": 1}},
			want:     kinds.ApplyParentPlan{},
		},
		{
			reason:   "a sync answer for a parent being finalized is synced again, not applied: the finalize hook decides its children now (applied, it recreated the children the finalize answer deleted)",
			finalize: true,
			parent:   applyParentObj(func(p *unstructured.Unstructured) { deleting(p); holding(p); same(p) }),
			ds:       bus.DesiredState{Hook: "sync", Status: map[string]any{"ready": 1}},
			want:     kinds.ApplyParentPlan{Gate: kinds.ApplyStale},
		},
		{
			reason:   "a sync answer from generation 3 delivered after the answer of generation 5 was applied: synced again, not applied",
			finalize: true,
			parent:   applyParentObj(func(p *unstructured.Unstructured) { holding(p); at(int64(5), int64(5))(p) }),
			ds:       bus.DesiredState{Hook: "sync", Status: map[string]any{"ready": 1}},
			dsGen:    3,
			want:     kinds.ApplyParentPlan{Gate: kinds.ApplyStale},
		},
		{
			reason:   "a finalize answer older than the applied one: synced again, not applied",
			finalize: true,
			parent:   applyParentObj(func(p *unstructured.Unstructured) { deleting(p); holding(p); at(int64(6), int64(6))(p) }),
			ds:       bus.DesiredState{Hook: "finalize", Status: map[string]any{"ready": 1}},
			dsGen:    5,
			want:     kinds.ApplyParentPlan{Gate: kinds.ApplyStale},
		},
		{
			reason: "observedGeneration read as a float64 is compared as well",
			parent: applyParentObj(at(int64(5), float64(5))),
			ds:     bus.DesiredState{Hook: "sync", Status: map[string]any{"ready": 1}},
			dsGen:  4,
			want:   kinds.ApplyParentPlan{Gate: kinds.ApplyStale},
		},
		{
			reason: "an answer of the generation already applied is applied (a child changed, not the parent)",
			parent: applyParentObj(at(int64(5), int64(5))),
			ds:     bus.DesiredState{Hook: "sync", Status: map[string]any{"ready": float64(2)}},
			dsGen:  5,
			want:   kinds.ApplyParentPlan{Status: map[string]any{"ready": float64(2), "observedGeneration": int64(5)}},
		},
		{
			reason: "an answer computed from an older generation than the parent's, but newer than the applied one, is applied (as upstream; the newer generation has its own sync)",
			parent: applyParentObj(at(int64(5), int64(3))),
			ds:     bus.DesiredState{Hook: "sync", Status: map[string]any{"ready": 1}},
			dsGen:  4,
			want:   kinds.ApplyParentPlan{Status: map[string]any{"ready": 1, "observedGeneration": int64(4)}},
		},
		{
			reason:   "a sync answer for a parent being deleted never adds the finalizer",
			finalize: true,
			parent:   applyParentObj(func(p *unstructured.Unstructured) { deleting(p); p.SetFinalizers([]string{"x"}); same(p) }),
			ds:       bus.DesiredState{Hook: "sync", Status: map[string]any{"ready": 1}},
			want:     kinds.ApplyParentPlan{Gate: kinds.ApplyParentDeleting},
		},
	}
	for _, tt := range tests {
		t.Run(tt.reason, func(t *testing.T) {
			c := applyController(t, applySpec(tt.finalize, false))
			tt.ds.Parent = bus.ObjectRef{Generation: tt.parent.GetGeneration()}
			if tt.dsGen != 0 {
				tt.ds.Parent.Generation = tt.dsGen
			}
			before := tt.parent.DeepCopy()
			got, err := c.ApplyParent(kinds.ApplyInput{Desired: &tt.ds, Parent: tt.parent, ParentResource: "things", ParentHasStatus: true})
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("plan (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(before, tt.parent); diff != "" {
				t.Errorf("the observed parent was modified (-before +after):\n%s", diff)
			}
		})
	}
}

func TestApplyOwnerAndRules(t *testing.T) {
	tests := []struct {
		reason     string
		generate   bool
		parent     *unstructured.Unstructured
		wantErr    bool
		wantSel    string
		wantLabels map[string]string
	}{
		{reason: "spec.selector", parent: applyParentObj(nil), wantSel: "app=web"},
		{reason: "generateSelector: controller-uid on every child", generate: true,
			parent: applyParentObj(nil), wantSel: "controller-uid=p-uid", wantLabels: map[string]string{"controller-uid": "p-uid"}},
		{reason: "no selector and no generateSelector: the parent cannot own children",
			parent: applyParentObj(func(p *unstructured.Unstructured) { delete(p.Object, "spec") }), wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.reason, func(t *testing.T) {
			c := applyController(t, applySpec(false, tt.generate))
			owner, err := c.ApplyOwner(tt.parent, &bus.DesiredState{})
			if (err != nil) != tt.wantErr {
				t.Fatalf("err = %v, want error %v", err, tt.wantErr)
			}
			if err != nil {
				return
			}
			if got := owner.Selector.String(); got != tt.wantSel {
				t.Errorf("selector %q, want %q", got, tt.wantSel)
			}
			if diff := cmp.Diff(tt.wantLabels, owner.ExtraLabels); diff != "" {
				t.Errorf("extra labels (-want +got):\n%s", diff)
			}
			if owner.UID != "p-uid" || owner.Kind != "Thing" || owner.Namespace != "ns" || !owner.Namespaced {
				t.Errorf("owner %+v is not the parent", owner)
			}
		})
	}

	c := applyController(t, applySpec(false, false))
	want := kinds.ApplyChildRules{
		Field: "spec.childResources", Noun: "children", OwnerUIDLabels: []string{"controller-uid"},
		Rules: []kinds.ApplyChildRule{
			{ResourceRule: v1alpha1.ResourceRule{APIVersion: "v1", Resource: "pods"}, Method: v1alpha1.ChildUpdateRecreate},
			{ResourceRule: v1alpha1.ResourceRule{APIVersion: "v1", Resource: "configmaps"}},
		},
	}
	if diff := cmp.Diff(want, c.ApplyChildRules()); diff != "" {
		t.Errorf("child rules (-want +got):\n%s", diff)
	}
	if !c.ApplyClaims() {
		t.Error("a CompositeController parent must claim its children")
	}
}

// The applier's rollout must agree with package rollout's, which the
// dispatcher uses: the revisions both compute must be the same.
func TestApplyRolloutAgreesWithRollout(t *testing.T) {
	rolling := func(method string, generate bool, paths []any) map[string]any {
		s := applySpec(false, generate)
		s["childResources"] = []any{map[string]any{"apiVersion": "v1", "resource": "pods", "updateStrategy": map[string]any{
			"method": method, "statusChecks": map[string]any{"conditions": []any{map[string]any{"type": "Ready", "status": "True"}}},
		}}}
		if paths != nil {
			s["parentResource"].(map[string]any)["revisionHistory"] = map[string]any{"fieldPaths": paths}
		}
		return s
	}
	parent := applyParentObj(func(p *unstructured.Unstructured) {
		p.Object["spec"].(map[string]any)["template"] = map[string]any{"metadata": map[string]any{"labels": map[string]any{"app": "web", "tier": "front"}}}
	})
	tests := []struct {
		reason string
		spec   map[string]any
		rolls  bool
	}{
		{reason: "no rolling child: no rollout", spec: applySpec(false, false)},
		{reason: "RollingRecreate with statusChecks", spec: rolling("RollingRecreate", false, nil), rolls: true},
		{reason: "RollingInPlace under generateSelector, with field paths", spec: rolling("RollingInPlace", true, []any{"spec.template"}), rolls: true},
	}
	for _, tt := range tests {
		t.Run(tt.reason, func(t *testing.T) {
			c := applyController(t, tt.spec)
			cc := c.(*composite.Controller).CC
			got, rolls := c.ApplyRollout(parent, "things")
			if rolls != tt.rolls {
				t.Fatalf("rolls %v, want %v", rolls, tt.rolls)
			}
			if !rolls {
				return
			}
			want := kinds.ApplyRolloutSpec{FieldPaths: composite.RevisionFieldPaths(cc), History: composite.HistoryParent(cc, parent, "things")}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("rollout (-dispatcher's +applier's):\n%s", diff)
			}
			for i, r := range c.ApplyChildRules().Rules {
				if diff := cmp.Diff(cc.Spec.ChildResources[i].UpdateStrategy.StatusChecks.Conditions, r.Checks); diff != "" {
					t.Errorf("rule %d checks (-want +got):\n%s", i, diff)
				}
			}
		})
	}
}
