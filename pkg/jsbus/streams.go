package jsbus

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/metabus/metabus/pkg/bus"
)

// streamConfig is a stream's configuration for JetStream.
func streamConfig(c bus.StreamConfig) jetstream.StreamConfig {
	out := jetstream.StreamConfig{
		Name: c.Name, Description: c.Description, Subjects: c.Subjects,
		Retention: jetstream.LimitsPolicy, Storage: jetstream.FileStorage, Replicas: c.Replicas,
		MaxMsgsPerSubject: c.MaxMsgsPerSubject, Discard: jetstream.DiscardOld, DiscardNewPerSubject: c.DiscardNewPerSubject,
		Duplicates: c.Duplicates, MaxAge: c.MaxAge, MaxBytes: c.MaxBytes, AllowDirect: c.AllowDirect,
		AllowMsgSchedules: c.AllowMsgSchedules, AllowMsgTTL: c.AllowMsgTTL, Metadata: c.Metadata,
	}
	if c.WorkQueue {
		out.Retention = jetstream.WorkQueuePolicy
	}
	if c.Memory {
		out.Storage = jetstream.MemoryStorage
	}
	if c.DiscardNew {
		out.Discard = jetstream.DiscardNew
	}
	if c.Compressed {
		out.Compression = jetstream.S2Compression
	}
	if c.TransformSource != "" {
		out.SubjectTransform = &jetstream.SubjectTransformConfig{Source: c.TransformSource, Destination: c.TransformDestination}
	}
	return out
}

// consumerConfig is a consumer's configuration for JetStream: explicit
// acks, delivering everything from the start.
func consumerConfig(c bus.ConsumerConfig) jetstream.ConsumerConfig {
	return jetstream.ConsumerConfig{
		Durable: c.Durable, Description: c.Description, FilterSubject: c.FilterSubject, FilterSubjects: c.FilterSubjects,
		AckPolicy: jetstream.AckExplicitPolicy, DeliverPolicy: jetstream.DeliverAllPolicy,
		MaxAckPending: c.MaxAckPending, AckWait: c.AckWait, MaxDeliver: c.MaxDeliver, BackOff: c.BackOff,
		Replicas: c.Replicas, MemoryStorage: c.MemoryState,
	}
}

// bucketConfig is a key-value bucket's configuration for JetStream.
func bucketConfig(c bus.BucketConfig) jetstream.KeyValueConfig {
	out := jetstream.KeyValueConfig{Bucket: c.Bucket, Description: c.Description, History: c.History, TTL: c.TTL,
		Storage: jetstream.FileStorage, Replicas: c.Replicas}
	if c.Memory {
		out.Storage = jetstream.MemoryStorage
	}
	return out
}

// Ensure creates or updates every stream and consumer. It is idempotent and
// safe to run from every replica at start. A changed partition count
// (Options.Partitions) is written to the streams' metadata and its
// cut-over left to KeepConsumers when replicas still hold old partitions.
func Ensure(ctx context.Context, js jetstream.JetStream, o bus.Options) error {
	if o.Partitions != 0 {
		if err := bus.ValidPartitions(o.Partitions); err != nil {
			return err
		}
	}
	var streams []jetstream.StreamConfig
	for _, c := range []bus.StreamConfig{bus.WorkStreamConfig(o), bus.DesiredStreamConfig(o), bus.SchedStreamConfig(o),
		bus.AdvisoryStreamConfig(o), bus.DLQStreamConfig(o)} {
		streams = append(streams, streamConfig(c))
	}
	for _, cfg := range streams {
		if cfg.Storage == jetstream.MemoryStorage {
			cfg.Compression = jetstream.NoCompression // file storage only
		}
		if cfg.Name == bus.WorkStream || cfg.Name == bus.DesiredStream {
			n, err := partitionsToSet(ctx, js, cfg.Name, o)
			if err != nil {
				return err
			}
			cfg.Metadata = map[string]string{bus.PartitionsMetadata: strconv.Itoa(n)}
		}
		if err := ensureStream(ctx, js, cfg); err != nil {
			return fmt.Errorf("ensure stream %s: %w", cfg.Name, err)
		}
	}
	if err := ensureOwners(ctx, js, o); err != nil {
		return fmt.Errorf("ensure bucket %s: %w", bus.OwnersBucket, err)
	}
	for _, ps := range bus.PartitionedStreams() {
		if err := ReconcileLayout(ctx, js, o, ps); err != nil && !errors.Is(err, bus.ErrCutOverPending) {
			return err
		}
	}
	if _, err := js.CreateOrUpdateConsumer(ctx, bus.SchedStream, consumerConfig(bus.DueConsumerConfig(o))); err != nil {
		return fmt.Errorf("ensure consumer %s: %w", bus.DueConsumer, err)
	}
	if _, err := js.CreateOrUpdateConsumer(ctx, bus.AdvisoryStream, consumerConfig(bus.DLQConsumerConfig(o))); err != nil {
		return fmt.Errorf("ensure consumer %s: %w", bus.DLQConsumer, err)
	}
	return nil
}

