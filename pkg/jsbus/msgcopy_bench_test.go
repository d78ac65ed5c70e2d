package jsbus

import (
	"context"
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/metabus/metabus/internal/testing/natstest"
	"github.com/metabus/metabus/pkg/bus"
)

// BenchmarkHeldMessage prints the live heap one delivered work item costs
// while an owner holds it (B/held): the client's message, and the copy
// the partition consumers hand to owners (msgCopy), and what copying
// takes (ns-copying/msg). It asserts nothing.
//
//	go test -run '^$' -bench HeldMessage -benchtime 1x ./pkg/jsbus/
func BenchmarkHeldMessage(b *testing.B) {
	for _, copied := range []bool{false, true} {
		name := "client"
		if copied {
			name = "copy"
		}
		b.Run(name, func(b *testing.B) {
			const n = 2000
			nc, js := natstest.Start(b)
			ctx := context.Background()
			if _, err := js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{Name: "B", Subjects: []string{"b.>"}, Storage: jetstream.MemoryStorage}); err != nil {
				b.Fatal(err)
			}
			for i := range n {
				it := item("bench-controller", fmt.Sprintf("%08d-8d1c-4a53-9f0e-4f7f2a9c1d10", i))
				it.Parent.ResourceVersion = "123456"
				m, err := NewMsg(ctx, "b."+it.Parent.UID, bus.TypeSyncRequested, "", it.Controller, it.Parent, it, map[string]string{bus.ExtReason: bus.ReasonEvent})
				if err != nil {
					b.Fatal(err)
				}
				if _, err := js.PublishMsg(ctx, m); err != nil {
					b.Fatal(err)
				}
			}
			c, err := js.CreateOrUpdateConsumer(ctx, "B", jetstream.ConsumerConfig{Durable: "held", AckPolicy: jetstream.AckExplicitPolicy, MaxAckPending: n})
			if err != nil {
				b.Fatal(err)
			}
			for b.Loop() {
				held := make([]jetstream.Msg, 0, n)
				before := liveHeap()
				batch, err := c.Fetch(n, jetstream.FetchMaxWait(10*time.Second))
				if err != nil {
					b.Fatal(err)
				}
				var copying time.Duration
				for m := range batch.Messages() {
					if copied {
						start := time.Now()
						m = copyMsg(nc, m)
						copying += time.Since(start)
					}
					held = append(held, m)
				}
				if len(held) != n {
					b.Fatalf("fetched %d of %d", len(held), n)
				}
				b.ReportMetric(float64(liveHeap()-before)/n, "B/held")
				b.ReportMetric(float64(len(held[0].Data())), "B-body")
				b.ReportMetric(float64(copying.Nanoseconds())/n, "ns-copying/msg")
				for _, m := range held {
					_ = m.Nak()
				}
			}
		})
	}
}

// liveHeap is the heap's live bytes after a full collection.
func liveHeap() uint64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}
