package main

import (
	"io"

	"github.com/spf13/cobra"

	"github.com/metabus/metabus/pkg/opscli"
)

// explainCommand is `metabus explain ns/name`: one parent's controller,
// last hook calls and answer, the writes that followed, what waits for it
// on the bus, and its Events.
func explainCommand() *cobra.Command {
	var (
		f *opsFlags
		o opscli.ExplainOptions
	)
	cmd := &cobra.Command{
		Use:   "explain NAMESPACE/NAME",
		Short: "Explain one parent: its last hook calls and answer, the writes that followed, pending work, Events",
		Long: `Answer "why is this parent not converging": the controller that owns it, the
dispatchers' record of its last syncs (each hook call, how long it took, its
error, and a summary of the answer: children and status), the appliers'
record of the applies that followed (result, error and each object written),
what waits for it on the bus (work items waiting or in flight, desired states,
a pending retry or resync, DLQ entries) and its Kubernetes Events.

The sync and apply records live in the memory of the replicas that made
them: a replica restarted since knows nothing older.`,
		Example: `  metabus explain default/my-hello
  metabus explain default/web --controller cc/webapps
  metabus explain default/web --resource webapps.example.com -o yaml`,
		Args: usageArgs(1, "one parent: NAMESPACE/NAME, or NAME for a cluster-scoped one"),
		RunE: func(cmd *cobra.Command, args []string) error {
			format, err := f.format()
			if err != nil {
				return err
			}
			o.Object = args[0]
			if _, _, err := opscli.ParseObjectName(o.Object); err != nil {
				return err
			}
			b, done, err := f.connect(runCtx(cmd), needCluster|needNATS)
			if err != nil {
				return err
			}
			defer done()
			ex, err := b.Explain(runCtx(cmd), o)
			if err != nil {
				return err
			}
			return opscli.Print(cmd.OutOrStdout(), format, ex, func(w io.Writer) error { return opscli.WriteExplanation(w, ex) })
		},
	}
	f = newOpsFlags(cmd)
	cmd.Flags().StringVar(&o.Controller, "controller", "", "the parent's controller, when several controllers have a parent of that name: <kind>/<name> or a name")
	cmd.Flags().StringVar(&o.Resource, "resource", "", "the parent's resource, when several controllers have a parent of that name: <resource>[.<group>] or the kind")
	return cmd
}
