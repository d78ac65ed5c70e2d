// Package natsx connects services to NATS. The embedded nats-server (the
// all-in-one process, `make run`, the tests) is started by package
// embeddednats, so that the stage binaries, which import this package,
// do not link nats-server.
package natsx

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"
)

// ConnOptions configure a client connection.
type ConnOptions struct {
	URL   string
	Name  string
	Creds string // path of a .creds file (per-service credentials)
	// NKeySeed is a path of an nkey seed file.
	NKeySeed string
	// TLS
	CAFile, CertFile, KeyFile string
	// InProcess connects to an embedded server (*server.Server, see
	// embeddednats) without TCP.
	InProcess nats.InProcessConnProvider
	Logger    *zap.Logger
	// InboxPrefix replaces _INBOX as the prefix of the connection's reply
	// subjects (request/reply, JetStream API calls and pulls): each service
	// uses ServiceInboxPrefix, so that NATS permissions can let each user
	// subscribe to its own replies only ("" keeps _INBOX).
	InboxPrefix string
}

// ServiceInboxPrefix is the reply-subject prefix of a metabus service
// ("watcher", "dispatcher", "applier", "revisions"): _INBOX_<service>. The
// shipped nats-server.conf allows each service's user to subscribe to
// <prefix>.> and to no other inbox, so no service reads another's replies
// (snapshots carry Secret children).
func ServiceInboxPrefix(service string) string { return "_INBOX_" + service }

// Connect dials NATS and returns the connection and a JetStream handle. It
// reconnects forever once connected: the bus is allowed to blip, the
// services wait. The first dial is one attempt; Dial retries it.
func Connect(o ConnOptions) (*nats.Conn, jetstream.JetStream, error) {
	opts, err := o.natsOptions()
	if err != nil {
		return nil, nil, err
	}
	return connect(o, opts)
}

// Backoff bounds the waits between attempts of Dial and Retry: the first
// wait is Base, doubled after each failure up to Max.
type Backoff struct{ Base, Max time.Duration }

// DefaultBackoff is 500 ms doubling to 30 s: a NATS server rolling over is
// found within a second, one down for long costs a log line and an attempt
// every 30 s.
var DefaultBackoff = Backoff{Base: 500 * time.Millisecond, Max: 30 * time.Second}

