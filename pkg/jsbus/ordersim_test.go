package jsbus

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"net/http"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// The order simulation (issue 33): the real oldest-message check of an
// ordered stage (order.go, through the msgStore seam) and the real lease
// guard (leaseguard.go, with the lease reading a fake clock) under seeded
// schedules of a partition's life: desired states published to a few
// items (some of them finalizer releases that must never be skipped), the
// partition handed from owner to owner, each handover redelivering what
// was left in the stream in any order, interleaved with new messages;
// stream reads and deletes that fail; an owner cut off between its write
// and its ack; and an owner paused past its lease with a write in flight,
// which it sends when it resumes, before or without its fence having run.
// Ownership itself is the core's (pkg/ownership's simulation checks that
// one owner acts at a time); here owners follow one another.
//
// It checks that an item's writes never go back in stream order (but a
// kept message's, which runs whenever it comes back), that the kept
// messages are never deleted, and, once the faults stop and the stream is
// drained, that the newest message of each item was written, every kept
// one too, and the stream is empty.
//
//	go test ./pkg/jsbus -run 'TestOrderSimulation$' -ordersim.schedules 1000000
//	go test ./pkg/jsbus -run 'TestOrderSimulation$' -ordersim.seed 12345 -v   (one schedule, traced)

var (
	orderSimSchedules = flag.Int("ordersim.schedules", 0, "order simulation schedules (0: 20000, or 2000 with -short)")
	orderSimSeed      = flag.Uint64("ordersim.seed", 0, "simulate only this seed of the order simulation, with a trace")
)

const (
	osStream = "MC_DESIRED"
	osLease  = 10 * time.Second
)

// osMsg is a message of the model stream.
type osMsg struct {
	item int
	keep bool
}

// osStore is the model stream behind msgStore; fail injects a failure
// into a read or a delete.
type osStore struct {
	s    *osSim
	msgs map[uint64]osMsg
	fail func() bool
}

func osSubject(item int) string { return fmt.Sprintf("mc.desired.s.c.item%d", item) }

func (st *osStore) FirstFrom(_ context.Context, stream, subj string, from uint64) (*jetstream.RawStreamMsg, error) {
	if stream != osStream {
		return nil, fmt.Errorf("stream %s: %w", stream, jetstream.ErrStreamNotFound)
	}
	if st.fail() {
		st.s.seen["read failed"]++
		return nil, errors.New("read: injected fault")
	}
	best := uint64(0)
	for seq, m := range st.msgs {
		if seq >= from && osSubject(m.item) == subj && (best == 0 || seq < best) {
			best = seq
		}
	}
	if best == 0 {
		return nil, jetstream.ErrMsgNotFound
	}
	var h nats.Header
	if st.msgs[best].keep {
		h = nats.Header{"Keep": []string{"1"}}
	}
	return &jetstream.RawStreamMsg{Subject: subj, Sequence: best, Header: h}, nil
}

func (st *osStore) DeleteMsg(_ context.Context, stream string, seq uint64) error {
	if st.fail() {
		st.s.seen["delete failed"]++
		return errors.New("delete: injected fault")
	}
	if m, ok := st.msgs[seq]; ok {
		if m.keep {
			st.s.violate("a kept message (seq %d) was deleted", seq)
		}
		st.s.logf("delete superseded seq %d (item %d)", seq, m.item)
		st.s.seen["superseded deleted"]++
		delete(st.msgs, seq)
	}
	return nil
}

func osKeep(h nats.Header, _ []byte) bool { return h.Get("Keep") != "" }

// osOwner is one owner of the partition: its lease (on the fake clock),
// the messages delivered to it, per item in delivery order, and whether it
// checks each one first (every owner after the first: a takeover).
type osOwner struct {
	n      int
	until  atomic.Int64
	lease  *lease
	ctx    context.Context
	check  bool
	queues map[int][]uint64
}

// osZombie is a write in flight of an owner paused past its lease.
type osZombie struct {
	o    *osOwner
	item int
	seq  uint64
}

