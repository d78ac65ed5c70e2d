package jsbus_test

// Benchmarks of the bus on an in-process embedded JetStream server (file
// store, default fsync), the setting metabus ships. They print figures;
// they assert nothing about speed.
//
//	go test -run '^$' -bench . -benchmem ./pkg/bus/

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	cejs "github.com/cloudevents/sdk-go/protocol/nats_jetstream/v2"
	cloudevents "github.com/cloudevents/sdk-go/v2"
	"github.com/cloudevents/sdk-go/v2/binding"
	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/metabus/metabus/pkg/bus"
	"github.com/metabus/metabus/pkg/embeddednats"
	"github.com/metabus/metabus/pkg/jsbus"
	"github.com/metabus/metabus/pkg/natsx"
	"github.com/metabus/metabus/pkg/outcome"
)

// benchBus starts an embedded server with the metabus streams and returns a
// JetStream handle on an in-process connection. Setup is not timed.
func benchBus(b *testing.B) jetstream.JetStream { return benchBusWith(b, false) }

// benchBusWith starts an embedded server with metabus's streams, with
// MC_WORK and MC_DESIRED in memory as the all-in-one keeps them
// (bus.Options.MemoryQueues) or on file as a standalone NATS does. The
// partition consumers' state is in memory either way (their config says so).
func benchBusWith(b *testing.B, memoryQueues bool) jetstream.JetStream {
	b.Helper()
	b.StopTimer()
	defer b.StartTimer()
	s, err := embeddednats.Start(embeddednats.Options{StoreDir: b.TempDir(), Listen: "-"})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { s.Shutdown(); s.WaitForShutdown() })
	nc, js, err := natsx.Connect(natsx.ConnOptions{InProcess: s, Name: b.Name()})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(nc.Close)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := jsbus.Ensure(ctx, js, bus.Options{MemoryQueues: memoryQueues}); err != nil {
		b.Fatalf("Ensure: %v", err)
	}
	return js
}

// benchPadding pads a work item's freshness map so its JSON body is about
// 1 KB, a typical work item's size. Built once; shared read-only.
var benchPadding = sync.OnceValue(func() map[string]string {
	m := map[string]string{}
	for k := 0; ; k++ {
		it := benchItemWith(0, m)
		if data, _ := json.Marshal(it); len(data) >= 1024 {
			return m
		}
		m[fmt.Sprintf("group%02d.example.com/resource%02d", k, k)] = "1234567890"
	}
})

// benchItem is a ~1 KB work item for parent number i.
func benchItem(i int) bus.WorkItem { return benchItemWith(i, benchPadding()) }

func benchItemWith(i int, rvs map[string]string) bus.WorkItem {
	return bus.WorkItem{
		Controller: bus.ControllerRef{Kind: "CompositeController", Name: "bench-controller", UID: "0b6f3c3e-8d1c-4a53-9f0e-4f7f2a9c1d10"},
		Parent: bus.ObjectRef{
			APIVersion: "test.metabus.dev/v1", Kind: "Widget", Resource: "widgets",
			Namespace: "bench", Name: fmt.Sprintf("widget-%07d", i), UID: benchUID(i),
			ResourceVersion: "123456", Generation: 3,
		},
		Reason:              bus.ReasonEvent,
		MinResourceVersions: rvs,
	}
}

// benchUID is a deterministic UUID for parent number i. It must look random
// like a Kubernetes UID: the server's slot transform is FNV-1a mod 1024,
// whose low bits spread structured keys badly (UIDs differing only in a
// counter, like %08x-…-%012x of i, land in only 16 of the 64 partitions).
func benchUID(i int) string {
	return uuid.NewSHA1(uuid.NameSpaceOID, []byte(strconv.Itoa(i))).String()
}

// cpuTime is the CPU time this process (client and embedded server) used
// so far.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func perSecond(b *testing.B, n int) float64 {
	if s := b.Elapsed().Seconds(); s > 0 {
		return float64(n) / s
	}
	return 0
}

func reportPercentiles(b *testing.B, lat []time.Duration, unit time.Duration, suffix string) {
	if len(lat) == 0 {
		return
	}
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	pct := func(p float64) float64 {
		i := int(p * float64(len(lat)-1))
		return float64(lat[i]) / float64(unit)
	}
	b.ReportMetric(pct(0.50), "p50-"+suffix)
	b.ReportMetric(pct(0.99), "p99-"+suffix)
	// The maximum shows partition stalls: a partition whose pull request
	// is lost waits for the client's missing-heartbeat timer (2 × pullHeartbeat).
	b.ReportMetric(float64(lat[len(lat)-1])/float64(time.Millisecond), "max-ms")
}

