package jsbus

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/metabus/metabus/pkg/bus"
	"github.com/metabus/metabus/pkg/fairq"
	"github.com/metabus/metabus/pkg/jsbus/drivecore"
	"github.com/metabus/metabus/pkg/natsx"
	"github.com/metabus/metabus/pkg/outcome"
	"github.com/metabus/metabus/pkg/ownership"
)

// DefaultMaxInFlight is the default Total of a replica.
const DefaultMaxInFlight = 256

// ConsumeConfig tunes Consume. Stream, Prefix and Stage are required.
type ConsumeConfig struct {
	// Stream and Prefix name the partition consumers <Prefix>pNN of Stream.
	Stream, Prefix string
	// Stage names the lease namespace (WorkStage, DesiredStage).
	Stage string
	// PerController bounds the messages of one controller running at once
	// in this replica (upstream's --workers, which is per controller).
	PerController int
	// Total bounds the messages running at once in this replica; when it
	// is reached, controllers share it by Weight.
	Total int
	// Weight (optional) is a controller's share of Total when saturated;
	// by default each message's weight extension (ExtWeight) says it.
	Weight func(ctrlID string) int
	// AckWait is the partition consumers' AckWait: held messages are kept
	// alive every AckWait/3.
	AckWait time.Duration
	// Lease is the owner lease; the lease bucket's TTL overrides it.
	Lease time.Duration
	// Ordered: a parent's messages must run in stream order even across a
	// takeover (MC_DESIRED needs it; MC_WORK does not: a work item means
	// "sync now", whatever its age). After a takeover that found messages
	// pending elsewhere, and whenever a delivery went to another
	// subscriber, a message runs only when it is the oldest of its item
	// left in the stream (order.go): older ones are deleted as superseded,
	// and a message no longer in the stream is not run.
	Ordered bool
	// KeepOlder (ordered stages, optional) says, of an older message found
	// in the stream, that it must not be deleted as superseded: it runs
	// whenever it comes back (its effect does not depend on order).
	KeepOlder func(h nats.Header, data []byte) bool
	// Member is this replica's member id (default: host, pid and a random
	// suffix).
	Member string
	// OnError (optional) receives consumer and lease errors.
	OnError func(error)
	// Ownership (optional) is told of every partition claimed and
	// released (metrics).
	Ownership OwnershipObserver
	// Headroom (unordered stages; ≤ 0: none) bounds the messages of one
	// controller this replica holds in hand from one partition, running
	// or waiting their turn, so that one controller cannot fill the
	// partition consumer's MaxAckPending, which every controller hashed
	// to it shares. A message beyond it is put off: stored again by
	// PutOff to come back later (package headroom says when), then acked.
	Headroom int
	// HeadroomBusy is how many messages of a partition (every controller
	// together) this replica holds before Headroom applies (headroom.Config
	// Busy; ≤ 0: always): below it the window has room for every
	// controller, and a burst is not put off for nothing.
	HeadroomBusy int
	PutOff       PutOff
	// FixedLayout (bus.Options.FixedLayout): Stream's partition count
	// cannot change while this replica runs. It is read once, when Consume
	// starts, and the protocol's layout reads (every Lease/5, and after
	// each claim) are answered with it instead of a stream info request
	// each.
	FixedLayout bool

	// pullHeartbeat overrides the partition consumers' idle heartbeat
	// (tests), with an expiry twice as long.
	pullHeartbeat time.Duration
}

// Consume runs h for the messages of the partitions this replica owns until
// ctx is done, then hands its partitions back.
//
// Topology: each partition consumer is consumed by
// exactly one replica at a time, the holder of the partition's lease in
// OwnersBucket; replicas share the partitions by rendezvous hashing over
// the live members and hand partitions over gracefully when membership
// changes. The owner holds many messages of a partition at once and
// serializes them per parent itself (package fairq): one message per
// parent at a time, in stream order; at most PerController running per
// controller, so one controller's hanging hook holds only its own share;
// Total shared between controllers by weight. Concurrency thus scales with
// replicas × workers, not with the partition count, and a slow parent
// blocks no other parent.
//
// The protocol (claims, renewals, handovers, the fence, cut-overs, the
// checks after a takeover) is package ownership's pure state machine; this
// is its driver: it performs the machine's effects (lease writes, consumer
// calls, handler runs) and feeds their outcomes back. The machine is
// called under one mutex that no network call ever holds, and its fence
// runs from a timer: a slow JetStream API cannot delay it.
//
// A handler may write and settle only while its partition's lease holds:
// its context is cancelled when the lease is lost (the fence), its Err
// reads the clock against the lease (so a process resumed after a pause
// longer than the lease sees it expired before any timer has run), and
// LeaseValid checks it through derived contexts at the point of writing.
// A handler never settles its message: it returns an outcome (package
// outcome), which Consume settles while the lease holds. Done is an ack;
// in an ordered stage the ack is confirmed by the server (retried while
// the lease holds), so that a parent's next message never runs while this
// one is still in the stream. Terminal terms the message with its reason.
// Retry, RetryAt and Throttled run the message again in place after their
// wait (Outcome.Wait; a Retry's grows with the retries), keeping its
// parent's turn and costing no delivery. No outcome leaves the message to
// the server's redelivery.
func Consume(ctx context.Context, js jetstream.JetStream, c ConsumeConfig, h Handler) error {
	if c.Lease <= 0 {
		c.Lease = bus.OwnerLease
	}
	if c.AckWait <= 0 {
		c.AckWait = bus.WorkAckWait
	}
	if c.Member == "" {
		c.Member = NewMemberID()
	}
	if c.OnError == nil {
		c.OnError = func(error) {}
	}
	kv, err := js.KeyValue(ctx, bus.OwnersBucket)
	if err != nil {
		return fmt.Errorf("open lease bucket %s: %w", bus.OwnersBucket, err)
	}
	// The lease is the bucket's TTL, whoever created it: fencing must
	// happen before the server lets the lease expire.
	if st, err := kv.Status(ctx); err == nil && st.TTL() > 0 {
		c.Lease = st.TTL()
	}
	if c.PerController <= 0 {
		c.PerController = 16
	}
	if c.Total <= 0 {
		c.Total = DefaultMaxInFlight
	}
	n, err := StreamPartitions(ctx, js, c.Stream)
	if err != nil {
		return err
	}
	api := ownerAPI{js}
	o := newOwner(api, leaseBucket{kv}, api, realClock{}, c, h, n)
	defer close(o.quit)
	if testOwner != nil {
		testOwner(o)
	}
	return o.run(ctx)
}