type osSim struct {
	seed   uint64
	rng    *rand.Rand
	clk    *fakeClock
	store  *osStore
	guard  http.RoundTripper
	noChk  bool // the old driver: no check after a takeover
	seq    uint64
	items  int
	owner  *osOwner
	owners int
	redel  []uint64 // left in the stream by earlier owners, to redeliver
	zombie *osZombie

	published map[int][]uint64 // item → seqs
	written   map[int]uint64   // item → newest seq written
	wrote     map[uint64]bool
	kept      map[uint64]bool // published kept, whether still in the stream or not
	fail      []string
	trace     func(string, ...any)
	// seen counts what the schedule exercised, by kind.
	seen map[string]int
}

func (s *osSim) violate(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	s.fail = append(s.fail, msg)
	s.logf("VIOLATION %s", msg)
}

func (s *osSim) logf(format string, args ...any) {
	if s.trace != nil {
		s.trace(format, args...)
	}
}

// record is the write's destination, behind the lease guard.
func (s *osSim) record(req *http.Request) (*http.Response, error) {
	var item int
	var seq uint64
	if _, err := fmt.Sscanf(req.URL.Path, "/item/%d/%d", &item, &seq); err != nil {
		return nil, err
	}
	keep := s.kept[seq]
	s.logf("write item %d seq %d (keep %v)", item, seq, keep)
	if keep && seq < s.written[item] {
		s.seen["kept written late"]++
	}
	s.wrote[seq] = true
	// A kept message runs whenever it comes back: its write alone may
	// be older than one already made.
	if last := s.written[item]; !keep && seq < last {
		s.violate("item %d: seq %d written after seq %d", item, seq, last)
	}
	s.written[item] = max(s.written[item], seq)
	return &http.Response{StatusCode: http.StatusOK, Body: http.NoBody, Request: req}, nil
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

func (s *osSim) write(ctx context.Context, item int, seq uint64) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPut, fmt.Sprintf("http://apiserver/item/%d/%d", item, seq), http.NoBody)
	if err != nil {
		return err
	}
	resp, err := s.guard.RoundTrip(req)
	if err == nil {
		_ = resp.Body.Close()
	}
	return err
}

func (s *osSim) newOwner() {
	o := &osOwner{n: s.owners, check: s.owners > 0 && !s.noChk, queues: map[int][]uint64{}}
	s.owners++
	o.until.Store(s.clk.Now().Add(osLease).UnixNano())
	o.lease = newLease(&o.until, s.clk)
	o.ctx = leaseCtx{Context: o.lease.ctx, l: o.lease}
	s.owner = o
	s.logf("owner %d takes over (check %v), %d to redeliver", o.n, o.check, len(s.redel))
}

func (s *osSim) publish() {
	s.seq++
	item := s.rng.IntN(s.items)
	keep := s.rng.IntN(7) == 0
	s.store.msgs[s.seq] = osMsg{item: item, keep: keep}
	s.kept[s.seq] = keep
	s.published[item] = append(s.published[item], s.seq)
	s.owner.queues[item] = append(s.owner.queues[item], s.seq)
	s.logf("publish seq %d item %d keep %v", s.seq, item, keep)
}

// redeliver hands one message left by an earlier owner to the current
// one, if it is still in the stream.
func (s *osSim) redeliver() {
	if len(s.redel) == 0 {
		return
	}
	i := s.rng.IntN(len(s.redel))
	seq := s.redel[i]
	s.redel = slices.Delete(s.redel, i, i+1)
	m, ok := s.store.msgs[seq]
	if !ok {
		return
	}
	s.logf("redeliver seq %d item %d to owner %d", seq, m.item, s.owner.n)
	s.owner.queues[m.item] = append(s.owner.queues[m.item], seq)
}

