package dispatcher

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"go.uber.org/zap"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/metabus/metabus/pkg/api/v1alpha1"
	"github.com/metabus/metabus/pkg/apply"
	"github.com/metabus/metabus/pkg/bus"
	"github.com/metabus/metabus/pkg/hooks"
	"github.com/metabus/metabus/pkg/inspect"
	"github.com/metabus/metabus/pkg/kinds"
	"github.com/metabus/metabus/pkg/snapshot"
)

// syncCall is what every sync or finalize hook call of one sync shares.
type syncCall struct {
	item      bus.WorkItem
	seq       uint64
	parent    bus.ObjectRef
	hook      *v1alpha1.Hook
	kind      string // the hook kind (bus.HookSync, HookFinalize, HookMap...)
	ctrlType  string
	ctrlName  string
	endpoints []v1alpha1.EndpointConfig
	// inputs are the objects the hook is shown, by UID (echo.Inputs), for
	// a controller that opted into echo suppression; nil for syncs that
	// must never count as echoes. They travel with the desired state.
	inputs map[string]string
	// shown are the same whatever the opt-in, nil when the request is not
	// objects alone (rolling updates): the reference a later item is
	// merged against (Dispatcher.repeats).
	shown map[string]string
}

// callHooks makes the kind's calls (one at once; several, say one per
// input object, all at the same time, so a sync costs one hook latency)
// and turns the answers into the desired state.
func (d *Dispatcher) callHooks(ctx context.Context, c syncCall, k kinds.Syncing, calls []kinds.HookCall) (bus.DesiredState, error) {
	if err := d.doHooks(ctx, c, calls, nil); err != nil {
		return bus.DesiredState{}, err
	}
	ds, err := k.SyncDesired(calls)
	if err != nil {
		return bus.DesiredState{}, failure(err)
	}
	return ds, nil
}

// doHooks calls the hook with every request of calls, decoding each answer
// into its call. revisions[i], when given, is the older revision call i
// renders the parent as of ("" for the parent as it is).
func (d *Dispatcher) doHooks(ctx context.Context, c syncCall, calls []kinds.HookCall, revisions []string) error {
	revision := func(i int) string {
		if revisions == nil {
			return ""
		}
		return revisions[i]
	}
	if len(calls) == 1 {
		if err := d.doHook(ctx, c, calls[0], revision(0)); err != nil {
			return hookError(c.kind, err)
		}
		return nil
	}
	errs := make([]error, len(calls))
	var wg sync.WaitGroup
	for i := range calls {
		wg.Go(func() { errs[i] = d.doHook(ctx, c, calls[i], revision(i)) })
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return hookError(c.kind, err)
		}
	}
	return nil
}

// doHook makes one call, recording its latency. revision keeps the hook
// response caches of a parent's revisions apart. The partition key is the
// item's (bus.ItemKey), so a hook sharded by it sees one map key's calls in
// order, as metabus makes them.
func (d *Dispatcher) doHook(ctx context.Context, c syncCall, call kinds.HookCall, revision string) error {
	start := time.Now()
	it := hooks.Item{
		Controller: c.item.Controller, ControllerName: c.ctrlName, Parent: c.parent, MapKey: c.item.MapKey,
		WorkSeq: c.seq, Endpoints: c.endpoints,
	}
	err := d.hooks.Do(ctx, it.SyncCall(c.hook, c.kind, cacheKey(c.parent.UID, c.item.MapKey, revision), call.Request), call.Response)
	took := time.Since(start)
	d.metrics.hookSeconds.WithLabelValues(c.kind).Observe(took.Seconds())
	inspect.SyncOf(ctx).Hook(c.kind, took, err)
	return err
}

// hookError is how a failed hook call ends the sync: a 429 is retried
// after its Retry-After without counting as a failure; anything else is
// reported and retried with backoff.
func hookError(kind string, err error) error {
	var tooMany *hooks.TooManyRequestsError
	if errors.As(err, &tooMany) {
		return &throttled{after: tooMany.RetryAfter, err: err}
	}
	var refused *hooks.RefusedError
	if errors.As(err, &refused) {
		if refused.Redirect != "" {
			// The hook was called; what it redirected to was refused.
			return failure(fmt.Errorf("%s hook failed: %w", kind, err))
		}
		return failure(fmt.Errorf("%s hook not called: %w", kind, err))
	}
	return failure(fmt.Errorf("%s hook failed: %w", kind, err))
}

