// Package natstest starts an embedded JetStream server for a test or
// benchmark, with everything cleaned up when it ends.
package natstest

import (
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/metabus/metabus/pkg/embeddednats"
	"github.com/metabus/metabus/pkg/natsx"
)

// Start runs an in-process server (no listener) with its store in a
// temporary directory and connects to it.
func Start(tb testing.TB) (*nats.Conn, jetstream.JetStream) {
	tb.Helper()
	s, err := embeddednats.Start(embeddednats.Options{StoreDir: tb.TempDir(), Listen: "-"})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { s.Shutdown(); s.WaitForShutdown() })
	nc, js, err := natsx.Connect(natsx.ConnOptions{InProcess: s, Name: tb.Name()})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(nc.Close)
	return nc, js
}
