// Package busstats reads the state of metabus's bus from JetStream (stream
// depths, partition consumers' pending and redelivered counts, the work
// waiting per controller and the age of its oldest item, the dead-letter
// queue, partition ownership) and exports it as Prometheus metrics.
//
// Nothing here sits on a message's path: a Read is a handful of JetStream
// API requests (stream and consumer info, one message header read per
// controller with waiting work), made by one process of the installation
// (the watcher that leads) when it is scraped, at most once per interval.
package busstats

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/metabus/metabus/pkg/bus"
	"github.com/metabus/metabus/pkg/jsbus"
)

// DefaultMaxSubjects bounds the per-subject listing a Read asks a stream
// for (about 80 bytes a subject): with more parents waiting than this, the
// per-controller figures of that stream are skipped for the round
// (Stats.Detailed reports it) and only the stream's totals are read.
const DefaultMaxSubjects = 10000

// Stats is one reading of the bus.
type Stats struct {
	// At is when the reading was taken.
	At time.Time
	// Streams are the totals of every metabus stream found, by name.
	Streams map[string]Stream
	// Partitions are the partition consumers of MC_WORK and MC_DESIRED.
	Partitions []Partition
	// Queues are the messages of each controller waiting (or being
	// handled) in MC_WORK (stage "work") and MC_DESIRED ("desired").
	Queues []Queue
	// DeadLetters counts MC_DLQ's messages by stage and controller.
	DeadLetters []Queue
	// Stages are the partition counts and ownership of each stage.
	Stages map[string]Stage
	// Detailed is false when a stream held too many distinct subjects to
	// list: its per-controller figures are missing from Queues or
	// DeadLetters.
	Detailed bool
}

// Stream is a stream's totals.
type Stream struct {
	Messages, Bytes uint64
	// Oldest is the timestamp of its oldest message (zero: none).
	Oldest time.Time
}

// Partition is one partition consumer's state.
type Partition struct {
	// Stage is bus.WorkStage or bus.DesiredStage; Name is the partition
	// (<N>-pNN, the consumer's name without its prefix).
	Stage, Name string
	// Pending are messages not delivered yet; AckPending delivered and
	// not acknowledged (held by the owner: waiting their parent's turn or
	// running); Redelivered those among AckPending delivered more than
	// once.
	Pending                 uint64
	AckPending, Redelivered int
}

// Queue is what one controller has in a stream.
type Queue struct {
	Stage string
	// ControllerID is the controller's subject token (bus.ControllerID).
	ControllerID string
	Messages     uint64
	// Oldest is the timestamp of its oldest message (Queues only).
	Oldest time.Time
}

// Stage is one stage's partitions and their owners, read from the lease
// bucket.
type Stage struct {
	// Partitions is the stream's partition count; Owned how many of them
	// have a lease; Members the replicas registered in the stage. A lease
	// or member deleted less than the lease TTL (10 s) ago still counts:
	// the bucket keeps the deletion marker that long.
	Partitions, Owned, Members int
}

// Options tune Read.
type Options struct {
	// MaxSubjects is DefaultMaxSubjects when zero.
	MaxSubjects int
}

var partitionedStreams = []struct{ stream, prefix, stage, root string }{
	{bus.WorkStream, bus.WorkConsumerPrefix, bus.WorkStage, "mc.work"},
	{bus.DesiredStream, bus.DesiredConsumerPrefix, bus.DesiredStage, "mc.desired"},
}

// Read takes a reading of the bus. A stream that does not exist is left
// out; any other failure is an error.
func Read(ctx context.Context, js jetstream.JetStream, o Options) (*Stats, error) {
	if o.MaxSubjects <= 0 {
		o.MaxSubjects = DefaultMaxSubjects
	}
	st := &Stats{At: time.Now(), Streams: map[string]Stream{}, Stages: map[string]Stage{}, Detailed: true}
	for _, p := range partitionedStreams {
		s, subjects, err := st.stream(ctx, js, p.stream, p.root+".>", o.MaxSubjects)
		if err != nil {
			return nil, err
		}
		if s == nil {
			continue
		}
		if err := st.partitions(ctx, s, p.stage, p.prefix); err != nil {
			return nil, err
		}
		if err := st.queues(ctx, s, p.stage, p.root, subjects); err != nil {
			return nil, err
		}
	}
	_, dlq, err := st.stream(ctx, js, bus.DLQStream, "mc.dlq.>", o.MaxSubjects)
	if err != nil {
		return nil, err
	}
	st.DeadLetters = deadLetters(dlq)
	for _, name := range []string{bus.SchedStream, bus.AdvisoryStream} {
		if _, _, err := st.stream(ctx, js, name, "", 0); err != nil {
			return nil, err
		}
	}
	if err := st.owners(ctx, js, o.MaxSubjects); err != nil {
		return nil, err
	}
	return st, nil
}

