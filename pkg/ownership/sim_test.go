package ownership

import (
	"flag"
	"fmt"
	"math/rand/v2"
	"runtime"
	"runtime/debug"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/metabus/metabus/pkg/fairq"
)

// The simulation: replicas (each a Core and a model of the driver of
// package jsbus) against the server model of simserver_test.go, in virtual
// time, through randomized schedules that a seed reproduces: replicas
// joining, leaving, crashing and pausing past their lease; slow, lost and
// delayed API replies; redeliveries in every order the server's BackOff
// and redelivery queue produce; partition-count changes; several messages
// per item. After every step it checks that no item has two handlers that
// may write at once and that each item's writes never go back in stream
// order; at the end (faults healed, the system left to settle) that
// nothing was lost; and throughout, that no delivery was counted against
// MaxDeliver unless the replica holding it lost its lease for good (a
// crash, or a cut-off longer than the lease).
//
//	go test ./pkg/ownership -run TestSimulation -sim.schedules 1000000
//	go test ./pkg/ownership -run TestSimulation -sim.seed 12345 -v   (one schedule, traced)

var (
	simSchedules = flag.Int("sim.schedules", 0, "schedules to simulate (0: 100000, or 2000 with -short)")
	simSeed      = flag.Uint64("sim.seed", 0, "simulate only this seed, with a trace")
	simFirst     = flag.Uint64("sim.first", 1, "first seed")
	simEffects   = flag.Bool("sim.effects", false, "with -sim.seed: trace the cores' effects too")
)

const (
	simLease     = 10 * time.Second
	simPullExp   = 3 * time.Second // < 2/5 of the lease (see the driver)
	simNet       = 2 * time.Millisecond
	simTimeout   = 5 * time.Second // a request's timeout when its reply is lost
	simPublishes = 40 * time.Second
	simSettle    = 600 * time.Second
	simGroup     = "c"
)

// itemKeys are the items' queue keys.
var itemKeys = func() []string {
	out := make([]string, 16)
	for i := range out {
		out[i] = fmt.Sprint(i)
	}
	return out
}()

// --- event queue ---

type event struct {
	at  int64 // virtual nanoseconds
	seq uint64
	fn  func()
}

// events is a binary min-heap by (at, seq).
type events []event

func (e events) less(i, j int) bool {
	return e[i].at < e[j].at || e[i].at == e[j].at && e[i].seq < e[j].seq
}

func (e *events) push(x event) {
	*e = append(*e, x)
	h := *e
	for i := len(h) - 1; i > 0; {
		p := (i - 1) / 2
		if !h.less(i, p) {
			break
		}
		h[i], h[p] = h[p], h[i]
		i = p
	}
}

func (e *events) pop() event {
	h := *e
	top := h[0]
	last := len(h) - 1
	h[0] = h[last]
	h[last] = event{}
	h = h[:last]
	for i := 0; ; {
		l, r, m := 2*i+1, 2*i+2, i
		if l < len(h) && h.less(l, m) {
			m = l
		}
		if r < len(h) && h.less(r, m) {
			m = r
		}
		if m == i {
			break
		}
		h[i], h[m] = h[m], h[i]
		i = m
	}
	*e = h
	return top
}

// --- the simulation ---

// simConfig is what a seed draws.
type simConfig struct {
	ordered  bool
	ackWait  time.Duration
	n        int
	items    int
	replicas int
	quirks   quirks
	// legacyLoop: the old driver's single loop, where the fence waited
	// behind blocking API calls and handlers checked only their
	// cancellation, not the clock.
	legacyLoop bool
	// giveBack: handlers sometimes return without settling (the driver
	// then gives the message back to the server).
	giveBack bool
}

type sim struct {
	seed    uint64
	cfg     simConfig
	rng     *rand.Rand
	now     time.Time
	start   time.Time
	q       events
	evSeq   uint64
	lease   time.Duration
	srv     *simServer
	reps    []*replica
	nextRep int
	trace   func(string, ...any)
	fail    []string

	// checks
	published  map[int][]uint64   // item → seqs published
	written    map[int]uint64     // item → last seq written
	writes     map[uint64]bool    // seqs written at least once
	superseded map[uint64]bool    // deleted by an oldest check
	dead       map[uint64]bool    // dead-lettered
	justified  map[uint64]int     // redeliveries caused by a lease lost for good, since the last reset
	running    map[int][]*handler // item → handlers started, not done
	faults     map[string]int     // fault kinds injected
	// keepGoing: record the first violation of each kind and go on (the
	// old protocol's run, where one defect would hide the next).
	keepGoing bool
	kinds     map[string]bool
	crowded   int // items with more than one handler started
	steps     int
}

func newSim(seed uint64, cfg simConfig) *sim {
	s := &sim{seed: seed, cfg: cfg, rng: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)), lease: simLease,
		published: map[int][]uint64{}, written: map[int]uint64{}, writes: map[uint64]bool{}, superseded: map[uint64]bool{},
		dead: map[uint64]bool{}, justified: map[uint64]int{}, running: map[int][]*handler{}, faults: map[string]int{}, kinds: map[string]bool{}}
	s.now = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	s.start = s.now
	s.srv = newSimServer(s, cfg.n, cfg.ackWait)
	return s
}

