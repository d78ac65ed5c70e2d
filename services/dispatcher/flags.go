package dispatcher

import (
	"flag"
	"net/netip"
	"slices"
	"strings"

	"github.com/metabus/metabus/pkg/hooks"
	"github.com/metabus/metabus/pkg/related"
)

// RegisterFlags adds the dispatcher's own flags; shared ones (--workers,
// --snapshot-wait, --events-qps...) live in pkg/cli.
func (c *Config) RegisterFlags(fs *flag.FlagSet) {
	fs.BoolVar(&c.RunRelay, "run-schedule-relay", true, "relay fired schedules (retries, resyncs) into MC_WORK from this replica")
	fs.IntVar(&c.ResyncAfterBacklog, "resync-after-backlog", 0, "a resync a hook asks for (resyncAfterSeconds) goes into MC_WORK "+
		"only while its controller has fewer than this many items there, and waits otherwise, so one controller's requests cannot fill "+
		"the partitions every controller shares (0: unpaced, as upstream)")
	fs.IntVar(&c.Headroom, "max-held-per-controller", DefaultHeadroom, "how many work items of one controller a replica holds in hand "+
		"from one MC_WORK partition, running or waiting their turn, once it holds half that partition's window (every controller together); one beyond it is put off (scheduled again in MC_SCHED, then acked), "+
		"so that one controller whose hook hangs or whose parents flood cannot fill the partition's MaxAckPending, which every controller "+
		"hashed to it shares (negative: no bound)")
	fs.BoolVar(&c.RunDLQ, "run-dead-letter", true, "move poison messages to MC_DLQ from this replica")
	// Unset, every namespace is allowed (upstream's behaviour); the first
	// use replaces that with the list given, so an empty value leaves the
	// dispatcher's own namespace alone (the hardened profile).
	fs.Func("secret-namespaces", "comma-separated namespaces, besides the dispatcher's own (POD_NAMESPACE, else metabus), "+
		"whose Secrets and ConfigMaps webhook TLS/auth options may reference; * for all. Unset: all namespaces, as upstream "+
		"(the shipped RBAC grants a cluster-wide get); empty: the own namespace only (the hardened profile). Repeatable",
		func(v string) error {
			ns, err := parseNamespaces(v)
			if err != nil {
				return err
			}
			if c.SecretNamespaces == nil {
				c.SecretNamespaces = []string{}
			}
			c.SecretNamespaces = append(c.SecretNamespaces, ns...)
			return nil
		})
	fs.Func("hook-credential-secrets", "comma-separated names of Secrets in the dispatcher's own namespace that webhook TLS/auth "+
		"options may reference (default none: that namespace holds metabus's own keys; metabus-nats-* and Helm's sh.helm.release.v1.* "+
		"are refused even when listed). Repeatable",
		func(v string) error {
			names, err := parseSecretNames(v)
			if err != nil {
				return err
			}
			c.HookCredentialSecrets = append(c.HookCredentialSecrets, names...)
			return nil
		})
	fs.Func("related-resources", "comma-separated <group>/<resource> (core/configmaps, apps/*, * for all) that customize hooks' "+
		"related rules may name; -<group>/<resource> denies and wins over any allow. A refused rule fails the sync with a SyncError. "+
		"Repeatable (default "+strings.Join(related.DefaultPolicy, ",")+")",
		related.AppendEntries(related.RelatedSetting, &c.RelatedResources))
	fs.Func("hook-destinations", "comma-separated entries saying where hooks may be called, read in order, the first match deciding "+
		"(none matching: denied): [-]TARGET[:PORT], TARGET one of *, a host name, *.<domain>, an IP, a CIDR ([v6]:port with a port), "+
		"loopback, link-local (with cloud metadata addresses), private, apiserver; - denies. Checked at every dial after DNS resolution, "+
		"redirects included; an allowed host name is still denied an address in loopback, link-local, apiserver or a later denying "+
		"address entry unless written trust:NAME. "+
		"E.g. -loopback,-link-local,-apiserver,*. Repeatable (default *: anywhere, as upstream)",
		func(v string) error {
			// The API server's addresses are resolved at start; the syntax is checked now.
			named := map[string][]netip.Prefix{APIServerSet: nil}
			if _, err := hooks.ParseDestinations(append(slices.Clone(c.HookDestinations), v), named, HookDestinationsSetting); err != nil {
				return err
			}
			c.HookDestinations = append(c.HookDestinations, v)
			return nil
		})
	fs.DurationVar(&c.MergeWait, "merge-wait", DefaultMergeWait, "how long a sync of a parent whose previous answer is still "+
		"being applied waits for that apply, so that the hook sees all of the answer's writes in one call; a change by anyone "+
		"else waits at most this long. Negative: never wait")
	fs.BoolVar(&c.RefuseInsecureCredentials, "refuse-insecure-credentials", false,
		"never send webhook credentials over plain http, whatever a webhook's allowInsecureCredentials says")
	c.registerHookNATSFlags(fs)
}
