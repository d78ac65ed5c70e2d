package main

import (
	"context"
	"fmt"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/client-go/dynamic"

	"github.com/metabus/metabus/pkg/cli"
	"github.com/metabus/metabus/pkg/discovery"
	"github.com/metabus/metabus/pkg/kubeapi"
	"github.com/metabus/metabus/pkg/natsx"
	"github.com/metabus/metabus/pkg/opscli"
)

// opsFlags are the flags every operator subcommand takes: the connection
// flags of pkg/cli (--kubeconfig, --context, --nats-url and the NATS
// credential and TLS flags, named as the services name them), -o and
// --timeout. Exit codes are opscli's (0 ok, 1 failure, 2 usage, 3 not
// found, 4 render found changes), through pkg/cli's Run.
type opsFlags struct {
	conn    *cli.ClientFlags
	output  string
	timeout time.Duration
}

// newOpsFlags adds the flags to cmd.
func newOpsFlags(cmd *cobra.Command) *opsFlags {
	f := &opsFlags{conn: cli.AddClientFlags(cmd)}
	fs := cmd.Flags()
	fs.StringVarP(&f.output, "output", "o", "table", "output format: table, json or yaml")
	fs.DurationVar(&f.timeout, "timeout", 2*time.Second, "how long replicas are waited for when asked what they did")
	return f
}

// format is the parsed -o.
func (f *opsFlags) format() (opscli.Format, error) { return opscli.ParseFormat(f.output) }

// needs says what a subcommand connects to.
type needs int

const (
	needCluster needs = 1 << iota
	needNATS
)

// connect opens what a subcommand needs; closeFn releases it.
func (f *opsFlags) connect(ctx context.Context, n needs) (b *opscli.Bus, closeFn func(), err error) {
	b = &opscli.Bus{Timeout: f.timeout}
	closeFn = func() {}
	if n&needCluster != 0 {
		rc, err := f.conn.REST()
		if err != nil {
			return nil, nil, err
		}
		if b.Dyn, err = dynamic.NewForConfig(rc); err != nil {
			return nil, nil, fmt.Errorf("kubernetes client: %w", err)
		}
		api, err := kubeapi.NewForConfig(rc)
		if err != nil {
			return nil, nil, fmt.Errorf("kubernetes client: %w", err)
		}
		b.Disc = discovery.New(discovery.APIServer{API: api})
	}
	if n&needNATS != 0 {
		if err := ctx.Err(); err != nil {
			return nil, nil, err
		}
		o := f.conn.NATS.Options("metabus-cli")
		o.InboxPrefix = opscli.InboxPrefix
		nc, js, err := natsx.Connect(o)
		if err != nil {
			return nil, nil, err
		}
		b.NC, b.JS = nc, js
		closeFn = nc.Close
	}
	return b, closeFn, nil
}

// runCtx is the context of a subcommand: cancelled by SIGINT/SIGTERM.
func runCtx(cmd *cobra.Command) context.Context {
	if ctx := cmd.Context(); ctx != nil {
		return ctx
	}
	return context.Background()
}

// usageArgs checks the positional arguments, as a usage error.
func usageArgs(n int, what string) cobra.PositionalArgs {
	return func(_ *cobra.Command, args []string) error {
		if len(args) != n {
			return opscli.Usage("want %s", what)
		}
		return nil
	}
}
