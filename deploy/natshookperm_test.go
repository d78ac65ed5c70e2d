package deploy

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"

	"github.com/metabus/metabus/pkg/natscreds"
	"github.com/metabus/metabus/pkg/natsx"
	"github.com/metabus/metabus/pkg/testnats"
)

// hookConn is a hook process's connection, recording the permission
// violations the server reports to it.
type hookConn struct {
	nc         *nats.Conn
	mu         sync.Mutex
	violations []string
}

func (c *hookConn) violated(part string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, v := range c.violations {
		if strings.Contains(v, part) {
			return true
		}
	}
	return false
}

func connectHook(t *testing.T, url, seed string) *hookConn {
	t.Helper()
	c := &hookConn{}
	nc, _, err := natsx.Connect(natsx.ConnOptions{URL: url, Name: "hook", NKeySeed: seed})
	if err != nil {
		t.Fatal(err)
	}
	nc.SetErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
		c.mu.Lock()
		c.violations = append(c.violations, err.Error())
		c.mu.Unlock()
	})
	t.Cleanup(nc.Close)
	c.nc = nc
	return c
}

// TestHookUsersUnderProductionNATSPermissions: hook users inserted into the
// shipped nats-server.conf as Helm's nats.hookUsers are. The dispatcher's
// request to hooks.hello.sync reaches hook hello's queue group, whose reply
// comes back; hook hello may not subscribe to the bus (mc.>), another
// hook's subjects or anyone's replies, and may publish nothing but its
// replies: not onto the bus, not to another hook, not to an inbox it got
// no request from.
func TestHookUsersUnderProductionNATSPermissions(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a nats-server")
	}
	p := testnats.StartProductionWithHooks(t, filepath.Join("nats", "nats-server.conf"), "hello", "other")
	disp, _, err := natsx.Connect(natsx.ConnOptions{URL: p.URL, Name: "metabus-dispatcher", NKeySeed: p.Seeds["dispatcher"],
		InboxPrefix: natsx.ServiceInboxPrefix("dispatcher")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(disp.Close)
	hello := connectHook(t, p.URL, p.Seeds["hook-hello"])
	other := connectHook(t, p.URL, p.Seeds["hook-other"])

	for _, c := range []*hookConn{hello, hello} { // two replicas' subscriptions in one queue group
		if _, err := c.nc.QueueSubscribe("hooks.hello.>", "hello", func(m *nats.Msg) { _ = m.Respond([]byte(`{"ok":true}`)) }); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := other.nc.Subscribe("hooks.other.sync", func(m *nats.Msg) { _ = m.Respond([]byte(`{}`)) }); err != nil {
		t.Fatal(err)
	}
	for _, c := range []*hookConn{hello, other} {
		if err := c.nc.Flush(); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	reply, err := disp.RequestWithContext(ctx, "hooks.hello.sync", []byte(`{}`))
	if err != nil {
		t.Fatalf("the dispatcher's request to hook hello: %v", err)
	}
	if string(reply.Data) != `{"ok":true}` {
		t.Errorf("reply %q", reply.Data)
	}

	// Subscriptions outside its own subjects are refused.
	for _, subject := range []string{"mc.>", "mc.work.*.*", "hooks.other.sync", "hooks.>", "_INBOX_dispatcher.>", "_INBOX.>", "$JS.>"} {
		if _, err := hello.nc.Subscribe(subject, func(*nats.Msg) {}); err != nil {
			t.Fatal(err)
		}
		_ = hello.nc.Flush()
		waitViolation(t, hello, `Subscription to "`+subject+`"`)
	}
	// Publishes anywhere are refused: the bus, another hook, an inbox
	// without a request, JetStream's API.
	for _, subject := range []string{"mc.work.cc-hello.uid", "mc.applied", "hooks.other.sync", "hooks.hello.sync",
		natsx.ServiceInboxPrefix("dispatcher") + ".forged", "$JS.API.STREAM.DELETE.MC_WORK"} {
		if err := hello.nc.Publish(subject, []byte("x")); err != nil {
			t.Fatal(err)
		}
		_ = hello.nc.Flush()
		waitViolation(t, hello, `Publish to "`+subject+`"`)
	}
	// The other hook never served hello's subjects, nor hello other's.
	if other.violated("hooks.hello") {
		t.Error("hook other touched hello's subjects")
	}
}

func waitViolation(t *testing.T, c *hookConn, part string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !c.violated(part) {
		if time.Now().After(deadline) {
			t.Errorf("no permissions violation for %s: the hook user may do it", part)
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestHelmHookUsers: the chart's nats.hookUsers give the configuration
// natscreds.InsertHookUsers makes (the one the permission test runs), and
// none leave the shipped file's users unchanged.
func TestHelmHookUsers(t *testing.T) {
	conf, err := os.ReadFile(filepath.Join("nats", "nats-server.conf"))
	if err != nil {
		t.Fatal(err)
	}
	kp, err := nkeys.CreateUser()
	if err != nil {
		t.Fatal(err)
	}
	pub, _ := kp.PublicKey()
	for _, tc := range []struct {
		reason string
		users  []natscreds.HookUser
	}{
		{reason: "no hook users"},
		{reason: "one with its default subjects, one with its own", users: []natscreds.HookUser{
			{Name: "hello", NKey: pub}, {Name: "team-b", NKey: pub, Subjects: []string{"hooks.team-b.sync", "hooks.team-b.finalize"}}}},
	} {
		t.Run(tc.reason, func(t *testing.T) {
			var values []any
			for _, u := range tc.users {
				v := map[string]any{"name": u.Name, "nkey": u.NKey}
				if u.Subjects != nil {
					subjects := make([]any, len(u.Subjects))
					for i, s := range u.Subjects {
						subjects[i] = s
					}
					v["subjects"] = subjects
				}
				values = append(values, v)
			}
			objs, err := renderChart(map[string]any{"nats": map[string]any{"hookUsers": values}})
			if err != nil {
				t.Fatal(err)
			}
			got := str(objs["ConfigMap/metabus-nats-config"], "data", "nats-server.conf")
			want, err := natscreds.InsertHookUsers(string(conf), tc.users)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(strings.TrimSpace(want), strings.TrimSpace(got)); diff != "" {
				t.Errorf("rendered nats-server.conf (-natscreds +helm):\n%s", diff)
			}
		})
	}
	if _, err := renderChart(map[string]any{"nats": map[string]any{"hookUsers": []any{map[string]any{"name": "x", "nkey": "not-a-key"}}}}); err == nil {
		t.Error("a malformed nkey was rendered")
	}
}
