package jsbus

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/metabus/metabus/pkg/bus"
	"github.com/metabus/metabus/pkg/outcome"
)

// Handler processes one message and returns how it ended; Consume settles
// the message from that outcome, the handler never does (the message's
// Ack, Nak and Term fail). The context is cancelled when the replica loses
// the message's partition; a handler that stops then may return the zero
// outcome.
type Handler func(ctx context.Context, m jetstream.Msg) outcome.Outcome

// settlePlain settles a message of a plain consumer (one without partition
// ownership: the schedule relay, the dead-letter worker) from its outcome:
// Done acks, Terminal terms with the reason, a retry naks with its wait
// (the server's redelivery, counted against the consumer's MaxDeliver; a
// plain consumer counts no retries itself, so a Retry without an Attempt
// waits its After), and no outcome naks at once.
func settlePlain(m jetstream.Msg, o outcome.Outcome) error {
	switch {
	case o.Kind == outcome.KindDone:
		return m.Ack()
	case o.Kind == outcome.KindTerminal:
		return m.TermWithReason(o.Reason)
	case o.Retries():
		return m.NakWithDelay(o.Wait(time.Now(), 1))
	default:
		return m.Nak()
	}
}

// Meta returns the stream sequence and delivery count of a message.
func Meta(m jetstream.Msg) (streamSeq uint64, delivered uint64, err error) {
	md, err := m.Metadata()
	if err != nil {
		return 0, 0, fmt.Errorf("message metadata: %w", err)
	}
	return md.Sequence.Stream, md.NumDelivered, nil
}

// RunRelay moves fired schedules (mc.due.*) into MC_WORK until ctx is done.
// Any number of replicas may run it: a relayed item that was already queued
// collapses into the pending one.
//
// MC_SCHED is a limits stream, so the relay deletes each due message it has
// relayed (or can never relay): otherwise the stream keeps one fired due
// message per parent ever scheduled. A due message is deleted by its own
// sequence, so a newer one for the same parent, fired meanwhile, stays. The
// schedule itself (mc.sched.*) is purged by the server when it fires.
// Deletes run beside the relay, not in its path: a slow or refused delete
// (a NATS user without $JS.API.STREAM.MSG.DELETE.MC_SCHED) never delays
// relaying; a due message left behind is only space, and the next due
// message of the same parent replaces it (MaxMsgsPerSubject=1).
func RunRelay(ctx context.Context, js jetstream.JetStream, onError func(error)) error {
	return RunRelayWith(ctx, Publisher{JS: js}, onError)
}

// RunRelayWith is RunRelay publishing through pub (its Queued hook counts
// the relayed items).
func RunRelayWith(ctx context.Context, pub Publisher, onError func(error)) error {
	return RunRelayGated(ctx, pub, nil, onError)
}

// RelayGate paces the resyncs hooks ask for (bus.ReasonResyncAfter): the
// relay asks it before such an item goes into MC_WORK, and a wait > 0
// schedules the item again in MC_SCHED that much later instead (the due
// message is settled: held back, it would count against the relay's
// MaxAckPending, which every controller's schedules share). An error is
// reported and the item relayed.
type RelayGate func(ctx context.Context, item bus.WorkItem) (time.Duration, error)

// RunRelayGated is RunRelayWith asking gate (nil: none) before relaying a
// hook-asked resync.
func RunRelayGated(ctx context.Context, pub Publisher, gate RelayGate, onError func(error)) error {
	js := pub.JS
	cons, err := js.Consumer(ctx, bus.SchedStream, bus.DueConsumer)
	if err != nil {
		return fmt.Errorf("open relay consumer: %w", err)
	}
	sched, err := js.Stream(ctx, bus.SchedStream)
	if err != nil {
		return fmt.Errorf("open stream %s: %w", bus.SchedStream, err)
	}
	deletes := make(chan uint64, 1024)
	go func() {
		for {
			var seq uint64
			select {
			case <-ctx.Done():
				return
			case seq = <-deletes:
			}
			dctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			err := sched.DeleteMsg(dctx, seq)
			cancel()
			if err != nil && !errors.Is(err, jetstream.ErrMsgNotFound) && ctx.Err() == nil {
				onError(fmt.Errorf("delete relayed due message %s seq %d: %w", bus.SchedStream, seq, err))
			}
		}
	}()
	remove := func(m jetstream.Msg) {
		seq, _, err := Meta(m)
		if err != nil {
			onError(err)
			return
		}
		select {
		case deletes <- seq:
		default: // backlog full: left for the parent's next due message to replace
		}
	}
	lost := newConsumeWatch()
	cc, err := cons.Consume(func(m jetstream.Msg) {
		out := relay(ctx, pub, gate, m, onError)
		_ = settlePlain(m, out)
		if !out.Retries() {
			remove(m) // relayed, or never relayable
		}
	}, jetstream.ConsumeErrHandler(lost.handler(onError)))
	if err != nil {
		return fmt.Errorf("consume due schedules: %w", err)
	}
	return lost.wait(ctx, cc, "schedule relay")
}

