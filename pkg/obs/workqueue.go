package obs

import (
	"errors"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/utils/clock"
)

// QueueName is the workqueue_* name of a controller's work queue, as
// upstream Metacontroller names its per-controller queues:
// "<Kind>-<name>" ("CompositeController-foo", "DecoratorController-bar";
// metabus's MapControllers likewise "MapController-baz").
func QueueName(kind, name string) string { return kind + "-" + name }

// WorkQueueMetrics are the work-queue families upstream dashboards read
// (client-go's workqueue metrics under the names, labels and buckets that
// controller-runtime v0.24.1 gives them, pkg/internal/metrics/workqueue.go;
// both labels name and controller carry the queue name), mapped onto the
// bus. A controller's queue is its work items in MC_WORK:
//
//   - workqueue_adds_total: work items stored in MC_WORK (by the watcher,
//     the schedule relay, a dispatcher's immediate resync); a publish the
//     stream refuses because the parent is already queued is not an add,
//     as a duplicate Add of a queued key is not one in client-go;
//   - workqueue_queue_duration_seconds: from a work item's publication to
//     the start of its sync in a dispatcher;
//   - workqueue_work_duration_seconds: a dispatcher's sync of one item
//     (snapshot, hook calls, publishing the desired state); the applier's
//     writes are the next stage's (metabus_applier_*);
//   - workqueue_retries_total: backoff requeues after a failed or
//     throttled sync (scheduled through MC_SCHED), in-place retries after
//     the bus or snapshot service failed, and redeliveries by the server
//     (a delivery attempt after the first);
//   - workqueue_unfinished_work_seconds and
//     workqueue_longest_running_processor_seconds: over the syncs running
//     in this dispatcher replica, computed when scraped;
//   - workqueue_depth is read from the stream, not counted here (package
//     busstats).
//
// Provider reports the process's own in-memory client-go queues under the
// same families (the watcher's queues of controller objects).
//
// Every process counts what it does; sum over processes by name.
type WorkQueueMetrics struct {
	adds, retries               *prometheus.CounterVec
	queueDuration, workDuration *prometheus.HistogramVec
	running                     *runningWork
}

// workQueueBuckets are controller-runtime's: 10ns to 1000s.
var workQueueBuckets = prometheus.ExponentialBuckets(10e-9, 10, 12)

// NewWorkQueueMetrics registers the families with reg (nil: none are
// exported, the methods still work).
func NewWorkQueueMetrics(reg prometheus.Registerer) (*WorkQueueMetrics, error) {
	labels := []string{"name", "controller"}
	hist := func(name, help string) *prometheus.HistogramVec {
		return prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Subsystem: "workqueue", Name: name, Help: help, Buckets: workQueueBuckets,
			NativeHistogramBucketFactor:     1.1,
			NativeHistogramMaxBucketNumber:  100,
			NativeHistogramMinResetDuration: time.Hour,
		}, labels)
	}
	m := &WorkQueueMetrics{}
	var errs [5]error
	m.adds, errs[0] = Register(reg, prometheus.NewCounterVec(prometheus.CounterOpts{
		Subsystem: "workqueue", Name: "adds_total",
		Help: "Work items stored in MC_WORK for the controller (duplicates of an already queued parent are not adds).",
	}, labels))
	m.retries, errs[1] = Register(reg, prometheus.NewCounterVec(prometheus.CounterOpts{
		Subsystem: "workqueue", Name: "retries_total",
		Help: "Work items retried: backoff requeues after failed or throttled syncs, in-place retries after bus failures, and redeliveries.",
	}, labels))
	m.queueDuration, errs[2] = Register(reg, hist("queue_duration_seconds",
		"Seconds from a work item's publication to the start of its sync."))
	m.workDuration, errs[3] = Register(reg, hist("work_duration_seconds",
		"Seconds a dispatcher's sync of one work item takes (snapshot, hook calls, publishing the desired state)."))
	m.running, errs[4] = Register(reg, newRunningWork())
	return m, errors.Join(errs[:]...)
}

