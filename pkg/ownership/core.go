// Package ownership is the partition-ownership protocol of a stage's
// replicas (dispatchers on MC_WORK, appliers on MC_DESIRED) as a pure state
// machine: events and the clock in, effects out, no goroutines, timers or
// I/O, in the way of etcd raft's Ready/Advance. A thin driver (package jsbus,
// owned.go) performs the effects (lease writes, consumer calls, handler
// runs) and feeds their outcomes back; a simulation (sim_test.go) drives the
// same core through randomized schedules against a model of nats-server.
//
// The protocol. A stream's partitions are shared by the stage's live
// members by rendezvous hashing (Assign). A replica consumes a partition
// only while it holds the partition's lease, a key in a bucket whose
// entries expire Lease after their last write; it renews every Lease/5 and
// counts a lease valid only until 3/5 of Lease after it sent its last
// successful write (its deadline), so it has stopped before the server lets
// the lease expire and another replica may claim it. The deadline is
// enforced twice: by Tick (the fence: no more messages, handlers cancelled),
// which the driver calls from a timer that no network call can delay, and at
// the point of every write by the handlers themselves (the Deadline effect
// gives the driver what to check against).
//
// Transitions of one partition in one replica:
//
//	claiming ─ok→ opening ─layout read after the claim confirms N,
//	                        and the consumer's state is known→ active
//	opening, active ─not assigned any more, layout changed, or Stop→ draining
//	draining ─running handlers done→ resetting ─→ releasing ─→ (gone)
//	opening, active, draining ─deadline passed, or lease taken→ fenced
//	fenced ─handlers done→ recovering ─lease still ours→ resetting
//	                                  └otherwise→ (gone)
//
// Handovers cost nothing: a replica that hands a partition back (draining)
// stops consuming, lets its running handlers finish, drops what waits
// without settling it, and resets the consumer to its ack floor before it
// deletes the lease. The reset makes every message not yet acknowledged
// deliverable again at once, in stream order, with its delivery count
// cleared: no delivery is spent on a rebalance (MaxDeliver stays for crash
// loops), and the next owner waits for nothing. A fenced replica that finds
// its lease still its own once its handlers have stopped (recovering) does
// the same. Only a replica that loses its lease for good (it crashed, or
// could not reach the server for longer than the lease) leaves messages
// pending on the server, which redelivers them after AckWait, counting the
// delivery: a crash loop of one message is still dead-lettered.
//
// Order in ordered stages does not depend on the order of redeliveries: a
// partition whose consumer had messages pending elsewhere when it was
// opened, or whose deliveries skip a delivery sequence (a delivery that
// went to another subscriber), is tainted until its ack floor passes every
// delivery made before: while tainted, each message is checked before it
// runs (Effect.Check) and runs only if it is the oldest of its item left in
// the stream (the driver deletes older ones it supersedes). An untainted
// partition's older messages are all in this replica's hands, where the
// queue (package fairq) runs each item's messages in stream order.
package ownership

import (
	"errors"
	"fmt"
	"sort"
	"time"

	"github.com/metabus/metabus/pkg/fairq"
)

// ErrCannotReset, wrapped in ResetDone's error, says the consumer cannot
// be reset at all (a server before 2.14, a user without the permission),
// rather than that the server did not answer this time.
var ErrCannotReset = errors.New("the consumer cannot be reset")

// Config is one replica's view of the protocol.
type Config struct {
	// Member is this replica's member id.
	Member string
	// Lease is the lease bucket's TTL.
	Lease time.Duration
	// AckWait is the partition consumers' AckWait: how long a handover
	// waits for running handlers before cancelling them.
	AckWait time.Duration
	// Ordered stages keep each item's messages in stream order across
	// takeovers (MC_DESIRED).
	Ordered bool
	// Limits and Weight configure the queue of held messages.
	Limits fairq.Limits
	Weight func(group string) int
}

// Partition is partition P of a layout of N partitions.
type Partition struct{ N, P int }

func (p Partition) String() string { return fmt.Sprintf("%d-p%02d", p.N, p.P) }

// Outcome is the answer to a lease write.
type Outcome int

const (
	// OK: written.
	OK Outcome = iota
	// Taken: the lease is another replica's, or gone: definitive.
	Taken
	// Failed: no answer or an error; the write may or may not have
	// happened.
	Failed
	// Regained (claims): the lease was already this replica's, written by
	// an earlier claim or renewal whose answer it lost track of. Nobody
	// else can have consumed the partition since, so the claim resets the
	// consumer: what that earlier ownership left pending costs nothing.
	Regained
)