// relay moves one fired schedule into MC_WORK, or, a hook-asked resync
// the gate holds back, into MC_SCHED again.
func relay(ctx context.Context, pub Publisher, gate RelayGate, m jetstream.Msg, onError func(error)) outcome.Outcome {
	var item bus.WorkItem
	if err := Decode(m, bus.TypeSyncRequested, &item); err != nil {
		onError(err)
		return outcome.Terminal("malformed due work item")
	}
	if gate != nil && item.Reason == bus.ReasonResyncAfter {
		wait, err := gate(ctx, item)
		if err != nil {
			onError(err)
		}
		if wait > 0 {
			if err := pub.Schedule(ctx, item, time.Now().Add(wait)); err != nil {
				onError(fmt.Errorf("schedule a held-back resync again: %w", err))
				return outcome.Retry(time.Second, 0)
			}
			return outcome.Done()
		}
	}
	if _, err := pub.PublishWork(ctx, item); err != nil {
		onError(err)
		return outcome.Retry(time.Second, 0)
	}
	return outcome.Done()
}

// consumeWatch notices that a Consume has stopped for good (its consumer
// or stream deleted), so a background worker returns an error to be
// restarted and reported instead of idling on a dead subscription.
type consumeWatch struct {
	once sync.Once
	dead chan error
}

func newConsumeWatch() *consumeWatch { return &consumeWatch{dead: make(chan error, 1)} }

// handler is a ConsumeErrHandler: it passes errors on (not missed
// heartbeats or leader moves, which the client recovers from) and stops
// the consume on a terminal one.
func (w *consumeWatch) handler(onError func(error)) jetstream.ConsumeErrHandler {
	return func(cc jetstream.ConsumeContext, err error) {
		if errors.Is(err, jetstream.ErrNoHeartbeat) || errors.Is(err, jetstream.ErrConsumerLeadershipChanged) {
			return
		}
		if errors.Is(err, jetstream.ErrConsumerDeleted) || errors.Is(err, jetstream.ErrConsumerNotFound) ||
			errors.Is(err, jetstream.ErrStreamNotFound) {
			w.once.Do(func() { w.dead <- err })
			cc.Stop()
			return
		}
		onError(err)
	}
}

// wait blocks until ctx is done (drains and returns nil) or the consume
// stopped on its own (returns why).
func (w *consumeWatch) wait(ctx context.Context, cc jetstream.ConsumeContext, what string) error {
	select {
	case <-ctx.Done():
		cc.Drain()
		return nil
	case err := <-w.dead:
		cc.Stop()
		return fmt.Errorf("%s stopped: %w", what, err)
	case <-cc.Closed():
		select {
		case err := <-w.dead:
			return fmt.Errorf("%s stopped: %w", what, err)
		default:
		}
		if ctx.Err() != nil {
			return nil
		}
		return fmt.Errorf("%s stopped: subscription closed", what)
	}
}

// SuperviseOptions tune Supervise. Zero values are production defaults.
type SuperviseOptions struct {
	// Base is the first restart delay, doubled after each failed run up to
	// Max (defaults 1 s and 30 s).
	Base, Max time.Duration
	// Settle is how long a run must last to count as up (default 2 s): a
	// worker that fails at start is never reported ready in between.
	Settle time.Duration
}

// Supervise runs a background worker (RunRelay, RunDLQ) until ctx is done,
// restarting it with exponential backoff whenever it returns. state gets
// the reason whenever the worker is down and nil once a run has lasted
// Settle; readiness checks report it. The backoff resets after a run that
// lasted a minute.
func Supervise(ctx context.Context, o SuperviseOptions, run func(context.Context) error, state func(error)) {
	if o.Base <= 0 {
		o.Base = time.Second
	}
	if o.Max <= 0 {
		o.Max = 30 * time.Second
	}
	if o.Settle <= 0 {
		o.Settle = 2 * time.Second
	}
	delay := o.Base
	for ctx.Err() == nil {
		start := time.Now()
		var mu sync.Mutex
		running := true
		up := time.AfterFunc(o.Settle, func() {
			mu.Lock()
			defer mu.Unlock()
			if running { // never report up after the run has returned
				state(nil)
			}
		})
		err := run(ctx)
		mu.Lock()
		running = false
		mu.Unlock()
		settled := !up.Stop()
		if ctx.Err() != nil {
			return
		}
		if err == nil {
			err = errors.New("stopped")
		}
		state(err)
		if settled && time.Since(start) > time.Minute {
			delay = o.Base
		}
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		delay = min(2*delay, o.Max)
	}
}
