package mapctl

import (
	"fmt"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/metabus/metabus/pkg/api/v1alpha1"
	"github.com/metabus/metabus/pkg/apply"
	"github.com/metabus/metabus/pkg/bus"
	"github.com/metabus/metabus/pkg/hookapi"
	"github.com/metabus/metabus/pkg/kinds"
	"github.com/metabus/metabus/pkg/snapshot"
)

// A MapController sync is one of three, by the snapshot it starts from:
//
//   - a live key (the snapshot has the key's input): the map hook, shown
//     the input and the key's outputs; its answer is the key's desired
//     outputs;
//   - a detached key (no input, outputs left): the tombstone hook, or,
//     without one, metabus deletes the key's outputs (a local answer);
//   - the per-parent item (no key): the aggregated status the watcher
//     summarised from its caches (a local answer, no hook).

// SyncEndpoints are spec.endpointConfigs.
func (c *Controller) SyncEndpoints() []v1alpha1.EndpointConfig { return c.MC.Spec.EndpointConfigs }

// SyncCustomizeHook is nil: a MapController has no related objects.
func (c *Controller) SyncCustomizeHook() *v1alpha1.Hook { return nil }

// SyncGate skips a parent being deleted (the garbage collector deletes its
// outputs, and there is no finalizer to wait for) and fails a parent whose
// spec.selector cannot be used: mapping "everything" instead would create
// outputs the user did not ask for.
func (c *Controller) SyncGate(snap *snapshot.Response) (kinds.Gate, error) {
	if snap.Parent.GetDeletionTimestamp() != nil {
		return kinds.Gate{Skip: true}, nil
	}
	if snap.SelectorError != "" {
		return kinds.Gate{}, fmt.Errorf("cannot map: %s", snap.SelectorError)
	}
	return kinds.Gate{}, nil
}

// SyncEchoable is always true, whatever bus.SuppressEchoesAnnotation
// says: a map hook answers with outputs only, never a status, so the echo
// of the outputs it asked for (as this controller wrote them) tells it
// nothing, and one change of an input is one map call, as MapController's
// design intends. A change of an output by anyone else is not an echo and
// still calls it, and so does a resync. A key's answer depends only on the
// objects the hook is shown (the per-parent item is never an echo: its
// snapshot's summary is not made of object versions).
func (c *Controller) SyncEchoable() bool { return true }

// SyncInputsComplete is true: a key's request is the objects it is shown.
func (c *Controller) SyncInputsComplete() bool { return true }

// SyncHook chooses by the snapshot (see above). A detached key with no
// output left to decide about needs nothing.
func (c *Controller) SyncHook(snap *snapshot.Response, _ string) (kinds.HookChoice, error) {
	hooks := c.hooks()
	switch {
	case snap.MapKey == "":
		return kinds.HookChoice{Kind: bus.HookStatus, Local: true}, nil
	case snap.Input != nil:
		if hooks.Map == nil {
			return kinds.HookChoice{}, fmt.Errorf("%s has no map hook", c.name())
		}
		return kinds.HookChoice{Hook: hooks.Map, Kind: bus.HookMap}, nil
	case !hasLiveOutputs(snap.Children):
		return kinds.HookChoice{}, nil
	case hooks.Tombstone != nil:
		return kinds.HookChoice{Hook: hooks.Tombstone, Kind: bus.HookTombstone}, nil
	default:
		return kinds.HookChoice{Kind: bus.HookTombstone, Local: true}, nil
	}
}

// hasLiveOutputs reports whether any output is not being deleted yet.
func hasLiveOutputs(groups []snapshot.Group) bool {
	for _, g := range groups {
		for _, o := range g.Objects {
			if o.GetDeletionTimestamp() == nil {
				return true
			}
		}
	}
	return false
}

// The answers SyncCalls allocates: each holds what SyncDesired needs
// besides the hook's body, which decodes into the embedded response (the
// hook client decodes strictly, and promoted fields are the response's
// own).
type (
	// mapAnswer is a map hook call's answer.
	mapAnswer struct {
		hookapi.MapResponse
		input string // InputAnnotation of the key's input
	}
	// tombstoneAnswer is a detached key's outcome: the tombstone hook's
	// answer, or none (local: delete every output).
	tombstoneAnswer struct {
		hookapi.TombstoneResponse
		local           bool
		outputs         []snapshot.Group
		parentNamespace string
	}
	// statusAnswer is the per-parent item's aggregated status.
	statusAnswer struct {
		status map[string]any
	}
)

