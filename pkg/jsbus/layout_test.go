package jsbus

import (
	"context"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/metabus/metabus/pkg/bus"
	"github.com/metabus/metabus/pkg/outcome"
)

// partitionConsumers lists a stream's partition consumers, sorted.
func partitionConsumers(t *testing.T, js jetstream.JetStream, stream, prefix string) []string {
	t.Helper()
	s, err := js.Stream(context.Background(), stream)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	names := s.ConsumerNames(context.Background())
	for n := range names.Name() {
		if _, _, ok := bus.ParsePartitionConsumer(prefix, n); ok {
			out = append(out, n)
		}
	}
	sort.Strings(out)
	return out
}

func layoutNames(prefix string, n int) []string {
	var out []string
	for p := range n {
		out = append(out, bus.PartitionConsumerName(prefix, n, p))
	}
	sort.Strings(out)
	return out
}

// TestRepartitionNeverOverlaps changes the partition count twice (the
// default 16 → 8 → 128) while two replicas consume a steady stream of work: no parent ever
// runs on two replicas at once or out of order, nothing is lost, the old
// consumers go only after their leases, and both replicas end up sharing
// the new partitions.
func TestRepartitionNeverOverlaps(t *testing.T) {
	t.Parallel() // waits out leases and AckWaits, on a server of its own
	o := bus.Options{OwnerLease: 2 * time.Second, WorkAckWait: 3 * time.Second}
	connect := replicas(t, o)
	x := newExclusive(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	for _, name := range []string{"a", "b"} {
		_, js := connect()
		// Every tenth parent's handler outlasts a lease tick, so a
		// cut-over always finds handlers of the old layout running.
		fast, slow := x.handler(name, 20*time.Millisecond), x.handler(name, 1500*time.Millisecond)
		h := func(ctx context.Context, m jetstream.Msg) outcome.Outcome {
			if _, _, uid, _ := bus.ParseStoredSubject(m.Subject()); strings.HasSuffix(uid, "0") {
				return slow(ctx, m)
			}
			return fast(ctx, m)
		}
		consumeWork(ctx, t, &wg, js, name, h)
	}
	_, js := connect()
	// The watcher's keeper finishes cut-overs.
	var pending atomic.Int64
	go KeepConsumers(ctx, js, o, 200*time.Millisecond, func(err error) { pending.Add(1); t.Logf("keeper: %v", err) }, nil)

	var uids []string
	for i := range 300 {
		uids = append(uids, fmt.Sprintf("rp-%04d", i))
	}
	stop := make(chan struct{})
	pubDone := make(chan struct{})
	go func() { // every parent, again and again, through both cut-overs
		defer close(pubDone)
		for {
			select {
			case <-stop:
				return
			default:
			}
			for _, u := range uids {
				_, _ = (Publisher{JS: js}).PublishWork(context.Background(), item("c", u))
			}
			time.Sleep(20 * time.Millisecond)
		}
	}()
	x.waitAll(t, uids, 20*time.Second)

	for _, n := range []int{8, 128} {
		o.Partitions = n
		if err := Ensure(ctx, js, o); err != nil {
			t.Fatalf("Ensure with %d partitions: %v", n, err)
		}
		deadline := time.Now().Add(30 * time.Second)
		for {
			work := partitionConsumers(t, js, bus.WorkStream, bus.WorkConsumerPrefix)
			desired := partitionConsumers(t, js, bus.DesiredStream, bus.DesiredConsumerPrefix)
			if cmp.Equal(work, layoutNames(bus.WorkConsumerPrefix, n)) && cmp.Equal(desired, layoutNames(bus.DesiredConsumerPrefix, n)) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("cut-over to %d partitions not finished: work consumers %v", n, work)
			}
			time.Sleep(100 * time.Millisecond)
		}
		// Work flows again under the new layout: every parent once more.
		x.mu.Lock()
		clear(x.done)
		x.mu.Unlock()
		x.waitAll(t, uids, 30*time.Second)
		t.Logf("%d partitions: handled by a %d, by b %d so far", n, x.byRep["a"], x.byRep["b"])
	}
	close(stop)
	<-pubDone

	// Both replicas hold a share of the 128 new partitions.
	kv, err := js.KeyValue(context.Background(), bus.OwnersBucket)
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		owners := map[string]int{}
		for p := range 128 {
			if e, err := kv.Get(context.Background(), bus.LeaseKey(bus.WorkStage, 128, p)); err == nil {
				owners[string(e.Value())]++
			}
		}
		if owners["a"] == 64 && owners["b"] == 64 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("leases of the 128 partitions per replica: %v, want 64 each", owners)
		}
		time.Sleep(200 * time.Millisecond)
	}
	cancel()
	wg.Wait()
}

