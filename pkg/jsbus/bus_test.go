package jsbus

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/metabus/metabus/internal/testing/natstest"
	"github.com/metabus/metabus/internal/testing/testnats"
	"github.com/metabus/metabus/pkg/bus"
	"github.com/metabus/metabus/pkg/outcome"
)

// startNATS starts an in-process embedded server for the test and connects
// to it.
func startNATS(t *testing.T) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	return natstest.Start(t)
}

func startBus(t *testing.T, o bus.Options) jetstream.JetStream {
	t.Helper()
	_, js := startNATS(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := Ensure(ctx, js, o); err != nil {
		t.Fatalf("Ensure: %v", err)
	}
	return js
}

func item(ctrl, uid string) bus.WorkItem {
	return bus.WorkItem{
		Controller: bus.ControllerRef{Kind: "CompositeController", Name: ctrl},
		Parent:     bus.ObjectRef{APIVersion: "example.com/v1", Kind: "Thing", Resource: "things", Namespace: "ns", Name: "a", UID: uid},
		Reason:     bus.ReasonEvent,
	}
}

// TestStreamsAsDesigned pins the stream settings measured when the bus was designed: the ones
// that looked right but lose events or break per-parent order are exactly
// what this guards against.
func TestStreamsAsDesigned(t *testing.T) {
	js := startBus(t, bus.Options{})
	ctx := context.Background()
	st, err := js.Stream(ctx, bus.WorkStream)
	if err != nil {
		t.Fatal(err)
	}
	c := st.CachedInfo().Config
	if c.Retention != jetstream.WorkQueuePolicy || c.MaxMsgsPerSubject != 2 || c.Discard != jetstream.DiscardNew ||
		!c.DiscardNewPerSubject || c.Duplicates != 2*time.Minute || c.MaxMsgs > 0 || c.MaxBytes > 0 {
		t.Errorf("MC_WORK config = %+v", c)
	}
	if want := strconv.Itoa(bus.DefaultPartitions); c.Metadata[bus.PartitionsMetadata] != want {
		t.Errorf("MC_WORK metadata %v, want %s=%s", c.Metadata, bus.PartitionsMetadata, want)
	}
	if c.SubjectTransform == nil || c.SubjectTransform.Destination != "mc.work.{{partition(64,1,2)}}.{{partition(1024,1,2)}}.{{wildcard(1)}}.{{wildcard(2)}}" {
		t.Errorf("MC_WORK transform = %+v", c.SubjectTransform)
	}
	d, err := js.Stream(ctx, bus.DesiredStream)
	if err != nil {
		t.Fatal(err)
	}
	dc := d.CachedInfo().Config
	if dc.Retention != jetstream.WorkQueuePolicy || dc.MaxMsgsPerSubject > 0 || !dc.AllowDirect {
		t.Errorf("MC_DESIRED config = %+v", dc)
	}
	// Bounded by age only (issue 13 #13): a count or byte limit with
	// DiscardOld would silently drop desired states not yet applied under
	// load; one a day old is stale and the periodic resync rederives it.
	if dc.MaxAge < 24*time.Hour || dc.MaxMsgs > 0 || dc.MaxBytes > 0 || dc.Discard != jetstream.DiscardOld {
		t.Errorf("MC_DESIRED limits: MaxAge %s (want at least 24h), MaxMsgs %d, MaxBytes %d, Discard %v: want age only",
			dc.MaxAge, dc.MaxMsgs, dc.MaxBytes, dc.Discard)
	}
	s, err := js.Stream(ctx, bus.SchedStream)
	if err != nil {
		t.Fatal(err)
	}
	if sc := s.CachedInfo().Config; !sc.AllowMsgSchedules || sc.Discard == jetstream.DiscardNew {
		t.Errorf("MC_SCHED config = %+v", sc)
	}
	// No MaxAge on MC_SCHED: a schedule must stay until it fires, however
	// far ahead (fired due messages are deleted by the relay instead).
	if sc := s.CachedInfo().Config; sc.MaxAge != 0 || sc.MaxMsgsPerSubject != 1 {
		t.Errorf("MC_SCHED MaxAge %s MaxMsgsPerSubject %d, want none and 1", sc.MaxAge, sc.MaxMsgsPerSubject)
	}
	for _, tc := range []struct{ stream, prefix string }{{bus.WorkStream, bus.WorkConsumerPrefix}, {bus.DesiredStream, bus.DesiredConsumerPrefix}} {
		for p := 0; p < bus.DefaultPartitions; p++ {
			cons, err := js.Consumer(ctx, tc.stream, bus.PartitionConsumerName(tc.prefix, bus.DefaultPartitions, p))
			if err != nil {
				t.Fatalf("consumer %s/%d: %v", tc.stream, p, err)
			}
			cc := cons.CachedInfo().Config
			wantPending := bus.WorkMaxAckPending
			if tc.stream == bus.DesiredStream {
				wantPending = bus.DesiredMaxAckPending
			}
			if cc.MaxAckPending != wantPending || cc.AckPolicy != jetstream.AckExplicitPolicy || cc.MaxDeliver != bus.MaxDeliver {
				t.Errorf("consumer %s = %+v", cc.Durable, cc)
			}
			if tc.stream == bus.WorkStream && fmt.Sprint(cc.BackOff) != "[15s 30s 1m0s 2m0s]" {
				t.Errorf("consumer %s backoff %v, want 15s 30s 60s 120s (design §2.7)", cc.Durable, cc.BackOff)
			}
		}
	}
}

// TestWorkQueueSemantics: many publishes while queued collapse, an add
// during processing causes exactly one more run, and 10077 is reported as
// "already queued" rather than an error.
func TestWorkQueueSemantics(t *testing.T) {
	js := startBus(t, bus.Options{})
	ctx := context.Background()
	pub := Publisher{JS: js}
	it := item("c1", "11111111-2222-3333-4444-555555555555")
	results := []bool{}
	for i := 0; i < 4; i++ {
		queued, err := pub.PublishWork(ctx, it)
		if err != nil {
			t.Fatalf("publish %d: %v", i, err)
		}
		results = append(results, queued)
	}
	if fmt.Sprint(results) != "[true true false false]" {
		t.Errorf("queued results = %v, want two accepted then already-queued", results)
	}
	// The server stored it in the partition the client computes.
	st, err := js.Stream(ctx, bus.WorkStream)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.GetLastMsgForSubject(ctx, bus.StoredWorkSubject(it.Controller.ID(), it.Parent.UID)); err != nil {
		t.Errorf("not stored under %q: %v", bus.StoredWorkSubject(it.Controller.ID(), it.Parent.UID), err)
	}
	// The partition's owner runs the first; the second waits its turn
	// (one at a time per parent) and further publishes collapse into it.
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	runs := make(chan jetstream.Msg)
	acked := make(chan struct{}, 2)
	go func() {
		_ = Consume(cctx, js, ConsumeConfig{Stream: bus.WorkStream, Prefix: bus.WorkConsumerPrefix, Stage: bus.WorkStage, PerController: 4},
			func(hctx context.Context, m jetstream.Msg) outcome.Outcome {
				select {
				case runs <- m:
				case <-hctx.Done():
					return outcome.Outcome{}
				}
				<-acked // the test says when it is done
				return outcome.Done()
			})
	}()
	<-runs
	select {
	case <-runs:
		t.Fatal("a second item of the parent ran while the first was in flight")
	case <-time.After(500 * time.Millisecond):
	}
	if queued, err := pub.PublishWork(ctx, it); err != nil || queued {
		t.Errorf("publish during processing: queued=%v err=%v, want already queued", queued, err)
	}
	acked <- struct{}{}
	// Ack frees the slot: one more run follows, and a new publish is
	// accepted again as the pending one.
	select {
	case <-runs:
	case <-time.After(5 * time.Second):
		t.Fatal("the pending item was never run after the ack")
	}
	acked <- struct{}{}
	waitEmpty(t, st, "both were done") // acked and gone
	if queued, err := pub.PublishWork(ctx, it); err != nil || !queued {
		t.Errorf("publish after the pending item was taken: queued=%v err=%v", queued, err)
	}
}

// consumerOf is the default layout's partition consumer of a work item.
func consumerOf(prefix string, it bus.WorkItem) string {
	return bus.PartitionConsumerName(prefix, bus.DefaultPartitions, bus.PartitionOf(bus.Slot(it.Controller.ID(), it.Parent.UID), bus.DefaultPartitions))
}

// TestSlotMatchesServer: the client's FNV-1a slot equals the server's
// transform for many keys.
func TestSlotMatchesServer(t *testing.T) {
	js := startBus(t, bus.Options{})
	ctx := context.Background()
	pub := Publisher{JS: js}
	for i := 0; i < 200; i++ {
		it := item(fmt.Sprintf("ctrl%d", i%7), fmt.Sprintf("uid-%04d", i))
		if _, err := pub.PublishWork(ctx, it); err != nil {
			t.Fatal(err)
		}
		st, _ := js.Stream(ctx, bus.WorkStream)
		raw, err := st.GetLastMsgForSubject(ctx, bus.StoredWorkSubject(it.Controller.ID(), it.Parent.UID))
		if err != nil {
			t.Fatalf("key %d not stored where the client expects: %v", i, err)
		}
		if _, _, uid, _ := bus.ParseStoredSubject(raw.Subject); uid != it.Parent.UID {
			t.Fatalf("stored subject %q", raw.Subject)
		}
	}
}

// TestScheduleRelay: a schedule fires into mc.due and the relay moves it to
// MC_WORK; a later schedule replaces an earlier one.
func TestScheduleRelay(t *testing.T) {
	js := startBus(t, bus.Options{})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	relayErrs := make(chan error, 16)
	go func() { _ = RunRelay(ctx, js, func(err error) { relayErrs <- err }) }()
	pub := Publisher{JS: js}
	it := item("sched", "99999999-2222-3333-4444-555555555555")
	it.Reason = bus.ReasonRetry
	it.Attempt = 3
	start := time.Now()
	if err := pub.Schedule(ctx, it, time.Now().Add(5*time.Minute)); err != nil {
		t.Fatalf("schedule: %v", err)
	}
	// Replace it with an earlier one: only the replacement fires.
	if err := pub.Schedule(ctx, it, time.Now().Add(1*time.Second)); err != nil {
		t.Fatalf("reschedule: %v", err)
	}
	cons, err := js.Consumer(ctx, bus.WorkStream, consumerOf(bus.WorkConsumerPrefix, it))
	if err != nil {
		t.Fatal(err)
	}
	var got *bus.WorkItem
	deadline := time.Now().Add(10 * time.Second)
	for got == nil && time.Now().Before(deadline) {
		b, err := cons.Fetch(1, jetstream.FetchMaxWait(500*time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		for m := range b.Messages() {
			var w bus.WorkItem
			if err := Decode(m, bus.TypeSyncRequested, &w); err != nil {
				t.Fatal(err)
			}
			got = &w
			_ = m.Ack()
		}
		select {
		case err := <-relayErrs:
			t.Fatalf("relay: %v", err)
		default:
		}
	}
	if got == nil {
		t.Fatal("scheduled item never reached MC_WORK")
	}
	elapsed := time.Since(start)
	t.Logf("schedule fired and was relayed after %s", elapsed.Round(time.Millisecond))
	if got.Attempt != 3 || got.Reason != bus.ReasonRetry {
		t.Errorf("relayed item = %+v", got)
	}
	if elapsed < 500*time.Millisecond {
		t.Errorf("schedule fired after %s, before it was due", elapsed)
	}
}

func TestIsAlreadyQueued(t *testing.T) {
	if IsAlreadyQueued(errors.New("x")) || IsAlreadyQueued(nil) {
		t.Error("plain errors are not 10077")
	}
}

// TestOversizeDesiredState: a desired state above max_payload fails with
// nats.ErrMaxPayload, which the dispatcher reports instead of retrying.
func TestOversizeDesiredState(t *testing.T) {
	js := startBus(t, bus.Options{})
	ds := bus.DesiredState{
		Controller: bus.ControllerRef{Kind: "CompositeController", Name: "big"},
		Parent:     bus.ObjectRef{APIVersion: "v1", Kind: "Thing", Resource: "things", Name: "a", UID: "u-1"},
		Status:     map[string]any{"blob": strings.Repeat("x", 9<<20)},
	}
	err := Publisher{JS: js}.PublishDesired(context.Background(), ds)
	if !errors.Is(err, nats.ErrMaxPayload) {
		t.Fatalf("publish of a 9 MiB desired state: %v, want nats.ErrMaxPayload", err)
	}
}

// TestPoisonMessageDeadLettered: a work item whose handler never settles it
// is redelivered with backoff up to MaxDeliver, then moved to MC_DLQ and
// deleted from MC_WORK, which frees the parent's per-subject slot (a
// WorkQueue message otherwise stays after MaxDeliver).
func TestPoisonMessageDeadLettered(t *testing.T) {
	t.Parallel() // waits out leases and AckWaits, on a server of its own
	js := startBus(t, bus.Options{WorkAckWait: 200 * time.Millisecond})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	dead := make(chan DeadLetter, 1)
	go func() { _ = RunDLQ(ctx, js, func(d DeadLetter) { dead <- d }, func(error) {}) }()
	it := item("poison", "dead-0000-1111")
	if _, err := (Publisher{JS: js}).PublishWork(ctx, it); err != nil {
		t.Fatal(err)
	}
	cons, err := js.Consumer(ctx, bus.WorkStream, consumerOf(bus.WorkConsumerPrefix, it))
	if err != nil {
		t.Fatal(err)
	}
	deliveries := 0
	deadline := time.Now().Add(20 * time.Second)
	var got DeadLetter
	for got.Subject == "" && time.Now().Before(deadline) {
		b, err := cons.Fetch(1, jetstream.FetchMaxWait(300*time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		for range b.Messages() {
			deliveries++ // never acked: a handler that crashes every time
		}
		select {
		case got = <-dead:
		default:
		}
	}
	if got.Subject == "" {
		t.Fatalf("no dead letter after %d deliveries", deliveries)
	}
	if got.Deliveries != bus.MaxDeliver || got.Parent.UID != it.Parent.UID || got.Stream != bus.WorkStream {
		t.Errorf("dead letter = %+v", got)
	}
	t.Logf("dead-lettered after %d deliveries", deliveries)
	dlq, err := js.Stream(ctx, bus.DLQStream)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := dlq.GetLastMsgForSubject(ctx, bus.DLQSubject("work", it.Controller.ID(), it.Parent.UID)); err != nil {
		t.Errorf("message not parked in %s: %v", bus.DLQStream, err)
	}
	// The slot is free again: two publishes are accepted.
	for i := 0; i < 2; i++ {
		if queued, err := (Publisher{JS: js}).PublishWork(ctx, it); err != nil || !queued {
			t.Errorf("publish %d after dead-lettering: queued=%v err=%v", i, queued, err)
		}
	}
}

// TestHeartbeatFollowsConsumerAckWait: a replica configured with a longer
// AckWait than the consumers really have (streams made by another process)
// must still keep a slow message alive, or the server would hand it to a
// second handler while the first still runs.
func TestHeartbeatFollowsConsumerAckWait(t *testing.T) {
	js := startBus(t, bus.Options{WorkAckWait: 600 * time.Millisecond})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	it := item("slow", "slow-0000-1111")
	if _, err := (Publisher{JS: js}).PublishWork(ctx, it); err != nil {
		t.Fatal(err)
	}
	var calls, done atomic.Int32
	errc := make(chan error, 1)
	go func() {
		errc <- Consume(ctx, js, ConsumeConfig{Stream: bus.WorkStream, Prefix: bus.WorkConsumerPrefix, Stage: bus.WorkStage, PerController: 2, AckWait: 30 * time.Second}, func(_ context.Context, m jetstream.Msg) outcome.Outcome {
			calls.Add(1)
			time.Sleep(2 * time.Second) // > 3 × the consumer's AckWait
			done.Add(1)
			return outcome.Done()
		})
	}()
	deadline := time.Now().Add(15 * time.Second)
	for done.Load() == 0 && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	time.Sleep(time.Second) // a redelivery would land by now
	if done.Load() == 0 || calls.Load() != 1 {
		t.Fatalf("handled %d times (%d finished), want exactly once", calls.Load(), done.Load())
	}
	cancel()
	<-errc
}

// TestRerunDesiredStateNotDropped: a work item run twice (a dispatcher
// crashed after publishing, before acking) publishes two answers; the
// second saw the cluster later and must be kept, while an identical
// republish is still dropped. With the work item alone as Nats-Msg-Id the
// second answer was dropped and its change lost (found by hack/faults).
func TestRerunDesiredStateNotDropped(t *testing.T) {
	js := startBus(t, bus.Options{})
	ctx := context.Background()
	pub := Publisher{JS: js}
	ds := bus.DesiredState{
		Controller: bus.ControllerRef{Kind: "CompositeController", Name: "c"},
		Parent:     bus.ObjectRef{APIVersion: "example.com/v1", Kind: "Thing", Resource: "things", Namespace: "ns", Name: "a", UID: "rerun-0001"},
		WorkSeq:    42, Hook: "sync", Status: map[string]any{"gen": float64(1)},
	}
	for i, st := range []map[string]any{{"gen": float64(1)}, {"gen": float64(1)}, {"gen": float64(2)}} {
		ds.Status = st
		if err := pub.PublishDesired(ctx, ds); err != nil {
			t.Fatalf("publish %d: %v", i, err)
		}
	}
	s, err := js.Stream(ctx, bus.DesiredStream)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Msgs != 2 {
		t.Errorf("%d desired states stored, want 2 (the identical republish dropped, the re-run's answer kept)", info.State.Msgs)
	}
	last, err := s.GetLastMsgForSubject(ctx, bus.StoredDesiredSubject(ds.Controller.ID(), ds.Parent.UID))
	if err != nil {
		t.Fatal(err)
	}
	var got bus.DesiredState
	if err := json.Unmarshal(last.Data, &got); err != nil || got.Status["gen"] != float64(2) {
		t.Errorf("last desired state %s (%v), want the re-run's gen 2", last.Data, err)
	}
}

// TestWaitReadyWaitsForJetStream: a server whose JetStream is not up (yet)
// is waited for, not a reason to exit; the caller's own cancellation ends
// the wait.
func TestWaitReadyWaitsForJetStream(t *testing.T) {
	s := testnats.Serve(t, &server.Options{Port: -1})
	nc, err := nats.Connect(s.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 1500*time.Millisecond)
	defer cancel()
	if err := WaitReady(ctx, js); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("WaitReady on a server without JetStream: %v, want it to wait until the caller gives up", err)
	}
}
