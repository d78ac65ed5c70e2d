package jsbus

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/metabus/metabus/pkg/bus"
	"github.com/metabus/metabus/pkg/embeddednats"
	"github.com/metabus/metabus/pkg/natsx"
	"github.com/metabus/metabus/pkg/outcome"
)

// replicas starts one embedded server and returns a function that opens a
// new connection to it (one per simulated replica), after ensuring the bus.
func replicas(t *testing.T, o bus.Options) func() (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	s, err := embeddednats.Start(embeddednats.Options{StoreDir: t.TempDir(), Listen: "-"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Shutdown(); s.WaitForShutdown() })
	connect := func() (*nats.Conn, jetstream.JetStream) {
		nc, js, err := natsx.Connect(natsx.ConnOptions{InProcess: s, Name: t.Name()})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(nc.Close)
		return nc, js
	}
	_, js := connect()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := Ensure(ctx, js, o); err != nil {
		t.Fatal(err)
	}
	return connect
}

// exclusive records handler runs per parent and fails on any overlap or
// out-of-order run.
type exclusive struct {
	t       *testing.T
	mu      sync.Mutex
	running map[string]string // parent → replica running it
	lastSeq map[string]uint64
	done    map[string]int
	byRep   map[string]int
}

func newExclusive(t *testing.T) *exclusive {
	return &exclusive{t: t, running: map[string]string{}, lastSeq: map[string]uint64{}, done: map[string]int{}, byRep: map[string]int{}}
}

func (x *exclusive) handler(replica string, work time.Duration) Handler {
	return func(ctx context.Context, m jetstream.Msg) outcome.Outcome {
		var it bus.WorkItem
		if err := Decode(m, bus.TypeSyncRequested, &it); err != nil {
			x.t.Errorf("decode: %v", err)
			return outcome.Terminal("malformed")
		}
		seq, _, _ := Meta(m)
		uid := it.Parent.UID
		x.mu.Lock()
		if other, ok := x.running[uid]; ok {
			x.t.Errorf("parent %s run by %s while %s still runs it", uid, replica, other)
		}
		x.running[uid] = replica
		x.mu.Unlock()
		select {
		case <-time.After(work):
		case <-ctx.Done():
			x.mu.Lock()
			delete(x.running, uid)
			x.mu.Unlock()
			return outcome.Outcome{} // fenced: not settled, redelivered to the new owner
		}
		x.mu.Lock()
		delete(x.running, uid)
		if seq < x.lastSeq[uid] {
			x.t.Errorf("parent %s: seq %d ran after %d", uid, seq, x.lastSeq[uid])
		}
		x.lastSeq[uid] = seq
		x.mu.Unlock()
		if LeaseValid(ctx) != nil {
			return outcome.Outcome{} // fenced: the ack would be dropped
		}
		x.mu.Lock()
		x.done[uid]++
		x.byRep[replica]++
		x.mu.Unlock()
		return outcome.Done()
	}
}

