package composite

import (
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/metabus/metabus/pkg/api/v1alpha1"
	"github.com/metabus/metabus/pkg/revision"
	"github.com/metabus/metabus/pkg/rollout"
)

// Rolls reports whether any child resource rolls out gradually
// (RollingRecreate, RollingInPlace): only then does a parent have
// ControllerRevisions, and only then is its sync never an echo (its answer
// also depends on the revisions). The dispatcher and the applier both ask.
func Rolls(cc *v1alpha1.CompositeController) bool {
	for _, c := range cc.Spec.ChildResources {
		if c.UpdateStrategy != nil && rollout.Rolling(c.UpdateStrategy.Method) {
			return true
		}
	}
	return false
}

// RevisionFieldPaths returns the parent fields that roll out gradually
// (revisionHistory.fieldPaths; package revision defaults an empty list to
// ["spec"]).
func RevisionFieldPaths(cc *v1alpha1.CompositeController) []string {
	if h := cc.Spec.ParentResource.RevisionHistory; h != nil {
		return h.FieldPaths
	}
	return nil
}

// HistoryParent describes a parent to package revision, with the labels and
// controller reference upstream puts on the revisions it creates: the
// parent's spec.template.metadata.labels (only controller-uid=<parent UID>
// under generateSelector), plus the parent's API group and resource.
func HistoryParent(cc *v1alpha1.CompositeController, parent *unstructured.Unstructured, resource string) revision.Parent {
	group, _, found := strings.Cut(parent.GetAPIVersion(), "/")
	if !found {
		group = ""
	}
	var controllerUID string
	if GeneratesSelector(cc.Spec) {
		controllerUID = string(parent.GetUID())
	}
	templateLabels, _, _ := unstructured.NestedStringMap(parent.Object, "spec", "template", "metadata", "labels")
	yes := true
	return revision.Parent{
		Resource:  resource,
		Group:     group,
		UID:       string(parent.GetUID()),
		Namespace: parent.GetNamespace(),
		Labels:    revision.Labels(templateLabels, controllerUID, group, resource),
		OwnerReferences: []metav1.OwnerReference{{
			APIVersion: parent.GetAPIVersion(), Kind: parent.GetKind(), Name: parent.GetName(),
			UID: parent.GetUID(), Controller: &yes, BlockOwnerDeletion: &yes,
		}},
	}
}