func (s *sim) at(t time.Time, fn func()) {
	if t.Before(s.now) {
		t = s.now
	}
	s.evSeq++
	s.q.push(event{at: t.UnixNano(), seq: s.evSeq, fn: fn})
}

func (s *sim) after(d time.Duration, fn func()) { s.at(s.now.Add(d), fn) }

func (s *sim) violate(kind, format string, args ...any) {
	if s.kinds[kind] {
		return
	}
	if s.keepGoing {
		s.kinds[kind] = true
	}
	msg := fmt.Sprintf("t=%s: ", s.now.Sub(s.start)) + fmt.Sprintf(format, args...)
	s.fail = append(s.fail, msg)
	if s.trace != nil {
		s.trace("VIOLATION %s", msg)
	}
}

func (s *sim) logf(format string, args ...any) {
	if s.trace != nil {
		s.trace("t=%-12s "+format, append([]any{s.now.Sub(s.start)}, args...)...)
	}
}

// run processes events until until, or until the system has settled.
func (s *sim) run(until time.Time, settle bool) {
	limit := until.UnixNano()
	for len(s.q) > 0 && (len(s.fail) == 0 || s.keepGoing) {
		if s.q[0].at > limit {
			break
		}
		if settle && s.settled() {
			return
		}
		e := s.q.pop()
		s.now = time.Unix(0, e.at).UTC()
		e.fn()
		s.steps++
		s.checkExclusive()
	}
	if s.now.Before(until) && len(s.q) == 0 {
		s.now = until
	}
}

// settled: nothing left in the stream, nothing running.
func (s *sim) settled() bool {
	if len(s.srv.msgs) > 0 {
		return false
	}
	for _, hs := range s.running {
		if len(hs) > 0 {
			return false
		}
	}
	return true
}

// --- checks ---

// active reports whether h may still write: a handler writes only while
// its replica runs (a paused one may resume), it is not cancelled, and
// (checked at the point of writing) its partition's lease holds.
func (s *sim) active(h *handler) bool {
	r := h.r
	if r.crashed || h.cancelled || h.done {
		return false
	}
	if s.cfg.legacyLoop {
		return true
	}
	return s.now.Before(r.deadline[h.part])
}

func (s *sim) checkExclusive() {
	if s.crowded == 0 {
		return
	}
	for item, hs := range s.running {
		if len(hs) < 2 {
			continue
		}
		var act []*handler
		for _, h := range hs {
			if s.active(h) {
				act = append(act, h)
			}
		}
		if len(act) > 1 {
			var who []string
			for _, h := range act {
				who = append(who, fmt.Sprintf("%s(seq %d, %s)", h.r.id, h.seq, h.part))
			}
			s.violate("exclusive", "item %d has %d handlers that may write at once: %s", item, len(act), strings.Join(who, ", "))
			return
		}
	}
}

func (s *sim) wrote(h *handler) {
	s.logf("%s writes item %d seq %d", h.r.id, h.item, h.seq)
	if s.cfg.ordered && h.seq < s.written[h.item] {
		s.violate("order", "item %d: seq %d written by %s after seq %d", h.item, h.seq, h.r.id, s.written[h.item])
	}
	s.written[h.item] = max(s.written[h.item], h.seq)
	s.writes[h.seq] = true
}

func (s *sim) onDelivered(c *simConsumer, seq uint64, dc int) {
	if dc > 1 && s.justified[seq] < dc-1 {
		s.violate("budget", "seq %d delivered a %d. time by %s: only %d of its redeliveries followed a lease lost for good", seq, dc, c.id, s.justified[seq])
	}
}

// onRedelivered: a message is delivered again (or given up after
// MaxDeliver) while its last delivery p is still pending. That is
// justified only if the replica p went to lost its lease for good: it
// crashed, the lease it held then ran out on the server, or it held none
// (a subscriber left behind by a replica that had lost it). A handover
// deletes its lease after resetting the consumer, which forgets the
// delivery counts: a redelivery after one is not justified.
func (s *sim) onRedelivered(c *simConsumer, seq uint64, p *pend) {
	if p.sub.r.crashed || p.lease == 0 || s.srv.expired[p.lease] || p.askedAgain {
		s.justified[seq]++
	}
}

func (s *sim) onMaxDeliveries(c *simConsumer, seq uint64) {
	s.logf("MAX_DELIVERIES seq %d on %s", seq, c.id)
	if s.justified[seq] < s.srv.maxDeliv-1 {
		s.violate("budget", "seq %d dead-lettered with %d of %d redeliveries after a lease lost for good", seq, s.justified[seq], s.srv.maxDeliv-1)
	}
	// The DLQ worker moves it out of the stream.
	s.dead[seq] = true
	s.srv.deleteMsg(seq)
}

func (s *sim) onReset(c *simConsumer) {
	s.logf("reset %s", c.id)
	for seq := range s.justified {
		if m := s.srv.msgs[seq]; m != nil && s.srv.partitionOf(m.item, c.id.N) == c.id.P {
			delete(s.justified, seq)
		}
	}
}

