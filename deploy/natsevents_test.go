package deploy

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	cloudevents "github.com/cloudevents/sdk-go/v2"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	eventsconsumer "github.com/metabus/metabus/examples/events-consumer"
	"github.com/metabus/metabus/pkg/bus"
	"github.com/metabus/metabus/pkg/jsbus"
)

// TestEventsUserPermissions: under the shipped nats-server.conf, the
// applier creates MC_EVENTS and publishes the bus's events, and the
// read-only events user reads them through the CloudEvents JetStream
// binding (as examples/events-consumer does), while the server refuses it
// everything else: the internal subjects (mc.>, MC_DESIRED's Secret
// children in clear), other users' inboxes, other streams, and any publish
// of an event.
func TestEventsUserPermissions(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a nats-server (~1 s)")
	}
	env := startProductionNATS(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	watcher := env.connect(t, "watcher")
	if err := jsbus.Ensure(ctx, watcher.js, bus.Options{}); err != nil {
		t.Fatalf("watcher: ensure streams: %v", err)
	}
	applier := env.connect(t, "applier")
	if err := jsbus.EnsureEventsStream(ctx, applier.js, bus.EventsStreamConfig(bus.Options{}, time.Minute, 1<<20)); err != nil {
		t.Fatalf("applier: ensure %s: %v", bus.EventsStream, err)
	}

	// The events user, through the CloudEvents JetStream binding (the
	// example consumer's code).
	events := env.connect(t, "events")
	got := make(chan cloudevents.Event, 4)
	rctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- eventsconsumer.Receive(rctx, events.nc, bus.EventsRoot+".applied.>", func(e cloudevents.Event) { got <- e })
	}()
	defer func() { stop(); <-done }()

	ctrl := bus.ControllerRef{Kind: "CompositeController", Name: "hello"}
	parent := bus.ObjectRef{APIVersion: "example.com/v1", Kind: "Hello", Resource: "hellos", Namespace: "default", Name: "a", UID: "uid-a"}
	ev, err := bus.NewAppliedEvent(&bus.AppliedEvent{Controller: ctrl, Parent: parent, WorkSeq: 7, Hook: bus.HookSync, Outcome: bus.OutcomeApplied})
	if err != nil {
		t.Fatal(err)
	}
	if err := applier.nc.PublishMsg(&nats.Msg{Subject: ev.Subject, Header: nats.Header(ev.Header), Data: ev.Data}); err != nil {
		t.Fatalf("applier: publish %s: %v", ev.Subject, err)
	}
	select {
	case e := <-got:
		var body bus.AppliedEvent
		if err := json.Unmarshal(e.Data(), &body); err != nil || e.Type() != bus.TypeApplied || body.WorkSeq != 7 || body.Outcome != bus.OutcomeApplied {
			t.Errorf("events read type %q, body %s (%v)", e.Type(), e.Data(), err)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("the events user read no event; violations: %v %v", events.violationList(), events.otherList())
	}
	for _, c := range []*permConn{watcher, applier, events} {
		if r := c.report(); r != "" {
			t.Errorf("refused while allowed:\n%s", r)
		}
	}

	stored := bus.StoredDesiredSubject("cc-hello", "uid-a")
	for _, d := range []denial{
		{"events", "subscribe to desired states (Secret children in clear)", "mc.desired.*.*", func(_ context.Context, c *permConn) error {
			_, err := c.nc.SubscribeSync("mc.desired.*.*")
			return err
		}},
		{"events", "subscribe to the internal subjects", "mc.>", func(_ context.Context, c *permConn) error {
			_, err := c.nc.SubscribeSync("mc.>")
			return err
		}},
		{"events", "read another user's replies", "_INBOX_applier.>", func(_ context.Context, c *permConn) error {
			_, err := c.nc.SubscribeSync("_INBOX_applier.>")
			return err
		}},
		{"events", "read a desired state from MC_DESIRED", "$JS.API.DIRECT.GET.MC_DESIRED." + stored, func(ctx context.Context, c *permConn) error {
			_, err := c.nc.RequestWithContext(ctx, "$JS.API.DIRECT.GET.MC_DESIRED."+stored, nil)
			return err
		}},
		{"events", "create a consumer on MC_DESIRED", "$JS.API.CONSUMER.CREATE.MC_DESIRED.peek", func(ctx context.Context, c *permConn) error {
			_, err := c.js.CreateConsumer(ctx, bus.DesiredStream, jetstream.ConsumerConfig{Name: "peek"})
			return err
		}},
		{"events", "publish an event", bus.EventsRoot + ".applied.cc-hello.default.a", func(_ context.Context, c *permConn) error {
			return c.nc.Publish(bus.EventsRoot+".applied.cc-hello.default.a", []byte("{}"))
		}},
		{"events", "publish a work item", "mc.work.cc-hello.uid-a", func(_ context.Context, c *permConn) error {
			return c.nc.Publish("mc.work.cc-hello.uid-a", []byte("{}"))
		}},
		{"events", "purge the events stream", "$JS.API.STREAM.PURGE.MC_EVENTS", func(ctx context.Context, c *permConn) error {
			_, err := c.nc.RequestWithContext(ctx, "$JS.API.STREAM.PURGE.MC_EVENTS", nil)
			return err
		}},
	} {
		d.check(t, env)
	}
}