// BenchmarkPublishWork publishes 1 KB work items to MC_WORK the way the
// watcher does (synchronous publish, 10077 counted as success).
//
//   - new: every item is a different parent, so every publish is stored;
//   - already-queued: the same parent over and over; after two stored items
//     every publish is refused with 10077, the watcher's common case for a
//     busy parent;
//   - parallel: new parents from GOMAXPROCS×8 goroutines, like the watcher's
//     publish workers (throughput rather than latency).
func BenchmarkPublishWork(b *testing.B) {
	b.Run("new", func(b *testing.B) {
		js := benchBus(b)
		pub := jsbus.Publisher{JS: js}
		ctx := context.Background()
		items := make([]bus.WorkItem, b.N)
		for i := range items {
			items[i] = benchItem(i)
		}
		b.ReportAllocs()
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			queued, err := pub.PublishWork(ctx, items[i])
			if err != nil || !queued {
				b.Fatalf("publish %d: queued=%v err=%v", i, queued, err)
			}
		}
		b.StopTimer()
		b.ReportMetric(perSecond(b, b.N), "msgs/s")
	})
	b.Run("already-queued", func(b *testing.B) {
		js := benchBus(b)
		pub := jsbus.Publisher{JS: js}
		ctx := context.Background()
		it := benchItem(1)
		for i := 0; i < 2; i++ {
			if _, err := pub.PublishWork(ctx, it); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportAllocs()
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			queued, err := pub.PublishWork(ctx, it)
			if err != nil || queued {
				b.Fatalf("publish %d: queued=%v err=%v, want already queued", i, queued, err)
			}
		}
		b.StopTimer()
		b.ReportMetric(perSecond(b, b.N), "msgs/s")
	})
	b.Run("parallel", func(b *testing.B) {
		js := benchBus(b)
		pub := jsbus.Publisher{JS: js}
		ctx := context.Background()
		var next atomic.Int64
		b.SetParallelism(8)
		b.ReportAllocs()
		b.ResetTimer()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				it := benchItem(int(next.Add(1)))
				if queued, err := pub.PublishWork(ctx, it); err != nil || !queued {
					b.Errorf("publish: queued=%v err=%v", queued, err)
					return
				}
			}
		})
		b.StopTimer()
		b.ReportMetric(perSecond(b, b.N), "msgs/s")
	})
}