// newOwner is the driver of c (defaulted) over its seams, for a stream of
// n partitions: Consume's, or a simulation's over a fake JetStream and
// clock. Run it with run, then close its quit.
func newOwner(js ownerJS, kv leaseKV, store msgStore, clk clock, c ConsumeConfig, h Handler, n int) *owner {
	o := &owner{
		js: js, kv: kv, store: store, clk: clk, c: c, h: h, n: n, room: newRoom(c),
		parts:    map[ownership.Partition]*dpart{},
		msgs:     map[uint64]*held{},
		weights:  map[string]int{},
		jobs:     make(chan job),
		heldWake: make(chan struct{}, 1),
		quit:     make(chan struct{}),
		left:     make(chan struct{}),
	}
	weight := c.Weight
	if weight == nil {
		// Called by the queue under o.mu.
		weight = func(ctrlID string) int { return o.weights[ctrlID] }
	}
	o.core = ownership.New(ownership.Config{
		Member: c.Member, Lease: c.Lease, AckWait: c.AckWait, Ordered: c.Ordered,
		Limits: fairq.Limits{PerGroup: c.PerController, Total: c.Total}, Weight: weight,
	}, n, clk.Now())
	return o
}

// The partition consumers' pull expiry and idle heartbeat (see consume).
const (
	pullExpiry    = 30 * time.Second
	pullHeartbeat = 10 * time.Second
)

// testOwner (tests) is given each Consume's owner before it runs.
var testOwner func(*owner)

// NewMemberID returns a replica id: hostname, pid and a random suffix, as
// a KV key token.
func NewMemberID() string {
	host, _ := os.Hostname()
	var b [4]byte
	_, _ = rand.Read(b[:])
	id := fmt.Sprintf("%s-%d-%s", host, os.Getpid(), hex.EncodeToString(b[:]))
	return strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_' {
			return r
		}
		return '_'
	}, id)
}

// owner drives one replica's ownership.Core for a stage.
type owner struct {
	// The seams (seams.go): JetStream, the lease bucket, the stream's
	// messages for the oldest-message check, and the clock.
	js    ownerJS
	kv    leaseKV
	store msgStore
	clk   clock
	c     ConsumeConfig
	h     Handler

	// mu serializes the core and the driver state below. It is never
	// held across a network call.
	mu      sync.Mutex
	core    *ownership.Core
	room    *room // the controllers' headroom (nil: unbounded)
	n       int   // the partition count read when Consume started
	parts   map[ownership.Partition]*dpart
	msgs    map[uint64]*held // every message in hand, by id
	nextID  uint64
	weights map[string]int // per controller, from the messages' weight extension
	timer   timer
	wake    time.Time // when timer fires
	watchOK bool      // the member watch is running
	wctx    context.Context
	stopped bool // Stop was given to the core
	left    chan struct{}

	jobs    chan job      // to idle handler goroutines
	quit    chan struct{} // closed when Consume returns: idle handlers exit
	running sync.WaitGroup
	// minBeat is the shortest keep-alive period of any partition (the
	// consumers' AckWait may be shorter than this replica's setting).
	minBeat atomic.Int64
	// held wakes the heartbeat when a message is taken in hand: with
	// nothing in hand it sleeps (an idle replica has nothing to keep
	// alive, and a ticker would wake it four times a second for nothing).
	heldWake chan struct{}
	// beatScans counts the heartbeat's scans (tests).
	beatScans atomic.Int64
	// layoutAnswered counts layout reads answered without a request
	// (FixedLayout; tests).
	layoutAnswered atomic.Int64
	// cannotReset remembers that a consumer reset proved impossible (a
	// server before 2.14, a user without the permission): that is
	// reported to OnError once, the later ones are only counted.
	cannotReset atomic.Bool
}

// dpart is the driver's side of a partition held here.
type dpart struct {
	id   ownership.Partition
	name string // <N>-pNN: the consumer's name without prefix, the lease's last token
	// until is the lease's deadline (unix nanoseconds; 0: not held):
	// handlers write and settle only before it.
	until atomic.Int64
	// cur is the lease of the current consumption (its handlers'
	// context).
	cur   *lease
	cc    jetstream.ConsumeContext
	epoch uint64
	beat  time.Duration // keep-alive period of its held messages
	// busy counts consumptions starting or stopping: a reset waits for
	// them, since a subscription still there when the consumer is reset
	// would be delivered what the reset makes deliverable again.
	busy sync.WaitGroup
}

