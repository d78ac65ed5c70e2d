// Command metabus-applier consumes desired states and converges children
// and parent status in the cluster.
package main

import (
	"context"

	"github.com/metabus/metabus/pkg/cli"
	"github.com/metabus/metabus/pkg/natsx"
	"github.com/metabus/metabus/services/applier"
)

func main() {
	var cfg applier.Config
	cli.Main("metabus-applier", nil, func(ctx context.Context, env cli.Env) error {
		rest, err := env.Flags.Kube.Config()
		if err != nil {
			return err
		}
		opts := env.Flags.NATS.Options("metabus-applier")
		opts.Logger = env.Log
		nc, js, err := natsx.Connect(opts)
		if err != nil {
			return err
		}
		defer natsx.Drain(context.Background(), nc)
		cfg.Workers, cfg.MaxInFlight, cfg.SnapshotWait = env.Flags.Workers, env.Flags.MaxInFlight, env.Flags.SnapshotWait
		cfg.DiscoveryInterval = env.Flags.DiscoveryInterval
		cfg.EventsQPS, cfg.EventsBurst = float32(env.Flags.EventsQPS), env.Flags.EventsBurst
		a, err := applier.New(cfg, applier.Deps{REST: rest, NC: nc, JS: js, Log: env.Log, Metrics: env.Registry, Health: env.Health})
		if err != nil {
			return err
		}
		return a.Run(ctx)
	})
}
