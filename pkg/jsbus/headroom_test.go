package jsbus

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/metabus/metabus/pkg/bus"
	"github.com/metabus/metabus/pkg/outcome"
)

// schedulePutOff is the dispatcher's PutOff: the work item scheduled in
// MC_SCHED, relayed into MC_WORK when due.
// (counted in n).
func schedulePutOff(js jetstream.JetStream, n *atomic.Int64) PutOff {
	return func(ctx context.Context, m jetstream.Msg, at time.Time) error {
		var it bus.WorkItem
		if err := Decode(m, bus.TypeSyncRequested, &it); err != nil {
			return err
		}
		if err := (Publisher{JS: js}).Schedule(ctx, it, at); err != nil {
			return err
		}
		n.Add(1)
		return nil
	}
}

// hangSlow handles the messages of controller "slow" by hanging until
// release is closed (counted in hanging), and the others with x.
func hangSlow(x *exclusive, hanging *atomic.Int64, release chan struct{}) Handler {
	return func(hctx context.Context, m jetstream.Msg) outcome.Outcome {
		var it bus.WorkItem
		_ = Decode(m, bus.TypeSyncRequested, &it)
		if it.Controller.Name == "slow" {
			hanging.Add(1)
			select {
			case <-release:
			case <-hctx.Done():
			}
			return outcome.Done()
		}
		return x.handler("r", time.Millisecond)(hctx, m)
	}
}

// TestHeadroomKeepsPartitionOpen (issue 35, item 5): a controller whose
// handler hangs, with more messages in a partition than its consumer's
// MaxAckPending, fills that window without a headroom: the server
// delivers nothing more of the partition, and another controller's
// messages there wait for the hanging ones. With a headroom, what is
// beyond it is put off (scheduled in MC_SCHED and acked), and the other
// controller's messages are handled at once.
func TestHeadroomKeepsPartitionOpen(t *testing.T) {
	slow := bus.WorkMaxAckPending + 100
	for _, tc := range []struct {
		name     string
		headroom int
		handled  bool
	}{
		{"without headroom the partition fills", 0, false},
		{"with headroom the other controller is handled", 16, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			connect := replicas(t, bus.Options{Partitions: 1})
			_, js := connect()
			x := newExclusive(t)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			var hanging, putOff atomic.Int64
			release := make(chan struct{})
			var wg sync.WaitGroup
			defer wg.Wait()
			defer cancel()
			wg.Add(1)
			go func() {
				defer wg.Done()
				err := Consume(ctx, js, ConsumeConfig{Stream: bus.WorkStream, Prefix: bus.WorkConsumerPrefix, Stage: bus.WorkStage,
					PerController: 4, Total: 16, Headroom: tc.headroom, PutOff: schedulePutOff(js, &putOff)},
					hangSlow(x, &hanging, release))
				if err != nil {
					t.Error(err)
				}
			}()
			publishMany(t, js, "slow", slow)
			for hanging.Load() < 4 {
				time.Sleep(10 * time.Millisecond)
			}
			start := time.Now()
			// Fewer than the headroom: the other controller stays within
			// its own bound however slowly its handler runs, so none of
			// its messages is put off (this test runs no relay to bring
			// a put-off one back). With 20, a loaded machine that let 17
			// pile up put the 17th off for good.
			uids := publishMany(t, js, "fast", 12)
			deadline := time.Now().Add(15 * time.Second)
			n := 0
			for ; time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
				x.mu.Lock()
				n = 0
				for _, u := range uids {
					if x.done[u] > 0 {
						n++
					}
				}
				x.mu.Unlock()
				if n == len(uids) || !tc.handled && time.Since(start) > 5*time.Second {
					break
				}
			}
			cons, err := js.Consumer(context.Background(), bus.WorkStream, bus.WorkConsumerPrefix+bus.PartitionConsumerName("", 1, 0))
			if err != nil {
				t.Fatal(err)
			}
			info, err := cons.Info(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("headroom %d: %d of %d messages of the other controller handled in %s beside %d hanging ones (%d put off, %d pending acks)",
				tc.headroom, n, len(uids), time.Since(start).Round(time.Millisecond), slow, putOff.Load(), info.NumAckPending)
			if got := n == len(uids); got != tc.handled {
				t.Errorf("the other controller's %d messages all handled: %v, want %v", len(uids), got, tc.handled)
			}
			if tc.headroom > 0 && info.NumAckPending > tc.headroom+len(uids) {
				t.Errorf("%d messages pending acks, want at most the headroom %d and the other controller's %d", info.NumAckPending, tc.headroom, len(uids))
			}
			close(release)
		})
	}
}

