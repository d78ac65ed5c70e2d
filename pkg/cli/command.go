package cli

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/metabus/metabus/pkg/version"
)

// Service is one binary that runs metabus services: a service's own
// binary, or the all-in-one `metabus`.
type Service struct {
	// Name is the binary's name (metabus-watcher), used in usage, logs and
	// as its NATS connection name.
	Name string
	// Stage is what it runs; it decides which upstream flags it ignores.
	Stage Stage
	// Short and Long describe it in --help.
	Short, Long string
	// Flags registers the service's own flags (services/*/flags.go) on a
	// Go flag set, bridged into the command's.
	Flags func(fs *flag.FlagSet)
	// Run runs the service until ctx is done.
	Run func(ctx context.Context, env Env) error
}

// Command is the cobra command that runs s: it takes flags only (a stray
// argument is an error, and nothing starts), prints the build for
// --version, and refuses values upstream's flags do not take before
// starting anything.
func (s Service) Command() *cobra.Command {
	common := &CommonFlags{}
	gfs := flag.NewFlagSet(s.Name, flag.ContinueOnError)
	common.Register(gfs, ":9999", ":8081")
	if s.Flags != nil {
		s.Flags(gfs)
	}
	if err := acceptUpstream(gfs, s.Stage); err != nil {
		// A binary built without one of upstream's flags: caught by each
		// binary's test, never by a user.
		panic(err)
	}
	cmd := &cobra.Command{
		Use:     s.Name + " [flags]",
		Short:   s.Short,
		Long:    s.Long,
		Version: version.Get().String(),
		Args:    cobra.NoArgs,
		PreRunE: func(*cobra.Command, []string) error {
			if err := common.Validate(func(name string) bool { return ignoredReason(s.Stage, name) != "" }); err != nil {
				return invalidError{err}
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runService(cmd.Context(), s, common, cmd.Flags())
		},
	}
	cmd.Flags().AddGoFlagSet(gfs)
	return cmd
}

// VersionCommand is `version`: the build's version, git revision and Go
// version, as --version prints them, or as JSON with -o json.
func VersionCommand() *cobra.Command {
	var output string
	cmd := &cobra.Command{
		Use:   "version",
		Short: "Print the version, git revision and Go version of this build",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			info := version.Get()
			switch output {
			case "":
				_, err := fmt.Fprintf(cmd.OutOrStdout(), "%s version %s\n", cmd.Root().Name(), info)
				return err
			case "json":
				enc := json.NewEncoder(cmd.OutOrStdout())
				enc.SetIndent("", "  ")
				return enc.Encode(info)
			default:
				return invalidError{fmt.Errorf("--output=%q: want json, or nothing for one line", output)}
			}
		},
	}
	cmd.Flags().StringVarP(&output, "output", "o", "", "output format: json (default: one line)")
	return cmd
}

// Exit codes of Run.
const (
	ExitOK = 0
	// ExitFailure: the command ran and failed.
	ExitFailure = 1
	// ExitUsage: the command line was wrong (an unknown subcommand, flag
	// or argument, or a value a flag does not take); nothing ran.
	ExitUsage = 2
)

// usageError is a command line the command does not understand: reported
// with the command's usage.
type usageError struct{ err error }

func (e usageError) Error() string { return e.err.Error() }
func (e usageError) Unwrap() error { return e.err }

// invalidError is a flag value the command refuses: reported with what to
// do instead, without the usage.
type invalidError struct{ err error }

func (e invalidError) Error() string { return e.err.Error() }
func (e invalidError) Unwrap() error { return e.err }

// exitCoder is an error that says which exit code it calls for (package
// opscli's ExitCodeError).
type exitCoder interface {
	error
	ExitCode() int
}

// reportedError failed a run that already logged why.
type reportedError struct{ err error }

func (e reportedError) Error() string { return e.err.Error() }
func (e reportedError) Unwrap() error { return e.err }

