package main

import (
	"fmt"
	"io"

	"github.com/spf13/cobra"

	"github.com/metabus/metabus/pkg/opscli"
)

// dlqCommand is `metabus dlq list|show|replay|purge`: the messages MC_DLQ
// keeps after their deliveries ran out.
func dlqCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "dlq",
		Short: "List, show, replay and purge the dead-letter queue (MC_DLQ)",
		Long: `MC_DLQ keeps, for a week, the work items and desired states whose deliveries
ran out (their handler kept crashing or hanging). list and show read it
(the read-only operator user may); replay and purge change it (the
operator-admin user).`,
	}
	// Each subcommand has its own connection and output flags.
	var lf, sf, rf, pf *opsFlags
	var filter opscli.DLQFilter
	addFilter := func(c *cobra.Command) {
		c.Flags().StringVar(&filter.Controller, "controller", "", "only entries of this controller: <kind>/<name> or a name")
		c.Flags().StringVar(&filter.Parent, "parent", "", "only entries of this parent: namespace/name or name")
		c.Flags().StringVar(&filter.Stage, "stage", "", "only entries of this stage: work or desired")
	}

	var limit int
	list := &cobra.Command{
		Use:     "list",
		Short:   "List DLQ entries",
		Example: "  metabus dlq list --controller cc/hello\n  metabus dlq list --parent default/my-hello -o json",
		Args:    usageArgs(0, "no arguments (filter with --controller, --parent, --stage)"),
		RunE: func(cmd *cobra.Command, _ []string) error {
			format, err := lf.format()
			if err != nil {
				return err
			}
			b, done, err := lf.connect(runCtx(cmd), needNATS)
			if err != nil {
				return err
			}
			defer done()
			entries, err := b.DLQList(runCtx(cmd), filter, limit)
			if err != nil {
				return err
			}
			for i := range entries {
				entries[i].Body = nil // show prints bodies
			}
			if entries == nil {
				entries = []opscli.DLQEntry{}
			}
			return opscli.Print(cmd.OutOrStdout(), format, entries, func(w io.Writer) error {
				return opscli.WriteDLQ(w, b.Now(), entries)
			})
		},
	}
	lf = newOpsFlags(list)
	addFilter(list)
	list.Flags().IntVar(&limit, "limit", 0, "at most this many entries (0: all)")

	show := &cobra.Command{
		Use:     "show SEQ...",
		Short:   "Show DLQ entries in full (Secret data is never parked)",
		Example: "  metabus dlq show 42",
		Args: func(_ *cobra.Command, args []string) error {
			if len(args) == 0 {
				return opscli.Usage("want one or more DLQ entry numbers (the SEQ column of metabus dlq list)")
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			format, err := sf.format()
			if err != nil {
				return err
			}
			seqs, err := opscli.ParseSeqs(args)
			if err != nil {
				return err
			}
			b, done, err := sf.connect(runCtx(cmd), needNATS)
			if err != nil {
				return err
			}
			defer done()
			entries, err := b.DLQList(runCtx(cmd), opscli.DLQFilter{Seqs: seqs}, 0)
			if err != nil {
				return err
			}
			return opscli.Print(cmd.OutOrStdout(), format, entries, func(w io.Writer) error {
				for i, e := range entries {
					if i > 0 {
						fmt.Fprintln(w)
					}
					if err := opscli.WriteDLQEntry(w, b.Now(), e); err != nil {
						return err
					}
				}
				return nil
			})
		},
	}

	sf = newOpsFlags(show)

	var keep, all bool
	replay := &cobra.Command{
		Use:   "replay [SEQ...]",
		Short: "Sync the parents of DLQ entries again, from the cluster",
		Long: `Replay re-derives each entry's work from the cluster: it reads the entry's
controller and parent as they are now and publishes a fresh work item for the
parent (its map key for a MapController item), as the watcher would; the
parked message is never republished. Replayed entries are removed (--keep
keeps them). An entry whose parent or controller is gone is left for purge.`,
		Example: "  metabus dlq replay 42 43\n  metabus dlq replay --controller cc/hello --all",
		Args:    cobra.ArbitraryArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			format, err := rf.format()
			if err != nil {
				return err
			}
			sel := filter
			if sel.Seqs, err = opscli.ParseSeqs(args); err != nil {
				return err
			}
			if sel.Empty() && !all {
				return opscli.Usage("replay what? give entry numbers, --controller, --parent or --stage, or --all for every entry")
			}
			b, done, err := rf.connect(runCtx(cmd), needCluster|needNATS)
			if err != nil {
				return err
			}
			defer done()
			ctx := runCtx(cmd)
			entries, err := b.DLQList(ctx, sel, 0)
			if err != nil {
				return err
			}
			rs, err := b.DLQReplay(ctx, entries, keep)
			if err != nil {
				return err
			}
			if rs == nil {
				rs = []opscli.ReplayResult{}
			}
			if err := opscli.Print(cmd.OutOrStdout(), format, rs, func(w io.Writer) error { return opscli.WriteReplay(w, rs) }); err != nil {
				return err
			}
			for _, r := range rs {
				if r.Result == "failed" {
					return fmt.Errorf("some entries could not be replayed")
				}
			}
			return nil
		},
	}
	rf = newOpsFlags(replay)
	addFilter(replay)
	replay.Flags().BoolVar(&keep, "keep", false, "keep replayed entries in the DLQ")
	replay.Flags().BoolVar(&all, "all", false, "with no other selection: every entry")

	var purgeAll bool
	purge := &cobra.Command{
		Use:     "purge [SEQ...]",
		Short:   "Remove DLQ entries",
		Example: "  metabus dlq purge 42\n  metabus dlq purge --controller cc/hello\n  metabus dlq purge --all",
		Args:    cobra.ArbitraryArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			sel := filter
			var err error
			if sel.Seqs, err = opscli.ParseSeqs(args); err != nil {
				return err
			}
			if sel.Empty() && !purgeAll {
				return opscli.Usage("purge what? give entry numbers, --controller, --parent or --stage, or --all for every entry")
			}
			b, done, err := pf.connect(runCtx(cmd), needNATS)
			if err != nil {
				return err
			}
			defer done()
			n, err := b.DLQPurge(runCtx(cmd), sel, purgeAll)
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "removed %d entries\n", n)
			return nil
		},
	}
	pf = newOpsFlags(purge)
	addFilter(purge)
	purge.Flags().BoolVar(&purgeAll, "all", false, "with no other selection: every entry")

	cmd.AddCommand(list, show, replay, purge)
	return cmd
}