// ConsumerState is what a partition consumer's info says.
type ConsumerState struct {
	// AckPending is the number of messages delivered and not settled.
	AckPending int
	// Delivered is the stream sequence of the last delivery and
	// DeliveredSeq its delivery (consumer) sequence.
	Delivered, DeliveredSeq uint64
	// AckFloor is the stream sequence up to which everything is settled.
	AckFloor uint64
}

// Msg is a message delivered to this replica.
type Msg struct {
	// ID is the driver's handle of the message.
	ID uint64
	// Part and Epoch name the consumption it came from (Effect Consume).
	Part  Partition
	Epoch uint64
	// Group (a controller) and Key (an item) schedule it (package fairq).
	Group, Key string
	// Seq is its stream sequence, DSeq its delivery sequence.
	Seq, DSeq uint64
}

// Kind is the kind of an effect.
type Kind int

// Effects. I/O effects report back through the event of the same name
// (Claim → ClaimDone...); the others are local to the driver.
const (
	// ReadLayout reads the stream's partition count (LayoutRead).
	ReadLayout Kind = iota
	// RenewMember writes this replica's member key.
	RenewMember
	// Claim creates Part's lease (ClaimDone).
	Claim
	// Renew writes every lease in Leases, each conditional on its
	// revision (RenewDone).
	Renew
	// Open reads Part's consumer state (OpenDone).
	Open
	// Consume starts consuming Part; deliveries carry Epoch.
	Consume
	// StopConsume stops consumption Epoch of Part.
	StopConsume
	// Deadline sets the time until which Part's handlers may write and
	// settle (zero: not at all).
	Deadline
	// Cancel cancels the contexts of Part's running handlers.
	Cancel
	// Run starts the handler of message ID. Newer says another message
	// of its item waits behind it; Check, that it must first make sure
	// it is the oldest of its item left in the stream.
	Run
	// Drop forgets messages IDs without settling them.
	Drop
	// Reset resets Part's consumer to its ack floor (ResetDone).
	Reset
	// DeleteLease deletes Part's lease at revision Rev (ReleaseDone).
	DeleteLease
	// Recover rewrites Part's lease at revision Rev (RecoverDone).
	Recover
	// ReadFloor reads Part's consumer state for its ack floor (FloorRead).
	ReadFloor
	// Leave deletes this replica's member key: it is stopping, so the
	// others take its partitions as it hands them back.
	Leave
	// Nak gives messages IDs back to the server (the old protocol's
	// handover, kept for the simulation's comparison).
	Nak
	// Owned and Disowned report that this replica took Part's lease, and
	// that it no longer holds it: handed back (Lost false) or lost for
	// good (Lost true). For metrics.
	Owned
	Disowned
)

// Lease is a lease and its revision.
type Lease struct {
	Part Partition
	Rev  uint64
}

// Effect is something the driver must do.
type Effect struct {
	Kind   Kind
	Lost   bool
	Part   Partition
	Rev    uint64
	Epoch  uint64
	Read   uint64
	Until  time.Time
	ID     uint64
	Newer  bool
	Check  bool
	IDs    []uint64
	Leases []Lease
}

// Renewal is the outcome of one lease's renewal.
type Renewal struct {
	Part Partition
	// Rev is the lease's new revision (OK).
	Rev uint64
	Out Outcome
}

type phase int

const (
	claiming phase = iota
	opening
	active
	draining
	resetting
	releasing
	fenced
	recovering
)

var phaseNames = [...]string{"claiming", "opening", "active", "draining", "resetting", "releasing", "fenced", "recovering"}

func (p phase) String() string { return phaseNames[p] }

type part struct {
	id    Partition
	phase phase
	rev   uint64
	// sent is when the write that made rev was sent; deadline is sent +
	// 3/5 Lease.
	deadline time.Time
	// claimRead: a layout read issued after the claim (id > claimRead)
	// must confirm N before the partition is consumed.
	claimRead uint64
	confirmed bool
	opened    bool
	openBusy  bool
	// claimedAt is when the claim succeeded (the old ordered wait).
	claimedAt time.Time
	epoch     uint64
	consumed  bool // consumed since the last reset: a handover resets
	running   int
	waiting   int
	// tainted: messages run only after the oldest check; clean once the
	// ack floor reaches horizon (0: not known yet).
	tainted   bool
	horizon   uint64
	floorBusy bool
	expect    uint64 // next delivery sequence
	drainAt   time.Time
	cancelled bool
	lost      bool // fenced because the lease is another's: no recovery
	// deleteAfterRenew: releasing waits for a renewal in flight.
	deleteAfterRenew bool
	// reopen: after the reset, consume again (a recovery still assigned).
	reopen      bool
	resetFailed bool
	resetSince  time.Time // when resetting began
}

