package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/metabus/metabus/pkg/cli"
	"github.com/metabus/metabus/pkg/discovery"
	"github.com/metabus/metabus/pkg/kubeapi"
	"github.com/metabus/metabus/pkg/natsx"
	"github.com/metabus/metabus/pkg/opscli"
)

// opsFlags are the connection and output flags every operator subcommand
// shares: the cluster (--kubeconfig, --context), NATS (--nats-url and the
// credential and TLS flags of the services), -o and --timeout.
type opsFlags struct {
	kubeconfig string
	context    string
	nats       cli.NATSFlags
	output     string
	timeout    time.Duration
}

// register adds the flags to cmd (persistent: subcommands inherit them).
func (f *opsFlags) register(cmd *cobra.Command) {
	fs := cmd.PersistentFlags()
	fs.StringVar(&f.kubeconfig, "kubeconfig", "", "path to a kubeconfig (default: $KUBECONFIG, then ~/.kube/config)")
	fs.StringVar(&f.context, "context", "", "kubeconfig context to use (default: the current one)")
	gofs := flag.NewFlagSet("nats", flag.ContinueOnError)
	f.nats.Register(gofs)
	fs.AddGoFlagSet(gofs)
	fs.StringVarP(&f.output, "output", "o", "table", "output format: table, json or yaml")
	fs.DurationVar(&f.timeout, "timeout", 2*time.Second, "how long replicas are waited for when asked what they did")
	cmd.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return opscli.Usage("%v", err) })
	// The caller prints the error once and exits with its code
	// (exitOnError).
	cmd.SilenceUsage, cmd.SilenceErrors = true, true
}

// format is the parsed -o.
func (f *opsFlags) format() (opscli.Format, error) { return opscli.ParseFormat(f.output) }

// restConfig reads the kubeconfig (or the in-cluster configuration).
func (f *opsFlags) restConfig() (*rest.Config, error) {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	if f.kubeconfig != "" {
		rules.ExplicitPath = f.kubeconfig
	}
	cfg, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{CurrentContext: f.context}).ClientConfig()
	if err != nil && f.kubeconfig == "" && f.context == "" {
		if in, ierr := rest.InClusterConfig(); ierr == nil {
			return in, nil
		}
	}
	if err != nil {
		return nil, fmt.Errorf("kubernetes client config: %w", err)
	}
	cfg.QPS, cfg.Burst = 50, 100
	return cfg, nil
}

// needs says what a subcommand connects to.
type needs int

const (
	needCluster needs = 1 << iota
	needNATS
)

// connect opens what a subcommand needs; closeFn releases it.
func (f *opsFlags) connect(n needs) (b *opscli.Bus, closeFn func(), err error) {
	b = &opscli.Bus{Timeout: f.timeout}
	closeFn = func() {}
	if n&needCluster != 0 {
		rc, err := f.restConfig()
		if err != nil {
			return nil, nil, err
		}
		if b.Dyn, err = dynamic.NewForConfig(rc); err != nil {
			return nil, nil, fmt.Errorf("kubernetes client: %w", err)
		}
		if b.Kube, err = kubernetes.NewForConfig(rc); err != nil {
			return nil, nil, fmt.Errorf("kubernetes client: %w", err)
		}
		api, err := kubeapi.NewForConfig(rc)
		if err != nil {
			return nil, nil, fmt.Errorf("kubernetes client: %w", err)
		}
		b.Disc = discovery.New(discovery.APIServer{API: api})
	}
	if n&needNATS != 0 {
		nc, js, err := natsx.Connect(f.nats.Options("metabus-cli"))
		if err != nil {
			return nil, nil, err
		}
		b.NC, b.JS = nc, js
		closeFn = nc.Close
	}
	return b, closeFn, nil
}

// exitCode is the process exit code for a subcommand's error (the exit
// codes are opscli's: 0 ok, 1 failure, 2 usage, 3 not found, 4 render
// found changes).
func exitCode(err error) int { return opscli.Code(err) }

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

// exitOnError is what a main without its own error handling does with a
// subcommand's error: print it and exit with its code.
func exitOnError(err error) {
	if err == nil {
		return
	}
	fmt.Fprintln(os.Stderr, "Error:", err)
	os.Exit(exitCode(err))
}