// lease is what the handlers of one consumption of a partition hold: a
// context the fence cancels, and the deadline.
type lease struct {
	ctx    context.Context
	cancel context.CancelCauseFunc
	until  *atomic.Int64
	clk    clock
}

func newLease(until *atomic.Int64, clk clock) *lease {
	l := &lease{until: until, clk: clk}
	l.ctx, l.cancel = context.WithCancelCause(context.Background())
	return l
}

var (
	errFenced       = errors.New("partition lease lost: settlement dropped, the new owner gets the message")
	errLeaseExpired = errors.New("partition lease not renewed in time")
)

// valid reports whether the lease holds now; if its deadline has passed,
// it ends it at once (the fence may not have run yet).
func (l *lease) valid() error {
	if l.ctx.Err() != nil {
		return errFenced
	}
	if l.clk.Now().UnixNano() >= l.until.Load() {
		l.cancel(errLeaseExpired)
		return errFenced
	}
	return nil
}

// leaseCtx is a handler's context: cancelled by the fence, and expired by
// the clock as soon as the lease's deadline has passed, whether or not the
// fence has run yet (after a process pause, handlers may run before any
// timer). Its Err reads the clock (ending the lease, which closes Done
// first, as the context contract wants).
type leaseCtx struct {
	context.Context
	l *lease
}

type leaseKey struct{}

func (c leaseCtx) Err() error {
	_ = c.l.valid()
	return c.Context.Err()
}

func (c leaseCtx) Value(k any) any {
	if k == (leaseKey{}) {
		return c.l
	}
	return c.Context.Value(k)
}

// LeaseValid reports whether ctx (or a context derived from it) belongs
// to a Consume handler whose partition lease no longer holds: a handler
// checks it right before each write, since a derived context learns of the
// lease's end only once the fence has run. Contexts of anything else are
// always valid.
func LeaseValid(ctx context.Context) error {
	if l, ok := ctx.Value(leaseKey{}).(*lease); ok {
		return l.valid()
	}
	return nil
}

// held is one message in hand. The handler gets it as its jetstream.Msg
// but cannot settle it (its Ack, Nak and Term fail): the driver settles it
// from the handler's outcome (settle), through the real message, only
// while the partition's lease holds.
type held struct {
	jetstream.Msg
	o        *owner
	id       uint64
	part     *dpart
	lease    *lease
	group    string
	key      string
	seq      uint64
	lastBeat time.Time
	settled  bool
}

// errRuntimeSettles is what a handler gets from its message's Ack, Nak or
// Term: settling is the runtime's, from the outcome the handler returns.
var errRuntimeSettles = errors.New("a Consume handler does not settle its message: it returns an outcome, which Consume settles")

// The settling methods of the message a handler holds all fail (see
// errRuntimeSettles).
func (m *held) Ack() error                       { return errRuntimeSettles }
func (m *held) DoubleAck(context.Context) error  { return errRuntimeSettles }
func (m *held) Nak() error                       { return errRuntimeSettles }
func (m *held) NakWithDelay(time.Duration) error { return errRuntimeSettles }
func (m *held) Term() error                      { return errRuntimeSettles }
func (m *held) TermWithReason(string) error      { return errRuntimeSettles }

// InProgress keeps the message alive while the lease holds (the
// heartbeat's; a handler may call it too).
func (m *held) InProgress() error {
	if err := m.lease.valid(); err != nil {
		return err
	}
	return m.Msg.InProgress()
}

// ack acknowledges the message. In an ordered stage it waits for the
// server to confirm it, trying again while the lease holds: a lost ack
// must not let the parent's next message run while this one is still in
// the stream (it would come back after it, and nothing newer would be
// left to show it is stale). A work item's ack is not waited for (the
// round trip cost the bus benchmark a third of its throughput at hook
// 0): one lost in transit redelivers the item, one more sync.
func (m *held) ack() error {
	if !m.o.c.Ordered {
		return m.settleWith(m.Msg.Ack)
	}
	var b drivecore.AckBackoff
	for {
		if err := m.lease.valid(); err != nil {
			return err
		}
		actx, cancel := context.WithTimeout(context.Background(), drivecore.AckTimeout(apiTimeout, m.o.c.Lease))
		err := m.Msg.DoubleAck(actx)
		cancel()
		if drivecore.Acked(errKind(err)) {
			m.settled = true
			return nil
		}
		sleep(m.o.clk, b.Next())
	}
}

// settleWith settles the message with f if the lease still holds.
func (m *held) settleWith(f func() error) error {
	if err := m.lease.valid(); err != nil {
		return err
	}
	m.settled = true
	return f()
}

type newerKey struct{}

// NewerQueued reports whether, when a Consume handler was called, a later
// message of the same parent was already held behind this one: for desired
// states, this one is superseded.
func NewerQueued(ctx context.Context) bool {
	v, _ := ctx.Value(newerKey{}).(bool)
	return v
}

// --- the driver ---

// update runs f on the core under the lock, then performs its effects.
func (o *owner) update(f func(c *ownership.Core, now time.Time)) {
	o.mu.Lock()
	f(o.core, o.clk.Now())
	o.flushLocked()
	o.mu.Unlock()
}

// flushLocked performs the core's effects: local ones at once (the
// deadline, cancellation, handler runs, dropped messages), network calls
// in goroutines of their own. Then it arms the timer for the core's next
// tick.
func (o *owner) flushLocked() {
	for {
		effs := o.core.Ready()
		if len(effs) == 0 {
			break
		}
		for _, e := range effs {
			o.effect(e)
		}
	}
	if o.core.Left() {
		select {
		case <-o.left:
		default:
			close(o.left)
		}
		if o.timer != nil {
			o.timer.Stop()
		}
		return
	}
	w := o.core.Wake()
	if o.timer == nil {
		o.wake = w
		o.timer = o.clk.AfterFunc(w.Sub(o.clk.Now()), o.tick)
		return
	}
	if !w.Equal(o.wake) {
		o.wake = w
		o.timer.Reset(w.Sub(o.clk.Now()))
	}
}

