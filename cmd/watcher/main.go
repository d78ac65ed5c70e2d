// Command metabus-watcher turns Kubernetes informer events into work items
// on NATS JetStream and serves observed-state snapshots.
package main

import (
	"context"

	"github.com/spf13/cobra"

	"github.com/metabus/metabus/internal/stageconfig"
	"github.com/metabus/metabus/pkg/cli"
	"github.com/metabus/metabus/pkg/natsx"
	"github.com/metabus/metabus/services/watcher"
)

func main() { cli.Execute(newCommand()) }

func newCommand() *cobra.Command {
	var cfg watcher.Config
	return cli.Service{
		Name:  "metabus-watcher",
		Stage: cli.Watcher,
		Short: "Turn Kubernetes events into work items on NATS JetStream and serve observed-state snapshots",
		Flags: cfg.RegisterFlags,
		Run: func(ctx context.Context, env cli.Env) error {
			nc, js, err := env.ConnectNATS(ctx)
			if err != nil {
				return err
			}
			defer natsx.Drain(context.Background(), nc)
			stageconfig.Watcher(env.Flags, &cfg)
			w, err := watcher.New(cfg, watcher.Deps{REST: env.REST, NC: nc, JS: js, Log: env.Log, Metrics: env.Registry, Health: env.Health})
			if err != nil {
				return err
			}
			return w.Run(ctx)
		},
	}.Command()
}
