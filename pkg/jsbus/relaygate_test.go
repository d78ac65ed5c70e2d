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

// TestRelayGateHoldsHookAskedResyncs (issue 35): a hook-asked resync the
// gate holds back does not reach MC_WORK but is scheduled again and asked
// about later; once the gate lets it go, it is relayed. Another
// controller's item, and an item that is not a hook-asked resync, are
// relayed meanwhile.
func TestRelayGateHoldsHookAskedResyncs(t *testing.T) {
	js := startBus(t, bus.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	flood := item("flood", "flood-0000-held")
	flood.Reason = bus.ReasonResyncAfter
	floodRetry := item("flood", "flood-0000-retry") // a failure's retry: never gated
	floodRetry.Reason = bus.ReasonRetry
	quiet := item("quiet", "quiet-0000-asked")
	quiet.Reason = bus.ReasonResyncAfter
	var (
		mu    sync.Mutex
		asked = map[string]int{}
		open  bool
	)
	gate := func(_ context.Context, it bus.WorkItem) (time.Duration, error) {
		mu.Lock()
		defer mu.Unlock()
		if it.Reason != bus.ReasonResyncAfter {
			t.Errorf("gate asked about a %s item: only hook-asked resyncs are paced", it.Reason)
		}
		asked[it.Controller.Name]++
		if it.Controller.Name == "flood" && !open {
			return time.Second, nil
		}
		return 0, nil
	}
	for _, it := range []bus.WorkItem{flood, floodRetry, quiet} {
		if err := (Publisher{JS: js}).Schedule(ctx, it, time.Now()); err != nil {
			t.Fatal(err)
		}
	}
	rctx, rcancel := context.WithCancel(ctx)
	defer rcancel()
	go func() {
		_ = RunRelayGated(rctx, Publisher{JS: js}, gate, func(err error) {
			if rctx.Err() == nil {
				t.Logf("relay: %v", err)
			}
		})
	}()
	work, err := js.Stream(ctx, bus.WorkStream)
	if err != nil {
		t.Fatal(err)
	}
	inWork := func(it bus.WorkItem) bool {
		_, err := work.GetLastMsgForSubject(ctx, bus.StoredWorkSubject(it.Controller.ID(), it.Parent.UID))
		if err != nil && !errors.Is(err, jetstream.ErrMsgNotFound) {
			t.Fatal(err)
		}
		return err == nil
	}
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for !cond() {
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting until %s", what)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	waitFor("the other controller's resync and the retry are relayed", func() bool { return inWork(quiet) && inWork(floodRetry) })
	waitFor("the held resync is asked about again", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return asked["flood"] >= 2
	})
	if inWork(flood) {
		t.Fatal("a resync the gate held back reached MC_WORK")
	}
	mu.Lock()
	open = true
	mu.Unlock()
	waitFor("the resync is relayed once the gate lets it go", func() bool { return inWork(flood) })
}
