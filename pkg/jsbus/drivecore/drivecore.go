// Package drivecore holds the decisions of jsbus.Consume's driver (the
// owner of a stage's partitions) as pure functions: what an API answer
// means for a lease write or a consumer reset, how a confirmed ack is
// retried, how a handler's retries are counted, when the heartbeat scans
// and which held message it keeps alive, and how each of the ownership
// core's effects is performed. It imports no NATS package, reads no clock
// (time is an argument) and starts no goroutine: the driver maps
// JetStream's errors to the kinds here at its edge (Err), asks, and
// performs what it is told.
package drivecore

import (
	"time"

	"github.com/metabus/metabus/pkg/outcome"
	"github.com/metabus/metabus/pkg/ownership"
)

// Err is what the driver makes of an API call's error, the only thing
// about it the decisions here depend on.
type Err int

const (
	// ErrNone: no error.
	ErrNone Err = iota
	// ErrNotFound: the consumer, key or message does not exist.
	ErrNotFound
	// ErrDeleted: the key or consumer was deleted.
	ErrDeleted
	// ErrExists: a create found the key, or a write conditional on the
	// key's revision (the subject's last sequence) was refused.
	ErrExists
	// ErrAlreadyAcked: the server had the ack already.
	ErrAlreadyAcked
	// ErrNoHeartbeat: a pull's idle heartbeat was missed (the client
	// pulls again by itself).
	ErrNoHeartbeat
	// ErrLeaderMoved: the consumer's leader moved, and the new one said
	// the pull requests it inherited are void (the client pulls again by
	// itself).
	ErrLeaderMoved
	// ErrRefused: an API error below 500: the server means it.
	ErrRefused
	// ErrNoResponders: nobody serves the API subject.
	ErrNoResponders
	// ErrTimeout: no answer in time.
	ErrTimeout
	// ErrOther: anything else (a 5xx, such as no consumer leader yet).
	ErrOther
)

var errNames = [...]string{"none", "not found", "deleted", "exists", "already acked",
	"no heartbeat", "leader moved", "refused", "no responders", "timeout", "other"}

func (e Err) String() string {
	if e < 0 || int(e) >= len(errNames) {
		return "unknown"
	}
	return errNames[e]
}

// Gone reports whether e says the thing asked for is not there (not
// found, or deleted).
func (e Err) Gone() bool { return e == ErrNotFound || e == ErrDeleted }

// --- lease writes ---

// Answer is what a lease write's answer means: the outcome to feed back
// to the core, unless Ours says to ask first whether the key is still this
// replica's (a refused conditional write may have been this replica's own
// earlier write, applied by the server after its reply was lost); Report
// says the error is worth OnError.
type Answer struct {
	Out    ownership.Outcome
	Ours   bool
	Report bool
}

// Claim reads the answer to a lease create.
func Claim(create Err) Answer {
	switch create {
	case ErrNone:
		return Answer{Out: ownership.OK}
	case ErrExists:
		return Answer{Ours: true}
	default:
		return Answer{Out: ownership.Failed, Report: true}
	}
}

// Regained is a claim's outcome when the key it found was this
// replica's: ours is what rewriting it answered (see Ours).
func Regained(ours ownership.Outcome) ownership.Outcome {
	if ours == ownership.OK {
		return ownership.Regained
	}
	return ours
}

// Recover reads the answer to a lease rewrite at the revision the core
// last knew (a fenced replica taking its lease back).
func Recover(update Err) Answer {
	switch {
	case update == ErrNone:
		return Answer{Out: ownership.OK}
	case update == ErrExists:
		return Answer{Ours: true}
	case update.Gone():
		return Answer{Out: ownership.Taken}
	default:
		return Answer{Out: ownership.Failed}
	}
}

// Renewed reports whether a lease renewal's refusal must be checked
// against the key (see Answer.Ours); a renewal that merely got no answer
// fails and is tried again by the core.
func Renewed(publish Err) (ours bool) { return publish == ErrExists }

// OursRead reads the answer to reading a key whose conditional write was
// refused: whether to rewrite it (it still names this replica: mine), or
// else the outcome.
func OursRead(get Err, mine bool) (rewrite bool, out ownership.Outcome) {
	switch {
	case get.Gone():
		return false, ownership.Taken
	case get != ErrNone:
		return false, ownership.Failed
	case !mine:
		return false, ownership.Taken
	default:
		return true, ownership.OK
	}
}