func (x *exclusive) waitAll(t *testing.T, uids []string, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for time.Now().Before(deadline) {
		x.mu.Lock()
		n := 0
		for _, u := range uids {
			if x.done[u] > 0 {
				n++
			}
		}
		x.mu.Unlock()
		if n == len(uids) {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	missing := 0
	for _, u := range uids {
		if x.done[u] == 0 {
			missing++
		}
	}
	t.Fatalf("%d of %d parents never handled within %s", missing, len(uids), within)
}

// consumeWork runs a replica named name on MC_WORK (8 per controller,
// AckWait 3 s) until ctx is done.
func consumeWork(ctx context.Context, t *testing.T, wg *sync.WaitGroup, js jetstream.JetStream, name string, h Handler) {
	wg.Add(1)
	go func() {
		defer wg.Done()
		err := Consume(ctx, js, ConsumeConfig{Stream: bus.WorkStream, Prefix: bus.WorkConsumerPrefix, Stage: bus.WorkStage,
			PerController: 8, AckWait: 3 * time.Second, Member: name}, h)
		if err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}()
}

func publishMany(t *testing.T, js jetstream.JetStream, ctrl string, n int) []string {
	t.Helper()
	var uids []string
	for i := 0; i < n; i++ {
		it := item(ctrl, fmt.Sprintf("%s-%04d", ctrl, i))
		if _, err := (Publisher{JS: js}).PublishWork(context.Background(), it); err != nil {
			t.Fatal(err)
		}
		uids = append(uids, it.Parent.UID)
	}
	return uids
}

// TestReplicasSharePartitions: a second replica joining takes about half
// the partitions over, handed back gracefully by the first while work
// flows; no parent ever runs on both at once, none out of order, none is
// lost.
func TestReplicasSharePartitions(t *testing.T) {
	t.Parallel() // waits out leases and AckWaits, on a server of its own
	o := bus.Options{OwnerLease: 2 * time.Second, WorkAckWait: 3 * time.Second}
	connect := replicas(t, o)
	x := newExclusive(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	start := func(name string) {
		_, js := connect()
		consumeWork(ctx, t, &wg, js, name, x.handler(name, 5*time.Millisecond))
	}
	_, js := connect()
	start("a")
	uids := publishMany(t, js, "c", 200)
	x.waitAll(t, uids, 20*time.Second)
	start("b")
	// Keep publishing through the handover: every parent, again and again.
	stop := make(chan struct{})
	var pubs atomic.Int64
	go func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			for _, u := range uids {
				it := item("c", u)
				if _, err := (Publisher{JS: js}).PublishWork(context.Background(), it); err == nil {
					pubs.Add(1)
				}
			}
			time.Sleep(50 * time.Millisecond)
		}
	}()
	time.Sleep(4 * time.Second)
	close(stop)
	x.mu.Lock()
	for _, u := range uids {
		x.done[u] = 0
	}
	x.mu.Unlock()
	for _, u := range uids { // one more change each, after the handover
		if _, err := (Publisher{JS: js}).PublishWork(context.Background(), item("c", u)); err != nil {
			t.Fatal(err)
		}
	}
	x.waitAll(t, uids, 20*time.Second)
	x.mu.Lock()
	t.Logf("handled by a: %d, by b: %d", x.byRep["a"], x.byRep["b"])
	if x.byRep["b"] == 0 {
		t.Error("the second replica never got a partition")
	}
	x.mu.Unlock()
	kv, err := js.KeyValue(context.Background(), bus.OwnersBucket)
	if err != nil {
		t.Fatal(err)
	}
	owners := map[string]int{}
	for p := 0; p < bus.DefaultPartitions; p++ {
		e, err := kv.Get(context.Background(), bus.LeaseKey(bus.WorkStage, bus.DefaultPartitions, p))
		if err != nil {
			t.Fatalf("partition %d has no lease: %v", p, err)
		}
		owners[string(e.Value())]++
	}
	if owners["a"] < bus.DefaultPartitions/4 || owners["b"] < bus.DefaultPartitions/4 {
		t.Errorf("partitions per replica %v, want both to hold a fair share of %d", owners, bus.DefaultPartitions)
	}
	cancel()
	wg.Wait()
}

// TestCrashedReplicaFencedBeforeTakeover: a replica that loses NATS stops
// its handlers before its leases expire; the survivor then takes the
// partitions over and gets the unacknowledged messages, never while the
// first still runs them.
func TestCrashedReplicaFencedBeforeTakeover(t *testing.T) {
	t.Parallel() // waits out leases and AckWaits, on a server of its own
	o := bus.Options{OwnerLease: 3 * time.Second, WorkAckWait: 2 * time.Second}
	connect := replicas(t, o)
	x := newExclusive(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ncA, jsA := connect()
	_, jsB := connect()
	var cancelled, started atomic.Int64
	hang := func(ctx context.Context, m jetstream.Msg) outcome.Outcome {
		started.Add(1)
		<-ctx.Done() // a hook that hangs until the replica is fenced
		cancelled.Add(1)
		return outcome.Outcome{}
	}
	aDone := make(chan struct{})
	go func() {
		defer close(aDone)
		_ = Consume(ctx, jsA, ConsumeConfig{Stream: bus.WorkStream, Prefix: bus.WorkConsumerPrefix, Stage: bus.WorkStage,
			PerController: 64, AckWait: 2 * time.Second, Member: "a"}, hang)
	}()
	time.Sleep(500 * time.Millisecond)
	uids := publishMany(t, jsB, "c", 20)
	deadline := time.Now().Add(10 * time.Second)
	for {
		info, err := jsB.Stream(ctx, bus.WorkStream)
		if err != nil {
			t.Fatal(err)
		}
		_ = info
		// Every message must be running in a before it crashes: one
		// still in the stream would go to b with nothing to overlap.
		if started.Load() == int64(len(uids)) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("replica a runs %d of the %d messages", started.Load(), len(uids))
		}
		time.Sleep(50 * time.Millisecond)
	}
	// a "crashes": its connection goes away without handing anything back.
	ncA.Close()
	var aFenced atomic.Int64
	go func() {
		for cancelled.Load() < int64(len(uids)) {
			time.Sleep(10 * time.Millisecond)
		}
		aFenced.Store(time.Now().UnixNano())
	}()
	var firstB atomic.Int64
	bHandler := x.handler("b", time.Millisecond)
	go func() {
		_ = Consume(ctx, jsB, ConsumeConfig{Stream: bus.WorkStream, Prefix: bus.WorkConsumerPrefix, Stage: bus.WorkStage,
			PerController: 64, AckWait: 2 * time.Second, Member: "b"}, func(ctx context.Context, m jetstream.Msg) outcome.Outcome {
			if firstB.CompareAndSwap(0, time.Now().UnixNano()) && cancelled.Load() < int64(len(uids)) {
				t.Errorf("b ran a message while a still ran %d", int64(len(uids))-cancelled.Load())
			}
			return bHandler(ctx, m)
		})
	}()
	x.waitAll(t, uids, 30*time.Second)
	t.Logf("a fenced after its connection closed; b took over %s later", time.Duration(firstB.Load()-aFenced.Load()).Round(time.Millisecond))
	cancel()
	<-aDone
}

// TestHangingControllerIsolated: one controller whose handler hangs holds
// only its PerController share; another controller's messages, in the
// same partitions, run at once.
func TestHangingControllerIsolated(t *testing.T) {
	o := bus.Options{}
	connect := replicas(t, o)
	x := newExclusive(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	_, js := connect()
	var hanging atomic.Int64
	release := make(chan struct{})
	go func() {
		_ = Consume(ctx, js, ConsumeConfig{Stream: bus.WorkStream, Prefix: bus.WorkConsumerPrefix, Stage: bus.WorkStage,
			PerController: 4, Total: 16}, hangSlow(x, &hanging, release))
	}()
	publishMany(t, js, "slow", 300) // in every partition
	for hanging.Load() < 4 {
		time.Sleep(10 * time.Millisecond)
	}
	start := time.Now()
	uids := publishMany(t, js, "fast", 100)
	x.waitAll(t, uids, 10*time.Second)
	t.Logf("100 parents of the fast controller handled in %s beside 300 hanging ones", time.Since(start).Round(time.Millisecond))
	if n := hanging.Load(); n != 4 {
		t.Errorf("%d hanging handlers of one controller, want its share of 4", n)
	}
	close(release)
}

// TestWaitingMessageKeptAlive (issue #13, defect 7): a message waiting for
// its controller's worker slot is kept alive from the moment it arrives.
// Before, the heartbeat started with the handler, so a message queued
// behind slow hooks was redelivered after AckWait and ran twice.
func TestWaitingMessageKeptAlive(t *testing.T) {
	o := bus.Options{WorkAckWait: 600 * time.Millisecond}
	connect := replicas(t, o)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	_, js := connect()
	var mu sync.Mutex
	runs := map[string][]uint64{} // parent → NumDelivered of each run
	go func() {
		_ = Consume(ctx, js, ConsumeConfig{Stream: bus.WorkStream, Prefix: bus.WorkConsumerPrefix, Stage: bus.WorkStage,
			PerController: 1, AckWait: 30 * time.Second}, func(_ context.Context, m jetstream.Msg) outcome.Outcome {
			var it bus.WorkItem
			_ = Decode(m, bus.TypeSyncRequested, &it)
			_, delivered, _ := Meta(m)
			mu.Lock()
			runs[it.Parent.UID] = append(runs[it.Parent.UID], delivered)
			mu.Unlock()
			time.Sleep(1500 * time.Millisecond) // > 2 × the consumer's AckWait
			return outcome.Done()
		})
	}()
	uids := publishMany(t, js, "slow", 3) // one worker: the last waits 3 s
	deadline := time.Now().Add(15 * time.Second)
	for {
		mu.Lock()
		n := len(runs)
		mu.Unlock()
		if n == len(uids) || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	time.Sleep(time.Second) // a redelivery would have run by now
	mu.Lock()
	defer mu.Unlock()
	for _, u := range uids {
		if got := runs[u]; len(got) != 1 || got[0] != 1 {
			t.Errorf("parent %s: runs with delivery counts %v, want exactly one first delivery", u, got)
		}
	}
}

// TestRetryInPlaceKeepsDeliveryBudget (issue #13, defect 10): a handler
// that retries an infrastructure failure (NakWithDelay) more often than
// MaxDeliver neither dead-letters the message nor lets the server count
// the retries against it, and the parent's next message waits its turn.
func TestRetryInPlaceKeepsDeliveryBudget(t *testing.T) {
	connect := replicas(t, bus.Options{})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	_, js := connect()
	var attempts atomic.Int64
	done := make(chan uint64, 4)
	go func() {
		_ = Consume(ctx, js, ConsumeConfig{Stream: bus.WorkStream, Prefix: bus.WorkConsumerPrefix, Stage: bus.WorkStage, PerController: 4},
			func(_ context.Context, m jetstream.Msg) outcome.Outcome {
				if attempts.Add(1) <= bus.MaxDeliver+2 {
					return outcome.Retry(10*time.Millisecond, 0) // NATS leader moving
				}
				_, delivered, _ := Meta(m)
				done <- delivered
				return outcome.Done()
			})
	}()
	publishMany(t, js, "flaky", 1)
	select {
	case delivered := <-done:
		if delivered != 1 {
			t.Errorf("handled at delivery %d, want 1: retries in place cost no delivery", delivered)
		}
	case <-time.After(20 * time.Second):
		t.Fatalf("never handled after %d attempts", attempts.Load())
	}
	if n := attempts.Load(); n != bus.MaxDeliver+3 {
		t.Errorf("%d attempts, want %d", n, bus.MaxDeliver+3)
	}
}

// TestWeightsShareASaturatedReplica: with Total reached, a controller of
// weight 3 (WeightAnnotation, carried by its messages) gets three turns
// for every turn of a controller of weight 1.
func TestWeightsShareASaturatedReplica(t *testing.T) {
	connect := replicas(t, bus.Options{})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	_, js := connect()
	for i := 0; i < 40; i++ {
		for _, c := range []struct {
			name   string
			weight int
		}{{"heavy", 3}, {"light", 1}} {
			it := item(c.name, fmt.Sprintf("%s-%04d", c.name, i))
			it.Controller.Weight = c.weight
			if _, err := (Publisher{JS: js}).PublishWork(ctx, it); err != nil {
				t.Fatal(err)
			}
		}
	}
	var mu sync.Mutex
	var order []string
	started := make(chan struct{})
	var once sync.Once
	go func() {
		_ = Consume(ctx, js, ConsumeConfig{Stream: bus.WorkStream, Prefix: bus.WorkConsumerPrefix, Stage: bus.WorkStage, PerController: 8, Total: 1},
			func(_ context.Context, m jetstream.Msg) outcome.Outcome {
				once.Do(func() { <-started }) // let every message arrive first
				var it bus.WorkItem
				_ = Decode(m, bus.TypeSyncRequested, &it)
				mu.Lock()
				order = append(order, it.Controller.Name)
				mu.Unlock()
				return outcome.Done()
			})
	}()
	time.Sleep(time.Second)
	close(started)
	deadline := time.Now().Add(20 * time.Second)
	for {
		mu.Lock()
		n := len(order)
		mu.Unlock()
		if n >= 80 || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(order) < 80 {
		t.Fatalf("handled %d of 80", len(order))
	}
	// Among the first 40 turns (both still have a backlog), heavy has ~30.
	heavy := 0
	for _, c := range order[1:41] {
		if c == "heavy" {
			heavy++
		}
	}
	if heavy < 27 || heavy > 33 {
		t.Errorf("heavy got %d of 40 turns while both waited, want ~30 (weights 3:1): %v", heavy, order[:41])
	}
}

// TestHandoverWaitsForRunningHandler: a partition handed to a joining
// replica stays with its owner, lease renewed, until the handler running
// there finishes, even when that takes several leases; only then does the
// newcomer run the parent's next message.
func TestHandoverWaitsForRunningHandler(t *testing.T) {
	t.Parallel() // waits out leases and AckWaits, on a server of its own
	o := bus.Options{OwnerLease: time.Second, WorkAckWait: 10 * time.Second}
	connect := replicas(t, o)
	x := newExclusive(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	run := func(name string, work time.Duration) {
		_, js := connect()
		go func() {
			_ = Consume(ctx, js, ConsumeConfig{Stream: bus.WorkStream, Prefix: bus.WorkConsumerPrefix, Stage: bus.WorkStage,
				PerController: 64, AckWait: 10 * time.Second, Member: name}, x.handler(name, work))
		}()
	}
	_, js := connect()
	run("a", 3*time.Second) // every handler of a outlives its lease three times
	uids := publishMany(t, js, "c", 64)
	time.Sleep(300 * time.Millisecond) // a holds them, running
	run("b", time.Millisecond)
	for _, u := range uids { // the next change of every parent
		if _, err := (Publisher{JS: js}).PublishWork(ctx, item("c", u)); err != nil {
			t.Fatal(err)
		}
	}
	x.waitAll(t, uids, 20*time.Second)
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		x.mu.Lock()
		n := 0
		for _, u := range uids {
			n += x.done[u]
		}
		x.mu.Unlock()
		if n >= 2*len(uids) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	t.Logf("handled by a: %d, by b: %d", x.byRep["a"], x.byRep["b"])
	if x.byRep["b"] == 0 {
		t.Error("b never got a partition")
	}
}

// TestHeartbeatSleepsWhileNothingHeld (issue 31): an idle replica's
// keep-alive loop does not tick while it holds no message; it starts when
// one is taken in hand (and keeps it alive: TestWaitingMessageKeptAlive)
// and stops again once it is settled.
func TestHeartbeatSleepsWhileNothingHeld(t *testing.T) {
	// Each message is held 1 s: several heartbeat periods (AckWait/12).
	o, js, ran := heldOwner(t, 3*time.Second, time.Second)
	scansOver := func(d time.Duration) int64 {
		before := o.beatScans.Load()
		time.Sleep(d)
		return o.beatScans.Load() - before
	}
	time.Sleep(2 * time.Second) // partitions claimed
	if n := scansOver(time.Second); n != 0 {
		t.Errorf("idle replica: %d heartbeat scans in 1 s, want 0", n)
	}
	publishMany(t, js, "beat", 1)
	select {
	case <-ran:
	case <-time.After(15 * time.Second):
		t.Fatal("the message did not run")
	}
	if n := o.beatScans.Load(); n == 0 {
		t.Error("no heartbeat scan while a message was held for 1 s")
	}
	time.Sleep(500 * time.Millisecond) // the scan in progress ends
	if n := scansOver(time.Second); n > 1 {
		t.Errorf("after the message was settled: %d heartbeat scans in 1 s, want at most 1", n)
	}
}

// TestHeartbeatScansOnlyWhenDue (issue 31): while the messages held are
// younger than their first keep-alive, the heartbeat does not rescan them
// every tick: it sleeps until the earliest keep-alive is due (drivecore.BeatWait).
func TestHeartbeatScansOnlyWhenDue(t *testing.T) {
	// AckWait 15 s: the first keep-alive is due 5 s after arrival; the
	// old heartbeat scanned every 250 ms meanwhile.
	o, js, ran := heldOwner(t, 15*time.Second, 2*time.Second)
	time.Sleep(2 * time.Second) // partitions claimed
	before := o.beatScans.Load()
	publishMany(t, js, "young", 1)
	select {
	case <-ran:
	case <-time.After(15 * time.Second):
		t.Fatal("the message did not run")
	}
	if n := o.beatScans.Load() - before; n > 2 {
		t.Errorf("%d heartbeat scans while one message was held 2 s with its first keep-alive due at 5 s, want at most 2", n)
	}
}

// heldOwner starts Consume on the work stream with ackWait, each message
// held for hold before it is done (a signal on ran), and returns its
// owner, for the heartbeat's scan counter.
func heldOwner(t *testing.T, ackWait, hold time.Duration) (*owner, jetstream.JetStream, <-chan struct{}) {
	t.Helper()
	connect := replicas(t, bus.Options{})
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	_, js := connect()
	owners := make(chan *owner, 1)
	testOwner = func(o *owner) { owners <- o }
	t.Cleanup(func() { testOwner = nil })
	ran := make(chan struct{}, 1)
	go func() {
		_ = Consume(ctx, js, ConsumeConfig{Stream: bus.WorkStream, Prefix: bus.WorkConsumerPrefix, Stage: bus.WorkStage,
			AckWait: ackWait}, func(_ context.Context, m jetstream.Msg) outcome.Outcome {
			time.Sleep(hold)
			ran <- struct{}{}
			return outcome.Done()
		})
	}()
	select {
	case o := <-owners:
		return o, js, ran
	case <-time.After(10 * time.Second):
		t.Fatal("Consume did not start")
		return nil, nil, nil
	}
}
