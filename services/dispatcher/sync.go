package dispatcher

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.uber.org/zap"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/metabus/metabus/pkg/bus"
	"github.com/metabus/metabus/pkg/echo"
	"github.com/metabus/metabus/pkg/jsbus"
	"github.com/metabus/metabus/pkg/kinds"
	"github.com/metabus/metabus/pkg/kindtable"
	"github.com/metabus/metabus/pkg/snapshot"
)

// syncParent syncs one parent of any controller kind, through the kind's
// Syncing seam: observe the parent, let the kind gate it (stale finalizer,
// garbage collection), run the customize hook and observe the related
// objects, skip echoes of metabus's own writes, choose the hook, call it
// (once, or once per live revision) or let the kind answer by itself, and
// publish the answer as one desired state. It settles nothing: its error
// says how the item ends (settle).
//
// The unit of work is the item: a parent, or one map key of a keyed kind's
// parent (item.MapKey). Everything below that is kept per unit (echo
// references, failures, resync timers, the hook's ETag cache) is keyed by
// the item, so the keys of one parent, which run in parallel, never share
// it.
func (d *Dispatcher) syncParent(ctx context.Context, item bus.WorkItem, seq uint64) error {
	k, ok := kindtable.Lookup(item.Controller.Kind)
	if !ok {
		d.log.Error("dropping work item for an unsupported controller kind", zap.String("kind", item.Controller.Kind))
		return settled{result: "unsupported"}
	}
	if item.Reason == bus.ReasonRelease {
		return d.release(ctx, item, seq)
	}
	item.MinResourceVersions = d.awaitAnswer(ctx, item)
	sreq, snap, err := d.observe(ctx, item, seq, k)
	if err != nil {
		return err
	}
	c, err := kindtable.Decode(snap.Controller)
	if err != nil || c.Ref().Kind != item.Controller.Kind {
		return settled{result: "invalid"}
	}
	parent := snap.Parent
	resource := snap.ParentResource
	if resource == "" {
		resource = item.Parent.Resource
	}
	// The parent as first observed is what the desired state answers to
	// (its resourceVersion is the applier's freshness floor).
	pref := parentRef(parent, resource)
	gate, err := c.SyncGate(snap)
	if err != nil {
		return failure(err)
	}
	if gate.Release != "" {
		return d.releaseStale(ctx, item, seq, gate.Release)
	}
	if gate.Skip {
		return settled{result: "skipped", forget: true}
	}
	if hook := c.SyncCustomizeHook(); hook != nil {
		rules, err := d.customizeRules(ctx, item, c, hook, snap.Controller, parent)
		if err != nil {
			return failure(err)
		}
		if snap, err = d.withRelated(ctx, item, sreq, snap, rules); err != nil {
			return err
		}
		parent = snap.Parent
	}
	// shown is what the hook would be shown, when that is objects alone
	// (not for rolling updates, whose requests also depend on revisions).
	var shown, inputs map[string]string
	if c.SyncInputsComplete() {
		shown = echo.Inputs(snap)
	}
	if c.SyncEchoable() {
		inputs = shown
		if d.echoed(ctx, item, inputs) {
			return settled{result: "echo", forget: true}
		}
	}
	if d.repeats(item, shown) {
		return settled{result: "merged", forget: true}
	}
	choice, err := c.SyncHook(snap, resource)
	if err != nil {
		return failure(err)
	}
	if choice.Hook == nil && !choice.Local {
		// Deleting or deselected with nothing to finalize: the garbage
		// collector (or nobody) takes the children.
		return settled{result: "skipped", forget: true}
	}
	calls, err := c.SyncCalls(kinds.SyncInput{Snapshot: snap, Hook: choice})
	if err != nil {
		return failure(err)
	}
	call := syncCall{
		item: item, seq: seq, parent: pref, hook: choice.Hook, kind: choice.Kind,
		ctrlType: item.Controller.Kind, ctrlName: c.Object().GetName(), endpoints: c.SyncEndpoints(),
		inputs: inputs, shown: shown,
	}
	if choice.Local {
		// The kind's own answer (an aggregated status, the deletion of a
		// detached key's outputs): no hook to call, no revisions to
		// render, published like any answer.
		ds, err := localAnswer(c, choice, calls)
		if err != nil {
			return failure(err)
		}
		return d.publishDesired(ctx, call, ds, snap, c)
	}
	revs, err := c.SyncRevisions(parent)
	if err != nil {
		return failure(err)
	}
	var ds bus.DesiredState
	if revs != nil {
		ds, err = d.syncRevisions(ctx, call, c, calls, parent, revs)
	} else {
		ds, err = d.callHooks(ctx, call, c, calls)
	}
	if err != nil {
		return err
	}
	return d.publishDesired(ctx, call, ds, snap, c)
}

