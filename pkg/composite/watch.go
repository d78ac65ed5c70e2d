package composite

import (
	"fmt"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/metabus/metabus/pkg/api/v1alpha1"
	"github.com/metabus/metabus/pkg/apiresource"
	"github.com/metabus/metabus/pkg/children"
	"github.com/metabus/metabus/pkg/kinds"
	"github.com/metabus/metabus/pkg/snapshot"
)

// WatchResources lists the parent resource and the child resources, in
// spec order, for the admin's policy.
func (c *Controller) WatchResources() []kinds.WatchedResource {
	spec := &c.CC.Spec
	out := make([]kinds.WatchedResource, 0, 1+len(spec.ChildResources))
	out = append(out, kinds.WatchedResource{Field: "spec.parentResource",
		APIVersion: spec.ParentResource.APIVersion, Resource: spec.ParentResource.Resource})
	for i, ch := range spec.ChildResources {
		out = append(out, kinds.WatchedResource{Field: fmt.Sprintf("spec.childResources[%d]", i),
			APIVersion: ch.APIVersion, Resource: ch.Resource})
	}
	return out
}

// WatchPlan resolves the parent and child resources: one parent source
// (selected by parentResource.labelSelector), the children in spec order,
// orphans adopted by the parent's selector.
func (c *Controller) WatchPlan(resolve kinds.WatchResolver) (*kinds.WatchPlan, error) {
	spec := &c.CC.Spec
	pr := spec.ParentResource
	if pr.APIVersion == "" || pr.Resource == "" {
		return nil, fmt.Errorf("spec.parentResource needs apiVersion and resource")
	}
	parentRes, err := resolve(pr.APIVersion, pr.Resource)
	if err != nil {
		return nil, fmt.Errorf("parent resource: %w", err)
	}
	if !parentRes.HasStatus {
		// As upstream: without the status subresource every status write
		// bumps metadata.generation and the controller hot-loops.
		return nil, fmt.Errorf("parent resource %s does not have subresource 'status' enabled", parentRes.GVR)
	}
	rules := &watchRules{spec: spec, parentSel: labels.Everything(), finalizer: c.Finalizer()}
	if pr.LabelSelector != nil {
		sel, err := metav1.LabelSelectorAsSelector(pr.LabelSelector)
		if err != nil {
			return nil, fmt.Errorf("spec.parentResource.labelSelector: %w", err)
		}
		rules.parentSel = sel
	}
	declared := make([]string, len(spec.ChildResources))
	for i, ch := range spec.ChildResources {
		res, err := resolve(ch.APIVersion, ch.Resource)
		if err != nil {
			return nil, fmt.Errorf("spec.childResources[%d]: %w", i, err)
		}
		if parentRes.Namespaced && !res.Namespaced {
			return nil, fmt.Errorf("spec.childResources[%d]: a namespaced parent cannot own cluster-scoped %s", i, res.GVR.Resource)
		}
		rules.owned = append(rules.owned, res)
		declared[i] = ch.APIVersion
	}
	if err := WatchCheckDistinct("spec.childResources", declared, rules.owned); err != nil {
		return nil, err
	}
	return &kinds.WatchPlan{
		Parents:   []kinds.WatchParent{{Res: parentRes, IgnoreStatusChanges: pr.IgnoreStatusChanges != nil && *pr.IgnoreStatusChanges}},
		Owned:     rules.owned,
		Adopts:    true,
		Finalizer: rules.finalizer,
		Rules:     rules,
	}, nil
}

// WatchCheckDistinct rejects a list of resolved resources that declares one
// resource twice (also in two versions): its objects would be planned under
// two rules at once and deleted and recreated on every sync. apiVersions
// are the versions as declared, one per resource.
func WatchCheckDistinct(field string, apiVersions []string, res []*apiresource.Resource) error {
	rules := make([]children.Rule, len(res))
	for i, r := range res {
		rules[i] = children.Rule{APIVersion: apiVersions[i], Resource: r.GVR.Resource, Kind: r.Kind}
	}
	return children.CheckDistinct(field, rules)
}

// watchRules are a CompositeController's watch decisions.
type watchRules struct {
	spec      *v1alpha1.CompositeControllerSpec
	parentSel labels.Selector // parentResource.labelSelector
	owned     []*apiresource.Resource
	finalizer string
}