// Execute runs root with the process's arguments until SIGINT or SIGTERM,
// and exits with Run's code.
func Execute(root *cobra.Command) {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	code := Run(ctx, root, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// Run runs root (or the subcommand args name) with args and returns the
// exit code. Go-style single-dash long flags are accepted as their
// double-dash form. Every command of the tree refuses positional arguments
// unless it declares its own Args; an unknown subcommand, flag or argument
// prints the usage and returns ExitUsage before anything runs.
func Run(ctx context.Context, root *cobra.Command, args []string, stdout, stderr io.Writer) int {
	prepare(root)
	root.SetArgs(normalizeArgs(root, args))
	root.SetOut(stdout)
	root.SetErr(stderr)
	cmd, err := root.ExecuteContextC(ctx)
	if err == nil {
		return ExitOK
	}
	var (
		ue usageError
		ie invalidError
		re reportedError
		ec exitCoder
	)
	switch {
	case errors.As(err, &ec):
		// A subcommand's own exit code (an operator subcommand's "not
		// found", say), with its message.
		fmt.Fprintf(stderr, "Error: %v\n", err)
		return ec.ExitCode()
	case errors.As(err, &ue):
		fmt.Fprintf(stderr, "Error: %v\n\n%s", err, cmd.UsageString())
		return ExitUsage
	case errors.As(err, &ie):
		fmt.Fprintf(stderr, "Error: %v\n", err)
		return ExitUsage
	case errors.As(err, &re):
		return ExitFailure
	default:
		fmt.Fprintf(stderr, "Error: %v\n", err)
		return ExitFailure
	}
}

// prepare makes every command of the tree report errors through Run:
// silenced by cobra, and flag and argument errors marked as usage errors.
// A command without an Args rule takes no arguments: cobra would let a
// subcommand take any.
func prepare(root *cobra.Command) {
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageError{err} })
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		c.SilenceErrors, c.SilenceUsage = true, true
		args := c.Args
		if args == nil {
			args = cobra.NoArgs
		}
		c.Args = func(c *cobra.Command, a []string) error {
			if err := args(c, a); err != nil {
				var ue usageError
				if errors.As(err, &ue) {
					return err
				}
				return usageError{err}
			}
			return nil
		}
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	walk(root)
}

// normalizeArgs rewrites Go-style long flags (-workers=5, -kubeconfig x)
// of any command in the tree to pflag's --workers=5, so that manifests
// written for upstream's Go-flag binary keep working. Values (the word
// after a flag that takes one) and everything after "--" are left alone.
func normalizeArgs(root *cobra.Command, args []string) []string {
	long, short := map[string]bool{"help": false, "version": false}, map[string]bool{"h": false}
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		for _, fs := range []*pflag.FlagSet{c.Flags(), c.PersistentFlags()} {
			fs.VisitAll(func(f *pflag.Flag) {
				takes := f.NoOptDefVal == ""
				long[f.Name] = long[f.Name] || takes
				if f.Shorthand != "" {
					short[f.Shorthand] = short[f.Shorthand] || takes
				}
			})
		}
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	walk(root)
	out := make([]string, 0, len(args))
	value := false
	for i, a := range args {
		switch {
		case value:
			value = false
		case a == "--":
			return append(out, args[i:]...)
		case strings.HasPrefix(a, "--"):
			name, _, hasValue := strings.Cut(a[2:], "=")
			value = !hasValue && long[name]
		case len(a) > 2 && a[0] == '-':
			name, _, hasValue := strings.Cut(a[1:], "=")
			if takes, known := long[name]; known && len(name) > 1 {
				a = "-" + a
				value = !hasValue && takes
			} else if len(name) == 1 {
				value = !hasValue && short[name]
			}
		case len(a) == 2 && a[0] == '-':
			value = short[a[1:]]
		}
		out = append(out, a)
	}
	return out
}