// Added counts a work item stored for queue.
func (m *WorkQueueMetrics) Added(queue string) {
	if m != nil {
		m.adds.WithLabelValues(queue, queue).Inc()
	}
}

// Retried counts a retry of a work item of queue.
func (m *WorkQueueMetrics) Retried(queue string) {
	if m != nil {
		m.retries.WithLabelValues(queue, queue).Inc()
	}
}

// RetriesCounter is queue's workqueue_retries_total (tests read it).
func (m *WorkQueueMetrics) RetriesCounter(queue string) prometheus.Counter {
	return m.retries.WithLabelValues(queue, queue)
}

// Waited records that a work item of queue waited d from its publication
// to the start of its sync.
func (m *WorkQueueMetrics) Waited(queue string, d time.Duration) {
	if m != nil {
		m.queueDuration.WithLabelValues(queue, queue).Observe(max(d, 0).Seconds())
	}
}

// Started records the start of a sync of a work item of queue; done
// records its end.
func (m *WorkQueueMetrics) Started(queue string) (done func()) {
	if m == nil {
		return func() {}
	}
	begin := time.Now()
	end := m.running.start(queue, begin)
	return func() {
		end()
		m.workDuration.WithLabelValues(queue, queue).Observe(time.Since(begin).Seconds())
	}
}

// Provider reports a client-go work queue of this process (an in-memory
// queue, not the bus) under the workqueue_* families, as controller-runtime
// reports its controllers' queues: adds, queue and work durations, retries
// (items added with a delay: AddRateLimited, AddAfter), and the unfinished
// and longest-running figures the queue computes itself. Its depth is
// workqueue_depth of the bus collector (package busstats), which reports
// such queues' Len(): one collector owns that family. A nil m provides
// nothing (the queue then uses client-go's global provider, which records
// nothing unless set).
func (m *WorkQueueMetrics) Provider() workqueue.MetricsProvider {
	if m == nil {
		return nil
	}
	return queueProvider{m}
}

type queueProvider struct{ m *WorkQueueMetrics }

// QueueGaugePeriod is how often a client-go queue made with QueueClock
// refreshes its unfinished-work and longest-running gauges.
const QueueGaugePeriod = 10 * time.Second

// QueueClock is the clock for a client-go queue that reports to Provider.
// Such a queue refreshes those two gauges from a ticker of its own (500 ms)
// that runs whether or not anything is queued: the watcher's three queues
// of controller objects, which see a change now and then, woke an idle
// process six times a second for it. With this clock the ticker runs every
// QueueGaugePeriod instead, still well within a scrape interval; nothing
// else of the queue changes (its delays use timers, and the delaying
// queue's own 10 s heartbeat is not shortened or lengthened).
func QueueClock() clock.WithTicker { return slowTickers{} }

// slowTickers is the real clock with tickers of at least QueueGaugePeriod.
type slowTickers struct{ clock.RealClock }

func (c slowTickers) NewTicker(d time.Duration) clock.Ticker {
	return c.RealClock.NewTicker(gaugePeriod(d))
}

// gaugePeriod is the period of a ticker asked for with period d.
func gaugePeriod(d time.Duration) time.Duration { return max(d, QueueGaugePeriod) }

// noDepth: see Provider.
type noDepth struct{}

func (noDepth) Inc() {}
func (noDepth) Dec() {}

func (queueProvider) NewDepthMetric(string) workqueue.GaugeMetric { return noDepth{} }
func (p queueProvider) NewAddsMetric(name string) workqueue.CounterMetric {
	return p.m.adds.WithLabelValues(name, name)
}
func (p queueProvider) NewLatencyMetric(name string) workqueue.HistogramMetric {
	return p.m.queueDuration.WithLabelValues(name, name)
}
func (p queueProvider) NewWorkDurationMetric(name string) workqueue.HistogramMetric {
	return p.m.workDuration.WithLabelValues(name, name)
}
func (p queueProvider) NewUnfinishedWorkSecondsMetric(name string) workqueue.SettableGaugeMetric {
	return p.m.running.settable(name).unfinished
}
func (p queueProvider) NewLongestRunningProcessorSecondsMetric(name string) workqueue.SettableGaugeMetric {
	return p.m.running.settable(name).longest
}
func (p queueProvider) NewRetriesMetric(name string) workqueue.CounterMetric {
	return p.m.retries.WithLabelValues(name, name)
}

