package children

import (
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
)

// Claim applies the ControllerRef rules to one child resource. owned are
// the objects whose controller reference names the owner; orphans are
// objects with no controller reference that could belong to it.
//
//   - keep: owned objects that still match the selector (the hook sees them);
//   - adopt: orphans that match the selector (the hook sees them too, and the
//     applier makes them owned before acting on the hook's answer);
//   - release: owned objects that no longer match (the applier removes the
//     controller reference; the hook does not see them).
//
// Nothing is adopted or released while the owner is being deleted, objects
// being deleted are never adopted, and a nil selector (decorators) claims
// nothing beyond what is already owned.
func Claim(owner Owner, ownerDeleting bool, owned, orphans []*unstructured.Unstructured) (keep, adopt, release []*unstructured.Unstructured) {
	for _, o := range owned {
		if o == nil {
			continue
		}
		if owner.Selector == nil || ownerDeleting || owner.Selector.Matches(labels.Set(o.GetLabels())) {
			keep = append(keep, o)
			continue
		}
		release = append(release, o)
	}
	if owner.Selector == nil || owner.Selector.Empty() || ownerDeleting {
		return keep, nil, release
	}
	for _, o := range orphans {
		if o == nil || o.GetDeletionTimestamp() != nil {
			continue
		}
		if owner.Namespaced && o.GetNamespace() != owner.Namespace {
			continue
		}
		if owner.Selector.Matches(labels.Set(o.GetLabels())) {
			adopt = append(adopt, o)
		}
	}
	return keep, adopt, release
}
