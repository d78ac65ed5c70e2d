package mapctl

import (
	"fmt"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/metabus/metabus/pkg/bus"
	"github.com/metabus/metabus/pkg/children"
	"github.com/metabus/metabus/pkg/events"
	"github.com/metabus/metabus/pkg/kinds"
)

// ApplyChildRules are spec.outputResources, with their update methods.
func (c *Controller) ApplyChildRules() kinds.ApplyChildRules {
	rules := make([]kinds.ApplyChildRule, len(c.MC.Spec.OutputResources))
	for i, r := range c.MC.Spec.OutputResources {
		rules[i].ResourceRule = r.ResourceRule
		rules[i].Method = OutputMethod(r)
	}
	// Kept outputs are re-applied from their last-applied annotation
	// (asApplied): dynamic apply only.
	return kinds.ApplyChildRules{Field: "spec.outputResources", Noun: "outputs", Rules: rules, RejectReason: events.ReasonSyncError,
		DynamicApplyOnly: true}
}

// ApplyOwner is the owner of one key's outputs (OutputOwner): the parent,
// with the key's label and selector, and the input annotation. The
// applier plans against the key's observed outputs only, so outputs of
// other keys are never touched. The per-parent state has no outputs; its
// owner is the plain parent.
func (c *Controller) ApplyOwner(parent *unstructured.Unstructured, ds *bus.DesiredState) (children.Owner, error) {
	if ds.MapKey == "" {
		return children.OwnerOf(parent), nil
	}
	if ds.MapInput == "" {
		// A detached key whose outputs name no input: they can only be
		// deleted (SyncDesired keeps none without knowing their input).
		if len(ds.Children) > 0 {
			return children.Owner{}, fmt.Errorf("%s: outputs of map key %s name no input", c.name(), ds.MapKey)
		}
		owner := children.OwnerOf(parent)
		owner.Selector = labels.SelectorFromSet(labels.Set{MapKeyLabel: ds.MapKey})
		return owner, nil
	}
	ref, err := ParseInputAnnotation(ds.MapInput)
	if err != nil {
		return children.Owner{}, fmt.Errorf("%s: %w", c.name(), err)
	}
	if ref.Key() != ds.MapKey {
		return children.Owner{}, fmt.Errorf("%s: input %s is not map key %s", c.name(), ds.MapInput, ds.MapKey)
	}
	return OutputOwner(parent, ref), nil
}

// ApplyClaims is false: outputs are never adopted nor released.
func (c *Controller) ApplyClaims() bool { return false }

// ApplyRollout is false: outputs never roll out.
func (c *Controller) ApplyRollout(*unstructured.Unstructured, string) (kinds.ApplyRolloutSpec, bool) {
	return kinds.ApplyRolloutSpec{}, false
}

// ApplyParent writes nothing on the parent for a key. For the per-parent
// state it writes the aggregated status through the status subresource,
// merged into the parent's (MergeStatus: metabus owns only its fields),
// and only when that changes it. A parent being deleted is left to the
// garbage collector.
func (c *Controller) ApplyParent(in kinds.ApplyInput) (kinds.ApplyParentPlan, error) {
	if in.Parent.GetDeletionTimestamp() != nil {
		return kinds.ApplyParentPlan{Gate: kinds.ApplyParentDeleting}, nil
	}
	ds := in.Desired
	if ds.Hook != bus.HookStatus || ds.Status == nil {
		return kinds.ApplyParentPlan{}, nil
	}
	current, _, err := unstructured.NestedMap(in.Parent.Object, "status")
	if err != nil {
		return kinds.ApplyParentPlan{}, fmt.Errorf("%s: parent status: %w", c.name(), err)
	}
	merged, changed, err := MergeStatus(current, ds.Status)
	if err != nil {
		return kinds.ApplyParentPlan{}, fmt.Errorf("%s: %w", c.name(), err)
	}
	if !changed {
		return kinds.ApplyParentPlan{}, nil
	}
	return kinds.ApplyParentPlan{Status: merged}, nil
}