func (s *sim) onConsumerDeleted(c *simConsumer) {
	s.logf("consumer %s deleted (cut-over)", c.id)
	for seq := range c.pending {
		delete(s.justified, seq)
	}
}

// final checks that nothing was lost: every item's newest message was
// written (or dead-lettered after a crash loop), and every message was
// written, superseded by a newer one, or dead-lettered.
func (s *sim) final() {
	if len(s.fail) > 0 && !s.keepGoing {
		return
	}
	if len(s.srv.msgs) > 0 {
		var left []string
		for seq, m := range s.srv.msgs {
			left = append(left, fmt.Sprintf("seq %d (item %d)", seq, m.item))
		}
		sort.Strings(left)
		s.violate("lost", "never settled: %s", strings.Join(left, ", "))
		return
	}
	for item, seqs := range s.published {
		last := seqs[len(seqs)-1]
		if !s.writes[last] && !s.dead[last] {
			s.violate("lost", "item %d: newest seq %d never written", item, last)
		}
		for _, seq := range seqs {
			if !s.writes[seq] && !s.superseded[seq] && !s.dead[seq] {
				s.violate("lost", "item %d: seq %d neither written, superseded nor dead-lettered", item, seq)
			}
		}
	}
}

// --- replicas: the driver's model ---

type simSub struct {
	r     *replica
	part  Partition
	epoch uint64
	alive bool
	c     *simConsumer
}

type dmsg struct {
	seq  uint64
	dseq uint64
	item int
	part Partition
	sub  *simSub
}

type handler struct {
	r         *replica
	id        uint64
	seq       uint64
	item      int
	part      Partition
	cancelled bool
	done      bool
}

type replica struct {
	s        *sim
	id       string
	core     *Core
	crashed  bool
	paused   bool
	deferred []func()
	// slowUntil / lossyUntil: the JetStream API answers late / loses
	// replies until then.
	slowUntil, lossyUntil time.Time
	slowBy                time.Duration
	deadline              map[Partition]time.Time
	epoch                 map[Partition]uint64
	subs                  map[Partition]*simSub
	msgs                  map[uint64]*dmsg
	handlers              map[uint64]*handler
	nextID                uint64
	wake                  time.Time
	blocked               int // legacyLoop: blocking API calls in flight
	tickOwed              bool
}

func (s *sim) addReplica(begin time.Duration) *replica {
	s.nextRep++
	r := &replica{s: s, id: fmt.Sprintf("r%d", s.nextRep), deadline: map[Partition]time.Time{}, epoch: map[Partition]uint64{},
		subs: map[Partition]*simSub{}, msgs: map[uint64]*dmsg{}, handlers: map[uint64]*handler{}}
	r.core = New(Config{Member: r.id, Lease: s.lease, AckWait: s.cfg.ackWait, Ordered: s.cfg.ordered,
		Limits: fairq.Limits{PerGroup: 4, Total: 8}}, s.srv.n, s.now)
	r.core.q = s.cfg.quirks
	s.reps = append(s.reps, r)
	s.logf("%s starts", r.id)
	// It learns the members already there (the watch's initial values),
	// then begins.
	for _, o := range s.reps {
		if o != r && !o.crashed && s.srv.kvGet("member."+o.id) != nil {
			r.core.MemberSeen(o.id, s.now)
		}
	}
	r.after(begin, func() { r.core.Begin(s.now); r.flush() })
	r.flush()
	return r
}

// after runs fn after d unless the replica crashed; while it is paused,
// fn waits for it to resume.
func (r *replica) after(d time.Duration, fn func()) {
	r.s.after(d, func() { r.do(fn) })
}

func (r *replica) do(fn func()) {
	switch {
	case r.crashed:
	case r.paused:
		r.deferred = append(r.deferred, fn)
	default:
		fn()
	}
}

func (r *replica) crash() {
	r.s.logf("%s crashes", r.id)
	r.crashed = true
	for _, sub := range r.subs {
		sub.alive = false
	}
	for _, h := range r.handlers {
		r.s.finish(h)
	}
}

func (r *replica) pause() {
	r.s.logf("%s pauses", r.id)
	r.paused = true
}

// resume runs what waited, in an adversarial order: handlers may run
// before any timer does.
func (r *replica) resume() {
	if r.crashed || !r.paused {
		return
	}
	r.s.logf("%s resumes", r.id)
	r.paused = false
	d := r.deferred
	r.deferred = nil
	r.s.rng.Shuffle(len(d), func(i, j int) { d[i], d[j] = d[j], d[i] })
	for _, fn := range d {
		if r.crashed {
			return
		}
		if r.paused {
			r.deferred = append(r.deferred, fn)
			continue
		}
		fn()
	}
}

// latency is one API round trip's half; slow replicas wait longer.
func (r *replica) latency() time.Duration {
	if r.s.now.Before(r.slowUntil) {
		return simNet + time.Duration(r.s.rng.Int64N(int64(r.slowBy)+1))
	}
	return simNet + time.Duration(r.s.rng.Int64N(int64(3*time.Millisecond)))
}

