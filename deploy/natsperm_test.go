package deploy

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nats.go/micro"
	"k8s.io/client-go/rest"

	"github.com/metabus/metabus/internal/testing/testnats"
	"github.com/metabus/metabus/pkg/bus"
	"github.com/metabus/metabus/pkg/echo"
	"github.com/metabus/metabus/pkg/jsbus"
	"github.com/metabus/metabus/pkg/natsx"
	"github.com/metabus/metabus/pkg/outcome"
	"github.com/metabus/metabus/pkg/revstore"
	"github.com/metabus/metabus/pkg/snapshot"
	"github.com/metabus/metabus/services/revisions"
)

// TestServicesUnderProductionNATSPermissions runs the bus operations of the
// four services against a real nats-server loaded from the shipped
// deploy/nats/nats-server.conf, each service connected as its own nkey user.
// The server refuses a publish or subscription outside a user's allow list
// silently for the caller (the client only gets an asynchronous -ERR and, for
// a request, a timeout later), so every connection records the permission
// violations its error handler sees and the test fails on any of them.
// TestNATSConfig checks subjects against the allow lists by pattern; this test
// checks that the subjects the code really uses are the ones allowed.
func TestServicesUnderProductionNATSPermissions(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a nats-server and runs the services' bus operations (~3 s)")
	}
	env := startProductionNATS(t)

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	// Everything the services run in the background stops with runCtx;
	// the test waits for it before checking what was recorded.
	runCtx, stopRun := context.WithCancel(ctx)
	var bg sync.WaitGroup
	defer func() { stopRun(); bg.Wait() }()
	goBG := func(f func()) { bg.Add(1); go func() { defer bg.Done(); f() }() }

	watcher := env.connect(t, "watcher")
	dispatcher := env.connect(t, "dispatcher")
	applier := env.connect(t, "applier")
	revs := env.connect(t, "revisions")
	conns := []*permConn{watcher, dispatcher, applier, revs}

	ctrl := bus.ControllerRef{Kind: "CompositeController", Name: "hello", UID: "ctrl-uid"}
	parent := func(uid string) bus.ObjectRef {
		return bus.ObjectRef{APIVersion: "example.com/v1", Kind: "Hello", Resource: "hellos", Namespace: "default", Name: uid, UID: uid}
	}
	const (
		uidA    = "uid-a"     // the normal path: event, retry (relayed), conflict
		uidB    = "uid-b"     // the applier's resync schedule (far ahead, stays pending)
		poisonW = "poison-w"  // the dispatcher never settles it: MC_WORK → MC_DLQ
		poisonD = "poison-d"  // the applier never settles it: MC_DESIRED → MC_DLQ
		child   = "child-uid" // the object the applier's note says it wrote
	)
	ev := newEventLog()
	// step bounds one setup call: a refused request only times out.
	step := func() context.Context {
		sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		t.Cleanup(cancel)
		return sctx
	}

	// --- revisions: the real service (over NATS; Kubernetes is never
	// reached: the callers send an op it refuses without an API call).
	revSvc, err := revisions.New(revisions.Config{Timeout: 2 * time.Second},
		revisions.Deps{REST: &rest.Config{Host: "http://127.0.0.1:1"}, NC: revs.nc})
	if err != nil {
		t.Fatal(err)
	}
	goBG(func() {
		if err := revSvc.Run(runCtx); err != nil {
			revs.busError(fmt.Errorf("revisions service: %w", err))
		}
	})
	revisionsProbe := func(who *permConn, uid string) {
		resp, err := jsbus.RevisionsClient{NC: who.nc, Timeout: 5 * time.Second}.Revisions(ctx,
			revstore.Request{Op: "permission-probe", Controller: ctrl, Parent: revstore.Parent{UID: uid, Name: uid}})
		if err != nil {
			who.busError(fmt.Errorf("revisions request: %w", err))
			return
		}
		if resp.Result != revstore.Invalid {
			who.busError(fmt.Errorf("revisions request: result %q, want %q (the service's answer to an unknown op)", resp.Result, revstore.Invalid))
			return
		}
		ev.add(who.name + " revisions answered")
	}

	// --- watcher: streams, consumers and the lease bucket, the consumer
	// keeper, the core NATS subscriptions and the snapshot micro service
	// (registered as services/watcher's serveSnapshots does; its answers
	// come from informer caches, so here a fixed one).
	if err := jsbus.Ensure(step(), watcher.js, bus.Options{}); err != nil {
		t.Fatalf("watcher: jsbus.Ensure: %v\n%s", err, watcher.report())
	}
	goBG(func() {
		jsbus.KeepConsumers(runCtx, watcher.js, bus.Options{}, 300*time.Millisecond, func(err error) {
			if !errors.Is(err, bus.ErrCutOverPending) { // the cut-over below, waiting for handovers
				watcher.busError(err)
			}
		}, nil)
	})
	watcherBook := echo.NewBook(0)
	if _, err := watcherBook.Subscribe(watcher.nc); err != nil {
		t.Fatal(err)
	}
	if _, err := watcher.nc.Subscribe(bus.RelatedSubject, func(m *nats.Msg) {
		var rr bus.RelatedRules
		if err := json.Unmarshal(m.Data, &rr); err != nil {
			watcher.busError(err)
			return
		}
		ev.add("watcher related " + rr.ParentUID)
	}); err != nil {
		t.Fatal(err)
	}
	snapSvc, err := micro.AddService(watcher.nc, micro.Config{
		Name: bus.SnapshotServiceName, Version: "0.1.0", QueueGroup: bus.SnapshotQueue,
		Endpoint: &micro.EndpointConfig{
			Subject: bus.SnapshotSubject,
			Handler: micro.HandlerFunc(func(r micro.Request) {
				if err := jsbus.RespondJSON(r, "snapshot", func(req snapshot.Request) any {
					ev.add("watcher snapshot " + req.ParentUID)
					return &snapshot.Response{Result: snapshot.NotFound}
				}); err != nil {
					watcher.busError(err)
				}
			}),
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = snapSvc.Stop() }()
	snapshotProbe := func(who *permConn, uid string) {
		resp, err := jsbus.SnapshotClient{NC: who.nc, Timeout: 5 * time.Second}.Snapshot(ctx, snapshot.Request{Controller: ctrl, ParentUID: uid})
		if err != nil {
			who.busError(err)
			return
		}
		if resp.Result != snapshot.NotFound {
			who.busError(fmt.Errorf("snapshot result %q", resp.Result))
			return
		}
		ev.add(who.name + " snapshot answered")
	}
	if err := watcher.nc.Flush(); err != nil {
		t.Fatal(err)
	}

	// --- dispatcher: background workers as services/dispatcher runs them,
	// the applied-note subscription, and the work consumer.
	dispatcherBook := echo.NewBook(0)
	if _, err := dispatcherBook.Subscribe(dispatcher.nc); err != nil {
		t.Fatal(err)
	}
	if err := jsbus.WaitReady(step(), dispatcher.js); err != nil {
		t.Fatalf("dispatcher: WaitReady: %v\n%s", err, dispatcher.report())
	}
	var deadMu sync.Mutex
	var dead []jsbus.DeadLetter
	for name, run := range map[string]func(context.Context) error{
		"schedule relay": func(ctx context.Context) error { return jsbus.RunRelay(ctx, dispatcher.js, dispatcher.busError) },
		"dead-letter worker": func(ctx context.Context) error {
			return jsbus.RunDLQ(ctx, dispatcher.js, func(dl jsbus.DeadLetter) {
				deadMu.Lock()
				dead = append(dead, dl)
				deadMu.Unlock()
			}, dispatcher.busError)
		},
	} {
		goBG(func() {
			jsbus.Supervise(runCtx, jsbus.SuperviseOptions{}, run, func(err error) {
				if err != nil {
					dispatcher.busError(fmt.Errorf("%s down: %w", name, err))
				}
			})
		})
	}
	dpub := jsbus.Publisher{JS: dispatcher.js}
	goBG(func() {
		err := jsbus.Consume(runCtx, dispatcher.js, jsbus.ConsumeConfig{
			Stream: bus.WorkStream, Prefix: bus.WorkConsumerPrefix, Stage: bus.WorkStage,
			Member: "dispatcher-0", OnError: dispatcher.busError,
		}, func(ctx context.Context, m jetstream.Msg) outcome.Outcome {
			var item bus.WorkItem
			if err := jsbus.Decode(m, bus.TypeSyncRequested, &item); err != nil {
				dispatcher.busError(err)
				return outcome.Terminal("malformed")
			}
			seq, _, err := jsbus.Meta(m)
			if err != nil {
				dispatcher.busError(err)
				return outcome.Retry(time.Second, 0)
			}
			uid := item.Parent.UID
			if uid == poisonW {
				ev.add("dispatcher delivery " + uid)
				return outcome.Outcome{} // no outcome: redelivered until MaxDeliver, then dead-lettered
			}
			snapshotProbe(dispatcher, uid)
			revisionsProbe(dispatcher, uid)
			// As services/dispatcher's broadcastRelated.
			rules, _ := json.Marshal(&bus.RelatedRules{Controller: ctrl, ParentUID: uid, ParentNamespace: "default"})
			if err := dispatcher.nc.Publish(bus.RelatedSubject, rules); err != nil {
				dispatcher.busError(err)
			}
			if err := dpub.PublishDesired(ctx, bus.DesiredState{
				Controller: item.Controller, Parent: item.Parent, WorkSeq: seq, Hook: "sync",
				Inputs: map[string]string{child: "1"}, ProducedAt: time.Now(),
			}); err != nil {
				dispatcher.busError(err)
				return outcome.Retry(time.Second, 0)
			}
			if uid == uidA && item.Reason == bus.ReasonEvent {
				// A failed sync's retry: fires into mc.due, the relay moves
				// it back to MC_WORK (and deletes the due message).
				retry := item
				retry.Reason, retry.Attempt, retry.EnqueuedAt = bus.ReasonRetry, 1, time.Time{}
				if err := dpub.Schedule(ctx, retry, time.Now()); err != nil {
					dispatcher.busError(err)
				}
			}
			ev.add("dispatcher " + uid + " " + item.Reason)
			return outcome.Done() // acked by Consume, its errors to OnError
		})
		if err != nil {
			dispatcher.busError(fmt.Errorf("work consumer: %w", err))
		}
	})

	// --- applier: the desired-state consumer (ordered, as
	// services/applier), its superseded check, requeue, schedule and note.
	if err := jsbus.WaitReady(step(), applier.js); err != nil {
		t.Fatalf("applier: WaitReady: %v\n%s", err, applier.report())
	}
	apub := jsbus.Publisher{JS: applier.js}
	var requeueOnce sync.Once
	goBG(func() {
		err := jsbus.Consume(runCtx, applier.js, jsbus.ConsumeConfig{
			Stream: bus.DesiredStream, Prefix: bus.DesiredConsumerPrefix, Stage: bus.DesiredStage,
			AckWait: bus.DesiredAckWait, Ordered: true, Member: "applier-0", OnError: applier.busError,
		}, func(ctx context.Context, m jetstream.Msg) outcome.Outcome {
			var ds bus.DesiredState
			if err := jsbus.Decode(m, bus.TypeDesired, &ds); err != nil {
				applier.busError(err)
				return outcome.Terminal("malformed")
			}
			md, err := m.Metadata()
			if err != nil {
				applier.busError(err)
				return outcome.Retry(time.Second, 0)
			}
			uid := ds.Parent.UID
			if uid == poisonD {
				ev.add("applier delivery " + uid)
				return outcome.Outcome{}
			}
			// services/applier's superseded(): the last stored desired
			// state of the parent, by direct get.
			st, err := applier.js.Stream(ctx, bus.DesiredStream)
			if err != nil {
				applier.busError(err)
			} else if last, err := st.GetLastMsgForSubject(ctx, bus.StoredDesiredSubject(ds.Controller.ID(), uid)); err != nil {
				applier.busError(fmt.Errorf("superseded check: %w", err))
			} else if last.Sequence < md.Sequence.Stream {
				applier.busError(fmt.Errorf("superseded check: last seq %d < own %d", last.Sequence, md.Sequence.Stream))
			} else {
				ev.add("applier superseded check " + uid)
			}
			snapshotProbe(applier, uid)
			revisionsProbe(applier, uid)
			if uid == uidA {
				requeueOnce.Do(func() {
					// A conflict requeues the parent; a resyncAfterSeconds
					// answer schedules it.
					if _, err := apub.PublishWork(ctx, bus.WorkItem{Controller: ds.Controller, Parent: ds.Parent, Reason: bus.ReasonConflict}); err != nil {
						applier.busError(err)
					}
					if err := apub.Schedule(ctx, bus.WorkItem{Controller: ds.Controller, Parent: parent(uidB), Reason: bus.ReasonResyncAfter}, time.Now().Add(time.Hour)); err != nil {
						applier.busError(err)
					}
				})
			}
			// As services/applier's publishNote.
			if err := echo.Publish(applier.nc, &bus.Applied{Controller: ds.Controller, ParentUID: uid, WorkSeq: ds.WorkSeq,
				Inputs: ds.Inputs, Writes: []bus.Write{{UID: child, From: "1", To: "2"}}}, ""); err != nil {
				applier.busError(err)
			}
			ev.add("applier " + uid)
			return outcome.Done() // acked (and confirmed) by Consume, its errors to OnError
		})
		if err != nil {
			applier.busError(fmt.Errorf("desired-state consumer: %w", err))
		}
	})

	// --- the watcher publishes work items.
	wpub := jsbus.Publisher{JS: watcher.js}
	for _, uid := range []string{uidA, poisonW, poisonD} {
		queued, err := wpub.PublishWork(step(), bus.WorkItem{Controller: ctrl, Parent: parent(uid), Reason: bus.ReasonEvent})
		if err != nil || !queued {
			t.Fatalf("watcher: PublishWork %s: queued=%v err=%v\n%s", uid, queued, err, watcher.report())
		}
	}

	// --- wait for every step to have happened.
	steps := []string{
		"dispatcher " + uidA + " " + bus.ReasonEvent,
		"dispatcher " + uidA + " " + bus.ReasonRetry, // scheduled, fired, relayed
		"dispatcher " + uidA + " " + bus.ReasonConflict,
		"dispatcher " + poisonD + " " + bus.ReasonEvent,
		"dispatcher snapshot answered", "dispatcher revisions answered",
		"watcher snapshot " + uidA, "watcher related " + uidA,
		"applier " + uidA, "applier superseded check " + uidA,
		"applier snapshot answered", "applier revisions answered",
	}
	waitFor(t, 25*time.Second, conns, "every service step", func() []string {
		var missing []string
		for _, s := range steps {
			if ev.count(s) == 0 {
				missing = append(missing, s)
			}
		}
		if n := ev.count("applier " + uidA); n < 3 {
			missing = append(missing, fmt.Sprintf("applier got %d desired states of %s, want 3 (event, retry, conflict)", n, uidA))
		}
		if !watcherBook.Wrote(ctrl.ID(), child, "2") {
			missing = append(missing, "watcher's echo book has the applied note")
		}
		if !dispatcherBook.Wrote(ctrl.ID(), child, "2") {
			missing = append(missing, "dispatcher's echo book has the applied note")
		}
		deadMu.Lock()
		defer deadMu.Unlock()
		for _, want := range []struct{ stream, uid string }{{bus.WorkStream, poisonW}, {bus.DesiredStream, poisonD}} {
			if !slices.ContainsFunc(dead, func(dl jsbus.DeadLetter) bool { return dl.Stream == want.stream && dl.Parent.UID == want.uid }) {
				missing = append(missing, fmt.Sprintf("%s dead-lettered from %s", want.uid, want.stream))
			}
		}
		return missing
	})
	if n := ev.count("dispatcher delivery " + poisonW); n != bus.MaxDeliver {
		t.Errorf("poison work item delivered %d times, want MaxDeliver=%d", n, bus.MaxDeliver)
	}
	if n := ev.count("applier delivery " + poisonD); n != bus.MaxDeliver {
		t.Errorf("poison desired state delivered %d times, want MaxDeliver=%d", n, bus.MaxDeliver)
	}

	// --- what the server holds afterwards, read with the permissions the
	// services have (stream info; the lease bucket through a watch, as
	// Consume's member watch) on connections of the test's own, so that a
	// refused read is not taken for a service's.
	inspect := env.connect(t, "watcher")
	inspect.name = "watcher (test reads)"
	conns = append(conns, inspect)
	subjects := func(stream, filter string) map[string]uint64 {
		rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		s, err := inspect.js.Stream(rctx, stream)
		if err != nil {
			t.Fatalf("stream %s: %v\n%s", stream, err, inspect.report())
		}
		info, err := s.Info(rctx, jetstream.WithSubjectFilter(filter))
		if err != nil {
			t.Fatalf("stream %s info: %v\n%s", stream, err, inspect.report())
		}
		return info.State.Subjects
	}
	waitFor(t, 5*time.Second, conns, "the relay deleting fired due messages", func() []string {
		if due := subjects(bus.SchedStream, "mc.due.>"); len(due) > 0 {
			return []string{fmt.Sprintf("MC_SCHED still holds due messages %v", due)}
		}
		return nil
	})
	if sched := subjects(bus.SchedStream, "mc.sched.>"); sched["mc.sched."+ctrl.ID()+"."+uidB] != 1 {
		t.Errorf("applier's schedule for %s is not pending in MC_SCHED: %v", uidB, sched)
	}
	dlq := subjects(bus.DLQStream, "mc.dlq.>")
	for _, s := range []string{bus.DLQSubject("work", ctrl.ID(), poisonW), bus.DLQSubject("desired", ctrl.ID(), poisonD)} {
		if dlq[s] != 1 {
			t.Errorf("MC_DLQ lacks %s: %v", s, dlq)
		}
	}
	if left := subjects(bus.WorkStream, "mc.work.>"); left[bus.StoredWorkSubject(ctrl.ID(), poisonW)] != 0 {
		t.Errorf("the DLQ worker did not delete the poison work item from MC_WORK: %v", left)
	}
	if left := subjects(bus.DesiredStream, "mc.desired.>"); left[bus.StoredDesiredSubject(ctrl.ID(), poisonD)] != 0 {
		t.Errorf("the DLQ worker did not delete the poison desired state from MC_DESIRED: %v", left)
	}
	for user, stage := range map[string]string{"dispatcher": bus.WorkStage, "applier": bus.DesiredStage} {
		c := env.connect(t, user)
		c.name = user + " (test reads)"
		conns = append(conns, c)
		checkLeases(t, ctx, c, stage, map[string]string{bus.WorkStage: "dispatcher-0", bus.DesiredStage: "applier-0"}, bus.DefaultPartitions, 5*time.Second)
	}

	// --- what must be refused, each on a connection of its own so that
	// these expected violations do not count against the services.
	denials := []denial{
		{user: "applier", what: "publish a desired state", subject: "mc.desired.cc-x.y", do: func(ctx context.Context, c *permConn) error {
			return jsbus.Publisher{JS: c.js}.PublishDesired(ctx, bus.DesiredState{
				Controller: bus.ControllerRef{Kind: "CompositeController", Name: "x"}, Parent: parent("y"), WorkSeq: 1})
		}},
		{user: "watcher", what: "write a partition lease", subject: "$KV.MC_OWNERS.lease.work.p00", do: func(ctx context.Context, c *permConn) error {
			kv, err := c.js.KeyValue(ctx, bus.OwnersBucket)
			if err != nil {
				return err
			}
			_, err = kv.Put(ctx, "lease.work.p00", []byte("intruder"))
			return err
		}},
		// One compromised stage cannot seize (or release) the other's
		// partitions (issue 35): each writes its own stage's keys only.
		{user: "dispatcher", what: "write an applier's partition lease", subject: "$KV.MC_OWNERS." + bus.LeaseKey(bus.DesiredStage, bus.DefaultPartitions, 0),
			do: func(ctx context.Context, c *permConn) error {
				return putLease(ctx, c, bus.LeaseKey(bus.DesiredStage, bus.DefaultPartitions, 0))
			}},
		{user: "applier", what: "write a dispatcher's partition lease", subject: "$KV.MC_OWNERS." + bus.LeaseKey(bus.WorkStage, bus.DefaultPartitions, 0),
			do: func(ctx context.Context, c *permConn) error {
				return putLease(ctx, c, bus.LeaseKey(bus.WorkStage, bus.DefaultPartitions, 0))
			}},
		{user: "dispatcher", what: "register as an applier member", subject: "$KV.MC_OWNERS." + bus.MemberKey(bus.DesiredStage, "intruder"),
			do: func(ctx context.Context, c *permConn) error {
				return putLease(ctx, c, bus.MemberKey(bus.DesiredStage, "intruder"))
			}},
		{user: "applier", what: "register as a dispatcher member", subject: "$KV.MC_OWNERS." + bus.MemberKey(bus.WorkStage, "intruder"),
			do: func(ctx context.Context, c *permConn) error {
				return putLease(ctx, c, bus.MemberKey(bus.WorkStage, "intruder"))
			}},
		// The watcher makes consumers on the streams it owns only.
		{user: "watcher", what: "create a consumer on the lease bucket", subject: "$JS.API.CONSUMER.CREATE.KV_MC_OWNERS.snoop", do: func(ctx context.Context, c *permConn) error {
			_, err := c.js.CreateOrUpdateConsumer(ctx, "KV_"+bus.OwnersBucket, jetstream.ConsumerConfig{Durable: "snoop"})
			return err
		}},
		{user: "watcher", what: "create the events stream", subject: "$JS.API.STREAM.CREATE.MC_EVENTS", do: func(ctx context.Context, c *permConn) error {
			_, err := c.js.CreateStream(ctx, jetstream.StreamConfig{Name: "MC_EVENTS", Subjects: []string{"metabus.events.>"}})
			return err
		}},
		{user: "watcher", what: "publish a stored (partitioned) work subject", subject: "mc.work.7.cc-hello.z", do: func(ctx context.Context, c *permConn) error {
			_, err := c.js.Publish(ctx, "mc.work.7.cc-hello.z", []byte("{}"))
			return err
		}},
		{user: "revisions", what: "publish a work item", subject: "mc.work.cc-hello.z", do: func(ctx context.Context, c *permConn) error {
			_, err := jsbus.Publisher{JS: c.js}.PublishWork(ctx, bus.WorkItem{Controller: ctrl, Parent: parent("z"), Reason: bus.ReasonEvent})
			return err
		}},
		{user: "applier", what: "delete stream MC_WORK", subject: "$JS.API.STREAM.DELETE.MC_WORK", do: func(ctx context.Context, c *permConn) error {
			return c.js.DeleteStream(ctx, bus.WorkStream)
		}},
		{user: "dispatcher", what: "pull from MC_DESIRED", subject: "$JS.API.CONSUMER.MSG.NEXT.MC_DESIRED." + bus.PartitionConsumerName(bus.DesiredConsumerPrefix, bus.DefaultPartitions, 0), do: func(ctx context.Context, c *permConn) error {
			cons, err := c.js.Consumer(ctx, bus.DesiredStream, bus.PartitionConsumerName(bus.DesiredConsumerPrefix, bus.DefaultPartitions, 0))
			if err != nil {
				return err
			}
			_, err = cons.Fetch(1, jetstream.FetchMaxWait(time.Second))
			return err
		}},
		{user: "dispatcher", what: "serve the snapshot service", subject: bus.SnapshotSubject, do: func(ctx context.Context, c *permConn) error {
			_, err := c.nc.QueueSubscribe(bus.SnapshotSubject, bus.SnapshotQueue, func(*nats.Msg) {})
			return err
		}},
		{user: "revisions", what: "listen to applied notes", subject: bus.AppliedSubject, do: func(ctx context.Context, c *permConn) error {
			_, err := c.nc.Subscribe(bus.AppliedSubject, func(*nats.Msg) {})
			return err
		}},
	}
	// Nobody reads another's replies (issue 26): snapshots (Secret
	// children), revisions and JetStream API replies travel on inboxes.
	for _, user := range testnats.Services {
		for _, subject := range []string{"_INBOX.>", "_INBOX.*", ">"} {
			denials = append(denials, denial{user: user, what: "subscribe to " + subject, subject: subject,
				do: func(ctx context.Context, c *permConn) error {
					_, err := c.nc.Subscribe(subject, func(*nats.Msg) {})
					return err
				}})
		}
		for _, other := range testnats.Services {
			if other == user {
				continue
			}
			subject := natsx.ServiceInboxPrefix(other) + ".>"
			denials = append(denials, denial{user: user, what: "read the " + other + "'s replies", subject: subject,
				do: func(ctx context.Context, c *permConn) error {
					_, err := c.nc.Subscribe(subject, func(*nats.Msg) {})
					return err
				}})
		}
	}
	var dwg sync.WaitGroup
	for _, d := range denials {
		dwg.Add(1)
		go func() { defer dwg.Done(); d.check(t, env) }()
	}
	dwg.Wait()
	if _, err := watcher.js.Stream(ctx, bus.WorkStream); err != nil {
		t.Errorf("MC_WORK after the applier's refused delete: %v", err)
	}

	// --- a partition-count cut-over with the same permissions: the
	// watcher asks for 16 partitions, the running stages hand the 64 back
	// and take the 16 over (reading the count from the stream), the
	// watcher's keeper (started without a count: it follows the stream's)
	// replaces the consumers, and work flows again.
	cut := bus.Options{Partitions: 16}
	if err := jsbus.Ensure(step(), watcher.js, cut); err != nil {
		t.Fatalf("watcher: jsbus.Ensure with 16 partitions: %v\n%s", err, watcher.report())
	}
	for user, stage := range map[string]string{"dispatcher": bus.WorkStage, "applier": bus.DesiredStage} {
		c := env.connect(t, user)
		c.name = user + " (test reads after the cut-over)"
		conns = append(conns, c)
		checkLeases(t, ctx, c, stage, map[string]string{bus.WorkStage: "dispatcher-0", bus.DesiredStage: "applier-0"}, 16, 30*time.Second)
	}
	before := ev.count("applier " + uidA)
	if _, err := wpub.PublishWork(step(), bus.WorkItem{Controller: ctrl, Parent: parent(uidA), Reason: bus.ReasonEvent}); err != nil {
		t.Fatalf("watcher: PublishWork after the cut-over: %v\n%s", err, watcher.report())
	}
	waitFor(t, 20*time.Second, conns, "a change applied through the 16 partitions", func() []string {
		if ev.count("applier "+uidA) <= before {
			return []string{"no desired state of " + uidA + " applied after the cut-over"}
		}
		return nil
	})

	// --- stop everything, then the verdict.
	stopRun()
	bg.Wait()
	for _, c := range conns {
		for _, v := range c.violationList() {
			t.Errorf("%s: %s", c.name, v)
		}
		for _, e := range c.busErrorList() {
			t.Errorf("%s: bus operation failed: %s", c.name, e)
		}
		for _, e := range c.otherList() {
			t.Logf("%s: async error (not a permission violation): %s", c.name, e)
		}
	}
}

// ---------------------------------------------------------------------------
// Server from the shipped configuration

type permEnv struct {
	url   string
	seeds map[string]string // user → seed file
}

// startProductionNATS starts nats-server from deploy/nats/nats-server.conf
// (testnats.StartProduction).
func startProductionNATS(t *testing.T) *permEnv {
	t.Helper()
	p := testnats.StartProduction(t, filepath.Join("nats", "nats-server.conf"))
	return &permEnv{url: p.URL, seeds: p.Seeds}
}

// ---------------------------------------------------------------------------
// Connections that record what the server refused

type permConn struct {
	name string
	nc   *nats.Conn
	js   jetstream.JetStream

	mu         sync.Mutex
	violations []string
	other      []string
	busErrs    []string
	onErr      func(error) // for denial checks: sees every async error
}

// connect connects as user the way the services do (natsx.Connect with the
// --nats-nkey seed file) and records the connection's async errors.
func (e *permEnv) connect(t *testing.T, user string) *permConn {
	t.Helper()
	nc, js, err := natsx.Connect(natsx.ConnOptions{URL: e.url, Name: "metabus-" + user, NKeySeed: e.seeds[user], InboxPrefix: natsx.ServiceInboxPrefix(user)})
	if err != nil {
		t.Fatalf("connect as %s: %v", user, err)
	}
	c := &permConn{name: user, nc: nc, js: js}
	nc.SetErrorHandler(c.asyncError)
	t.Cleanup(nc.Close)
	return c
}

func isViolation(err error) bool {
	return errors.Is(err, nats.ErrPermissionViolation) || strings.Contains(strings.ToLower(err.Error()), "permissions violation")
}

func (c *permConn) asyncError(_ *nats.Conn, sub *nats.Subscription, err error) {
	msg := err.Error()
	if sub != nil {
		msg += " (subscription " + sub.Subject + ")"
	}
	c.mu.Lock()
	if isViolation(err) {
		c.violations = append(c.violations, msg)
	} else {
		c.other = append(c.other, msg)
	}
	f := c.onErr
	c.mu.Unlock()
	if f != nil {
		f(err)
	}
}

// busError records an error a bus operation returned or reported.
func (c *permConn) busError(err error) {
	if err == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.busErrs = append(c.busErrs, err.Error())
}

func (c *permConn) violationList() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.violations)
}

