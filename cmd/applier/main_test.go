package main

import (
	"testing"

	"github.com/metabus/metabus/internal/testing/clitest"
	"github.com/metabus/metabus/pkg/cli"
)

// TestUpstreamFlags: every flag of upstream Metacontroller v4.17 parses, in
// each spelling manifests use (issue #23).
func TestUpstreamFlags(t *testing.T) { clitest.AcceptsUpstreamFlags(t, newCommand) }

// TestDefaultsAsDocumented: the defaults this binary gives upstream's flags
// are upstream's, except those docs/operating.md lists, with these values.
func TestDefaultsAsDocumented(t *testing.T) { clitest.DefaultsAsDocumented(t, newCommand, cli.Applier) }

// TestFlagTableAsDocumented: the defaults docs/operating.md's flags table
// gives are this binary's.
func TestFlagTableAsDocumented(t *testing.T) {
	clitest.FlagTableAsDocumented(t, newCommand, cli.Applier)
}

// TestStrayWords: an unknown word is an error, and nothing starts.
func TestStrayWords(t *testing.T) { clitest.RefusesStrayWords(t, newCommand) }

// TestReadiness (issues #23, #25): /readyz follows NATS, the streams and
// consumers and the API server; started before either exists, the service
// waits for them.
func TestReadiness(t *testing.T) {
	clitest.CheckReadiness(t, clitest.Readiness{New: newCommand, EnsureStreams: true})
}
