package watcher

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/client-go/util/workqueue"

	"github.com/metabus/metabus/pkg/bus"
	"github.com/metabus/metabus/pkg/busstats"
	"github.com/metabus/metabus/pkg/kindtable"
	"github.com/metabus/metabus/pkg/obs"
)

type metrics struct {
	published       *prometheus.CounterVec
	controllers     prometheus.Gauge
	snapshots       *prometheus.CounterVec
	snapshotSeconds prometheus.Histogram
	echoes          prometheus.Counter
	withheld        prometheus.Counter
	// queues count the work items stored (workqueue_adds_total).
	queues *obs.WorkQueueMetrics
	leader *obs.LeaderMetrics
	// reconciles are controller-runtime's controller_runtime_* families
	// of the controller objects' reconciles (runControllers), by kind.
	reconciles map[string]*obs.Reconciles

	// err is what failed to register (logged by New).
	err error
}

func newMetrics(reg prometheus.Registerer, w *Watcher) *metrics {
	m := &metrics{
		published: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "metabus_watcher_work_items_total",
			Help: "Work items the watcher published, by reason and result (queued; already_queued: a resync its parent's queued items cover; deferred: a change or release refused by a full parent queue, published again once there is room; error).",
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
		withheld: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "metabus_watcher_read_withheld_objects_total",
			Help: "Objects withheld from a controller's hooks because its ServiceAccount may not list and watch them: counted each time one is left out of a snapshot, or a parent's change is dropped.",
		}),
		snapshotSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "metabus_snapshot_duration_seconds",
			Help:    "Time to serve a snapshot, including freshness waits.",
			Buckets: prometheus.ExponentialBuckets(0.0001, 4, 10),
		}),
	}
	if reg != nil {
		reg.MustRegister(m.published, m.controllers, m.snapshots, m.snapshotSeconds, m.echoes, m.withheld,
			prometheus.NewGaugeFunc(prometheus.GaugeOpts{
				Name: "metabus_watcher_publish_queue_depth",
				Help: "Parents waiting to be published to MC_WORK.",
			}, func() float64 { return float64(w.out.queue.Len()) }),
			prometheus.NewGaugeFunc(prometheus.GaugeOpts{
				Name: "metabus_watcher_related_buckets",
				Help: "Namespace buckets of the related-resource index over every controller: one per resource and namespace " +
					"that some parent's customize hook currently names (what it grows with).",
			}, func() float64 { return float64(w.relatedBuckets()) }))
	}
	var errs [6]error
	m.queues, errs[0] = obs.NewWorkQueueMetrics(reg)
	// The queues of controller objects report to m.queues; they are made
	// here, before the collector reading their depth is registered.
	w.ctrlQueues = map[string]workqueue.TypedRateLimitingInterface[string]{}
	for _, k := range kindtable.Kinds {
		w.ctrlQueues[k.Name] = workqueue.NewTypedRateLimitingQueueWithConfig(
			workqueue.DefaultTypedControllerRateLimiter[string](),
			workqueue.TypedRateLimitingQueueConfig[string]{Name: obs.ReconcilerName(k.Name), MetricsProvider: m.queues.Provider(),
				Clock: obs.QueueClock()})
	}
	m.leader, errs[1] = obs.NewLeaderMetrics(reg)
	errs[2] = obs.RegisterRESTClientMetrics(reg)
	if w.nc != nil {
		errs[3] = obs.RegisterNATS(reg, "watcher", w.nc)
	}
	reconciles, err := obs.NewReconcileMetrics(reg)
	errs[4] = err
	m.reconciles = map[string]*obs.Reconciles{}
	for _, k := range kindtable.Kinds {
		// One worker: runControllers.
		m.reconciles[k.Name] = reconciles.Controller(obs.ReconcilerName(k.Name), 1)
	}
	errs[5] = obs.RegisterUnservedUpstreamMetrics(reg)
	m.err = errors.Join(errs[:]...)
	if w.js != nil {
		// The bus's state, reported by the leading watcher only (one
		// process per installation, whose controllers are the ones it
		// wired).
		stats := busstats.NewCollector(w.js, busstats.CollectorOptions{
			Active:      w.leader.Load,
			Controllers: w.controllerRefs,
			LocalQueues: w.controllerQueueDepths,
			Log:         w.log,
		})
		m.err = errors.Join(m.err, stats.Register(reg))
	}
	return m
}

// queued is the work publisher's Queued hook: a work item stored.
func (m *metrics) queued(item bus.WorkItem) {
	m.queues.Added(obs.QueueName(item.Controller.Kind, item.Controller.Name))
}

// controllerRefs lists the controllers this watcher has wired.
func (w *Watcher) controllerRefs() []bus.ControllerRef {
	w.mu.RLock()
	defer w.mu.RUnlock()
	out := make([]bus.ControllerRef, 0, len(w.wirings))
	for _, wr := range w.wirings {
		out = append(out, wr.ref)
	}
	return out
}

// controllerQueueDepths returns the items waiting in the queues of
// controller objects, by queue name.
func (w *Watcher) controllerQueueDepths() map[string]int {
	out := make(map[string]int, len(w.ctrlQueues))
	for kind, q := range w.ctrlQueues {
		out[obs.ReconcilerName(kind)] = q.Len()
	}
	return out
}