// BenchmarkWorkRoundTrip measures publish → Consume handler →
// ack through MC_WORK's partition consumers (MaxAckPending 1 each) with
// the dispatcher's default 16 workers. The handler decodes the item as the
// dispatcher does.
//
//   - serial: one message at a time (an idle system); latency is from the
//     start of the publish to the handler receiving the message, and the
//     next publish waits for the ack;
//   - pipelined: 16 publishers push b.N different parents as fast as they
//     can; throughput is until the last one is acked, latency per message
//     includes queueing behind busy partitions;
//   - */memory-queues: the same with MC_WORK in memory, as in the
//     all-in-one process (bus.Options.MemoryQueues).
func BenchmarkWorkRoundTrip(b *testing.B) {
	run := func(b *testing.B, publishers int, memoryQueues bool) {
		js := benchBusWith(b, memoryQueues)
		pub := jsbus.Publisher{JS: js}
		ctx, cancel := context.WithCancel(context.Background())
		var mu sync.Mutex
		lat := make([]time.Duration, 0, b.N)
		var handled atomic.Int64
		signal := make(chan struct{}, 1)
		stopped := make(chan error, 1)
		go func() {
			stopped <- jsbus.Consume(ctx, js, jsbus.ConsumeConfig{Stream: bus.WorkStream, Prefix: bus.WorkConsumerPrefix, Stage: bus.WorkStage, PerController: 16, AckWait: bus.WorkAckWait},
				func(_ context.Context, m jetstream.Msg) outcome.Outcome {
					now := time.Now()
					var it bus.WorkItem
					if err := jsbus.Decode(m, bus.TypeSyncRequested, &it); err != nil {
						b.Errorf("decode: %v", err)
					}
					mu.Lock()
					lat = append(lat, now.Sub(it.EnqueuedAt))
					mu.Unlock()
					handled.Add(1)
					select {
					case signal <- struct{}{}:
					default:
					}
					return outcome.Done()
				})
		}()
		defer func() {
			cancel()
			if err := <-stopped; err != nil {
				b.Errorf("Consume: %v", err)
			}
		}()
		// Warm up: one message through every partition, so every pull is
		// open before timing starts.
		b.StopTimer()
		seen := map[int]bool{}
		for i := 1 << 30; len(seen) < bus.DefaultPartitions; i++ {
			warm := benchItem(i)
			p := bus.PartitionOf(bus.Slot(warm.Controller.ID(), warm.Parent.UID), bus.DefaultPartitions)
			if seen[p] {
				continue
			}
			seen[p] = true
			if _, err := pub.PublishWork(ctx, warm); err != nil {
				b.Fatal(err)
			}
		}
		waitHandled(b, &handled, signal, bus.DefaultPartitions)
		mu.Lock()
		lat = lat[:0]
		mu.Unlock()
		handled.Store(0)
		items := make([]bus.WorkItem, b.N)
		for i := range items {
			items[i] = benchItem(i)
		}
		b.StartTimer()
		b.ResetTimer()
		cpu0 := cpuTime()

		if publishers <= 1 {
			for i := 0; i < b.N; i++ {
				items[i].EnqueuedAt = time.Now()
				if _, err := pub.PublishWork(ctx, items[i]); err != nil {
					b.Fatal(err)
				}
				waitHandled(b, &handled, signal, int64(i+1))
			}
		} else {
			var next atomic.Int64
			var wg sync.WaitGroup
			for p := 0; p < publishers; p++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for {
						i := int(next.Add(1)) - 1
						if i >= b.N {
							return
						}
						items[i].EnqueuedAt = time.Now()
						if _, err := pub.PublishWork(ctx, items[i]); err != nil {
							b.Errorf("publish: %v", err)
							return
						}
					}
				}()
			}
			wg.Wait()
			waitHandled(b, &handled, signal, int64(b.N))
		}
		b.StopTimer()
		b.ReportMetric(float64(cpuTime()-cpu0)/float64(time.Microsecond)/float64(b.N), "cpu-µs/msg")
		b.ReportMetric(perSecond(b, b.N), "msgs/s")
		mu.Lock()
		reportPercentiles(b, lat, time.Microsecond, "µs")
		mu.Unlock()
	}
	b.Run("serial", func(b *testing.B) { run(b, 1, false) })
	b.Run("pipelined", func(b *testing.B) { run(b, 16, false) })
	// The same with the partition consumers' state kept in memory: what the
	// file-store consumer state (a state file rewritten up to 10 times a
	// second per consumer, 128 consumers) costs.
	b.Run("serial/memory-queues", func(b *testing.B) { run(b, 1, true) })
	b.Run("pipelined/memory-queues", func(b *testing.B) { run(b, 16, true) })
}

func waitHandled(b *testing.B, handled *atomic.Int64, signal <-chan struct{}, n int64) {
	b.Helper()
	deadline := time.After(60 * time.Second)
	for handled.Load() < n {
		select {
		case <-signal:
		case <-time.After(10 * time.Millisecond):
		case <-deadline:
			b.Fatalf("only %d of %d messages handled after 60s", handled.Load(), n)
		}
	}
}

// BenchmarkNewMsg is the cost of wrapping a 1 KB work item in a binary-mode
// CloudEvent (jsbus.NewMsg), against the bare json.Marshal of the same body
// that it necessarily includes.
func BenchmarkNewMsg(b *testing.B) {
	it := benchItem(7)
	it.EnqueuedAt = time.Now()
	ctx := context.Background()
	subject, err := bus.WorkSubject(it.Controller.ID(), it.Parent.UID)
	if err != nil {
		b.Fatal(err)
	}
	b.Run("cloudevent", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			m, err := jsbus.NewMsg(ctx, subject, bus.TypeSyncRequested, "", it.Controller, it.Parent, it,
				map[string]string{bus.ExtReason: it.Reason})
			if err != nil || len(m.Data) < 1024 {
				b.Fatalf("NewMsg: %v (%d bytes)", err, len(m.Data))
			}
		}
	})
	// sdk is the same event through the CloudEvents sdk's event and
	// binding (what NewMsg did before it wrote the headers itself).
	b.Run("sdk", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			m, err := sdkMsg(ctx, subject, bus.TypeSyncRequested, "", it.Controller, it.Parent, it,
				map[string]string{bus.ExtReason: it.Reason})
			if err != nil || len(m.Data) < 1024 {
				b.Fatalf("sdkMsg: %v", err)
			}
		}
	})
	b.Run("json-only", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			data, err := json.Marshal(it)
			if err != nil || len(data) < 1024 {
				b.Fatalf("marshal: %v", err)
			}
		}
	})
}

