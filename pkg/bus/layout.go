package bus

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// Partition layout: MC_WORK and MC_DESIRED store every message under one of
// Slots slots (subjects.go); a partition is the set of slots s with
// s mod N == p (N a power of two), consumed by the durable consumer
// <prefix><N>-pNN through wildcard filters on the slot tokens (64/N for N
// up to 64: one for 64, four for the default 16; 1024/N above), and owned
// by one replica at a time through the lease lease.<stage>.<N>-pNN
// (owners.go). N, the partition count, is a setting stored in the stream's
// metadata (PartitionsMetadata).
//
// Changing N moves no message, but for a while the old and the new
// partitions of a parent differ, so the cut-over must never let an old and
// a new owner run the same parent at once:
//
//  1. The watcher writes the new N into the stream metadata (Ensure).
//  2. Every replica reads N on each lease tick, hands back the partitions
//     of the old layout it holds (graceful: running handlers finished,
//     waiting messages left to the stream) and deletes their leases.
//  3. The watcher deletes the old layout's consumers only once none of
//     their leases exists (ReconcileLayout), then creates the new ones.
//     WorkQueue streams refuse overlapping consumers, so the new ones
//     cannot exist before.
//  4. Replicas claim the new partitions and consume them.
//
// A replica that claims an old-layout lease concurrently with step 3 reads
// N again after its claim, consumes only once a read made after the claim
// confirms N (a failed read confirms nothing), and gives the lease back
// unused if N changed: either its claim came first and the watcher saw it
// and waited, or it came after the metadata write and its read sees the
// new N. Unacked
// messages of the old consumers stay in the stream (WorkQueue retention
// deletes only acked ones) and the new consumers deliver them in stream
// order, so nothing is lost and a parent's desired states keep their order.
// A cut-over pauses consumption for about one lease tick plus the time the
// slowest running handler takes to finish.

// DefaultPartitions is the partition count of a new installation: at most
// this many replicas of a stage get work, and the count can be raised live
// (--partitions). Every partition costs each stage replica, even at rest, a
// consumer with its pull request and idle heartbeats and a lease renewal
// every Lease/5, and costs the server a consumer (a raft group of its own
// with replicated streams) and those renewals' writes: at rest, the
// partitions were most of a dispatcher's or an applier's CPU at 64 (see
// docs/performance.md, "Partitions at rest"). 16 still gives every replica
// of a stage of 1, 2, 4, 8 or 16 replicas an equal share. Installations
// made with 64 keep it (PartitionsOf).
const DefaultPartitions = 16

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
// (what a stream without the setting has, PartitionsOf) serializes old and
// new messages of a parent in the same partition. Raise the count above 64
// only after the upgrade's cut-over has delivered the old messages: its
// filters name whole slots.
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
	return LeaseKeyOf(stage, PartitionConsumerName("", n, p))
}

// LeaseKeyOf is the lease key of a partition consumer's name without its
// prefix (legacy consumers pNN had leases lease.<stage>.pNN).
func LeaseKeyOf(stage, suffix string) string { return "lease." + stage + "." + suffix }

// PartitionFilters are the filter subjects of partition p of n (a power of
// two) of the stream rooted at root: with n up to 64, the groups (first
// slot token) g ≡ p mod n, any slot; above 64, the slots s ≡ p mod n, in
// their group.
func PartitionFilters(root string, n, p int) []string {
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

// ParsePartitionConsumer recognizes a partition consumer's name, current
// (<prefix><n>-pNN) or legacy (<prefix>pNN), and returns the name without
// its prefix, which is also its lease's last token.
func ParsePartitionConsumer(prefix, name string) (suffix string, n int, ok bool) {
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

// PartitionsOf reads the partition count from stream metadata; a stream
// without it predates the setting and has the count of those releases,
// LegacyPartitions (not DefaultPartitions, which only new streams get).
func PartitionsOf(md map[string]string) (int, error) {
	v, ok := md[PartitionsMetadata]
	if !ok {
		return LegacyPartitions, nil
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

// ErrCutOverPending reports that a stream's partition count changed and
// replicas still hold leases of the old layout: the old consumers cannot be
// deleted yet, and the reconciler must run again.
var ErrCutOverPending = errors.New("partition cut-over pending: old partitions still leased")
