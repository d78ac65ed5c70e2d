package watcher

import (
	"context"
	"os"
	"time"

	"go.uber.org/zap"

	"github.com/metabus/metabus/pkg/leader"
)

// newElector builds the watcher's elector: a Lease in
// --leader-election-namespace (default metabus); only the holder publishes
// work items. Losing the lease stops publishing at once; the new leader
// resyncs everything, so nothing is lost in the handover.
func (w *Watcher) newElector() (*leader.Elector, error) {
	id, _ := os.Hostname()
	id += "-" + time.Now().Format("150405.000000")
	ns := w.cfg.LeaderElectionNamespace
	if ns == "" {
		ns = "metabus"
	}
	return leader.New(w.kube, leader.Config{
		Namespace:       ns,
		Name:            w.cfg.LeaderElectionID,
		Identity:        id,
		ReleaseOnCancel: true,
		LeaseDuration:   15 * time.Second,
		RenewDeadline:   10 * time.Second,
		RetryPeriod:     2 * time.Second,
		OnStartedLeading: func(context.Context) {
			w.log.Info("became leader", zap.String("identity", id))
			w.metrics.leader.Leading(w.cfg.LeaderElectionID, true)
			w.becomeLeader()
		},
		OnStoppedLeading: func() {
			w.log.Info("lost leadership", zap.String("identity", id))
			w.metrics.leader.Leading(w.cfg.LeaderElectionID, false)
			w.leader.Store(false)
			w.stopSnapshots()
		},
		Log: w.log,
	})
}

// runLeaderElection campaigns for the Lease again each time leadership
// ends, until ctx is done.
func (w *Watcher) runLeaderElection(ctx context.Context) {
	for ctx.Err() == nil {
		w.elector.Run(ctx)
	}
}
