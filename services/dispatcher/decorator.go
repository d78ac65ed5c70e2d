package dispatcher

import (
	"context"
	"fmt"

	"github.com/metabus/metabus/pkg/api/v1alpha1"
	"github.com/metabus/metabus/pkg/bus"
	"github.com/metabus/metabus/pkg/composite"
	"github.com/metabus/metabus/pkg/decorator"
	"github.com/metabus/metabus/pkg/echo"
	"github.com/metabus/metabus/pkg/events"
	"github.com/metabus/metabus/pkg/hookapi"
)

// syncDecorator syncs one target of a DecoratorController: it reads the
// target and its attachments from the snapshot service, calls sync (or
// finalize, when the target is being deleted or opted out of the
// selectors while holding our finalizer), and publishes the answer.
func (d *Dispatcher) syncDecorator(ctx context.Context, item bus.WorkItem, seq uint64) outcome {
	sreq, snap, out, ok := d.observe(ctx, item, seq, decorator.Finalizer(item.Controller.Name))
	if !ok {
		return out
	}
	dc, err := decorator.Decode(snap.Controller)
	if err != nil {
		return outcome{result: "invalid"}
	}
	target := snap.Parent
	resource := snap.ParentResource
	if resource == "" {
		resource = item.Parent.Resource
	}
	pref := parentRef(target, item.Parent)
	pref.Resource = resource
	if stale := decorator.Finalizer(dc.Name); decorator.ControllerFinalizer(dc) == "" && composite.HasFinalizer(target, stale) {
		return d.releaseStale(ctx, item, seq, stale)
	}
	if composite.WaitingForGC(target) {
		d.succeeded(item)
		return outcome{result: "skipped"}
	}
	if dc.Spec.Hooks != nil && dc.Spec.Hooks.Customize != nil {
		rules, err := d.customizeRules(ctx, item, customizer{
			hook: dc.Spec.Hooks.Customize, endpoints: dc.Spec.EndpointConfigs,
			controllerType: v1alpha1.DecoratorControllerKind, controllerName: dc.Name,
		}, snap.Controller, target)
		if err != nil {
			return d.failed(ctx, item, events.ReasonSyncError, err)
		}
		var out outcome
		if snap, out = d.withRelated(ctx, item, sreq, snap, rules); snap == nil {
			return out
		}
		target = snap.Parent
	}
	inputs := echo.Inputs(snap)
	if d.echoed(ctx, item, inputs) {
		return outcome{result: "echo"}
	}
	selected, err := decorator.Selected(dc.Spec, target, resource)
	if err != nil {
		// The watcher wired the controller with the same selectors, so
		// this only happens while a broken spec is being rolled out.
		return d.failed(ctx, item, events.ReasonSyncError, fmt.Errorf("DecoratorController %s: %w", dc.Name, err))
	}
	hook, kind, finalizing := decorator.ChooseHook(dc, target, selected)
	if hook == nil {
		if kind == "" {
			// Deleting or opted out, with nothing to finalize: the garbage
			// collector (or nobody) takes the attachments.
			d.succeeded(item)
			return outcome{result: "skipped"}
		}
		return d.failed(ctx, item, events.ReasonSyncError, fmt.Errorf("DecoratorController %s has no %s hook", dc.Name, kind))
	}
	attachments, related, err := hookMaps(hookVersion(hook), target.GetNamespace() != "", snap)
	if err != nil {
		return d.failed(ctx, item, events.ReasonSyncError, err)
	}
	call := syncCall{
		item: item, seq: seq, parent: pref, hook: hook, kind: kind,
		ctrlType: v1alpha1.DecoratorControllerKind, ctrlName: dc.Name, endpoints: dc.Spec.EndpointConfigs,
		inputs: inputs,
		request: hookapi.DecoratorSyncRequest{
			Controller:  snap.Controller,
			Object:      target,
			Attachments: attachments,
			Related:     related,
			Finalizing:  finalizing,
		},
	}
	var resp hookapi.DecoratorSyncResponse
	if out, ok := d.callHook(ctx, call, &resp); !ok {
		return out
	}
	return d.publishDesired(ctx, call, bus.DesiredState{
		Children:           resp.Attachments,
		Labels:             resp.Labels,
		Annotations:        resp.Annotations,
		Status:             resp.Status,
		StatusSet:          resp.Status != nil,
		ResyncAfterSeconds: resp.ResyncAfterSeconds,
		Finalized:          resp.Finalized,
	}, snap.Children)
}
