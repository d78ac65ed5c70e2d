// Command metabus-applier consumes desired states and converges children
// and parent status in the cluster.
package main

import (
	"context"

	"github.com/spf13/cobra"

	"github.com/metabus/metabus/internal/stageconfig"
	"github.com/metabus/metabus/pkg/cli"
	"github.com/metabus/metabus/pkg/natsx"
	"github.com/metabus/metabus/services/applier"
)

func main() { cli.Execute(newCommand()) }

func newCommand() *cobra.Command {
	var cfg applier.Config
	return cli.Service{
		Name:  "metabus-applier",
		Stage: cli.Applier,
		Short: "Consume desired states and converge children and parent status in the cluster",
		Flags: cfg.RegisterFlags,
		Run: func(ctx context.Context, env cli.Env) error {
			nc, js, err := env.ConnectNATS(ctx)
			if err != nil {
				return err
			}
			defer natsx.Drain(context.Background(), nc)
			stageconfig.Applier(env.Flags, &cfg)
			a, err := applier.New(cfg, applier.Deps{REST: env.REST, NC: nc, JS: js, Log: env.Log, Metrics: env.Registry, Health: env.Health})
			if err != nil {
				return err
			}
			return a.Run(ctx)
		},
	}.Command()
}