// OursWrite reads the answer to that rewrite.
func OursWrite(update Err) ownership.Outcome {
	switch update {
	case ErrNone:
		return ownership.OK
	case ErrExists, ErrNotFound:
		return ownership.Taken
	default:
		return ownership.Failed
	}
}

// --- consumer resets ---

// Reset is what a consumer reset's answer means.
type Reset int

const (
	// ResetDone: reset, or no consumer left to reset.
	ResetDone Reset = iota
	// ResetUnsupported: the consumer cannot be reset (a server too old,
	// a user without the permission): the handover goes on without.
	ResetUnsupported
	// ResetProbe: no answer. A user without the permission gets none
	// (the server drops the request), nor does a server before 2.14:
	// ask the consumer's info; if it answers, the API is up and the
	// reset unsupported (ResetProbed).
	ResetProbe
	// ResetNoAnswer: no answer, nor from the info: tried again while the
	// lease holds.
	ResetNoAnswer
	// ResetError: another error (a 5xx, such as no consumer leader yet):
	// tried again while the lease holds.
	ResetError
)

// ResetAnswer reads the answer to a consumer reset.
func ResetAnswer(reset Err) Reset {
	switch reset {
	case ErrNone, ErrNotFound:
		return ResetDone
	case ErrRefused, ErrNoResponders:
		return ResetUnsupported
	case ErrTimeout:
		return ResetProbe
	default:
		return ResetError
	}
}

// ResetProbed reads the consumer info's answer after a reset got none
// (ResetProbe).
func ResetProbed(info Err) Reset {
	if info == ErrNone {
		return ResetUnsupported
	}
	return ResetNoAnswer
}

// --- consumption ---

// ConsumeFailure says what a consumption's error means: whether it ends
// the consumption (the core starts another) and whether OnError hears of
// it. A consumer not found or deleted is expected (a cut-over's old
// consumers go away) and ends it silently; a missed idle heartbeat and a
// leader move are the client's to recover from.
func ConsumeFailure(e Err) (ends, report bool) {
	switch {
	case e == ErrNoHeartbeat, e == ErrLeaderMoved:
		return false, false
	case e.Gone():
		return true, false
	default:
		return false, true
	}
}

// StartFailure says whether a consumption that could not start is worth
// OnError (it always ends: the core tries again).
func StartFailure(e Err) (report bool) { return !e.Gone() }

// --- settling ---

// Settle is how a message is settled from its handler's final outcome.
type Settle int

const (
	// SettleAck acknowledges it (confirmed, in an ordered stage).
	SettleAck Settle = iota
	// SettleTerm terminates it with the outcome's reason.
	SettleTerm
	// SettleGiveBack naks it, if the lease still holds: the server
	// redelivers it, as after a crash, counting the delivery.
	SettleGiveBack
)

// SettleOf says how to settle a final outcome of kind k; unknown says
// the handler returned something this runtime does not settle (worth
// OnError), as opposed to none at all (its context ended first).
func SettleOf(k outcome.Kind) (s Settle, unknown bool) {
	switch k {
	case outcome.KindDone:
		return SettleAck, false
	case outcome.KindTerminal:
		return SettleTerm, false
	default:
		return SettleGiveBack, k != 0
	}
}

// AckBackoff paces the retries of an ordered stage's confirmed ack: a
// lost ack must not let the parent's next message run while this one is
// still in the stream, so it is tried again, while the lease holds, after
// 50 ms, doubling to at most 1 s. Each attempt waits at most Timeout.
type AckBackoff struct {
	wait time.Duration
}

// Next is how long to wait before the next attempt, after a failed one.
func (b *AckBackoff) Next() time.Duration {
	if b.wait == 0 {
		b.wait = 50 * time.Millisecond
	} else {
		b.wait = min(2*b.wait, time.Second)
	}
	return b.wait
}

// AckTimeout bounds one attempt of a confirmed ack: an API request's
// bound, and no more than a lease renewal's period (lease/5), so that a
// slow server costs no more than one renewal's worth of the lease.
func AckTimeout(api, lease time.Duration) time.Duration { return min(api, lease/5) }

