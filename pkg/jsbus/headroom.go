package jsbus

import (
	"context"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/metabus/metabus/pkg/headroom"
)

// PutOff stores message m again, to come back at (or soon after) at; the
// message is acked once it returns nil. The dispatcher's schedules the
// work item in MC_SCHED, which relays it into MC_WORK when it is due. ctx
// carries the partition's lease (LeaseValid).
type PutOff func(ctx context.Context, m jetstream.Msg, at time.Time) error

// room is the driver of an owner's headroom.Book (ConsumeConfig.Headroom):
// it asks the book about each message received, puts off what the book
// says to, and tells the book what leaves the owner's hands. Its book is
// guarded by the owner's mutex.
type room struct {
	book *headroom.Book
	put  PutOff
}

// newRoom returns the room of c, nil when c bounds nothing (or is ordered:
// a desired state cannot be put off behind a later one of its parent).
func newRoom(c ConsumeConfig) *room {
	if c.Headroom <= 0 || c.PutOff == nil || c.Ordered {
		return nil
	}
	return &room{book: headroom.New(headroom.Config{Limit: c.Headroom, Busy: c.HeadroomBusy}), put: c.PutOff}
}

// admit is receive's question, under o.mu: true when the message is to be
// taken in hand now (and is counted as such); false when it is being put
// off, in a goroutine of its own: stored again, then acked while the lease
// holds. One that cannot be stored again is taken in hand after all (take
// is called then): neither lost nor given back to the server, which would
// count a delivery against MaxDeliver.
func (r *room) admit(o *owner, dp *dpart, id uint64, ctrlID string, m jetstream.Msg, take func()) bool {
	if r == nil {
		return true
	}
	slot := headroom.Slot{Part: dp.name, Group: ctrlID}
	d := r.book.Offer(slot, id, o.clk.Now())
	if d.Take {
		return true
	}
	l := dp.cur
	// Nothing keeps the message alive meanwhile: storing it again must
	// end well within its AckWait.
	wait := apiTimeout
	if dp.beat > 0 {
		wait = min(wait, dp.beat/2)
	}
	go func() {
		ctx, cancel := context.WithTimeout(leaseCtx{Context: l.ctx, l: l}, wait)
		err := r.put(ctx, m, d.At)
		cancel()
		if err == nil {
			if err = l.valid(); err == nil {
				// The message is stored again: acking it loses nothing. A
				// lost ack redelivers it, to be put off again.
				_ = m.Ack()
				return
			}
		}
		if l.valid() == nil {
			o.c.OnError(fmt.Errorf("put off %s message of %s: %w; taken in hand over its controller's headroom", o.c.Stream, ctrlID, err))
		}
		o.mu.Lock()
		defer o.mu.Unlock()
		r.book.Take(slot, id, o.clk.Now())
		take()
	}()
	return false
}

// release ends the count of a message leaving the owner's hands (settled,
// given back or dropped). Called under o.mu.
func (r *room) release(hm *held) {
	if r == nil {
		return
	}
	r.book.Release(headroom.Slot{Part: hm.part.name, Group: hm.group}, hm.id, hm.o.clk.Now())
}
