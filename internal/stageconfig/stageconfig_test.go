package stageconfig

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/metabus/metabus/internal/allinone"
	"github.com/metabus/metabus/pkg/apply"
	"github.com/metabus/metabus/pkg/cli"
)

// TestAllInOneMatchesStages: every stage of the all-in-one gets the
// common flags exactly as its own binary does, and each value reaches the
// field that uses it.
func TestAllInOneMatchesStages(t *testing.T) {
	f := &cli.CommonFlags{Workers: 7, MaxInFlight: 99, SnapshotWait: 3 * time.Second, DiscoveryInterval: 41 * time.Second,
		EventsQPS: 0.5, EventsBurst: 9, ApplyStrategy: string(apply.ServerSideApply), SSAFieldManager: "fm"}
	var all allinone.Config
	AllInOne(f, &all.Watcher, &all.Dispatcher, &all.Applier)

	var c allinone.Config
	Watcher(f, &c.Watcher)
	Dispatcher(f, &c.Dispatcher)
	Applier(f, &c.Applier)
	if diff := cmp.Diff(c.Applier, all.Applier); diff != "" {
		t.Errorf("all-in-one applier (-stage +all-in-one):\n%s", diff)
	}
	if diff := cmp.Diff(c.Watcher.DiscoveryInterval, all.Watcher.DiscoveryInterval); diff != "" {
		t.Errorf("all-in-one watcher discovery interval:\n%s", diff)
	}

	got := []any{
		all.Watcher.DiscoveryInterval, all.Watcher.EventsQPS, all.Watcher.EventsBurst,
		all.Dispatcher.Workers, all.Dispatcher.MaxInFlight, all.Dispatcher.SnapshotWait, all.Dispatcher.EventsQPS, all.Dispatcher.EventsBurst,
		all.Applier.Strategy, all.Applier.FieldManager, all.Applier.Workers, all.Applier.MaxInFlight, all.Applier.SnapshotWait,
		all.Applier.DiscoveryInterval, all.Applier.EventsQPS, all.Applier.EventsBurst,
	}
	want := []any{
		41 * time.Second, float32(0.5), 9,
		7, 99, 3 * time.Second, float32(0.5), 9,
		apply.ServerSideApply, "fm", 7, 99, 3 * time.Second,
		41 * time.Second, float32(0.5), 9,
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("stage configs (-want +got):\n%s", diff)
	}
}
