package jsbus

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/metabus/metabus/pkg/bus"
)

// TestMemoryQueues: an embedded server keeps MC_WORK, MC_DESIRED and the
// lease bucket in memory (the rest stays on file), and a store left by a
// file-stored release is converted when the streams are ensured again.
func TestMemoryQueues(t *testing.T) {
	js := startBus(t, bus.Options{}) // file-stored queues, as an older release left them
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := Ensure(ctx, js, bus.Options{MemoryQueues: true}); err != nil {
		t.Fatalf("Ensure with MemoryQueues over file-stored queues: %v", err)
	}
	for name, want := range map[string]jetstream.StorageType{
		bus.WorkStream: jetstream.MemoryStorage, bus.DesiredStream: jetstream.MemoryStorage,
		bus.SchedStream: jetstream.FileStorage, bus.DLQStream: jetstream.FileStorage,
		"KV_" + bus.OwnersBucket: jetstream.MemoryStorage,
	} {
		st, err := js.Stream(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		if got := st.CachedInfo().Config.Storage; got != want {
			t.Errorf("%s stored as %v, want %v", name, got, want)
		}
	}
	if _, err := js.Consumer(ctx, bus.WorkStream, bus.PartitionConsumerName(bus.WorkConsumerPrefix, bus.DefaultPartitions, 0)); err != nil {
		t.Errorf("partition consumers were not recreated with the stream: %v", err)
	}
	if err := Ensure(ctx, js, bus.Options{}); err == nil {
		t.Error("asking for file-stored queues over memory-stored ones must fail, not delete them")
	}
}