// TestLegacyLayoutUpgraded: streams and consumers of a release before
// slots (64 partitions, transform mod 64, consumers <prefix>pNN) are
// brought to the slot layout by Ensure, and the messages they held are
// all delivered by the new consumers.
func TestLegacyLayoutUpgraded(t *testing.T) {
	connect := func() jetstream.JetStream { return startBus(t, bus.Options{}) }
	js := connect()
	ctx := context.Background()
	// Recreate the legacy shape over what Ensure made.
	for _, ps := range bus.PartitionedStreams() {
		for p := range bus.DefaultPartitions {
			if err := js.DeleteConsumer(ctx, ps.Stream, bus.PartitionConsumerName(ps.Prefix, bus.DefaultPartitions, p)); err != nil {
				t.Fatal(err)
			}
		}
	}
	legacy := streamConfig(bus.WorkStreamConfig(bus.Options{}))
	legacy.SubjectTransform.Destination = "mc.work.{{partition(64,1,2)}}.{{wildcard(1)}}.{{wildcard(2)}}"
	if _, err := js.UpdateStream(ctx, legacy); err != nil {
		t.Fatal(err)
	}
	for p := range bus.LegacyPartitions {
		cfg := consumerConfig(bus.WorkConsumerConfig(bus.Options{}, bus.DefaultPartitions, p))
		cfg.Durable = fmt.Sprintf("%sp%02d", bus.WorkConsumerPrefix, p)
		cfg.FilterSubjects = nil
		cfg.FilterSubject = "mc.work." + strconv.Itoa(p) + ".>"
		if _, err := js.CreateOrUpdateConsumer(ctx, bus.WorkStream, cfg); err != nil {
			t.Fatal(err)
		}
	}
	var uids []string
	for i := range 100 {
		it := item("up", fmt.Sprintf("up-%04d", i))
		if _, err := (Publisher{JS: js}).PublishWork(ctx, it); err != nil {
			t.Fatal(err)
		}
		uids = append(uids, it.Parent.UID)
	}
	// The upgrade: nobody holds a legacy lease, so the cut-over is immediate.
	if err := Ensure(ctx, js, bus.Options{}); err != nil {
		t.Fatalf("Ensure over the legacy layout: %v", err)
	}
	// A stream without the partition setting keeps the 64 partitions of
	// its release, not a new installation's count.
	if got, want := partitionConsumers(t, js, bus.WorkStream, bus.WorkConsumerPrefix), layoutNames(bus.WorkConsumerPrefix, bus.LegacyPartitions); !cmp.Equal(got, want) {
		t.Fatalf("work consumers after the upgrade: %v", got)
	}
	// New messages of the same parents go to their slots; both kinds are
	// consumed, each parent by the partition it had before.
	for _, u := range uids[:50] {
		if _, err := (Publisher{JS: js}).PublishWork(ctx, item("up", u)); err != nil && !IsAlreadyQueued(err) {
			t.Fatal(err)
		}
	}
	x := newExclusive(t)
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := Consume(cctx, js, ConsumeConfig{Stream: bus.WorkStream, Prefix: bus.WorkConsumerPrefix, Stage: bus.WorkStage, Member: "solo"}, x.handler("solo", time.Millisecond)); err != nil {
			t.Errorf("Consume: %v", err)
		}
	}()
	x.waitAll(t, uids, 20*time.Second)
	deadline := time.Now().Add(10 * time.Second)
	for {
		s, err := js.Stream(ctx, bus.WorkStream)
		if err != nil {
			t.Fatal(err)
		}
		if s.CachedInfo().State.Msgs == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d messages left in MC_WORK after the upgrade", s.CachedInfo().State.Msgs)
		}
		time.Sleep(100 * time.Millisecond)
	}
	cancel()
	<-done
}
