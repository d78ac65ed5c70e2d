package applier

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"

	"github.com/metabus/metabus/pkg/api/v1alpha1"
	"github.com/metabus/metabus/pkg/bus"
	"github.com/metabus/metabus/pkg/children"
	"github.com/metabus/metabus/pkg/composite"
	"github.com/metabus/metabus/pkg/decorator"
	"github.com/metabus/metabus/pkg/events"
	"github.com/metabus/metabus/pkg/snapshot"
)

// applyDecorator converges one DecoratorController target: attachments
// through the same planning and writes as CompositeController children, and
// the target's labels, annotations, finalizer and status through writes
// that carry the observed resourceVersion. The target's spec is never
// written. Everything is compared with the snapshot first, so a no-op sync
// makes no API call (and never a GET).
func (a *Applier) applyDecorator(ctx context.Context, ds *bus.DesiredState, snap *snapshot.Response) result {
	dc, err := decorator.Decode(snap.Controller)
	if err != nil {
		return result{result: "invalid"}
	}
	target := snap.Parent
	finalizer := decorator.Finalizer(dc.Name)
	holds := composite.HasFinalizer(target, finalizer)
	deleting := target.GetDeletionTimestamp() != nil
	if deleting && !holds {
		// Going away without our finalizer: the garbage collector owns
		// the attachments now.
		return result{result: "parent_deleting"}
	}

	if ds.Hook == decorator.HookSync {
		if selected, err := decorator.Selected(dc.Spec, target, snap.ParentResource); err == nil && !selected {
			// The target opted out after the hook answered: applying the
			// sync would decorate it again. Sync anew (finalize, or
			// nothing).
			return a.requeue(ctx, ds)
		}
	}

	// Validate and plan everything before the first write: a response we
	// know to be wrong is rejected as a whole.
	rules, err := a.attachmentRules(ctx, dc)
	if err != nil {
		return a.retry(ctx, ds, events.ReasonApplyError, err)
	}
	owner := children.Owner{
		APIVersion:       target.GetAPIVersion(),
		Kind:             target.GetKind(),
		Namespace:        target.GetNamespace(),
		Name:             target.GetName(),
		UID:              string(target.GetUID()),
		Namespaced:       target.GetNamespace() != "",
		ExtraAnnotations: map[string]string{decorator.ControllerAnnotation: dc.Name},
	}
	desired, err := children.Normalize(owner, rules, ds.Children)
	if err != nil {
		a.metrics.rejected.Inc()
		return a.retry(ctx, ds, events.ReasonInvalidDesired, fmt.Errorf("%s hook response rejected, nothing applied: %w", ds.Hook, err))
	}
	observed := map[int][]*unstructured.Unstructured{}
	for i, g := range snap.Children {
		if i < len(rules) {
			observed[i] = g.Objects
		}
	}
	actions, err := children.Plan(owner, rules, observed, desired)
	if err != nil {
		return a.retry(ctx, ds, events.ReasonApplyError, fmt.Errorf("plan attachments: %w", err))
	}
	changes := decorator.Changes{
		Labels:      ds.Labels,
		Annotations: ds.Annotations,
		Status:      ds.Status,
		StatusSet:   ds.StatusSet,
	}
	if ds.Hook == decorator.HookSync && decorator.ControllerFinalizer(dc) != "" && !holds && !deleting {
		// In place before any attachment exists, so that deletion (or
		// opting out) always waits for the finalize hook.
		changes.AddFinalizer = finalizer
	}
	update, err := decorator.PlanTarget(target, changes, snap.ParentHasStatus)
	if err != nil {
		return a.retry(ctx, ds, events.ReasonApplyError, err)
	}

	if update.Patch != nil {
		out, err := a.patchTarget(ctx, ds, target, update.Patch)
		if err != nil {
			return a.writeFailed(ctx, ds, err)
		}
		target = out
	}
	var errs []error
	conflict := false
	for _, act := range actions {
		if err := a.write(ctx, act); err != nil {
			if apierrors.IsConflict(err) {
				conflict = true
				continue
			}
			errs = append(errs, err)
		}
	}
	if update.Status != nil {
		out, err := a.writeTargetStatus(ctx, ds, target, update.Status)
		switch {
		case apierrors.IsConflict(err):
			conflict = true
		case err != nil:
			errs = append(errs, err)
		default:
			target = out
		}
	}
	if len(errs) > 0 {
		return a.retry(ctx, ds, events.ReasonApplyError, errors.Join(errs...))
	}
	if conflict {
		return a.requeue(ctx, ds)
	}
	if ds.Hook == decorator.HookFinalize && ds.Finalized && holds {
		// Only now: every write of the final desired state is done.
		if _, err := a.setFinalizer(ctx, ds, target, finalizer, false); err != nil {
			return a.writeFailed(ctx, ds, err)
		}
		return result{result: "finalized"}
	}
	if len(actions) == 0 && update.IsZero() {
		return result{result: "noop"}
	}
	return result{result: "ok"}
}

