package dispatcher

import (
	"flag"
	"fmt"

	"github.com/metabus/metabus/pkg/hooks"
	"github.com/metabus/metabus/pkg/natsx"
)

// HookSubjectPrefixSetting names where the NATS hook subject policy is set,
// for refusal messages.
const HookSubjectPrefixSetting = "the dispatcher flag --hook-subject-prefix (Helm value dispatcher.hookSubjectPrefix)"

// HookNATS is the connection hooks served over NATS are called through
// (--hook-nats-*). Unset, they go over the dispatcher's bus connection:
// the bus server, the dispatcher's own user (which may publish to the hook
// subjects only, and read replies on its own inbox only). Setting any of
// them dials a connection of its own, to URL (default: the bus URL) with
// these credentials, so that hooks may live on another server or account.
type HookNATS struct {
	URL, Creds, NKeySeed, CAFile, CertFile, KeyFile string
}

// Set reports whether any --hook-nats-* flag was given.
func (h HookNATS) Set() bool { return h != HookNATS{} }

// Options are the connection options, busURL when no URL was given.
func (h HookNATS) Options(busURL string) natsx.ConnOptions {
	u := h.URL
	if u == "" {
		u = busURL
	}
	return natsx.ConnOptions{URL: u, Name: "metabus-dispatcher-hooks", Creds: h.Creds, NKeySeed: h.NKeySeed,
		CAFile: h.CAFile, CertFile: h.CertFile, KeyFile: h.KeyFile, InboxPrefix: natsx.ServiceInboxPrefix("dispatcher")}
}

// registerHookNATSFlags adds the NATS hook transport's flags.
func (c *Config) registerHookNATSFlags(fs *flag.FlagSet) {
	h := &c.HookNATS
	fs.StringVar(&h.URL, "hook-nats-url", "", "NATS server URL(s) hooks served over NATS are called through (default: the bus, --nats-url)")
	fs.StringVar(&h.Creds, "hook-nats-creds", "", "credentials file of the hook connection (default: the bus connection's)")
	fs.StringVar(&h.NKeySeed, "hook-nats-nkey", "", "nkey seed file of the hook connection (default: the bus connection's)")
	fs.StringVar(&h.CAFile, "hook-nats-ca", "", "CA bundle to verify the hooks' NATS server")
	fs.StringVar(&h.CertFile, "hook-nats-cert", "", "client certificate for the hook connection's mTLS")
	fs.StringVar(&h.KeyFile, "hook-nats-key", "", "client key for the hook connection's mTLS")
	c.HookSubjectPrefix = hooks.DefaultSubjectPrefix
	fs.Var((*subjectPrefix)(&c.HookSubjectPrefix), "hook-subject-prefix",
		"the prefix every NATS hook subject must start with, ending with a dot; subjects outside it, and "+
			"metabus's and NATS's own (mc.>, $..., _INBOX.>), are refused")
}

// subjectPrefix is the --hook-subject-prefix flag: checked when it is
// parsed, and showing its default in the flag table.
type subjectPrefix string

func (p *subjectPrefix) String() string { return string(*p) }

func (p *subjectPrefix) Set(v string) error {
	if err := hooks.CheckSubjectPrefix(v); err != nil {
		return err
	}
	*p = subjectPrefix(v)
	return nil
}

// hookSubjectPrefix is the configured prefix, checked (New refuses a bad
// one set without the flag).
func (c *Config) hookSubjectPrefix() (string, error) {
	if c.HookSubjectPrefix == "" {
		return hooks.DefaultSubjectPrefix, nil
	}
	if err := hooks.CheckSubjectPrefix(c.HookSubjectPrefix); err != nil {
		return "", fmt.Errorf("--hook-subject-prefix: %w", err)
	}
	return c.HookSubjectPrefix, nil
}
