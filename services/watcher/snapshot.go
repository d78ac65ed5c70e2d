package watcher

import (
	"context"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/micro"
	"go.uber.org/zap"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/metabus/metabus/pkg/bus"
	"github.com/metabus/metabus/pkg/discovery"
	"github.com/metabus/metabus/pkg/informers"
	"github.com/metabus/metabus/pkg/snapshot"
)

// Snapshot answers from the informer caches. It implements snapshot.Source
// for in-process callers; the NATS service wraps it.
func (w *Watcher) Snapshot(ctx context.Context, req snapshot.Request) (*snapshot.Response, error) {
	start := time.Now()
	resp := w.snapshot(ctx, req)
	w.metrics.snapshots.WithLabelValues(resp.Result).Inc()
	w.metrics.snapshotSeconds.Observe(time.Since(start).Seconds())
	return resp, nil
}

func (w *Watcher) snapshot(ctx context.Context, req snapshot.Request) *snapshot.Response {
	id := req.Controller.ID()
	w.mu.RLock()
	wr := w.wirings[id]
	h := w.ctrlHandles[req.Controller.Kind]
	w.mu.RUnlock()
	if wr == nil {
		if h == nil || !h.HasSynced() {
			return &snapshot.Response{Result: snapshot.Retry, Message: "controllers not synced yet"}
		}
		// A controller that exists but is not wired yet (just created, or
		// failing to wire) is worth retrying; one that is gone is not.
		u, exists := w.controllerObject(req.Controller.Kind, req.Controller.Name)
		if !exists {
			return &snapshot.Response{Result: snapshot.ControllerGone, Message: "controller " + id + " was deleted"}
		}
		if !w.targets.Matches(labels.Set(u.GetLabels())) {
			return &snapshot.Response{Result: snapshot.NotFound, Message: "controller " + id + " is not served by this installation"}
		}
		return &snapshot.Response{Result: snapshot.Retry, Message: "controller not wired yet"}
	}
	return wr.snapshot(ctx, req)
}

// waitFresh waits until every informer named in the request has delivered
// the requested resourceVersion (bounded by SnapshotWait).
func (w *Watcher) waitFresh(ctx context.Context, req snapshot.Request, handleFor func(string) *informers.Handle) (bool, string) {
	if len(req.MinResourceVersions) == 0 {
		return true, ""
	}
	wctx, cancel := context.WithTimeout(ctx, w.cfg.SnapshotWait)
	defer cancel()
	for key, rv := range req.MinResourceVersions {
		h := handleFor(key)
		if h == nil {
			continue // not a resource of this controller (any more)
		}
		if !h.WaitSeen(wctx, rv) {
			return false, fmt.Sprintf("cache of %s has not reached resourceVersion %s", key, rv)
		}
	}
	return true, ""
}

// snapshot of a parent of any kind: the parent, its owned objects per
// owned resource in spec order (as the kind's core claims them), and the
// objects its related rules select.
func (wr *wiring) snapshot(ctx context.Context, req snapshot.Request) *snapshot.Response {
	w := wr.w
	w.mu.RLock()
	ctrl := wr.obj
	w.mu.RUnlock()
	for _, h := range wr.parents {
		if !h.HasSynced() {
			return &snapshot.Response{Result: snapshot.Retry, Message: "parent cache " + h.GVR().String() + " not synced"}
		}
	}
	for _, h := range wr.owned {
		if !h.HasSynced() {
			return &snapshot.Response{Result: snapshot.Retry, Message: "owned cache " + h.GVR().String() + " not synced"}
		}
	}
	var rules []relatedRule
	if req.Related != nil {
		var err error
		if rules, err = wr.related.register(req.Related); err != nil {
			return &snapshot.Response{Result: snapshot.Invalid, Message: "related resources: " + err.Error()}
		}
	}
	if ok, msg := w.waitFresh(ctx, req, wr.handleFor); !ok {
		return &snapshot.Response{Result: snapshot.Retry, Message: msg}
	}
	var (
		parent    *unstructured.Unstructured
		parentRes *discovery.Resource
	)
	for i, h := range wr.parents {
		if obj, ok := h.ByUID(req.ParentUID); ok {
			parent, parentRes = obj, wr.plan.Parents[i].Res
			break
		}
	}
	if parent == nil {
		return &snapshot.Response{Result: snapshot.NotFound, Message: "parent " + req.ParentUID + " not found"}
	}
	resp := &snapshot.Response{
		Result:          snapshot.OK,
		Controller:      ctrl,
		Parent:          parent,
		ParentResource:  parentRes.GVR.Resource,
		ParentHasStatus: parentRes.HasStatus,
	}
	resp.Children, resp.SelectorError = wr.plan.Rules.Observe(parentRes, parent, wr.caches)
	if len(rules) > 0 {
		groups, ok := wr.related.snapshot(rules)
		if !ok {
			return &snapshot.Response{Result: snapshot.Retry, Message: "related caches not synced yet"}
		}
		resp.Related = groups
	}
	return resp
}

// startSnapshots serves snapshots from this replica, which has just become
// the leader. Only the leader serves them: a work item refused as already
// queued loses its MinResourceVersions (the queued item keeps older ones),
// so a follower whose cache lags the leader's could answer that item with
// a state older than the change behind it, and the change would wait for
// the next cache flush (issue #13, defect 6). The leader's cache has seen
// every event it published or folded into a queued item.
func (w *Watcher) startSnapshots() {
	w.snaps.mu.Lock()
	defer w.snaps.mu.Unlock()
	if w.snaps.ctx == nil || w.snaps.stop != nil {
		return
	}
	stop, err := w.serveSnapshots(w.snaps.ctx)
	if err != nil {
		// Without the service no parent syncs: a readiness failure
		// would be visible, a log line alone is not enough.
		w.log.Error("cannot serve snapshots", zap.Error(err))
		w.health.SetReady("snapshots", func() error { return err })
		return
	}
	w.health.SetReady("snapshots", func() error { return nil })
	w.snaps.stop = stop
}

// stopSnapshots stops serving snapshots (leadership lost, or shutdown).
func (w *Watcher) stopSnapshots() {
	w.snaps.mu.Lock()
	defer w.snaps.mu.Unlock()
	if w.snaps.stop != nil {
		w.snaps.stop()
		w.snaps.stop = nil
	}
}

// serveSnapshots registers the snapshot micro service. Each request runs in
// its own goroutine (bounded): a request waiting for cache freshness must
// not hold up the others, and micro calls handlers serially.
func (w *Watcher) serveSnapshots(ctx context.Context) (func(), error) {
	sem := make(chan struct{}, 256)
	svc, err := micro.AddService(w.nc, micro.Config{
		Name:        bus.SnapshotServiceName,
		Version:     "0.1.0",
		Description: "observed-state snapshots from the watcher's informer caches",
		QueueGroup:  bus.SnapshotQueue,
		Endpoint: &micro.EndpointConfig{
			Subject: bus.SnapshotSubject,
			Handler: micro.HandlerFunc(func(r micro.Request) {
				sem <- struct{}{}
				go func() {
					defer func() { <-sem }()
					err := bus.RespondJSON(r, "snapshot", func(req snapshot.Request) any {
						resp, _ := w.Snapshot(ctx, req)
						return resp
					})
					if err != nil {
						w.log.Warn("snapshot request not answered", zap.Error(err))
					}
				}()
			}),
		},
	})
	if err != nil {
		return nil, fmt.Errorf("register snapshot service: %w", err)
	}
	return func() { _ = svc.Stop() }, nil
}
