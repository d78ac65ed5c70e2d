// Package outcome is what a bus handler returns: how its message ended,
// in one small vocabulary shared by every stage. A handler decides; the bus
// runtime (package jsbus) alone settles the message from the outcome (ack,
// retry in place or nak with a delay, term), so no service acks, naks or
// terms anything itself. The package is pure: a service's mapping from its
// own errors to outcomes needs no NATS import to be written or tested.
//
// An outcome settles the message it was returned for, nothing else: work a
// handler publishes on its own behalf (a desired state, a sync scheduled
// for later through MC_SCHED) is its effect, done before it returns Done.
package outcome

import (
	"fmt"
	"time"
)

// Kind says how a message ended.
type Kind uint8

// The kinds. The zero Kind is no outcome (see Outcome).
const (
	// KindDone: the message's work is finished. Settlement: ack (in an
	// ordered stage, acked and confirmed by the server while the
	// partition's lease holds, so the parent's next message never runs
	// while this one is still in the stream).
	KindDone Kind = iota + 1
	// KindRetry: the work failed for a reason that may pass (the bus or
	// a service of metabus's own unreachable); run the message again
	// after a delay (Wait). Settlement: under partition ownership
	// (jsbus.Consume) the message runs again in place, keeping its
	// parent's turn and its delivery budget (no redelivery is counted,
	// so it never reaches MaxDeliver and the dead-letter queue); on a
	// plain consumer (the schedule relay, the dead-letter worker) it is
	// nak'ed with the delay and redelivered by the server, each
	// redelivery counted.
	KindRetry
	// KindRetryAt: run the message again at a given time; settled as
	// KindRetry, the wait being what is left until then, not grown.
	KindRetryAt
	// KindTerminal: nothing can ever process the message (it does not
	// decode). Settlement: term with the reason, which the server keeps
	// in its advisory; the message is never redelivered and never
	// dead-lettered (the dead-letter queue takes messages that exceeded
	// MaxDeliver, not terminated ones).
	KindTerminal
	// KindThrottled: a dependency asked to be left alone for a while
	// (a 429's Retry-After); settled as KindRetry after exactly that
	// delay, not grown and not counted as a failed attempt.
	KindThrottled
)

// MaxRetryWait bounds the wait of a retry whose delay grows with its
// attempt (Wait).
const MaxRetryWait = 30 * time.Second

// Outcome is how a handler's message ended. Build one with Done, Retry,
// RetryAt, Terminal or Throttled.
//
// The zero Outcome is none: a handler returns it only when its context
// ended before it could decide (its partition lease was lost). The
// runtime then settles nothing the new owner would not redo: the message
// is left to the server's redelivery, as after a crash.
type Outcome struct {
	Kind Kind
	// After is the delay of a Retry (before growth) or a Throttled.
	After time.Duration
	// Attempt numbers a Retry among the retries of its message, 1 for the
	// first; 0 leaves the counting to the runtime (which counts the
	// retries it runs in place). It grows the wait (Wait).
	Attempt int
	// At is when a RetryAt runs again.
	At time.Time
	// Reason says why a Terminal message is dropped.
	Reason string
}

// Done is a finished message: ack.
func Done() Outcome { return Outcome{Kind: KindDone} }

// Retry runs the message again after a delay that grows with attempt
// (see Outcome.Wait); attempt 0 lets the runtime count.
func Retry(after time.Duration, attempt int) Outcome {
	return Outcome{Kind: KindRetry, After: after, Attempt: attempt}
}

// RetryAt runs the message again at t.
func RetryAt(t time.Time) Outcome { return Outcome{Kind: KindRetryAt, At: t} }

// Terminal drops a message nothing can ever process, saying why.
func Terminal(reason string) Outcome { return Outcome{Kind: KindTerminal, Reason: reason} }

// Throttled runs the message again after exactly after.
func Throttled(after time.Duration) Outcome { return Outcome{Kind: KindThrottled, After: after} }

// defaultRetryWait replaces a retry's zero or negative wait, which would
// spin.
const defaultRetryWait = 100 * time.Millisecond

// Retries reports whether the outcome runs the message again later.
func (o Outcome) Retries() bool {
	return o.Kind == KindRetry || o.Kind == KindRetryAt || o.Kind == KindThrottled
}

// Wait is how long to wait, from now, before running a retried message
// again; counted is the runtime's own count of the message's retries,
// this one included, used when the outcome carries no Attempt.
//
// A Retry waits After·2^(attempt-1) (After 100 ms if not positive), at
// most MaxRetryWait but never less than After: a dependency that keeps failing is tried less and less
// often. A RetryAt waits until At, a Throttled exactly After. A wait that
// comes out zero or negative is 100 ms. Other kinds do not wait (0).
func (o Outcome) Wait(now time.Time, counted int) time.Duration {
	var d time.Duration
	switch o.Kind {
	case KindRetry:
		n := o.Attempt
		if n <= 0 {
			n = counted
		}
		after := o.After
		if after <= 0 {
			after = defaultRetryWait
		}
		d = after
		for i := 1; i < n && d < MaxRetryWait; i++ {
			d *= 2
		}
		d = max(after, min(d, MaxRetryWait))
	case KindRetryAt:
		d = o.At.Sub(now)
	case KindThrottled:
		d = o.After
	default:
		return 0
	}
	if d <= 0 {
		return defaultRetryWait
	}
	return d
}

// String names the outcome for logs and test failures.
func (o Outcome) String() string {
	switch o.Kind {
	case KindDone:
		return "done"
	case KindRetry:
		if o.Attempt > 0 {
			return fmt.Sprintf("retry after %s (attempt %d)", o.After, o.Attempt)
		}
		return fmt.Sprintf("retry after %s", o.After)
	case KindRetryAt:
		return "retry at " + o.At.UTC().Format(time.RFC3339Nano)
	case KindTerminal:
		return "terminal: " + o.Reason
	case KindThrottled:
		return fmt.Sprintf("throttled for %s", o.After)
	case 0:
		return "none"
	}
	return fmt.Sprintf("outcome kind %d", o.Kind)
}
