// Command metabus-dispatcher consumes work items, calls hooks and publishes
// desired states.
package main

import (
	"context"

	"github.com/spf13/cobra"

	"github.com/metabus/metabus/pkg/cli"
	"github.com/metabus/metabus/pkg/natsx"
	"github.com/metabus/metabus/services/dispatcher"
)

func main() { cli.Execute(newCommand()) }

func newCommand() *cobra.Command {
	var cfg dispatcher.Config
	return cli.Service{
		Name:  "metabus-dispatcher",
		Stage: cli.Dispatcher,
		Short: "Consume work items, call the controllers' hooks and publish desired states",
		Flags: cfg.RegisterFlags,
		Run: func(ctx context.Context, env cli.Env) error {
			nc, js, err := env.ConnectNATS(ctx)
			if err != nil {
				return err
			}
			defer natsx.Drain(context.Background(), nc)
			cfg.Workers, cfg.MaxInFlight, cfg.SnapshotWait = env.Flags.Workers, env.Flags.MaxInFlight, env.Flags.SnapshotWait
			cfg.EventsQPS, cfg.EventsBurst = float32(env.Flags.EventsQPS), env.Flags.EventsBurst
			d, err := dispatcher.New(cfg, dispatcher.Deps{REST: env.REST, NC: nc, JS: js, Log: env.Log, Metrics: env.Registry, Health: env.Health})
			if err != nil {
				return err
			}
			return d.Run(ctx)
		},
	}.Command()
}
