package jsbus

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/metabus/metabus/pkg/bus"
	"github.com/metabus/metabus/pkg/outcome"
)

// Real-NATS tests of the partition-ownership protocol across takeovers and
// handovers (issue 24): several desired states per parent, replicas that
// crash (their connection closed without a handover), join and leave.

// applied records, per parent, the work sequences of the desired states an
// ordered stage applied, and flags one applied after a newer one.
type applied struct {
	t     *testing.T
	mu    sync.Mutex
	seqs  map[string][]uint64 // parent → work sequences, in apply order
	by    map[string][]string // parent → replica of each apply
	after []string            // violations
}

func newApplied(t *testing.T) *applied {
	return &applied{t: t, seqs: map[string][]uint64{}, by: map[string][]string{}}
}

// slowHandler is handler without a hold, taking d for each message, so
// that a backlog waits in the replica that owns the partition.
func (a *applied) slowHandler(replica string, d time.Duration) Handler {
	h := a.handler(replica, nil)
	return func(ctx context.Context, m jetstream.Msg) outcome.Outcome {
		time.Sleep(d)
		return h(ctx, m)
	}
}

// handler applies (records and acks) every desired state; hold, if set,
// says which ones to hold unsettled until the handler's context ends (a
// replica that crashes while applying them).
func (a *applied) handler(replica string, hold func(ds bus.DesiredState, delivered uint64) bool) Handler {
	return func(ctx context.Context, m jetstream.Msg) outcome.Outcome {
		var ds bus.DesiredState
		if err := Decode(m, bus.TypeDesired, &ds); err != nil {
			a.t.Errorf("decode: %v", err)
			return outcome.Terminal("malformed")
		}
		_, delivered, _ := Meta(m)
		if hold != nil && hold(ds, delivered) {
			<-ctx.Done()
			return outcome.Outcome{}
		}
		a.mu.Lock()
		p := ds.Parent.UID
		if s := a.seqs[p]; len(s) > 0 && ds.WorkSeq < s[len(s)-1] {
			a.after = append(a.after, fmt.Sprintf("parent %s: desired state %d applied by %s after %d", p, ds.WorkSeq, replica, s[len(s)-1]))
		}
		a.seqs[p] = append(a.seqs[p], ds.WorkSeq)
		a.by[p] = append(a.by[p], replica)
		a.mu.Unlock()
		return outcome.Done()
	}
}

// last is the last work sequence applied for parent.
func (a *applied) last(parent string) uint64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	s := a.seqs[parent]
	if len(s) == 0 {
		return 0
	}
	return s[len(s)-1]
}

// waitFor waits until cond holds or fails after within.
func waitFor(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not within %s: %s", within, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// eventually reports whether cond held within.
func eventually(within time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(20 * time.Millisecond)
	}
	return true
}

func desired(ctrl, uid string, workSeq uint64) bus.DesiredState {
	it := item(ctrl, uid)
	return bus.DesiredState{Controller: it.Controller, Parent: it.Parent, WorkSeq: workSeq, Hook: bus.HookSync}
}

// consumeDesired runs an ordered replica of the desired stage until ctx is
// done; it returns a channel closed when Consume has returned.
func consumeDesired(ctx context.Context, js jetstream.JetStream, member string, ackWait time.Duration, h Handler) <-chan struct{} {
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = Consume(ctx, js, ConsumeConfig{Stream: bus.DesiredStream, Prefix: bus.DesiredConsumerPrefix, Stage: bus.DesiredStage,
			PerController: 8, AckWait: ackWait, Ordered: true, Member: member}, h)
	}()
	return done
}

// ackPending is the number of messages of the only desired partition
// delivered and not acknowledged.
func ackPending(t *testing.T, js jetstream.JetStream) int {
	t.Helper()
	c, err := js.Consumer(context.Background(), bus.DesiredStream, bus.PartitionConsumerName(bus.DesiredConsumerPrefix, 1, 0))
	if err != nil {
		t.Fatal(err)
	}
	info, err := c.Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return info.NumAckPending
}

