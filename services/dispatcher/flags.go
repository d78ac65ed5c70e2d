package dispatcher

import (
	"flag"
	"strings"

	"github.com/metabus/metabus/pkg/related"
)

// RegisterFlags adds the dispatcher's own flags; shared ones (--workers,
// --snapshot-wait, --events-qps...) live in pkg/cli.
func (c *Config) RegisterFlags(fs *flag.FlagSet) {
	fs.BoolVar(&c.RunRelay, "run-schedule-relay", true, "relay fired schedules (retries, resyncs) into MC_WORK from this replica")
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
	fs.Func("related-resources", "comma-separated <group>/<resource> (core/configmaps, apps/*, * for all) that customize hooks' "+
		"related rules may name; -<group>/<resource> denies and wins over any allow. A refused rule fails the sync with a SyncError. "+
		"Repeatable (default "+strings.Join(related.DefaultPolicy, ",")+")",
		related.AppendEntries(related.RelatedSetting, &c.RelatedResources))
}