// handover ends the current owner: what is left in the stream is
// redelivered to the next one in any order. With a write in flight, the
// owner may be paused past its lease and send it later.
func (s *osSim) handover(zombie *osZombie) {
	old := s.owner
	s.redel = s.redel[:0]
	for seq := range s.store.msgs {
		s.redel = append(s.redel, seq)
	}
	slices.Sort(s.redel)
	if zombie != nil {
		s.zombie = zombie
		s.logf("owner %d paused with the write of item %d seq %d in flight", old.n, zombie.item, zombie.seq)
	}
	// The lease runs out (the next owner claims it only after it
	// expired); the fence may or may not have run in the paused process.
	s.clk.Advance(osLease + time.Second)
	if s.rng.IntN(2) == 0 {
		old.lease.cancel(errFenced)
	}
	s.newOwner()
}

// step runs the next message of one of the current owner's items.
func (s *osSim) step() {
	o := s.owner
	var items []int
	for item, q := range o.queues {
		if len(q) > 0 {
			items = append(items, item)
		}
	}
	if len(items) == 0 {
		return
	}
	slices.Sort(items)
	item := items[s.rng.IntN(len(items))]
	seq := o.queues[item][0]
	if o.check {
		run, err := oldest(o.ctx, s.store, osStream, osSubject(item), seq, osKeep)
		if err != nil {
			s.logf("owner %d: check of seq %d failed: %v", o.n, seq, err)
			return // tried again in place
		}
		if !run {
			s.logf("owner %d: seq %d is gone: not run", o.n, seq)
			s.seen["gone, not run"]++
			o.queues[item] = o.queues[item][1:]
			return
		}
	}
	if _, ok := s.store.msgs[seq]; !ok && !o.check {
		// Acked already (a redelivery raced with its ack): the server
		// would not deliver it again.
		o.queues[item] = o.queues[item][1:]
		return
	}
	switch s.rng.IntN(12) {
	case 0:
		// Paused past the lease before the write: it goes out later.
		s.handover(&osZombie{o: o, item: item, seq: seq})
		return
	case 1:
		// Written, then cut off before the ack: left in the stream.
		s.seen["cut off before the ack"]++
		if err := s.write(o.ctx, item, seq); err != nil {
			s.violate("owner %d: write of a live lease refused: %v", o.n, err)
		}
		s.handover(nil)
		return
	}
	if err := s.write(o.ctx, item, seq); err != nil {
		s.violate("owner %d: write of a live lease refused: %v", o.n, err)
	}
	delete(s.store.msgs, seq) // acked
	o.queues[item] = o.queues[item][1:]
}

// resumeZombie lets the paused owner send its write: the guard must
// refuse it.
func (s *osSim) resumeZombie() {
	z := s.zombie
	s.zombie = nil
	err := s.write(z.o.ctx, z.item, z.seq)
	s.logf("owner %d resumes: its write of seq %d: %v", z.o.n, z.seq, err)
	if err != nil {
		s.seen["paused write refused"]++
	}
}

// runOrderSchedule runs seed's schedule; guard wraps the writes' transport
// (LeaseGuard, or a defective one).
func runOrderSchedule(seed uint64, noCheck bool, guard func(http.RoundTripper) http.RoundTripper, trace func(string, ...any), seen map[string]int) []string {
	s := &osSim{seed: seed, rng: rand.New(rand.NewPCG(seed, seed^0x5851f42d4c957f2d)), noChk: noCheck,
		clk:       newFakeClock(time.Date(2026, 11, 28, 23, 0, 0, 0, time.UTC)),
		published: map[int][]uint64{}, written: map[int]uint64{}, wrote: map[uint64]bool{}, kept: map[uint64]bool{}, trace: trace, seen: seen}
	s.guard = guard(roundTripFunc(s.record))
	s.items = 1 + s.rng.IntN(3)
	pfail := []int{0, 0, 10, 4}[s.rng.IntN(4)] // 1 in pfail store calls fails
	faults := true
	s.store = &osStore{s: s, msgs: map[uint64]osMsg{}, fail: func() bool {
		return faults && pfail > 0 && s.rng.IntN(pfail) == 0
	}}
	s.newOwner()
	steps := 20 + s.rng.IntN(60)
	for range steps {
		switch r := s.rng.IntN(20); {
		case r < 6:
			s.publish()
		case r < 9:
			s.redeliver()
		case r < 10:
			s.handover(nil)
		case r < 11 && s.zombie != nil:
			s.resumeZombie()
		default:
			s.step()
		}
	}
	// Heal: no more faults or handovers; the paused owner resumes; the
	// current owner is given everything left and drains it.
	faults = false
	if s.zombie != nil {
		s.resumeZombie()
	}
	for len(s.redel) > 0 {
		s.redeliver()
	}
	for range 10000 {
		busy := false
		for _, q := range s.owner.queues {
			busy = busy || len(q) > 0
		}
		if !busy {
			break
		}
		s.step()
		for len(s.redel) > 0 {
			s.redeliver()
		}
	}
	if len(s.store.msgs) > 0 {
		s.violate("%d messages left in the stream after draining", len(s.store.msgs))
	}
	for item, seqs := range s.published {
		for _, seq := range seqs {
			if s.kept[seq] && !s.wrote[seq] {
				s.violate("item %d: kept seq %d never written", item, seq)
			}
		}
		if newest := seqs[len(seqs)-1]; !s.wrote[newest] {
			s.violate("item %d: its newest message, seq %d, never written", item, newest)
		}
	}
	return s.fail
}

