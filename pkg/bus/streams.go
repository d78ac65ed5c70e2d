package bus

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Stream names.
const (
	// WorkStream (MC_WORK) carries work items: "parent P of controller C
	// needs a sync". It is the client-go workqueue contract on JetStream:
	// at most one item in flight per parent (the partition's owner runs a
	// parent's items one at a time) plus one pending (MaxMsgsPerSubject=2
	// with DiscardNewPerSubject).
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

// Timing defaults for consumers (design.md §2, jetstream-findings §2.7).
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
}

func (o Options) replicas() int {
	if o.Replicas <= 0 {
		return 1
	}
	return o.Replicas
}

// queueStorage is the storage of MC_WORK and MC_DESIRED.
func (o Options) queueStorage() jetstream.StorageType {
	if o.MemoryQueues {
		return jetstream.MemoryStorage
	}
	return jetstream.FileStorage
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
func WorkStreamConfig(o Options) jetstream.StreamConfig {
	return jetstream.StreamConfig{
		Name:                 WorkStream,
		Description:          "metabus work items: one in flight and one pending per parent",
		Subjects:             []string{workRoot + ".*.*"},
		Retention:            jetstream.WorkQueuePolicy,
		Storage:              o.queueStorage(),
		Replicas:             o.replicas(),
		MaxMsgsPerSubject:    2,
		Discard:              jetstream.DiscardNew,
		DiscardNewPerSubject: true,
		Duplicates:           2 * time.Minute,
		SubjectTransform: &jetstream.SubjectTransformConfig{
			Source:      workRoot + ".*.*",
			Destination: fmt.Sprintf("%s.{{partition(%d,1,2)}}.{{partition(%d,1,2)}}.{{wildcard(1)}}.{{wildcard(2)}}", workRoot, groups, Slots),
		},
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
func DesiredStreamConfig(o Options) jetstream.StreamConfig {
	return jetstream.StreamConfig{
		Name:        DesiredStream,
		Description: "metabus desired states (CloudEvents), ordered per parent",
		Subjects:    []string{desiredRoot + ".*.*"},
		Retention:   jetstream.WorkQueuePolicy,
		Storage:     o.queueStorage(),
		Replicas:    o.replicas(),
		Discard:     jetstream.DiscardOld,
		MaxAge:      DesiredMaxAge,
		Duplicates:  2 * time.Minute,
		AllowDirect: true,
		Compression: jetstream.S2Compression,
		SubjectTransform: &jetstream.SubjectTransformConfig{
			Source:      desiredRoot + ".*.*",
			Destination: fmt.Sprintf("%s.{{partition(%d,1,2)}}.{{partition(%d,1,2)}}.{{wildcard(1)}}.{{wildcard(2)}}", desiredRoot, groups, Slots),
		},
	}
}

// SchedStreamConfig is MC_SCHED: schedules on mc.sched.<ctrl>.<uid> (one per
// parent: a new schedule replaces the old one) firing into
// mc.due.<ctrl>.<uid>, which the relay moves to MC_WORK and then deletes.
// No MaxAge: a schedule must stay until it fires, however far ahead; the
// server purges a one-shot schedule when it fires.
func SchedStreamConfig(o Options) jetstream.StreamConfig {
	return jetstream.StreamConfig{
		Name:              SchedStream,
		Description:       "metabus per-parent schedules: retry backoff and resyncs",
		Subjects:          []string{schedRoot + ".*.*", dueRoot + ".*.*"},
		Retention:         jetstream.LimitsPolicy,
		Storage:           jetstream.FileStorage,
		Replicas:          o.replicas(),
		MaxMsgsPerSubject: 1,
		Discard:           jetstream.DiscardOld,
		AllowMsgSchedules: true,
		AllowMsgTTL:       true,
	}
}

// AdvisoryStreamConfig is MC_ADV: max-deliveries advisories of the work and
// desired consumers, kept for a day.
func AdvisoryStreamConfig(o Options) jetstream.StreamConfig {
	return jetstream.StreamConfig{
		Name:        AdvisoryStream,
		Description: "metabus consumer advisories feeding the DLQ worker",
		Subjects: []string{
			"$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES." + WorkStream + ".>",
			"$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES." + DesiredStream + ".>",
		},
		Retention: jetstream.WorkQueuePolicy,
		Storage:   jetstream.FileStorage,
		Replicas:  o.replicas(),
		MaxAge:    24 * time.Hour,
	}
}

// DLQStreamConfig is MC_DLQ: poison messages, kept for a week.
func DLQStreamConfig(o Options) jetstream.StreamConfig {
	return jetstream.StreamConfig{
		Name:        DLQStream,
		Description: "metabus poison messages (max deliveries exceeded)",
		Subjects:    []string{dlqRoot + ".>"},
		Retention:   jetstream.LimitsPolicy,
		Storage:     jetstream.FileStorage,
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

func partitionConsumer(prefix, root string, n, p int, ackWait time.Duration, maxAckPending, replicas int) jetstream.ConsumerConfig {
	backoff := partitionBackoff(ackWait)
	return jetstream.ConsumerConfig{
		Durable:        PartitionConsumerName(prefix, n, p),
		Description:    fmt.Sprintf("partition %d of %d of %s", p, n, root),
		FilterSubjects: partitionFilters(root, n, p),
		AckPolicy:      jetstream.AckExplicitPolicy,
		DeliverPolicy:  jetstream.DeliverAllPolicy,
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
		MemoryStorage: true,
	}
}

// WorkConsumerConfig is the consumer of MC_WORK partition p of n.
func WorkConsumerConfig(o Options, n, p int) jetstream.ConsumerConfig {
	return partitionConsumer(WorkConsumerPrefix, workRoot, n, p, o.workAckWait(), WorkMaxAckPending, o.replicas())
}

// DesiredConsumerConfig is the consumer of MC_DESIRED partition p of n.
func DesiredConsumerConfig(o Options, n, p int) jetstream.ConsumerConfig {
	return partitionConsumer(DesiredConsumerPrefix, desiredRoot, n, p, o.desiredAckWait(), DesiredMaxAckPending, o.replicas())
}

// DueConsumerConfig relays fired schedules. Any number of relays may pull
// from it; relaying is idempotent because MC_WORK collapses duplicates.
func DueConsumerConfig(o Options) jetstream.ConsumerConfig {
	return jetstream.ConsumerConfig{
		Durable:       DueConsumer,
		Description:   "moves fired schedules into MC_WORK",
		FilterSubject: dueRoot + ".>",
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       10 * time.Second,
		MaxAckPending: 1024,
		Replicas:      o.replicas(),
	}
}

// DLQConsumerConfig reads MC_ADV.
func DLQConsumerConfig(o Options) jetstream.ConsumerConfig {
	return jetstream.ConsumerConfig{
		Durable:       DLQConsumer,
		Description:   "moves poison messages to MC_DLQ",
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       30 * time.Second,
		MaxAckPending: 64,
		Replicas:      o.replicas(),
	}
}

// Ensure creates or updates every stream and consumer. It is idempotent and
// safe to run from every replica at start. A changed partition count
// (Options.Partitions) is written to the streams' metadata and its
// cut-over left to KeepConsumers when replicas still hold old partitions.
func Ensure(ctx context.Context, js jetstream.JetStream, o Options) error {
	if o.Partitions != 0 {
		if err := ValidPartitions(o.Partitions); err != nil {
			return err
		}
	}
	streams := []jetstream.StreamConfig{
		WorkStreamConfig(o), DesiredStreamConfig(o), SchedStreamConfig(o),
		AdvisoryStreamConfig(o), DLQStreamConfig(o),
	}
	for _, cfg := range streams {
		if cfg.Storage == jetstream.MemoryStorage {
			cfg.Compression = jetstream.NoCompression // file storage only
		}
		if cfg.Name == WorkStream || cfg.Name == DesiredStream {
			n, err := partitionsToSet(ctx, js, cfg.Name, o)
			if err != nil {
				return err
			}
			cfg.Metadata = map[string]string{PartitionsMetadata: strconv.Itoa(n)}
		}
		if err := ensureStream(ctx, js, cfg); err != nil {
			return fmt.Errorf("ensure stream %s: %w", cfg.Name, err)
		}
	}
	if err := ensureOwners(ctx, js, o); err != nil {
		return fmt.Errorf("ensure bucket %s: %w", OwnersBucket, err)
	}
	for _, ps := range partitionedStreams() {
		if err := ReconcileLayout(ctx, js, o, ps); err != nil && !errors.Is(err, ErrCutOverPending) {
			return err
		}
	}
	if _, err := js.CreateOrUpdateConsumer(ctx, SchedStream, DueConsumerConfig(o)); err != nil {
		return fmt.Errorf("ensure consumer %s: %w", DueConsumer, err)
	}
	if _, err := js.CreateOrUpdateConsumer(ctx, AdvisoryStream, DLQConsumerConfig(o)); err != nil {
		return fmt.Errorf("ensure consumer %s: %w", DLQConsumer, err)
	}
	return nil
}

// partitionsToSet is the partition count Ensure writes into a stream's
// metadata: the one asked for, else the stream's own, else the default.
func partitionsToSet(ctx context.Context, js jetstream.JetStream, stream string, o Options) (int, error) {
	if o.Partitions != 0 {
		return o.Partitions, nil
	}
	n, err := StreamPartitions(ctx, js, stream)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return DefaultPartitions, nil
	}
	return n, err
}

// ensureStream creates or updates a stream. A file-stored work queue that
// should be in memory (an embedded server's store from before MemoryQueues)
// is replaced: JetStream cannot change a stream's storage, and what it held
// is rederived by the resync of the starting watcher. The other way round is
// refused: a process asking for file-stored queues on a server that holds
// them in memory belongs to another installation's configuration.
func ensureStream(ctx context.Context, js jetstream.JetStream, cfg jetstream.StreamConfig) error {
	_, err := js.CreateOrUpdateStream(ctx, cfg)
	if err == nil || cfg.Storage != jetstream.MemoryStorage || (cfg.Name != WorkStream && cfg.Name != DesiredStream) {
		return err
	}
	var apiErr *jetstream.APIError
	if !errors.As(err, &apiErr) || !strings.Contains(apiErr.Description, "can not change storage type") {
		return err
	}
	if err := js.DeleteStream(ctx, cfg.Name); err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
		return fmt.Errorf("replace stream stored differently: %w", err)
	}
	_, err = js.CreateOrUpdateStream(ctx, cfg)
	return err
}

// ensureOwners creates or updates the lease bucket. A file-stored bucket
// that should be in memory (an embedded server's store from before
// MemoryQueues covered it) is replaced, as ensureStream replaces the
// queues: Ensure runs before any owner starts, and an owner that finds
// its lease gone fences the partition and claims it again.
func ensureOwners(ctx context.Context, js jetstream.JetStream, o Options) error {
	cfg := OwnersConfig(o)
	_, err := js.CreateOrUpdateKeyValue(ctx, cfg)
	if err == nil || cfg.Storage != jetstream.MemoryStorage {
		return err
	}
	var apiErr *jetstream.APIError
	if !errors.As(err, &apiErr) || !strings.Contains(apiErr.Description, "can not change storage type") {
		return err
	}
	if err := js.DeleteKeyValue(ctx, OwnersBucket); err != nil && !errors.Is(err, jetstream.ErrBucketNotFound) {
		return fmt.Errorf("replace bucket stored differently: %w", err)
	}
	_, err = js.CreateOrUpdateKeyValue(ctx, cfg)
	return err
}

func ensureConsumer(ctx context.Context, js jetstream.JetStream, stream string, cfg jetstream.ConsumerConfig) error {
	_, err := js.CreateOrUpdateConsumer(ctx, stream, cfg)
	if err == nil {
		return nil
	}
	var apiErr *jetstream.APIError
	if !errors.As(err, &apiErr) || !strings.Contains(apiErr.Description, "storage type can not be updated") {
		return err
	}
	if err := js.DeleteConsumer(ctx, stream, cfg.Durable); err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) {
		return fmt.Errorf("replace consumer stored differently: %w", err)
	}
	_, err = js.CreateOrUpdateConsumer(ctx, stream, cfg)
	return err
}

// KeepConsumers keeps the partition consumers in their current layout
// until ctx is done: every interval it checks that partition 0 of each
// partitioned stream exists and otherwise runs ReconcileLayout, which
// recreates consumers a server restart lost (their state lives in memory)
// and finishes a partition-count cut-over once the old partitions are
// handed back. A stream that is gone is created again (Ensure).
//
// onRecreated (optional) is called when a partitioned stream is found
// created anew since the previous check, by this process or another:
// whatever the bus held was lost (a NATS cluster that lost its data), and
// only a resync derives it again. Cost: a stream info and a consumer info
// per stream per check.
func KeepConsumers(ctx context.Context, js jetstream.JetStream, o Options, interval time.Duration, onError func(error), onRecreated func(stream string)) {
	t := time.NewTicker(interval)
	defer t.Stop()
	// The streams as they are now (the caller has just ensured them), so
	// that a loss before the first check is noticed too.
	created := map[string]time.Time{}
	for _, ps := range partitionedStreams() {
		if s, err := js.Stream(ctx, ps.stream); err == nil {
			created[ps.stream] = s.CachedInfo().Created
		}
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		for _, ps := range partitionedStreams() {
			s, err := js.Stream(ctx, ps.stream)
			var n int
			if err == nil {
				info := s.CachedInfo()
				if seen, ok := created[ps.stream]; ok && !seen.Equal(info.Created) && onRecreated != nil {
					onRecreated(ps.stream)
				}
				created[ps.stream] = info.Created
				n, err = partitionsOf(info.Config.Metadata)
			}
			if err == nil {
				_, err = js.Consumer(ctx, ps.stream, PartitionConsumerName(ps.prefix, n, 0))
			}
			switch {
			case err == nil:
				continue
			case errors.Is(err, jetstream.ErrStreamNotFound):
				err = Ensure(ctx, js, o)
			case errors.Is(err, jetstream.ErrConsumerNotFound):
				err = ReconcileLayout(ctx, js, o, ps)
			}
			if err != nil && ctx.Err() == nil && onError != nil {
				onError(fmt.Errorf("keep partition consumers of %s: %w", ps.stream, err))
			}
		}
	}
}

// WaitReady waits until Ensure (run by the watcher) has finished: the DLQ
// consumer is the last thing it creates. Services without stream-management
// permissions start this way. A server that does not answer yet (restarting,
// JetStream still starting) is waited for too: a fault run saw a
// dispatcher started during a NATS restart exit on the lookup's timeout.
func WaitReady(ctx context.Context, js jetstream.JetStream) error {
	for {
		_, err := js.Consumer(ctx, AdvisoryStream, DLQConsumer)
		if err == nil {
			return nil
		}
		if !errors.Is(err, jetstream.ErrStreamNotFound) && !errors.Is(err, jetstream.ErrConsumerNotFound) && !notAnsweringYet(ctx, err) {
			return fmt.Errorf("look up %s/%s: %w", AdvisoryStream, DLQConsumer, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// notAnsweringYet reports an error that means the server has not answered
// (yet), not that it refused: the request timed out (its own deadline, not
// the caller's), nobody serves the JetStream API, JetStream is not enabled
// yet, the connection is being re-established, or the JetStream API
// answered 503 (in a cluster: "JetStream system temporarily unavailable"
// while the node has no meta leader, e.g. cut from the other nodes, or
// during an election; a clustered fault run saw an applier started then
// exit on it).
func notAnsweringYet(ctx context.Context, err error) bool {
	if ctx.Err() != nil {
		return false
	}
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) && apiErr.Code == 503 {
		return true
	}
	return errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout) ||
		errors.Is(err, nats.ErrNoResponders) || errors.Is(err, jetstream.ErrJetStreamNotEnabled) ||
		errors.Is(err, jetstream.ErrJetStreamNotEnabledForAccount) ||
		errors.Is(err, nats.ErrConnectionReconnecting) || errors.Is(err, nats.ErrDisconnected)
}
