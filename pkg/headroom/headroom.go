// Package headroom decides whether a partition's owner takes a message in
// hand or puts it off, so that one controller cannot fill the window of
// unacknowledged messages (the consumer's MaxAckPending) that every
// controller hashed to the partition shares. It is a pure core: no
// goroutines, no clocks, no I/O; package jsbus performs what it decides.
//
// Why putting off, and how. JetStream stops delivering a partition's
// messages once MaxAckPending of them are unacknowledged, whatever their
// controller. A message a replica holds (running, or waiting for its
// controller's turn) counts, and so does one it naks, with or without a
// delay: the server keeps it pending until it is redelivered, and the
// redelivery counts against MaxDeliver, then the dead-letter queue. Only
// an ack (or a term) frees its place. So a message of a controller that
// already holds Limit messages of the partition is stored again to come
// back later (the dispatcher schedules its work item in MC_SCHED, where a
// parent's sooner schedule wins) and then acked: durable before it is
// acked, so nothing is lost, even if the replica dies in between (the
// message is then delivered again, and stored again); and never counted as
// a failed delivery.
//
// Only under pressure. A controller beyond Limit is put off only while
// the owner holds at least Busy messages of the partition (all
// controllers together): below that the window has room for everyone, and
// putting off one controller's burst would only delay it (a well-behaved
// burst of new parents holds hundreds of messages in hand, mostly waiting
// their turn for the replica's in-flight limit). So a controller holds at
// most max(Limit, Busy) of a partition, and every other controller finds
// the rest of the window open.
//
// When it comes back. Put-off messages of a (partition, controller) come
// back in waves of at most Limit, one wave per spacing: the age of the
// oldest message the controller holds there, between MinDelay and
// MaxDelay. That age is about how long the controller takes to work
// through the Limit it holds, so a wave finds room when it comes back, and
// a controller whose hook hangs is not put off again and again at a higher
// rate than it drains. No wave is further off than MaxDelay: that bounds
// how long a controller that drains faster again (a fixed hook) waits for
// what was put off while it was slow, and the re-puts a controller that
// never drains costs (one per message per MaxDelay).
package headroom

import (
	"time"
)

// Defaults of Config's delays.
const (
	DefaultMinDelay = time.Second
	DefaultMaxDelay = 5 * time.Minute
)

// Config bounds what one owner holds in hand.
type Config struct {
	// Limit is how many messages of one group (a controller) one owner
	// may hold in hand from one partition; ≤ 0: no limit (every message
	// is taken).
	Limit int
	// Busy is how many messages of one partition (every group together)
	// the owner holds before Limit applies; ≤ 0: Limit always applies.
	Busy int
	// MinDelay and MaxDelay bound how far off a message is put (zero:
	// DefaultMinDelay, DefaultMaxDelay).
	MinDelay, MaxDelay time.Duration
}

// Slot is what Limit applies to: a group's messages from one partition.
type Slot struct {
	Part, Group string
}

// Decision is what to do with a message offered.
type Decision struct {
	// Take: hold it in hand (it is counted until Release).
	Take bool
	// At is when a message put off (Take false) is to come back.
	At time.Time
}

// Book counts what an owner holds per Slot. The zero value is not usable:
// call New.
type Book struct {
	cfg   Config
	slots map[Slot]*slot
	// parts counts what is held per partition, every group together.
	parts map[string]int
}

type slot struct {
	// held are the messages in hand, with when each was taken.
	held map[uint64]time.Time
	// order has the ids of held in the order they were taken, and some
	// already released (trimmed from the front, compacted when they
	// outnumber the held ones): its first held id is the oldest.
	order []uint64
	// due is when the latest wave of put-off messages comes back, and
	// inDue how many were put off to it.
	due   time.Time
	inDue int
}

// New returns an empty book.
func New(cfg Config) *Book {
	if cfg.MinDelay <= 0 {
		cfg.MinDelay = DefaultMinDelay
	}
	if cfg.MaxDelay <= 0 {
		cfg.MaxDelay = DefaultMaxDelay
	}
	if cfg.MaxDelay < cfg.MinDelay {
		cfg.MaxDelay = cfg.MinDelay
	}
	return &Book{cfg: cfg, slots: map[Slot]*slot{}, parts: map[string]int{}}
}

