package cli

import (
	"bytes"
	"context"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/spf13/cobra"

	"github.com/metabus/metabus/services/watcher"
)

func TestNormalizeArgs(t *testing.T) {
	root := &cobra.Command{Use: "metabus"}
	root.Flags().String("kubeconfig", "", "")
	root.Flags().Bool("leader-election", false, "")
	root.Flags().Int("workers", 5, "")
	sub := &cobra.Command{Use: "status"}
	sub.Flags().StringP("output", "o", "", "")
	sub.Flags().String("nats-listen", "", "")
	root.AddCommand(sub)
	cases := []struct {
		reason string
		args   []string
		want   []string
	}{
		{reason: "pflag spellings are left alone", args: []string{"--workers=5", "--kubeconfig", "/k", "--leader-election"},
			want: []string{"--workers=5", "--kubeconfig", "/k", "--leader-election"}},
		{reason: "Go-style -flag=value becomes --flag=value", args: []string{"-workers=5", "-leader-election=false"},
			want: []string{"--workers=5", "--leader-election=false"}},
		{reason: "Go-style -flag value: the value is kept as is", args: []string{"-kubeconfig", "-odd-but-a-path", "-workers", "3"},
			want: []string{"--kubeconfig", "-odd-but-a-path", "--workers", "3"}},
		{reason: "a Go-style bool takes no separate value", args: []string{"-leader-election", "-workers=2"},
			want: []string{"--leader-election", "--workers=2"}},
		{reason: "a value that looks like a flag after --flag", args: []string{"--nats-listen", "-", "-workers=1"},
			want: []string{"--nats-listen", "-", "--workers=1"}},
		{reason: "shorthand flags and their values are left alone", args: []string{"status", "-o", "-workers", "-ojson"},
			want: []string{"status", "-o", "-workers", "-ojson"}},
		{reason: "unknown single-dash words are left for the parser to refuse", args: []string{"-bogus=1", "-h"},
			want: []string{"-bogus=1", "-h"}},
		{reason: "nothing after -- is touched", args: []string{"-workers=1", "--", "-workers=2"},
			want: []string{"--workers=1", "--", "-workers=2"}},
		{reason: "help and version", args: []string{"-help", "-version"}, want: []string{"--help", "--version"}},
	}
	for _, c := range cases {
		t.Run(c.reason, func(t *testing.T) {
			if diff := cmp.Diff(c.want, normalizeArgs(root, c.args)); diff != "" {
				t.Errorf("normalizeArgs(%q) (-want +got):\n%s", c.args, diff)
			}
		})
	}
}