// Selects matches parentResource.labelSelector.
func (r *watchRules) Selects(parent *unstructured.Unstructured) bool {
	return r.parentSel.Matches(labels.Set(parent.GetLabels()))
}

// OwnerRef is any controller reference: the watcher checks that it names
// a parent.
func (r *watchRules) OwnerRef(obj *unstructured.Unstructured) *metav1.OwnerReference {
	return metav1.GetControllerOfNoCopy(obj)
}

// WantsOrphan: a parent adopts the orphans its selector matches (never
// with an empty or unusable selector, which would claim everything).
func (r *watchRules) WantsOrphan(parent, orphan *unstructured.Unstructured) bool {
	sel, err := ParentSelector(*r.spec, parent)
	return err == nil && !sel.Empty() && sel.Matches(labels.Set(orphan.GetLabels()))
}

// Observe claims the children of parent per child resource: owned ones
// matching its selector are kept, owned ones that stopped matching are
// released, and matching orphans (and children of an earlier incarnation
// of the parent) are adopted. A parent whose selector is unusable keeps
// only what it owns and adopts nothing; selectorError says why.
func (r *watchRules) Observe(parentRes *apiresource.Resource, parent *unstructured.Unstructured, caches []kinds.WatchCache) ([]snapshot.Group, string) {
	parentUID := string(parent.GetUID())
	parentGroup := parentRes.GVR.Group
	owner := children.Owner{Namespace: parent.GetNamespace(), Namespaced: parentRes.Namespaced}
	var selectorError string
	if sel, err := ParentSelector(*r.spec, parent); err != nil {
		selectorError = err.Error()
	} else {
		owner.Selector = sel
	}
	deleting := parent.GetDeletionTimestamp() != nil
	var groups []snapshot.Group
	for i, h := range caches {
		res := r.owned[i]
		g := snapshot.GroupOf(res)
		var owned []*unstructured.Unstructured
		for _, c := range h.OwnedBy(parentUID) {
			if watchControlledByKind(c, parentGroup, parentRes.Kind) {
				owned = append(owned, c)
			}
		}
		var orphans, earlier []*unstructured.Unstructured
		if owner.Selector != nil && !deleting {
			if owner.Namespaced {
				orphans = h.Orphans(owner.Namespace)
			} else {
				orphans = h.AllOrphans()
			}
			// Children of an earlier incarnation of this parent (same
			// kind and name, a UID that no longer exists: names are
			// unique, so the old parent is gone) are orphans the garbage
			// collector may never collect, e.g. when it saw the delete
			// and recreate as one update across an API server restart.
			// Adopt them like any orphan. (A cluster-scoped parent's
			// namespaced children are not looked for: that would scan
			// every namespace.)
			// Under generateSelector their controller-uid label names the
			// old UID, which the selector cannot match by construction:
			// they are offered by name and kind alone, and the applier
			// rewrites the label as it replaces the controller reference.
			for _, c := range h.ControlledByName(parentGroup, parentRes.Kind, parent.GetNamespace(), parent.GetName()) {
				ref := metav1.GetControllerOfNoCopy(c)
				switch {
				case ref == nil || string(ref.UID) == parentUID:
				case GeneratesSelector(*r.spec) && c.GetDeletionTimestamp() == nil:
					earlier = append(earlier, c)
				default:
					orphans = append(orphans, c)
				}
			}
		}
		keep, adopt, release := children.Claim(owner, deleting, owned, orphans)
		adopt = append(adopt, earlier...)
		g.Objects = append(append(g.Objects, keep...), adopt...)
		g.Adopt, g.Release = adopt, release
		groups = append(groups, g)
	}
	return groups, selectorError
}

// ReleaseOnReplace releases the parents' finalizer when the new spec drops
// the finalize hook: nobody will finalize them.
func (r *watchRules) ReleaseOnReplace(next *kinds.WatchPlan) []bool {
	if r.finalizer == "" || next.Finalizer != "" {
		return nil
	}
	return []bool{true}
}

// watchControlledByKind reports whether obj's controller reference names
// an object of the group and kind.
func watchControlledByKind(obj *unstructured.Unstructured, group, kind string) bool {
	ref := metav1.GetControllerOfNoCopy(obj)
	if ref == nil || ref.Kind != kind {
		return false
	}
	gv, err := schema.ParseGroupVersion(ref.APIVersion)
	return err == nil && gv.Group == group
}