type msg struct {
	Msg
	p *part
}

type doneMark struct {
	seq uint64
	at  time.Time
}

// quirks re-enable the protocol before issue 24, for the simulation to
// show what it finds there. Zero in production.
type quirks struct {
	// nakOnRelease: a handover naks what waits, and what arrives during
	// the drain, and deletes the lease without resetting the consumer.
	nakOnRelease bool
	// noOrderCheck: no oldest check and no taint: a takeover waits for
	// the previous owner's pending messages at most AckWait after its
	// claim (orderedWait) and then consumes whatever comes.
	noOrderCheck bool
	orderedWait  bool
	// layoutErrOK: a failed layout read after a claim counts as "N
	// unchanged".
	layoutErrOK bool
	// noRecover: a fenced partition is forgotten.
	noRecover bool
}

// Core is one replica's partition ownership for one stage. Not safe for
// concurrent use: the driver serializes calls.
type Core struct {
	cfg   Config
	q     quirks
	now   time.Time
	n     int // partition count as last read (0: unknown)
	reads uint64
	// readBusy: a layout read is in flight; readAgain: one issued after it
	// is needed (a claim came back meanwhile).
	readBusy, readAgain bool
	members             map[string]time.Time
	parts               map[Partition]*part
	// renewing holds the revisions sent in the renewal in flight.
	renewing   map[Partition]uint64
	renewSent  time.Time
	nextRenew  time.Time
	nextLayout time.Time
	msgs       map[uint64]*msg
	fq         *fairq.Queue[*msg]
	// done is, per item, the newest message whose handler returned here
	// lately: an older one delivered after it (a redelivery already on
	// its way when it was acknowledged) is checked before it runs.
	done     map[string]doneMark
	begun    bool
	stopping bool
	left     bool
	effects  []Effect
	// membersV counts changes of the live member set; mineV and mineN
	// say which set and layout mineC was computed for.
	membersV, mineV uint64
	mineN           int
	mineC           map[Partition]bool
	// order is parts sorted, nil when parts changed.
	order []*part
}

// New returns the core of a replica that has read the partition count n
// (0 if it could not).
func New(cfg Config, n int, now time.Time) *Core {
	c := &Core{cfg: cfg, now: now, n: n, members: map[string]time.Time{}, parts: map[Partition]*part{},
		msgs: map[uint64]*msg{}, done: map[string]doneMark{}, fq: fairq.New[*msg](cfg.Limits, cfg.Weight)}
	c.emit(Effect{Kind: RenewMember})
	c.nextRenew = now.Add(c.every())
	c.nextLayout = now.Add(c.every())
	return c
}

func (c *Core) every() time.Duration { return c.cfg.Lease / 5 }

// validFor is how long after a lease write was sent the lease counts as
// held: 3/5 of the lease, so that a replica stops well before the server
// can let the lease expire, whatever the latency of the write was.
func (c *Core) validFor() time.Duration { return c.cfg.Lease * 3 / 5 }

func (c *Core) emit(e Effect) { c.effects = append(c.effects, e) }

// Ready returns the effects to perform, in order, and forgets them.
func (c *Core) Ready() []Effect {
	out := c.effects
	c.effects = nil
	return out
}

// Wake is when the core next needs Tick.
func (c *Core) Wake() time.Time {
	w := c.nextRenew
	if c.nextLayout.Before(w) {
		w = c.nextLayout
	}
	for _, p := range c.parts {
		if c.holds(p) && !p.deadline.IsZero() && p.deadline.Before(w) {
			w = p.deadline
		}
		if p.phase == draining && p.running > 0 {
			if d := p.drainAt.Add(c.cfg.AckWait); d.Before(w) {
				w = d
			}
		}
	}
	return w
}

// Left reports whether the replica has handed everything back after Stop.
func (c *Core) Left() bool { return c.left }

// Begin starts claiming partitions. The driver calls it once it has
// learned the members already there (MemberSeen), so that a replica
// joining a running stage claims only its share.
func (c *Core) Begin(now time.Time) {
	c.advance(now)
	c.begun = true
	c.balance()
}