// Acked reports whether a confirmed ack's answer settles the message.
func Acked(e Err) bool { return e == ErrNone || e == ErrAlreadyAcked }

// Retries counts a message's in-place retries and says how long each
// waits: a Retry's wait grows with the Retries so far (this one
// included), a RetryAt's and a Throttled's do not count.
type Retries struct {
	n int
}

// Wait counts out (a retrying outcome) and returns its wait from now.
func (r *Retries) Wait(out outcome.Outcome, now time.Time) time.Duration {
	if out.Kind == outcome.KindRetry {
		r.n++
	}
	return out.Wait(now, r.n)
}

// CheckFailed is the outcome of an ordered stage's oldest-message check
// that could not be made: tried again in place after a second, uncounted.
func CheckFailed() outcome.Outcome { return outcome.Retry(time.Second, 0) }

// --- the heartbeat ---

// BeatPeriod is a partition's keep-alive period: this replica's AckWait,
// or the consumer's own if shorter (streams created by another process
// may use a shorter one). A consumer's zero means unset.
func BeatPeriod(configured, consumer time.Duration) time.Duration {
	if consumer > 0 && consumer < configured {
		return consumer
	}
	return configured
}

// MinBeat is the shortest of the owner's keep-alive periods so far (cur,
// zero when none yet) and p.
func MinBeat(cur, p time.Duration) time.Duration {
	if cur == 0 || p < cur {
		return p
	}
	return cur
}

// BeatWait is how long the heartbeat sleeps before its next scan, given
// the earliest keep-alive due among the messages held at the last scan
// (zero: none known yet, as right after the first message arrives) and
// period, the shortest keep-alive period of the owner's partitions. It
// never scans more often than every period/12 (at least 20 ms, at most
// 250 ms: how late a keep-alive may be), and never waits longer than
// period/3, so a message that arrives meanwhile, due period/3 after it
// arrives at the earliest, is seen by then.
func BeatWait(now, next time.Time, period time.Duration) time.Duration {
	floor := min(max(period/12, 20*time.Millisecond), 250*time.Millisecond)
	if next.IsZero() {
		return floor
	}
	return min(max(next.Sub(now), floor), max(period/3, floor))
}

// Scan is one heartbeat scan over the held messages: Visit says of each
// whether its keep-alive is due, and Next is then the earliest due after
// the scan (zero if nothing was visited).
type Scan struct {
	Now  time.Time
	Next time.Time
}

// Visit looks at a message last kept alive at last (or received then),
// whose partition's keep-alive period is beat: a keep-alive is due every
// beat/3. It returns whether one is due now, and the message's new last.
func (s *Scan) Visit(last time.Time, beat time.Duration) (due bool, newLast time.Time) {
	if s.Now.Sub(last) >= beat/3 {
		due, last = true, s.Now
	}
	if at := last.Add(beat / 3); s.Next.IsZero() || at.Before(s.Next) {
		s.Next = at
	}
	return due, last
}

// --- effects ---

// Mode is how the driver performs an effect of the ownership core. The
// core's effects are performed in the order it gives them; the mode says
// which part of each happens at once, under the owner's lock, and which on
// a goroutine of its own, never under the lock.
type Mode int

const (
	// Inline: at once, under the lock (local state: a deadline, a
	// cancellation, a handler started, messages dropped, a metric).
	Inline Mode = iota
	// Async: a network call, on a goroutine of its own; it feeds its
	// answer back to the core.
	Async
	// Start: local state at once (a consumption's epoch and lease, the
	// partition marked busy), then the network call on a goroutine of
	// its own (starting or stopping the consumption).
	Start
)

// ModeOf is how an effect of kind k is performed; ok is false for a kind
// this driver does not know (a core newer than its driver).
func ModeOf(k ownership.Kind) (m Mode, ok bool) {
	switch k {
	case ownership.Deadline, ownership.Cancel, ownership.Run, ownership.Drop, ownership.Nak,
		ownership.Owned, ownership.Disowned:
		return Inline, true
	case ownership.Consume, ownership.StopConsume:
		return Start, true
	case ownership.ReadLayout, ownership.RenewMember, ownership.Leave, ownership.Claim, ownership.Renew,
		ownership.Open, ownership.ReadFloor, ownership.Reset, ownership.DeleteLease, ownership.Recover:
		return Async, true
	}
	return 0, false
}
