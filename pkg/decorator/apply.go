package decorator

import (
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/metabus/metabus/pkg/bus"
	"github.com/metabus/metabus/pkg/children"
	"github.com/metabus/metabus/pkg/composite"
	"github.com/metabus/metabus/pkg/kinds"
)

// ApplyChildRules are spec.attachments.
func (c *Controller) ApplyChildRules() kinds.ApplyChildRules {
	rules := make([]kinds.ApplyChildRule, len(c.DC.Spec.Attachments))
	for i, at := range c.DC.Spec.Attachments {
		rules[i].ResourceRule = at.ResourceRule
		if at.UpdateStrategy != nil {
			rules[i].Method = at.UpdateStrategy.Method
		}
	}
	return kinds.ApplyChildRules{Field: "spec.attachments", Noun: "attachments", Rules: rules}
}

// ApplyOwner is the target, with the annotation that marks an attachment
// as this controller's. Attachments have no selector to match.
func (c *Controller) ApplyOwner(target *unstructured.Unstructured, _ *bus.DesiredState) (children.Owner, error) {
	owner := children.OwnerOf(target)
	owner.ExtraAnnotations = map[string]string{ControllerAnnotation: c.DC.Name}
	return owner, nil
}

// ApplyClaims is false: a decorator never adopts nor releases (upstream's
// contract).
func (c *Controller) ApplyClaims() bool { return false }

// ApplyRollout is false: attachments have no rolling updates.
func (c *Controller) ApplyRollout(*unstructured.Unstructured, string) (kinds.ApplyRolloutSpec, bool) {
	return kinds.ApplyRolloutSpec{}, false
}

// ApplyParent plans the target's own writes (PlanTarget): labels,
// annotations and the finalizer in one patch before the attachments, the
// status through the status subresource after them (or in the patch when
// the resource has none), and the finalizer removed after a finalize
// hook's final answer. A sync answer for a target that opted out since is
// not applied (it would decorate the target again): the target is synced
// anew, which finalizes it or does nothing.
func (c *Controller) ApplyParent(in kinds.ApplyInput) (kinds.ApplyParentPlan, error) {
	target, ds := in.Parent, in.Desired
	finalizer := c.FinalizerName()
	holds := composite.HasFinalizer(target, finalizer)
	deleting := target.GetDeletionTimestamp() != nil
	if deleting && !holds {
		return kinds.ApplyParentPlan{Gate: kinds.ApplyParentDeleting}, nil
	}
	if ds.Hook == HookSync {
		if selected, err := Selected(c.DC.Spec, target, in.ParentResource); err == nil && !selected {
			return kinds.ApplyParentPlan{Gate: kinds.ApplyStale}, nil
		}
	}
	changes := Changes{Labels: ds.Labels, Annotations: ds.Annotations, Status: ds.Status, StatusSet: ds.StatusSet}
	if ds.Hook == HookSync && c.Finalizer() != "" && !holds && !deleting {
		changes.AddFinalizer = finalizer
	}
	u, err := PlanTarget(target, changes, in.ParentHasStatus)
	if err != nil {
		return kinds.ApplyParentPlan{}, err
	}
	plan := kinds.ApplyParentPlan{Patch: u.Patch, Status: u.Status}
	if u.Patch != nil {
		plan.AddsFinalizer = changes.AddFinalizer
	}
	if ds.Hook == HookFinalize && ds.Finalized && holds {
		plan.RemoveFinalizer = finalizer
	}
	return plan, nil
}
