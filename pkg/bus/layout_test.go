package bus

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/nats-io/nats.go/jetstream"
)

func TestPartitionFilters(t *testing.T) {
	for _, tc := range []struct {
		reason string
		n, p   int
		want   []string // first filters
		count  int
	}{
		{reason: "the default layout: one wildcard per partition", n: 64, p: 7, want: []string{"mc.work.7.*.>"}, count: 1},
		{reason: "fewer partitions: the groups congruent to p", n: 8, p: 3, want: []string{"mc.work.3.*.>", "mc.work.11.*.>", "mc.work.19.*.>"}, count: 8},
		{reason: "one partition: every group", n: 1, p: 0, want: []string{"mc.work.0.*.>", "mc.work.1.*.>"}, count: 64},
		{reason: "more partitions: whole slots within the group", n: 128, p: 7, want: []string{"mc.work.7.7.>", "mc.work.7.135.>", "mc.work.7.263.>"}, count: 8},
		{reason: "one slot per partition", n: 1024, p: 1000, want: []string{"mc.work.40.1000.>"}, count: 1},
	} {
		t.Run(tc.reason, func(t *testing.T) {
			got := partitionFilters(workRoot, tc.n, tc.p)
			if len(got) != tc.count {
				t.Errorf("%d filters, want %d", len(got), tc.count)
			}
			if diff := cmp.Diff(tc.want, got[:min(len(got), len(tc.want))]); diff != "" {
				t.Errorf("filters (-want +got):\n%s", diff)
			}
		})
	}
	// Every stored subject matches exactly the partition of its slot, in
	// every layout; a subject stored before slots (<root>.<slot mod
	// 64>.<ctrl>.<uid>) matches it too when the count divides 64.
	for n := 1; n <= Slots; n *= 2 {
		filters := make([][]string, n)
		for p := range n {
			filters[p] = partitionFilters(workRoot, n, p)
		}
		for slot := range Slots {
			subjects := []string{fmt.Sprintf("mc.work.%d.%d.cc-x.uid", slot%groups, slot)}
			if n <= groups {
				subjects = append(subjects, fmt.Sprintf("mc.work.%d.cc-x.uid", slot%groups))
			}
			for _, subj := range subjects {
				var in []int
				for p := range n {
					if slices.ContainsFunc(filters[p], func(f string) bool { return subjectMatches(f, subj) }) {
						in = append(in, p)
					}
				}
				if len(in) != 1 || in[0] != PartitionOf(slot, n) {
					t.Fatalf("n=%d: %s matched by partitions %v, want only %d", n, subj, in, PartitionOf(slot, n))
				}
			}
		}
	}
	for _, n := range []int{0, 3, 100, 2048} {
		if ValidPartitions(n) == nil {
			t.Errorf("%d partitions accepted", n)
		}
	}
}

// subjectMatches is NATS subject matching with * and > wildcards.
func subjectMatches(filter, subject string) bool {
	f, s := strings.Split(filter, "."), strings.Split(subject, ".")
	for i, tok := range f {
		switch {
		case tok == ">":
			return len(s) > i
		case i >= len(s):
			return false
		case tok != "*" && tok != s[i]:
			return false
		}
	}
	return len(f) == len(s)
}

