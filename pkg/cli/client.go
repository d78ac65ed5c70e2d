package cli

import (
	"context"
	"flag"
	"fmt"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/cobra"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"

	"github.com/metabus/metabus/pkg/natsx"
)

// ClientFlags are the connection flags of an operator subcommand (metabus
// status, dlq, tail...): which cluster (--kubeconfig, --context) and which
// NATS server with which credentials (--nats-url, --nats-creds,
// --nats-nkey, --nats-ca, --nats-cert, --nats-key), named as the services
// name them.
type ClientFlags struct {
	Kube KubeFlags
	NATS NATSFlags
}

// AddClientFlags registers the connection flags on cmd and returns them,
// filled in once cmd's flags are parsed:
//
//	func statusCommand() *cobra.Command {
//		cmd := &cobra.Command{Use: "status", ...}
//		conn := cli.AddClientFlags(cmd)
//		cmd.RunE = func(cmd *cobra.Command, _ []string) error {
//			dyn, err := conn.Dynamic()
//			...
//			nc, js, err := conn.ConnectNATS(cmd.Context(), "metabus-status")
//		}
//		return cmd
//	}
func AddClientFlags(cmd *cobra.Command) *ClientFlags {
	f := &ClientFlags{}
	gfs := flag.NewFlagSet(cmd.Name(), flag.ContinueOnError)
	f.Kube.RegisterConfig(gfs)
	f.NATS.Register(gfs)
	cmd.Flags().AddGoFlagSet(gfs)
	return f
}

// REST is the Kubernetes client configuration: --kubeconfig and --context,
// else in-cluster, else $KUBECONFIG or ~/.kube/config. An operator's
// command is not rate-limited on the client side.
func (f *ClientFlags) REST() (*rest.Config, error) {
	k := f.Kube
	k.QPS, k.Burst = -1, 0
	return k.Config()
}

// Dynamic is a dynamic client of the cluster.
func (f *ClientFlags) Dynamic() (dynamic.Interface, error) {
	cfg, err := f.REST()
	if err != nil {
		return nil, err
	}
	c, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("dynamic client: %w", err)
	}
	return c, nil
}

// ConnectNATS connects once, failing at once when the server cannot be
// reached: an operator's command reports that rather than waiting (the
// services wait; see Env.ConnectNATS). name is the connection's name, seen
// in the server's connection list.
func (f *ClientFlags) ConnectNATS(ctx context.Context, name string) (*nats.Conn, jetstream.JetStream, error) {
	if err := ctx.Err(); err != nil {
		return nil, nil, err
	}
	return natsx.Connect(f.NATS.Options(name))
}