// tick is the timer's: the fence, renewals, the balance. It takes nothing
// but the lock, which no network call holds.
func (o *owner) tick() {
	o.mu.Lock()
	o.wake = time.Time{}
	o.core.Tick(o.clk.Now())
	if !o.watchOK && !o.stopped && o.wctx != nil {
		o.watchOK = true
		go o.watchMembers(o.wctx, nil)
	}
	o.flushLocked()
	o.mu.Unlock()
}

// part returns the driver state of p, creating it.
func (o *owner) part(p ownership.Partition) *dpart {
	dp := o.parts[p]
	if dp == nil {
		dp = &dpart{id: p, name: bus.PartitionConsumerName("", p.N, p.P)}
		dp.cur = newLease(&dp.until, o.clk)
		dp.cur.cancel(errFenced) // not consuming yet
		o.parts[p] = dp
	}
	return dp
}

// effect performs one of the core's effects, under o.mu: its local part
// at once, its network call (drivecore.ModeOf says which it has) on a
// goroutine of its own, which feeds the answer back through update.
func (o *owner) effect(e ownership.Effect) {
	if e.Kind == ownership.ReadLayout && o.c.FixedLayout {
		// Answered at once with the count read at start: nothing can
		// change it (ConsumeConfig.FixedLayout). The core's effects of
		// the answer are performed by flushLocked, which called this.
		o.core.LayoutRead(e.Read, o.n, nil, o.clk.Now())
		o.layoutAnswered.Add(1)
		return
	}
	mode, ok := drivecore.ModeOf(e.Kind)
	if !ok {
		o.c.OnError(fmt.Errorf("%s: the ownership core asked for effect %d, unknown to its driver", o.c.Stage, e.Kind))
		return
	}
	var call func()
	if mode == drivecore.Async {
		call = o.call(e)
	} else {
		call = o.local(e)
	}
	if call != nil {
		go call()
	}
}

// local performs an Inline or Start effect; it returns a Start effect's
// network call.
func (o *owner) local(e ownership.Effect) func() {
	switch e.Kind {
	case ownership.Deadline:
		dp := o.part(e.Part)
		if e.Until.IsZero() {
			dp.until.Store(0)
			dp.cur.cancel(errFenced)
		} else {
			dp.until.Store(e.Until.UnixNano())
		}
	case ownership.Cancel:
		o.part(e.Part).cur.cancel(errFenced)
	case ownership.Run:
		hm := o.msgs[e.ID]
		o.running.Add(1)
		o.start(job{hm, e.Newer, e.Check})
	case ownership.Drop, ownership.Nak:
		for _, id := range e.IDs {
			if hm := o.msgs[id]; hm != nil {
				delete(o.msgs, id)
				o.room.release(hm)
				if e.Kind == ownership.Nak {
					_ = hm.Msg.Nak()
				}
			}
		}
	case ownership.Consume:
		dp := o.part(e.Part)
		dp.epoch = e.Epoch
		dp.cur = newLease(&dp.until, o.clk)
		dp.busy.Add(1)
		return func() { o.consume(dp, e.Epoch) }
	case ownership.StopConsume:
		dp := o.part(e.Part)
		if cc := dp.cc; cc != nil && dp.epoch == e.Epoch {
			dp.cc = nil
			dp.busy.Add(1)
			return func() { defer dp.busy.Done(); o.stop(cc) }
		}
	case ownership.Owned:
		o.c.claimed()
	case ownership.Disowned:
		o.c.released(e.Lost)
	}
	return nil
}

// call returns an Async effect's network call, its arguments bound under
// o.mu.
func (o *owner) call(e ownership.Effect) func() {
	switch e.Kind {
	case ownership.ReadLayout:
		return func() { o.readLayout(e.Read) }
	case ownership.RenewMember:
		return o.renewMember
	case ownership.Leave:
		return o.leave
	case ownership.Claim:
		return func() { o.claim(e.Part) }
	case ownership.Renew:
		return func() { o.renew(e.Leases) }
	case ownership.Open:
		return func() { o.open(e.Part, false) }
	case ownership.ReadFloor:
		return func() { o.open(e.Part, true) }
	case ownership.Reset:
		dp := o.part(e.Part)
		return func() { o.reset(dp) }
	case ownership.DeleteLease:
		return func() { o.deleteLease(e.Part, e.Rev) }
	case ownership.Recover:
		return func() { o.recover(e.Part, e.Rev) }
	}
	return nil
}

func (o *owner) run(ctx context.Context) error {
	// Join, and learn who else is there before claiming anything, so a
	// replica joining a running stage takes only its share.
	initial := make(chan struct{})
	wctx, stopWatch := context.WithCancel(context.Background())
	defer stopWatch()
	o.mu.Lock()
	o.watchOK, o.wctx = true, wctx
	o.mu.Unlock()
	go o.watchMembers(wctx, initial)
	o.update(func(*ownership.Core, time.Time) {}) // the first member renewal
	select {
	case <-initial:
	case <-after(o.clk, 2*time.Second):
	case <-ctx.Done():
		o.mu.Lock()
		o.stopped = true
		o.mu.Unlock()
		return nil
	}
	dctx, stopBeat := context.WithCancel(context.Background())
	beatDone := make(chan struct{})
	go func() { defer close(beatDone); o.heartbeat(dctx) }()
	o.update(func(c *ownership.Core, now time.Time) { c.Begin(now) })

	<-ctx.Done()
	// Hand every partition back, then leave. Leases are renewed until
	// then: handlers still running must not lose them.
	o.update(func(c *ownership.Core, now time.Time) {
		o.stopped = true
		c.Stop(now)
	})
	<-o.left
	o.running.Wait()
	stopBeat()
	<-beatDone
	return nil
}