func TestParsePartitionConsumer(t *testing.T) {
	type out struct {
		Suffix string
		N      int
		OK     bool
	}
	for _, tc := range []struct {
		reason, name string
		want         out
	}{
		{reason: "current layout", name: "work-64-p07", want: out{"64-p07", 64, true}},
		{reason: "a layout of 1024", name: "work-1024-p1000", want: out{"1024-p1000", 1024, true}},
		{reason: "legacy name: 64 partitions, lease lease.<stage>.pNN", name: "work-p07", want: out{"p07", LegacyPartitions, true}},
		{reason: "another prefix", name: "desired-64-p07", want: out{}},
		{reason: "not a partition consumer", name: "work-relay", want: out{}},
		{reason: "garbage after p", name: "work-64-pxx", want: out{}},
		{reason: "garbage count", name: "work-x-p01", want: out{}},
	} {
		t.Run(tc.reason, func(t *testing.T) {
			s, n, ok := parsePartitionConsumer(WorkConsumerPrefix, tc.name)
			if diff := cmp.Diff(tc.want, out{s, n, ok}); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}

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
		if _, _, ok := parsePartitionConsumer(prefix, n); ok {
			out = append(out, n)
		}
	}
	sort.Strings(out)
	return out
}

func layoutNames(prefix string, n int) []string {
	var out []string
	for p := range n {
		out = append(out, PartitionConsumerName(prefix, n, p))
	}
	sort.Strings(out)
	return out
}

// TestRepartitionNeverOverlaps changes the partition count twice (64 → 8 →
// 128) while two replicas consume a steady stream of work: no parent ever
// runs on two replicas at once or out of order, nothing is lost, the old
// consumers go only after their leases, and both replicas end up sharing
// the new partitions.
func TestRepartitionNeverOverlaps(t *testing.T) {
	o := Options{OwnerLease: 2 * time.Second, WorkAckWait: 3 * time.Second}
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
		h := func(ctx context.Context, m jetstream.Msg) {
			if _, _, uid, _ := ParseStoredSubject(m.Subject()); strings.HasSuffix(uid, "0") {
				slow(ctx, m)
				return
			}
			fast(ctx, m)
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
			work := partitionConsumers(t, js, WorkStream, WorkConsumerPrefix)
			desired := partitionConsumers(t, js, DesiredStream, DesiredConsumerPrefix)
			if cmp.Equal(work, layoutNames(WorkConsumerPrefix, n)) && cmp.Equal(desired, layoutNames(DesiredConsumerPrefix, n)) {
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
	kv, err := js.KeyValue(context.Background(), OwnersBucket)
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		owners := map[string]int{}
		for p := range 128 {
			if e, err := kv.Get(context.Background(), LeaseKey(WorkStage, 128, p)); err == nil {
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
	connect := func() jetstream.JetStream { return startBus(t, Options{}) }
	js := connect()
	ctx := context.Background()
	// Recreate the legacy shape over what Ensure made.
	for _, ps := range partitionedStreams() {
		for p := range DefaultPartitions {
			if err := js.DeleteConsumer(ctx, ps.stream, PartitionConsumerName(ps.prefix, DefaultPartitions, p)); err != nil {
				t.Fatal(err)
			}
		}
	}
	legacy := WorkStreamConfig(Options{})
	legacy.SubjectTransform.Destination = workRoot + ".{{partition(64,1,2)}}.{{wildcard(1)}}.{{wildcard(2)}}"
	if _, err := js.UpdateStream(ctx, legacy); err != nil {
		t.Fatal(err)
	}
	for p := range LegacyPartitions {
		cfg := WorkConsumerConfig(Options{}, DefaultPartitions, p)
		cfg.Durable = fmt.Sprintf("%sp%02d", WorkConsumerPrefix, p)
		cfg.FilterSubjects = nil
		cfg.FilterSubject = workRoot + "." + strconv.Itoa(p) + ".>"
		if _, err := js.CreateOrUpdateConsumer(ctx, WorkStream, cfg); err != nil {
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
	if err := Ensure(ctx, js, Options{}); err != nil {
		t.Fatalf("Ensure over the legacy layout: %v", err)
	}
	if got, want := partitionConsumers(t, js, WorkStream, WorkConsumerPrefix), layoutNames(WorkConsumerPrefix, DefaultPartitions); !cmp.Equal(got, want) {
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
		if err := Consume(cctx, js, ConsumeConfig{Stream: WorkStream, Prefix: WorkConsumerPrefix, Stage: WorkStage, Member: "solo"}, x.handler("solo", time.Millisecond)); err != nil {
			t.Errorf("Consume: %v", err)
		}
	}()
	x.waitAll(t, uids, 20*time.Second)
	deadline := time.Now().Add(10 * time.Second)
	for {
		s, err := js.Stream(ctx, WorkStream)
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
