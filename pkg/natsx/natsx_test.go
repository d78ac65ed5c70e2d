package natsx

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
)

// TestPermissionViolationsLogged (issue #13, defect 3): a publish the
// server's permissions deny is reported asynchronously; without an error
// handler it was silent, and a missing grant went unnoticed.
func TestPermissionViolationsLogged(t *testing.T) {
	s, err := server.NewServer(&server.Options{
		Host: "127.0.0.1", Port: -1, NoLog: true, NoSigs: true,
		Users: []*server.User{{Username: "svc", Password: "pw", Permissions: &server.Permissions{
			Publish:   &server.SubjectPermission{Allow: []string{"allowed.>"}},
			Subscribe: &server.SubjectPermission{Allow: []string{"_INBOX.>"}},
		}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	go s.Start()
	if !s.ReadyForConnections(5 * time.Second) {
		t.Fatal("server not ready")
	}
	defer s.Shutdown()
	core, logs := observer.New(zap.WarnLevel)
	url := strings.Replace(s.ClientURL(), "nats://", "nats://svc:pw@", 1)
	nc, _, err := Connect(ConnOptions{URL: url, Name: t.Name(), Logger: zap.New(core)})
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	if err := nc.Publish("denied.subject", []byte("x")); err != nil {
		t.Fatal(err)
	}
	_ = nc.Flush()
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		for _, e := range logs.All() {
			if e.Level == zap.ErrorLevel && strings.Contains(e.Message, "permission denied") {
				return
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("no error logged for a denied publish; logged: %v", logs.All())
}

// TestDialWaitsForServer (issue #25): a service started while NATS is down
// must wait and retry, never exit. Dial is started against a port nobody
// listens on, reports its failed attempts, and connects once a server
// starts there.
func TestDialWaitsForServer(t *testing.T) {
	port := freePort(t)
	url := fmt.Sprintf("nats://127.0.0.1:%d", port)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var retries atomic.Int32
	type result struct {
		nc  *nats.Conn
		err error
	}
	done := make(chan result, 1)
	go func() {
		nc, _, err := Dial(ctx, ConnOptions{URL: url, Name: t.Name()}, Backoff{Base: 20 * time.Millisecond, Max: 100 * time.Millisecond},
			func(error, time.Duration) { retries.Add(1) })
		done <- result{nc, err}
	}()
	deadline := time.Now().Add(30 * time.Second)
	for retries.Load() < 2 {
		if time.Now().After(deadline) {
			t.Fatal("Dial reported no failed attempt against a closed port")
		}
		select {
		case r := <-done:
			t.Fatalf("Dial returned before any server existed: %v", r.err)
		case <-time.After(10 * time.Millisecond):
		}
	}
	s, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: port, NoLog: true, NoSigs: true})
	if err != nil {
		t.Fatal(err)
	}
	go s.Start()
	defer s.Shutdown()
	select {
	case r := <-done:
		if r.err != nil {
			t.Fatalf("Dial: %v", r.err)
		}
		defer r.nc.Close()
		if err := Check(r.nc)(); err != nil {
			t.Errorf("check after connecting: %v", err)
		}
	case <-time.After(60 * time.Second):
		t.Fatal("Dial did not connect once the server started")
	}
}

// TestDialStopsWithContext: a service told to stop while it waits for NATS
// stops.
func TestDialStopsWithContext(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	url := fmt.Sprintf("nats://127.0.0.1:%d", freePort(t))
	done := make(chan error, 1)
	go func() {
		_, _, err := Dial(ctx, ConnOptions{URL: url}, Backoff{Base: time.Hour}, func(error, time.Duration) { cancel() })
		done <- err
	}()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Errorf("Dial = %v, want context.Canceled", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Dial did not return once its context was cancelled")
	}
}

// TestDialOptionErrorsAreNotRetried: a seed file that cannot be read is a
// configuration error no wait repairs.
func TestDialOptionErrorsAreNotRetried(t *testing.T) {
	_, _, err := Dial(context.Background(), ConnOptions{URL: "nats://127.0.0.1:1", NKeySeed: "/nonexistent/seed"}, Backoff{},
		func(err error, _ time.Duration) { t.Errorf("retried a configuration error: %v", err) })
	if err == nil || !strings.Contains(err.Error(), "nkey seed") {
		t.Errorf("Dial = %v, want the seed error", err)
	}
}

// TestCheckFollowsConnection: the readiness check fails while the
// connection to the server is lost, and passes again once it is back.
func TestCheckFollowsConnection(t *testing.T) {
	port := freePort(t)
	start := func() *server.Server {
		s, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: port, NoLog: true, NoSigs: true})
		if err != nil {
			t.Fatal(err)
		}
		go s.Start()
		if !s.ReadyForConnections(10 * time.Second) {
			t.Fatal("server not ready")
		}
		return s
	}
	s := start()
	nc, _, err := Connect(ConnOptions{URL: s.ClientURL(), Name: t.Name()})
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	check := Check(nc)
	if err := check(); err != nil {
		t.Fatalf("connected: %v", err)
	}
	s.Shutdown()
	s.WaitForShutdown()
	eventually(t, "the check fails once the server is gone", func() bool { return check() != nil })
	s = start()
	defer s.Shutdown()
	eventually(t, "the check passes once reconnected", func() bool { return check() == nil })
}

func eventually(t *testing.T, what string, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out: %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// TestServiceInbox (issue 26): a connection with a service's inbox prefix
// gets its replies (core request/reply and JetStream API calls) on that
// prefix, so a server allowing the user only <prefix>.> serves it, and a
// user allowed only another prefix cannot read them.
func TestServiceInbox(t *testing.T) {
	perms := func(inbox string) *server.Permissions {
		return &server.Permissions{
			Publish:   &server.SubjectPermission{Allow: []string{"svc.echo", "$JS.API.>"}},
			Subscribe: &server.SubjectPermission{Allow: []string{inbox + ".>", "svc.echo"}},
			Response:  &server.ResponsePermission{MaxMsgs: 1},
		}
	}
	s, err := server.NewServer(&server.Options{
		Host: "127.0.0.1", Port: -1, NoLog: true, NoSigs: true, JetStream: true, StoreDir: t.TempDir(),
		Users: []*server.User{
			{Username: "a", Password: "pw", Permissions: perms(ServiceInboxPrefix("a"))},
			{Username: "b", Password: "pw", Permissions: perms(ServiceInboxPrefix("b"))},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	go s.Start()
	if !s.ReadyForConnections(5 * time.Second) {
		t.Fatal("server not ready")
	}
	defer s.Shutdown()
	connect := func(user string) (*nats.Conn, jetstream.JetStream) {
		t.Helper()
		url := strings.Replace(s.ClientURL(), "nats://", "nats://"+user+":pw@", 1)
		nc, js, err := Connect(ConnOptions{URL: url, Name: user, InboxPrefix: ServiceInboxPrefix(user)})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(nc.Close)
		return nc, js
	}
	a, ajs := connect("a")
	b, _ := connect("b")
	if _, err := b.Subscribe("svc.echo", func(m *nats.Msg) { _ = m.Respond(m.Data) }); err != nil {
		t.Fatal(err)
	}
	if err := b.Flush(); err != nil {
		t.Fatal(err)
	}
	if got := a.NewRespInbox(); !strings.HasPrefix(got, "_INBOX_a.") {
		t.Errorf("reply inbox %q, want the prefix _INBOX_a.", got)
	}
	msg, err := a.Request("svc.echo", []byte("ping"), 5*time.Second)
	if err != nil || string(msg.Data) != "ping" {
		t.Fatalf("request/reply on the service's inbox: %v, %v", msg, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := ajs.AccountInfo(ctx); err != nil {
		t.Fatalf("a JetStream API call on the service's inbox: %v", err)
	}
	denied := make(chan error, 1)
	b.SetErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) { denied <- err })
	if _, err := b.Subscribe(ServiceInboxPrefix("a")+".>", func(*nats.Msg) {}); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-denied:
		if !errors.Is(err, nats.ErrPermissionViolation) && !strings.Contains(strings.ToLower(err.Error()), "permissions violation") {
			t.Errorf("subscribing to another's inbox: %v, want a permissions violation", err)
		}
	case <-time.After(3 * time.Second):
		t.Error("b subscribed to a's inbox without a permissions violation")
	}
}