// TestOrderedTakeoverAfterCrash (issue 24, defect 1a): replica a holds D9
// of a parent on its second delivery and D10 on its first when it crashes.
// Under the consumer's BackOff, D10 comes back first (AckWait) and D9 one
// AckWait later. The replica that takes the partition over must never
// apply D9 after D10.
func TestOrderedTakeoverAfterCrash(t *testing.T) {
	t.Parallel() // waits out leases and AckWaits, on a server of its own
	const (
		lease   = time.Second
		ackWait = 3 * time.Second // > lease, so the takeover's wait ends between the two redeliveries
	)
	o := bus.Options{OwnerLease: lease, DesiredAckWait: ackWait, Partitions: 1}
	connect := replicas(t, o)
	_, js := connect()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	a := newApplied(t)
	const uid = "00000000-0000-0000-0000-0000000000aa"
	pub := Publisher{JS: js}
	var mu sync.Mutex
	seen := map[string][]uint64{} // replica → NumDelivered of D9 when it was held there
	hold := func(replica string) func(bus.DesiredState, uint64) bool {
		return func(ds bus.DesiredState, delivered uint64) bool {
			mu.Lock()
			defer mu.Unlock()
			if ds.WorkSeq == 9 {
				seen[replica] = append(seen[replica], delivered)
			}
			return true
		}
	}
	heldAt := func(replica string, delivered uint64) func() bool {
		return func() bool {
			mu.Lock()
			defer mu.Unlock()
			for _, d := range seen[replica] {
				if d == delivered {
					return true
				}
			}
			return false
		}
	}
	// x takes D9 and crashes with it: D9's next delivery is its second.
	ncX, jsX := connect()
	xDone := consumeDesired(ctx, jsX, "x", ackWait, a.handler("x", hold("x")))
	if err := pub.PublishDesired(ctx, desired("c", uid, 9)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "x holds D9", heldAt("x", 1))
	ncX.Close()

	// a takes the partition over, gets D9 again (second delivery) and D10
	// (first delivery), and crashes holding both.
	ncA, jsA := connect()
	aDone := consumeDesired(ctx, jsA, "a", ackWait, a.handler("a", hold("a")))
	waitFor(t, 20*time.Second, "a holds D9 on its second delivery", heldAt("a", 2))
	if err := pub.PublishDesired(ctx, desired("c", uid, 10)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "a holds D10 too", func() bool { return ackPending(t, js) == 2 })
	ncA.Close()

	// b takes over: it must apply D10 last (D9 before it, or never).
	_, jsB := connect()
	bDone := consumeDesired(ctx, jsB, "b", ackWait, a.handler("b", nil))
	waitFor(t, 30*time.Second, "b applies D10", func() bool { return a.last(uid) == 10 })
	// D9 comes back one AckWait after D10 under the BackOff: give it the
	// time to be (wrongly) applied.
	time.Sleep(2 * ackWait)
	a.mu.Lock()
	t.Logf("applied %v by %v", a.seqs[uid], a.by[uid])
	for _, v := range a.after {
		t.Error(v)
	}
	a.mu.Unlock()
	cancel()
	<-xDone
	<-aDone
	<-bDone
}

// winner returns a member name with the given prefix that Assign gives the
// only partition to, against the members already there.
func winner(prefix string, others ...string) string {
	for i := 0; ; i++ {
		name := fmt.Sprintf("%s%d", prefix, i)
		if Assign(append([]string{name}, others...), 1)[0] == name {
			return name
		}
	}
}

// publishing publishes desired states of parents round robin, each with
// the next work sequence, until stop is closed; it returns how many.
func publishing(t *testing.T, js jetstream.JetStream, parents []string, every time.Duration, stop <-chan struct{}) <-chan int {
	n := make(chan int, 1)
	go func() {
		pub := Publisher{JS: js}
		seq, count := uint64(0), 0
		for {
			for _, p := range parents {
				select {
				case <-stop:
					n <- count
					return
				default:
				}
				seq++
				if err := pub.PublishDesired(context.Background(), desired("c", p, seq)); err != nil {
					t.Errorf("publish: %v", err)
					n <- count
					return
				}
				count++
				time.Sleep(every)
			}
		}
	}()
	return n
}