// holds reports whether p's lease is (believed) held and its deadline
// enforced.
func (c *Core) holds(p *part) bool {
	switch p.phase {
	case opening, active, draining, resetting:
		return true
	}
	return false
}

// advance moves the clock to now and fences every partition whose
// deadline has passed. Every event does it first: the handlers check the
// same deadline at the point of writing, so a partition whose deadline
// passed must be fenced before anything else happens to it, even if a
// renewal sent in time answers only now.
func (c *Core) advance(now time.Time) {
	c.now = now
	for _, p := range c.sorted() {
		if c.holds(p) && !now.Before(p.deadline) {
			c.fence(p, false)
		}
	}
}

// Tick advances the clock: the fence, the drain bound, periodic renewals,
// layout reads and the balance.
func (c *Core) Tick(now time.Time) {
	c.advance(now)
	for _, p := range c.sorted() {
		if p.phase == draining && p.running > 0 && !now.Before(p.drainAt.Add(c.cfg.AckWait)) {
			if !p.cancelled {
				// Handlers that outlive a handover are cancelled; if
				// they still run another AckWait, the lease goes.
				p.cancelled = true
				p.drainAt = now
				c.emit(Effect{Kind: Cancel, Part: p.id})
			} else {
				c.fence(p, false)
			}
		}
	}
	if !now.Before(c.nextRenew) {
		c.nextRenew = now.Add(c.every())
		for k, d := range c.done {
			if now.Sub(d.at) > c.cfg.AckWait {
				delete(c.done, k)
			}
		}
		if !c.stopping {
			c.emit(Effect{Kind: RenewMember})
		}
		c.renew()
		for _, p := range c.sorted() {
			if p.tainted && !p.floorBusy && c.holds(p) {
				p.floorBusy = true
				c.emit(Effect{Kind: ReadFloor, Part: p.id})
			}
			if p.phase == opening && !p.opened && !p.openBusy {
				p.openBusy = true
				c.emit(Effect{Kind: Open, Part: p.id})
			}
			if p.phase == resetting && p.resetFailed {
				// A reset that failed is retried while the lease holds.
				p.resetFailed = false
				c.emit(Effect{Kind: Reset, Part: p.id})
			}
		}
	}
	if !now.Before(c.nextLayout) {
		c.nextLayout = now.Add(c.every())
		c.readLayout()
	}
	c.balance()
}

// sorted returns the partitions in a fixed order, so that effects come
// out deterministically. The result is shared: callers that add or remove
// partitions while iterating go on with the old order.
func (c *Core) sorted() []*part {
	if c.order != nil {
		return c.order
	}
	ps := make([]*part, 0, len(c.parts))
	for _, p := range c.parts {
		ps = append(ps, p)
	}
	sort.Slice(ps, func(i, j int) bool {
		if ps[i].id.N != ps[j].id.N {
			return ps[i].id.N < ps[j].id.N
		}
		return ps[i].id.P < ps[j].id.P
	})
	c.order = ps
	return ps
}

func (c *Core) addPart(p *part) {
	c.parts[p.id] = p
	c.order = nil
}

func (c *Core) delPart(id Partition) {
	delete(c.parts, id)
	c.order = nil
}

func (c *Core) readLayout() {
	if c.readBusy {
		c.readAgain = true
		return
	}
	c.readBusy = true
	c.reads++
	c.emit(Effect{Kind: ReadLayout, Read: c.reads})
}

func (c *Core) renew() {
	if c.renewing != nil {
		return // the last round is still out; the deadline covers it
	}
	var ls []Lease
	for _, p := range c.sorted() {
		if c.holds(p) {
			ls = append(ls, Lease{Part: p.id, Rev: p.rev})
		}
	}
	if len(ls) == 0 {
		return
	}
	c.renewing = make(map[Partition]uint64, len(ls))
	for _, l := range ls {
		c.renewing[l.Part] = l.Rev
	}
	c.renewSent = c.now
	c.emit(Effect{Kind: Renew, Leases: ls})
}

// MemberSeen records a write of member id's key.
func (c *Core) MemberSeen(id string, now time.Time) {
	c.advance(now)
	_, known := c.members[id]
	c.members[id] = now
	if !known {
		c.membersV++
		c.balance()
	}
}

// MemberGone records the deletion of member id's key (it left).
func (c *Core) MemberGone(id string, now time.Time) {
	c.advance(now)
	if _, known := c.members[id]; known {
		delete(c.members, id)
		c.membersV++
		c.balance()
	}
}