// publishDesired completes ds (routing: controller, parent, map key, work
// sequence and hook; freshness floor, attempt, timestamps), publishes it
// before the work item is acked, and arranges the hook's
// resyncAfterSeconds for the same item (a keyed one resyncs its key).
// An answer that would write nothing against snap, the observed state the
// hook was shown, is settled without being published (unpublished).
func (d *Dispatcher) publishDesired(ctx context.Context, c syncCall, ds bus.DesiredState, snap *snapshot.Response, k kinds.Applying) error {
	minRVs := map[string]string{}
	for k, v := range c.item.MinResourceVersions {
		minRVs[k] = v
	}
	if gv, err := schema.ParseGroupVersion(c.parent.APIVersion); err == nil && c.parent.ResourceVersion != "" {
		minRVs[bus.FreshnessKey(gv.Group, c.parent.Resource)] = c.parent.ResourceVersion
	}
	ds.Controller, ds.Parent, ds.MapKey, ds.WorkSeq, ds.Hook = c.item.Controller, c.parent, c.item.MapKey, c.seq, c.kind
	ds.Observed, ds.MinResourceVersions = ObservedRefs(snap.Children), minRVs
	ds.Inputs = c.inputs
	ds.Attempt, ds.ProducedAt = d.attempt(c.item), time.Now()
	if ds.Children == nil {
		ds.Children = []*unstructured.Unstructured{}
	}
	if d.unpublished(c, &ds, snap, k) {
		inspect.SyncOf(ctx).Answer(&ds)
		d.echoes.Called(c.item.Controller.ID(), c.parent.UID, c.item.MapKey, c.seq, c.shown)
		d.resyncLater(ctx, c.item, ds.ResyncAfterSeconds)
		return settled{result: resultUnchanged, forget: true}
	}
	// The Done note of ds can come back before the publish returns (an
	// applier in this process): expect it first.
	unexpect := d.echoes.Expect(c.item.Controller.ID(), c.parent.UID, c.item.MapKey, c.seq)
	if err := d.pub.PublishDesired(ctx, ds); err != nil {
		unexpect()
		inspect.SyncOf(ctx).Answer(&ds) // what was asked for, though not published
		if errors.Is(err, nats.ErrMaxPayload) {
			// Retrying cannot help until the hook answers with less; tell
			// the user rather than redelivering into the dead-letter queue.
			return failure(fmt.Errorf("the %s hook's desired state is larger than the bus allows (max_payload): %w", c.kind, err))
		}
		return published("publish desired state", err)
	}
	inspect.SyncOf(ctx).Answer(&ds)
	// The answer is on its way: until the world changes, syncing again
	// would show the hook what it has answered (Book.Shown); with echo
	// suppression, until it changes beyond our own writes (Book.Echo).
	d.echoes.Called(c.item.Controller.ID(), c.parent.UID, c.item.MapKey, c.seq, c.shown)
	d.resyncLater(ctx, c.item, ds.ResyncAfterSeconds)
	return nil
}

// resultUnchanged is the result label (metabus_dispatcher_syncs_total) of
// a sync whose answer would write nothing, settled unpublished.
const resultUnchanged = "unchanged"

// unpublished reports whether the answer ds can be settled here without
// a desired state: applying it against snap would write nothing
// (kinds.WritesNothing, the applier's own plan) under the appliers' known
// apply strategy, so publishing it would only cost the bus a message, the
// applier a snapshot of the same parent and a Done note, for no write
// (upstream makes none either: it compares with its cache too). Not when
// the strategy is unknown, nor for a controller that opted into echo
// suppression (its Done notes carry the inputs later echoes are judged
// by), nor while an earlier answer of this replica for the item is still
// being applied (applying that one may write what this one would undo).
func (d *Dispatcher) unpublished(c syncCall, ds *bus.DesiredState, snap *snapshot.Response, k kinds.Applying) bool {
	if len(c.inputs) > 0 || k == nil {
		return false
	}
	strategy, ok := d.applierStrategy()
	if !ok {
		return false
	}
	if d.echoes.Applying(c.item.Controller.ID(), c.parent.UID, c.item.MapKey) != nil {
		return false
	}
	return kinds.WritesNothing(k, ds, snap, strategy)
}

