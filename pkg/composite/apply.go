package composite

import (
	"bytes"
	"fmt"
	"slices"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/metabus/metabus/pkg/bus"
	"github.com/metabus/metabus/pkg/children"
	"github.com/metabus/metabus/pkg/kinds"
	"github.com/metabus/metabus/pkg/ujson"
)

// ApplyChildRules are spec.childResources.
func (c *Controller) ApplyChildRules() kinds.ApplyChildRules {
	rules := make([]kinds.ApplyChildRule, len(c.CC.Spec.ChildResources))
	for i, cr := range c.CC.Spec.ChildResources {
		rules[i].ResourceRule = cr.ResourceRule
		if s := cr.UpdateStrategy; s != nil {
			rules[i].Method = s.Method
			rules[i].Checks = s.StatusChecks.Conditions
		}
	}
	return kinds.ApplyChildRules{
		Field: "spec.childResources", Noun: "children", Rules: rules,
		OwnerUIDLabels: []string{ControllerUIDLabel},
	}
}

// ApplyOwner is the parent with its selector (spec.selector, or
// controller-uid=<uid> under generateSelector) and, under
// generateSelector, the controller-uid label every child gets.
func (c *Controller) ApplyOwner(parent *unstructured.Unstructured, _ *bus.DesiredState) (children.Owner, error) {
	sel, err := ParentSelector(c.CC.Spec, parent)
	if err != nil {
		return children.Owner{}, err
	}
	owner := children.OwnerOf(parent)
	owner.Selector = sel
	owner.ExtraLabels = ExtraLabels(c.CC.Spec, parent)
	return owner, nil
}

// ApplyClaims is true: a CompositeController parent adopts the orphans
// its selector matches and releases the children it stopped matching.
func (c *Controller) ApplyClaims() bool { return true }

// ApplyRollout reports whether a child resource has a rolling update
// strategy: only then does the parent have ControllerRevisions.
func (c *Controller) ApplyRollout(parent *unstructured.Unstructured, resource string) (kinds.ApplyRolloutSpec, bool) {
	if !Rolls(c.CC) {
		return kinds.ApplyRolloutSpec{}, false
	}
	return kinds.ApplyRolloutSpec{FieldPaths: RevisionFieldPaths(c.CC), History: HistoryParent(c.CC, parent, resource)}, true
}

// ApplyParent plans a CompositeController parent's own writes: the
// finalizer added before the first child of a sync (with a finalize hook),
// the hook's status plus observedGeneration when it differs from the
// observed one, and the finalizer removed after a finalize hook's final
// answer. A parent being deleted without the finalizer is left to the
// garbage collector.
//
// A desired state the parent has moved past is not applied but synced
// again (ApplyStale): a sync answer for a parent now being finalized, and
// any answer computed from an older generation of the parent than the one
// an applied answer already recorded in status.observedGeneration. Such a
// desired state reaches the applier only out of order: its publish was
// held up (a dispatcher cut from NATS whose bytes arrived after the heal,
// once a newer answer had been applied) and is stored after the newer
// one, so the stream's own order cannot tell. Applied, it would undo the
// newer answer: a sync answer after the finalize hook deleted the
// children creates them again.
func (c *Controller) ApplyParent(in kinds.ApplyInput) (kinds.ApplyParentPlan, error) {
	parent, ds := in.Parent, in.Desired
	finalizer := c.Finalizer()
	holds := HasFinalizer(parent, finalizer)
	deleting := parent.GetDeletionTimestamp() != nil
	if deleting && !holds {
		return kinds.ApplyParentPlan{Gate: kinds.ApplyParentDeleting}, nil
	}
	if (deleting && ds.Hook == bus.HookSync) || appliedGeneration(parent) > ds.Parent.Generation {
		return kinds.ApplyParentPlan{Gate: kinds.ApplyStale}, nil
	}
	var plan kinds.ApplyParentPlan
	if ds.Hook == bus.HookSync && finalizer != "" && !holds && !deleting {
		plan.Patch = map[string]any{"metadata": map[string]any{
			"finalizers":      append(slices.Clone(parent.GetFinalizers()), finalizer),
			"resourceVersion": parent.GetResourceVersion(),
		}}
		plan.AddsFinalizer = finalizer
	}
	status, err := applyStatus(parent, ds)
	if err != nil {
		return kinds.ApplyParentPlan{}, err
	}
	plan.Status = status
	if ds.Hook == bus.HookFinalize && ds.Finalized && holds {
		plan.RemoveFinalizer = finalizer
	}
	return plan, nil
}

// appliedGeneration is the parent generation the last applied answer was
// computed from (status.observedGeneration, which every status write
// sets), 0 if none is recorded.
func appliedGeneration(parent *unstructured.Unstructured) int64 {
	v, _, _ := unstructured.NestedFieldNoCopy(parent.Object, "status", "observedGeneration")
	switch n := v.(type) {
	case int64:
		return n
	case float64:
		return int64(n)
	}
	return 0
}

// applyStatus is the hook's status plus observedGeneration, or nil when
// the parent already has exactly that status.
func applyStatus(parent *unstructured.Unstructured, ds *bus.DesiredState) (map[string]any, error) {
	status := make(map[string]any, len(ds.Status)+1)
	for k, v := range ds.Status {
		status[k] = v
	}
	status["observedGeneration"] = ds.Parent.Generation
	current, _, _ := unstructured.NestedFieldNoCopy(parent.Object, "status")
	// Compared by canonical JSON, so int64(1) from the API server equals
	// float64(1) from a hook.
	cur, err := ujson.Marshal(current)
	if err != nil {
		return nil, fmt.Errorf("compare status: %w", err)
	}
	want, err := ujson.Marshal(status)
	if err != nil {
		return nil, fmt.Errorf("compare status: %w", err)
	}
	if bytes.Equal(cur, want) {
		return nil, nil
	}
	return status, nil
}
