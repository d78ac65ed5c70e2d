package jsbus

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/metabus/metabus/pkg/bus"
	"github.com/metabus/metabus/pkg/outcome"
)

// TestFixedLayoutReadOnce (issue 31): with FixedLayout a replica reads the
// partition count once, when it starts, and answers the protocol's layout
// reads (every Lease/5, and after each claim) with it; it still claims
// and consumes its partitions. Without it, every lease tick asks the
// server (a stream info request).
func TestFixedLayoutReadOnce(t *testing.T) {
	for _, c := range []struct {
		reason string
		fixed  bool
	}{
		{reason: "fixed layout: one stream info, at start", fixed: true},
		{reason: "otherwise: a stream info on every lease tick", fixed: false},
	} {
		t.Run(c.reason, func(t *testing.T) {
			// A 1 s lease: a tick every 200 ms.
			connect := replicas(t, bus.Options{OwnerLease: time.Second})
			watch, _ := connect()
			var infos atomic.Int64
			sub, err := watch.Subscribe("$JS.API.STREAM.INFO."+bus.WorkStream, func(*nats.Msg) { infos.Add(1) })
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = sub.Unsubscribe() }()
			if err := watch.Flush(); err != nil {
				t.Fatal(err)
			}
			_, js := connect()
			owners := make(chan *owner, 1)
			testOwner = func(o *owner) { owners <- o }
			t.Cleanup(func() { testOwner = nil })
			ran := make(chan struct{}, 1)
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan struct{})
			go func() {
				defer close(done)
				err := Consume(ctx, js, ConsumeConfig{Stream: bus.WorkStream, Prefix: bus.WorkConsumerPrefix, Stage: bus.WorkStage,
					AckWait: 3 * time.Second, FixedLayout: c.fixed}, func(context.Context, jetstream.Msg) outcome.Outcome {
					ran <- struct{}{}
					return outcome.Done()
				})
				if err != nil {
					t.Error(err)
				}
			}()
			defer func() { cancel(); <-done }()
			var o *owner
			select {
			case o = <-owners:
			case <-time.After(10 * time.Second):
				t.Fatal("Consume did not start")
			}
			publishMany(t, js, "fixed", 1)
			select {
			case <-ran:
			case <-time.After(15 * time.Second):
				t.Fatal("the message did not run: the replica does not consume its partitions")
			}
			time.Sleep(1500 * time.Millisecond) // several lease ticks
			if err := watch.Flush(); err != nil {
				t.Fatal(err)
			}
			requests, answered := infos.Load(), o.layoutAnswered.Load()
			if c.fixed && (requests != 1 || answered < 5) {
				t.Errorf("fixed layout: %d stream info requests (want 1, at start), %d layout reads answered locally (want one per tick, at least 5)", requests, answered)
			}
			if !c.fixed && (requests < 5 || answered != 0) {
				t.Errorf("changeable layout: %d stream info requests (want one per tick, at least 5), %d layout reads answered locally (want 0)", requests, answered)
			}
		})
	}
}
