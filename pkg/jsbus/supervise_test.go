package jsbus

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/metabus/metabus/pkg/bus"
)

// TestRelayAndDLQStopWhenConsumerLost (issue 13 #14): when the consumer
// under the schedule relay or the dead-letter worker goes away, the worker
// must return an error (so it can be restarted and reported), not sit
// silently on a dead subscription until the process exits.
func TestRelayAndDLQStopWhenConsumerLost(t *testing.T) {
	cases := []struct {
		reason           string
		stream, consumer string
		run              func(ctx context.Context, js jetstream.JetStream) error
	}{
		{reason: "schedule relay whose due-relay consumer is deleted", stream: bus.SchedStream, consumer: bus.DueConsumer,
			run: func(ctx context.Context, js jetstream.JetStream) error { return RunRelay(ctx, js, func(error) {}) }},
		{reason: "dead-letter worker whose dlq consumer is deleted", stream: bus.AdvisoryStream, consumer: bus.DLQConsumer,
			run: func(ctx context.Context, js jetstream.JetStream) error {
				return RunDLQ(ctx, js, func(DeadLetter) {}, func(error) {})
			}},
	}
	for _, tc := range cases {
		t.Run(tc.reason, func(t *testing.T) {
			js := startBus(t, bus.Options{})
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			done := make(chan error, 1)
			go func() { done <- tc.run(ctx, js) }()
			time.Sleep(300 * time.Millisecond)
			select {
			case err := <-done:
				t.Fatalf("%s: returned before the consumer was lost: %v", tc.reason, err)
			default:
			}
			if err := js.DeleteConsumer(context.Background(), tc.stream, tc.consumer); err != nil {
				t.Fatal(err)
			}
			select {
			case err := <-done:
				if err == nil {
					t.Errorf("%s: returned nil, want an error saying why it stopped", tc.reason)
				}
			case <-time.After(10 * time.Second):
				t.Fatalf("%s: still \"running\" 10 s after its consumer was deleted", tc.reason)
			}
		})
	}
}

// TestSupervise (issue 13 #14): a background worker is restarted with
// backoff while ctx lives, reported down while it is down and up once it
// has run for a while, and not restarted after ctx ends.
func TestSupervise(t *testing.T) {
	errBoom := errors.New("boom")
	cases := []struct {
		reason    string
		failures  int // runs that fail at once before one that keeps running
		wantStops int
	}{
		{reason: "a worker that keeps running is up and started once", failures: 0},
		{reason: "a worker failing at start is restarted until it runs", failures: 3},
	}
	for _, tc := range cases {
		t.Run(tc.reason, func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			var mu sync.Mutex
			starts := 0
			var states []error
			var startTimes []time.Time
			run := func(ctx context.Context) error {
				mu.Lock()
				starts++
				n := starts
				startTimes = append(startTimes, time.Now())
				mu.Unlock()
				if n <= tc.failures {
					return errBoom
				}
				<-ctx.Done()
				return nil
			}
			done := make(chan struct{})
			go func() {
				defer close(done)
				Supervise(ctx, SuperviseOptions{Base: 20 * time.Millisecond, Max: time.Second, Settle: 100 * time.Millisecond}, run, func(err error) {
					mu.Lock()
					states = append(states, err)
					mu.Unlock()
				})
			}()
			deadline := time.Now().Add(5 * time.Second)
			for {
				mu.Lock()
				up := len(states) > 0 && states[len(states)-1] == nil && starts == tc.failures+1
				mu.Unlock()
				if up {
					break
				}
				if time.Now().After(deadline) {
					mu.Lock()
					t.Fatalf("%s: never reported up after %d starts, states %v", tc.reason, starts, states)
				}
				time.Sleep(10 * time.Millisecond)
			}
			mu.Lock()
			downs := 0
			for _, s := range states {
				if errors.Is(s, errBoom) {
					downs++
				}
			}
			if downs != tc.failures {
				t.Errorf("%s: reported down %d times, want %d (states %v)", tc.reason, downs, tc.failures, states)
			}
			// Restart i waits at least Base×2^(i-1): a timer never fires
			// early, while a loaded machine may fire it late, so
			// comparing one gap with the one before would be flaky.
			for i := 1; i < len(startTimes); i++ {
				if gap, want := startTimes[i].Sub(startTimes[i-1]), (20*time.Millisecond)<<(i-1); gap < want {
					t.Errorf("%s: restart %d after %s, want at least %s: no backoff", tc.reason, i, gap, want)
				}
			}
			mu.Unlock()
			cancel()
			select {
			case <-done:
			case <-time.After(2 * time.Second):
				t.Fatalf("%s: Supervise did not return after ctx ended", tc.reason)
			}
			mu.Lock()
			defer mu.Unlock()
			if starts != tc.failures+1 {
				t.Errorf("%s: started %d times, want %d", tc.reason, starts, tc.failures+1)
			}
		})
	}
}

// TestSupervisedRelayRecovers (issue 13 #14): the relay is reported down
// while its consumer is missing and relays again once it is back.
func TestSupervisedRelayRecovers(t *testing.T) {
	js := startBus(t, bus.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := js.DeleteConsumer(ctx, bus.SchedStream, bus.DueConsumer); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var state error = errors.New("not started")
	sctx, scancel := context.WithCancel(ctx)
	defer scancel()
	go Supervise(sctx, SuperviseOptions{Base: 50 * time.Millisecond, Max: 200 * time.Millisecond, Settle: 200 * time.Millisecond},
		func(ctx context.Context) error { return RunRelay(ctx, js, func(error) {}) },
		func(err error) { mu.Lock(); state = err; mu.Unlock() })
	time.Sleep(500 * time.Millisecond)
	mu.Lock()
	if state == nil {
		t.Error("relay reported up while its consumer is missing")
	}
	mu.Unlock()
	if err := Ensure(ctx, js, bus.Options{}); err != nil {
		t.Fatal(err)
	}
	it := item("recover", "recover-0000-1111")
	if err := (Publisher{JS: js}).Schedule(ctx, it, time.Now()); err != nil {
		t.Fatal(err)
	}
	work, err := js.Stream(ctx, bus.WorkStream)
	if err != nil {
		t.Fatal(err)
	}
	for {
		_, err := work.GetLastMsgForSubject(ctx, bus.StoredWorkSubject(it.Controller.ID(), it.Parent.UID))
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			t.Fatal("relay never resumed after its consumer came back")
		}
		time.Sleep(100 * time.Millisecond)
	}
	time.Sleep(300 * time.Millisecond)
	mu.Lock()
	defer mu.Unlock()
	if state != nil {
		t.Errorf("relay running again but reported down: %v", state)
	}
}