func parentUIDs(n int) []string {
	var out []string
	for i := 0; i < n; i++ {
		out = append(out, fmt.Sprintf("00000000-0000-0000-0000-%012d", i))
	}
	return out
}

// TestOrderedGracefulHandover (issue 24, defect 1b): desired states keep
// arriving while the partition's owner hands it to a joining replica.
// Messages that arrive during the drain used to be naked before the ones
// waiting in the owner, so the next owner got a parent's newer states
// before its older ones. Every parent's states must be applied in order.
func TestOrderedGracefulHandover(t *testing.T) {
	const ackWait = 3 * time.Second
	o := bus.Options{OwnerLease: time.Second, DesiredAckWait: ackWait, Partitions: 1}
	connect := replicas(t, o)
	_, js := connect()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	a := newApplied(t)
	slow := func(replica string) Handler { return a.slowHandler(replica, 30*time.Millisecond) } // a backlog waits in the owner
	parents := parentUIDs(10)
	stop := make(chan struct{})
	published := publishing(t, js, parents, 2*time.Millisecond, stop)
	_, jsA := connect()
	aDone := consumeDesired(ctx, jsA, "a", ackWait, slow("a"))
	time.Sleep(1500 * time.Millisecond)
	_, jsB := connect()
	b := winner("b", "a")
	bDone := consumeDesired(ctx, jsB, b, ackWait, slow(b))
	waitFor(t, 30*time.Second, b+" applies", func() bool {
		a.mu.Lock()
		defer a.mu.Unlock()
		for _, by := range a.by {
			for _, r := range by {
				if r == b {
					return true
				}
			}
		}
		return false
	})
	time.Sleep(500 * time.Millisecond)
	close(stop)
	n := <-published
	waitFor(t, 60*time.Second, "every desired state applied or superseded", func() bool {
		return ackPendingAndWaiting(t, js) == 0
	})
	a.mu.Lock()
	applies := 0
	for _, s := range a.seqs {
		applies += len(s)
	}
	t.Logf("%d desired states published, %d applied", n, applies)
	for _, v := range a.after {
		t.Error(v)
	}
	a.mu.Unlock()
	cancel()
	<-aDone
	<-bDone
}

// ackPendingAndWaiting is the number of messages left in MC_DESIRED.
func ackPendingAndWaiting(t *testing.T, js jetstream.JetStream) uint64 {
	t.Helper()
	s, err := js.Stream(context.Background(), bus.DesiredStream)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return info.State.Msgs
}

// TestGracefulHandoverNoStall (issue 24, defect 5): a replica that joins
// and is handed a partition gracefully starts on its backlog at once. The
// messages the previous owner gave back used to stay counted as pending
// until pulled, so the new owner's ordered wait always ran a full AckWait.
func TestGracefulHandoverNoStall(t *testing.T) {
	const ackWait = 20 * time.Second
	o := bus.Options{OwnerLease: time.Second, DesiredAckWait: ackWait, Partitions: 1}
	connect := replicas(t, o)
	_, js := connect()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	a := newApplied(t)
	slow := func(replica string) Handler { return a.slowHandler(replica, 200*time.Millisecond) }
	pub := Publisher{JS: js}
	seq := uint64(0)
	for i := 0; i < 40; i++ { // a backlog of 10 s for a alone
		for _, p := range parentUIDs(10) {
			seq++
			if err := pub.PublishDesired(ctx, desired("c", p, seq)); err != nil {
				t.Fatal(err)
			}
		}
	}
	_, jsA := connect()
	aDone := consumeDesired(ctx, jsA, "a", ackWait, slow("a"))
	time.Sleep(1500 * time.Millisecond)
	_, jsB := connect()
	b := winner("b", "a")
	start := time.Now()
	bDone := consumeDesired(ctx, jsB, b, ackWait, slow(b))
	// b's first apply follows its join (2 s), a's handover (its running
	// handlers, 200 ms) and a lease tick: far less than AckWait.
	waitFor(t, ackWait/2, b+" applies after the handover", func() bool {
		a.mu.Lock()
		defer a.mu.Unlock()
		for _, by := range a.by {
			for _, r := range by {
				if r == b {
					return true
				}
			}
		}
		return false
	})
	t.Logf("%s applied its first desired state %s after it started", b, time.Since(start).Round(time.Millisecond))
	cancel()
	<-aDone
	<-bDone
}

