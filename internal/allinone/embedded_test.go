package allinone

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/metabus/metabus/pkg/bus"
	"github.com/metabus/metabus/services/watcher"
)

// With its embedded server, the all-in-one's watcher keeps the work queues
// in memory, in the embedded layout, which its stages read once
// (FixedLayout), and checks them once a minute; what the command line set
// is kept.
func TestEmbeddedWatcher(t *testing.T) {
	type got struct {
		Memory     bool
		Partitions int
		Keep       time.Duration
		Fixed      bool
	}
	cases := []struct {
		reason string
		in     watcher.Config
		want   got
	}{
		{reason: "defaults: memory queues, the embedded layout, a check a minute", in: watcher.Config{},
			want: got{Memory: true, Partitions: bus.EmbeddedPartitions, Keep: EmbeddedKeepConsumersEvery, Fixed: true}},
		{reason: "a partition count asked for is kept",
			in:   watcher.Config{Bus: bus.Options{Partitions: 64}},
			want: got{Memory: true, Partitions: 64, Keep: EmbeddedKeepConsumersEvery, Fixed: true}},
		{reason: "a check interval set is kept",
			in:   watcher.Config{KeepConsumersEvery: 5 * time.Second},
			want: got{Memory: true, Partitions: bus.EmbeddedPartitions, Keep: 5 * time.Second, Fixed: true}},
	}
	for _, c := range cases {
		t.Run(c.reason, func(t *testing.T) {
			w := embeddedWatcher(c.in)
			if diff := cmp.Diff(c.want, got{w.Bus.MemoryQueues, w.Bus.Partitions, w.KeepConsumersEvery, w.Bus.FixedLayout}); diff != "" {
				t.Errorf("embeddedWatcher (-want +got):\n%s", diff)
			}
		})
	}
}
