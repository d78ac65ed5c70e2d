package revisions

import (
	"errors"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/metabus/metabus/pkg/obs"
)

type metrics struct {
	requests *prometheus.CounterVec
	seconds  *prometheus.HistogramVec
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "metabus_revisions_requests_total",
			Help: "Revisions requests served, by op (load, commit) and result (ok, conflict, invalid, error).",
		}, []string{"op", "result"}),
		seconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "metabus_revisions_request_duration_seconds",
			Help:    "Time to serve a revisions request, API calls included.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 3, 12),
		}, []string{"op"}),
	}
	if reg != nil {
		reg.MustRegister(m.requests, m.seconds)
	}
	return m
}

// registerProcess exports client-go's API request counter and whether nc
// is connected.
func (m *metrics) registerProcess(reg prometheus.Registerer, nc *nats.Conn) error {
	err := obs.RegisterRESTClientMetrics(reg)
	if nc != nil {
		err = errors.Join(err, obs.RegisterNATS(reg, "revisions", nc))
	}
	return err
}