// partitionsToSet is the partition count Ensure writes into a stream's
// metadata: the one asked for, else the stream's own, else the default.
func partitionsToSet(ctx context.Context, js jetstream.JetStream, stream string, o bus.Options) (int, error) {
	if o.Partitions != 0 {
		return o.Partitions, nil
	}
	n, err := StreamPartitions(ctx, js, stream)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return bus.DefaultPartitions, nil
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
	if err == nil || cfg.Storage != jetstream.MemoryStorage || (cfg.Name != bus.WorkStream && cfg.Name != bus.DesiredStream) {
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

// EnsureEventsStream creates or updates the consumer-facing events stream
// (bus.EventsStreamConfig): the applier does when it publishes events, so
// that installations without --bus-events have no such stream.
func EnsureEventsStream(ctx context.Context, js jetstream.JetStream, c bus.StreamConfig) error {
	if err := ensureStream(ctx, js, streamConfig(c)); err != nil {
		return fmt.Errorf("ensure stream %s: %w", c.Name, err)
	}
	return nil
}

// ensureOwners creates or updates the lease bucket. A file-stored bucket
// that should be in memory (an embedded server's store from before
// MemoryQueues covered it) is replaced, as ensureStream replaces the
// queues: Ensure runs before any owner starts, and an owner that finds
// its lease gone fences the partition and claims it again.
func ensureOwners(ctx context.Context, js jetstream.JetStream, o bus.Options) error {
	cfg := bucketConfig(bus.OwnersConfig(o))
	_, err := js.CreateOrUpdateKeyValue(ctx, cfg)
	if err == nil || cfg.Storage != jetstream.MemoryStorage {
		return err
	}
	var apiErr *jetstream.APIError
	if !errors.As(err, &apiErr) || !strings.Contains(apiErr.Description, "can not change storage type") {
		return err
	}
	if err := js.DeleteKeyValue(ctx, bus.OwnersBucket); err != nil && !errors.Is(err, jetstream.ErrBucketNotFound) {
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
func KeepConsumers(ctx context.Context, js jetstream.JetStream, o bus.Options, interval time.Duration, onError func(error), onRecreated func(stream string)) {
	t := time.NewTicker(interval)
	defer t.Stop()
	// The streams as they are now (the caller has just ensured them), so
	// that a loss before the first check is noticed too.
	created := map[string]time.Time{}
	for _, ps := range bus.PartitionedStreams() {
		if s, err := js.Stream(ctx, ps.Stream); err == nil {
			created[ps.Stream] = s.CachedInfo().Created
		}
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		for _, ps := range bus.PartitionedStreams() {
			s, err := js.Stream(ctx, ps.Stream)
			var n int
			if err == nil {
				info := s.CachedInfo()
				if seen, ok := created[ps.Stream]; ok && !seen.Equal(info.Created) && onRecreated != nil {
					onRecreated(ps.Stream)
				}
				created[ps.Stream] = info.Created
				n, err = bus.PartitionsOf(info.Config.Metadata)
			}
			if err == nil {
				_, err = js.Consumer(ctx, ps.Stream, bus.PartitionConsumerName(ps.Prefix, n, 0))
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
				onError(fmt.Errorf("keep partition consumers of %s: %w", ps.Stream, err))
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
		_, err := js.Consumer(ctx, bus.AdvisoryStream, bus.DLQConsumer)
		if err == nil {
			return nil
		}
		if !errors.Is(err, jetstream.ErrStreamNotFound) && !errors.Is(err, jetstream.ErrConsumerNotFound) && !notAnsweringYet(ctx, err) {
			return fmt.Errorf("look up %s/%s: %w", bus.AdvisoryStream, bus.DLQConsumer, err)
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
