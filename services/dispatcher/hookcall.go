package dispatcher

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"go.uber.org/zap"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/metabus/metabus/pkg/api/v1alpha1"
	"github.com/metabus/metabus/pkg/bus"
	"github.com/metabus/metabus/pkg/events"
	"github.com/metabus/metabus/pkg/hookapi"
	"github.com/metabus/metabus/pkg/hooks"
	"github.com/metabus/metabus/pkg/snapshot"
)

// hookVersion is the hook's request encoding (v1 unless it says v2).
func hookVersion(h *v1alpha1.Hook) v1alpha1.HookVersion {
	if h != nil && h.Version != nil && *h.Version != "" {
		return *h.Version
	}
	return v1alpha1.HookVersionV1
}

// objectMap encodes snapshot groups the way the hook version keys them;
// every group appears, even when empty.
func objectMap(version v1alpha1.HookVersion, parentNamespaced bool, groups []snapshot.Group) (hookapi.ObjectMap, error) {
	b := hookapi.NewObjectMap(version, parentNamespaced)
	for _, g := range groups {
		b.Ensure(g.APIVersion, g.Kind)
		for _, o := range g.Objects {
			if err := b.Add(o, g.Namespaced); err != nil {
				return nil, fmt.Errorf("build hook request: %w", err)
			}
		}
	}
	return b.Map(), nil
}

// hookMaps encodes a snapshot's children (attachments) and related objects
// for a hook request of the given version.
func hookMaps(version v1alpha1.HookVersion, namespaced bool, snap *snapshot.Response) (children, related hookapi.ObjectMap, err error) {
	if children, err = objectMap(version, namespaced, snap.Children); err != nil {
		return nil, nil, err
	}
	if related, err = objectMap(version, namespaced, snap.Related); err != nil {
		return nil, nil, err
	}
	return children, related, nil
}

// syncCall is one sync or finalize hook call for a parent.
type syncCall struct {
	item      bus.WorkItem
	seq       uint64
	parent    bus.ObjectRef
	hook      *v1alpha1.Hook
	kind      string // sync or finalize
	ctrlType  string
	ctrlName  string
	endpoints []v1alpha1.EndpointConfig
	request   any
	// inputs are the objects the hook is shown, by UID (echo.Inputs); nil
	// for syncs that must never count as echoes.
	inputs map[string]string
	// revision is the older revision the parent is rendered as of ("" for
	// the parent as it is); it keeps hook response caches apart.
	revision string
}

// callHook calls the hook and decodes into resp. When it returns ok=false
// the outcome is final: a 429 was rescheduled after its Retry-After
// without counting as a failure, or the failure was reported and retried
// with backoff.
func (d *Dispatcher) callHook(ctx context.Context, c syncCall, resp any) (outcome, bool) {
	if err := d.doHook(ctx, c, resp); err != nil {
		return d.hookFailed(ctx, c, err), false
	}
	return outcome{}, true
}

// doHook calls the hook and decodes into resp, recording its latency.
func (d *Dispatcher) doHook(ctx context.Context, c syncCall, resp any) error {
	start := time.Now()
	err := d.hooks.Do(ctx, hooks.Call{
		Hook:            c.hook,
		EndpointConfigs: c.endpoints,
		Kind:            c.kind,
		ControllerType:  c.ctrlType,
		ControllerName:  c.ctrlName,
		Source:          bus.ControllerSource(c.item.Controller),
		Subject:         bus.ObjectPath(c.parent),
		ID:              bus.DesiredMsgID(c.parent.UID, c.seq),
		Extensions: map[string]string{
			bus.ExtParentUID:    c.parent.UID,
			bus.ExtWorkSeq:      bus.WorkSeqString(c.seq),
			bus.ExtPartitionKey: c.item.Controller.ID() + "/" + c.parent.UID,
		},
		CacheKey: cacheKey(c),
		Request:  c.request,
	}, resp)
	d.metrics.hookSeconds.WithLabelValues(c.kind).Observe(time.Since(start).Seconds())
	return err
}

// hookFailed settles a failed hook call: a 429 is rescheduled after its
// Retry-After without counting as a failure; anything else is reported and
// retried with backoff.
func (d *Dispatcher) hookFailed(ctx context.Context, c syncCall, err error) outcome {
	var tooMany *hooks.TooManyRequestsError
	if errors.As(err, &tooMany) {
		// The hook asked us to come back later: not a failure.
		d.log.Info("hook throttled; retrying after Retry-After", zap.String("controller", c.ctrlName),
			zap.String("parent", c.parent.Namespace+"/"+c.parent.Name), zap.Duration("retryAfter", tooMany.RetryAfter))
		if serr := d.retry(ctx, c.item, time.Now().Add(tooMany.RetryAfter)); serr != nil {
			return outcome{result: "throttled", infra: true}
		}
		return outcome{result: "throttled"}
	}
	var refused *hooks.RefusedError
	if errors.As(err, &refused) {
		return d.failed(ctx, c.item, events.ReasonSyncError, fmt.Errorf("%s hook not called: %w", c.kind, err))
	}
	return d.failed(ctx, c.item, events.ReasonSyncError, fmt.Errorf("%s hook failed: %w", c.kind, err))
}

// publishDesired completes ds (freshness floor, attempt, timestamps),
// publishes it before the work item is acked, and arranges the hook's
// resyncAfterSeconds.
func (d *Dispatcher) publishDesired(ctx context.Context, c syncCall, ds bus.DesiredState, observed []snapshot.Group) outcome {
	minRVs := map[string]string{}
	for k, v := range c.item.MinResourceVersions {
		minRVs[k] = v
	}
	if gv, err := schema.ParseGroupVersion(c.parent.APIVersion); err == nil && c.parent.ResourceVersion != "" {
		minRVs[gv.Group+"/"+c.parent.Resource] = c.parent.ResourceVersion
	}
	ds.Controller, ds.Parent, ds.WorkSeq, ds.Hook = c.item.Controller, c.parent, c.seq, c.kind
	ds.Observed, ds.MinResourceVersions = ObservedRefs(observed), minRVs
	ds.Inputs = c.inputs
	ds.Attempt, ds.ProducedAt = d.attempt(c.item), time.Now()
	if ds.Children == nil {
		ds.Children = []*unstructured.Unstructured{}
	}
	if err := d.pub.PublishDesired(ctx, ds); err != nil {
		if errors.Is(err, nats.ErrMaxPayload) {
			// Retrying cannot help until the hook answers with less; tell
			// the user rather than redelivering into the dead-letter queue.
			return d.failed(ctx, c.item, events.ReasonSyncError, fmt.Errorf("the %s hook's desired state is larger than the bus allows (max_payload): %w", c.kind, err))
		}
		d.log.Warn("publish desired state", zap.Error(err))
		return outcome{result: "error", infra: true}
	}
	d.succeeded(c.item)
	// The answer is on its way: until the world changes beyond our own
	// writes, syncing again would show the hook what it has answered.
	d.echoes.Called(c.item.Controller.ID(), c.parent.UID, c.seq, c.inputs)
	if delay, ok := resyncDelay(ds.ResyncAfterSeconds); ok {
		next := c.item
		next.Reason, next.Attempt, next.EnqueuedAt = bus.ReasonResyncAfter, 0, time.Time{}
		next.MinResourceVersions = nil
		d.resyncAfter(ctx, next, delay)
	}
	return outcome{result: "ok"}
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

func cacheKey(c syncCall) string {
	if c.revision == "" {
		return c.parent.UID
	}
	return c.parent.UID + "/" + c.revision
}
