package busstats

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/metabus/metabus/internal/testing/obstest"
	"github.com/metabus/metabus/pkg/bus"
	"github.com/metabus/metabus/pkg/embeddednats"
	"github.com/metabus/metabus/pkg/jsbus"
	"github.com/metabus/metabus/pkg/natsx"
	"github.com/metabus/metabus/pkg/outcome"
)

// TestCollectorReadsTheBus puts work items, a desired state and a dead
// letter on a real JetStream and checks what the collector reports before
// any replica consumes (everything pending, no owner) and while one holds
// every work item (acknowledgement pending, every partition owned).
func TestCollectorReadsTheBus(t *testing.T) {
	if testing.Short() {
		t.Skip("starts an embedded nats-server")
	}
	s, err := embeddednats.Start(embeddednats.Options{StoreDir: t.TempDir(), Listen: "-"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Shutdown(); s.WaitForShutdown() })
	nc, js, err := natsx.Connect(natsx.ConnOptions{InProcess: s, Name: t.Name()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := jsbus.Ensure(ctx, js, bus.Options{Partitions: 4}); err != nil {
		t.Fatal(err)
	}
	composite := bus.ControllerRef{Kind: "CompositeController", Name: "hello.world", UID: "c1"}
	decorator := bus.ControllerRef{Kind: "DecoratorController", Name: "deco", UID: "d1"}
	idle := bus.ControllerRef{Kind: "CompositeController", Name: "idle", UID: "c2"}
	parent := func(uid string) bus.ObjectRef {
		return bus.ObjectRef{APIVersion: "v1", Kind: "ConfigMap", Resource: "configmaps", Namespace: "ns", Name: uid, UID: uid}
	}
	pub := jsbus.Publisher{JS: js}
	for i := range 3 {
		if _, err := pub.PublishWork(ctx, bus.WorkItem{Controller: composite, Parent: parent(fmt.Sprint("p", i)), Reason: bus.ReasonEvent}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := pub.PublishWork(ctx, bus.WorkItem{Controller: decorator, Parent: parent("q"), Reason: bus.ReasonEvent}); err != nil {
		t.Fatal(err)
	}
	if err := pub.PublishDesired(ctx, bus.DesiredState{Controller: composite, Parent: parent("p0"), WorkSeq: 1}); err != nil {
		t.Fatal(err)
	}
	if _, err := js.Publish(ctx, bus.DLQSubject("work", composite.ID(), "dead"), []byte("{}")); err != nil {
		t.Fatal(err)
	}
	time.Sleep(1100 * time.Millisecond) // the oldest items are over a second old

	reg := prometheus.NewRegistry()
	c := NewCollector(js, CollectorOptions{
		Controllers: func() []bus.ControllerRef { return []bus.ControllerRef{composite, decorator, idle} },
		Interval:    time.Nanosecond, // read at every scrape
	})
	if err := c.Register(reg); err != nil {
		t.Fatal(err)
	}
	before := gather(t, reg)
	want := map[string]float64{
		`workqueue_depth{controller="CompositeController-hello.world",name="CompositeController-hello.world",priority=""}`: 3,
		`workqueue_depth{controller="DecoratorController-deco",name="DecoratorController-deco",priority=""}`:               1,
		`workqueue_depth{controller="CompositeController-idle",name="CompositeController-idle",priority=""}`:               0,
		`metabus_bus_queued_messages{controller="hello.world",controller_type="CompositeController",stage="work"}`:         3,
		`metabus_bus_queued_messages{controller="hello.world",controller_type="CompositeController",stage="desired"}`:      1,
		`metabus_bus_queued_messages{controller="deco",controller_type="DecoratorController",stage="work"}`:                1,
		`metabus_bus_queued_messages{controller="idle",controller_type="CompositeController",stage="work"}`:                0,
		`metabus_bus_dlq_messages{controller="hello.world",controller_type="CompositeController",stage="work"}`:            1,
		`metabus_bus_dlq_messages{controller="deco",controller_type="DecoratorController",stage="work"}`:                   0,
		`metabus_bus_stream_messages{stream="MC_WORK"}`:                                                                    4,
		`metabus_bus_stream_messages{stream="MC_DESIRED"}`:                                                                 1,
		`metabus_bus_stream_messages{stream="MC_DLQ"}`:                                                                     1,
		`metabus_bus_stream_messages{stream="MC_SCHED"}`:                                                                   0,
		`metabus_bus_partitions{stage="work"}`:                                                                             4,
		`metabus_bus_partitions_unowned{stage="work"}`:                                                                     4,
		`metabus_bus_stage_members{stage="work"}`:                                                                          0,
		`metabus_bus_stats_up`:                                      1,
		`metabus_bus_stats_detailed`:                                1,
		"sum metabus_bus_consumer_pending_messages{stage=work}":     4,
		"sum metabus_bus_consumer_ack_pending_messages{stage=work}": 0,
		"count metabus_bus_consumer_pending_messages{stage=work}":   4,
	}
	check(t, "before any replica consumes", before, want)
	for _, series := range []string{
		`metabus_bus_oldest_message_age_seconds{controller="hello.world",controller_type="CompositeController",stage="work"}`,
		`metabus_bus_stream_oldest_message_age_seconds{stream="MC_WORK"}`,
	} {
		if age := before[series]; age < 1 || age > 30 {
			t.Errorf("%s = %v, want the age of items published over a second ago", series, age)
		}
	}
	if age := before[`metabus_bus_oldest_message_age_seconds{controller="idle",controller_type="CompositeController",stage="work"}`]; age != 0 {
		t.Errorf("an idle controller's oldest age is %v, want 0", age)
	}

	// One replica takes every partition and holds every item.
	release := make(chan struct{})
	cctx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = jsbus.Consume(cctx, js, jsbus.ConsumeConfig{Stream: bus.WorkStream, Prefix: bus.WorkConsumerPrefix, Stage: bus.WorkStage},
			func(context.Context, jetstream.Msg) outcome.Outcome { <-release; return outcome.Done() })
	}()
	defer func() { close(release); stop(); <-done }()
	deadline := time.Now().Add(30 * time.Second)
	for {
		got := gather(t, reg)
		if got["sum metabus_bus_consumer_ack_pending_messages{stage=work}"] == 4 && got[`metabus_bus_partitions_unowned{stage="work"}`] == 0 {
			if got[`metabus_bus_stage_members{stage="work"}`] != 1 || got["sum metabus_bus_consumer_pending_messages{stage=work}"] != 0 {
				t.Errorf("while held: members %v, pending %v; want 1 and 0", got[`metabus_bus_stage_members{stage="work"}`], got["sum metabus_bus_consumer_pending_messages{stage=work}"])
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the replica's holding never showed: %v", got)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// Not leading: nothing is read, nothing reported.
func TestCollectorInactive(t *testing.T) {
	reg := prometheus.NewRegistry()
	c := NewCollector(nil, CollectorOptions{Active: func() bool { return false }})
	if err := c.Register(reg); err != nil {
		t.Fatal(err)
	}
	if got := gather(t, reg); len(got) != 0 {
		t.Errorf("an inactive collector reported %v, want nothing", got)
	}
}

// The process's own queues are reported whether or not it leads: they are
// its own, not the bus's.
func TestCollectorLocalQueues(t *testing.T) {
	reg := prometheus.NewRegistry()
	c := NewCollector(nil, CollectorOptions{
		Active: func() bool { return false },
		LocalQueues: func() map[string]int {
			return map[string]int{"composite-metacontroller": 2, "decorator-metacontroller": 0}
		},
	})
	if err := c.Register(reg); err != nil {
		t.Fatal(err)
	}
	want := map[string]float64{
		`workqueue_depth{controller="composite-metacontroller",name="composite-metacontroller",priority=""}`: 2,
		`workqueue_depth{controller="decorator-metacontroller",name="decorator-metacontroller",priority=""}`: 0,
	}
	if diff := cmp.Diff(want, gather(t, reg)); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
}

// gather flattens a registry to "name{labels}" → value, plus "sum" and
// "count" entries per (name, stage) of the per-partition series.
func gather(t *testing.T, reg *prometheus.Registry) map[string]float64 {
	t.Helper()
	out := map[string]float64{}
	obstest.Each(t, reg, func(mf *dto.MetricFamily, m *dto.Metric, key string, v float64) {
		out[key] = v
		if strings.HasPrefix(mf.GetName(), "metabus_bus_consumer_") {
			stage := ""
			for _, l := range m.GetLabel() {
				if l.GetName() == "stage" {
					stage = l.GetValue()
				}
			}
			out["sum "+mf.GetName()+"{stage="+stage+"}"] += v
			out["count "+mf.GetName()+"{stage="+stage+"}"]++
		}
	})
	return out
}

func check(t *testing.T, when string, got, want map[string]float64) {
	t.Helper()
	picked := map[string]float64{}
	for k := range want {
		if v, ok := got[k]; ok {
			picked[k] = v
		}
	}
	if diff := cmp.Diff(want, picked); diff != "" {
		t.Errorf("%s (-want +got):\n%s", when, diff)
	}
}

// BenchmarkRead prints what one reading of the bus costs the process that
// takes it (the leading watcher, at most once per scrape interval), with 64
// partitions per stage and an embedded server (whose own work is counted
// too): an idle bus, and 2,000 waiting work items and 2,000 desired states
// of 10 controllers.
func BenchmarkRead(b *testing.B) {
	for _, items := range []int{0, 2000} {
		b.Run(fmt.Sprintf("items=%d", items), func(b *testing.B) { benchmarkRead(b, items) })
	}
}

func benchmarkRead(b *testing.B, items int) {
	s, err := embeddednats.Start(embeddednats.Options{StoreDir: b.TempDir(), Listen: "-"})
	if err != nil {
		b.Fatal(err)
	}
	defer func() { s.Shutdown(); s.WaitForShutdown() }()
	nc, js, err := natsx.Connect(natsx.ConnOptions{InProcess: s, Name: b.Name()})
	if err != nil {
		b.Fatal(err)
	}
	defer nc.Close()
	ctx := context.Background()
	if err := jsbus.Ensure(ctx, js, bus.Options{Partitions: 64}); err != nil {
		b.Fatal(err)
	}
	pub := jsbus.Publisher{JS: js}
	for i := range items {
		ctrl := bus.ControllerRef{Kind: "CompositeController", Name: fmt.Sprint("c", i%10)}
		p := bus.ObjectRef{APIVersion: "v1", Kind: "ConfigMap", Namespace: "ns", Name: fmt.Sprint("p", i), UID: fmt.Sprint("uid-", i)}
		if _, err := pub.PublishWork(ctx, bus.WorkItem{Controller: ctrl, Parent: p, Reason: bus.ReasonEvent}); err != nil {
			b.Fatal(err)
		}
		if err := pub.PublishDesired(ctx, bus.DesiredState{Controller: ctrl, Parent: p, WorkSeq: uint64(i + 1)}); err != nil {
			b.Fatal(err)
		}
	}
	wantQueues := min(items, 10) * 2
	b.ResetTimer()
	for b.Loop() {
		st, err := Read(ctx, js, Options{})
		if err != nil {
			b.Fatal(err)
		}
		if len(st.Queues) != wantQueues || len(st.Partitions) != 128 {
			b.Fatalf("%d queues, %d partitions", len(st.Queues), len(st.Partitions))
		}
	}
}