// api sends a request: apply runs on the server after the request's
// latency (unless it is lost), and reply gets its answer on the replica
// after the reply's latency, or lost=true after the request's timeout.
func (r *replica) api(apply func(), reply func(lost bool)) {
	s := r.s
	lossy := s.now.Before(r.lossyUntil)
	reqLost := lossy && s.rng.IntN(10) == 0
	replyLost := lossy && s.rng.IntN(4) == 0
	out := r.latency()
	back := r.latency()
	if !reqLost {
		s.after(out, func() {
			if !r.crashed {
				apply()
			}
		})
	}
	if reqLost || replyLost {
		r.after(max(simTimeout, out), func() { reply(true) })
		return
	}
	r.after(out+back, func() { reply(false) })
}

// flush performs the core's effects.
func (r *replica) flush() {
	for {
		effs := r.core.Ready()
		if len(effs) == 0 {
			break
		}
		for _, e := range effs {
			if *simEffects {
				r.s.logf("%s: %s", r.id, show([]Effect{e})[0])
			}
			r.effect(e)
		}
	}
	r.arm()
}

// arm schedules the core's next Tick.
func (r *replica) arm() {
	w := r.core.Wake()
	if !r.wake.IsZero() && !w.Before(r.wake) && r.wake.After(r.s.now) {
		return
	}
	r.wake = w
	r.s.at(w, func() {
		r.do(func() {
			if !r.wake.Equal(w) {
				return
			}
			r.wake = time.Time{}
			r.tick()
		})
	})
}

func (r *replica) tick() {
	if r.s.cfg.legacyLoop && r.blocked > 0 {
		r.tickOwed = true // the old loop was waiting on an API call
		return
	}
	r.core.Tick(r.s.now)
	r.flush()
	if !r.core.Left() {
		r.arm()
	}
}

// block marks an API call the old driver made from its loop (legacyLoop):
// the loop, and so the fence, waited for it; call the result when it is
// answered.
func (r *replica) block() func() {
	if !r.s.cfg.legacyLoop {
		return func() {}
	}
	r.blocked++
	return func() {
		r.blocked--
		if r.blocked == 0 && r.tickOwed {
			r.tickOwed = false
			r.tick()
		}
	}
}