// live are the members heard from within a lease, this one always.
func (c *Core) live() []string {
	out := []string{c.cfg.Member}
	for id, seen := range c.members {
		if id == c.cfg.Member {
			continue
		}
		if c.now.Sub(seen) > c.cfg.Lease {
			delete(c.members, id)
			c.membersV++
			continue
		}
		out = append(out, id)
	}
	sort.Strings(out)
	return out
}

// mine is the set of partitions of the current layout assigned to this
// replica.
func (c *Core) mine() map[Partition]bool {
	if c.n == 0 || c.stopping {
		return nil
	}
	for id, seen := range c.members {
		if id != c.cfg.Member && c.now.Sub(seen) > c.cfg.Lease {
			delete(c.members, id)
			c.membersV++
		}
	}
	if c.mineC != nil && c.mineV == c.membersV && c.mineN == c.n {
		return c.mineC
	}
	mine := map[Partition]bool{}
	for p, m := range Assign(c.live(), c.n) {
		if m == c.cfg.Member {
			mine[Partition{c.n, p}] = true
		}
	}
	c.mineC, c.mineV, c.mineN = mine, c.membersV, c.n
	return mine
}

// balance claims the partitions assigned here that this replica does not
// hold, and hands back those held but assigned elsewhere or of another
// layout.
func (c *Core) balance() {
	if !c.begun {
		return
	}
	mine := c.mine()
	for _, p := range c.sorted() {
		if (p.phase == opening || p.phase == active) && !mine[p.id] {
			c.release(p)
		}
	}
	ids := make([]Partition, 0, len(mine))
	for id := range mine {
		ids = append(ids, id)
	}
	sort.Slice(ids, func(i, j int) bool { return ids[i].P < ids[j].P })
	for _, id := range ids {
		if _, held := c.parts[id]; !held {
			c.addPart(&part{id: id, phase: claiming})
			c.emit(Effect{Kind: Claim, Part: id})
		}
	}
}

// ClaimDone is the outcome of Claim, sent at sent.
func (c *Core) ClaimDone(id Partition, rev uint64, out Outcome, sent, now time.Time) {
	c.advance(now)
	p := c.parts[id]
	if p == nil || p.phase != claiming {
		if out == OK {
			// A claim nobody waits for any more: give it back.
			c.emit(Effect{Kind: DeleteLease, Part: id, Rev: rev})
		}
		return
	}
	if out != OK && out != Regained {
		c.delPart(id) // claimed again on a later tick
		c.maybeLeave()
		return
	}
	p.rev = rev
	p.deadline = sent.Add(c.validFor())
	p.claimedAt = now
	c.emit(Effect{Kind: Owned, Part: id})
	c.emit(Effect{Kind: Deadline, Part: id, Until: p.deadline})
	// The partition count must be read again after the claim: a cut-over
	// that began before it must not find this lease unused yet consumed.
	p.claimRead = c.reads
	c.readLayout()
	if out == Regained && !c.q.noRecover {
		// What the forgotten ownership left pending is this one's to give
		// back at no cost: a reset comes before consuming, also when the
		// lease must be got back first.
		p.consumed = true
	}
	if !now.Before(p.deadline) {
		// The answer came after the deadline it sets: as after a fence,
		// get the lease back first.
		p.phase = opening
		c.fence(p, false)
		return
	}
	if p.consumed {
		p.phase, p.reopen, p.resetSince = resetting, true, now
		c.emit(Effect{Kind: Reset, Part: id})
		return
	}
	p.phase = opening
	p.openBusy = true
	c.emit(Effect{Kind: Open, Part: id})
	if c.stopping || !c.mine()[id] && c.n != 0 {
		c.release(p)
	}
}

// LayoutRead is the outcome of ReadLayout number read.
func (c *Core) LayoutRead(read uint64, n int, err error, now time.Time) {
	c.advance(now)
	c.readBusy = false
	if err == nil && n > 0 {
		c.n = n
	}
	for _, p := range c.sorted() {
		if p.phase != opening || p.confirmed || read <= p.claimRead {
			continue
		}
		switch {
		case err != nil && c.q.layoutErrOK:
			p.confirmed = true
		case err != nil:
		case p.id.N != n:
			c.release(p) // a cut-over began: never consumed
		default:
			p.confirmed = true
		}
		c.maybeStart(p)
	}
	if c.readAgain {
		c.readAgain = false
		c.readLayout()
	}
	c.balance()
}