// watchMembers feeds member puts and deletes to the core; initial (if not
// nil) is closed once the current members have been read.
func (o *owner) watchMembers(ctx context.Context, initial chan struct{}) {
	defer func() {
		o.mu.Lock()
		o.watchOK = false
		o.mu.Unlock()
	}()
	prefix := "member." + o.c.Stage + "."
	w, err := o.kv.Watch(ctx, prefix+"*")
	if err != nil {
		if ctx.Err() == nil {
			o.c.OnError(fmt.Errorf("watch %s members: %w", o.c.Stage, err))
		}
		return
	}
	defer func() { _ = w.Stop() }()
	for {
		select {
		case <-ctx.Done():
			return
		case e, ok := <-w.Updates():
			if !ok {
				return
			}
			if e == nil {
				if initial != nil {
					close(initial)
					initial = nil
				}
				continue
			}
			id := strings.TrimPrefix(e.Key(), prefix)
			o.update(func(c *ownership.Core, now time.Time) {
				if e.Operation() == jetstream.KeyValuePut {
					c.MemberSeen(id, now)
				} else {
					c.MemberGone(id, now)
				}
			})
		}
	}
}

func (o *owner) apiCtx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), o.c.Lease/5)
}

func (o *owner) renewMember() {
	ctx, cancel := o.apiCtx()
	defer cancel()
	if _, err := o.kv.Put(ctx, bus.MemberKey(o.c.Stage, o.c.Member), []byte(o.c.Member)); err != nil {
		o.c.OnError(fmt.Errorf("renew %s membership: %w", o.c.Stage, err))
	}
}

func (o *owner) leave() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_ = o.kv.DeleteAt(ctx, bus.MemberKey(o.c.Stage, o.c.Member), 0)
}

func (o *owner) readLayout(read uint64) {
	ctx, cancel := context.WithTimeout(context.Background(), apiTimeout)
	defer cancel()
	n, err := StreamPartitions(ctx, o.js, o.c.Stream)
	if err != nil {
		o.c.OnError(err)
	}
	o.update(func(c *ownership.Core, now time.Time) { c.LayoutRead(read, n, err, now) })
}

func (o *owner) leaseKey(p ownership.Partition) string {
	return bus.LeaseKeyOf(o.c.Stage, bus.PartitionConsumerName("", p.N, p.P))
}

// ours rewrites key if it still names member: a refused conditional write
// may have been member's own earlier write, applied by the server after
// its reply was lost.
func ours(ctx context.Context, kv leaseKV, member, key string) (uint64, ownership.Outcome) {
	cur, err := kv.Get(ctx, key)
	rewrite, out := drivecore.OursRead(errKind(err), err == nil && string(cur.Value()) == member)
	if !rewrite {
		return 0, out
	}
	rev, err := kv.Update(ctx, key, []byte(member), cur.Revision())
	if out = drivecore.OursWrite(errKind(err)); out != ownership.OK {
		rev = 0
	}
	return rev, out
}

func (o *owner) claim(p ownership.Partition) {
	ctx, cancel := o.apiCtx()
	defer cancel()
	key := o.leaseKey(p)
	sent := o.clk.Now()
	rev, err := o.kv.Create(ctx, key, []byte(o.c.Member))
	a := drivecore.Claim(errKind(err))
	out := a.Out
	if a.Ours {
		rev, out = ours(ctx, o.kv, o.c.Member, key)
		out = drivecore.Regained(out)
	}
	if a.Report {
		o.c.OnError(fmt.Errorf("claim %s partition %s: %w", o.c.Stage, p, err))
	}
	o.update(func(c *ownership.Core, now time.Time) { c.ClaimDone(p, rev, out, sent, now) })
}

func (o *owner) recover(p ownership.Partition, rev uint64) {
	ctx, cancel := o.apiCtx()
	defer cancel()
	key := o.leaseKey(p)
	sent := o.clk.Now()
	nrev, err := o.kv.Update(ctx, key, []byte(o.c.Member), rev)
	a := drivecore.Recover(errKind(err))
	out := a.Out
	if a.Ours {
		nrev, out = ours(ctx, o.kv, o.c.Member, key)
	}
	o.update(func(c *ownership.Core, now time.Time) { c.RecoverDone(p, nrev, out, sent, now) })
}

func (o *owner) deleteLease(p ownership.Partition, rev uint64) {
	ctx, cancel := o.apiCtx()
	defer cancel()
	if err := o.kv.DeleteAt(ctx, o.leaseKey(p), rev); err != nil {
		o.c.OnError(fmt.Errorf("hand back %s partition %s: %w", o.c.Stream, p, err))
	}
	o.update(func(c *ownership.Core, now time.Time) { c.ReleaseDone(p, now) })
}

