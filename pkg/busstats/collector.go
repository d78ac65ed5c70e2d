package busstats

import (
	"context"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/metabus/metabus/pkg/bus"
	"github.com/metabus/metabus/pkg/obs"
)

// DefaultInterval is how old a reading may be before a scrape takes a new
// one.
const DefaultInterval = 10 * time.Second

// readTimeout bounds one reading: a scrape must not hang on a stuck bus.
const readTimeout = 5 * time.Second

// CollectorOptions configure a Collector.
type CollectorOptions struct {
	// Active says whether this process reports the bus (the leading
	// watcher): one process per installation does, so that sums over
	// processes count each figure once. nil: always.
	Active func() bool
	// Controllers lists the controllers this installation serves; the
	// per-controller series are theirs only (a watcher sharded by
	// --target-label-selector reports its own controllers, and each idle
	// one reports 0). Stream, partition and stage series cover the whole
	// bus.
	Controllers func() []bus.ControllerRef
	// LocalQueues returns the depth (Len) of this process's own in-memory
	// work queues by name, reported under workqueue_depth whether or not
	// the process is Active: they are this process's, not the bus's
	// (obs.WorkQueueMetrics.Provider reports their other figures).
	LocalQueues func() map[string]int
	// Interval is DefaultInterval when zero.
	Interval time.Duration
	Read     Options
	Log      *zap.Logger
}

// Collector exports the bus's state. It reads the bus when scraped, at
// most once per Interval, and only while Active: an installation that
// nobody scrapes pays nothing.
type Collector struct {
	js   jetstream.JetStream
	opts CollectorOptions

	mu       sync.Mutex
	last     *Stats
	lastErr  error
	lastRead time.Time
	took     time.Duration
	errors   float64

	depth, streamMsgs, streamBytes, streamAge *prometheus.Desc
	pending, ackPending, redelivered          *prometheus.Desc
	queued, oldestAge, dlq                    *prometheus.Desc
	partitions, unowned, members              *prometheus.Desc
	up, readSeconds, readErrors, detailed     *prometheus.Desc
}

// NewCollector returns a collector reading the bus through js.
func NewCollector(js jetstream.JetStream, o CollectorOptions) *Collector {
	if o.Interval <= 0 {
		o.Interval = DefaultInterval
	}
	if o.Log == nil {
		o.Log = zap.NewNop()
	}
	ctrl := []string{"stage", "controller_type", "controller"}
	part := []string{"stage", "partition"}
	return &Collector{
		js: js, opts: o,
		// controller-runtime's workqueue_depth (name, controller and an
		// empty priority, as client-go queues report it); see
		// obs.WorkQueueMetrics for the other workqueue_* families.
		depth: prometheus.NewDesc("workqueue_depth",
			"Work items of the controller in MC_WORK: waiting, or being synced (at most --workers per dispatcher replica); "+
				"for this process's in-memory queues (the watcher's controller objects), the items waiting in it.",
			[]string{"name", "controller", "priority"}, nil),
		streamMsgs:  prometheus.NewDesc("metabus_bus_stream_messages", "Messages in the stream.", []string{"stream"}, nil),
		streamBytes: prometheus.NewDesc("metabus_bus_stream_bytes", "Bytes of the stream's messages.", []string{"stream"}, nil),
		streamAge: prometheus.NewDesc("metabus_bus_stream_oldest_message_age_seconds",
			"Age of the stream's oldest message (0 when it is empty).", []string{"stream"}, nil),
		pending: prometheus.NewDesc("metabus_bus_consumer_pending_messages",
			"Messages of the partition not yet delivered to its owner.", part, nil),
		ackPending: prometheus.NewDesc("metabus_bus_consumer_ack_pending_messages",
			"Messages of the partition delivered to its owner and not yet acknowledged: waiting their parent's turn or being handled.", part, nil),
		redelivered: prometheus.NewDesc("metabus_bus_consumer_redelivered_messages",
			"Messages of the partition awaiting acknowledgement that were delivered more than once.", part, nil),
		queued: prometheus.NewDesc("metabus_bus_queued_messages",
			"Messages of the controller in the stage's stream (work items in MC_WORK, desired states in MC_DESIRED): waiting or being handled.", ctrl, nil),
		oldestAge: prometheus.NewDesc("metabus_bus_oldest_message_age_seconds",
			"Age of the controller's oldest message in the stage's stream: how long its longest-waiting item has waited (0 when none waits).", ctrl, nil),
		dlq: prometheus.NewDesc("metabus_bus_dlq_messages",
			"Messages of the controller parked in MC_DLQ after too many deliveries, by the stage they failed in.", ctrl, nil),
		partitions: prometheus.NewDesc("metabus_bus_partitions", "Partitions of the stage's stream.", []string{"stage"}, nil),
		unowned: prometheus.NewDesc("metabus_bus_partitions_unowned",
			"Partitions of the stage no replica holds the lease of: nobody consumes them.", []string{"stage"}, nil),
		members: prometheus.NewDesc("metabus_bus_stage_members", "Replicas registered in the stage.", []string{"stage"}, nil),
		up: prometheus.NewDesc("metabus_bus_stats_up",
			"1 if the last reading of the bus succeeded, 0 if JetStream could not be read.", nil, nil),
		readSeconds: prometheus.NewDesc("metabus_bus_stats_read_duration_seconds",
			"How long the last reading of the bus took.", nil, nil),
		readErrors: prometheus.NewDesc("metabus_bus_stats_read_errors_total",
			"Readings of the bus that failed.", nil, nil),
		detailed: prometheus.NewDesc("metabus_bus_stats_detailed",
			"1 if the last reading has per-controller figures for every stream, 0 if a stream held too many subjects to list.", nil, nil),
	}
}