// TestHandoversSpendNoDeliveries (issue 24, defect 2): a backlog that
// waits in its owners through many graceful handovers (a replica joining
// and leaving again and again) is delivered as if it had never moved: no
// delivery counts towards MaxDeliver, and nothing is dead-lettered.
func TestHandoversSpendNoDeliveries(t *testing.T) {
	// Its ~40 s are handovers and a drain waited for: beside the other
	// waiting tests, on a server of its own.
	t.Parallel()
	const ackWait = 2 * time.Second
	o := bus.Options{OwnerLease: time.Second, DesiredAckWait: ackWait, Partitions: 1}
	connect := replicas(t, o)
	_, js := connect()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var mu sync.Mutex
	maxDelivered := map[uint64]uint64{} // work seq → highest NumDelivered seen
	a := newApplied(t)
	slow := func(replica string) Handler {
		h := a.handler(replica, nil)
		return func(ctx context.Context, m jetstream.Msg) outcome.Outcome {
			var ds bus.DesiredState
			_ = Decode(m, bus.TypeDesired, &ds)
			_, delivered, _ := Meta(m)
			mu.Lock()
			maxDelivered[ds.WorkSeq] = max(maxDelivered[ds.WorkSeq], delivered)
			mu.Unlock()
			time.Sleep(100 * time.Millisecond)
			return h(ctx, m)
		}
	}
	consume := func(ctx context.Context, js jetstream.JetStream, member string) <-chan struct{} {
		done := make(chan struct{})
		go func() {
			defer close(done)
			_ = Consume(ctx, js, ConsumeConfig{Stream: bus.DesiredStream, Prefix: bus.DesiredConsumerPrefix, Stage: bus.DesiredStage,
				PerController: 2, AckWait: ackWait, Ordered: true, Member: member}, slow(member))
		}()
		return done
	}
	pub := Publisher{JS: js}
	seq := uint64(0)
	for i := 0; i < 20; i++ {
		for _, p := range parentUIDs(40) {
			seq++
			if err := pub.PublishDesired(ctx, desired("c", p, seq)); err != nil {
				t.Fatal(err)
			}
		}
	}
	_, jsA := connect()
	aDone := consume(ctx, jsA, "a")
	b := winner("b", "a")
	for i := 0; i < 5; i++ { // 10 handovers
		time.Sleep(time.Second)
		_, jsB := connect()
		bctx, bcancel := context.WithCancel(ctx)
		bDone := consume(bctx, jsB, b)
		time.Sleep(5 * time.Second) // joins (2 s), takes the partition over, applies
		bcancel()
		<-bDone
	}
	// Dead-lettered ones (nobody moves them to MC_DLQ here) stay.
	drained := eventually(60*time.Second, func() bool { return ackPendingAndWaiting(t, js) == 0 })
	adv, err := js.Stream(ctx, bus.AdvisoryStream)
	if err != nil {
		t.Fatal(err)
	}
	info, err := adv.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	worst := uint64(0)
	for _, d := range maxDelivered {
		worst = max(worst, d)
	}
	t.Logf("%d desired states, highest delivery count %d, %d max-deliveries advisories", seq, worst, info.State.Msgs)
	if worst > 1 {
		t.Errorf("a desired state was delivered %d times: handovers spent its delivery budget", worst)
	}
	if info.State.Msgs > 0 {
		t.Errorf("%d desired states reached MaxDeliver through handovers alone", info.State.Msgs)
	}
	if !drained {
		t.Errorf("%d desired states never applied", ackPendingAndWaiting(t, js))
	}
	for _, v := range a.after {
		t.Error(v)
	}
	cancel()
	<-aDone
}

