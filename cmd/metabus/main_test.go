package main

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/metabus/metabus/internal/testing/clitest"
	"github.com/metabus/metabus/pkg/cli"
	"github.com/metabus/metabus/pkg/version"
)

// TestUpstreamFlags: every flag of upstream Metacontroller v4.17 parses, in
// each spelling manifests use (issue #23).
func TestUpstreamFlags(t *testing.T) { clitest.AcceptsUpstreamFlags(t, newRoot) }

// TestDefaultsAsDocumented: the defaults this binary gives upstream's flags
// are upstream's, except those docs/operating.md lists, with these values.
func TestDefaultsAsDocumented(t *testing.T) { clitest.DefaultsAsDocumented(t, newRoot, cli.AllInOne) }

// TestFlagTableAsDocumented: the defaults docs/operating.md's flags table
// gives are this binary's.
func TestFlagTableAsDocumented(t *testing.T) {
	clitest.FlagTableAsDocumented(t, newRoot, cli.AllInOne)
}

// TestStrayWords: `metabus status --kubeconfig=X` started a controller
// while status was no subcommand (issue #23); an unknown word is an error,
// and nothing starts.
func TestStrayWords(t *testing.T) { clitest.RefusesStrayWords(t, newRoot) }

func TestVersion(t *testing.T) {
	want := "metabus version " + version.Get().String() + "\n"
	for _, args := range [][]string{{"version"}, {"--version"}, {"-version"}} {
		var stdout, stderr bytes.Buffer
		if code := cli.Run(context.Background(), newRoot(), args, &stdout, &stderr); code != cli.ExitOK {
			t.Fatalf("metabus %s: exit code %d: %s", strings.Join(args, " "), code, stderr.String())
		}
		if stdout.String() != want {
			t.Errorf("metabus %s printed %q, want %q", strings.Join(args, " "), stdout.String(), want)
		}
	}
	var stdout, stderr bytes.Buffer
	if code := cli.Run(context.Background(), newRoot(), []string{"version", "-o", "json"}, &stdout, &stderr); code != cli.ExitOK ||
		!strings.Contains(stdout.String(), `"revision"`) {
		t.Errorf("metabus version -o json: %d %q %q", code, stdout.String(), stderr.String())
	}
	if code := cli.Run(context.Background(), newRoot(), []string{"version", "extra"}, &stdout, &stderr); code != cli.ExitUsage {
		t.Errorf("metabus version extra: exit code %d, want %d", code, cli.ExitUsage)
	}
}

// TestReadiness (issues #23, #25): the all-in-one with an external NATS
// server: /readyz follows NATS, the streams, the API server and the caches;
// started before either exists, it waits for them.
func TestReadiness(t *testing.T) {
	clitest.CheckReadiness(t, clitest.Readiness{New: newRoot, Args: []string{"--external-nats", "--discovery-interval=5s"}})
}
