package bus

import (
	"fmt"
	"time"
)

// The stream, consumer and bucket configurations are wire contracts too:
// every process that creates or checks them (the watcher's Ensure, tests,
// tools) must agree. They are described here as plain data, without the
// NATS client; package jsbus turns them into JetStream's.

// MaxPayload is the largest message the bus carries: the max_payload of
// the embedded NATS server (package natsx) and of the deployed ones
// (deploy/ holds them equal). Snapshots and desired states of parents with
// many children exceed NATS's 1 MB default. It is a contract, not a
// server setting, because every producer must stay under it: the hook
// client bounds replies by it.
const MaxPayload = 8 << 20

// StreamConfig is what metabus sets on a stream.
type StreamConfig struct {
	Name, Description string
	Subjects          []string
	// WorkQueue retention (else limits).
	WorkQueue bool
	// Memory storage (else file).
	Memory   bool
	Replicas int
	// MaxMsgsPerSubject (0: unlimited); DiscardNew refuses new messages at
	// the limit (else the oldest go), per subject with
	// DiscardNewPerSubject.
	MaxMsgsPerSubject    int64
	DiscardNew           bool
	DiscardNewPerSubject bool
	Duplicates, MaxAge   time.Duration
	// MaxBytes bounds the stream's size (0: unlimited; the oldest
	// messages go).
	MaxBytes    int64
	AllowDirect bool
	// Compressed with S2.
	Compressed                     bool
	AllowMsgSchedules, AllowMsgTTL bool
	// Transform stores the messages of TransformSource under
	// TransformDestination ("" for none).
	TransformSource, TransformDestination string
	Metadata                              map[string]string
}

// ConsumerConfig is what metabus sets on a durable pull consumer: explicit
// acks, delivering everything from the start.
type ConsumerConfig struct {
	Durable, Description string
	// FilterSubject, or FilterSubjects, select what it delivers.
	FilterSubject  string
	FilterSubjects []string
	MaxAckPending  int
	AckWait        time.Duration
	// MaxDeliver (0: unlimited) and the redelivery BackOff.
	MaxDeliver int
	BackOff    []time.Duration
	Replicas   int
	// MemoryState keeps the consumer's state in memory.
	MemoryState bool
}

// BucketConfig is a key-value bucket.
type BucketConfig struct {
	Bucket, Description string
	History             uint8
	TTL                 time.Duration
	Memory              bool
	Replicas            int
}

// Stream names.
const (
	// WorkStream (MC_WORK) carries work items: "parent P of controller C
	// needs a sync". It is the client-go workqueue contract on JetStream:
	// at most one item in flight per parent (the partition's owner runs a
	// parent's items one at a time) plus one pending (MaxMsgsPerSubject=2
	// with DiscardNewPerSubject). A refusal does not prove that a pending
	// item will see the refused change: an acked item counts until the
	// server removes it (dispatchers do not wait for their acks, and in a
	// cluster the removal is a Raft proposal of its own), while the
	// parent's next item may already have taken its snapshot. Publishers
	// of real changes publish a refused item again once there is room
	// (services/watcher mustLand); resyncs may be dropped.
	WorkStream = "MC_WORK"
	// DesiredStream (MC_DESIRED) carries desired states as CloudEvents from
	// dispatchers to appliers, ordered per parent.
	DesiredStream = "MC_DESIRED"
	// SchedStream (MC_SCHED) holds one message schedule per parent (retry
	// backoff, resyncAfterSeconds, periodic resync) and the due messages the
	// schedules fire. It cannot be MC_WORK itself: schedules are refused in
	// DiscardNew streams (error 10052).
	SchedStream = "MC_SCHED"
	// AdvisoryStream (MC_ADV) captures MAX_DELIVERIES advisories of the work
	// and desired consumers so poison messages can be moved to MC_DLQ.
	AdvisoryStream = "MC_ADV"
	// DLQStream (MC_DLQ) keeps poison messages for a week for inspection.
	DLQStream = "MC_DLQ"
)

// Consumer name prefixes; partition p of n has consumer <prefix><n>-p<NN>.
const (
	WorkConsumerPrefix    = "work-"
	DesiredConsumerPrefix = "desired-"
	// DueConsumer relays fired schedules into MC_WORK.
	DueConsumer = "due-relay"
	// DLQConsumer reads MC_ADV.
	DLQConsumer = "dlq"
)

// Timing defaults for consumers, measured against JetStream's redelivery
// and heartbeat behaviour (docs/reliability.md).
const (
	// WorkAckWait is how long a dispatcher may hold a work item without a
	// heartbeat before it is redelivered (to another replica after a crash).
	WorkAckWait = 15 * time.Second
	// DesiredAckWait is the same for appliers; API writes can be slow.
	DesiredAckWait = 30 * time.Second
	// MaxDeliver bounds redeliveries of a message whose handler keeps
	// crashing; application errors never count (they ack and reschedule).
	MaxDeliver = 5
)

