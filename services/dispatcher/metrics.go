package dispatcher

import (
	"errors"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/metabus/metabus/pkg/bus"
	"github.com/metabus/metabus/pkg/obs"
)

type metrics struct {
	syncs        *prometheus.CounterVec
	syncSeconds  *prometheus.HistogramVec
	hookSeconds  *prometheus.HistogramVec
	queueLatency prometheus.Histogram
	// mergeWaits time the waits for an item's previous answer to be
	// applied (Dispatcher.awaitAnswer), by how they ended.
	mergeWaits *prometheus.HistogramVec
	// putOff counts the work items put off beyond their controller's
	// headroom (--max-held-per-controller), by controller.
	putOff *prometheus.CounterVec
	// queues are upstream's workqueue_* families for the controllers'
	// work items (obs.WorkQueueMetrics says what each means on the bus).
	queues *obs.WorkQueueMetrics
	// partitions count this replica's partition ownership.
	partitions *obs.PartitionMetrics

	// retrying holds, per MC_WORK sequence, the delivery count of a work
	// item whose sync asked for an in-place retry (bus failure): its next
	// run is that retry, counted already, not a new delivery.
	rmu      sync.Mutex
	retrying map[uint64]uint64

	// err is what failed to register (logged by New).
	err error
}

// maxRetrying bounds metrics.retrying: an entry whose retry never runs here
// (the partition moved to another replica meanwhile) is otherwise never
// removed. Dropping them all only risks counting a few retries twice.
const maxRetrying = 4096

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		syncs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "metabus_dispatcher_syncs_total",
			Help: "Work items handled, by controller and result.",
		}, []string{"controller_type", "controller", "result"}),
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
		mergeWaits: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "metabus_dispatcher_merge_wait_seconds",
			Help: "Time a sync waited for its item's previous answer to be applied (--merge-wait), by result: " +
				"applied, timeout (the bound held it back) or cancelled.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 3, 12),
		}, []string{"result"}),
		putOff: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "metabus_dispatcher_put_off_total",
			Help: "Work items put off (scheduled again in MC_SCHED) because their controller held --max-held-per-controller of " +
				"their MC_WORK partition, by controller.",
		}, []string{"controller_type", "controller"}),
		retrying: map[uint64]uint64{},
	}
	if reg != nil {
		reg.MustRegister(m.syncs, m.syncSeconds, m.hookSeconds, m.queueLatency, m.mergeWaits, m.putOff)
	}
	var errs [3]error
	m.queues, errs[0] = obs.NewWorkQueueMetrics(reg)
	m.partitions, errs[1] = obs.NewPartitionMetrics(reg)
	errs[2] = obs.RegisterRESTClientMetrics(reg)
	m.err = errors.Join(errs[:]...)
	return m
}

// watchNATS exports whether nc is connected.
func (m *metrics) watchNATS(reg prometheus.Registerer, nc *nats.Conn) {
	if nc == nil {
		return
	}
	m.err = errors.Join(m.err, obs.RegisterNATS(reg, "dispatcher", nc))
}

// mergeWait records one wait for an item's previous answer.
func (m *metrics) mergeWait(result string, d time.Duration) {
	m.mergeWaits.WithLabelValues(result).Observe(d.Seconds())
}

// queued is the work publisher's Queued hook: a work item stored.
func (m *metrics) queued(item bus.WorkItem) {
	m.queues.Added(queueOf(item.Controller))
}

func queueOf(c bus.ControllerRef) string { return obs.QueueName(c.Kind, c.Name) }

// delivered records the start of a run of the item at seq, delivered
// delivered times, and reports whether it is a new delivery (not an
// in-place retry of the previous run).
func (m *metrics) delivered(seq, delivered uint64) bool {
	m.rmu.Lock()
	defer m.rmu.Unlock()
	if n, ok := m.retrying[seq]; ok {
		delete(m.retrying, seq)
		if n == delivered {
			return false
		}
	}
	return true
}

// retryInPlace records that the item at seq will run again in place.
func (m *metrics) retryInPlace(seq, delivered uint64) {
	m.rmu.Lock()
	defer m.rmu.Unlock()
	if len(m.retrying) >= maxRetrying {
		clear(m.retrying)
	}
	m.retrying[seq] = delivered
}