// localAnswer is the desired state of a kind that answers by itself
// (kinds.HookChoice.Local): its calls come with their answers filled in
// and nothing is sent. A call carrying a request would be a hook call that
// is never made, its answer taken from whatever the kind preset: refused.
func localAnswer(k kinds.Syncing, choice kinds.HookChoice, calls []kinds.HookCall) (bus.DesiredState, error) {
	if choice.Hook != nil {
		return bus.DesiredState{}, fmt.Errorf("%s: the kind chose both a hook and its own answer", choice.Kind)
	}
	for i, c := range calls {
		if c.Request != nil {
			return bus.DesiredState{}, fmt.Errorf("%s: the kind answers by itself but built a hook request (call %d)", choice.Kind, i)
		}
	}
	ds, err := k.SyncDesired(calls)
	if err != nil {
		return bus.DesiredState{}, fmt.Errorf("%s: %w", choice.Kind, err)
	}
	return ds, nil
}

// observe fetches the parent's observed state (with its cached related
// rules), or the item's map key's for a keyed item. An error ends the
// sync: the parent is gone, its controller is gone (its finalizer, if its
// kind has one, is released), or the snapshot failed.
func (d *Dispatcher) observe(ctx context.Context, item bus.WorkItem, seq uint64, k kinds.Kind) (snapshot.Request, *snapshot.Response, error) {
	sreq := snapshot.Request{
		Controller: item.Controller, ParentUID: item.Parent.UID, MinResourceVersions: item.MinResourceVersions,
		Related: d.cachedRelated(item), MapKey: item.MapKey,
	}
	snap, err := snapshot.Fetch(ctx, d.snaps, sreq, d.cfg.SnapshotWait)
	if err != nil {
		if ctx.Err() != nil {
			return sreq, nil, cancelled()
		}
		if errors.Is(err, jsbus.ErrTooLarge) {
			// Retrying cannot help until the parent has fewer or smaller
			// children: say so on the parent, with backoff.
			return sreq, nil, failure(fmt.Errorf("observed state too large for the bus (raise the NATS server's max_payload): %w", err))
		}
		return sreq, nil, quietFailure(fmt.Errorf("observed state unavailable: %w", err))
	}
	switch snap.Result {
	case snapshot.OK:
		return sreq, snap, nil
	case snapshot.NotFound:
		// The parent is gone; the garbage collector removes its children.
		return sreq, nil, settled{result: "notfound", forget: true}
	case snapshot.ControllerGone:
		// Make sure the deleted controller's finalizer does not outlive it
		// (the watcher also asks for this; this covers an item that raced
		// with that request). A kind without a finalizer has nothing to
		// release: release settles the item then.
		d.succeeded(item)
		item.Finalizer = k.Finalizer(item.Controller.Name)
		return sreq, nil, d.release(ctx, item, seq)
	case snapshot.Retry:
		return sreq, nil, quietFailure(fmt.Errorf("observed state not fresh yet: %s", snap.Message))
	case snapshot.Invalid:
		if sreq.Related != nil {
			// The cached related rules cannot be served any more (say a
			// related resource's CRD was removed). Forget them, so that
			// the retry asks the customize hook again, and say why on the
			// parent: acking quietly would wedge it until a restart.
			d.forgetRelated(item)
			return sreq, nil, failure(fmt.Errorf("related resources cannot be observed: %s", snap.Message))
		}
		d.log.Warn("controller cannot be served", zap.String("controller", item.Controller.Name), zap.String("why", snap.Message))
		return sreq, nil, settled{result: "invalid"}
	default:
		d.log.Warn("controller cannot be served", zap.String("controller", item.Controller.Name), zap.String("why", snap.Message))
		return sreq, nil, settled{result: "invalid"}
	}
}

// release forwards a finalizer release to the applier: there is no
// controller left to ask, so no snapshot and no hook. A kind without a
// finalizer (item.Finalizer "") has nothing to release: the item is
// settled without a desired state, which would only cost the applier a
// GET of the parent.
func (d *Dispatcher) release(ctx context.Context, item bus.WorkItem, seq uint64) error {
	if item.Finalizer == "" {
		return settled{result: "skipped", forget: true}
	}
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
		return published("publish finalizer release", err)
	}
	return settled{result: "release"}
}

// releaseStale releases the finalizer of a controller that no longer has
// a finalize hook (kinds.Gate.Release). The next sync (the release is a
// write) is a normal one.
func (d *Dispatcher) releaseStale(ctx context.Context, item bus.WorkItem, seq uint64, finalizer string) error {
	d.log.Info("releasing the finalizer of a removed finalize hook", zap.String("controller", item.Controller.Name),
		zap.String("parent", item.Parent.Namespace+"/"+item.Parent.Name), zap.String("finalizer", finalizer))
	item.Finalizer = finalizer
	d.succeeded(item)
	return d.release(ctx, item, seq)
}

