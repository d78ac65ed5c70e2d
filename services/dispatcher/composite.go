package dispatcher

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.uber.org/zap"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/metabus/metabus/pkg/api/v1alpha1"
	"github.com/metabus/metabus/pkg/bus"
	"github.com/metabus/metabus/pkg/composite"
	"github.com/metabus/metabus/pkg/echo"
	"github.com/metabus/metabus/pkg/events"
	"github.com/metabus/metabus/pkg/hookapi"
	"github.com/metabus/metabus/pkg/revision"
	"github.com/metabus/metabus/pkg/rollout"
	"github.com/metabus/metabus/pkg/snapshot"
)

func (d *Dispatcher) sync(ctx context.Context, item bus.WorkItem, seq uint64) outcome {
	switch item.Controller.Kind {
	case v1alpha1.CompositeControllerKind:
		return d.syncComposite(ctx, item, seq)
	case v1alpha1.DecoratorControllerKind:
		return d.syncDecorator(ctx, item, seq)
	default:
		d.log.Error("dropping work item for an unsupported controller kind", zap.String("kind", item.Controller.Kind))
		return outcome{result: "unsupported"}
	}
}

// ObservedRefs lists the identities of the children a hook was shown.
func ObservedRefs(groups []snapshot.Group) []bus.ObjectRef {
	var refs []bus.ObjectRef
	for _, g := range groups {
		for _, o := range g.Objects {
			refs = append(refs, bus.ObjectRef{
				APIVersion: g.APIVersion, Kind: g.Kind, Resource: g.Resource,
				Namespace: o.GetNamespace(), Name: o.GetName(), UID: string(o.GetUID()),
				ResourceVersion: o.GetResourceVersion(),
			})
		}
	}
	return refs
}

// observe handles finalizer releases and fetches the parent's observed
// state (with its cached related rules). ok is false when the item is
// settled without a hook call; out says how. finalizer is the controller's
// finalizer name, released when the controller turns out to be gone.
func (d *Dispatcher) observe(ctx context.Context, item bus.WorkItem, seq uint64, finalizer string) (snapshot.Request, *snapshot.Response, outcome, bool) {
	if item.Reason == bus.ReasonRelease {
		return snapshot.Request{}, nil, d.release(ctx, item, seq), false
	}
	sreq := snapshot.Request{
		Controller: item.Controller, ParentUID: item.Parent.UID, MinResourceVersions: item.MinResourceVersions,
		Related: d.cachedRelated(item),
	}
	snap, err := snapshot.Fetch(ctx, d.snaps, sreq, d.cfg.SnapshotWait)
	if err != nil {
		if ctx.Err() != nil {
			return sreq, nil, outcome{result: "cancelled", infra: true}, false
		}
		if errors.Is(err, bus.ErrTooLarge) {
			// Retrying cannot help until the parent has fewer or smaller
			// children: say so on the parent, with backoff.
			return sreq, nil, d.failed(ctx, item, events.ReasonSyncError, fmt.Errorf("observed state too large for the bus (raise the NATS server's max_payload): %w", err)), false
		}
		return sreq, nil, d.failedQuietly(ctx, item, fmt.Errorf("observed state unavailable: %w", err)), false
	}
	switch snap.Result {
	case snapshot.OK:
		return sreq, snap, outcome{}, true
	case snapshot.NotFound:
		// The parent is gone; the garbage collector removes its children.
		d.succeeded(item)
		return sreq, nil, outcome{result: "notfound"}, false
	case snapshot.ControllerGone:
		// Make sure the deleted controller's finalizer does not outlive it
		// (the watcher also asks for this; this covers an item that raced
		// with that request).
		d.succeeded(item)
		item.Finalizer = finalizer
		return sreq, nil, d.release(ctx, item, seq), false
	case snapshot.Retry:
		return sreq, nil, d.failedQuietly(ctx, item, fmt.Errorf("observed state not fresh yet: %s", snap.Message)), false
	case snapshot.Invalid:
		if sreq.Related != nil {
			// The cached related rules cannot be served any more (say a
			// related resource's CRD was removed). Forget them, so that
			// the retry asks the customize hook again, and say why on the
			// parent: acking quietly would wedge it until a restart.
			d.forgetRelated(item)
			return sreq, nil, d.failed(ctx, item, events.ReasonSyncError, fmt.Errorf("related resources cannot be observed: %s", snap.Message)), false
		}
		d.log.Warn("controller cannot be served", zap.String("controller", item.Controller.Name), zap.String("why", snap.Message))
		return sreq, nil, outcome{result: "invalid"}, false
	default:
		d.log.Warn("controller cannot be served", zap.String("controller", item.Controller.Name), zap.String("why", snap.Message))
		return sreq, nil, outcome{result: "invalid"}, false
	}
}

