package revisions

import (
	"flag"
	"time"
)

// RegisterFlags adds the revisions service's own flags; shared ones
// (--kubeconfig, --nats-url...) live in pkg/cli.
func (c *Config) RegisterFlags(fs *flag.FlagSet) {
	fs.DurationVar(&c.Timeout, "revisions-timeout", 8*time.Second, "bound on the API calls of one revisions request (keep it below the callers' 10s request timeout)")
	fs.IntVar(&c.Concurrency, "revisions-concurrency", 32, "revisions requests served at once per replica")
}