func (c *permConn) busErrorList() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.busErrs)
}

func (c *permConn) otherList() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.other)
}

func (c *permConn) report() string {
	var b strings.Builder
	for _, v := range c.violationList() {
		fmt.Fprintf(&b, "  %s: %s\n", c.name, v)
	}
	for _, e := range c.busErrorList() {
		fmt.Fprintf(&b, "  %s: bus error: %s\n", c.name, e)
	}
	return b.String()
}

// denial is an operation the server must refuse to user.
type denial struct {
	user, what, subject string
	do                  func(ctx context.Context, c *permConn) error
}

// check runs the operation on a fresh connection and expects a permission
// violation naming the subject. The operation itself usually fails only
// later (a request to a refused subject times out), so its error is logged,
// not required.
func (d denial) check(t *testing.T, e *permEnv) {
	nc, js, err := natsx.Connect(natsx.ConnOptions{URL: e.url, Name: "denial-" + d.user, NKeySeed: e.seeds[d.user], InboxPrefix: natsx.ServiceInboxPrefix(d.user)})
	if err != nil {
		t.Errorf("%s may not %s: connect: %v", d.user, d.what, err)
		return
	}
	defer nc.Close()
	c := &permConn{name: d.user, nc: nc, js: js}
	seen := make(chan string, 16)
	c.onErr = func(err error) {
		if isViolation(err) {
			select {
			case seen <- err.Error():
			default:
			}
		}
	}
	nc.SetErrorHandler(c.asyncError)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	opErr := d.do(ctx, c)
	_ = nc.Flush()
	want := fmt.Sprintf("%q", d.subject)
	deadline := time.After(3 * time.Second)
	for {
		select {
		case v := <-seen:
			if strings.Contains(v, want) {
				t.Logf("denied as expected: %s may not %s: %s (operation: %v)", d.user, d.what, v, opErr)
				return
			}
		case <-deadline:
			t.Errorf("%s may not %s, but the server reported no violation for %s (operation returned %v; violations %v)",
				d.user, d.what, d.subject, opErr, c.violationList())
			return
		}
	}
}