func (r *replica) effect(e Effect) {
	s, srv := r.s, r.s.srv
	now := func() time.Time { return s.now }
	switch e.Kind {
	case ReadLayout:
		var n int
		unblock := r.block()
		r.api(func() { n = srv.n }, func(lost bool) {
			var err error
			if lost {
				err = errSim
			}
			r.core.LayoutRead(e.Read, n, err, now())
			r.flush()
			unblock()
		})
	case RenewMember:
		r.api(func() {
			srv.kvPut("member."+r.id, r.id)
			for _, o := range s.reps {
				if o != r {
					o.after(simNet, func() { o.core.MemberSeen(r.id, now()); o.flush() })
				}
			}
		}, func(bool) {})
	case Leave:
		r.api(func() {
			srv.kvDelete("member."+r.id, 0)
			for _, o := range s.reps {
				if o != r {
					o.after(simNet, func() { o.core.MemberGone(r.id, now()); o.flush() })
				}
			}
		}, func(bool) {})
	case Claim:
		sent := s.now
		unblock := r.block()
		r.leaseWrite(e.Part, true, func() (uint64, bool) { return srv.kvCreate(leaseKey(e.Part), r.id) }, func(rev uint64, out Outcome) {
			s.logf("%s claims %s: %v", r.id, e.Part, out)
			r.core.ClaimDone(e.Part, rev, out, sent, now())
			r.flush()
			unblock()
		})
	case Renew:
		sent := s.now
		type res struct {
			rev uint64
			ok  bool
		}
		results := make([]res, len(e.Leases))
		r.api(func() {
			for i, l := range e.Leases {
				results[i].rev, results[i].ok = srv.kvUpdate(leaseKey(l.Part), r.id, l.Rev)
			}
		}, func(lost bool) {
			rs := make([]Renewal, len(e.Leases))
			pending := 0
			for i, l := range e.Leases {
				rs[i] = Renewal{Part: l.Part, Out: Failed}
				if lost {
					continue
				}
				if results[i].ok {
					rs[i].Out, rs[i].Rev = OK, results[i].rev
					continue
				}
				// A revision mismatch may be our own renewal applied
				// with its reply lost: read the lease back.
				pending++
				i, l := i, l
				r.leaseWrite(l.Part, false, func() (uint64, bool) { return 0, false }, func(rev uint64, out Outcome) {
					rs[i].Rev, rs[i].Out = rev, out
					pending--
					if pending == 0 {
						r.core.RenewDone(rs, sent, now())
						r.flush()
					}
				})
			}
			if pending == 0 {
				r.core.RenewDone(rs, sent, now())
				r.flush()
			}
		})
	case Recover:
		sent := s.now
		r.leaseWrite(e.Part, false, func() (uint64, bool) { return srv.kvUpdate(leaseKey(e.Part), r.id, e.Rev) }, func(rev uint64, out Outcome) {
			s.logf("%s recovers %s: %v", r.id, e.Part, out)
			r.core.RecoverDone(e.Part, rev, out, sent, now())
			r.flush()
		})
	case DeleteLease:
		r.api(func() { srv.kvDelete(leaseKey(e.Part), e.Rev) }, func(bool) {
			s.logf("%s released %s", r.id, e.Part)
			r.core.ReleaseDone(e.Part, now())
			r.flush()
		})
	case Open, ReadFloor:
		var st ConsumerState
		found := false
		unblock := r.block()
		r.api(func() {
			if c := srv.cons[e.Part]; c != nil {
				st, found = srv.info(c), true
			}
		}, func(lost bool) {
			var err error
			if lost || !found {
				err = errSim
			}
			if e.Kind == Open {
				r.core.OpenDone(e.Part, st, err, now())
			} else {
				r.core.FloorRead(e.Part, st, err, now())
			}
			r.flush()
			unblock()
		})
	case Consume:
		r.epoch[e.Part] = e.Epoch
		sub := &simSub{r: r, part: e.Part, epoch: e.Epoch, alive: true}
		r.subs[e.Part] = sub
		s.logf("%s consumes %s (epoch %d)", r.id, e.Part, e.Epoch)
		r.after(r.latency(), func() {
			c := srv.cons[e.Part]
			if c == nil {
				sub.alive = false
				r.core.ConsumeFailed(e.Part, e.Epoch, now())
				r.flush()
				return
			}
			sub.c = c
			r.pull(sub)
		})
	case StopConsume:
		if sub := r.subs[e.Part]; sub != nil && sub.epoch == e.Epoch {
			sub.alive = false
			delete(r.subs, e.Part)
		}
	case Deadline:
		r.deadline[e.Part] = e.Until
	case Cancel:
		for _, h := range r.handlers {
			if h.part == e.Part {
				h.cancelled = true
			}
		}
	case Run:
		m := r.msgs[e.ID]
		h := &handler{r: r, id: e.ID, seq: m.seq, item: m.item, part: m.part}
		r.handlers[e.ID] = h
		s.running[m.item] = append(s.running[m.item], h)
		if len(s.running[m.item]) == 2 {
			s.crowded++
		}
		r.run(h, e.Check)
	case Drop:
		for _, id := range e.IDs {
			delete(r.msgs, id)
		}
	case Nak:
		for _, id := range e.IDs {
			if m := r.msgs[id]; m != nil {
				delete(r.msgs, id)
				r.api(func() {
					if c := srv.cons[m.part]; c != nil && m.sub.c == c {
						srv.nak(c, m.seq, m.dseq, false)
					}
				}, func(bool) {})
			}
		}
	case Reset:
		if !s.now.Before(r.deadline[e.Part]) && !r.s.cfg.legacyLoop {
			// Point of writing: the lease must hold when the reset is
			// sent.
			r.after(0, func() { r.core.ResetDone(e.Part, errSim, now()); r.flush() })
			return
		}
		r.api(func() {
			if c := srv.cons[e.Part]; c != nil {
				srv.reset(c)
			}
		}, func(lost bool) {
			var err error
			if lost {
				err = errSim
			}
			r.core.ResetDone(e.Part, err, now())
			r.flush()
		})
	}
}

var errSim = fmt.Errorf("simulated failure")

// leaseWrite performs a conditional lease write as the driver does: a
// refusal (the revision moved, or the key exists) may be this replica's
// own earlier write whose reply was lost, so the lease is read back and,
// if it still names this replica, rewritten at its revision (a claim
// then reports Regained).
func (r *replica) leaseWrite(p Partition, claim bool, write func() (uint64, bool), done func(rev uint64, out Outcome)) {
	srv := r.s.srv
	var rev uint64
	var ok bool
	r.api(func() { rev, ok = write() }, func(lost bool) {
		switch {
		case lost:
			done(0, Failed)
		case ok:
			done(rev, OK)
		default:
			var cur *kvEntry
			var rev2 uint64
			var ok2 bool
			r.api(func() {
				cur = srv.kvGet(leaseKey(p))
				if cur != nil && cur.val == r.id {
					rev2, ok2 = srv.kvUpdate(leaseKey(p), r.id, cur.rev)
				}
			}, func(lost bool) {
				switch {
				case lost:
					done(0, Failed)
				case ok2 && claim:
					done(rev2, Regained)
				case ok2:
					done(rev2, OK)
				default:
					done(0, Taken)
				}
			})
		}
	})
}

// pull keeps one pull request of sub outstanding, as nats.go's Consume
// does, each expiring after simPullExp.
func (r *replica) pull(sub *simSub) {
	if !sub.alive || sub.c == nil || sub.c.deleted {
		if sub.alive && sub.c != nil && sub.c.deleted {
			sub.alive = false
			r.core.ConsumeFailed(sub.part, sub.epoch, r.s.now)
			r.flush()
		}
		return
	}
	srv := r.s.srv
	p := &pull{sub: sub, n: srv.maxAck, expires: r.s.now.Add(simPullExp)}
	r.s.after(simNet, func() {
		if r.crashed || sub.c.deleted {
			return
		}
		sub.c.waiting = append(sub.c.waiting, p)
		srv.deliver(sub.c)
	})
	r.after(simPullExp, func() { r.pull(sub) })
}

