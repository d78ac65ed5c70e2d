package composite

import (
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/metabus/metabus/pkg/api/v1alpha1"
	"github.com/metabus/metabus/pkg/bus"
)

// TestRolls: only the rolling methods give a parent revisions, and the
// dispatcher (SyncRevisions, SyncEchoable) and the applier (ApplyRollout)
// agree on it, since both read Rolls.
func TestRolls(t *testing.T) {
	parent := &unstructured.Unstructured{Object: map[string]any{"spec": map[string]any{"x": "1"}}}
	parent.SetNamespace("ns")
	for _, tc := range []struct {
		reason string
		method v1alpha1.ChildUpdateMethod
		want   bool
	}{
		{"no strategy is OnDelete", "", false},
		{"OnDelete", v1alpha1.ChildUpdateOnDelete, false},
		{"Recreate replaces at once", v1alpha1.ChildUpdateRecreate, false},
		{"InPlace updates at once", v1alpha1.ChildUpdateInPlace, false},
		{"RollingRecreate rolls", v1alpha1.ChildUpdateRollingRecreate, true},
		{"RollingInPlace rolls", v1alpha1.ChildUpdateRollingInPlace, true},
	} {
		t.Run(tc.reason, func(t *testing.T) {
			rule := v1alpha1.CompositeControllerChildResourceRule{}
			if tc.method != "" {
				rule.UpdateStrategy = &v1alpha1.CompositeControllerChildUpdateStrategy{Method: tc.method}
			}
			cc := &v1alpha1.CompositeController{}
			cc.Spec.ChildResources = []v1alpha1.CompositeControllerChildResourceRule{{}, rule}
			// Opted into echo suppression: rolling must still veto it.
			obj := &unstructured.Unstructured{}
			obj.SetAnnotations(map[string]string{bus.SuppressEchoesAnnotation: "true"})
			c := &Controller{CC: cc, obj: obj}
			revs, err := c.SyncRevisions(parent)
			if err != nil {
				t.Fatal(err)
			}
			_, applies := c.ApplyRollout(parent, "things")
			// A rolling parent's request also depends on its revisions:
			// never merged into a previous call either.
			if Rolls(cc) != tc.want || (revs != nil) != tc.want || c.SyncEchoable() == tc.want || applies != tc.want ||
				c.SyncInputsComplete() == tc.want {
				t.Errorf("Rolls %v, SyncRevisions %v, SyncEchoable %v, ApplyRollout %v, SyncInputsComplete %v; want rolling %v",
					Rolls(cc), revs != nil, c.SyncEchoable(), applies, c.SyncInputsComplete(), tc.want)
			}
		})
	}
}