func orderSchedules(t *testing.T) (first uint64, n int) {
	if *orderSimSeed != 0 {
		return *orderSimSeed, 1
	}
	n = *orderSimSchedules
	if n == 0 {
		n = 20000
		if testing.Short() {
			n = 2000
		}
	}
	return 1, n
}

// TestOrderSimulation: no schedule breaks an item's order, deletes a kept
// message or loses one.
func TestOrderSimulation(t *testing.T) {
	first, n := orderSchedules(t)
	var trace func(string, ...any)
	if n == 1 {
		trace = t.Logf
	}
	failed := 0
	seen := map[string]int{}
	for seed := first; seed < first+uint64(n); seed++ {
		if fails := runOrderSchedule(seed, false, LeaseGuard, trace, seen); len(fails) > 0 {
			failed++
			if failed <= 5 {
				t.Errorf("seed %d (replay: -run 'TestOrderSimulation$' -ordersim.seed %d -v): %v", seed, seed, fails)
			}
		}
	}
	t.Logf("%d schedules, %d failed; exercised: %v", n, failed, seen)
	if n < 1000 {
		return
	}
	// A schedule generator that stopped producing one of these would
	// leave its defect unchecked.
	for _, k := range []string{"read failed", "delete failed", "superseded deleted", "gone, not run",
		"paused write refused", "cut off before the ack", "kept written late"} {
		if seen[k] == 0 {
			t.Errorf("no schedule exercised %q", k)
		}
	}
}

// clockBlindGuard is the old defect put back into the lease guard: it
// refuses a write only once the handler's context is cancelled (the fence
// has run), not once the lease's deadline has passed by the clock.
func clockBlindGuard(rt http.RoundTripper) http.RoundTripper {
	return roundTripFunc(func(req *http.Request) (*http.Response, error) {
		select {
		case <-req.Context().Done():
			return nil, errFenced
		default:
			return rt.RoundTrip(req)
		}
	})
}

// TestOrderSimulationFindsOldDefects: the simulation finds the defects
// order.go and the clock-reading lease fixed: a driver that runs what a
// takeover redelivers without checking it is the oldest of its item, and
// a guard that trusts the fence alone, so a process paused past its lease
// writes when it resumes.
func TestOrderSimulationFindsOldDefects(t *testing.T) {
	for _, tc := range []struct {
		reason  string
		noCheck bool
		guard   func(http.RoundTripper) http.RoundTripper
	}{
		{"no oldest check after a takeover", true, LeaseGuard},
		{"a lease guard blind to the clock", false, clockBlindGuard},
	} {
		t.Run(tc.reason, func(t *testing.T) {
			for seed := uint64(1); seed <= 2000; seed++ {
				if fails := runOrderSchedule(seed, tc.noCheck, tc.guard, nil, map[string]int{}); len(fails) > 0 {
					t.Logf("found by seed %d: %v", seed, fails[0])
					return
				}
			}
			t.Errorf("2000 schedules found nothing")
		})
	}
}
