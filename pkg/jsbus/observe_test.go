package jsbus

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/metabus/metabus/pkg/bus"
	"github.com/metabus/metabus/pkg/outcome"
)

// observed counts what an OwnershipObserver is told.
type observed struct {
	mu                    sync.Mutex
	claimed, handed, lost map[string]int
	heldNow, heldAtLeast  map[string]int
	resetFailed           map[string]int // by stage/reason
}

func newOwnership() *observed {
	return &observed{claimed: map[string]int{}, handed: map[string]int{}, lost: map[string]int{}, heldNow: map[string]int{}, heldAtLeast: map[string]int{},
		resetFailed: map[string]int{}}
}

func (o *observed) ConsumerResetFailed(stage, reason string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.resetFailed[stage+"/"+reason]++
}

func (o *observed) PartitionClaimed(stage string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.claimed[stage]++
	o.heldNow[stage]++
	o.heldAtLeast[stage] = max(o.heldAtLeast[stage], o.heldNow[stage])
}

func (o *observed) PartitionReleased(stage string, lost bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if lost {
		o.lost[stage]++
	} else {
		o.handed[stage]++
	}
	o.heldNow[stage]--
}

// A replica reports every partition it claims and, when it stops, every
// one it hands back; a second replica joining takes some over (a
// rebalance: the first hands them back, the second claims them).
func TestOwnershipObserved(t *testing.T) {
	connect := replicas(t, bus.Options{Partitions: 8})
	run := func(obs *observed) (stop func()) {
		_, js := connect()
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() {
			defer close(done)
			_ = Consume(ctx, js, ConsumeConfig{Stream: bus.WorkStream, Prefix: bus.WorkConsumerPrefix, Stage: bus.WorkStage, Ownership: obs},
				func(context.Context, jetstream.Msg) outcome.Outcome { return outcome.Done() })
		}()
		return func() { cancel(); <-done }
	}
	held := func(obs *observed) int {
		obs.mu.Lock()
		defer obs.mu.Unlock()
		return obs.heldNow[bus.WorkStage]
	}
	waitFor := func(what string, f func() bool) {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for !f() {
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting for %s", what)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	a, b := newOwnership(), newOwnership()
	stopA := run(a)
	waitFor("the first replica to hold all 8 partitions", func() bool { return held(a) == 8 })
	stopB := run(b)
	waitFor("the partitions to be shared", func() bool { return held(a) > 0 && held(b) > 0 && held(a)+held(b) == 8 })
	a.mu.Lock()
	rebalanced := a.handed[bus.WorkStage]
	a.mu.Unlock()
	if rebalanced == 0 {
		t.Errorf("the first replica reported no hand-back when the second took partitions over")
	}
	stopB()
	stopA()
	for name, o := range map[string]*observed{"first": a, "second": b} {
		o.mu.Lock()
		if diff := cmp.Diff(map[string]int{bus.WorkStage: 0}, o.heldNow); diff != "" {
			t.Errorf("%s replica: partitions still held after it stopped (-want +got):\n%s", name, diff)
		}
		if o.claimed[bus.WorkStage] == 0 || o.claimed[bus.WorkStage] != o.handed[bus.WorkStage]+o.lost[bus.WorkStage] {
			t.Errorf("%s replica: %d claims, %d hand-backs, %d losses", name, o.claimed[bus.WorkStage], o.handed[bus.WorkStage], o.lost[bus.WorkStage])
		}
		if o.lost[bus.WorkStage] != 0 {
			t.Errorf("%s replica lost %d partitions in an orderly run", name, o.lost[bus.WorkStage])
		}
		o.mu.Unlock()
	}
}
