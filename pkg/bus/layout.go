package bus

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/nats-io/nats.go/jetstream"
)

// Partition layout: MC_WORK and MC_DESIRED store every message under one of
// Slots slots (subjects.go); a partition is the set of slots s with
// s mod N == p (N a power of two), consumed by the durable consumer
// <prefix><N>-pNN through wildcard filters on the slot tokens (one for the
// default 64, at most 8 for any N but 1), and owned by one replica at a time through
// the lease lease.<stage>.<N>-pNN (owners.go). N, the partition count, is a
// setting stored in the stream's metadata (PartitionsMetadata).
//
// Changing N moves no message, but for a while the old and the new
// partitions of a parent differ, so the cut-over must never let an old and
// a new owner run the same parent at once:
//
//  1. The watcher writes the new N into the stream metadata (Ensure).
//  2. Every replica reads N on each lease tick, hands back the partitions
//     of the old layout it holds (graceful: waiting messages naked,
//     running ones finished) and deletes their leases.
//  3. The watcher deletes the old layout's consumers only once none of
//     their leases exists (ReconcileLayout), then creates the new ones.
//     WorkQueue streams refuse overlapping consumers, so the new ones
//     cannot exist before.
//  4. Replicas claim the new partitions and consume them.
//
// A replica that claims an old-layout lease concurrently with step 3 reads
// N again after its claim and gives the lease back unused if N changed:
// either its claim came first and the watcher saw it and waited, or it
// came after the metadata write and its read sees the new N. Unacked
// messages of the old consumers stay in the stream (WorkQueue retention
// deletes only acked ones) and the new consumers deliver them in stream
// order, so nothing is lost and a parent's desired states keep their order.
// A cut-over pauses consumption for about one lease tick plus the time the
// slowest running handler takes to finish.

// DefaultPartitions is the partition count of a new installation.
const DefaultPartitions = 64

// EmbeddedPartitions is the partition count of an embedded server's new
// streams (the all-in-one process, `make run`, the tests), unless a count is
// asked for. A partition is the unit of ownership among a stage's replicas,
// not of serialization (owners serialize per parent), so it only bounds how
// many replicas of a stage get work: one process needs one, and the few
// replicas that may join it over TCP need a few. Every partition costs each
// stage a consumer (five goroutines between client and server, its pull
// requests and heartbeats) and a lease renewal every 2 s: 64 of them held
// about 12 MiB of the all-in-one's memory and most of its idle CPU.
const EmbeddedPartitions = 8

// LegacyPartitions is the partition count of releases before slots, whose
// consumers were named <prefix>pNN and whose streams stored messages under
// slot hash mod 64 (<root>.<slot mod 64>.<ctrl>.<uid>). The filters of a
// partition count that divides 64 match those subjects too, in the
// partition of the parent's slot, so an upgrade keeping 64 partitions
// (the default) serializes old and new messages of a parent in the same
// partition. Raise the count above 64 only after the upgrade's cut-over
// has delivered the old messages: its filters name whole slots.
const LegacyPartitions = 64

// PartitionsMetadata is the stream metadata key holding the partition
// count of MC_WORK and MC_DESIRED.
const PartitionsMetadata = "metabus.dev/partitions"

// ValidPartitions reports whether n is a usable partition count: a power
// of two from 1 to Slots, so that partitions are unions of slot tokens.
func ValidPartitions(n int) error {
	if n < 1 || n > Slots || n&(n-1) != 0 {
		return fmt.Errorf("partitions must be a power of two from 1 to %d, not %d", Slots, n)
	}
	return nil
}

// PartitionOf is the partition of a slot when there are n partitions.
func PartitionOf(slot, n int) int { return slot % n }

// PartitionConsumerName is the durable name of partition p of n.
func PartitionConsumerName(prefix string, n, p int) string {
	return fmt.Sprintf("%s%d-p%02d", prefix, n, p)
}

// LeaseKey is the lease of partition p of n in a stage.
func LeaseKey(stage string, n, p int) string {
	return leaseKeyOf(stage, PartitionConsumerName("", n, p))
}

// leaseKeyOf is the lease key of a partition consumer's name without its
// prefix (legacy consumers pNN had leases lease.<stage>.pNN).
func leaseKeyOf(stage, suffix string) string { return "lease." + stage + "." + suffix }

// partitionFilters are the filter subjects of partition p of n (a power of
// two): with n up to 64, the groups (first slot token) g ≡ p mod n, any
// slot; above 64, the slots s ≡ p mod n, in their group.
func partitionFilters(root string, n, p int) []string {
	if n <= groups {
		out := make([]string, 0, groups/n)
		for g := p; g < groups; g += n {
			out = append(out, root+"."+strconv.Itoa(g)+".*.>")
		}
		return out
	}
	out := make([]string, 0, Slots/n)
	for s := p; s < Slots; s += n {
		out = append(out, root+"."+strconv.Itoa(s%groups)+"."+strconv.Itoa(s)+".>")
	}
	return out
}

