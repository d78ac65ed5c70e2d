// Command metabus runs every stage (watcher, dispatcher, applier, revisions)
// in one process, with an embedded JetStream server unless --external-nats
// is given; its subcommands operate an installation.
package main

import (
	"context"
	"flag"

	"github.com/spf13/cobra"

	"github.com/metabus/metabus/internal/allinone"
	"github.com/metabus/metabus/internal/stageconfig"
	"github.com/metabus/metabus/pkg/cli"
)

func main() { cli.Execute(newRoot()) }

// newRoot is `metabus`: with no subcommand it runs the all-in-one process.
// A subcommand is one AddCommand line here; its connection flags come
// from cli.AddClientFlags.
func newRoot() *cobra.Command {
	root := allInOne()
	root.AddCommand(cli.VersionCommand())
	root.AddCommand(credentialsCommand())
	root.AddCommand(statusCommand())
	root.AddCommand(dlqCommand())
	root.AddCommand(tailCommand())
	root.AddCommand(renderCommand())
	root.AddCommand(explainCommand())
	return root
}

func allInOne() *cobra.Command {
	var (
		cfg      allinone.Config
		external bool
	)
	register := func(fs *flag.FlagSet) {
		cfg.Watcher.RegisterFlags(fs)
		(&cfg.Dispatcher).RegisterFlags(fs)
		cfg.Revisions.RegisterFlags(fs)
		cfg.Applier.RegisterFlags(fs)
		fs.BoolVar(&external, "external-nats", false, "use --nats-url instead of an embedded JetStream server")
		fs.StringVar(&cfg.StoreDir, "nats-store-dir", "metabus-data", "JetStream store directory of the embedded server")
		fs.StringVar(&cfg.Listen, "nats-listen", "127.0.0.1:4222", "client address of the embedded server (\"-\": in-process only)")
	}
	return cli.Service{
		Name:  "metabus",
		Stage: cli.AllInOne,
		Short: "Metacontroller on NATS JetStream: every stage in one process",
		Long: "metabus runs Metacontroller's CompositeControllers and DecoratorControllers as event-driven stages on NATS JetStream.\n" +
			"Without a subcommand it runs every stage (watcher, dispatcher, applier, revisions) in this process,\n" +
			"with an embedded JetStream server unless --external-nats is given.",
		Flags: register,
		Run: func(ctx context.Context, env cli.Env) error {
			if external {
				cfg.NATS = env.Flags.NATS.Options("metabus")
			}
			stageconfig.AllInOne(env.Flags, &cfg.Watcher, &cfg.Dispatcher, &cfg.Applier)
			return allinone.Run(ctx, cfg, allinone.Deps{REST: env.REST, Log: env.Log, Metrics: env.Registry, Health: env.Health})
		},
	}.Command()
}
