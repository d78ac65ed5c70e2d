package mapctl

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/metabus/metabus/pkg/api/v1alpha1"
	"github.com/metabus/metabus/pkg/bus"
	"github.com/metabus/metabus/pkg/children"
	"github.com/metabus/metabus/pkg/kinds"
)

func TestApplyChildRules(t *testing.T) {
	method := func(m string) map[string]any { return map[string]any{"method": m} }
	out := func(apiVersion, resource string, strategy map[string]any) map[string]any {
		r := rule(apiVersion, resource)
		if strategy != nil {
			r["updateStrategy"] = strategy
		}
		return r
	}
	resRule := func(apiVersion, resource string) v1alpha1.ResourceRule {
		return v1alpha1.ResourceRule{APIVersion: apiVersion, Resource: resource}
	}
	cases := []struct {
		reason  string
		outputs []any
		want    kinds.ApplyChildRules
	}{
		{
			reason:  "the issue's example: one output updated in place",
			outputs: validSpec()["outputResources"].([]any),
			want: kinds.ApplyChildRules{Field: "spec.outputResources", Noun: "outputs", RejectReason: "SyncError", DynamicApplyOnly: true, Rules: []kinds.ApplyChildRule{
				{ResourceRule: resRule("snapshot.storage.k8s.io/v1", "volumesnapshots"), Method: v1alpha1.ChildUpdateInPlace},
			}},
		},
		{
			reason: "every output in spec order, with its method; none (or an empty one) is OnDelete",
			outputs: []any{
				out("v1", "configmaps", method("Recreate")),
				out("v1", "secrets", nil),
				out("apps/v1", "deployments", map[string]any{}),
				out("snapshot.storage.k8s.io/v1", "volumesnapshots", method("OnDelete")),
			},
			want: kinds.ApplyChildRules{Field: "spec.outputResources", Noun: "outputs", RejectReason: "SyncError", DynamicApplyOnly: true, Rules: []kinds.ApplyChildRule{
				{ResourceRule: resRule("v1", "configmaps"), Method: v1alpha1.ChildUpdateRecreate},
				{ResourceRule: resRule("v1", "secrets"), Method: v1alpha1.ChildUpdateOnDelete},
				{ResourceRule: resRule("apps/v1", "deployments"), Method: v1alpha1.ChildUpdateOnDelete},
				{ResourceRule: resRule("snapshot.storage.k8s.io/v1", "volumesnapshots"), Method: v1alpha1.ChildUpdateOnDelete},
			}},
		},
	}
	for _, c := range cases {
		t.Run(c.reason, func(t *testing.T) {
			ctl := newController(t, specWith(func(s map[string]any) { s["outputResources"] = c.outputs }))
			if diff := cmp.Diff(c.want, ctl.ApplyChildRules()); diff != "" {
				t.Errorf("rules (-want +got):\n%s", diff)
			}
		})
	}
}