// sdkMsg builds jsbus.NewMsg's message with the CloudEvents sdk: the
// reference NewMsg's hand-written headers are held to.
func sdkMsg(ctx context.Context, subject, ceType, id string, ctrl bus.ControllerRef, parent bus.ObjectRef, body any, ext map[string]string) (*nats.Msg, error) {
	data, err := json.Marshal(body)
	if err != nil {
		return nil, err
	}
	ev := cloudevents.NewEvent()
	if id == "" {
		id = uuid.NewString()
	}
	ev.SetID(id)
	ev.SetType(ceType)
	ev.SetSource(bus.ControllerSource(ctrl))
	ev.SetSubject(bus.ObjectPath(parent))
	ev.SetTime(time.Now())
	if err := ev.SetData(cloudevents.ApplicationJSON, data); err != nil {
		return nil, err
	}
	ev.SetExtension(bus.ExtPartitionKey, ctrl.ID()+"/"+parent.UID)
	ev.SetExtension(bus.ExtParentUID, parent.UID)
	if parent.ResourceVersion != "" {
		ev.SetExtension(bus.ExtParentRV, parent.ResourceVersion)
	}
	if ctrl.Weight > 1 {
		ev.SetExtension(bus.ExtWeight, strconv.Itoa(ctrl.Weight))
	}
	for k, v := range ext {
		ev.SetExtension(k, v)
	}
	if err := ev.Validate(); err != nil {
		return nil, err
	}
	var buf bytes.Buffer
	hdr, err := cejs.WriteMsg(ctx, binding.ToMessage(&ev), &buf)
	if err != nil {
		return nil, err
	}
	return &nats.Msg{Subject: subject, Header: hdr, Data: buf.Bytes()}, nil
}

// TestNewMsgMatchesSDK: NewMsg's headers decode, with the CloudEvents sdk,
// to the event the sdk itself writes for the same input.
func TestNewMsgMatchesSDK(t *testing.T) {
	ctx := context.Background()
	it := benchItem(3)
	weighted := it.Controller
	weighted.Weight = 7
	noRV := it.Parent
	noRV.ResourceVersion = ""
	for _, tc := range []struct {
		reason string
		ctrl   bus.ControllerRef
		parent bus.ObjectRef
		id     string
		ext    map[string]string
	}{
		{reason: "a work item with a reason", ctrl: it.Controller, parent: it.Parent, ext: map[string]string{bus.ExtReason: "event"}},
		{reason: "a desired state with a fixed id and a work sequence", ctrl: it.Controller, parent: it.Parent, id: "uid:42:abc", ext: map[string]string{bus.ExtWorkSeq: bus.WorkSeqString(42)}},
		{reason: "a weighted controller", ctrl: weighted, parent: it.Parent},
		{reason: "no parent resourceVersion", ctrl: it.Controller, parent: noRV},
	} {
		t.Run(tc.reason, func(t *testing.T) {
			mine, err := jsbus.NewMsg(ctx, "mc.work.x.y", bus.TypeSyncRequested, tc.id, tc.ctrl, tc.parent, it, tc.ext)
			if err != nil {
				t.Fatal(err)
			}
			ref, err := sdkMsg(ctx, "mc.work.x.y", bus.TypeSyncRequested, tc.id, tc.ctrl, tc.parent, it, tc.ext)
			if err != nil {
				t.Fatal(err)
			}
			if err := sameEvent(ctx, ref, mine); err != nil {
				t.Errorf("NewMsg's event differs from the sdk's: %v", err)
			}
			if tc.id != "" && mine.Header.Get("ce-id") != tc.id {
				t.Errorf("ce-id %q, want %q", mine.Header.Get("ce-id"), tc.id)
			}
		})
	}
	if _, err := jsbus.NewMsg(ctx, "mc.work.x.y", bus.TypeSyncRequested, "", it.Controller, it.Parent, it, map[string]string{"Bad-Name": "x"}); err == nil {
		t.Error("an extension name with upper case and a dash was accepted")
	}
}

// sameEvent decodes both messages with the CloudEvents sdk and compares
// them, ignoring id and time.
func sameEvent(ctx context.Context, a, b *nats.Msg) error {
	ea, err := binding.ToEvent(ctx, cejs.NewMessage(a))
	if err != nil {
		return fmt.Errorf("decode NewMsg's: %w", err)
	}
	eb, err := binding.ToEvent(ctx, cejs.NewMessage(b))
	if err != nil {
		return fmt.Errorf("decode hand-built: %w", err)
	}
	if err := eb.Validate(); err != nil {
		return err
	}
	eb.SetID(ea.ID())
	eb.SetTime(ea.Time())
	ja, _ := json.Marshal(ea)
	jb, _ := json.Marshal(eb)
	if string(ja) != string(jb) {
		return fmt.Errorf("\n%s\n%s", ja, jb)
	}
	return nil
}
