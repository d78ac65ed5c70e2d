package jsbus

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Order of an ordered stage (MC_DESIRED) that does not depend on the order
// the server redelivers in.
//
// nats-server redelivers in the order messages were queued for
// redelivery, not in stream order, and under the consumers' BackOff a
// message on its second delivery comes back twice as late as one on its
// first; messages given back with a nak come back in the order of the
// naks. So after a takeover the next owner can be handed a parent's newer
// desired state before an older one that the previous owner still held.
//
// The rule that keeps the order whatever the server does: a message of an
// ordered stage runs only when it is the oldest message of its item (the
// stored subject: a parent, or one map key of it) left in the stream. An
// older one left there is one that some owner once received and never
// settled; the message in hand supersedes it, so it is deleted first (or,
// if the stage says it must never be skipped, left to run whenever it
// comes back: a finalizer release is idempotent and order-free). A message
// that is no longer in the stream (deleted that way by another owner's
// newer message, or acknowledged) is not run.
//
// The high-water mark thus lives in the stream itself: WorkQueue retention
// deletes a desired state once it is acknowledged, and every older one of
// its item was deleted before it ran, so nothing older than an applied
// desired state is ever left to run, across crashes of every replica. It
// costs no write on the hot path: a delete only when an older message is
// found, which only a takeover or handover leaves behind.

// oldest makes sure m (stream sequence seq on stored subject subj) is the
// oldest message of its item in the stream: older ones are deleted unless
// keep says they must run anyway. run is false when m is no longer in the
// stream.
func oldest(ctx context.Context, store msgStore, stream, subj string, seq uint64, keep func(nats.Header, []byte) bool) (run bool, err error) {
	from := uint64(1)
	for {
		first, err := store.FirstFrom(ctx, stream, subj, from)
		switch {
		case errors.Is(err, jetstream.ErrMsgNotFound):
			return false, nil
		case err != nil:
			return false, err
		case first.Sequence == seq:
			return true, nil
		case first.Sequence > seq:
			return false, nil
		}
		from = first.Sequence + 1
		if keep != nil && keep(first.Header, first.Data) {
			continue
		}
		if err := store.DeleteMsg(ctx, stream, first.Sequence); err != nil {
			return false, err
		}
	}
}

// firstFrom reads the first message of subj at or after sequence from,
// from the stream's leader. A direct get may be answered by a follower
// that has not stored (or deleted) the latest messages yet.
func firstFrom(ctx context.Context, js jetstream.JetStream, stream, subj string, from uint64) (*jetstream.RawStreamMsg, error) {
	req, err := json.Marshal(struct {
		Seq     uint64 `json:"seq"`
		NextFor string `json:"next_by_subj"`
	}{from, subj})
	if err != nil {
		return nil, err
	}
	ctx, cancel := apiContext(ctx)
	defer cancel()
	reply, err := js.Conn().RequestWithContext(ctx, "$JS.API.STREAM.MSG.GET."+stream, req)
	if err != nil {
		return nil, fmt.Errorf("read first message of %s: %w", subj, err)
	}
	var resp struct {
		Error   *jetstream.APIError `json:"error,omitempty"`
		Message *struct {
			Subject  string    `json:"subject"`
			Sequence uint64    `json:"seq"`
			Header   []byte    `json:"hdrs,omitempty"`
			Data     []byte    `json:"data,omitempty"`
			Time     time.Time `json:"time"`
		} `json:"message,omitempty"`
	}
	if err := json.Unmarshal(reply.Data, &resp); err != nil {
		return nil, fmt.Errorf("read first message of %s: %w", subj, err)
	}
	if resp.Error != nil {
		if resp.Error.ErrorCode == jetstream.JSErrCodeMessageNotFound {
			return nil, jetstream.ErrMsgNotFound
		}
		return nil, fmt.Errorf("read first message of %s: %w", subj, resp.Error)
	}
	if resp.Message == nil {
		return nil, fmt.Errorf("read first message of %s: empty answer", subj)
	}
	var hdr nats.Header
	if len(resp.Message.Header) > 0 {
		if hdr, err = nats.DecodeHeadersMsg(resp.Message.Header); err != nil {
			return nil, fmt.Errorf("read first message of %s: %w", subj, err)
		}
	}
	return &jetstream.RawStreamMsg{Subject: resp.Message.Subject, Sequence: resp.Message.Sequence, Header: hdr, Data: resp.Message.Data, Time: resp.Message.Time}, nil
}

// deleteMsg deletes a superseded message (already gone is fine).
func deleteMsg(ctx context.Context, js jetstream.JetStream, stream string, seq uint64) error {
	ctx, cancel := apiContext(ctx)
	defer cancel()
	s, err := js.Stream(ctx, stream)
	if err != nil {
		return fmt.Errorf("delete superseded message %s seq %d: %w", stream, seq, err)
	}
	if err := s.DeleteMsg(ctx, seq); err != nil && !errors.Is(err, jetstream.ErrMsgNotFound) {
		return fmt.Errorf("delete superseded message %s seq %d: %w", stream, seq, err)
	}
	return nil
}

// apiTimeout bounds one JetStream API request made on a message's path.
const apiTimeout = 5 * time.Second

func apiContext(ctx context.Context) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return context.WithCancel(ctx)
	}
	return context.WithTimeout(ctx, apiTimeout)
}
