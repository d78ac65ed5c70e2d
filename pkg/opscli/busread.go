package opscli

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

// ownership is what the lease bucket says about a stage.
type ownership struct {
	members []string          // live members
	leases  map[string]string // partition name (<N>-pNN) -> holder
}

// readOwnership reads KV MC_OWNERS (read-only): the members and leases of
// every stage, by stage.
func readOwnership(ctx context.Context, js jetstream.JetStream) (map[string]*ownership, error) {
	kv, err := js.KeyValue(ctx, bus.OwnersBucket)
	if err != nil {
		return nil, fmt.Errorf("open lease bucket %s: %w", bus.OwnersBucket, err)
	}
	w, err := kv.WatchAll(ctx, jetstream.IgnoreDeletes())
	if err != nil {
		return nil, fmt.Errorf("read lease bucket %s: %w", bus.OwnersBucket, err)
	}
	defer func() { _ = w.Stop() }()
	out := map[string]*ownership{}
	get := func(stage string) *ownership {
		o := out[stage]
		if o == nil {
			o = &ownership{leases: map[string]string{}}
			out[stage] = o
		}
		return o
	}
	for {
		select {
		case e, ok := <-w.Updates():
			if !ok {
				return out, nil
			}
			if e == nil { // the initial values are all there
				return out, nil
			}
			kind, rest, _ := strings.Cut(e.Key(), ".")
			stage, id, ok := strings.Cut(rest, ".")
			if !ok {
				continue
			}
			switch kind {
			case "member":
				get(stage).members = append(get(stage).members, id)
			case "lease":
				get(stage).leases[id] = string(e.Value())
			}
		case <-ctx.Done():
			return nil, fmt.Errorf("read lease bucket %s: %w", bus.OwnersBucket, ctx.Err())
		}
	}
}

// subjectCounts is how many messages a stream holds per subject matching
// filter (one stream info request, paged by the client).
func subjectCounts(ctx context.Context, js jetstream.JetStream, stream, filter string) (map[string]uint64, error) {
	s, err := js.Stream(ctx, stream)
	if err != nil {
		return nil, fmt.Errorf("open stream %s: %w", stream, err)
	}
	info, err := s.Info(ctx, jetstream.WithSubjectFilter(filter))
	if err != nil {
		return nil, fmt.Errorf("read subjects of %s: %w", stream, err)
	}
	return info.State.Subjects, nil
}

// partitionConsumers reads the partition consumers of a stream's current
// layout, by partition index.
func partitionConsumers(ctx context.Context, js jetstream.JetStream, stream, prefix string) (n int, infos map[int]*jetstream.ConsumerInfo, err error) {
	s, err := js.Stream(ctx, stream)
	if err != nil {
		return 0, nil, fmt.Errorf("open stream %s: %w", stream, err)
	}
	n, err = jsbus.StreamPartitions(ctx, js, stream)
	if err != nil {
		return 0, nil, err
	}
	byName := map[string]int{}
	for p := range n {
		byName[bus.PartitionConsumerName(prefix, n, p)] = p
	}
	infos = map[int]*jetstream.ConsumerInfo{}
	list := s.ListConsumers(ctx)
	for ci := range list.Info() {
		if p, ok := byName[ci.Name]; ok {
			infos[p] = ci
		}
	}
	if err := list.Err(); err != nil {
		return 0, nil, fmt.Errorf("list consumers of %s: %w", stream, err)
	}
	return n, infos, nil
}

// storedMsg is one message read from a stream without consuming it.
type storedMsg struct {
	Seq     uint64
	Subject string
	Time    time.Time
	Data    []byte
	Header  map[string][]string
}

// scan reads the messages of a stream whose subject matches filter, in
// stream order, from seq from, at most limit of them (limit <= 0: all).
// Reads never remove a message, even from a work queue. more reports that
// the limit stopped the scan.
func scan(ctx context.Context, js jetstream.JetStream, stream, filter string, from uint64, limit int) (msgs []storedMsg, more bool, err error) {
	s, err := js.Stream(ctx, stream)
	if err != nil {
		return nil, false, fmt.Errorf("open stream %s: %w", stream, err)
	}
	seq := max(from, 1)
	for {
		if limit > 0 && len(msgs) == limit {
			return msgs, true, nil
		}
		m, err := s.GetMsg(ctx, seq, jetstream.WithGetMsgSubject(filter))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			return msgs, false, nil
		}
		if err != nil {
			return msgs, false, fmt.Errorf("read %s at %d: %w", stream, seq, err)
		}
		msgs = append(msgs, storedMsg{Seq: m.Sequence, Subject: m.Subject, Time: m.Time, Data: m.Data, Header: m.Header})
		seq = m.Sequence + 1
	}
}
