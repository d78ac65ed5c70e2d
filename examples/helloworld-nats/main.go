// Command helloworld-nats serves the HelloWorld sync hook
// (examples/helloworld) over NATS instead of HTTP: it subscribes to a
// subject in a queue group, so that any number of replicas share the calls
// and take over from one another, and it needs no Service or Ingress: only
// an outbound connection to NATS. Its connection flags are shaped as
// metabus's own (--nats-url, --nats-creds, --nats-nkey, --nats-ca,
// --nats-cert, --nats-key).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"os"
	"os/signal"
	"syscall"

	"github.com/nats-io/nats.go"

	"github.com/metabus/metabus/examples/helloworld"
	"github.com/metabus/metabus/sdk/hook"
)

// Defaults: the subject the example's controller.yaml names, and the
// queue group the replicas share.
const (
	DefaultSubject = "hooks.helloworld.sync"
	DefaultQueue   = "helloworld"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stderr); err != nil {
		log.Fatal(err)
	}
}

// config is the command line.
type config struct {
	url, creds, nkey, ca, cert, key string
	subject, queue                  string
}

func parseFlags(args []string, out io.Writer) (*config, error) {
	var c config
	fs := flag.NewFlagSet("helloworld-nats", flag.ContinueOnError)
	fs.SetOutput(out)
	fs.StringVar(&c.url, "nats-url", nats.DefaultURL, "NATS server URL(s), comma separated")
	fs.StringVar(&c.creds, "nats-creds", "", "NATS credentials file (a user allowed to subscribe to --subject)")
	fs.StringVar(&c.nkey, "nats-nkey", "", "NATS nkey seed file")
	fs.StringVar(&c.ca, "nats-ca", "", "CA bundle to verify the NATS server")
	fs.StringVar(&c.cert, "nats-cert", "", "client certificate for NATS mTLS")
	fs.StringVar(&c.key, "nats-key", "", "client key for NATS mTLS")
	fs.StringVar(&c.subject, "subject", DefaultSubject, "subject the hook serves (the controller's hooks.sync.nats.subject)")
	fs.StringVar(&c.queue, "queue", DefaultQueue, "queue group shared by the hook's replicas")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if c.creds != "" && c.nkey != "" {
		return nil, errors.New("--nats-creds and --nats-nkey are two ways to authenticate: give one")
	}
	if (c.cert == "") != (c.key == "") {
		return nil, errors.New("--nats-cert and --nats-key go together")
	}
	return &c, nil
}

// options are the NATS connection options of the flags: what metabus's
// services build from theirs, written out here so that the example stands
// alone (copy it out of this repository and it still builds).
func (c *config) options() ([]nats.Option, error) {
	opts := []nats.Option{
		nats.Name("helloworld-nats"),
		nats.MaxReconnects(-1), // a hook waits for NATS to come back
	}
	if c.creds != "" {
		opts = append(opts, nats.UserCredentials(c.creds))
	}
	if c.nkey != "" {
		opt, err := nats.NkeyOptionFromSeed(c.nkey)
		if err != nil {
			return nil, fmt.Errorf("--nats-nkey: %w", err)
		}
		opts = append(opts, opt)
	}
	if c.ca != "" {
		opts = append(opts, nats.RootCAs(c.ca))
	}
	if c.cert != "" {
		opts = append(opts, nats.ClientCert(c.cert, c.key))
	}
	return opts, nil
}

// run connects and serves until ctx is done.
func run(ctx context.Context, args []string, out io.Writer) error {
	c, err := parseFlags(args, out)
	if err != nil {
		return err
	}
	opts, err := c.options()
	if err != nil {
		return err
	}
	nc, err := nats.Connect(c.url, opts...)
	if err != nil {
		return fmt.Errorf("connecting to NATS at %s: %w", c.url, err)
	}
	defer nc.Close()
	logf := log.New(out, "", log.LstdFlags).Printf
	logf("serving the HelloWorld sync hook on %s (queue group %s)", c.subject, c.queue)
	return hook.ServeNATS(ctx, nc, c.subject, c.queue, hook.Composite(helloworld.Sync),
		hook.WithErrorLog(func(call *hook.Call, err error) {
			if call != nil {
				logf("call %s (%s): %v", call.ID, call.Subject, err)
				return
			}
			logf("%v", err)
		}))
}