// writes records the writes handlers make per parent, and who made them
// when: a handler writes only while its context is live, checked right
// before each write, as the services do.
type writes struct {
	mu  sync.Mutex
	log map[string][]write // parent → writes
}

type write struct {
	replica string
	at      time.Time
}

// writer is a handler that keeps writing for d (a long apply), checking
// its context before every write, then acks.
func (w *writes) writer(replica string, d time.Duration) Handler {
	return func(ctx context.Context, m jetstream.Msg) outcome.Outcome {
		var it bus.WorkItem
		_ = Decode(m, bus.TypeSyncRequested, &it)
		end := time.Now().Add(d)
		for time.Now().Before(end) {
			// Read before the lease check, so a write is logged no later
			// than its check (see TestPausedReplicaChild).
			checked := time.Now()
			if ctx.Err() != nil {
				return outcome.Outcome{}
			}
			w.mu.Lock()
			if w.log == nil {
				w.log = map[string][]write{}
			}
			w.log[it.Parent.UID] = append(w.log[it.Parent.UID], write{replica, checked})
			w.mu.Unlock()
			time.Sleep(10 * time.Millisecond)
		}
		return outcome.Done()
	}
}

// wrote reports whether replica wrote anything.
func (w *writes) wrote(replica string) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, l := range w.log {
		for _, x := range l {
			if x.replica == replica {
				return true
			}
		}
	}
	return false
}

// overlaps lists, per parent, the writes of one replica made after another
// replica's first write of it: two handlers of one parent at once.
func (w *writes) overlaps() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []string
	for uid, l := range w.log {
		first := map[string]time.Time{}
		for _, x := range l {
			if _, ok := first[x.replica]; !ok {
				first[x.replica] = x.at
			}
		}
		for r, at := range first {
			n, last := 0, time.Time{}
			for _, x := range l {
				if x.replica != r && first[x.replica].Before(at) && !x.at.Before(at) {
					n, last = n+1, x.at
				}
			}
			if n > 0 {
				out = append(out, fmt.Sprintf("parent %s: %d writes by another replica after %s's first, the last %s after it", uid, n, r, last.Sub(at).Round(time.Millisecond)))
			}
		}
	}
	return out
}

// TestFenceNotDelayedBySlowJetStream (issue 24, defect 3): a replica
// whose JetStream API calls hang (a slow or electing server) stops its
// handlers by its lease deadline, before another replica can take its
// partition over; the fence used to share a select with the lease tick,
// which waited on those calls, so handlers kept writing after the
// takeover.
func TestFenceNotDelayedBySlowJetStream(t *testing.T) {
	const lease = time.Second
	o := bus.Options{OwnerLease: lease, WorkAckWait: 2 * time.Second, Partitions: 1}
	connect := replicas(t, o)
	_, js := connect()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var w writes
	_, jsA := connect()
	fa := &faultJS{JetStream: jsA, delay: 8 * time.Second}
	run := func(js jetstream.JetStream, member string) <-chan struct{} {
		done := make(chan struct{})
		go func() {
			defer close(done)
			_ = Consume(ctx, js, ConsumeConfig{Stream: bus.WorkStream, Prefix: bus.WorkConsumerPrefix, Stage: bus.WorkStage,
				PerController: 64, AckWait: 2 * time.Second, Member: member}, w.writer(member, 10*time.Second))
		}()
		return done
	}
	aDone := run(fa, "a")
	pub := Publisher{JS: js}
	uids := parentUIDs(32) // the server spreads their next changes over a and b
	for _, uid := range uids {
		if _, err := pub.PublishWork(ctx, item("c", uid)); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, 10*time.Second, "a writes", func() bool { return w.wrote("a") })
	_, jsB := connect()
	bDone := run(jsB, "b")
	time.Sleep(2500 * time.Millisecond) // b has joined; a still owns
	fa.slow.Store(true)
	time.Sleep(2500 * time.Millisecond) // a's lease expires; b takes the partition
	for _, uid := range uids {          // the parents change again
		if _, err := pub.PublishWork(ctx, item("c", uid)); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, 20*time.Second, "b writes", func() bool { return w.wrote("b") })
	time.Sleep(time.Second)
	for _, v := range w.overlaps() {
		t.Error(v)
	}
	fa.slow.Store(false)
	cancel()
	<-aDone
	<-bDone
}

