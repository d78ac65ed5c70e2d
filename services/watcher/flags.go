package watcher

import (
	"flag"
	"strconv"
	"strings"
	"time"

	"github.com/metabus/metabus/pkg/bus"
	"github.com/metabus/metabus/pkg/related"
)

// RegisterFlags adds the watcher's own flags (upstream names where they
// exist). Shared flags (--discovery-interval, --events-qps...) live in
// pkg/cli so that the all-in-one process registers them once.
func (c *Config) RegisterFlags(fs *flag.FlagSet) {
	fs.DurationVar(&c.CacheFlushInterval, "cache-flush-interval", 30*time.Minute, "how often every parent is resynced (repairs anything the bus lost)")
	fs.StringVar(&c.TargetLabelSelector, "target-label-selector", "", "only serve controllers whose labels match this selector")
	fs.IntVar(&c.PublishWorkers, "publish-workers", 8, "goroutines publishing work items to NATS")
	fs.IntVar(&c.ResyncBacklog, "resync-backlog", 0, "resync items of one controller are published only while fewer than this many of them are in MC_WORK, so real changes never wait behind a resync wave and no controller's backlog holds another's resyncs back (0: 32, negative: unpaced)")
	fs.IntVar(&c.ResyncTotal, "resync-total", 0, "resync items of all controllers in MC_WORK at once (0: 1024); a controller with fewer than its fair share of them "+
		"(this over the controllers with resyncs there or waiting) may always add one, so controllers whose hooks hang cannot hold it")
	fs.Var(maxWeightFlag{&c.Weights.Max}, "max-controller-weight", "the largest weight a controller's metabus.dev/weight annotation is granted, 1-100 "+
		"(1: the annotation is ignored, every controller gets an equal share of a saturated replica; 100: as the annotation allows)")
	fs.Func("weighted-controllers", "comma-separated CompositeController/<name> or DecoratorController/<name> whose metabus.dev/weight "+
		"annotation counts; every other controller gets weight 1. Repeatable (default: every controller's annotation counts)",
		func(v string) error {
			ids, err := bus.ParseWeightedControllers(v)
			if err != nil {
				return err
			}
			if c.Weights.Allowed == nil {
				c.Weights.Allowed = map[string]bool{}
			}
			for _, id := range ids {
				c.Weights.Allowed[id] = true
			}
			return nil
		})
	fs.DurationVar(&c.SnapshotWait, "snapshot-freshness-wait", 2*time.Second, "how long a snapshot request waits for the cache to catch up before answering retry")
	fs.BoolVar(&c.ServeSnapshots, "serve-snapshots", true, "serve the observed-state snapshot service on NATS")
	fs.BoolVar(&c.LeaderElect, "leader-election", false, "publish work items only while holding a Lease (run several replicas for HA)")
	fs.StringVar(&c.LeaderElectionNamespace, "leader-election-namespace", "metabus", "namespace of the leader-election Lease")
	fs.StringVar(&c.LeaderElectionID, "leader-election-id", "metabus-watcher", "name of the leader-election Lease")
	fs.BoolVar(&c.EnsureStreams, "ensure-streams", true, "create or update the JetStream streams and consumers at start")
	fs.IntVar(&c.Bus.Replicas, "stream-replicas", 1, "replicas of each JetStream stream (3 in a production cluster)")
	fs.Func("controller-resources", "comma-separated <group>/<resource> (core/configmaps, apps/*, * for all) that controllers may "+
		"name as parent, child, decorator target or attachment, and in customize hooks' related rules: what metabus watches and "+
		"sends to their hooks; -<group>/<resource> denies and wins over any allow. A controller naming another is not started "+
		"(CreateError Event). Repeatable (default "+strings.Join(related.DefaultControllerPolicy, ",")+", as upstream; *,-core/secrets refuses Secrets)",
		related.AppendEntries(related.ControllerSetting, &c.ControllerResources))
	c.registerReadFlags(fs)
	fs.IntVar(&c.Bus.Partitions, "partitions", 0, "change the partition count of MC_WORK and MC_DESIRED to this (a power of two, 1-1024; the replicas of each stage that get work are at most this many); 0 keeps the current count ("+strconv.Itoa(bus.DefaultPartitions)+" on a new install; an existing one keeps its own); the change is a live cut-over, see docs/architecture.md, \"The bus\"")
}

// maxWeightFlag is --max-controller-weight: 1 to bus.MaxWeight, shown
// with its real default (unset means bus.MaxWeight).
type maxWeightFlag struct{ max *int }

func (f maxWeightFlag) String() string {
	if f.max == nil || *f.max == 0 {
		return strconv.Itoa(bus.MaxWeight)
	}
	return strconv.Itoa(*f.max)
}

func (f maxWeightFlag) Set(v string) error {
	n, err := bus.ParseMaxWeight(v)
	if err != nil {
		return err
	}
	*f.max = n
	return nil
}
