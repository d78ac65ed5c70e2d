package jsbus

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/metabus/metabus/internal/testing/natstest"
	"github.com/metabus/metabus/internal/testing/testnats"
	"github.com/metabus/metabus/pkg/bus"
	"github.com/metabus/metabus/pkg/embeddednats"
	"github.com/metabus/metabus/pkg/natsx"
	"github.com/metabus/metabus/pkg/outcome"
)

// TestConsumersSurviveServerRestart: the partition consumers keep their
// state in memory, so a restarted server (same store) has lost them.
// KeepConsumers must recreate them and Consume must resume on its
// own: a work item stored before the restart, and one published after it,
// are both handled.
func TestConsumersSurviveServerRestart(t *testing.T) {
	dir := t.TempDir()
	// The server binds the same port again after its restart: a port
	// below the ephemeral range, which no outgoing connection takes
	// meanwhile.
	port, err := testnats.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	start := func() func() {
		s, err := embeddednats.Start(embeddednats.Options{StoreDir: dir, Listen: addr})
		if err != nil {
			t.Fatal(err)
		}
		return func() { s.Shutdown(); s.WaitForShutdown() }
	}
	stop := start()
	nc, js, err := natsx.Connect(natsx.ConnOptions{URL: "nats://" + addr, Name: t.Name()})
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	o := bus.Options{WorkAckWait: 3 * time.Second, DesiredAckWait: 3 * time.Second}
	if err := Ensure(ctx, js, o); err != nil {
		t.Fatal(err)
	}
	go KeepConsumers(ctx, js, o, 200*time.Millisecond, func(err error) { t.Logf("keeper: %v", err) }, nil)

	var mu sync.Mutex
	seen := map[string]bool{}
	handled := make(chan string, 16)
	cctx, ccancel := context.WithCancel(ctx)
	defer ccancel()
	go func() {
		_ = Consume(cctx, js, ConsumeConfig{Stream: bus.WorkStream, Prefix: bus.WorkConsumerPrefix, Stage: bus.WorkStage, PerController: 4, AckWait: o.WorkAckWait}, func(_ context.Context, m jetstream.Msg) outcome.Outcome {
			var it bus.WorkItem
			if err := Decode(m, bus.TypeSyncRequested, &it); err == nil {
				mu.Lock()
				seen[it.Parent.UID] = true
				mu.Unlock()
				handled <- it.Parent.UID
			}
			return outcome.Done()
		})
	}()
	pub := Publisher{JS: js}
	waitFor := func(uid string) {
		t.Helper()
		deadline := time.After(30 * time.Second)
		for {
			mu.Lock()
			ok := seen[uid]
			mu.Unlock()
			if ok {
				return
			}
			select {
			case <-handled:
			case <-deadline:
				t.Fatalf("work item %s not handled within 30s", uid)
			}
		}
	}
	if _, err := pub.PublishWork(ctx, item("c", "before")); err != nil {
		t.Fatal(err)
	}
	waitFor("before")

	stop()
	stop = start()
	defer func() { stop() }()
	for i := 0; ; i++ {
		pctx, pcancel := context.WithTimeout(ctx, 2*time.Second)
		_, err := pub.PublishWork(pctx, item("c", "after"))
		pcancel()
		if err == nil {
			break
		}
		if i > 50 {
			t.Fatalf("publish after restart: %v", err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	waitFor("after")
	for p := 0; p < bus.DefaultPartitions; p++ {
		if _, err := js.Consumer(ctx, bus.WorkStream, bus.PartitionConsumerName(bus.WorkConsumerPrefix, bus.DefaultPartitions, p)); err != nil {
			t.Fatalf("partition %d after restart: %v", p, err)
		}
	}
}

// TestKeepConsumersReportsRecreatedStreams: a stream created anew (a NATS
// cluster that lost its data) lost what it held; KeepConsumers recreates
// it and reports it, so the watcher resyncs, and reports nothing while the
// streams stay the same.
func TestKeepConsumersReportsRecreatedStreams(t *testing.T) {
	_, js := natstest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	o := bus.Options{}
	if err := Ensure(ctx, js, o); err != nil {
		t.Fatal(err)
	}
	recreated := make(chan string, 16)
	go KeepConsumers(ctx, js, o, 100*time.Millisecond, func(err error) { t.Logf("keeper: %v", err) },
		func(stream string) { recreated <- stream })

	select {
	case s := <-recreated:
		t.Fatalf("%s reported recreated while nothing changed", s)
	case <-time.After(time.Second):
	}
	for range 2 { // each loss is reported
		if err := js.DeleteStream(ctx, bus.WorkStream); err != nil {
			t.Fatal(err)
		}
		select {
		case s := <-recreated:
			if s != bus.WorkStream {
				t.Fatalf("reported %s, want %s", s, bus.WorkStream)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("%s deleted and not reported recreated", bus.WorkStream)
		}
		if _, err := js.Stream(ctx, bus.WorkStream); err != nil {
			t.Fatalf("%s not recreated: %v", bus.WorkStream, err)
		}
	}
}