// Register registers c with reg.
func (c *Collector) Register(reg prometheus.Registerer) error {
	_, err := obs.Register(reg, c)
	return err
}

// Describe implements prometheus.Collector.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.depth, c.streamMsgs, c.streamBytes, c.streamAge, c.pending, c.ackPending, c.redelivered,
		c.queued, c.oldestAge, c.dlq, c.partitions, c.unowned, c.members, c.up, c.readSeconds, c.readErrors, c.detailed} {
		ch <- d
	}
}

// reading returns a reading no older than the interval, taking one if
// needed.
func (c *Collector) reading() (*Stats, error, time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if time.Since(c.lastRead) >= c.opts.Interval {
		ctx, cancel := context.WithTimeout(context.Background(), readTimeout)
		begin := time.Now()
		st, err := Read(ctx, c.js, c.opts.Read)
		cancel()
		c.took = time.Since(begin)
		c.lastRead = time.Now()
		c.last, c.lastErr = st, err
		if err != nil {
			c.errors++
			c.opts.Log.Warn("cannot read the bus for metrics", zap.Error(err))
		}
	}
	return c.last, c.lastErr, c.took
}

// Collect implements prometheus.Collector.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	if c.opts.LocalQueues != nil {
		for name, n := range c.opts.LocalQueues() {
			gauge(c.depth, float64(n), name, name, "")
		}
	}
	if c.opts.Active != nil && !c.opts.Active() {
		return
	}
	st, err, took := c.reading()
	c.mu.Lock()
	errs := c.errors
	c.mu.Unlock()
	ch <- prometheus.MustNewConstMetric(c.readErrors, prometheus.CounterValue, errs)
	gauge(c.readSeconds, took.Seconds())
	if err != nil {
		// Stale figures would look current: report none but the failure.
		gauge(c.up, 0)
		return
	}
	gauge(c.up, 1)
	gauge(c.detailed, boolValue(st.Detailed))
	age := func(t time.Time) float64 {
		if t.IsZero() {
			return 0
		}
		return max(st.At.Sub(t).Seconds(), 0)
	}
	for name, s := range st.Streams {
		gauge(c.streamMsgs, float64(s.Messages), name)
		gauge(c.streamBytes, float64(s.Bytes), name)
		gauge(c.streamAge, age(s.Oldest), name)
	}
	for _, p := range st.Partitions {
		gauge(c.pending, float64(p.Pending), p.Stage, p.Name)
		gauge(c.ackPending, float64(p.AckPending), p.Stage, p.Name)
		gauge(c.redelivered, float64(p.Redelivered), p.Stage, p.Name)
	}
	for stage, s := range st.Stages {
		gauge(c.partitions, float64(s.Partitions), stage)
		gauge(c.unowned, float64(max(s.Partitions-s.Owned, 0)), stage)
		gauge(c.members, float64(s.Members), stage)
	}
	// Per controller: the installation's own controllers, each one
	// reported (0 when idle) so that its series do not vanish.
	var ctrls []bus.ControllerRef
	if c.opts.Controllers != nil {
		ctrls = c.opts.Controllers()
	}
	byID := make(map[string]bus.ControllerRef, len(ctrls))
	for _, r := range ctrls {
		byID[r.ID()] = r
	}
	type key struct{ stage, id string }
	queues := map[key]Queue{}
	for _, q := range st.Queues {
		queues[key{q.Stage, q.ControllerID}] = q
	}
	dead := map[key]uint64{}
	for _, q := range st.DeadLetters {
		dead[key{q.Stage, q.ControllerID}] = q.Messages
	}
	for id, r := range byID {
		for _, stage := range []string{bus.WorkStage, bus.DesiredStage} {
			q, ok := queues[key{stage, id}]
			if !ok && !st.Detailed {
				continue // unknown this round, not zero
			}
			gauge(c.queued, float64(q.Messages), stage, r.Kind, r.Name)
			gauge(c.oldestAge, age(q.Oldest), stage, r.Kind, r.Name)
			if _, exists := st.Streams[bus.DLQStream]; exists {
				if n, ok := dead[key{stage, id}]; ok || st.Detailed {
					gauge(c.dlq, float64(n), stage, r.Kind, r.Name)
				}
			}
			if stage == bus.WorkStage {
				queue := obs.QueueName(r.Kind, r.Name)
				gauge(c.depth, float64(q.Messages), queue, queue, "")
			}
		}
	}
}

func boolValue(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