// TestClaimDuringCutOverNeedsLayout (issue 24, defect 6): a replica that
// claims a partition of the old layout while a partition-count cut-over
// begins must read the partition count again before it consumes, and not
// consume when that read fails: the watcher may have seen no lease of the
// old layout and be deleting its consumers, after which the new layout's
// consumers redeliver what this replica would be running.
func TestClaimDuringCutOverNeedsLayout(t *testing.T) {
	o := bus.Options{OwnerLease: time.Second, WorkAckWait: 2 * time.Second, Partitions: 2}
	connect := replicas(t, o)
	_, js := connect()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pub := Publisher{JS: js}
	for _, uid := range parentUIDs(16) {
		if _, err := pub.PublishWork(ctx, item("c", uid)); err != nil {
			t.Fatal(err)
		}
	}
	// a starts knowing the old layout: the cut-over to one partition
	// begins right after its first read of the partition count, and its
	// later reads fail.
	var mu sync.Mutex
	var stale []string
	_, jsA := connect()
	fa := &faultJS{JetStream: jsA}
	s, err := js.Stream(ctx, bus.WorkStream)
	if err != nil {
		t.Fatal(err)
	}
	fa.stale.Store(&s)
	fa.layoutFails.Store(true)
	cfg := s.CachedInfo().Config
	cfg.Metadata = map[string]string{bus.PartitionsMetadata: "1"} // a's copy keeps the old map
	if _, err := js.UpdateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = Consume(ctx, fa, ConsumeConfig{Stream: bus.WorkStream, Prefix: bus.WorkConsumerPrefix, Stage: bus.WorkStage,
			PerController: 16, AckWait: 2 * time.Second, Member: "a"}, func(_ context.Context, m jetstream.Msg) outcome.Outcome {
			md, err := m.Metadata()
			if err != nil {
				t.Error(err)
				return outcome.Outcome{}
			}
			mu.Lock()
			if md.Consumer != bus.PartitionConsumerName(bus.WorkConsumerPrefix, 1, 0) {
				stale = append(stale, md.Consumer)
			}
			mu.Unlock()
			return outcome.Done()
		})
	}()
	time.Sleep(2 * time.Second) // a claims the old layout's partitions
	mu.Lock()
	if len(stale) > 0 {
		t.Errorf("a consumed %d messages from old-layout consumers %v after the cut-over began, without reading the partition count", len(stale), stale)
	}
	mu.Unlock()
	// Once a can read the count, it hands the old partitions back, the
	// cut-over completes, and the new layout delivers everything.
	fa.layoutFails.Store(false)
	o.Partitions = 1
	waitFor(t, 20*time.Second, "the cut-over completes", func() bool {
		return ReconcileLayout(ctx, js, o, bus.PartitionedStreams()[0]) == nil
	})
	waitFor(t, 20*time.Second, "every work item handled", func() bool {
		s, err := js.Stream(ctx, bus.WorkStream)
		if err != nil {
			return false
		}
		info, err := s.Info(ctx)
		return err == nil && info.State.Msgs == 0
	})
	cancel()
	<-done
}