// receive is a delivery reaching the replica's subscription.
func (r *replica) receive(sub *simSub, seq, dseq uint64, dc int) {
	item := r.s.srv.msgs[seq].item
	r.s.after(simNet, func() {
		r.do(func() {
			r.s.logf("%s gets seq %d (item %d, dseq %d, delivery %d) on %s epoch %d", r.id, seq, item, dseq, dc, sub.part, sub.epoch)
			r.nextID++
			id := r.nextID
			r.msgs[id] = &dmsg{seq: seq, dseq: dseq, item: item, part: sub.part, sub: sub}
			r.core.Deliver(Msg{ID: id, Part: sub.part, Epoch: sub.epoch, Group: simGroup, Key: itemKeys[item], Seq: seq, DSeq: dseq}, r.s.now)
			r.flush()
		})
	})
}

// run is a handler: the oldest check (if asked), some work, the write
// (checked at the point of writing), the ack (checked too), done.
func (r *replica) run(h *handler, check bool) {
	s, srv := r.s, r.s.srv
	m := r.msgs[h.id]
	settled := false
	end := func() {
		s.finish(h)
		delete(r.handlers, h.id)
		delete(r.msgs, h.id)
		r.core.Done(h.id, settled, s.now)
		r.flush()
	}
	mayWrite := func() bool {
		if h.cancelled {
			return false
		}
		return s.cfg.legacyLoop || s.now.Before(r.deadline[h.part])
	}
	work := func() {
		d := time.Duration(s.rng.Int64N(int64(300 * time.Millisecond)))
		if s.rng.IntN(20) == 0 {
			d = time.Duration(s.rng.Int64N(int64(2 * s.cfg.ackWait)))
		}
		r.after(d, func() {
			if !mayWrite() {
				end()
				return
			}
			if s.cfg.giveBack && s.rng.IntN(50) == 0 {
				// The handler fails and returns without settling: the
				// driver gives the message back to the server, a
				// redelivery the handler asked for.
				// The redelivery it causes is justified: after AckWait
				// if the nak is lost, or when the server takes it, which
				// may be after a reset that forgot the delivery counts
				// (a nak is not waited for; the server applies one of an
				// earlier incarnation's delivery whose delivery sequence
				// is still in range).
				s.logf("%s gives seq %d back unsettled", r.id, h.seq)
				if c := srv.cons[h.part]; c != nil && m.sub.c == c {
					if p := c.pending[h.seq]; p != nil && p.sub == m.sub && p.dseq == m.dseq {
						p.askedAgain = true
					}
				}
				r.api(func() {
					if c := srv.cons[h.part]; c != nil && m.sub.c == c {
						srv.nak(c, h.seq, m.dseq, true)
					}
				}, func(bool) {})
				end()
				return
			}
			s.wrote(h)
			if !s.cfg.ordered {
				// A work item's ack is not waited for: one lost in
				// transit redelivers the item (the server doing its job,
				// not a lease lost).
				lost := true
				r.api(func() {
					lost = false
					if c := srv.cons[h.part]; c != nil && m.sub.c == c {
						srv.ack(c, h.seq)
					}
				}, func(bool) {})
				r.s.at(r.s.now.Add(simTimeout), func() {
					if lost {
						s.justified[h.seq]++
					}
				})
				settled = true
				end()
				return
			}
			// The ack is confirmed (AckSync), retried while the lease
			// holds: a lost ack must not let the item's next message run
			// while this one is still in the stream.
			var ack func()
			ack = func() {
				if !mayWrite() {
					end()
					return
				}
				answered := false
				r.api(func() {
					if c := srv.cons[h.part]; c != nil && m.sub.c == c {
						answered = srv.ack(c, h.seq)
					}
				}, func(lost bool) {
					if lost || !answered {
						r.after(100*time.Millisecond, ack)
						return
					}
					settled = true
					end()
				})
			}
			ack()
		})
	}
	if !check {
		work()
		return
	}
	var run, gone bool
	var attempt func()
	attempt = func() {
		r.api(func() {
			for {
				first, ok := srv.firstOf(h.item, 1)
				switch {
				case !ok || first > h.seq:
					gone = true
					return
				case first == h.seq:
					run = true
					return
				}
				s.logf("%s deletes seq %d, superseded by %d", r.id, first, h.seq)
				s.superseded[first] = true
				srv.deleteMsg(first)
			}
		}, func(lost bool) {
			switch {
			case h.cancelled || !s.cfg.legacyLoop && !s.now.Before(r.deadline[h.part]):
				end()
			case lost:
				r.after(time.Second, attempt) // retried in place
			case gone:
				s.superseded[h.seq] = true
				settled = true
				end()
			case run:
				work()
			}
		})
	}
	attempt()
}

func (s *sim) finish(h *handler) {
	h.done = true
	hs := s.running[h.item]
	for i, x := range hs {
		if x == h {
			s.running[h.item] = append(hs[:i], hs[i+1:]...)
			if len(hs) == 2 {
				s.crowded--
			}
			break
		}
	}
}

