package watcher

import (
	"context"
	"fmt"

	"github.com/nats-io/nats.go/micro"
	"go.uber.org/zap"

	"github.com/metabus/metabus/pkg/bus"
	"github.com/metabus/metabus/pkg/jsbus"
	"github.com/metabus/metabus/pkg/snapshot"
)

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
					err := jsbus.RespondJSON(r, "snapshot", func(req snapshot.Request) any {
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
