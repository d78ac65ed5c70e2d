package dispatcher

import "github.com/prometheus/client_golang/prometheus"

type metrics struct {
	syncs        *prometheus.CounterVec
	syncSeconds  *prometheus.HistogramVec
	hookSeconds  *prometheus.HistogramVec
	queueLatency prometheus.Histogram
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		syncs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "metabus_dispatcher_syncs_total",
			Help: "Work items handled, by controller kind and result.",
		}, []string{"controller_type", "result"}),
		syncSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "metabus_dispatcher_sync_duration_seconds",
			Help:    "Time from picking up a work item to settling it.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 3, 12),
		}, []string{"result"}),
		hookSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "metabus_dispatcher_hook_duration_seconds",
			Help:    "Hook call latency as the dispatcher sees it.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 3, 12),
		}, []string{"hook"}),
		queueLatency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "metabus_dispatcher_queue_latency_seconds",
			Help:    "Time from the watcher enqueuing a work item to a dispatcher picking it up.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 3, 14),
		}),
	}
	if reg != nil {
		reg.MustRegister(m.syncs, m.syncSeconds, m.hookSeconds, m.queueLatency)
	}
	return m
}