func TestApplyOwner(t *testing.T) {
	ctl := newController(t, validSpec())
	parent := scheduleParent("ns")
	plain := children.OwnerOf(parent)
	keyed := OutputOwner(parent, refA)
	keyed.Selector = nil
	type result struct {
		Owner    children.Owner // without Selector
		Selector string         // Selector.String(), "" for none
		Err      string         // prefix
	}
	cases := []struct {
		reason string
		ds     *bus.DesiredState
		want   result
	}{
		{
			reason: "the per-parent state: the plain parent, no selector (it has no outputs)",
			ds:     &bus.DesiredState{Hook: bus.HookStatus, Status: map[string]any{}},
			want:   result{Owner: plain},
		},
		{
			reason: "a key's outputs: tagged with the key and the input, selected by the key",
			ds:     &bus.DesiredState{Hook: bus.HookMap, MapKey: kA, MapInput: refA.Annotation(), Children: []*unstructured.Unstructured{snap("a-1", "")}},
			want: result{Owner: children.Owner{
				APIVersion: "ctl.example.com/v1", Kind: "SnapshotSchedule", Namespace: "ns", Name: "p", UID: "p-uid", Namespaced: true,
				ExtraLabels:      map[string]string{MapKeyLabel: kA},
				ExtraAnnotations: map[string]string{InputAnnotation: "/PersistentVolumeClaim/ns/a/ua"},
			}, Selector: MapKeyLabel + "=" + kA},
		},
		{
			reason: "a detached key whose outputs are kept: the same owner, so nothing of theirs changes",
			ds:     &bus.DesiredState{Hook: bus.HookTombstone, MapKey: kA, MapInput: refA.Annotation(), Children: []*unstructured.Unstructured{snap("a-1", "")}},
			want:   result{Owner: keyed, Selector: MapKeyLabel + "=" + kA},
		},
		{
			reason: "a detached key whose outputs name no input, all deleted: the parent, selecting the key",
			ds:     &bus.DesiredState{Hook: bus.HookTombstone, MapKey: kA, Children: []*unstructured.Unstructured{}},
			want:   result{Owner: plain, Selector: MapKeyLabel + "=" + kA},
		},
		{
			reason: "outputs to keep without knowing their input cannot be tagged",
			ds:     &bus.DesiredState{Hook: bus.HookTombstone, MapKey: kA, Children: []*unstructured.Unstructured{snap("a-1", "")}},
			want:   result{Err: "MapController snap: outputs of map key " + kA + " name no input"},
		},
		{
			reason: "an input that is not the key's would tag outputs with another key",
			ds:     &bus.DesiredState{Hook: bus.HookMap, MapKey: kA, MapInput: refB.Annotation()},
			want:   result{Err: "MapController snap: input /PersistentVolumeClaim/ns/b/ub is not map key " + kA},
		},
		{
			reason: "an input that does not parse",
			ds:     &bus.DesiredState{Hook: bus.HookMap, MapKey: kA, MapInput: "PersistentVolumeClaim/ns/a"},
			want:   result{Err: "MapController snap: " + InputAnnotation + ` "PersistentVolumeClaim/ns/a": want group/kind/namespace/name/uid`},
		},
	}
	for _, c := range cases {
		t.Run(c.reason, func(t *testing.T) {
			owner, err := ctl.ApplyOwner(parent, c.ds)
			if c.want.Err != "" {
				if err == nil || !strings.HasPrefix(err.Error(), c.want.Err) {
					t.Fatalf("error %v, want one starting with %q", err, c.want.Err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			got := result{Owner: owner}
			got.Owner.Selector = nil
			if owner.Selector != nil {
				got.Selector = owner.Selector.String()
			}
			if diff := cmp.Diff(c.want, got); diff != "" {
				t.Errorf("owner (-want +got):\n%s", diff)
			}
		})
	}
}

func TestApplyParent(t *testing.T) {
	ctl := newController(t, validSpec())
	computed := map[string]any{
		"observedGeneration": int64(3),
		"inputs":             map[string]any{"persistentvolumeclaims": map[string]any{"total": int64(2)}},
		"outputs":            map[string]any{"volumesnapshots": map[string]any{"total": int64(2), "readyToUse": int64(1)}},
	}
	// The same status as read back from the API (JSON numbers), and the
	// parent's own field metabus does not own.
	current := map[string]any{
		"phase":              "Active",
		"observedGeneration": float64(3),
		"inputs":             map[string]any{"persistentvolumeclaims": map[string]any{"total": float64(2)}},
		"outputs":            map[string]any{"volumesnapshots": map[string]any{"total": float64(2), "readyToUse": float64(1)}},
	}
	withStatus := func(s any) func(*unstructured.Unstructured) { return withField(s, "status") }
	cases := []struct {
		reason  string
		parent  *unstructured.Unstructured
		ds      *bus.DesiredState
		want    kinds.ApplyParentPlan
		wantErr string // prefix
	}{
		{
			reason: "a parent being deleted is left to the garbage collector",
			parent: scheduleParent("ns", deleting),
			ds:     &bus.DesiredState{Hook: bus.HookStatus, Status: computed},
			want:   kinds.ApplyParentPlan{Gate: kinds.ApplyParentDeleting},
		},
		{
			reason: "a key's state writes nothing on the parent",
			parent: scheduleParent("ns"),
			ds:     &bus.DesiredState{Hook: bus.HookMap, MapKey: kA, MapInput: refA.Annotation(), Status: computed},
		},
		{
			reason: "nor does a tombstone",
			parent: scheduleParent("ns"),
			ds:     &bus.DesiredState{Hook: bus.HookTombstone, MapKey: kA},
		},
		{
			reason: "a per-parent state without a status writes nothing",
			parent: scheduleParent("ns", withStatus(map[string]any{"phase": "Active"})),
			ds:     &bus.DesiredState{Hook: bus.HookStatus},
		},
		{
			reason: "a status that is already the parent's is not written again",
			parent: scheduleParent("ns", withStatus(current)),
			ds:     &bus.DesiredState{Hook: bus.HookStatus, Status: computed},
		},
		{
			reason: "a changed status is written through the subresource, the parent's other fields kept",
			parent: scheduleParent("ns", withStatus(map[string]any{
				"phase": "Active", "observedGeneration": int64(2),
				"inputs": map[string]any{"persistentvolumeclaims": map[string]any{"total": int64(1)}},
			})),
			ds: &bus.DesiredState{Hook: bus.HookStatus, Status: computed},
			want: kinds.ApplyParentPlan{Status: map[string]any{
				"phase":              "Active",
				"observedGeneration": int64(3),
				"inputs":             map[string]any{"persistentvolumeclaims": map[string]any{"total": int64(2)}},
				"outputs":            map[string]any{"volumesnapshots": map[string]any{"total": int64(2), "readyToUse": int64(1)}},
			}},
		},
		{
			reason: "a parent without status gets one",
			parent: scheduleParent("ns"),
			ds:     &bus.DesiredState{Hook: bus.HookStatus, Status: computed},
			want:   kinds.ApplyParentPlan{Status: computed},
		},
		{
			reason:  "a status that is not an object cannot be merged into",
			parent:  scheduleParent("ns", withStatus("broken")),
			ds:      &bus.DesiredState{Hook: bus.HookStatus, Status: computed},
			wantErr: "MapController snap: parent status: ",
		},
	}
	for _, c := range cases {
		t.Run(c.reason, func(t *testing.T) {
			before := c.parent.DeepCopy()
			plan, err := ctl.ApplyParent(kinds.ApplyInput{Desired: c.ds, Parent: c.parent, ParentResource: "snapshotschedules", ParentHasStatus: true})
			if c.wantErr != "" {
				if err == nil || !strings.HasPrefix(err.Error(), c.wantErr) {
					t.Fatalf("error %v, want one starting with %q", err, c.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(c.want, plan); diff != "" {
				t.Errorf("plan (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(before, c.parent); diff != "" {
				t.Errorf("the observed parent was modified (-before +after):\n%s", diff)
			}
		})
	}
}

func TestApplyClaimsAndRollout(t *testing.T) {
	ctl := newController(t, validSpec())
	spec, rolls := ctl.ApplyRollout(scheduleParent("ns"), "snapshotschedules")
	got := []any{ctl.ApplyClaims(), rolls, spec}
	want := []any{false, false, kinds.ApplyRolloutSpec{}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("outputs are never claimed and never roll out: claims, rolls, spec (-want +got):\n%s", diff)
	}
}