// heartbeat keeps the held messages of a replica alive (InProgress
// through the connection, not the API: a slow API does not stop it).
func (r *replica) heartbeat() {
	r.after(r.s.cfg.ackWait/3, func() {
		r.core.Held(r.s.now, func(id uint64) {
			m := r.msgs[id]
			if m == nil || m.sub.c == nil {
				return
			}
			c := m.sub.c
			r.s.after(simNet, func() {
				if !r.crashed {
					r.s.srv.inProgress(c, m.seq)
				}
			})
		})
		if !r.core.Left() {
			r.heartbeat()
		}
	})
}

// --- schedules ---

// schedule draws a seed's configuration, workload and faults, runs them,
// heals every fault, lets the system settle and checks the outcome.
func schedule(seed uint64, legacy bool, trace func(string, ...any)) *sim {
	rng := rand.New(rand.NewPCG(seed, 7))
	// The old protocol is run without handlers that give messages back,
	// so that what it finds is what issue 24 names.
	cfg := simConfig{ordered: rng.IntN(4) != 0, n: 1 << rng.IntN(2), items: 2 + rng.IntN(4), replicas: 1 + rng.IntN(3), giveBack: !legacy}
	cfg.ackWait = 15 * time.Second
	if cfg.ordered {
		cfg.ackWait = 30 * time.Second
	}
	if legacy {
		cfg.quirks = quirks{nakOnRelease: true, noOrderCheck: true, orderedWait: cfg.ordered, layoutErrOK: true, noRecover: true}
		cfg.legacyLoop = true
	}
	s := newSim(seed, cfg)
	s.trace = trace
	s.keepGoing = legacy
	for i := 0; i < cfg.replicas; i++ {
		r := s.addReplica(time.Duration(rng.Int64N(int64(time.Second))))
		r.heartbeat()
	}
	// Work: several messages per item, in bursts.
	for item := 0; item < cfg.items; item++ {
		k := 1 + rng.IntN(6)
		t := time.Duration(rng.Int64N(int64(simPublishes / 2)))
		for j := 0; j < k; j++ {
			t += time.Duration(rng.Int64N(int64(8 * time.Second)))
			item := item
			s.after(t, func() {
				seq := s.srv.publish(item)
				s.published[item] = append(s.published[item], seq)
				s.logf("publish item %d seq %d", item, seq)
			})
		}
	}
	// Faults.
	for f := rng.IntN(5); f > 0; f-- {
		at := time.Duration(rng.Int64N(int64(simPublishes)))
		kind := rng.IntN(8)
		s.after(at, func() { s.fault(kind, rng) })
	}
	// The layout keeper runs every second.
	var keep func()
	keep = func() {
		s.srv.reconcile()
		s.after(time.Second, keep)
	}
	s.after(time.Second, keep)
	end := s.start.Add(simPublishes + 10*time.Second)
	s.run(end, false)
	s.heal()
	s.run(end.Add(simSettle), true)
	s.final()
	return s
}

// fault injects one fault.
func (s *sim) fault(kind int, rng *rand.Rand) {
	var live []*replica
	for _, r := range s.reps {
		if !r.crashed && !r.core.stopping {
			live = append(live, r)
		}
	}
	pick := func() *replica {
		if len(live) == 0 {
			return nil
		}
		return live[rng.IntN(len(live))]
	}
	s.faults[faultNames[kind]]++
	switch kind {
	case 0: // a crash; the process comes back as a new member
		if r := pick(); r != nil {
			r.crash()
			s.after(time.Duration(rng.Int64N(int64(3*s.lease))), func() { s.addReplica(2 * time.Second).heartbeat() })
		}
	case 1: // a pause, often past the lease
		if r := pick(); r != nil {
			r.pause()
			s.after(time.Duration(rng.Int64N(int64(3*s.lease))), r.resume)
		}
	case 2: // a new replica joins
		s.addReplica(2 * time.Second).heartbeat()
	case 3: // a replica leaves gracefully (a rolling update)
		if r := pick(); r != nil && len(live) > 1 {
			s.logf("%s stops", r.id)
			r.core.Stop(s.now)
			r.flush()
		}
	case 4: // a slow JetStream API
		if r := pick(); r != nil {
			r.slowBy = time.Duration(rng.Int64N(int64(s.lease)))
			r.slowUntil = s.now.Add(time.Duration(rng.Int64N(int64(3 * s.lease))))
			s.logf("%s: API slow by up to %s until %s", r.id, r.slowBy, r.slowUntil.Sub(s.start))
		}
	case 5: // lost requests and replies
		if r := pick(); r != nil {
			r.lossyUntil = s.now.Add(time.Duration(rng.Int64N(int64(3 * s.lease))))
			s.logf("%s: lossy until %s", r.id, r.lossyUntil.Sub(s.start))
		}
	case 6: // a partition-count change (the watcher writes the metadata)
		s.srv.n = 3 - s.srv.n // 1 ↔ 2
		s.logf("partitions → %d", s.srv.n)
	case 7: // a burst on one item
		item := rng.IntN(s.cfg.items)
		for j := 0; j < 3; j++ {
			seq := s.srv.publish(item)
			s.published[item] = append(s.published[item], seq)
			s.logf("publish item %d seq %d (burst)", item, seq)
		}
	}
}