// Options tune the bus for an installation. The zero value is production
// defaults with R1 (embedded) streams.
type Options struct {
	// Replicas of every stream (3 in a production NATS cluster).
	Replicas int
	// MemoryQueues keeps MC_WORK and MC_DESIRED in memory instead of on
	// file. Only for a server that cannot restart without the watcher
	// restarting too (the all-in-one process's embedded server): a new
	// watcher resyncs every parent, which rederives everything the queues
	// held. It saves writing and then deleting every work item and desired
	// state on disk.
	MemoryQueues bool
	// WorkAckWait and DesiredAckWait override the defaults (tests shorten
	// them to exercise crash redelivery quickly).
	WorkAckWait    time.Duration
	DesiredAckWait time.Duration
	// OwnerLease overrides the partition lease duration (OwnerLease);
	// tests shorten it to exercise takeovers quickly.
	OwnerLease time.Duration
	// Partitions, when set, changes the partition count of MC_WORK and
	// MC_DESIRED to it (Ensure starts the cut-over described in
	// layout.go); 0 keeps the streams' current count, DefaultPartitions
	// for new streams.
	Partitions int
	// FixedLayout says the partition count cannot change while this
	// process runs (the all-in-one's embedded server, whose memory streams
	// are made anew at every start by its own watcher): its stages read it
	// once when they start consuming, not on every lease tick.
	FixedLayout bool
}

func (o Options) replicas() int {
	if o.Replicas <= 0 {
		return 1
	}
	return o.Replicas
}

func (o Options) workAckWait() time.Duration {
	if o.WorkAckWait > 0 {
		return o.WorkAckWait
	}
	return WorkAckWait
}

func (o Options) desiredAckWait() time.Duration {
	if o.DesiredAckWait > 0 {
		return o.DesiredAckWait
	}
	return DesiredAckWait
}

// WorkStreamConfig is MC_WORK. No stream-wide MaxMsgs/MaxBytes: with
// DiscardNew on a WorkQueue stream those lose messages silently
// (nats-server #4771); the per-subject cap already bounds the stream to two
// messages per (controller, parent).
func WorkStreamConfig(o Options) StreamConfig {
	return StreamConfig{
		Name:                 WorkStream,
		Description:          "metabus work items: one in flight and one pending per parent",
		Subjects:             []string{workRoot + ".*.*"},
		WorkQueue:            true,
		Memory:               o.MemoryQueues,
		Replicas:             o.replicas(),
		MaxMsgsPerSubject:    2,
		DiscardNew:           true,
		DiscardNewPerSubject: true,
		Duplicates:           2 * time.Minute,
		TransformSource:      workRoot + ".*.*",
		TransformDestination: fmt.Sprintf("%s.{{partition(%d,1,2)}}.{{partition(%d,1,2)}}.{{wildcard(1)}}.{{wildcard(2)}}", workRoot, groups, Slots),
	}
}

// DesiredMaxAge bounds MC_DESIRED. It is the only limit the stream has:
// with DiscardOld, a message-count or byte limit would silently drop desired
// states not yet applied whenever appliers fall behind. An age limit only
// drops a desired state that has waited a day, which is stale by then: the
// parent has been resynced many times since (every cache flush, 30 min by
// default, rederives it from the cluster), so its newer desired states, or
// the next resync, supersede it. It bounds what piles up while no applier
// runs at all.
const DesiredMaxAge = 24 * time.Hour

// DesiredStreamConfig is MC_DESIRED: WorkQueue, partitioned like MC_WORK, no
// per-subject limit (every desired state is kept until applied or
// superseded), direct gets for the superseded check, bounded by
// DesiredMaxAge.
func DesiredStreamConfig(o Options) StreamConfig {
	return StreamConfig{
		Name:        DesiredStream,
		Description: "metabus desired states (CloudEvents), ordered per parent",
		Subjects:    []string{desiredRoot + ".*.*"},
		WorkQueue:   true,
		Memory:      o.MemoryQueues,
		Replicas:    o.replicas(),
		MaxAge:      DesiredMaxAge,
		Duplicates:  2 * time.Minute,
		AllowDirect: true,
		// Not compressed: a nats-server 2.15.2 node SIGKILLed while
		// writing a compressed block came back with this stream's replica
		// unrecoverable ("Critical write error: smb.truncate: error reading
		// compression reader: s2: corrupt input"), its raft monitor not
		// running and the partition consumers it led stalled until an
		// operator removed the peer (a `make faults-cluster` run,
		// 2026-11-27); the uncompressed streams beside it recovered from
		// the same kills. Desired states live seconds, so S2 saved little.
		Compressed:           false,
		TransformSource:      desiredRoot + ".*.*",
		TransformDestination: fmt.Sprintf("%s.{{partition(%d,1,2)}}.{{partition(%d,1,2)}}.{{wildcard(1)}}.{{wildcard(2)}}", desiredRoot, groups, Slots),
	}
}

