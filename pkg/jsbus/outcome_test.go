package jsbus

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/metabus/metabus/pkg/bus"
	"github.com/metabus/metabus/pkg/outcome"
)

// settleLog records how a plain consumer's message was settled; other Msg
// methods are not expected (calling one panics on the nil embedded
// interface).
type settleLog struct {
	jetstream.Msg
	calls []string
}

func (m *settleLog) Ack() error { m.calls = append(m.calls, "ack"); return nil }
func (m *settleLog) Nak() error { m.calls = append(m.calls, "nak"); return nil }
func (m *settleLog) NakWithDelay(d time.Duration) error {
	m.calls = append(m.calls, "nak "+d.Round(100*time.Millisecond).String())
	return nil
}
func (m *settleLog) TermWithReason(r string) error {
	m.calls = append(m.calls, "term "+r)
	return nil
}

func TestSettlePlain(t *testing.T) {
	for _, tc := range []struct {
		reason string
		o      outcome.Outcome
		want   []string
	}{
		{reason: "done acks", o: outcome.Done(), want: []string{"ack"}},
		{reason: "terminal terms with its reason", o: outcome.Terminal("malformed due work item"), want: []string{"term malformed due work item"}},
		{reason: "a retry without attempt naks with its delay: a plain consumer counts nothing", o: outcome.Retry(time.Second, 0), want: []string{"nak 1s"}},
		{reason: "a retry's attempt grows the delay (the dead-letter worker's)", o: outcome.Retry(time.Second, 3), want: []string{"nak 4s"}},
		{reason: "a late attempt waits at most 30 s", o: outcome.Retry(time.Second, 9), want: []string{"nak 30s"}},
		{reason: "a retry at a time naks until then", o: outcome.RetryAt(time.Now().Add(time.Hour)), want: []string{"nak 1h0m0s"}},
		{reason: "throttled naks with exactly its delay", o: outcome.Throttled(5 * time.Second), want: []string{"nak 5s"}},
		{reason: "no outcome naks at once, for the server's redelivery", o: outcome.Outcome{}, want: []string{"nak"}},
	} {
		t.Run(tc.reason, func(t *testing.T) {
			m := &settleLog{}
			if err := settlePlain(m, tc.o); err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, m.calls); diff != "" {
				t.Errorf("settled (-want +got):\n%s", diff)
			}
		})
	}
}

// TestConsumeSettlesOutcomes: Consume settles each kind of outcome, and a
// handler cannot settle its message itself. Per parent (its controller
// says what it does): a Terminal message is dropped and never comes back;
// Throttled and RetryAt run again in place after their wait, costing no
// delivery; no outcome is redelivered by the server, counting one.
func TestConsumeSettlesOutcomes(t *testing.T) {
	connect := replicas(t, bus.Options{})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	_, js := connect()
	type run struct {
		Delivered uint64
		Waited    bool // at least 300 ms after the previous run
	}
	var mu sync.Mutex
	runs := map[string][]run{}
	last := map[string]time.Time{}
	consumed := make(chan struct{})
	go func() {
		defer close(consumed)
		_ = Consume(ctx, js, ConsumeConfig{Stream: bus.WorkStream, Prefix: bus.WorkConsumerPrefix, Stage: bus.WorkStage, PerController: 4},
			func(_ context.Context, m jetstream.Msg) outcome.Outcome {
				var it bus.WorkItem
				if err := Decode(m, bus.TypeSyncRequested, &it); err != nil {
					t.Error(err)
					return outcome.Terminal("malformed")
				}
				for what, err := range map[string]error{"ack": m.Ack(), "nak": m.NakWithDelay(time.Second), "term": m.TermWithReason("x")} {
					if !errors.Is(err, errRuntimeSettles) {
						t.Errorf("a handler's %s: %v, want %v", what, err, errRuntimeSettles)
					}
				}
				_, delivered, _ := Meta(m)
				name := it.Controller.Name
				mu.Lock()
				now := time.Now()
				prev, ok := last[name]
				runs[name] = append(runs[name], run{Delivered: delivered, Waited: ok && now.Sub(prev) >= 300*time.Millisecond})
				last[name] = now
				n := len(runs[name])
				mu.Unlock()
				if n > 1 {
					return outcome.Done()
				}
				switch name {
				case "terminal":
					return outcome.Terminal("dropped on purpose")
				case "throttled":
					return outcome.Throttled(300 * time.Millisecond)
				case "at":
					return outcome.RetryAt(time.Now().Add(300 * time.Millisecond))
				}
				return outcome.Outcome{} // "none"
			})
	}()
	for _, name := range []string{"terminal", "throttled", "at", "none"} {
		publishMany(t, js, name, 1)
	}
	want := map[string][]run{
		"terminal":  {{Delivered: 1}},
		"throttled": {{Delivered: 1}, {Delivered: 1, Waited: true}},
		"at":        {{Delivered: 1}, {Delivered: 1, Waited: true}},
		"none":      {{Delivered: 1}, {Delivered: 2}},
	}
	var got map[string][]run
	for deadline := time.Now().Add(15 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		mu.Lock()
		got = map[string][]run{}
		for k, v := range runs {
			got[k] = append([]run(nil), v...)
		}
		mu.Unlock()
		if cmp.Equal(want, got) {
			break
		}
	}
	time.Sleep(time.Second) // a terminated message coming back would run by now
	mu.Lock()
	got = runs
	mu.Unlock()
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("runs by parent (-want +got):\n%s", diff)
	}
	st, err := js.Stream(ctx, bus.WorkStream)
	if err != nil {
		t.Fatal(err)
	}
	waitEmpty(t, st, "every outcome must settle its message in the end")
	cancel()
	<-consumed
}

// waitEmpty waits up to 5 s for st to hold no message; why says what
// should have emptied it.
func waitEmpty(t *testing.T, st jetstream.Stream, why string) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		info, err := st.Info(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if info.State.Msgs == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d messages left in %s: %s", info.State.Msgs, info.Config.Name, why)
		}
	}
}
