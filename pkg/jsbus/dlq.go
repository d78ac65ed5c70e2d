package jsbus

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/metabus/metabus/pkg/bus"
	"github.com/metabus/metabus/pkg/outcome"
)

// DeadLetter describes a message moved to MC_DLQ.
type DeadLetter struct {
	Stream     string
	Subject    string
	Deliveries uint64
	Parent     bus.ObjectRef
	// MapKey is the dead item's map key ("" for a per-parent item), so a
	// report can name the input whose item died, not only its parent.
	MapKey string
}

// maxDeliveriesAdvisory is the part of JetStream's MAX_DELIVERIES advisory
// the DLQ worker needs.
type maxDeliveriesAdvisory struct {
	Stream     string `json:"stream"`
	Consumer   string `json:"consumer"`
	StreamSeq  uint64 `json:"stream_seq"`
	Deliveries uint64 `json:"deliveries"`
}

// RunDLQ moves poison messages out of MC_WORK and MC_DESIRED until ctx is
// done. After MaxDeliver a WorkQueue message stays in its stream and keeps
// one of its parent's two per-subject slots (measured), so it must be
// deleted, not just reported. It returns an error when its consumer goes
// away; run it under Supervise.
func RunDLQ(ctx context.Context, js jetstream.JetStream, onDead func(DeadLetter), onError func(error)) error {
	cons, err := js.Consumer(ctx, bus.AdvisoryStream, bus.DLQConsumer)
	if err != nil {
		return fmt.Errorf("open dead-letter consumer: %w", err)
	}
	lost := newConsumeWatch()
	cc, err := cons.Consume(func(m jetstream.Msg) {
		_ = settlePlain(m, moveDead(ctx, js, m, onDead, onError))
	}, jetstream.ConsumeErrHandler(lost.handler(onError)))
	if err != nil {
		return fmt.Errorf("consume advisories: %w", err)
	}
	return lost.wait(ctx, cc, "dead-letter worker")
}

// errPermanent marks a dead-letter failure that no retry can fix: the
// advisory is terminated. Every other failure is retried.
var errPermanent = errors.New("permanent")

func permanent(err error) error { return fmt.Errorf("%w: %w", errPermanent, err) }

// moveDead handles one max-deliveries advisory: the message it names is
// moved to MC_DLQ (Done), an advisory that can never be handled is
// dropped (Terminal), and a transient failure (NATS unavailable, a
// timeout, a leader move) is retried after 1 s doubling per delivery, at
// most 30 s: otherwise the poison message would stay in its stream for
// good, holding one of its parent's two MC_WORK slots. MC_ADV's MaxAge
// bounds how long an advisory is retried.
func moveDead(ctx context.Context, js jetstream.JetStream, m jetstream.Msg, onDead func(DeadLetter), onError func(error)) outcome.Outcome {
	dl, err := deadLetter(ctx, js, m.Data())
	if err != nil {
		onError(err)
		if errors.Is(err, errPermanent) {
			return outcome.Terminal(err.Error())
		}
		attempt := 1
		if md, err := m.Metadata(); err == nil && md.NumDelivered > 0 {
			attempt = int(min(md.NumDelivered, 64))
		}
		return outcome.Retry(time.Second, attempt)
	}
	if dl != nil && onDead != nil {
		onDead(*dl)
	}
	return outcome.Done()
}

// deadLetter moves the message an advisory names to MC_DLQ. Errors wrapping
// errPermanent cannot succeed on retry; all others may.
func deadLetter(ctx context.Context, js jetstream.JetStream, data []byte) (*DeadLetter, error) {
	var adv maxDeliveriesAdvisory
	if err := json.Unmarshal(data, &adv); err != nil {
		return nil, permanent(fmt.Errorf("decode max-deliveries advisory: %w", err))
	}
	if adv.Stream != bus.WorkStream && adv.Stream != bus.DesiredStream || adv.StreamSeq == 0 {
		return nil, permanent(fmt.Errorf("max-deliveries advisory for %s seq %d: not a metabus message", adv.Stream, adv.StreamSeq))
	}
	stream, err := js.Stream(ctx, adv.Stream)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil, permanent(fmt.Errorf("open stream %s: %w", adv.Stream, err)) // and its message with it
	}
	if err != nil {
		return nil, fmt.Errorf("open stream %s: %w", adv.Stream, err)
	}
	raw, err := stream.GetMsg(ctx, adv.StreamSeq)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return nil, nil // acked or deleted since
	}
	if err != nil {
		return nil, fmt.Errorf("get %s seq %d: %w", adv.Stream, adv.StreamSeq, err)
	}
	stage := "work"
	if adv.Stream == bus.DesiredStream {
		stage = "desired"
	}
	// uid is the parent token: a keyed item is parked under its own
	// <uid>~<key> subject, which mc.dlq.> and the parent's events still
	// cover.
	_, ctrlID, uid, err := bus.ParseStoredSubject(raw.Subject)
	if err != nil {
		return nil, permanent(err)
	}
	hdr := nats.Header{}
	for k, v := range raw.Header {
		hdr[k] = v
	}
	hdr.Set("Metabus-Dead-Reason", "max deliveries exceeded")
	hdr.Set("Metabus-Deliveries", strconv.FormatUint(adv.Deliveries, 10))
	hdr.Set("Metabus-Original-Subject", raw.Subject)
	// MC_DLQ keeps a message for a week for people to inspect: any Secret
	// a message carries (a desired state's, or one a later work item
	// format might) is parked without its data.
	parked, note := bus.RedactSecrets(raw.Data)
	if note != "" {
		hdr.Set("Metabus-Redacted", note)
	}
	// A retry after a failed delete parks the same message again: MC_DLQ's
	// duplicate window drops the copy.
	dlqID := fmt.Sprintf("dlq:%s:%d", adv.Stream, adv.StreamSeq)
	hdr.Del(jetstream.MsgIDHeader)
	if _, err := js.PublishMsg(ctx, &nats.Msg{Subject: bus.DLQSubject(stage, ctrlID, uid), Header: hdr, Data: parked}, jetstream.WithMsgID(dlqID)); err != nil {
		return nil, fmt.Errorf("park message in %s: %w", bus.DLQStream, err)
	}
	if err := stream.DeleteMsg(ctx, adv.StreamSeq); err != nil && !errors.Is(err, jetstream.ErrMsgNotFound) {
		return nil, fmt.Errorf("delete %s seq %d: %w", adv.Stream, adv.StreamSeq, err)
	}
	dl := &DeadLetter{Stream: adv.Stream, Subject: raw.Subject, Deliveries: adv.Deliveries}
	var body struct {
		Parent bus.ObjectRef `json:"parent"`
		MapKey string        `json:"mapKey"`
	}
	if json.Unmarshal(raw.Data, &body) == nil {
		dl.Parent = body.Parent
		dl.MapKey = body.MapKey
	}
	return dl, nil
}