// unreachableKubeconfig writes a kubeconfig whose server nobody serves (a
// port below 1024 on loopback that nothing listens on in a test).
func unreachableKubeconfig(t *testing.T) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "kubeconfig")
	data := `apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:1"}}]
users: [{name: u, user: {token: x}}]
contexts: [{name: c, context: {cluster: c, user: u}}]
current-context: c
`
	if err := os.WriteFile(path, []byte(data), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestServiceCommandLine: what a service binary does with its command
// line. Every case that must not start the service checks that its run
// function was never called; the others run it (it returns at once).
func TestServiceCommandLine(t *testing.T) {
	kubeconfig := unreachableKubeconfig(t)
	quiet := []string{"--kubeconfig=" + kubeconfig, "--metrics-address=0", "--health-probe-bind-address=0", "--zap-log-level=error"}
	cases := []struct {
		reason     string
		stage      Stage
		args       []string
		wantCode   int
		wantRun    bool
		wantStdout string
		wantStderr []string
	}{
		{reason: "flags only: the service runs", stage: Watcher, args: quiet, wantRun: true},
		{reason: "a stray positional argument: usage, nothing starts", stage: Watcher, args: append([]string{"status"}, quiet...),
			wantCode: ExitUsage, wantStderr: []string{`unknown command "status" for "metabus-test"`, "Usage:"}},
		{reason: "a positional argument after the flags", stage: Dispatcher, args: append(quiet, "extra"),
			wantCode: ExitUsage, wantStderr: []string{`unknown command "extra"`, "Usage:"}},
		{reason: "an unknown flag", stage: Watcher, args: append(quiet, "--no-such-flag=1"),
			wantCode: ExitUsage, wantStderr: []string{"unknown flag: --no-such-flag", "Usage:"}},
		{reason: "a value a flag's type refuses", stage: Watcher, args: append(quiet, "--workers=many"),
			wantCode: ExitUsage, wantStderr: []string{`invalid argument "many"`}},
		{reason: "--version prints the build and starts nothing", stage: Applier, args: []string{"--version"},
			wantStdout: "metabus-test version dev"},
		{reason: "Go-style -version", stage: Applier, args: []string{"-version"}, wantStdout: "metabus-test version"},
		{reason: "a lock other than leases is refused where leader election means something", stage: Watcher,
			args: append(quiet, "--leader-election-resource-lock=configmapsleases"), wantCode: ExitUsage,
			wantStderr: []string{`--leader-election-resource-lock="configmapsleases" is not supported`, "use --leader-election-resource-lock=leases"}},
		{reason: "the lock is only logged where leader election means nothing", stage: Dispatcher,
			args: append(quiet, "--leader-election-resource-lock=configmapsleases"), wantRun: true},
		{reason: "an unknown apply strategy is refused as upstream refuses it", stage: Applier,
			args: append(quiet, "--apply-strategy=replace"), wantCode: ExitUsage, wantStderr: []string{`unknown apply strategy`, ApplyServerSide}},
		{reason: "upstream's server-side apply strategy is accepted", stage: Applier,
			args: append(quiet, "--apply-strategy=server-side-apply", "--apply-strategy-ssa-field-manager=mine"), wantRun: true},
		{reason: "an invalid --zap-stacktrace-level", stage: Revisions, args: append(quiet, "--zap-stacktrace-level=warn"),
			wantCode: ExitUsage, wantStderr: []string{`unknown stacktrace level "warn"`}},
	}
	for _, c := range cases {
		t.Run(c.reason, func(t *testing.T) {
			ran := false
			var got *CommonFlags
			cmd := Service{Name: "metabus-test", Stage: c.stage, Flags: stageFlags(c.stage), Run: func(_ context.Context, env Env) error {
				ran, got = true, env.Flags
				return nil
			}}.Command()
			var stdout, stderr bytes.Buffer
			code := Run(context.Background(), cmd, c.args, &stdout, &stderr)
			if code != c.wantCode {
				t.Errorf("exit code %d, want %d; stderr:\n%s", code, c.wantCode, stderr.String())
			}
			if ran != c.wantRun {
				t.Errorf("service ran: %v, want %v", ran, c.wantRun)
			}
			if !strings.Contains(stdout.String(), c.wantStdout) {
				t.Errorf("stdout %q lacks %q", stdout.String(), c.wantStdout)
			}
			for _, w := range c.wantStderr {
				if !strings.Contains(stderr.String(), w) {
					t.Errorf("stderr lacks %q:\n%s", w, stderr.String())
				}
			}
			if got != nil && got.Kube.Kubeconfig != kubeconfig {
				t.Errorf("--kubeconfig parsed as %q", got.Kube.Kubeconfig)
			}
		})
	}
}

// TestEveryStageDefinesOrIgnoresUpstreamFlags: a stage either defines each
// upstream flag (common or its own) or says why it ignores it; the
// all-in-one ignores none.
func TestEveryStageDefinesOrIgnoresUpstreamFlags(t *testing.T) {
	for _, stage := range []Stage{AllInOne, Watcher, Dispatcher, Applier, Revisions} {
		fs := flag.NewFlagSet(string(stage), flag.ContinueOnError)
		(&CommonFlags{}).Register(fs, ":9999", ":8081")
		if err := acceptUpstream(fs, stage); stage == AllInOne || stage == Watcher {
			// These two define the watcher's flags themselves.
			if err == nil {
				t.Errorf("%s: common flags alone should lack the watcher's upstream flags", stage)
			}
		} else if err != nil {
			t.Errorf("%s: %v", stage, err)
		}
		for name := range ignoredBy[stage] {
			if !contains(UpstreamFlagNames(), name) {
				t.Errorf("%s ignores --%s, which is not an upstream flag", stage, name)
			}
		}
	}
	if len(ignoredBy[AllInOne]) != 0 {
		t.Errorf("the all-in-one runs every stage and ignores no upstream flag: %v", ignoredBy[AllInOne])
	}
}

// stageFlags registers what a stage's binary registers besides the common
// flags, as far as upstream's flags go.
func stageFlags(stage Stage) func(*flag.FlagSet) {
	if stage == Watcher || stage == AllInOne {
		return (&watcher.Config{}).RegisterFlags
	}
	return nil
}

func contains(s []string, v string) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

// TestIgnoredFlagsAreLogged: an upstream flag a stage has no use for is
// accepted and said once at start, with why.
func TestIgnoredFlagsAreLogged(t *testing.T) {
	out, err := os.CreateTemp(t.TempDir(), "stderr")
	if err != nil {
		t.Fatal(err)
	}
	orig := os.Stderr
	os.Stderr = out // zap resolves "stderr" when the logger is built
	defer func() { os.Stderr = orig }()
	cmd := Service{Name: "metabus-test", Stage: Revisions, Run: func(context.Context, Env) error { return nil }}.Command()
	var stdout, stderr bytes.Buffer
	code := Run(context.Background(), cmd, []string{"--kubeconfig=" + unreachableKubeconfig(t), "--metrics-address=0", "--health-probe-bind-address=0",
		"--workers=3", "--leader-election", "--cache-flush-interval=1h", "--zap-log-level=info"}, &stdout, &stderr)
	os.Stderr = orig
	if code != ExitOK {
		t.Fatalf("exit code %d: %s", code, stderr.String())
	}
	data, err := os.ReadFile(out.Name())
	if err != nil {
		t.Fatal(err)
	}
	log := string(data)
	for _, name := range []string{"workers", "leader-election", "cache-flush-interval"} {
		want := "--" + name + " is ignored by this stage because " + ignoredBy[Revisions][name]
		if n := strings.Count(log, want); n != 1 {
			t.Errorf("%q logged %d times, want once; log:\n%s", want, n, log)
		}
	}
	if strings.Contains(log, "--discovery-interval is ignored") {
		t.Errorf("a flag not given is reported as ignored:\n%s", log)
	}
	if !strings.Contains(log, `"version":"dev"`) || !strings.Contains(log, `"goVersion":"go`) {
		t.Errorf("the build is not logged at start:\n%s", log)
	}
}