// Offer decides about message id of s arriving at now: taken (and
// counted) while s holds fewer than Limit or its partition fewer than
// Busy, else put off to the wave it joins.
func (b *Book) Offer(s Slot, id uint64, now time.Time) Decision {
	st := b.slot(s)
	if b.cfg.Limit <= 0 || len(st.held) < b.cfg.Limit || b.parts[s.Part] < b.cfg.Busy {
		b.take(s, st, id, now)
		return Decision{Take: true}
	}
	return Decision{At: b.putOff(st, now)}
}

// Take counts message id of s as held whatever the limit: one that could
// not be put off (storing it again failed) is held rather than lost or
// given back to the server.
func (b *Book) Take(s Slot, id uint64, now time.Time) {
	b.take(s, b.slot(s), id, now)
}

func (b *Book) take(s Slot, st *slot, id uint64, now time.Time) {
	if st.take(id, now) {
		b.parts[s.Part]++
	}
}

// Release ends the count of message id of s (settled, given back, or
// dropped with its partition). A slot with nothing held and no wave to
// come is forgotten.
func (b *Book) Release(s Slot, id uint64, now time.Time) {
	st := b.slots[s]
	if st == nil {
		return
	}
	if _, ok := st.held[id]; !ok {
		return
	}
	delete(st.held, id)
	if b.parts[s.Part]--; b.parts[s.Part] <= 0 {
		delete(b.parts, s.Part)
	}
	if len(st.held) == 0 {
		st.order = st.order[:0]
		if !st.due.After(now) {
			delete(b.slots, s)
		}
		return
	}
	st.trim()
	if len(st.order) > 2*len(st.held)+16 {
		kept := st.order[:0]
		for _, x := range st.order {
			if _, ok := st.held[x]; ok {
				kept = append(kept, x)
			}
		}
		st.order = kept
	}
}

// Held is how many messages of s are counted.
func (b *Book) Held(s Slot) int {
	if st := b.slots[s]; st != nil {
		return len(st.held)
	}
	return 0
}

// PartHeld is how many messages of partition part are counted, every
// group together.
func (b *Book) PartHeld(part string) int { return b.parts[part] }

// Slots is how many slots the book remembers (tests: forgotten ones do
// not accumulate).
func (b *Book) Slots() int { return len(b.slots) }

func (b *Book) slot(s Slot) *slot {
	st := b.slots[s]
	if st == nil {
		st = &slot{held: map[uint64]time.Time{}}
		b.slots[s] = st
	}
	return st
}

// take counts id as held from now; false if it already was.
func (st *slot) take(id uint64, now time.Time) bool {
	if _, ok := st.held[id]; ok {
		return false
	}
	st.held[id] = now
	st.order = append(st.order, id)
	return true
}

// trim drops released ids from the front of order.
func (st *slot) trim() {
	i := 0
	for i < len(st.order) {
		if _, ok := st.held[st.order[i]]; ok {
			break
		}
		i++
	}
	st.order = st.order[i:]
}

// putOff returns when a message of st put off at now comes back: with the
// latest wave while it has room (fewer than Limit), else one spacing after
// it (or after now, if it has come), no further than MaxDelay.
func (b *Book) putOff(st *slot, now time.Time) time.Time {
	if st.due.After(now) && st.inDue < b.cfg.Limit {
		st.inDue++
		return st.due
	}
	st.trim()
	spacing := b.cfg.MinDelay
	if len(st.order) > 0 {
		spacing = min(max(now.Sub(st.held[st.order[0]]), b.cfg.MinDelay), b.cfg.MaxDelay)
	}
	next := now.Add(spacing)
	if st.due.After(now) {
		next = st.due.Add(spacing)
	}
	if horizon := now.Add(b.cfg.MaxDelay); next.After(horizon) {
		next = horizon
	}
	if !next.After(st.due) {
		// The latest wave is already at the horizon: it grows.
		st.inDue++
		return st.due
	}
	st.due, st.inDue = next, 1
	return next
}