// echoed reports whether a work item only echoes metabus's own writes: it
// was caused by an event, and the hook would be shown what it was shown
// last time plus what the applier wrote from its answer. Such a sync is
// settled without a hook call. Retries and resyncs always call the hook (a
// failed write, or time, may have changed the answer); so does a conflict
// requeue, unless the hook has answered a later item of the parent since.
//
// A write of this process still in flight on one of the objects may be what
// the item echoes (its watch event can outrun the writer): the check waits
// for it, a few milliseconds, rather than call the hook.
func (d *Dispatcher) echoed(ctx context.Context, item bus.WorkItem, inputs map[string]string) bool {
	ctrl := item.Controller.ID()
	switch {
	case item.Reason == bus.ReasonEvent:
	case item.Reason == bus.ReasonConflict && item.AfterSeq > 0 && d.echoes.Superseded(ctrl, item.Parent.UID, item.MapKey, item.AfterSeq):
		// The requeue of an apply that conflicted while the parent kept
		// changing: the hook has answered a later change since, and
		// that answer was applied completely. Unless something else
		// changed after that call, this sync would only repeat it: a
		// burst of updates cost one such call after it.
	default:
		return false
	}
	// The parent's last hook call here failed: its retry may have found
	// the parent's queue full and been folded into this event item, and
	// the hook's last answer (what the echo compares with) was not this
	// one's. A fault run lost a finalize retry that way: the follow-up
	// event was taken for an echo and the finalizer stayed.
	if d.failures.get(d.failureKey(item)) > 0 {
		return false
	}
	for try := 0; ; try++ {
		if d.echoes.Echo(ctrl, item.Parent.UID, item.MapKey, inputs) {
			return true
		}
		wait := d.echoes.Await(ctrl, inputs)
		if wait == nil || try == 3 {
			return false
		}
		select {
		case <-wait:
		case <-time.After(time.Second):
			return false
		case <-ctx.Done():
			return false
		}
	}
}

// awaitAnswer waits, at most Config.MergeWait, until the item's previous
// answer, if this replica published it and it is still being applied, has
// been settled by an applier, and returns the item's freshness floor
// raised to what that answer's writes produced. The snapshot then shows
// the hook every write of its previous answer at once: a new parent's
// children and first status come back in one call, not one call each
// (and a further call for each intermediate state they make). Nothing is
// skipped by waiting: a change by anyone else made meanwhile is in the
// snapshot too, late by at most MergeWait. A lost Done note costs the
// wait; an answer published by another replica (a partition handed over)
// is not waited for.
func (d *Dispatcher) awaitAnswer(ctx context.Context, item bus.WorkItem) map[string]string {
	ctrl := item.Controller.ID()
	if wait := d.echoes.Applying(ctrl, item.Parent.UID, item.MapKey); wait != nil && d.cfg.MergeWait > 0 {
		start := time.Now()
		t := time.NewTimer(d.cfg.MergeWait)
		result := "applied"
		select {
		case <-wait:
		case <-t.C:
			result = "timeout"
		case <-ctx.Done():
			result = "cancelled"
		}
		t.Stop()
		d.metrics.mergeWait(result, time.Since(start))
	}
	return bus.RaisedFloor(item.MinResourceVersions, d.echoes.Written(ctrl, item.Parent.UID, item.MapKey))
}

// repeats reports whether a work item would only repeat the item's latest
// hook call: it was caused by an event, and the hook would be shown
// exactly what that call was shown (every object at the same
// resourceVersion). The event's change was in that call already (the
// snapshot reflects at least the version the watcher saw), so the item is
// merged into it rather than skipped: the hook has seen every change.
// Retries, resyncs and conflict requeues always call the hook (a failed
// write, or time, may change the answer), and so does an item whose
// latest call failed.
func (d *Dispatcher) repeats(item bus.WorkItem, shown map[string]string) bool {
	if item.Reason != bus.ReasonEvent || shown == nil || d.failures.get(d.failureKey(item)) > 0 {
		return false
	}
	return d.echoes.Shown(item.Controller.ID(), item.Parent.UID, item.MapKey, shown)
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

// parentRef describes the parent as observed.
func parentRef(parent *unstructured.Unstructured, resource string) bus.ObjectRef {
	return bus.ObjectRef{
		APIVersion:      parent.GetAPIVersion(),
		Kind:            parent.GetKind(),
		Resource:        resource,
		Namespace:       parent.GetNamespace(),
		Name:            parent.GetName(),
		UID:             string(parent.GetUID()),
		ResourceVersion: parent.GetResourceVersion(),
		Generation:      parent.GetGeneration(),
	}
}