// ---------------------------------------------------------------------------
// Helpers

type eventLog struct {
	mu sync.Mutex
	n  map[string]int
}

func newEventLog() *eventLog { return &eventLog{n: map[string]int{}} }

func (l *eventLog) add(s string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.n[s]++
}

func (l *eventLog) count(s string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.n[s]
}

// waitFor polls missing until it reports nothing missing; on timeout it
// fails with what is missing and what the connections recorded.
func waitFor(t *testing.T, timeout time.Duration, conns []*permConn, what string, missing func() []string) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		m := missing()
		if len(m) == 0 {
			return
		}
		if time.Now().After(deadline) {
			var rep strings.Builder
			for _, c := range conns {
				rep.WriteString(c.report())
			}
			t.Fatalf("waiting for %s: still missing after %s:\n  %s\nrecorded so far:\n%s", what, timeout, strings.Join(m, "\n  "), rep.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// checkLeases reads the lease bucket through a watch (the only read the
// stage members are allowed: Consume's member watch) and expects every
// partition of each stage held by its one member, and the members present.
// It also drives the watch into flow control.
func checkLeases(t *testing.T, ctx context.Context, c *permConn, stage string, members map[string]string, partitions int, within time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, within+5*time.Second)
	defer cancel()
	kv, err := c.js.KeyValue(ctx, bus.OwnersBucket)
	if err != nil {
		t.Fatalf("%s: open %s: %v", c.name, bus.OwnersBucket, err)
	}
	// Enough data for the watch below to pass half of the server's 2 MB
	// flow-control window, so the server asks for flow control and the
	// client answers on $JS.FC.KV_MC_OWNERS.>, as the stages' member
	// watches do when busy. The keys are under c's own stage's leases,
	// the only keys it may write, with more tokens than a lease or member
	// key has, so no member watch or lease read matches them.
	filler := make([]byte, 768<<10)
	for _, k := range []string{"lease." + stage + ".fc-probe." + c.nc.Opts.Name + ".1", "lease." + stage + ".fc-probe." + c.nc.Opts.Name + ".2"} {
		if _, err := kv.Put(ctx, k, filler); err != nil {
			t.Fatalf("%s: put %s: %v", c.name, k, err)
		}
		defer func() { _ = kv.Purge(context.WithoutCancel(ctx), k) }()
	}
	w, err := kv.WatchAll(ctx)
	if err != nil {
		t.Fatalf("%s: watch %s: %v", c.name, bus.OwnersBucket, err)
	}
	defer func() { _ = w.Stop() }()
	// Read on past the end of the initial values: renewals rewrite the
	// leases meanwhile, moving them behind the watch's starting point.
	got := map[string]string{}
	missing := func() []string {
		var out []string
		for stage, member := range members {
			if got["member."+stage+"."+member] == "" {
				out = append(out, fmt.Sprintf("member.%s.%s is missing", stage, member))
			}
			for p := 0; p < partitions; p++ {
				key := bus.LeaseKey(stage, partitions, p)
				if got[key] != member {
					out = append(out, fmt.Sprintf("%s = %q, want %q", key, got[key], member))
				}
			}
		}
		return out
	}
	initial := false
	timeout := time.After(within)
	for !initial || len(missing()) > 0 {
		select {
		case e := <-w.Updates():
			if e == nil {
				initial = true
			} else if e.Operation() == jetstream.KeyValuePut {
				got[e.Key()] = string(e.Value())
			}
		case <-timeout:
			t.Fatalf("%s: in %s: %s\n%s", c.name, bus.OwnersBucket, strings.Join(missing(), "; "), c.report())
		}
	}
}

// putLease writes key of the lease bucket as a replica claiming it would.
func putLease(ctx context.Context, c *permConn, key string) error {
	kv, err := c.js.KeyValue(ctx, bus.OwnersBucket)
	if err != nil {
		return err
	}
	_, err = kv.Put(ctx, key, []byte("intruder"))
	return err
}
