package composite_test

import (
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/metabus/metabus/pkg/api/v1alpha1"
	"github.com/metabus/metabus/pkg/composite"
	"github.com/metabus/metabus/pkg/rollout"
)

// TestSyncAgreesWithRollout: package composite cannot import rollout (it
// imports composite), so the core repeats rollout.HasRolling and
// rollout.FieldPaths; they must not drift apart.
func TestSyncAgreesWithRollout(t *testing.T) {
	parent := &unstructured.Unstructured{Object: map[string]any{"spec": map[string]any{"x": "1", "y": "2"}}}
	parent.SetNamespace("ns")
	methods := []v1alpha1.ChildUpdateMethod{"", v1alpha1.ChildUpdateOnDelete, v1alpha1.ChildUpdateRecreate, v1alpha1.ChildUpdateInPlace,
		v1alpha1.ChildUpdateRollingRecreate, v1alpha1.ChildUpdateRollingInPlace}
	for _, method := range methods {
		for _, paths := range [][]string{nil, {"spec.x"}} {
			t.Run(string(method), func(t *testing.T) {
				cc := &v1alpha1.CompositeController{}
				rule := v1alpha1.CompositeControllerChildResourceRule{}
				if method != "" {
					rule.UpdateStrategy = &v1alpha1.CompositeControllerChildUpdateStrategy{Method: method}
				}
				cc.Spec.ChildResources = []v1alpha1.CompositeControllerChildResourceRule{{}, rule}
				if paths != nil {
					cc.Spec.ParentResource.RevisionHistory = &v1alpha1.CompositeControllerRevisionHistory{FieldPaths: paths}
				}
				c := &composite.Controller{CC: cc}
				revs, err := c.SyncRevisions(parent)
				if err != nil {
					t.Fatal(err)
				}
				if rolls := rollout.HasRolling(cc); (revs != nil) != rolls || c.SyncEchoable() == rolls {
					t.Errorf("rollout.HasRolling = %v, but SyncRevisions = %v and SyncEchoable = %v", rolls, revs, c.SyncEchoable())
				}
				if revs != nil && len(revs.FieldPaths) != len(rollout.FieldPaths(cc)) {
					t.Errorf("field paths %v, rollout says %v", revs.FieldPaths, rollout.FieldPaths(cc))
				}
			})
		}
	}
}
