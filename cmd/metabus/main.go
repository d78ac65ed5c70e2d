// Command metabus runs every stage (watcher, dispatcher, applier, revisions)
// in one process, with an embedded JetStream server unless --nats-url is given.
package main

import (
	"context"
	"flag"

	"github.com/metabus/metabus/pkg/allinone"
	"github.com/metabus/metabus/pkg/cli"
)

func main() {
	var (
		cfg      allinone.Config
		external bool
	)
	register := func(fs *flag.FlagSet) {
		cfg.Watcher.RegisterFlags(fs)
		(&cfg.Dispatcher).RegisterFlags(fs)
		cfg.Revisions.RegisterFlags(fs)
		fs.BoolVar(&external, "external-nats", false, "use --nats-url instead of an embedded JetStream server")
		fs.StringVar(&cfg.StoreDir, "nats-store-dir", "metabus-data", "JetStream store directory of the embedded server")
		fs.StringVar(&cfg.Listen, "nats-listen", "127.0.0.1:4222", "client address of the embedded server (\"-\": in-process only)")
	}
	cli.Main("metabus", register, func(ctx context.Context, env cli.Env) error {
		rest, err := env.Flags.Kube.Config()
		if err != nil {
			return err
		}
		if external {
			cfg.NATS = env.Flags.NATS.Options("metabus")
		}
		f := env.Flags
		cfg.Watcher.DiscoveryInterval = f.DiscoveryInterval
		cfg.Watcher.EventsQPS, cfg.Watcher.EventsBurst = float32(f.EventsQPS), f.EventsBurst
		cfg.Dispatcher.Workers, cfg.Dispatcher.MaxInFlight, cfg.Dispatcher.SnapshotWait = f.Workers, f.MaxInFlight, f.SnapshotWait
		cfg.Dispatcher.EventsQPS, cfg.Dispatcher.EventsBurst = float32(f.EventsQPS), f.EventsBurst
		cfg.Applier.Workers, cfg.Applier.MaxInFlight, cfg.Applier.SnapshotWait = f.Workers, f.MaxInFlight, f.SnapshotWait
		cfg.Applier.DiscoveryInterval = f.DiscoveryInterval
		cfg.Applier.EventsQPS, cfg.Applier.EventsBurst = float32(f.EventsQPS), f.EventsBurst
		return allinone.Run(ctx, cfg, allinone.Deps{REST: rest, Log: env.Log, Metrics: env.Registry, Health: env.Health})
	})
}