// parsePartitionConsumer recognizes a partition consumer's name, current
// (<prefix><n>-pNN) or legacy (<prefix>pNN), and returns the name without
// its prefix, which is also its lease's last token.
func parsePartitionConsumer(prefix, name string) (suffix string, n int, ok bool) {
	rest, found := strings.CutPrefix(name, prefix)
	if !found {
		return "", 0, false
	}
	if p, legacy := strings.CutPrefix(rest, "p"); legacy {
		if _, err := strconv.Atoi(p); err == nil {
			return rest, LegacyPartitions, true
		}
		return "", 0, false
	}
	ns, p, found := strings.Cut(rest, "-p")
	if !found {
		return "", 0, false
	}
	n, err := strconv.Atoi(ns)
	if err != nil {
		return "", 0, false
	}
	if _, err := strconv.Atoi(p); err != nil {
		return "", 0, false
	}
	return rest, n, true
}

// partitionsOf reads the partition count from stream metadata; a stream
// without it predates the setting and has the default.
func partitionsOf(md map[string]string) (int, error) {
	v, ok := md[PartitionsMetadata]
	if !ok {
		return DefaultPartitions, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil {
		return 0, fmt.Errorf("stream metadata %s=%q: %w", PartitionsMetadata, v, err)
	}
	if err := ValidPartitions(n); err != nil {
		return 0, fmt.Errorf("stream metadata %s: %w", PartitionsMetadata, err)
	}
	return n, nil
}

// StreamPartitions reads a stream's current partition count (one stream
// info request, answered by the stream leader).
func StreamPartitions(ctx context.Context, js jetstream.JetStream, stream string) (int, error) {
	s, err := js.Stream(ctx, stream)
	if err != nil {
		return 0, fmt.Errorf("read partitions of %s: %w", stream, err)
	}
	return partitionsOf(s.CachedInfo().Config.Metadata)
}

// partitioned describes one partitioned stream for the layout reconciler.
type partitioned struct {
	stream, prefix, stage string
	consumer              func(o Options, n, p int) jetstream.ConsumerConfig
}

func partitionedStreams() []partitioned {
	return []partitioned{
		{WorkStream, WorkConsumerPrefix, WorkStage, WorkConsumerConfig},
		{DesiredStream, DesiredConsumerPrefix, DesiredStage, DesiredConsumerConfig},
	}
}

// ErrCutOverPending reports that a stream's partition count changed and
// replicas still hold leases of the old layout: ReconcileLayout deleted
// nothing and must run again (KeepConsumers does, every interval).
var ErrCutOverPending = errors.New("partition cut-over pending: old partitions still leased")

// ReconcileLayout brings one partitioned stream's consumers to its current
// layout: it deletes the consumers of any other layout once none of their
// leases is held (step 3 of the cut-over), then creates or updates the
// layout's consumers. It is idempotent and safe to run from several
// watchers at once.
func ReconcileLayout(ctx context.Context, js jetstream.JetStream, o Options, ps partitioned) error {
	s, err := js.Stream(ctx, ps.stream)
	if err != nil {
		return fmt.Errorf("open stream %s: %w", ps.stream, err)
	}
	n, err := partitionsOf(s.CachedInfo().Config.Metadata)
	if err != nil {
		return err
	}
	current := make(map[string]bool, n)
	for p := range n {
		current[PartitionConsumerName(ps.prefix, n, p)] = true
	}
	var stale []string // names of other layouts' consumers
	names := s.ConsumerNames(ctx)
	for name := range names.Name() {
		if _, _, ok := parsePartitionConsumer(ps.prefix, name); ok && !current[name] {
			stale = append(stale, name)
		}
	}
	if err := names.Err(); err != nil {
		return fmt.Errorf("list consumers of %s: %w", ps.stream, err)
	}
	if len(stale) > 0 {
		kv, err := js.KeyValue(ctx, OwnersBucket)
		if err != nil {
			return fmt.Errorf("open lease bucket %s: %w", OwnersBucket, err)
		}
		held := 0
		for _, name := range stale {
			suffix, _, _ := parsePartitionConsumer(ps.prefix, name)
			_, err := kv.Get(ctx, leaseKeyOf(ps.stage, suffix))
			switch {
			case err == nil:
				held++
			case errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrKeyDeleted):
			default:
				return fmt.Errorf("check lease of %s/%s: %w", ps.stream, name, err)
			}
		}
		if held > 0 {
			return fmt.Errorf("%s to %d partitions: %d old partitions still leased: %w", ps.stream, n, held, ErrCutOverPending)
		}
		for _, name := range stale {
			if err := js.DeleteConsumer(ctx, ps.stream, name); err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) {
				return fmt.Errorf("delete old partition consumer %s/%s: %w", ps.stream, name, err)
			}
		}
	}
	// Partition 0 last: KeepConsumers takes its presence to mean the
	// whole layout exists.
	for p := n - 1; p >= 0; p-- {
		cfg := ps.consumer(o, n, p)
		if err := ensureConsumer(ctx, js, ps.stream, cfg); err != nil {
			return fmt.Errorf("ensure consumer %s/%s: %w", ps.stream, cfg.Durable, err)
		}
	}
	return nil
}