// SchedStreamConfig is MC_SCHED: schedules on mc.sched.<ctrl>.<uid> (one per
// parent: a new schedule replaces the old one) firing into
// mc.due.<ctrl>.<uid>, which the relay moves to MC_WORK and then deletes.
// No MaxAge: a schedule must stay until it fires, however far ahead; the
// server purges a one-shot schedule when it fires.
func SchedStreamConfig(o Options) StreamConfig {
	return StreamConfig{
		Name:              SchedStream,
		Description:       "metabus per-parent schedules: retry backoff and resyncs",
		Subjects:          []string{schedRoot + ".*.*", dueRoot + ".*.*"},
		Replicas:          o.replicas(),
		MaxMsgsPerSubject: 1,
		AllowMsgSchedules: true,
		AllowMsgTTL:       true,
	}
}

// AdvisoryStreamConfig is MC_ADV: max-deliveries advisories of the work and
// desired consumers, kept for a day.
func AdvisoryStreamConfig(o Options) StreamConfig {
	return StreamConfig{
		Name:        AdvisoryStream,
		Description: "metabus consumer advisories feeding the DLQ worker",
		Subjects: []string{
			"$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES." + WorkStream + ".>",
			"$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES." + DesiredStream + ".>",
		},
		WorkQueue: true,
		Replicas:  o.replicas(),
		MaxAge:    24 * time.Hour,
	}
}

// DLQStreamConfig is MC_DLQ: poison messages, kept for a week.
func DLQStreamConfig(o Options) StreamConfig {
	return StreamConfig{
		Name:        DLQStream,
		Description: "metabus poison messages (max deliveries exceeded)",
		Subjects:    []string{dlqRoot + ".>"},
		Replicas:    o.replicas(),
		MaxAge:      7 * 24 * time.Hour,
	}
}

// partitionBackoff is the redelivery schedule of a crashed or hung handler:
// ackWait, then doubling (15, 30, 60, 120 s with the default work AckWait).
// It bounds how long a poison message blocks its partition (about 4 min by
// default) before the DLQ takes it.
func partitionBackoff(ackWait time.Duration) []time.Duration {
	return []time.Duration{ackWait, 2 * ackWait, 4 * ackWait, 8 * ackWait}
}

func partitionConsumer(prefix, root string, n, p int, ackWait time.Duration, maxAckPending, replicas int) ConsumerConfig {
	backoff := partitionBackoff(ackWait)
	return ConsumerConfig{
		Durable:        PartitionConsumerName(prefix, n, p),
		Description:    fmt.Sprintf("partition %d of %d of %s", p, n, root),
		FilterSubjects: PartitionFilters(root, n, p),
		// The partition's owner (one replica, by lease) holds up to this
		// many messages and runs each parent's one at a time itself, so a
		// slow parent never holds the partition's other parents.
		MaxAckPending: maxAckPending,
		AckWait:       ackWait,
		MaxDeliver:    MaxDeliver,
		BackOff:       backoff,
		// WorkQueue consumers must have the stream's replica count.
		Replicas: replicas,
		// Consumer state in memory: file-stored, each of the 128
		// partition consumers rewrote its state file (write, fsync,
		// rename) up to 10 times a second under load, about 20% of an
		// all-in-one process's CPU. Losing the state is harmless here:
		// WorkQueue retention deletes acked messages, so a consumer that
		// a server restart lost is recreated (EnsureConsumers) and
		// redelivers only what was in flight.
		MemoryState: true,
	}
}

// WorkConsumerConfig is the consumer of MC_WORK partition p of n.
func WorkConsumerConfig(o Options, n, p int) ConsumerConfig {
	return partitionConsumer(WorkConsumerPrefix, workRoot, n, p, o.workAckWait(), WorkMaxAckPending, o.replicas())
}

// DesiredConsumerConfig is the consumer of MC_DESIRED partition p of n.
func DesiredConsumerConfig(o Options, n, p int) ConsumerConfig {
	return partitionConsumer(DesiredConsumerPrefix, desiredRoot, n, p, o.desiredAckWait(), DesiredMaxAckPending, o.replicas())
}

// DueConsumerConfig relays fired schedules. Any number of relays may pull
// from it; relaying is idempotent because MC_WORK collapses duplicates.
func DueConsumerConfig(o Options) ConsumerConfig {
	return ConsumerConfig{
		Durable:       DueConsumer,
		Description:   "moves fired schedules into MC_WORK",
		FilterSubject: dueRoot + ".>",
		AckWait:       10 * time.Second,
		MaxAckPending: 1024,
		Replicas:      o.replicas(),
	}
}

// DLQConsumerConfig reads MC_ADV.
func DLQConsumerConfig(o Options) ConsumerConfig {
	return ConsumerConfig{
		Durable:       DLQConsumer,
		Description:   "moves poison messages to MC_DLQ",
		AckWait:       30 * time.Second,
		MaxAckPending: 64,
		Replicas:      o.replicas(),
	}
}

// Partitioned describes one partitioned stream for the layout reconciler.
type Partitioned struct {
	Stream, Prefix, Stage string
	Consumer              func(o Options, n, p int) ConsumerConfig
}

// PartitionedStreams are MC_WORK and MC_DESIRED.
func PartitionedStreams() []Partitioned {
	return []Partitioned{
		{WorkStream, WorkConsumerPrefix, WorkStage, WorkConsumerConfig},
		{DesiredStream, DesiredConsumerPrefix, DesiredStage, DesiredConsumerConfig},
	}
}
