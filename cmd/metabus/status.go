package main

import (
	"fmt"
	"io"
	"time"

	"github.com/spf13/cobra"

	"github.com/metabus/metabus/pkg/opscli"
)

// statusCommand is `metabus status`: per stage, replicas and partitions
// held; per controller, work waiting and in flight, the oldest item's age,
// retries, desired states, schedules, DLQ entries, hook calls, applies and
// errors in the last minutes, and the last error.
func statusCommand() *cobra.Command {
	var (
		f        *opsFlags
		o        opscli.StatusOptions
		watch    bool
		interval time.Duration
	)
	cmd := &cobra.Command{
		Use:   "status",
		Short: "Show the stages, partitions and per-controller queues, activity and errors",
		Long: `Show what the bus and the cluster hold about metabus: per stage, its replicas
and the partitions each holds (leases in KV MC_OWNERS); per controller, the
work items waiting for a replica and in flight, the oldest one's age, items
retrying, desired states not yet applied, schedules, DLQ entries, and the hook
calls, applies and errors of the last minutes with the last error (as the
dispatcher and applier replicas recorded them since they started).`,
		Example: `  metabus status
  metabus status --controller cc/hello -o json
  metabus status --watch --interval 5s`,
		Args: usageArgs(0, "no arguments"),
		RunE: func(cmd *cobra.Command, _ []string) error {
			format, err := f.format()
			if err != nil {
				return err
			}
			b, done, err := f.connect(runCtx(cmd), needCluster|needNATS)
			if err != nil {
				return err
			}
			defer done()
			ctx := runCtx(cmd)
			for {
				st, err := b.GetStatus(ctx, o)
				if err != nil {
					return err
				}
				if watch && format == opscli.Table {
					// Clear the terminal and redraw, as watch(1) does.
					fmt.Fprint(cmd.OutOrStdout(), "\033[H\033[2J")
					fmt.Fprintf(cmd.OutOrStdout(), "Every %s: metabus status    %s\n\n", interval, st.Time.Format(time.RFC3339))
				}
				if err := opscli.Print(cmd.OutOrStdout(), format, st, func(w io.Writer) error {
					return opscli.WriteStatus(w, st)
				}); err != nil {
					return err
				}
				if !watch {
					return nil
				}
				select {
				case <-ctx.Done():
					return nil
				case <-time.After(interval):
				}
			}
		},
	}
	f = newOpsFlags(cmd)
	fs := cmd.Flags()
	fs.StringVar(&o.Controller, "controller", "", "only this controller: <kind>/<name> (cc/, dc/, mc/ or the full kind) or a name")
	fs.DurationVar(&o.Window, "window", 5*time.Minute, "how far back hook calls, applies and errors are counted (at most 15m)")
	fs.IntVar(&o.ScanLimit, "scan-limit", 1000, "work items read per controller to tell waiting from in-flight ones")
	fs.StringVar(&o.LeaderNamespace, "leader-election-namespace", "metabus", "namespace of the watcher's leader-election Lease")
	fs.StringVar(&o.LeaderName, "leader-election-id", "metabus-watcher", "name of the watcher's leader-election Lease")
	fs.BoolVarP(&watch, "watch", "w", false, "redraw every --interval until interrupted")
	fs.DurationVar(&interval, "interval", 2*time.Second, "how often --watch redraws")
	return cmd
}
