package watcher

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"

	"github.com/metabus/metabus/internal/testing/natstest"
	"github.com/metabus/metabus/pkg/bus"
	"github.com/metabus/metabus/pkg/jsbus"
)

// countingPublisher publishes through the bus and counts what went out
// per controller.
type countingPublisher struct {
	pub jsbus.Publisher
	mu  sync.Mutex
	n   map[string]int
}

func (c *countingPublisher) PublishWork(ctx context.Context, item bus.WorkItem) (bool, error) {
	queued, err := c.pub.PublishWork(ctx, item)
	if err == nil {
		c.mu.Lock()
		c.n[item.Controller.Name]++
		c.mu.Unlock()
	}
	return queued, err
}

func (c *countingPublisher) count(ctrl string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n[ctrl]
}

// busForTest is a JetStream server with metabus's streams, and a context
// cancelled when the test ends.
func busForTest(t *testing.T) (context.Context, jetstream.JetStream) {
	t.Helper()
	_, js := natstest.Start(t)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	if err := jsbus.Ensure(ctx, js, bus.Options{}); err != nil {
		t.Fatal(err)
	}
	return ctx, js
}

// outboxForTest is an outbox publishing through pub (reading MC_WORK
// through js), with its metrics, shut down when the test ends.
func outboxForTest(t *testing.T, pub workPublisher, js jetstream.JetStream) *outbox {
	o := newOutbox(zap.NewNop(), pub, js, 0)
	o.metrics = newMetrics(nil, &Watcher{})
	t.Cleanup(o.shutDown)
	return o
}

// TestResyncsNotHeldByAnotherControllersBacklog (issue 24, defect 4): a
// controller whose hook hangs has a backlog of 200 work items in MC_WORK;
// a new controller's first sync of its 20 parents (resync items) must go
// out at once. The pacer used to feed resyncs only while the whole stream
// held fewer than 32 messages, so they waited for the other controller's
// backlog to drain.
func TestResyncsNotHeldByAnotherControllersBacklog(t *testing.T) {
	ctx, js := busForTest(t)
	pub := &countingPublisher{pub: jsbus.Publisher{JS: js}, n: map[string]int{}}
	hanging := bus.ControllerRef{Kind: "CompositeController", Name: "hanging"}
	for i := 0; i < 200; i++ { // no dispatcher: the backlog stays
		it := bus.WorkItem{Controller: hanging, Reason: bus.ReasonEvent,
			Parent: bus.ObjectRef{APIVersion: "example.com/v1", Kind: "Thing", Resource: "things", Namespace: "ns", Name: fmt.Sprint(i), UID: fmt.Sprintf("h-%04d", i)}}
		if _, err := pub.PublishWork(ctx, it); err != nil {
			t.Fatal(err)
		}
	}
	o := outboxForTest(t, pub, js)
	go o.runResyncPacer(ctx)
	fresh := bus.ControllerRef{Kind: "DecoratorController", Name: "fresh"}
	for i := 0; i < 20; i++ {
		o.add(entry{ref: fresh, parentRes: thingsRes, reason: bus.ReasonResync,
			parent: testObject("example.com/v1", "Thing", "ns", fmt.Sprint(i), fmt.Sprintf("f-%04d", i), "1")})
	}
	deadline := time.Now().Add(10 * time.Second)
	for pub.count("fresh") < 20 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if n := pub.count("fresh"); n < 20 {
		t.Errorf("%d of the new controller's 20 first syncs published beside another controller's backlog of 200", n)
	}
}

// countingJS counts the stream information requests made through it.
type countingJS struct {
	jetstream.JetStream
	infos *atomic.Int64
}

func (c countingJS) Stream(ctx context.Context, name string) (jetstream.Stream, error) {
	s, err := c.JetStream.Stream(ctx, name)
	if err != nil {
		return nil, err
	}
	return countingStream{s, c.infos}, nil
}

type countingStream struct {
	jetstream.Stream
	infos *atomic.Int64
}

func (c countingStream) Info(ctx context.Context, opts ...jetstream.StreamInfoOpt) (*jetstream.StreamInfo, error) {
	c.infos.Add(1)
	return c.Stream.Info(ctx, opts...)
}

// TestResyncsPacedPerController (issue 24, defect 4): a controller's
// resyncs go into MC_WORK up to its resync backlog, whatever else is
// there, and wait for its own items to be taken; while they wait, the
// pacer looks at the stream less and less often (it used to ask every
// 20 ms), and not at all once nothing waits.
func TestResyncsPacedPerController(t *testing.T) {
	ctx, js := busForTest(t)
	pub := &countingPublisher{pub: jsbus.Publisher{JS: js}, n: map[string]int{}}
	var infos atomic.Int64
	o := outboxForTest(t, pub, countingJS{js, &infos})
	go o.runResyncPacer(ctx)
	busy := bus.ControllerRef{Kind: "CompositeController", Name: "busy"}
	for i := 0; i < 50; i++ { // nobody consumes them
		o.add(entry{ref: busy, parentRes: thingsRes, reason: bus.ReasonResync,
			parent: testObject("example.com/v1", "Thing", "ns", fmt.Sprint(i), fmt.Sprintf("b-%04d", i), "1")})
	}
	time.Sleep(3 * time.Second)
	if n := pub.count("busy"); n != defaultResyncBacklog {
		t.Errorf("%d of the controller's 50 resyncs published with nothing consumed, want its backlog of %d", n, defaultResyncBacklog)
	}
	// 50 ms, then doubling to 1 s: about 6 looks in 3 s.
	if n := infos.Load(); n > 10 {
		t.Errorf("%d stream information requests in 3 s while the resyncs waited", n)
	}
	t.Logf("%d stream information requests in 3 s while 18 resyncs waited", infos.Load())
	// A dispatcher takes the controller's items: the rest go.
	st, err := js.Stream(ctx, bus.WorkStream)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Purge(ctx); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for pub.count("busy") < 50 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if n := pub.count("busy"); n != 50 {
		t.Errorf("%d of 50 resyncs published once the controller's items were taken", n)
	}
	before := infos.Load()
	time.Sleep(1500 * time.Millisecond)
	if n := infos.Load() - before; n != 0 {
		t.Errorf("%d stream information requests while no resync waited", n)
	}
}