// renew renews the leases at once: pipelined asynchronous compare-and-set
// writes (what KeyValue.Update sends), then their acknowledgements
// awaited. Renewals are nearly all an idle process does (one per
// partition per stage every Lease/5), and a goroutine, a timer and a request round trip
// for each made an idle all-in-one spend several times the CPU of the
// writes themselves.
func (o *owner) renew(ls []ownership.Lease) {
	sent := o.clk.Now()
	rs := renewLeases(o.js, o.kv, o.clk, o.c.Stage, o.c.Member, ls, o.c.Lease/5)
	for i, r := range rs {
		if r.Out == ownership.Taken {
			o.c.OnError(fmt.Errorf("lease of %s partition %s lost", o.c.Stage, ls[i].Part))
		}
	}
	o.update(func(c *ownership.Core, now time.Time) { c.RenewDone(rs, sent, now) })
}

// renewLeases renews leases of member in stage, waiting at most wait for
// the answers.
func renewLeases(js ownerJS, kv leaseKV, clk clock, stage, member string, ls []ownership.Lease, wait time.Duration) []ownership.Renewal {
	type pending struct {
		ack jetstream.PubAckFuture
		err error
	}
	ps := make([]pending, len(ls))
	rs := make([]ownership.Renewal, len(ls))
	for i, l := range ls {
		rs[i] = ownership.Renewal{Part: l.Part, Out: ownership.Failed}
		ps[i].ack, ps[i].err = js.RenewAsync(bus.LeaseKeyOf(stage, bus.PartitionConsumerName("", l.Part.N, l.Part.P)), []byte(member), l.Rev)
	}
	timer := clk.NewTimer(wait)
	defer timer.Stop()
	expired := false
	for i := range ls {
		p := &ps[i]
		if p.err != nil || expired {
			continue
		}
		select {
		case pa := <-p.ack.Ok():
			rs[i].Out, rs[i].Rev = ownership.OK, pa.Sequence
		case p.err = <-p.ack.Err():
		case <-timer.C():
			expired = true
		}
	}
	for i := range ls {
		if drivecore.Renewed(errKind(ps[i].err)) {
			ctx, cancel := context.WithTimeout(context.Background(), wait)
			rs[i].Rev, rs[i].Out = ours(ctx, kv, member, bus.LeaseKeyOf(stage, bus.PartitionConsumerName("", ls[i].Part.N, ls[i].Part.P)))
			cancel()
		}
	}
	return rs
}

// open reads a partition's consumer state (for Open, or for the ack
// floor of a tainted partition).
func (o *owner) open(p ownership.Partition, floor bool) {
	ctx, cancel := context.WithTimeout(context.Background(), apiTimeout)
	defer cancel()
	name := o.c.Prefix + bus.PartitionConsumerName("", p.N, p.P)
	var st ownership.ConsumerState
	cons, err := o.js.Consumer(ctx, o.c.Stream, name)
	var info *jetstream.ConsumerInfo
	if err == nil {
		info = cons.CachedInfo()
		if floor {
			info, err = cons.Info(ctx)
		}
	}
	if err == nil {
		st = ownership.ConsumerState{AckPending: info.NumAckPending, Delivered: info.Delivered.Stream,
			DeliveredSeq: info.Delivered.Consumer, AckFloor: info.AckFloor.Stream}
	} else if !floor && !errors.Is(err, jetstream.ErrConsumerNotFound) {
		// A cut-over's new consumers appear once the old partitions are
		// handed back: not an error until then.
		o.c.OnError(fmt.Errorf("open consumer %s/%s: %w", o.c.Stream, name, err))
	}
	o.update(func(c *ownership.Core, now time.Time) {
		if floor {
			c.FloorRead(p, st, err, now)
			return
		}
		if err == nil {
			// Heartbeats follow the consumer's real AckWait: streams
			// created by another process may use a shorter one.
			dp := o.part(p)
			dp.beat = drivecore.BeatPeriod(o.c.AckWait, info.Config.AckWait)
			o.minBeat.Store(int64(drivecore.MinBeat(time.Duration(o.minBeat.Load()), dp.beat)))
		}
		c.OpenDone(p, st, err, now)
	})
}

// stop stops a consumption and waits (a few seconds at most) until its
// subscription is gone: the server then delivers it nothing more.
func (o *owner) stop(cc jetstream.ConsumeContext) {
	cc.Stop()
	select {
	case <-cc.Closed():
	case <-after(o.clk, apiTimeout):
	}
}

