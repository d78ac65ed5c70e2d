// Command metabus-revisions serves the revisions service: it owns the
// metacontroller.k8s.io ControllerRevisions of rolling updates, loading and
// committing them for the dispatchers and appliers over NATS.
package main

import (
	"context"

	"github.com/spf13/cobra"

	"github.com/metabus/metabus/pkg/cli"
	"github.com/metabus/metabus/pkg/natsx"
	"github.com/metabus/metabus/services/revisions"
)

func main() { cli.Execute(newCommand()) }

func newCommand() *cobra.Command {
	var cfg revisions.Config
	return cli.Service{
		Name:  "metabus-revisions",
		Stage: cli.Revisions,
		Short: "Load and commit the ControllerRevisions of rolling updates for the dispatchers and appliers, over NATS",
		Flags: cfg.RegisterFlags,
		Run: func(ctx context.Context, env cli.Env) error {
			nc, _, err := env.ConnectNATS(ctx)
			if err != nil {
				return err
			}
			defer natsx.Drain(context.Background(), nc)
			s, err := revisions.New(cfg, revisions.Deps{REST: env.REST, NC: nc, Log: env.Log, Metrics: env.Registry, Health: env.Health})
			if err != nil {
				return err
			}
			return s.Run(ctx)
		},
	}.Command()
}
