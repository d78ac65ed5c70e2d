// Package clitest checks a metabus binary's command line from its tests:
// that it takes every flag of upstream Metacontroller with a value upstream
// takes, in each spelling manifests use, without starting anything; and
// that its /readyz means ready, against real NATS and API servers.
package clitest

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/metabus/metabus/pkg/cli"
)

// UpstreamFlag is one flag of upstream Metacontroller v4.17.2 with a value
// upstream accepts.
type UpstreamFlag struct {
	Name  string
	Value string
	// Bool flags are also given without a value.
	Bool bool
}

// UpstreamFlags are every flag upstream Metacontroller v4.17.2 registers,
// read from its source: pkg/cmd/metacontroller/main.go (the flag.* calls),
// controller-runtime's zap Options.BindFlags (the --zap-* flags) and
// controller-runtime's client/config (--kubeconfig). Its binary's -help
// lists exactly these. The values are ones upstream takes.
var UpstreamFlags = []UpstreamFlag{
	{Name: "discovery-interval", Value: "20s"},
	{Name: "cache-flush-interval", Value: "10m"},
	{Name: "metrics-address", Value: "0"},
	{Name: "client-go-qps", Value: "50"},
	{Name: "client-go-burst", Value: "100"},
	{Name: "workers", Value: "7"},
	{Name: "events-qps", Value: "0.5"},
	{Name: "events-burst", Value: "30"},
	{Name: "pprof-address", Value: "0"},
	{Name: "leader-election", Value: "true", Bool: true},
	{Name: "leader-election-resource-lock", Value: "leases"},
	{Name: "leader-election-namespace", Value: "metacontroller"},
	{Name: "leader-election-id", Value: "metacontroller"},
	{Name: "health-probe-bind-address", Value: "0"},
	{Name: "target-label-selector", Value: "app.kubernetes.io/part-of=platform"},
	{Name: "apply-strategy", Value: "server-side-apply"},
	{Name: "apply-strategy-ssa-field-manager", Value: "metacontroller"},
	{Name: "zap-devel", Value: "false", Bool: true},
	{Name: "zap-encoder", Value: "json"},
	{Name: "zap-log-level", Value: "4"},
	{Name: "zap-stacktrace-level", Value: "panic"},
	{Name: "zap-time-encoding", Value: "rfc3339"},
	{Name: "kubeconfig", Value: "/etc/kubeconfig"},
}

// Spellings are the ways manifests and scripts pass a flag: pflag's and Go
// flag's --flag=value, --flag value (a bool alone) and Go flag's
// -flag=value.
var Spellings = map[string]func(f UpstreamFlag) []string{
	"--flag=value": func(f UpstreamFlag) []string { return []string{"--" + f.Name + "=" + f.Value} },
	"--flag value": func(f UpstreamFlag) []string {
		if f.Bool {
			return []string{"--" + f.Name}
		}
		return []string{"--" + f.Name, f.Value}
	},
	"-flag=value": func(f UpstreamFlag) []string { return []string{"-" + f.Name + "=" + f.Value} },
}

// AcceptsUpstreamFlags runs the command newCmd builds with every upstream
// flag at once, in each spelling, with its run replaced so that nothing
// starts; the flags must parse, pass validation, and each be seen as set.
func AcceptsUpstreamFlags(t *testing.T, newCmd func() *cobra.Command) {
	t.Helper()
	if got, want := len(UpstreamFlags), len(cli.UpstreamFlagNames()); got != want {
		t.Errorf("the test knows %d upstream flags, package cli %d", got, want)
	}
	for spelling, spell := range Spellings {
		t.Run(spelling, func(t *testing.T) {
			var args []string
			for _, f := range UpstreamFlags {
				args = append(args, spell(f)...)
			}
			cmd := newCmd()
			var ran bool
			cmd.RunE = func(c *cobra.Command, _ []string) error {
				ran = true
				for _, f := range UpstreamFlags {
					if !c.Flags().Changed(f.Name) {
						t.Errorf("--%s was not parsed", f.Name)
					}
				}
				if got := flagValue(c.Flags(), "workers"); got != "7" {
					t.Errorf("--workers = %s, want 7", got)
				}
				return nil
			}
			var stdout, stderr bytes.Buffer
			if code := cli.Run(context.Background(), cmd, args, &stdout, &stderr); code != cli.ExitOK {
				t.Fatalf("%s %s: exit code %d\n%s", cmd.Name(), strings.Join(args, " "), code, stderr.String())
			}
			if !ran {
				t.Fatal("the command did not get to run")
			}
		})
	}
}

func flagValue(fs *pflag.FlagSet, name string) string {
	if f := fs.Lookup(name); f != nil {
		return f.Value.String()
	}
	return ""
}

// RefusesStrayWords checks that the command, given an unknown subcommand
// or a positional argument, exits with the usage and runs nothing.
func RefusesStrayWords(t *testing.T, newCmd func() *cobra.Command) {
	t.Helper()
	for _, args := range [][]string{
		// A word that is no subcommand (status was none before the
		// operator subcommands existed).
		{"stauts", "--kubeconfig=/nonexistent"},
		{"--kubeconfig=/nonexistent", "extra"},
		{"--workers", "3", "4"},
	} {
		cmd := newCmd()
		ran := false
		cmd.RunE = func(*cobra.Command, []string) error { ran = true; return nil }
		var stdout, stderr bytes.Buffer
		code := cli.Run(context.Background(), cmd, args, &stdout, &stderr)
		if code != cli.ExitUsage || ran || !strings.Contains(stderr.String(), "Usage:") {
			t.Errorf("%s %s: exit code %d (want %d), ran %v, stderr:\n%s", cmd.Name(), strings.Join(args, " "), code, cli.ExitUsage, ran, stderr.String())
		}
	}
}