// applierStrategy is the appliers' apply strategy: the configured one
// (the all-in-one's), else the one the appliers' Done notes agree on;
// false while unknown.
func (d *Dispatcher) applierStrategy() (apply.Strategy, bool) {
	if d.cfg.ApplyStrategy != "" {
		return d.cfg.ApplyStrategy, true
	}
	s, ok := d.echoes.ApplierStrategy()
	if !ok {
		return "", false
	}
	strategy, err := apply.ParseStrategy(s)
	if err != nil {
		return "", false // a strategy this build does not know
	}
	return strategy, true
}

// resyncLater arranges the hook's resyncAfterSeconds request (0: none) for
// item, as a fresh resync of it.
func (d *Dispatcher) resyncLater(ctx context.Context, item bus.WorkItem, seconds float64) {
	delay, ok := resyncDelay(seconds)
	if !ok {
		return
	}
	item.Reason, item.Attempt, item.EnqueuedAt = bus.ReasonResyncAfter, 0, time.Time{}
	item.MinResourceVersions = nil
	d.resyncAfter(ctx, item, delay)
}

// shortResync is the delay below which a resyncAfterSeconds request is
// timed in this process instead of through MC_SCHED, whose schedules have
// one-second granularity. A lost timer (this replica dying) costs at most
// the next resync, like any lost message.
const shortResync = 2 * time.Second

// resyncAfter arranges the hook's one-time resync request, paced per
// controller when it fires (resyncGate). An item (a
// parent, or one map key of it) has at most one pending resync per
// replica: a newer request replaces the older
// one, as a newer schedule replaces the older in MC_SCHED, so a hook that
// always asks for a resync keeps one chain going, not one per sync.
func (d *Dispatcher) resyncAfter(ctx context.Context, item bus.WorkItem, delay time.Duration) {
	if delay < shortResync {
		key := d.failureKey(item)
		d.tmu.Lock()
		defer d.tmu.Unlock()
		if old := d.timers[key]; old != nil {
			old.Stop()
		}
		var t *time.Timer
		t = time.AfterFunc(delay, func() {
			d.tmu.Lock()
			if d.timers[key] == t {
				delete(d.timers, key)
			}
			d.tmu.Unlock()
			if ctx.Err() != nil {
				return
			}
			wait, err := d.gate.admit(ctx, item.Controller.ID(), time.Now())
			if err != nil && ctx.Err() == nil {
				d.log.Warn("pace resyncAfterSeconds", zap.Error(err))
			}
			if wait > 0 {
				// Its controller has its backlog in MC_WORK: ask again
				// later (a newer request of the item replaces this one).
				d.resyncAfter(ctx, item, wait)
				return
			}
			item.EnqueuedAt = time.Now()
			if _, err := d.pub.PublishWork(ctx, item); err != nil && ctx.Err() == nil {
				d.log.Warn("publish resyncAfterSeconds", zap.Error(err))
			}
		})
		d.timers[key] = t
		return
	}
	if err := d.pub.Schedule(ctx, item, time.Now().Add(delay)); err != nil {
		d.log.Warn("schedule resyncAfterSeconds", zap.Error(err))
	}
}

// maxResyncAfter bounds a hook's resyncAfterSeconds. Longer delays gain nothing over the
// periodic resyncs, and values from about 9.2e9 s on would overflow time.Duration into a
// negative delay, which re-syncs the parent in a hot loop.
const maxResyncAfter = 24 * time.Hour

// resyncDelay converts a hook's resyncAfterSeconds into a delay, at most maxResyncAfter; ok is
// false when it asks for no resync (zero, negative or NaN).
func resyncDelay(seconds float64) (delay time.Duration, ok bool) {
	if !(seconds > 0) { // also false for NaN
		return 0, false
	}
	if seconds >= maxResyncAfter.Seconds() { // compared as float: no overflow
		return maxResyncAfter, true
	}
	return time.Duration(seconds * float64(time.Second)), true
}

// cacheKey keys an item's hook response cache (ETags): per map key, since
// each key of a parent is its own request (keys sharing an entry would
// evict each other's ETag at every call, and a 304 to one key could be
// decoded from the other's cached body), and per revision, since each
// older revision is its own request.
func cacheKey(parentUID, mapKey, revision string) string {
	key := bus.ParentToken(parentUID, mapKey)
	if revision == "" {
		return key
	}
	return key + "/" + revision
}