// settableGauge is a gauge a client-go queue sets; runningWork reports it.
type settableGauge struct{ bits atomic.Uint64 }

func (g *settableGauge) Set(v float64) { g.bits.Store(math.Float64bits(v)) }
func (g *settableGauge) get() float64  { return math.Float64frombits(g.bits.Load()) }

// queueGauges are a client-go queue's unfinished and longest-running
// figures.
type queueGauges struct{ unfinished, longest *settableGauge }

// runningWork knows the syncs running in this process and reports
// workqueue_unfinished_work_seconds and
// workqueue_longest_running_processor_seconds when scraped: no timer, and
// a queue that ran once reports 0 while idle, as client-go's does. It
// also reports the figures client-go queues set (Provider).
type runningWork struct {
	unfinished, longest *prometheus.Desc

	mu     sync.Mutex
	next   uint64
	queues map[string]map[uint64]time.Time
	set    map[string]queueGauges
}

// settable returns the gauges of the client-go queue called name.
func (r *runningWork) settable(name string) queueGauges {
	r.mu.Lock()
	defer r.mu.Unlock()
	g, ok := r.set[name]
	if !ok {
		g = queueGauges{&settableGauge{}, &settableGauge{}}
		r.set[name] = g
	}
	return g
}

func newRunningWork() *runningWork {
	labels := []string{"name", "controller"}
	return &runningWork{
		unfinished: prometheus.NewDesc("workqueue_unfinished_work_seconds",
			"Seconds of work done by the syncs in progress that work_duration has not observed yet. Large values indicate stuck syncs.", labels, nil),
		longest: prometheus.NewDesc("workqueue_longest_running_processor_seconds",
			"Seconds the longest sync in progress has been running.", labels, nil),
		queues: map[string]map[uint64]time.Time{},
		set:    map[string]queueGauges{},
	}
}

func (r *runningWork) start(queue string, at time.Time) (end func()) {
	r.mu.Lock()
	defer r.mu.Unlock()
	q := r.queues[queue]
	if q == nil {
		q = map[uint64]time.Time{}
		r.queues[queue] = q
	}
	r.next++
	id := r.next
	q[id] = at
	return func() {
		r.mu.Lock()
		defer r.mu.Unlock()
		delete(q, id)
	}
}

// Describe implements prometheus.Collector.
func (r *runningWork) Describe(ch chan<- *prometheus.Desc) {
	ch <- r.unfinished
	ch <- r.longest
}

// Collect implements prometheus.Collector.
func (r *runningWork) Collect(ch chan<- prometheus.Metric) {
	now := time.Now()
	r.mu.Lock()
	defer r.mu.Unlock()
	for queue, q := range r.queues {
		var total, longest float64
		for _, at := range q {
			s := now.Sub(at).Seconds()
			total += s
			longest = max(longest, s)
		}
		ch <- prometheus.MustNewConstMetric(r.unfinished, prometheus.GaugeValue, total, queue, queue)
		ch <- prometheus.MustNewConstMetric(r.longest, prometheus.GaugeValue, longest, queue, queue)
	}
	for queue, g := range r.set {
		if _, dup := r.queues[queue]; dup {
			continue // a name is either kind; never both
		}
		ch <- prometheus.MustNewConstMetric(r.unfinished, prometheus.GaugeValue, g.unfinished.get(), queue, queue)
		ch <- prometheus.MustNewConstMetric(r.longest, prometheus.GaugeValue, g.longest.get(), queue, queue)
	}
}
