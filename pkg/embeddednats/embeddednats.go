// Package embeddednats runs the nats-server that the all-in-one process,
// `make run` and the tests embed. It is apart from package natsx, which
// every stage binary imports to connect, because linking nats-server
// costs a process that runs no server: the package's init starts a
// sampler of /proc/self/stat that wakes the process every second for its
// life (server/pse), and its code and tables add to the resident set.
package embeddednats

import (
	"errors"
	"fmt"
	"net"
	"strconv"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/metabus/metabus/pkg/bus"
)

// Options configure an embedded server.
type Options struct {
	// StoreDir is the JetStream file store directory.
	StoreDir string
	// Listen is host:port for clients ("" → 127.0.0.1 on a random port;
	// "-" → no listener, in-process connections only).
	Listen string
	// SyncAlways fsyncs every write (measured ~15x slower than the default on a
	// file store).
	SyncAlways bool
}

// Start starts a JetStream-enabled nats-server in this process.
func Start(o Options) (*server.Server, error) {
	if o.StoreDir == "" {
		return nil, errors.New("embedded nats: StoreDir is required")
	}
	opts := &server.Options{
		ServerName: "metabus-embedded",
		JetStream:  true,
		StoreDir:   o.StoreDir,
		MaxPayload: bus.MaxPayload,
		NoSigs:     true,
		NoLog:      true,
		SyncAlways: o.SyncAlways,
	}
	switch o.Listen {
	case "":
		opts.Host, opts.Port = "127.0.0.1", -1
	case "-":
		opts.DontListen = true
	default:
		host, port, err := net.SplitHostPort(o.Listen)
		if err != nil {
			return nil, fmt.Errorf("embedded nats listen address %q: %w", o.Listen, err)
		}
		p, err := strconv.Atoi(port)
		if err != nil {
			return nil, fmt.Errorf("embedded nats port %q: %w", port, err)
		}
		opts.Host, opts.Port = host, p
	}
	s, err := server.NewServer(opts)
	if err != nil {
		return nil, fmt.Errorf("create embedded nats: %w", err)
	}
	go s.Start()
	if !s.ReadyForConnections(10 * time.Second) {
		s.Shutdown()
		return nil, errors.New("embedded nats did not become ready in 10s")
	}
	return s, nil
}