// OpenDone is the outcome of Open.
func (c *Core) OpenDone(id Partition, st ConsumerState, err error, now time.Time) {
	c.advance(now)
	p := c.parts[id]
	if p == nil {
		return
	}
	p.openBusy = false
	if p.phase != opening {
		return
	}
	if err != nil {
		return // retried on the next renewal tick
	}
	if c.q.orderedWait && c.cfg.Ordered && st.AckPending > 0 && now.Sub(p.claimedAt) < c.cfg.AckWait {
		return // the old takeover wait: read again on the next tick
	}
	p.opened = true
	p.expect = st.DeliveredSeq + 1
	if c.cfg.Ordered && !c.q.noOrderCheck && st.AckPending > 0 {
		p.tainted, p.horizon = true, st.Delivered
	}
	c.maybeStart(p)
}

func (c *Core) maybeStart(p *part) {
	if p.phase != opening || !p.opened || !p.confirmed {
		return
	}
	p.phase = active
	p.epoch++
	p.consumed = true
	p.cancelled = false
	c.emit(Effect{Kind: Consume, Part: p.id, Epoch: p.epoch})
}

// ConsumeFailed reports that consumption epoch of id stopped on its own
// (the consumer was deleted, or could not be started): it is opened again.
func (c *Core) ConsumeFailed(id Partition, epoch uint64, now time.Time) {
	c.advance(now)
	p := c.parts[id]
	if p == nil || p.phase != active || p.epoch != epoch {
		return
	}
	c.drop(p)
	p.phase = opening
	p.opened = false
	p.openBusy = true
	c.emit(Effect{Kind: Open, Part: id})
}

// drop forgets p's waiting messages without settling them (or, with the
// old protocol, naks them).
func (c *Core) drop(p *part) {
	out := c.fq.Remove(func(_, _ string, m *msg) bool { return m.p == p })
	if len(out) == 0 {
		return
	}
	ids := make([]uint64, len(out))
	for i, m := range out {
		ids[i] = m.ID
		delete(c.msgs, m.ID)
	}
	p.waiting -= len(out)
	kind := Drop
	if c.q.nakOnRelease && p.phase == draining {
		kind = Nak
	}
	c.emit(Effect{Kind: kind, IDs: ids})
}

// release hands p back (draining), or gives up a claim not consumed yet.
func (c *Core) release(p *part) {
	switch p.phase {
	case opening:
		if !p.consumed {
			c.releaseLease(p)
			return
		}
		p.phase = draining
		p.drainAt = c.now
		c.drained(p)
	case active:
		c.emit(Effect{Kind: StopConsume, Part: p.id, Epoch: p.epoch})
		p.phase = draining
		p.drainAt = c.now
		c.drop(p)
		c.drained(p)
	}
}

// drained moves a draining partition on once its handlers are done: reset
// its consumer (what it dropped is delivered again at once, in stream
// order, at no cost), then delete the lease.
func (c *Core) drained(p *part) {
	if p.phase != draining || p.running > 0 {
		return
	}
	if !p.consumed || c.q.nakOnRelease {
		c.releaseLease(p)
		return
	}
	p.phase, p.resetSince = resetting, c.now
	c.emit(Effect{Kind: Reset, Part: p.id})
}

// ResetDone is the outcome of Reset.
func (c *Core) ResetDone(id Partition, err error, now time.Time) {
	c.advance(now)
	p := c.parts[id]
	if p == nil || p.phase != resetting {
		return
	}
	switch {
	case err == nil:
	case errors.Is(err, ErrCannotReset):
		// A server before 2.14, a user without the permission: go on
		// without. What it left pending comes back after AckWait,
		// counted, as before issue 24.
	case c.stopping && !now.Before(p.resetSince.Add(c.cfg.AckWait)):
		// Stopping, and the server has not answered for AckWait: leave
		// the lease to run out, as a crash does (what it left pending is
		// then redelivered, counted, to the next owner).
		c.emit(Effect{Kind: Deadline, Part: id})
		c.delPart(id)
		c.emit(Effect{Kind: Disowned, Part: id, Lost: true})
		c.maybeLeave()
		return
	default:
		// No answer, or an error the server may get over (no consumer
		// leader): tried again on the next tick while the lease holds,
		// however long it takes. Giving up would count what the
		// consumer holds pending, and the consumer cannot deliver while
		// its API does not answer anyway.
		p.resetFailed = true
		return
	}
	p.consumed = false
	p.tainted, p.horizon = false, 0
	if p.reopen && c.mine()[id] {
		p.reopen = false
		p.phase = opening
		p.opened = false
		p.openBusy = true
		c.emit(Effect{Kind: Open, Part: id})
		return
	}
	c.releaseLease(p)
}

