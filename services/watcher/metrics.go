package watcher

import (
	"github.com/prometheus/client_golang/prometheus"
)

type metrics struct {
	published       *prometheus.CounterVec
	controllers     prometheus.Gauge
	snapshots       *prometheus.CounterVec
	snapshotSeconds prometheus.Histogram
	echoes          prometheus.Counter
}

func newMetrics(reg prometheus.Registerer, w *Watcher) *metrics {
	m := &metrics{
		published: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "metabus_watcher_work_items_total",
			Help: "Work items the watcher published, by reason and result (queued, already_queued, error).",
		}, []string{"reason", "result"}),
		controllers: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "metabus_watcher_controllers",
			Help: "Controllers currently wired to informers.",
		}),
		snapshots: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "metabus_snapshot_requests_total",
			Help: "Snapshot requests served, by result.",
		}, []string{"result"}),
		echoes: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "metabus_watcher_echoes_dropped_total",
			Help: "Update events dropped because they were a controller's own write (an applier's Applied note listed them).",
		}),
		snapshotSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "metabus_snapshot_duration_seconds",
			Help:    "Time to serve a snapshot, including freshness waits.",
			Buckets: prometheus.ExponentialBuckets(0.0001, 4, 10),
		}),
	}
	if reg != nil {
		reg.MustRegister(m.published, m.controllers, m.snapshots, m.snapshotSeconds, m.echoes,
			prometheus.NewGaugeFunc(prometheus.GaugeOpts{
				Name: "metabus_watcher_publish_queue_depth",
				Help: "Parents waiting to be published to MC_WORK.",
			}, func() float64 { return float64(w.out.queue.Len()) }))
	}
	return m
}
