// Command metabus-dispatcher consumes work items, calls hooks and publishes
// desired states.
package main

import (
	"context"

	"github.com/metabus/metabus/pkg/cli"
	"github.com/metabus/metabus/pkg/natsx"
	"github.com/metabus/metabus/services/dispatcher"
)

func main() {
	var cfg dispatcher.Config
	cli.Main("metabus-dispatcher", cfg.RegisterFlags, func(ctx context.Context, env cli.Env) error {
		rest, err := env.Flags.Kube.Config()
		if err != nil {
			return err
		}
		opts := env.Flags.NATS.Options("metabus-dispatcher")
		opts.Logger = env.Log
		nc, js, err := natsx.Connect(opts)
		if err != nil {
			return err
		}
		defer natsx.Drain(context.Background(), nc)
		cfg.Workers, cfg.MaxInFlight, cfg.SnapshotWait = env.Flags.Workers, env.Flags.MaxInFlight, env.Flags.SnapshotWait
		cfg.EventsQPS, cfg.EventsBurst = float32(env.Flags.EventsQPS), env.Flags.EventsBurst
		d, err := dispatcher.New(cfg, dispatcher.Deps{REST: rest, NC: nc, JS: js, Log: env.Log, Metrics: env.Registry, Health: env.Health})
		if err != nil {
			return err
		}
		return d.Run(ctx)
	})
}
