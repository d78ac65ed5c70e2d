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
	fs.Func("secret-namespaces", "comma-separated namespaces, besides the dispatcher's own (POD_NAMESPACE, else metabus), "+
		"whose Secrets and ConfigMaps webhook TLS/auth options may reference; * for all (needs a cluster-wide get in RBAC). Repeatable",
		func(v string) error {
			ns, err := parseNamespaces(v)
			if err != nil {
				return err
			}
			c.SecretNamespaces = append(c.SecretNamespaces, ns...)
			return nil
		})
	fs.Func("related-resources", "comma-separated <group>/<resource> (core/configmaps, apps/*, * for all) that customize hooks' "+
		"related rules may name; -<group>/<resource> denies and wins over any allow. A refused rule fails the sync with a SyncError. "+
		"Repeatable (default "+strings.Join(related.DefaultPolicy, ",")+")",
		related.AppendEntries(related.RelatedSetting, &c.RelatedResources))
}
