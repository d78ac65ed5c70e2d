package main

import (
	"github.com/spf13/cobra"

	"github.com/metabus/metabus/pkg/opscli"
)

// tailCommand is `metabus tail`: work items, schedules, desired states and
// the replicas' sync and apply records, live, one line each.
func tailCommand() *cobra.Command {
	var (
		f *opsFlags
		o opscli.TailOptions
	)
	cmd := &cobra.Command{
		Use:   "tail",
		Short: "Follow work items, hook calls and desired states live",
		Long: `Follow, as they happen, the work items published (WORK), the retries and
resyncs scheduled (SCHEDULE), each sync with its hook calls (SYNC, from the
dispatchers), the desired states published (DESIRED) and each apply (APPLY,
from the appliers), one line each. -o json prints the events themselves: the
CloudEvents in their JSON form (Secret data blanked) and the replicas'
records. Nothing is consumed or acknowledged: tail listens to core NATS.`,
		Example: `  metabus tail
  metabus tail --controller cc/hello --parent default/my-hello
  metabus tail -o json | jq .`,
		Args: usageArgs(0, "no arguments (filter with --controller and --parent)"),
		RunE: func(cmd *cobra.Command, _ []string) error {
			format, err := f.format()
			if err != nil {
				return err
			}
			if format == opscli.YAML {
				return opscli.Usage("tail prints table or json (one JSON object per line)")
			}
			o.Format = format
			b, done, err := f.connect(runCtx(cmd), needNATS)
			if err != nil {
				return err
			}
			defer done()
			return b.Tail(runCtx(cmd), o, cmd.OutOrStdout())
		},
	}
	f = newOpsFlags(cmd)
	cmd.Flags().StringVar(&o.Controller, "controller", "", "only this controller: <kind>/<name> or a name")
	cmd.Flags().StringVar(&o.Parent, "parent", "", "only this parent: namespace/name or name")
	return cmd
}
