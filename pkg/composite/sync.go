package composite

import (
	"fmt"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/metabus/metabus/pkg/api/v1alpha1"
	"github.com/metabus/metabus/pkg/bus"
	"github.com/metabus/metabus/pkg/hookapi"
	"github.com/metabus/metabus/pkg/kinds"
	"github.com/metabus/metabus/pkg/revision"
	"github.com/metabus/metabus/pkg/snapshot"
)

// SyncEndpoints are the controller's endpoint configs.
func (c *Controller) SyncEndpoints() []v1alpha1.EndpointConfig { return c.CC.Spec.EndpointConfigs }

// SyncCustomizeHook is the controller's customize hook (nil: none).
func (c *Controller) SyncCustomizeHook() *v1alpha1.Hook {
	if c.CC.Spec.Hooks == nil {
		return nil
	}
	return c.CC.Spec.Hooks.Customize
}

// SyncGate releases a stale finalizer, waits for the garbage collector,
// and fails a parent whose children cannot be selected (its selector is
// missing or invalid): the hook would be shown no children and could act
// on that.
func (c *Controller) SyncGate(snap *snapshot.Response) (kinds.Gate, error) {
	if g, decided := SyncFinalizerGate(c, snap.Parent); decided {
		return g, nil
	}
	if snap.SelectorError != "" {
		return kinds.Gate{}, fmt.Errorf("cannot sync: %s", snap.SelectorError)
	}
	return kinds.Gate{}, nil
}

// SyncFinalizerGate is the part of a sync gate every kind with finalizers
// shares: a parent carrying the controller's finalizer after its finalize
// hook was removed is released (the watcher asks for that when the hook is
// removed, but that one request can be lost, so every sync of such a parent
// asks again and a deleted parent never hangs in Terminating); a parent
// whose dependents the garbage collector is still deleting is skipped (see
// WaitingForGC). decided is false when the sync goes on.
func SyncFinalizerGate(c kinds.Controller, parent *unstructured.Unstructured) (g kinds.Gate, decided bool) {
	if stale := c.FinalizerName(); c.Finalizer() == "" && HasFinalizer(parent, stale) {
		return kinds.Gate{Release: stale}, true
	}
	if WaitingForGC(parent) {
		return kinds.Gate{Skip: true}, true
	}
	return kinds.Gate{}, false
}

// SyncEchoable is true only for a controller that opted into echo
// suppression (bus.SuppressEchoesAnnotation), and never for one with
// rolling children: a rolling parent's sync also depends on its
// ControllerRevisions, which the echo inputs do not cover.
func (c *Controller) SyncEchoable() bool {
	return !Rolls(c.CC) && kinds.SuppressesEchoes(c.obj)
}

// SyncInputsComplete is false for a controller with rolling children,
// whose requests also depend on the parent's ControllerRevisions.
func (c *Controller) SyncInputsComplete() bool { return !Rolls(c.CC) }

// SyncHook is ChooseHook: finalize while the parent is deleted or
// deselected (nothing without a finalize hook), else sync, which the
// controller must have.
func (c *Controller) SyncHook(snap *snapshot.Response, _ string) (kinds.HookChoice, error) {
	hook, kind, finalizing := ChooseHook(c.CC, snap.Parent)
	if hook == nil {
		if kind == "" {
			// Deleting (or deselected) without a finalize hook: nothing to
			// do, the garbage collector takes the children.
			return kinds.HookChoice{}, nil
		}
		return kinds.HookChoice{}, fmt.Errorf("CompositeController %s has no %s hook", c.CC.Name, kind)
	}
	return kinds.HookChoice{Hook: hook, Kind: kind, Finalizing: finalizing}, nil
}

// SyncCalls builds the one CompositeSyncRequest of a parent.
func (c *Controller) SyncCalls(in kinds.SyncInput) ([]kinds.HookCall, error) {
	snap := in.Snapshot
	children, related, err := kinds.ObjectMaps(in.Hook.Hook, snap.Parent.GetNamespace() != "", snap)
	if err != nil {
		return nil, err
	}
	return []kinds.HookCall{{
		Request: hookapi.CompositeSyncRequest{
			Controller: snap.Controller,
			Parent:     snap.Parent,
			Children:   children,
			Related:    related,
			Finalizing: in.Hook.Finalizing,
		},
		Response: &hookapi.CompositeSyncResponse{},
	}}, nil
}

// SyncRevisions is nil unless a child resource rolls out gradually
// (RollingRecreate, RollingInPlace); then the parent keeps
// ControllerRevisions of its revisionHistory.fieldPaths, which need a
// namespaced parent.
func (c *Controller) SyncRevisions(parent *unstructured.Unstructured) (*kinds.Revisions, error) {
	if !Rolls(c.CC) {
		return nil, nil
	}
	if parent.GetNamespace() == "" {
		// ControllerRevisions are namespaced, so a cluster-scoped parent has
		// nowhere to keep its rollout (upstream fails here too, obscurely).
		return nil, fmt.Errorf("CompositeController %s: RollingRecreate and RollingInPlace need a namespaced parent resource (ControllerRevisions are namespaced); use Recreate or InPlace", c.CC.Name)
	}
	paths := RevisionFieldPaths(c.CC)
	patch, err := revision.ParentPatch(parent.Object, paths)
	if err != nil {
		return nil, fmt.Errorf("revisionHistory.fieldPaths: %w", err)
	}
	return &kinds.Revisions{FieldPaths: paths, Patch: patch}, nil
}

// SyncAsOf is the request of call with the parent as of an older revision:
// the children and related objects are the same (the maps are shared, not
// rebuilt), only the parent differs.
func (c *Controller) SyncAsOf(call kinds.HookCall, parent *unstructured.Unstructured) (kinds.HookCall, error) {
	req, ok := call.Request.(hookapi.CompositeSyncRequest)
	if !ok {
		return kinds.HookCall{}, fmt.Errorf("CompositeController %s: a %T is not its sync request", c.CC.Name, call.Request)
	}
	req.Parent = parent
	return kinds.HookCall{Request: req, Response: &hookapi.CompositeSyncResponse{}}, nil
}

// SyncDesired is the hook's answer as a desired state: the children, the
// parent's status (replaced whole), the resync request and, for finalize,
// whether cleanup is done.
func (c *Controller) SyncDesired(calls []kinds.HookCall) (bus.DesiredState, error) {
	call, err := kinds.OneCall(calls)
	if err != nil {
		return bus.DesiredState{}, fmt.Errorf("CompositeController %s: %w", c.CC.Name, err)
	}
	resp, ok := call.Response.(*hookapi.CompositeSyncResponse)
	if !ok {
		return bus.DesiredState{}, fmt.Errorf("CompositeController %s: a %T is not its sync response", c.CC.Name, call.Response)
	}
	return bus.DesiredState{
		Children:           resp.Children,
		Status:             resp.Status,
		ResyncAfterSeconds: resp.ResyncAfterSeconds,
		Finalized:          resp.Finalized,
	}, nil
}