// consume starts consumption epoch of dp.
func (o *owner) consume(dp *dpart, epoch uint64) {
	defer dp.busy.Done()
	ctx, cancel := context.WithTimeout(context.Background(), apiTimeout)
	defer cancel()
	name := o.c.Prefix + dp.name
	failed := func(err error) {
		if drivecore.StartFailure(errKind(err)) {
			o.c.OnError(fmt.Errorf("consume %s partition %s: %w", o.c.Stream, dp.name, err))
		}
		o.update(func(c *ownership.Core, now time.Time) { c.ConsumeFailed(dp.id, epoch, now) })
	}
	cons, err := o.js.Consumer(ctx, o.c.Stream, name)
	if err != nil {
		failed(err)
		return
	}
	var once sync.Once
	hb, expiry := pullHeartbeat, pullExpiry
	if o.c.pullHeartbeat > 0 {
		hb, expiry = o.c.pullHeartbeat, 2*o.c.pullHeartbeat
	}
	cc, err := cons.Consume(func(m jetstream.Msg) { o.receive(dp, epoch, m) },
		jetstream.PullMaxMessages(256),
		// A consumer leader move voids the pull requests the old leader
		// held, and the new leader says so to each of them (a 409
		// Leadership Change); the client pulls again at once
		// (TestLeaderMoveRepulls). A restarted server is pulled from again
		// on the reconnect. The idle heartbeat is the bound for any other
		// pull request lost unannounced: the client pulls again after two
		// missed ones, within 20 s. It is not shorter because every
		// heartbeat of every partition wakes both ends: at 2.5 s they were
		// most of a stage replica's CPU at rest, and, their timers spread
		// over a burst's pulls, kept it higher after a burst
		// (docs/performance.md, "Heartbeats at rest"). The expiry only
		// paces the renewal of a pull request while nothing arrives (a
		// 408 from the server, a new pull from the client): an idle
		// partition costs 4 messages in 30 s.
		jetstream.PullExpiry(expiry),
		jetstream.PullHeartbeat(hb),
		jetstream.ConsumeErrHandler(func(cc jetstream.ConsumeContext, err error) {
			ends, report := drivecore.ConsumeFailure(errKind(err))
			if report {
				o.c.OnError(fmt.Errorf("consume %s partition %s: %w", o.c.Stream, dp.name, err))
			}
			if ends {
				once.Do(func() { cc.Stop(); go failed(err) })
			}
		}))
	if err != nil {
		failed(err)
		return
	}
	o.mu.Lock()
	if dp.epoch == epoch && o.core.Consuming(dp.id, epoch) {
		dp.cc = cc
		o.mu.Unlock()
		return
	}
	o.mu.Unlock()
	o.stop(cc) // stopped meanwhile
}