// attachmentRules resolves the controller's attachment resources.
func (a *Applier) attachmentRules(ctx context.Context, dc *v1alpha1.DecoratorController) ([]children.Rule, error) {
	rules := make([]children.Rule, 0, len(dc.Spec.Attachments))
	for i, at := range dc.Spec.Attachments {
		var method v1alpha1.ChildUpdateMethod
		if at.UpdateStrategy != nil {
			method = at.UpdateStrategy.Method
		}
		r, err := a.resolveRule(ctx, at.ResourceRule, method)
		if err != nil {
			return nil, fmt.Errorf("spec.attachments[%d]: %w", i, err)
		}
		rules = append(rules, r)
	}
	if err := children.CheckDistinct("spec.attachments", rules); err != nil {
		return nil, err
	}
	return rules, nil
}

// patchTarget writes a merge patch computed by decorator.PlanTarget (it
// carries the observed resourceVersion: a target changed since fails with
// a conflict).
func (a *Applier) patchTarget(ctx context.Context, ds *bus.DesiredState, target *unstructured.Unstructured, patch map[string]any) (*unstructured.Unstructured, error) {
	data, err := json.Marshal(patch)
	if err != nil {
		return nil, fmt.Errorf("encode patch of %s: %w", key(target), err)
	}
	c, err := a.parentClient(ds.Parent)
	if err != nil {
		return nil, err
	}
	a.metrics.writes.WithLabelValues("patch_target", ds.Parent.Resource).Inc()
	finish := startWrite(ctx, target)
	out, err := c.Patch(ctx, target.GetName(), types.MergePatchType, data, metav1.PatchOptions{})
	finish(out)
	if err != nil {
		return nil, fmt.Errorf("patch labels/annotations/finalizers of %s: %w", key(target), err)
	}
	a.wrote(ds, out)
	return out, nil
}

// writeTargetStatus replaces the target's status through the status
// subresource, with the observed resourceVersion as precondition.
func (a *Applier) writeTargetStatus(ctx context.Context, ds *bus.DesiredState, target *unstructured.Unstructured, status map[string]any) (*unstructured.Unstructured, error) {
	c, err := a.parentClient(ds.Parent)
	if err != nil {
		return nil, err
	}
	updated := target.DeepCopy()
	updated.Object["status"] = status
	a.metrics.writes.WithLabelValues("update_status", ds.Parent.Resource).Inc()
	finish := startWrite(ctx, target)
	out, err := c.UpdateStatus(ctx, updated, metav1.UpdateOptions{})
	finish(out)
	if err != nil {
		if apierrors.IsNotFound(err) {
			return target, nil
		}
		if apierrors.IsConflict(err) {
			return nil, err
		}
		return nil, fmt.Errorf("update status of %s: %w", key(target), err)
	}
	a.wrote(ds, out)
	return out, nil
}
