// Command metabus-dispatcher consumes work items, calls hooks and publishes
// desired states.
package main

import (
	"context"
	"fmt"
	"time"

	"go.uber.org/zap"

	"github.com/spf13/cobra"

	"github.com/metabus/metabus/internal/stageconfig"
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
			stageconfig.Dispatcher(env.Flags, &cfg)
			deps := dispatcher.Deps{REST: env.REST, NC: nc, JS: js, Log: env.Log, Metrics: env.Registry, Health: env.Health}
			if cfg.HookNATS.Set() {
				// Hooks on a connection of their own (another server, account or user).
				o := cfg.HookNATS.Options(env.Flags.NATS.URL)
				o.Logger = env.Log
				hnc, _, err := natsx.Dial(ctx, o, natsx.DefaultBackoff, func(err error, next time.Duration) {
					env.Log.Warn("hook NATS server not reachable yet; retrying", zap.Error(err), zap.Duration("retryIn", next))
				})
				if err != nil {
					return fmt.Errorf("hook NATS connection: %w", err)
				}
				defer natsx.Drain(context.Background(), hnc)
				deps.HookNC = hnc
			}
			d, err := dispatcher.New(cfg, deps)
			if err != nil {
				return err
			}
			return d.Run(ctx)
		},
	}.Command()
}