func (c *Core) releaseLease(p *part) {
	p.phase = releasing
	c.emit(Effect{Kind: Deadline, Part: p.id})
	if _, busy := c.renewing[p.id]; busy {
		p.deleteAfterRenew = true
		return
	}
	c.emit(Effect{Kind: DeleteLease, Part: p.id, Rev: p.rev})
}

// ReleaseDone reports that DeleteLease was answered (either way: a lease
// not deleted expires on its own).
func (c *Core) ReleaseDone(id Partition, now time.Time) {
	c.advance(now)
	if p := c.parts[id]; p != nil && p.phase == releasing && !p.deleteAfterRenew {
		c.delPart(id)
		c.emit(Effect{Kind: Disowned, Part: id})
	}
	c.maybeLeave()
}

// RenewDone is the outcome of Renew sent at sent.
func (c *Core) RenewDone(rs []Renewal, sent, now time.Time) {
	c.advance(now)
	sentRevs := c.renewing
	c.renewing = nil
	for _, r := range rs {
		p := c.parts[r.Part]
		if p == nil || sentRevs[r.Part] != p.rev {
			continue // not the lease that was renewed any more
		}
		switch r.Out {
		case OK:
			p.rev = r.Rev
			if d := sent.Add(c.validFor()); d.After(p.deadline) {
				p.deadline = d
				if c.holds(p) {
					c.emit(Effect{Kind: Deadline, Part: p.id, Until: p.deadline})
				}
			}
		case Taken:
			if c.holds(p) {
				c.fence(p, true)
			} else {
				p.lost = true
			}
		}
		if p.deleteAfterRenew {
			p.deleteAfterRenew = false
			c.emit(Effect{Kind: DeleteLease, Part: p.id, Rev: p.rev})
		}
	}
	for _, p := range c.sorted() {
		c.afterFence(p)
	}
}

// fence stops p: its lease is not known to be held any more.
func (c *Core) fence(p *part, lost bool) {
	c.emit(Effect{Kind: Deadline, Part: p.id})
	if p.phase == active {
		c.emit(Effect{Kind: StopConsume, Part: p.id, Epoch: p.epoch})
	}
	prev := p.phase
	p.phase = fenced
	c.drop(p)
	if p.running > 0 && !(prev == draining && p.cancelled) {
		c.emit(Effect{Kind: Cancel, Part: p.id})
	}
	p.cancelled = true
	p.lost = p.lost || lost
	c.afterFence(p)
}

// afterFence tries to get a fenced partition back once its handlers are
// done: if the lease is still this replica's, nobody else has run its
// messages, and it can give them back at no cost (or go on consuming).
func (c *Core) afterFence(p *part) {
	if p.phase != fenced || p.running > 0 {
		return
	}
	if _, busy := c.renewing[p.id]; busy {
		return // its renewal's answer may still prove the lease held
	}
	if p.lost || p.rev == 0 || c.q.noRecover {
		c.delPart(p.id)
		c.emit(Effect{Kind: Disowned, Part: p.id, Lost: true})
		c.maybeLeave()
		return
	}
	p.phase = recovering
	c.emit(Effect{Kind: Recover, Part: p.id, Rev: p.rev})
}

// RecoverDone is the outcome of Recover sent at sent.
func (c *Core) RecoverDone(id Partition, rev uint64, out Outcome, sent, now time.Time) {
	c.advance(now)
	p := c.parts[id]
	if p == nil || p.phase != recovering {
		return
	}
	if out != OK {
		c.delPart(id)
		c.emit(Effect{Kind: Disowned, Part: id, Lost: true})
		c.maybeLeave()
		return
	}
	p.rev = rev
	p.deadline = sent.Add(c.validFor())
	if !now.Before(p.deadline) {
		p.phase = fenced // answered too late to use: try again
		c.afterFence(p)
		return
	}
	c.emit(Effect{Kind: Deadline, Part: id, Until: p.deadline})
	p.lost, p.cancelled = false, false
	if p.consumed {
		p.reopen = true
		p.phase, p.resetSince = resetting, now
		c.emit(Effect{Kind: Reset, Part: id})
		return
	}
	p.phase = opening
	p.opened, p.openBusy = false, true
	c.emit(Effect{Kind: Open, Part: id})
	if c.stopping || !c.mine()[id] {
		c.release(p)
	}
}

