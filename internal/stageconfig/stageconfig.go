// Package stageconfig turns the flags every service shares
// (cli.CommonFlags: upstream's --workers, --discovery-interval,
// --events-qps, --apply-strategy, ...) into each stage's configuration. It
// is the one place the stage mains (cmd/watcher, cmd/dispatcher,
// cmd/applier) and the all-in-one (cmd/metabus) share, so that a common
// flag means the same in every process. Each stage's own flags are
// registered by the stage (its RegisterFlags) straight into its Config.
package stageconfig

import (
	"github.com/metabus/metabus/pkg/apply"
	"github.com/metabus/metabus/pkg/cli"
	"github.com/metabus/metabus/services/applier"
	"github.com/metabus/metabus/services/dispatcher"
	"github.com/metabus/metabus/services/watcher"
)

// Watcher sets the common flags the watcher uses.
func Watcher(f *cli.CommonFlags, c *watcher.Config) {
	c.DiscoveryInterval = f.DiscoveryInterval
	c.EventsQPS, c.EventsBurst = float32(f.EventsQPS), f.EventsBurst
}

// Dispatcher sets the common flags the dispatcher uses. A dispatcher of
// its own does not take --apply-strategy (the appliers' Done notes tell
// it theirs); in the all-in-one, where one flag sets both stages,
// internal/allinone hands the applier's strategy to the dispatcher.
func Dispatcher(f *cli.CommonFlags, c *dispatcher.Config) {
	c.Workers, c.MaxInFlight, c.SnapshotWait = f.Workers, f.MaxInFlight, f.SnapshotWait
	c.EventsQPS, c.EventsBurst = float32(f.EventsQPS), f.EventsBurst
}

// Applier sets the common flags the applier uses.
func Applier(f *cli.CommonFlags, c *applier.Config) {
	c.Strategy, c.FieldManager = apply.Strategy(f.ApplyStrategy), f.SSAFieldManager
	c.Workers, c.MaxInFlight, c.SnapshotWait = f.Workers, f.MaxInFlight, f.SnapshotWait
	c.DiscoveryInterval = f.DiscoveryInterval
	c.EventsQPS, c.EventsBurst = float32(f.EventsQPS), f.EventsBurst
}

// AllInOne sets the common flags of every stage of the all-in-one process
// (allinone.Config's Watcher, Dispatcher and Applier). It takes the three
// rather than allinone.Config so that the stage binaries, which import
// this package, do not link the all-in-one and its embedded nats-server.
func AllInOne(f *cli.CommonFlags, w *watcher.Config, d *dispatcher.Config, a *applier.Config) {
	Watcher(f, w)
	Dispatcher(f, d)
	Applier(f, a)
}