// Retry runs f until it succeeds or ctx is done, waiting between attempts
// as b says (zero fields: DefaultBackoff's); every failure is reported to
// onRetry with the wait before the next attempt. It returns ctx's error if
// ctx ends first. Services use it for what must work before they can
// start (the connection, the streams), so that a bus that is not there yet
// is waited for instead of exiting into a crash-loop.
func Retry(ctx context.Context, b Backoff, f func(context.Context) error, onRetry func(err error, next time.Duration)) error {
	if b.Base <= 0 {
		b.Base = DefaultBackoff.Base
	}
	if b.Max < b.Base {
		b.Max = max(DefaultBackoff.Max, b.Base)
	}
	wait := b.Base
	for {
		err := f(ctx)
		if err == nil {
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if onRetry != nil {
			onRetry(err, wait)
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
		wait = min(2*wait, b.Max)
	}
}

// Dial is Connect for a service's start: a server that cannot be reached
// yet (not started, restarting, a cluster still electing, credentials not
// yet loaded by it) is retried as Retry does until it answers or ctx is
// done, so a service started before NATS waits for it instead of exiting.
// Errors in the options themselves (an unreadable seed file) are returned
// at once: no retry repairs them.
func Dial(ctx context.Context, o ConnOptions, b Backoff, onRetry func(err error, next time.Duration)) (*nats.Conn, jetstream.JetStream, error) {
	opts, err := o.natsOptions()
	if err != nil {
		return nil, nil, err
	}
	var (
		nc *nats.Conn
		js jetstream.JetStream
	)
	err = Retry(ctx, b, func(context.Context) error {
		var err error
		nc, js, err = connect(o, opts)
		return err
	}, onRetry)
	if err != nil {
		return nil, nil, err
	}
	return nc, js, nil
}

// Check is a readiness check of nc: it fails while the connection is not
// established (reconnecting after a server loss, or closed).
func Check(nc *nats.Conn) func() error {
	return func() error {
		if nc.IsConnected() {
			return nil
		}
		return fmt.Errorf("not connected to NATS (%s)", strings.ToLower(nc.Status().String()))
	}
}

// natsOptions turns o into nats.go options.
func (o ConnOptions) natsOptions() ([]nats.Option, error) {
	log := o.Logger
	if log == nil {
		log = zap.NewNop()
	}
	opts := []nats.Option{
		nats.Name(o.Name),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(500 * time.Millisecond),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			if err != nil {
				log.Warn("nats disconnected", zap.Error(err))
			}
		}),
		nats.ReconnectHandler(func(c *nats.Conn) {
			log.Info("nats reconnected", zap.String("url", c.ConnectedUrlRedacted()), zap.String("serverVersion", c.ConnectedServerVersion()))
			// Another server of a cluster may be of another release
			// (a rolling upgrade): check each one connected to.
			CheckServer(c, log)
		}),
		// Asynchronous errors are otherwise silent: a publish or
		// subscription the server's permissions deny only shows up here.
		nats.ErrorHandler(func(_ *nats.Conn, sub *nats.Subscription, err error) {
			fields := []zap.Field{zap.Error(err)}
			if sub != nil {
				fields = append(fields, zap.String("subject", sub.Subject))
			}
			if errors.Is(err, nats.ErrPermissionViolation) || strings.Contains(strings.ToLower(err.Error()), "permissions violation") {
				log.Error("nats permission denied: check this service's NATS user permissions", fields...)
				return
			}
			log.Warn("nats asynchronous error", fields...)
		}),
	}
	if o.InboxPrefix != "" {
		opts = append(opts, nats.CustomInboxPrefix(o.InboxPrefix))
	}
	if o.Creds != "" {
		opts = append(opts, nats.UserCredentials(o.Creds))
	}
	if o.NKeySeed != "" {
		opt, err := nats.NkeyOptionFromSeed(o.NKeySeed)
		if err != nil {
			return nil, fmt.Errorf("load nkey seed: %w", err)
		}
		opts = append(opts, opt)
	}
	if o.CAFile != "" {
		opts = append(opts, nats.RootCAs(o.CAFile))
	}
	if o.CertFile != "" || o.KeyFile != "" {
		opts = append(opts, nats.ClientCert(o.CertFile, o.KeyFile))
	}
	if o.InProcess != nil {
		opts = append(opts, nats.InProcessServer(o.InProcess))
	}
	return opts, nil
}

// connect makes one attempt with opts.
func connect(o ConnOptions, opts []nats.Option) (*nats.Conn, jetstream.JetStream, error) {
	url := o.URL
	if o.InProcess != nil {
		url = ""
	}
	nc, err := nats.Connect(url, opts...)
	if err != nil {
		return nil, nil, fmt.Errorf("connect to nats %s: %w", redact(url), err)
	}
	// A server that cannot reset consumers still works, degraded: say so
	// loudly at start rather than let every handover wait silently.
	CheckServer(nc, o.Logger)
	// An asynchronous publish whose acknowledgement never comes (a reply
	// lost with a server restart) is failed after this long rather than
	// tracked for ever; the lease renewals publish asynchronously.
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncTimeout(30*time.Second))
	if err != nil {
		nc.Close()
		return nil, nil, fmt.Errorf("jetstream: %w", err)
	}
	return nc, js, nil
}

// redact drops user info from a URL for logs.
func redact(url string) string {
	if i := indexAt(url); i >= 0 {
		if j := indexScheme(url); j >= 0 && j < i {
			return url[:j+3] + "***@" + url[i+1:]
		}
		return "***@" + url[i+1:]
	}
	return url
}

func indexAt(s string) int {
	for i := len(s) - 1; i >= 0; i-- {
		if s[i] == '@' {
			return i
		}
	}
	return -1
}

func indexScheme(s string) int {
	for i := 0; i+2 < len(s); i++ {
		if s[i] == ':' && s[i+1] == '/' && s[i+2] == '/' {
			return i
		}
	}
	return -1
}

// Drain closes a connection after flushing, bounded by ctx.
func Drain(ctx context.Context, nc *nats.Conn) {
	if nc == nil {
		return
	}
	done := make(chan struct{})
	nc.SetClosedHandler(func(*nats.Conn) { close(done) })
	if err := nc.Drain(); err != nil {
		nc.Close()
		return
	}
	select {
	case <-done:
	case <-ctx.Done():
		nc.Close()
	}
}
