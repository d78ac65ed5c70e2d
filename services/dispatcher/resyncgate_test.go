package dispatcher

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/metabus/metabus/internal/testing/natstest"
	"github.com/metabus/metabus/pkg/bus"
	"github.com/metabus/metabus/pkg/jsbus"
)

// TestResyncGate: a controller's hook-asked resyncs go into MC_WORK while
// it has fewer than the backlog of items there (counting those let in
// since the stream was last counted), and wait otherwise.
func TestResyncGate(t *testing.T) {
	t0 := time.Unix(1000, 0)
	// step: at offset, controller asks; counts say what MC_WORK holds
	// whenever it is counted ("err": the count fails).
	type step struct {
		at   time.Duration
		ctrl string
	}
	cases := []struct {
		reason string
		limit  int
		counts map[string][]string // successive counts per controller
		steps  []step
		want   []string // per step: "go", "wait 1s"; "+err" when an error is reported
	}{
		{
			reason: "unpaced: everything goes, nothing is counted",
			limit:  0,
			steps:  []step{{0, "a"}, {0, "a"}},
			want:   []string{"go", "go"},
		},
		{
			reason: "under the backlog: goes, and is counted until the next look",
			limit:  3,
			counts: map[string][]string{"a": {"1"}},
			steps:  []step{{0, "a"}, {10 * time.Millisecond, "a"}, {20 * time.Millisecond, "a"}},
			want:   []string{"go", "go", "wait 1s"},
		},
		{
			reason: "at the backlog: waits until a later count finds room",
			limit:  2,
			counts: map[string][]string{"a": {"2", "2", "0"}},
			steps:  []step{{0, "a"}, {time.Second, "a"}, {2 * time.Second, "a"}},
			want:   []string{"wait 1s", "wait 1s", "go"},
		},
		{
			reason: "one controller at its backlog does not hold another back",
			limit:  2,
			counts: map[string][]string{"flood": {"5000"}, "quiet": {"0"}},
			steps:  []step{{0, "flood"}, {0, "quiet"}, {0, "flood"}, {0, "quiet"}},
			want:   []string{"wait 1s", "go", "wait 1s", "go"},
		},
		{
			reason: "a failed count lets the request in and says why",
			limit:  1,
			counts: map[string][]string{"a": {"err", "err"}},
			steps:  []step{{0, "a"}, {time.Second, "a"}},
			want:   []string{"go+err", "go+err"},
		},
		{
			reason: "a failed count keeps the last good one",
			limit:  1,
			counts: map[string][]string{"a": {"1", "err"}},
			steps:  []step{{0, "a"}, {time.Second, "a"}},
			want:   []string{"wait 1s", "wait 1s+err"},
		},
	}
	for _, c := range cases {
		t.Run(c.reason, func(t *testing.T) {
			seen := map[string]int{}
			g := newResyncGate(c.limit, func(_ context.Context, ctrl string) (int, error) {
				list := c.counts[ctrl]
				i := min(seen[ctrl], len(list)-1)
				seen[ctrl]++
				if list[i] == "err" {
					return 0, errors.New("stream info failed")
				}
				var n int
				for _, r := range list[i] {
					n = 10*n + int(r-'0')
				}
				return n, nil
			})
			var got []string
			for _, s := range c.steps {
				wait, err := g.admit(context.Background(), s.ctrl, t0.Add(s.at))
				r := "go"
				if wait > 0 {
					r = "wait " + wait.String()
				}
				if err != nil {
					if !strings.Contains(err.Error(), s.ctrl) {
						t.Errorf("error %q does not name the controller", err)
					}
					r += "+err"
				}
				got = append(got, r)
			}
			if diff := cmp.Diff(c.want, got); diff != "" {
				t.Errorf("%s (-want +got):\n%s", c.reason, diff)
			}
		})
	}
}

// TestShortResyncAfterPaced: a sub-second resyncAfterSeconds request
// (timed in this process) whose controller has its backlog in MC_WORK
// does not go in when it fires; it asks again and goes in once the
// controller's items have drained.
func TestShortResyncAfterPaced(t *testing.T) {
	_, js := natstest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := jsbus.Ensure(ctx, js, bus.Options{}); err != nil {
		t.Fatal(err)
	}
	var (
		mu      sync.Mutex
		backlog = 10 // the controller's items in MC_WORK, as counted
		counted int
	)
	d := &Dispatcher{log: zap.NewNop(), pub: jsbus.Publisher{JS: js}, timers: map[string]*time.Timer{}}
	d.gate = newResyncGate(10, func(context.Context, string) (int, error) {
		mu.Lock()
		defer mu.Unlock()
		counted++
		return backlog, nil
	})
	it := bus.WorkItem{Controller: bus.ControllerRef{Kind: "CompositeController", Name: "flood"}, Reason: bus.ReasonResyncAfter,
		Parent: bus.ObjectRef{APIVersion: "example.com/v1", Kind: "Thing", Resource: "things", Namespace: "ns", Name: "a", UID: "flood-0001"}}
	d.resyncAfter(ctx, it, 100*time.Millisecond)
	work, err := js.Stream(ctx, bus.WorkStream)
	if err != nil {
		t.Fatal(err)
	}
	inWork := func() bool {
		_, err := work.GetLastMsgForSubject(ctx, bus.StoredWorkSubject(it.Controller.ID(), it.Parent.UID))
		if err != nil && !errors.Is(err, jetstream.ErrMsgNotFound) {
			t.Fatal(err)
		}
		return err == nil
	}
	time.Sleep(700 * time.Millisecond) // fired and held back
	if inWork() {
		t.Fatal("a resyncAfterSeconds request went into MC_WORK beside its controller's full backlog")
	}
	mu.Lock()
	if counted == 0 {
		t.Error("the gate never counted the controller's items")
	}
	backlog = 0
	mu.Unlock()
	deadline := time.Now().Add(5 * time.Second)
	for !inWork() {
		if time.Now().After(deadline) {
			t.Fatal("the held-back request never went into MC_WORK once the backlog drained")
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestStreamCounter: the gate's count is the controller's items in
// MC_WORK, not another controller's.
func TestStreamCounter(t *testing.T) {
	_, js := natstest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := jsbus.Ensure(ctx, js, bus.Options{}); err != nil {
		t.Fatal(err)
	}
	pub := jsbus.Publisher{JS: js}
	publish := func(ctrl, uid string) {
		it := bus.WorkItem{Controller: bus.ControllerRef{Kind: "CompositeController", Name: ctrl}, Reason: bus.ReasonEvent,
			Parent: bus.ObjectRef{APIVersion: "example.com/v1", Kind: "Thing", Resource: "things", Namespace: "ns", Name: uid, UID: uid}}
		if _, err := pub.PublishWork(ctx, it); err != nil {
			t.Fatal(err)
		}
	}
	for _, uid := range []string{"a-1", "a-2", "a-3", "a-3"} { // a-3 twice: one pending item
		publish("a", uid)
	}
	publish("b", "b-1")
	count := streamCounter(js)
	got := map[string]int{}
	for _, ctrl := range []string{"a", "b", "c"} {
		n, err := count(ctx, bus.ControllerID("CompositeController", ctrl))
		if err != nil {
			t.Fatal(err)
		}
		got[ctrl] = n
	}
	if diff := cmp.Diff(map[string]int{"a": 3, "b": 1, "c": 0}, got); diff != "" {
		t.Errorf("items per controller in MC_WORK (-want +got):\n%s", diff)
	}
}
