// Command metabus-watcher turns Kubernetes informer events into work items
// on NATS JetStream and serves observed-state snapshots.
package main

import (
	"context"

	"github.com/metabus/metabus/pkg/cli"
	"github.com/metabus/metabus/pkg/natsx"
	"github.com/metabus/metabus/services/watcher"
)

func main() {
	var cfg watcher.Config
	cli.Main("metabus-watcher", cfg.RegisterFlags, func(ctx context.Context, env cli.Env) error {
		rest, err := env.Flags.Kube.Config()
		if err != nil {
			return err
		}
		opts := env.Flags.NATS.Options("metabus-watcher")
		opts.Logger = env.Log
		nc, js, err := natsx.Connect(opts)
		if err != nil {
			return err
		}
		defer natsx.Drain(context.Background(), nc)
		cfg.DiscoveryInterval = env.Flags.DiscoveryInterval
		cfg.EventsQPS, cfg.EventsBurst = float32(env.Flags.EventsQPS), env.Flags.EventsBurst
		w, err := watcher.New(cfg, watcher.Deps{REST: rest, NC: nc, JS: js, Log: env.Log, Metrics: env.Registry, Health: env.Health})
		if err != nil {
			return err
		}
		return w.Run(ctx)
	})
}