// SyncCalls builds the one call of a sync.
func (c *Controller) SyncCalls(in kinds.SyncInput) ([]kinds.HookCall, error) {
	snap := in.Snapshot
	switch in.Hook.Kind {
	case bus.HookStatus:
		if snap.Summary == nil {
			return nil, fmt.Errorf("%s: no status summary in the parent's snapshot", c.name())
		}
		return []kinds.HookCall{{Response: &statusAnswer{status: snap.Summary}}}, nil
	case bus.HookMap:
		ref, err := InputRefOf(snap.Input.GetAPIVersion(), snap.Input.GetKind(), snap.Input)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", c.name(), err)
		}
		if ref.Key() != snap.MapKey {
			// The watcher keys an input by its resource's discovered kind;
			// an object that disagrees is not what the key names.
			return nil, fmt.Errorf("%s: input %s/%s does not have map key %s", c.name(), ref.Namespace, ref.Name, snap.MapKey)
		}
		outputs, err := c.outputMap(in.Hook.Hook, snap)
		if err != nil {
			return nil, err
		}
		return []kinds.HookCall{{
			Request: hookapi.MapRequest{
				Controller: snap.Controller,
				Parent:     snap.Parent,
				MapKey:     snap.MapKey,
				Input:      snap.Input,
				Outputs:    outputs,
			},
			Response: &mapAnswer{input: ref.Annotation()},
		}}, nil
	case bus.HookTombstone:
		answer := &tombstoneAnswer{local: in.Hook.Local, outputs: snap.Children, parentNamespace: snap.Parent.GetNamespace()}
		if in.Hook.Local {
			return []kinds.HookCall{{Response: answer}}, nil
		}
		outputs, err := c.outputMap(in.Hook.Hook, snap)
		if err != nil {
			return nil, err
		}
		return []kinds.HookCall{{
			Request: hookapi.TombstoneRequest{
				Controller: snap.Controller,
				Parent:     snap.Parent,
				MapKey:     snap.MapKey,
				Outputs:    outputs,
			},
			Response: answer,
		}}, nil
	default:
		return nil, fmt.Errorf("%s: no %q hook", c.name(), in.Hook.Kind)
	}
}

// outputMap encodes a key's outputs for a request, keyed like a
// CompositeController's children.
func (c *Controller) outputMap(hook *v1alpha1.Hook, snap *snapshot.Response) (hookapi.ObjectMap, error) {
	outputs, _, err := kinds.ObjectMaps(hook, snap.Parent.GetNamespace() != "", &snapshot.Response{Children: snap.Children})
	if err != nil {
		return nil, fmt.Errorf("%s: %w", c.name(), err)
	}
	return outputs, nil
}

// SyncRevisions is nil: outputs never roll out.
func (c *Controller) SyncRevisions(*unstructured.Unstructured) (*kinds.Revisions, error) {
	return nil, nil
}

// SyncAsOf is never asked (no revisions).
func (c *Controller) SyncAsOf(kinds.HookCall, *unstructured.Unstructured) (kinds.HookCall, error) {
	return kinds.HookCall{}, fmt.Errorf("%s: outputs have no revisions", c.name())
}

// SyncDesired turns the one answer into the key's desired state (or the
// parent's status):
//
//   - map: the hook's outputs, its resync request, and the input they are
//     tagged with;
//   - tombstone: the kept outputs (DecideTombstone), each as metabus last
//     applied it, so applying them writes nothing; every other output of
//     the key is deleted because it is not desired;
//   - status: the aggregated status, and no outputs (the per-parent
//     snapshot holds none, so nothing is planned for them).
func (c *Controller) SyncDesired(calls []kinds.HookCall) (bus.DesiredState, error) {
	call, err := kinds.OneCall(calls)
	if err != nil {
		return bus.DesiredState{}, fmt.Errorf("%s: %w", c.name(), err)
	}
	switch a := call.Response.(type) {
	case *mapAnswer:
		return bus.DesiredState{Children: a.Outputs, ResyncAfterSeconds: a.ResyncAfterSeconds, MapInput: a.input}, nil
	case *tombstoneAnswer:
		var answer *hookapi.TombstoneResponse
		if !a.local {
			answer = &a.TombstoneResponse
		}
		d := DecideTombstone(a.outputs, answer, a.parentNamespace)
		ds := bus.DesiredState{Children: []*unstructured.Unstructured{}, MapInput: inputOf(a.outputs)}
		if ds.MapInput == "" {
			// Outputs that name no input cannot be owned as kept
			// (ApplyOwner has no input to tag them with): they are only
			// deleted, whatever the hook answered.
			return ds, nil
		}
		for _, g := range d.Keep {
			for _, o := range g.Objects {
				kept, err := asApplied(g, o)
				if err != nil {
					return bus.DesiredState{}, fmt.Errorf("%s: keep %s %s: %w", c.name(), g.Kind, o.GetName(), err)
				}
				ds.Children = append(ds.Children, kept)
			}
		}
		return ds, nil
	case *statusAnswer:
		return bus.DesiredState{Status: a.status}, nil
	default:
		return bus.DesiredState{}, fmt.Errorf("%s: a %T is not one of its answers", c.name(), call.Response)
	}
}

// inputOf is the InputAnnotation of a detached key's outputs (the first
// one that parses), "" when none does: the outputs are then only deleted.
func inputOf(groups []snapshot.Group) string {
	for _, g := range groups {
		for _, o := range g.Objects {
			v := o.GetAnnotations()[InputAnnotation]
			if _, err := ParseInputAnnotation(v); err == nil {
				return v
			}
		}
	}
	return ""
}

// asApplied is a kept output as metabus last applied it (its last-applied
// annotation), which the applier's three-way merge turns into no write at
// all. An output without one (created by something else and tagged by
// hand) is desired by identity only, which changes none of its fields.
func asApplied(g snapshot.Group, o *unstructured.Unstructured) (*unstructured.Unstructured, error) {
	last, err := apply.GetLastApplied(o)
	if err != nil {
		return nil, err
	}
	if last == nil {
		meta := map[string]any{"name": o.GetName()}
		if o.GetNamespace() != "" {
			meta["namespace"] = o.GetNamespace()
		}
		last = map[string]any{"metadata": meta}
	}
	kept := &unstructured.Unstructured{Object: last}
	kept.SetAPIVersion(g.APIVersion)
	kept.SetKind(g.Kind)
	if o.GetNamespace() != "" && kept.GetNamespace() == "" {
		kept.SetNamespace(o.GetNamespace())
	}
	return kept, nil
}
