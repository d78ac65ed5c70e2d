package dispatcher

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/zap"

	"github.com/metabus/metabus/internal/testing/natstest"
	"github.com/metabus/metabus/pkg/bus"
	"github.com/metabus/metabus/pkg/jsbus"
)

// workMsg is a work item as the work consumer hands it over (only what
// putOff reads).
type workMsg struct {
	jetstream.Msg
	m *nats.Msg
}

func (w workMsg) Subject() string      { return w.m.Subject }
func (w workMsg) Headers() nats.Header { return w.m.Header }
func (w workMsg) Data() []byte         { return w.m.Data }

// TestPutOff (issue 35, item 5): a work item beyond its controller's
// headroom is scheduled again in MC_SCHED, unchanged (its reason and
// attempt kept), for the time the consumer asks, and counted; a malformed
// one is refused (the consumer then takes it in hand, and the handler
// terms it), nothing scheduled.
func TestPutOff(t *testing.T) {
	_, js := natstest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := jsbus.Ensure(ctx, js, bus.Options{}); err != nil {
		t.Fatal(err)
	}
	d := &Dispatcher{log: zap.NewNop(), pub: jsbus.Publisher{JS: js}, metrics: newMetrics(prometheus.NewRegistry())}
	it := bus.WorkItem{Controller: bus.ControllerRef{Kind: "CompositeController", Name: "hang"}, Reason: bus.ReasonRetry, Attempt: 3,
		Parent: bus.ObjectRef{APIVersion: "example.com/v1", Kind: "Thing", Resource: "things", Namespace: "ns", Name: "a", UID: "hang-0001"}}
	subject, err := bus.WorkSubject(it.Controller.ID(), it.Parent.UID)
	if err != nil {
		t.Fatal(err)
	}
	m, err := jsbus.NewMsg(ctx, subject, bus.TypeSyncRequested, "", it.Controller, it.Parent, it, map[string]string{bus.ExtReason: it.Reason})
	if err != nil {
		t.Fatal(err)
	}
	at := time.Now().Add(time.Hour)
	if err := d.putOff(ctx, workMsg{m: m}, at); err != nil {
		t.Fatalf("put off: %v", err)
	}
	sched, err := js.Stream(ctx, bus.SchedStream)
	if err != nil {
		t.Fatal(err)
	}
	schedSubject, err := bus.SchedSubject(it.Controller.ID(), it.Parent.UID)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := sched.GetLastMsgForSubject(ctx, schedSubject)
	if err != nil {
		t.Fatalf("no schedule for the item put off: %v", err)
	}
	var got bus.WorkItem
	if err := bus.DecodeEvent(raw.Subject, bus.Header(raw.Header), raw.Data, bus.TypeSyncRequested, &got); err != nil {
		t.Fatal(err)
	}
	if got.Reason != it.Reason || got.Attempt != it.Attempt || got.Parent.UID != it.Parent.UID {
		t.Errorf("scheduled %+v, want the item put off %+v", got, it)
	}
	when, err := time.Parse(time.RFC3339, raw.Header.Get("Nats-Schedule")[len("@at "):])
	if err != nil || when.Before(at.Truncate(time.Second)) || when.After(at.Add(time.Second)) {
		t.Errorf("scheduled at %q, want %s", raw.Header.Get("Nats-Schedule"), at.Format(time.RFC3339))
	}
	if n := testutil.ToFloat64(d.metrics.putOff.WithLabelValues("CompositeController", "hang")); n != 1 {
		t.Errorf("%v items counted as put off, want 1", n)
	}

	bad := &nats.Msg{Subject: subject, Header: nats.Header{}, Data: []byte("{")}
	if err := d.putOff(ctx, workMsg{m: bad}, at); err == nil {
		t.Error("a malformed work item was put off")
	}
	if n := testutil.ToFloat64(d.metrics.putOff.WithLabelValues("CompositeController", "hang")); n != 1 {
		t.Errorf("%v items counted as put off after a malformed one, want 1", n)
	}
	if _, err := sched.GetMsg(ctx, raw.Sequence+1); !errors.Is(err, jetstream.ErrMsgNotFound) {
		t.Errorf("something was scheduled for the malformed item: %v", err)
	}
}