// FloorRead is the outcome of ReadFloor.
func (c *Core) FloorRead(id Partition, st ConsumerState, err error, now time.Time) {
	c.advance(now)
	p := c.parts[id]
	if p == nil {
		return
	}
	p.floorBusy = false
	if err != nil || !p.tainted {
		return
	}
	if p.horizon == 0 {
		p.horizon = st.Delivered
	}
	if st.AckFloor >= p.horizon {
		p.tainted, p.horizon = false, 0
	}
}

// Deliver takes a message in, or drops it if its consumption is over.
func (c *Core) Deliver(m Msg, now time.Time) {
	c.advance(now)
	p := c.parts[m.Part]
	if p == nil || m.Epoch != p.epoch || p.phase != active {
		kind := Drop
		if c.q.nakOnRelease && p != nil && p.phase == draining && m.Epoch == p.epoch {
			kind = Nak
		}
		c.emit(Effect{Kind: kind, IDs: []uint64{m.ID}})
		return
	}
	if c.cfg.Ordered && !c.q.noOrderCheck && m.DSeq != p.expect {
		// A delivery went elsewhere (a subscriber of a replica that lost
		// the partition): from now on, check.
		if !p.tainted {
			p.tainted, p.horizon = true, 0
		} else {
			p.horizon = 0
		}
	}
	if m.DSeq >= p.expect {
		p.expect = m.DSeq + 1
	}
	hm := &msg{Msg: m, p: p}
	c.msgs[m.ID] = hm
	p.waiting++
	c.fq.Push(m.Group, m.Key, m.Seq, hm)
	c.dispatch()
}

func (c *Core) dispatch() {
	for {
		_, _, _, m, ok := c.fq.Next()
		if !ok {
			return
		}
		m.p.waiting--
		m.p.running++
		stale := m.Seq <= c.done[m.Key].seq
		c.emit(Effect{Kind: Run, ID: m.ID, Newer: c.fq.HasWaiting(m.Key), Check: m.p.tainted || stale && c.cfg.Ordered})
	}
}

// Done reports that the handler of message id returned; settled is false
// when it returned without settling the message, which the driver then
// gives back to the server (a handler's way of failing, counted against
// MaxDeliver). The message then comes back after the item's next ones may
// have run, so in an ordered stage the partition is checked from then on,
// until the ack floor has passed it.
func (c *Core) Done(id uint64, settled bool, now time.Time) {
	c.advance(now)
	m := c.msgs[id]
	if m == nil {
		return
	}
	delete(c.msgs, id)
	c.fq.Done(m.Key)
	if settled && m.Seq > c.done[m.Key].seq {
		c.done[m.Key] = doneMark{m.Seq, now}
	}
	p := m.p
	if !settled && c.cfg.Ordered && !c.q.noOrderCheck && p.phase == active {
		p.tainted, p.horizon = true, 0
	}
	p.running--
	c.dispatch()
	switch p.phase {
	case draining:
		c.drained(p)
	case fenced:
		c.afterFence(p)
	}
}

// Stop hands every partition back; Left reports when it is done. The
// member key goes at once, so that the others claim each partition as
// soon as it is handed back.
func (c *Core) Stop(now time.Time) {
	c.advance(now)
	if c.stopping {
		return
	}
	c.stopping = true
	c.emit(Effect{Kind: Leave})
	for _, p := range c.sorted() {
		c.release(p)
	}
	c.maybeLeave()
}

func (c *Core) maybeLeave() {
	if c.stopping && !c.left && len(c.parts) == 0 {
		c.left = true
	}
}

// Held calls f with every message held (waiting or running) in a
// partition whose lease holds at now: the messages to keep alive.
func (c *Core) Held(now time.Time, f func(id uint64)) {
	for id, m := range c.msgs {
		if (m.p.phase == active || m.p.phase == draining) && now.Before(m.p.deadline) {
			f(id)
		}
	}
}

// Partitions returns the partitions held and their phase, for metrics
// and tests.
func (c *Core) Partitions() map[Partition]string {
	out := make(map[Partition]string, len(c.parts))
	for id, p := range c.parts {
		out[id] = p.phase.String()
	}
	return out
}

// Consuming reports whether consumption epoch of p is the current one.
func (c *Core) Consuming(p Partition, epoch uint64) bool {
	x := c.parts[p]
	return x != nil && x.phase == active && x.epoch == epoch
}

// Running and Waiting count the messages in hand.
func (c *Core) Running() int { return c.fq.Running() }
func (c *Core) Waiting() int { return c.fq.Waiting() }
