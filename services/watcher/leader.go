package watcher

import (
	"context"
	"os"
	"time"

	"go.uber.org/zap"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
)

// runLeaderElection holds a Lease; only the holder publishes work items.
// Losing the lease stops publishing at once; the new leader resyncs
// everything, so nothing is lost in the handover.
func (w *Watcher) runLeaderElection(ctx context.Context) {
	id, _ := os.Hostname()
	id += "-" + time.Now().Format("150405.000000")
	ns := w.cfg.LeaderElectionNamespace
	if ns == "" {
		ns = "metabus"
	}
	lock := &resourcelock.LeaseLock{
		LeaseMeta:  metav1.ObjectMeta{Namespace: ns, Name: w.cfg.LeaderElectionID},
		Client:     w.kube.CoordinationV1(),
		LockConfig: resourcelock.ResourceLockConfig{Identity: id},
	}
	for ctx.Err() == nil {
		leaderelection.RunOrDie(ctx, leaderelection.LeaderElectionConfig{
			Lock:            lock,
			ReleaseOnCancel: true,
			LeaseDuration:   15 * time.Second,
			RenewDeadline:   10 * time.Second,
			RetryPeriod:     2 * time.Second,
			Callbacks: leaderelection.LeaderCallbacks{
				OnStartedLeading: func(context.Context) {
					w.log.Info("became leader", zap.String("identity", id))
					w.becomeLeader()
				},
				OnStoppedLeading: func() {
					w.log.Info("lost leadership", zap.String("identity", id))
					w.leader.Store(false)
					w.stopSnapshots()
				},
			},
		})
	}
}
