package decorator

import (
	"fmt"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/metabus/metabus/pkg/api/v1alpha1"
	"github.com/metabus/metabus/pkg/bus"
	"github.com/metabus/metabus/pkg/composite"
	"github.com/metabus/metabus/pkg/hookapi"
	"github.com/metabus/metabus/pkg/kinds"
	"github.com/metabus/metabus/pkg/snapshot"
)

// SyncEndpoints are the controller's endpoint configs.
func (c *Controller) SyncEndpoints() []v1alpha1.EndpointConfig { return c.DC.Spec.EndpointConfigs }

// SyncCustomizeHook is the controller's customize hook (nil: none).
func (c *Controller) SyncCustomizeHook() *v1alpha1.Hook {
	if c.DC.Spec.Hooks == nil {
		return nil
	}
	return c.DC.Spec.Hooks.Customize
}

// SyncGate releases a stale finalizer and waits for the garbage collector
// (composite.SyncFinalizerGate); targets have no selector of their own to
// check.
func (c *Controller) SyncGate(snap *snapshot.Response) (kinds.Gate, error) {
	g, _ := composite.SyncFinalizerGate(c, snap.Parent)
	return g, nil
}

// SyncEchoable is true for a controller that opted into echo suppression
// (bus.SuppressEchoesAnnotation): a decorator's answer depends only on the
// objects it is shown.
func (c *Controller) SyncEchoable() bool { return kinds.SuppressesEchoes(c.obj) }

// SyncInputsComplete is true: a decorator's request is the objects it is
// shown.
func (c *Controller) SyncInputsComplete() bool { return true }

// SyncHook is ChooseHook for a target of the given resource: finalize when
// it is deleted or no longer selected while holding the finalizer, else
// sync.
func (c *Controller) SyncHook(snap *snapshot.Response, resource string) (kinds.HookChoice, error) {
	target := snap.Parent
	selected, err := Selected(c.DC.Spec, target, resource)
	if err != nil {
		// The watcher wired the controller with the same selectors, so
		// this only happens while a broken spec is being rolled out.
		return kinds.HookChoice{}, fmt.Errorf("DecoratorController %s: %w", c.DC.Name, err)
	}
	hook, kind, finalizing := ChooseHook(c.DC, target, selected)
	if hook == nil {
		if kind == "" {
			// Deleting or opted out, with nothing to finalize: the garbage
			// collector (or nobody) takes the attachments.
			return kinds.HookChoice{}, nil
		}
		return kinds.HookChoice{}, fmt.Errorf("DecoratorController %s has no %s hook", c.DC.Name, kind)
	}
	return kinds.HookChoice{Hook: hook, Kind: kind, Finalizing: finalizing}, nil
}

// SyncCalls builds the one DecoratorSyncRequest of a target.
func (c *Controller) SyncCalls(in kinds.SyncInput) ([]kinds.HookCall, error) {
	snap := in.Snapshot
	attachments, related, err := kinds.ObjectMaps(in.Hook.Hook, snap.Parent.GetNamespace() != "", snap)
	if err != nil {
		return nil, err
	}
	return []kinds.HookCall{{
		Request: hookapi.DecoratorSyncRequest{
			Controller:  snap.Controller,
			Object:      snap.Parent,
			Attachments: attachments,
			Related:     related,
			Finalizing:  in.Hook.Finalizing,
		},
		Response: &hookapi.DecoratorSyncResponse{},
	}}, nil
}

// SyncRevisions is nil: targets keep no revisions.
func (c *Controller) SyncRevisions(*unstructured.Unstructured) (*kinds.Revisions, error) {
	return nil, nil
}

// SyncAsOf is never asked (no revisions); it fails rather than guess.
func (c *Controller) SyncAsOf(kinds.HookCall, *unstructured.Unstructured) (kinds.HookCall, error) {
	return kinds.HookCall{}, fmt.Errorf("DecoratorController %s: targets have no revisions", c.DC.Name)
}

// SyncDesired is the hook's answer as a desired state: the attachments, the
// labels and annotations to set or remove on the target, its status when
// the hook returned one (StatusSet; null leaves it alone), the resync
// request and, for finalize, whether cleanup is done.
func (c *Controller) SyncDesired(calls []kinds.HookCall) (bus.DesiredState, error) {
	call, err := kinds.OneCall(calls)
	if err != nil {
		return bus.DesiredState{}, fmt.Errorf("DecoratorController %s: %w", c.DC.Name, err)
	}
	resp, ok := call.Response.(*hookapi.DecoratorSyncResponse)
	if !ok {
		return bus.DesiredState{}, fmt.Errorf("DecoratorController %s: a %T is not its sync response", c.DC.Name, call.Response)
	}
	return bus.DesiredState{
		Children:           resp.Attachments,
		Labels:             resp.Labels,
		Annotations:        resp.Annotations,
		Status:             resp.Status,
		StatusSet:          resp.Status != nil,
		ResyncAfterSeconds: resp.ResyncAfterSeconds,
		Finalized:          resp.Finalized,
	}, nil
}
