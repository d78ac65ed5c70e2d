package bus

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// TestMemoryQueues: an embedded server keeps MC_WORK, MC_DESIRED and the
// lease bucket in memory (the rest stays on file), and a store left by a
// file-stored release is converted when the streams are ensured again.
func TestMemoryQueues(t *testing.T) {
	js := startBus(t, Options{}) // file-stored queues, as an older release left them
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := Ensure(ctx, js, Options{MemoryQueues: true}); err != nil {
		t.Fatalf("Ensure with MemoryQueues over file-stored queues: %v", err)
	}
	for name, want := range map[string]jetstream.StorageType{
		WorkStream: jetstream.MemoryStorage, DesiredStream: jetstream.MemoryStorage,
		SchedStream: jetstream.FileStorage, DLQStream: jetstream.FileStorage,
		"KV_" + OwnersBucket: jetstream.MemoryStorage,
	} {
		st, err := js.Stream(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		if got := st.CachedInfo().Config.Storage; got != want {
			t.Errorf("%s stored as %v, want %v", name, got, want)
		}
	}
	if _, err := js.Consumer(ctx, WorkStream, PartitionConsumerName(WorkConsumerPrefix, DefaultPartitions, 0)); err != nil {
		t.Errorf("partition consumers were not recreated with the stream: %v", err)
	}
	if err := Ensure(ctx, js, Options{}); err == nil {
		t.Error("asking for file-stored queues over memory-stored ones must fail, not delete them")
	}
}