func (d *Dispatcher) syncComposite(ctx context.Context, item bus.WorkItem, seq uint64) outcome {
	sreq, snap, out, ok := d.observe(ctx, item, seq, composite.Finalizer(item.Controller.Name))
	if !ok {
		return out
	}
	cc, err := composite.Decode(snap.Controller)
	if err != nil {
		return outcome{result: "invalid"}
	}
	parent := snap.Parent
	pref := parentRef(parent, item.Parent)
	if stale := composite.Finalizer(cc.Name); composite.ControllerFinalizer(cc) == "" && composite.HasFinalizer(parent, stale) {
		return d.releaseStale(ctx, item, seq, stale)
	}
	if composite.WaitingForGC(parent) {
		d.succeeded(item)
		return outcome{result: "skipped"}
	}

	if snap.SelectorError != "" {
		return d.failed(ctx, item, events.ReasonSyncError, fmt.Errorf("cannot sync: %s", snap.SelectorError))
	}
	if cc.Spec.Hooks != nil && cc.Spec.Hooks.Customize != nil {
		rules, err := d.relatedRules(ctx, item, cc, snap.Controller, parent)
		if err != nil {
			return d.failed(ctx, item, events.ReasonSyncError, err)
		}
		var out outcome
		if snap, out = d.withRelated(ctx, item, sreq, snap, rules); snap == nil {
			return out
		}
		parent = snap.Parent
	}
	rolling := rollout.HasRolling(cc)
	var inputs map[string]string
	if !rolling {
		// A rolling parent's sync also depends on its ControllerRevisions,
		// which the inputs do not cover: it is never an echo.
		inputs = echo.Inputs(snap)
		if d.echoed(ctx, item, inputs) {
			return outcome{result: "echo"}
		}
	}
	hook, kind, finalizing := composite.ChooseHook(cc, parent)
	if hook == nil {
		if kind == "" {
			// Deleting (or deselected) without a finalize hook: nothing to
			// do, the garbage collector takes the children.
			d.succeeded(item)
			return outcome{result: "skipped"}
		}
		return d.failed(ctx, item, events.ReasonSyncError, fmt.Errorf("CompositeController %s has no %s hook", cc.Name, kind))
	}
	children, relatedMap, err := hookMaps(hookVersion(hook), parent.GetNamespace() != "", snap)
	if err != nil {
		return d.failed(ctx, item, events.ReasonSyncError, err)
	}
	call := syncCall{
		item: item, seq: seq, parent: pref, hook: hook, kind: kind,
		ctrlType: v1alpha1.CompositeControllerKind, ctrlName: cc.Name, endpoints: cc.Spec.EndpointConfigs,
		inputs: inputs,
		request: hookapi.CompositeSyncRequest{
			Controller: snap.Controller,
			Parent:     parent,
			Children:   children,
			Related:    relatedMap,
			Finalizing: finalizing,
		},
	}
	var history *revision.History
	if rolling {
		var out outcome
		if history, out, ok = d.history(ctx, call, cc, parent); !ok {
			return out
		}
	}
	if history != nil {
		ds, out, ok := d.syncRevisions(ctx, call, cc, parent, history)
		if !ok {
			return out
		}
		return d.publishDesired(ctx, call, ds, snap.Children)
	}
	var resp hookapi.CompositeSyncResponse
	if out, ok := d.callHook(ctx, call, &resp); !ok {
		return out
	}
	ds := bus.DesiredState{
		Children:           resp.Children,
		Status:             resp.Status,
		ResyncAfterSeconds: resp.ResyncAfterSeconds,
		Finalized:          resp.Finalized,
	}
	return d.publishDesired(ctx, call, ds, snap.Children)
}

// release forwards a finalizer release to the applier: there is no
// controller left to ask, so no snapshot and no hook.
func (d *Dispatcher) release(ctx context.Context, item bus.WorkItem, seq uint64) outcome {
	ds := bus.DesiredState{
		Controller: item.Controller,
		Parent:     item.Parent,
		WorkSeq:    seq,
		Hook:       bus.HookRelease,
		Finalizer:  item.Finalizer,
		Children:   []*unstructured.Unstructured{},
		ProducedAt: time.Now(),
	}
	if err := d.pub.PublishDesired(ctx, ds); err != nil {
		d.log.Warn("publish finalizer release", zap.Error(err))
		return outcome{result: "error", infra: true}
	}
	return outcome{result: "release"}
}

// releaseStale releases the finalizer of a controller that no longer has
// a finalize hook. The watcher asks for it when the hook is removed, but
// that one request can be lost (refused as already queued, dead-lettered);
// every sync of a parent still carrying the finalizer asks again, so the
// release is derived from the cluster, and a deleted parent never hangs in
// Terminating. The next sync (the release is a write) is a normal one.
func (d *Dispatcher) releaseStale(ctx context.Context, item bus.WorkItem, seq uint64, finalizer string) outcome {
	d.log.Info("releasing the finalizer of a removed finalize hook", zap.String("controller", item.Controller.Name),
		zap.String("parent", item.Parent.Namespace+"/"+item.Parent.Name), zap.String("finalizer", finalizer))
	item.Finalizer = finalizer
	d.succeeded(item)
	return d.release(ctx, item, seq)
}

// failedQuietly is failed without an Event: the parent did nothing wrong.
func (d *Dispatcher) failedQuietly(ctx context.Context, item bus.WorkItem, err error) outcome {
	return d.failed(ctx, item, "", err)
}

// parentRef describes the parent as observed.
func parentRef(parent *unstructured.Unstructured, from bus.ObjectRef) bus.ObjectRef {
	return bus.ObjectRef{
		APIVersion:      parent.GetAPIVersion(),
		Kind:            parent.GetKind(),
		Resource:        from.Resource,
		Namespace:       parent.GetNamespace(),
		Name:            parent.GetName(),
		UID:             string(parent.GetUID()),
		ResourceVersion: parent.GetResourceVersion(),
		Generation:      parent.GetGeneration(),
	}
}
