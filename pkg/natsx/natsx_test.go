package natsx

import (
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
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