var faultNames = [...]string{"crash", "pause", "join", "leave", "slow", "lossy", "repartition", "burst"}

// heal ends every fault: paused replicas resume, APIs recover, and a
// replica runs.
func (s *sim) heal() {
	alive := 0
	for _, r := range s.reps {
		r.slowUntil, r.lossyUntil = time.Time{}, time.Time{}
		r.resume()
		if !r.crashed && !r.core.stopping {
			alive++
		}
	}
	if alive == 0 {
		s.addReplica(2 * time.Second).heartbeat()
	}
}

// --- tests ---

func schedules(t *testing.T) (first uint64, n int) {
	n = *simSchedules
	if n == 0 {
		n = 100000
		if testing.Short() {
			n = 2000
		}
	}
	return *simFirst, n
}

// runSchedules simulates n schedules from seed first on every core and
// returns the failing seeds (up to max) with their first violation.
func runSchedules(first uint64, n int, legacy bool, maxFail int) (fails []string, steps int64) {
	defer debug.SetGCPercent(debug.SetGCPercent(400))
	var next atomic.Uint64
	next.Store(first)
	var mu sync.Mutex
	var wg sync.WaitGroup
	var total atomic.Int64
	end := first + uint64(n)
	for w := 0; w < runtime.GOMAXPROCS(0); w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				seed := next.Add(1) - 1
				if seed >= end {
					return
				}
				s := schedule(seed, legacy, nil)
				total.Add(int64(s.steps))
				if len(s.fail) > 0 {
					var fs []string
					for f := range s.faults {
						fs = append(fs, f)
					}
					sort.Strings(fs)
					mu.Lock()
					for _, f := range s.fail {
						if len(fails) < maxFail {
							fails = append(fails, fmt.Sprintf("seed %d (faults: %s): %s", seed, strings.Join(fs, ","), f))
						}
					}
					mu.Unlock()
				}
			}
		}()
	}
	wg.Wait()
	sort.Strings(fails)
	return fails, total.Load()
}

// TestSimulation runs the protocol through randomized schedules and
// checks its invariants after every step.
func TestSimulation(t *testing.T) {
	if *simSeed != 0 {
		s := schedule(*simSeed, false, t.Logf)
		for _, f := range s.fail {
			t.Error(f)
		}
		t.Logf("%d steps", s.steps)
		return
	}
	first, n := schedules(t)
	start := time.Now()
	fails, steps := runSchedules(first, n, false, 20)
	t.Logf("%d schedules (seeds %d-%d), %d steps, in %s", n, first, first+uint64(n)-1, steps, time.Since(start).Round(time.Millisecond))
	for _, f := range fails {
		t.Error(f)
	}
}

// TestSimulationFindsOldDefects runs the same schedules against the
// protocol as it was before issue 24 (quirks: a handover naks what waits
// and resets nothing, a takeover waits at most AckWait for the previous
// owner's messages and then trusts the redelivery order, a failed layout
// read counts as unchanged, a fenced partition is simply forgotten; the
// driver's fence waits behind blocking API calls and handlers check only
// their cancellation): the harness must find each defect the issue
// names.
func TestSimulationFindsOldDefects(t *testing.T) {
	first, n := schedules(t)
	n = min(n, 20000)
	fails, _ := runSchedules(first, n, true, 1<<30)
	kinds := map[string][]string{}
	for _, f := range fails {
		switch {
		case strings.Contains(f, "written by") && !strings.Contains(f, "crash") && !strings.Contains(f, "pause") &&
			!strings.Contains(f, "slow") && !strings.Contains(f, "lossy") && !strings.Contains(f, "repartition"):
			kinds["1b: an older desired state applied after a newer one, graceful handovers only"] = append(kinds["1b: an older desired state applied after a newer one, graceful handovers only"], f)
		case strings.Contains(f, "written by"):
			kinds["1: an older desired state applied after a newer one"] = append(kinds["1: an older desired state applied after a newer one"], f)
		case strings.Contains(f, "delivered a") || strings.Contains(f, "dead-lettered"):
			kinds["2: deliveries spent (and dead letters) without a lease lost for good"] = append(kinds["2: deliveries spent (and dead letters) without a lease lost for good"], f)
		case strings.Contains(f, "may write at once"):
			kinds["3: two handlers of one item that may write at once"] = append(kinds["3: two handlers of one item that may write at once"], f)
		default:
			kinds["other"] = append(kinds["other"], f)
		}
	}
	for _, k := range []string{"1: an older desired state applied after a newer one", "1b: an older desired state applied after a newer one, graceful handovers only", "2: deliveries spent (and dead letters) without a lease lost for good", "3: two handlers of one item that may write at once", "other"} {
		fs := kinds[k]
		t.Logf("defect %s: %d of %d schedules", k, len(fs), n)
		for _, f := range fs[:min(2, len(fs))] {
			t.Logf("    e.g. %s", f)
		}
		if k != "other" && len(fs) == 0 {
			t.Errorf("the simulation did not find defect %s in the old protocol", k)
		}
	}
}