func (o *owner) receive(dp *dpart, epoch uint64, m jetstream.Msg) {
	_, ctrlID, parentUID, err := bus.ParseStoredSubject(m.Subject())
	if err != nil {
		o.c.OnError(err)
		_ = m.TermWithReason("unparsable subject")
		return
	}
	md, err := m.Metadata()
	if err != nil {
		o.c.OnError(err)
		return // redelivered after AckWait
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if w := bus.HeaderWeight(headerValue(m, bus.WeightHeader)); w > 1 {
		o.weights[ctrlID] = w
	} else {
		delete(o.weights, ctrlID)
	}
	o.nextID++
	id := o.nextID
	take := func() { // under o.mu
		// parentUID is the whole parent token: a keyed item's <uid>~<key>
		// (MapKeySep) makes its unit of serialization (parent, key), so keys
		// of one parent in one partition run side by side, each in order.
		hm := &held{Msg: m, o: o, id: id, part: dp, lease: dp.cur, group: ctrlID, key: ctrlID + "." + parentUID, seq: md.Sequence.Stream, lastBeat: o.clk.Now()}
		o.msgs[hm.id] = hm
		select {
		case o.heldWake <- struct{}{}:
		default: // already signalled
		}
		o.core.Deliver(ownership.Msg{ID: hm.id, Part: dp.id, Epoch: epoch, Group: hm.group, Key: hm.key,
			Seq: md.Sequence.Stream, DSeq: md.Sequence.Consumer}, o.clk.Now())
		o.flushLocked()
	}
	// Beyond its controller's headroom in this partition, the message is
	// put off instead (headroom.go).
	if o.room.admit(o, dp, id, ctrlID, m, take) {
		take()
	}
}

// reset resets a partition's consumer to its ack floor, if the lease still
// holds when the request is sent (the point of writing).
func (o *owner) reset(dp *dpart) {
	dp.busy.Wait()
	var err error
	if o.clk.Now().UnixNano() >= dp.until.Load() {
		err = errLeaseExpired
	} else {
		name := o.c.Prefix + dp.name
		ctx, cancel := context.WithTimeout(context.Background(), apiTimeout)
		_, err = o.js.ResetConsumer(ctx, o.c.Stream, name)
		cancel()
		how, probed := drivecore.ResetAnswer(errKind(err)), ""
		if how == drivecore.ResetProbe {
			ictx, icancel := context.WithTimeout(context.Background(), apiTimeout)
			_, ierr := o.js.Consumer(ictx, o.c.Stream, name)
			icancel()
			how, probed = drivecore.ResetProbed(errKind(ierr)), "; its info answers"
		}
		switch how {
		case drivecore.ResetDone:
			err = nil // nothing left to give back
		case drivecore.ResetUnsupported:
			// Hand the partition back anyway; what waited comes back
			// after AckWait, as it did before resets.
			err = fmt.Errorf("reset consumer %s/%s: %w (%w%s)", o.c.Stream, name, ownership.ErrCannotReset, err, probed)
			o.cannotResetOnce(err)
		default: // the core tries again while the lease holds
			err = fmt.Errorf("reset consumer %s/%s: %w", o.c.Stream, name, err)
			reason := ResetError
			if how == drivecore.ResetNoAnswer {
				reason = ResetNoAnswer
			}
			o.c.resetFailed(reason)
			o.c.OnError(err)
		}
	}
	o.update(func(c *ownership.Core, now time.Time) { c.ResetDone(dp.id, err, now) })
}

// cannotResetOnce counts a reset that proved impossible and reports the
// first of this replica's to OnError, naming the server's version: every
// handover meets it again, and an error per handover would bury the one
// that says what to do.
func (o *owner) cannotResetOnce(err error) {
	o.c.resetFailed(ResetUnsupported)
	if !o.cannotReset.CompareAndSwap(false, true) {
		return
	}
	version := o.js.ServerVersion()
	why := fmt.Sprintf("NATS server %s is older than %s, the first to reset consumers", version, natsx.MinResetVersion)
	if ok, _ := natsx.ConsumerResetSupported(version); ok {
		why = fmt.Sprintf("NATS server %s can reset consumers, so this replica's NATS user lacks the permission ($JS.API.CONSUMER.RESET.%s.*)", version, o.c.Stream)
	}
	o.c.OnError(fmt.Errorf("%w; %s: every handover of this replica now waits for the reset and redelivers after AckWait; "+
		"the later failures are only counted (metabus_bus_consumer_reset_failures_total)", err, why))
}

// --- handlers ---

// job is one message to handle.
type job struct {
	hm    *held
	newer bool
	check bool
}

// workerIdle is how long a handler goroutine waits for the next message
// before it exits.
const workerIdle = 10 * time.Second

// start hands j to an idle handler goroutine, or starts one. Reusing them
// keeps their grown stacks: a fresh goroutine per message grew its stack
// through every JSON encoding and API call, about 4% of an all-in-one
// process's CPU in copystack. Called under o.mu; never blocks.
func (o *owner) start(j job) {
	select {
	case o.jobs <- j:
	default:
		go o.worker(j)
	}
}

func (o *owner) worker(j job) {
	idle := o.clk.NewTimer(workerIdle)
	defer idle.Stop()
	for {
		o.handle(j)
		idle.Reset(workerIdle)
		select {
		case j = <-o.jobs:
		case <-idle.C():
			return
		case <-o.quit:
			return
		}
	}
}

// handle runs a message until it is settled or its lease is lost: the
// handler's outcome is settled here, and a retry runs again in place,
// keeping the parent's turn.
func (o *owner) handle(j job) {
	defer o.running.Done()
	hm := j.hm
	ctx := context.WithValue(leaseCtx{Context: hm.lease.ctx, l: hm.lease}, newerKey{}, j.newer)
	check := j.check && o.c.Ordered
	var retries drivecore.Retries // in place so far
	for ctx.Err() == nil {
		var out outcome.Outcome
		if check {
			run, err := oldest(ctx, o.store, o.c.Stream, hm.Subject(), hm.seq, o.c.KeepOlder)
			switch {
			case err != nil:
				if ctx.Err() == nil {
					o.c.OnError(err)
				}
				out = drivecore.CheckFailed()
			case !run:
				hm.settled = true // gone from the stream: superseded
			default:
				check = false
			}
		}
		if hm.settled {
			break
		}
		if !check {
			out = o.h(ctx, hm)
		}
		if !out.Retries() {
			o.settle(hm, out)
			break
		}
		// In place, keeping the parent's turn; a Retry's wait grows while
		// it keeps failing (an unreachable dependency).
		t := o.clk.NewTimer(retries.Wait(out, o.clk.Now()))
		select {
		case <-t.C():
		case <-ctx.Done():
			t.Stop()
		}
	}
	o.update(func(c *ownership.Core, now time.Time) {
		delete(o.msgs, hm.id)
		o.room.release(hm)
		c.Done(hm.id, hm.settled, now)
	})
}

// settle settles a message from its handler's final outcome (not a
// retry), while the lease holds: after it, the new owner has the message.
func (o *owner) settle(hm *held, out outcome.Outcome) {
	var err error
	how, unknown := drivecore.SettleOf(out.Kind)
	switch how {
	case drivecore.SettleAck:
		err = hm.ack()
	case drivecore.SettleTerm:
		err = hm.settleWith(func() error { return hm.Msg.TermWithReason(out.Reason) })
	default:
		// No outcome (the handler's context ended first), or one this
		// runtime does not know: the server redelivers the message, as
		// after a crash, counting the delivery (the core checks what
		// follows in an ordered stage).
		if unknown {
			o.c.OnError(fmt.Errorf("%s seq %d: handler returned %s; redelivered", o.c.Stream, hm.seq, out))
		}
		if hm.lease.valid() == nil {
			_ = hm.Msg.Nak()
		}
		return
	}
	if err != nil && !errors.Is(err, errFenced) {
		o.c.OnError(fmt.Errorf("settle %s seq %d (%s): %w", o.c.Stream, hm.seq, out, err))
	}
}

// heartbeat keeps every held message alive: the server must not redeliver
// a message this replica still holds, running or waiting its parent's turn.
// While nothing is in hand it waits for receive's signal instead of
// ticking: a message's first keep-alive is due a third of its AckWait
// after it arrived, so starting the ticks then misses nothing. Each scan
// finds the earliest keep-alive due next, and the next scan waits for it
// (drivecore.BeatWait): held messages that are all young cost no scans.
func (o *owner) heartbeat(ctx context.Context) {
	var next time.Time // the earliest keep-alive due, as of the last scan
	for {
		o.mu.Lock()
		empty := len(o.msgs) == 0
		o.mu.Unlock()
		if empty {
			next = time.Time{}
			select {
			case <-ctx.Done():
				return
			case <-o.heldWake:
			}
		}
		period := time.Duration(o.minBeat.Load())
		if period == 0 {
			period = o.c.AckWait
		}
		t := o.clk.NewTimer(drivecore.BeatWait(o.clk.Now(), next, period))
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C():
		}
		o.beatScans.Add(1)
		scan := drivecore.Scan{Now: o.clk.Now()}
		var due []*held
		o.mu.Lock()
		o.core.Held(scan.Now, func(id uint64) {
			hm := o.msgs[id]
			if hm == nil {
				return
			}
			var ok bool
			if ok, hm.lastBeat = scan.Visit(hm.lastBeat, hm.part.beat); ok {
				due = append(due, hm)
			}
		})
		o.mu.Unlock()
		next = scan.Next
		for _, hm := range due {
			_ = hm.InProgress()
		}
	}
}