// TestPutOffLosesNothing: every message of a controller beyond its
// headroom comes back and is handled, on its first delivery (a put-off is
// not a failed delivery: it counts nothing against MaxDeliver); and one
// that cannot be stored again is taken in hand over the headroom instead,
// neither lost nor given back to the server.
func TestPutOffLosesNothing(t *testing.T) {
	t.Parallel() // waits out leases and AckWaits, on servers of its own
	for _, tc := range []struct {
		name    string
		failing bool
	}{
		{"put off and back", false},
		{"storing again fails", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			connect := replicas(t, bus.Options{Partitions: 1})
			_, js := connect()
			ctx, cancel := context.WithCancel(context.Background())
			var wg sync.WaitGroup
			defer wg.Wait()
			defer cancel()
			wg.Add(2)
			go func() {
				defer wg.Done()
				_ = RunRelay(ctx, js, func(err error) { t.Logf("relay: %v", err) })
			}()
			var putOff, failed atomic.Int64
			put := schedulePutOff(js, &putOff)
			if tc.failing {
				put = func(context.Context, jetstream.Msg, time.Time) error {
					failed.Add(1)
					return errors.New("MC_SCHED unreachable")
				}
			}
			var mu sync.Mutex
			done := map[string]uint64{} // parent → the delivery it was handled on
			var redelivered []string
			go func() {
				defer wg.Done()
				_ = Consume(ctx, js, ConsumeConfig{Stream: bus.WorkStream, Prefix: bus.WorkConsumerPrefix, Stage: bus.WorkStage,
					PerController: 2, Total: 16, Headroom: 4, PutOff: put},
					func(hctx context.Context, m jetstream.Msg) outcome.Outcome {
						var it bus.WorkItem
						_ = Decode(m, bus.TypeSyncRequested, &it)
						_, delivered, _ := Meta(m)
						time.Sleep(50 * time.Millisecond)
						mu.Lock()
						defer mu.Unlock()
						if delivered > 1 {
							redelivered = append(redelivered, fmt.Sprintf("%s (delivery %d)", it.Parent.UID, delivered))
						}
						done[it.Parent.UID] = delivered
						return outcome.Done()
					})
			}()
			uids := publishMany(t, js, "c", 40)
			start := time.Now()
			deadline := start.Add(60 * time.Second)
			missing := len(uids)
			for ; missing > 0 && time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
				mu.Lock()
				missing = 0
				for _, u := range uids {
					if _, ok := done[u]; !ok {
						missing++
					}
				}
				mu.Unlock()
			}
			t.Logf("%d parents handled in %s, %d put off, %d put-offs failed", len(uids)-missing, time.Since(start).Round(time.Millisecond), putOff.Load(), failed.Load())
			if missing > 0 {
				t.Fatalf("%d of %d parents never handled", missing, len(uids))
			}
			mu.Lock()
			defer mu.Unlock()
			if len(redelivered) > 0 {
				t.Errorf("handled on a redelivery (counted against MaxDeliver): %v", redelivered)
			}
			if tc.failing && failed.Load() == 0 || !tc.failing && putOff.Load() == 0 {
				t.Errorf("nothing was put off (%d) or failed to be (%d): the headroom was not reached", putOff.Load(), failed.Load())
			}
		})
	}
}
