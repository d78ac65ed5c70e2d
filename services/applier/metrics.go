package applier

import (
	"errors"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/metabus/metabus/pkg/obs"
)

type metrics struct {
	applies      *prometheus.CounterVec
	applySeconds *prometheus.HistogramVec
	writes       *prometheus.CounterVec
	rejected     prometheus.Counter
	// statusDeferred counts status writes left to the sync that the
	// children created by the same apply cause.
	statusDeferred prometheus.Counter
	// partitions count this replica's partition ownership.
	partitions *obs.PartitionMetrics

	// err is what failed to register (logged by New).
	err error
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		applies: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "metabus_applier_applies_total",
			Help: "Desired states handled, by controller and result (ok, noop, superseded, conflict, error...).",
		}, []string{"controller_type", "controller", "result"}),
		applySeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "metabus_applier_apply_duration_seconds",
			Help:    "Time to apply one desired state.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 3, 12),
		}, []string{"result"}),
		writes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "metabus_applier_api_writes_total",
			Help: "Kubernetes API writes, by verb and resource.",
		}, []string{"verb", "resource"}),
		rejected: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "metabus_applier_rejected_desired_states_total",
			Help: "Hook responses rejected as a whole by validation.",
		}),
		statusDeferred: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "metabus_applier_status_writes_deferred_total",
			Help: "Parent status writes left to the next sync, because the same apply created children (whose events bring that sync).",
		}),
	}
	if reg != nil {
		reg.MustRegister(m.applies, m.applySeconds, m.writes, m.rejected, m.statusDeferred)
	}
	var errs [2]error
	m.partitions, errs[0] = obs.NewPartitionMetrics(reg)
	errs[1] = obs.RegisterRESTClientMetrics(reg)
	m.err = errors.Join(errs[:]...)
	return m
}

// watchNATS exports whether nc is connected.
func (m *metrics) watchNATS(reg prometheus.Registerer, nc *nats.Conn) {
	if nc == nil {
		return
	}
	m.err = errors.Join(m.err, obs.RegisterNATS(reg, "applier", nc))
}
