// Command metabus-revisions serves the revisions service: it owns the
// metacontroller.k8s.io ControllerRevisions of rolling updates, loading and
// committing them for the dispatchers and appliers over NATS.
package main

import (
	"context"

	"github.com/metabus/metabus/pkg/cli"
	"github.com/metabus/metabus/pkg/natsx"
	"github.com/metabus/metabus/services/revisions"
)

func main() {
	var cfg revisions.Config
	cli.Main("metabus-revisions", cfg.RegisterFlags, func(ctx context.Context, env cli.Env) error {
		rest, err := env.Flags.Kube.Config()
		if err != nil {
			return err
		}
		opts := env.Flags.NATS.Options("metabus-revisions")
		opts.Logger = env.Log
		nc, _, err := natsx.Connect(opts)
		if err != nil {
			return err
		}
		defer natsx.Drain(context.Background(), nc)
		s, err := revisions.New(cfg, revisions.Deps{REST: rest, NC: nc, Log: env.Log, Metrics: env.Registry, Health: env.Health})
		if err != nil {
			return err
		}
		return s.Run(ctx)
	})
}
