package jsbus

import (
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/metabus/metabus/pkg/bus"
)

// StreamPartitions reads a stream's current partition count (one stream
// info request, answered by the stream leader).
func StreamPartitions(ctx context.Context, js streamLookup, stream string) (int, error) {
	s, err := js.Stream(ctx, stream)
	if err != nil {
		return 0, fmt.Errorf("read partitions of %s: %w", stream, err)
	}
	return bus.PartitionsOf(s.CachedInfo().Config.Metadata)
}

// ReconcileLayout brings one partitioned stream's consumers to its current
// layout: it deletes the consumers of any other layout once none of their
// leases is held (step 3 of the cut-over), then creates or updates the
// layout's consumers. It is idempotent and safe to run from several
// watchers at once.
func ReconcileLayout(ctx context.Context, js jetstream.JetStream, o bus.Options, ps bus.Partitioned) error {
	s, err := js.Stream(ctx, ps.Stream)
	if err != nil {
		return fmt.Errorf("open stream %s: %w", ps.Stream, err)
	}
	n, err := bus.PartitionsOf(s.CachedInfo().Config.Metadata)
	if err != nil {
		return err
	}
	current := make(map[string]bool, n)
	for p := range n {
		current[bus.PartitionConsumerName(ps.Prefix, n, p)] = true
	}
	var stale []string // names of other layouts' consumers
	names := s.ConsumerNames(ctx)
	for name := range names.Name() {
		if _, _, ok := bus.ParsePartitionConsumer(ps.Prefix, name); ok && !current[name] {
			stale = append(stale, name)
		}
	}
	if err := names.Err(); err != nil {
		return fmt.Errorf("list consumers of %s: %w", ps.Stream, err)
	}
	if len(stale) > 0 {
		kv, err := js.KeyValue(ctx, bus.OwnersBucket)
		if err != nil {
			return fmt.Errorf("open lease bucket %s: %w", bus.OwnersBucket, err)
		}
		held := 0
		for _, name := range stale {
			suffix, _, _ := bus.ParsePartitionConsumer(ps.Prefix, name)
			_, err := kv.Get(ctx, bus.LeaseKeyOf(ps.Stage, suffix))
			switch {
			case err == nil:
				held++
			case errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrKeyDeleted):
			default:
				return fmt.Errorf("check lease of %s/%s: %w", ps.Stream, name, err)
			}
		}
		if held > 0 {
			return fmt.Errorf("%s to %d partitions: %d old partitions still leased: %w", ps.Stream, n, held, bus.ErrCutOverPending)
		}
		for _, name := range stale {
			if err := js.DeleteConsumer(ctx, ps.Stream, name); err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) {
				return fmt.Errorf("delete old partition consumer %s/%s: %w", ps.Stream, name, err)
			}
		}
	}
	// Partition 0 last: KeepConsumers takes its presence to mean the
	// whole layout exists.
	for p := n - 1; p >= 0; p-- {
		cfg := consumerConfig(ps.Consumer(o, n, p))
		if err := ensureConsumer(ctx, js, ps.Stream, cfg); err != nil {
			return fmt.Errorf("ensure consumer %s/%s: %w", ps.Stream, cfg.Durable, err)
		}
	}
	return nil
}