// stream records a stream's totals and, given a filter, returns its
// per-subject counts (nil when there are more than max subjects). A
// missing stream returns nil, nil, nil.
func (st *Stats) stream(ctx context.Context, js jetstream.JetStream, name, filter string, max int) (jetstream.Stream, map[string]uint64, error) {
	s, err := js.Stream(ctx, name)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil, nil, nil
	}
	if err != nil {
		return nil, nil, fmt.Errorf("read stream %s: %w", name, err)
	}
	state := s.CachedInfo().State
	st.Streams[name] = Stream{Messages: state.Msgs, Bytes: state.Bytes, Oldest: oldest(state.Msgs, state.FirstTime)}
	if filter == "" || state.NumSubjects == 0 {
		return s, nil, nil
	}
	if state.NumSubjects > uint64(max) {
		st.Detailed = false
		return s, nil, nil
	}
	info, err := s.Info(ctx, jetstream.WithSubjectFilter(filter))
	if err != nil {
		return nil, nil, fmt.Errorf("list subjects of %s: %w", name, err)
	}
	return s, info.State.Subjects, nil
}

func oldest(msgs uint64, first time.Time) time.Time {
	if msgs == 0 {
		return time.Time{}
	}
	return first
}

func (st *Stats) partitions(ctx context.Context, s jetstream.Stream, stage, prefix string) error {
	l := s.ListConsumers(ctx)
	for ci := range l.Info() {
		name, ok := strings.CutPrefix(ci.Name, prefix)
		if !ok {
			continue
		}
		st.Partitions = append(st.Partitions, Partition{Stage: stage, Name: name,
			Pending: ci.NumPending, AckPending: ci.NumAckPending, Redelivered: ci.NumRedelivered})
	}
	if err := l.Err(); err != nil {
		return fmt.Errorf("list consumers of %s: %w", s.CachedInfo().Config.Name, err)
	}
	return nil
}

// queues sums subjects by controller and reads the oldest message of each
// controller that has any: one message read per such controller.
func (st *Stats) queues(ctx context.Context, s jetstream.Stream, stage, root string, subjects map[string]uint64) error {
	counts := map[string]uint64{}
	for subject, n := range subjects {
		_, ctrl, _, err := bus.ParseStoredSubject(subject)
		if err != nil {
			continue // not a metabus subject: nothing to attribute
		}
		counts[ctrl] += n
	}
	first := s.CachedInfo().State.FirstSeq
	for ctrl, n := range counts {
		q := Queue{Stage: stage, ControllerID: ctrl, Messages: n}
		m, err := s.GetMsg(ctx, first, jetstream.WithGetMsgSubject(root+".*.*."+ctrl+".*"))
		switch {
		case err == nil:
			q.Oldest = m.Time
		case errors.Is(err, jetstream.ErrMsgNotFound):
			// Handled since the listing (or stored under the layout
			// before slots): no age to report.
		default:
			return fmt.Errorf("read the oldest message of %s in %s: %w", ctrl, s.CachedInfo().Config.Name, err)
		}
		st.Queues = append(st.Queues, q)
	}
	return nil
}

// deadLetters sums MC_DLQ's subjects mc.dlq.<stage>.<ctrl>.<uid> by stage
// and controller.
func deadLetters(subjects map[string]uint64) []Queue {
	type key struct{ stage, ctrl string }
	counts := map[key]uint64{}
	for subject, n := range subjects {
		parts := strings.Split(subject, ".")
		if len(parts) != 5 {
			continue
		}
		counts[key{parts[2], parts[3]}] += n
	}
	var out []Queue
	for k, n := range counts {
		out = append(out, Queue{Stage: k.stage, ControllerID: k.ctrl, Messages: n})
	}
	return out
}

// owners counts leases and members per stage from the lease bucket's
// subjects ($KV.MC_OWNERS.lease.<stage>.<N>-pNN,
// $KV.MC_OWNERS.member.<stage>.<id>).
func (st *Stats) owners(ctx context.Context, js jetstream.JetStream, max int) error {
	for _, p := range partitionedStreams {
		if _, ok := st.Streams[p.stream]; !ok {
			continue
		}
		n, err := jsbus.StreamPartitions(ctx, js, p.stream)
		if err != nil {
			return err
		}
		st.Stages[p.stage] = Stage{Partitions: n}
	}
	_, subjects, err := st.stream(ctx, js, "KV_"+bus.OwnersBucket, "$KV."+bus.OwnersBucket+".>", max)
	if err != nil {
		return err
	}
	delete(st.Streams, "KV_"+bus.OwnersBucket) // not a queue: its totals mean nothing to an operator
	for subject := range subjects {
		parts := strings.Split(subject, ".")
		if len(parts) != 5 {
			continue
		}
		kind, stage, id := parts[2], parts[3], parts[4]
		s, ok := st.Stages[stage]
		if !ok {
			continue
		}
		switch kind {
		case "lease":
			if i := partitionIndex(id); i >= 0 && i < s.Partitions && id == bus.PartitionConsumerName("", s.Partitions, i) {
				s.Owned++
			}
		case "member":
			s.Members++
		}
		st.Stages[stage] = s
	}
	return nil
}

// partitionIndex is the NN of a lease suffix <N>-pNN (-1 if malformed).
func partitionIndex(suffix string) int {
	_, p, ok := strings.Cut(suffix, "-p")
	if !ok {
		return -1
	}
	var n int
	if _, err := fmt.Sscanf(p, "%d", &n); err != nil {
		return -1
	}
	return n
}
