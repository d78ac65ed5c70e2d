package deploy

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"

	"github.com/metabus/metabus/internal/testing/testnats"
	"github.com/metabus/metabus/pkg/natscreds"
	"github.com/metabus/metabus/pkg/natsx"
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
// shipped nats-server.conf as Helm's nats.hookUsers are, declared without
// nkey so that their public keys come from the users Secret's
// HOOK_<NAME>_NKEY, where `metabus credentials ensure --hook-user` puts
// them. The dispatcher's
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

// shippedConfAndKey returns the shipped nats-server.conf and a fresh
// public user nkey, for hook users declared with one.
func shippedConfAndKey(t *testing.T) ([]byte, string) {
	t.Helper()
	conf, err := os.ReadFile(filepath.Join("nats", "nats-server.conf"))
	if err != nil {
		t.Fatal(err)
	}
	kp, err := nkeys.CreateUser()
	if err != nil {
		t.Fatal(err)
	}
	pub, err := kp.PublicKey()
	if err != nil {
		t.Fatal(err)
	}
	return conf, pub
}

// TestHelmHookUsers: the chart's nats.hookUsers give the configuration
// natscreds.InsertHookUsers makes (the one the permission test runs), and
// none leave the shipped file's users unchanged.
func TestHelmHookUsers(t *testing.T) {
	conf, pub := shippedConfAndKey(t)
	for _, tc := range []struct {
		reason string
		users  []natscreds.HookUser
	}{
		{reason: "no hook users"},
		{reason: "one with its default subjects, one with its own", users: []natscreds.HookUser{
			{Name: "hello", NKey: pub}, {Name: "team-b", NKey: pub, Subjects: []string{"hooks.team-b.sync", "hooks.team-b.finalize"}}}},
		{reason: "two without nkey, whose seeds ensure makes, and one with", users: []natscreds.HookUser{
			{Name: "hello"}, {Name: "team-b", Subjects: []string{"hooks.team-b.sync"}}, {Name: "own", NKey: pub}}},
	} {
		t.Run(tc.reason, func(t *testing.T) {
			var values []any
			for _, u := range tc.users {
				v := map[string]any{"name": u.Name}
				if u.NKey != "" {
					v["nkey"] = u.NKey
				}
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
			// The users without nkey are the init container's --hook-user,
			// and its Role may read and update their seed Secrets and read
			// their certificates.
			var wantArgs, wantNames []string
			for _, u := range tc.users {
				if u.NKey == "" {
					wantArgs = append(wantArgs, "--hook-user="+u.Name)
					wantNames = append(wantNames, natscreds.HookSecret(u.Name), natscreds.ClientTLSSecret(natscreds.HookUserID(u.Name)))
				}
			}
			init, _ := slice(objs["StatefulSet/metabus-nats"], "spec", "template", "spec", "initContainers")[0].(map[string]any)
			var gotArgs []string
			for _, a := range stringList(slice(init, "args")) {
				if strings.HasPrefix(a, "--hook-user") {
					gotArgs = append(gotArgs, a)
				}
			}
			if diff := cmp.Diff(wantArgs, gotArgs); diff != "" {
				t.Errorf("credentials init container's --hook-user args (-want +got):\n%s", diff)
			}
			var gotNames []string
			for _, r := range slice(objs["Role/metabus-credentials"], "rules") {
				for _, n := range stringList(slice(r.(map[string]any), "resourceNames")) {
					if strings.HasPrefix(n, "metabus-nats-hook-") {
						gotNames = append(gotNames, n)
					}
				}
			}
			slices.Sort(wantNames)
			slices.Sort(gotNames)
			if diff := cmp.Diff(wantNames, gotNames); diff != "" {
				t.Errorf("credentials Role's hook Secrets (-want +got):\n%s", diff)
			}
		})
	}
	if _, err := renderChart(map[string]any{"nats": map[string]any{"hookUsers": []any{map[string]any{"name": "x", "nkey": "not-a-key"}}}}); err == nil {
		t.Error("a malformed nkey was rendered")
	}
}

// TestKustomizeHookUsers: the component `metabus credentials hook-users`
// writes (natscreds.HookUsersComponent), used from a kustomization over the
// default and hardened installs, gives the NATS ConfigMap the configuration
// natscreds.InsertHookUsers makes (the one the permission test runs), the
// credentials init container --hook-user for each user without nkey, and
// the credentials Role those users' Secrets, as Helm's nats.hookUsers do.
func TestKustomizeHookUsers(t *testing.T) {
	conf, pub := shippedConfAndKey(t)
	users := []natscreds.HookUser{{Name: "hello"}, {Name: "team-b", Subjects: []string{"hooks.team-b.sync"}}, {Name: "own", NKey: pub}}
	files, err := natscreds.HookUsersComponent(string(conf), users)
	if err != nil {
		t.Fatal(err)
	}
	wantConf, err := natscreds.InsertHookUsers(string(conf), users)
	if err != nil {
		t.Fatal(err)
	}
	for _, base := range []string{kustomizeDefault, kustomizeHardened} {
		t.Run(base, func(t *testing.T) {
			abs, err := filepath.Abs(base)
			if err != nil {
				t.Fatal(err)
			}
			dir := t.TempDir()
			comp := filepath.Join(dir, "hook-users")
			if err := os.Mkdir(comp, 0o755); err != nil {
				t.Fatal(err)
			}
			for name, data := range files {
				if err := os.WriteFile(filepath.Join(comp, name), data, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			relBase, err := filepath.Rel(dir, abs) // kustomize takes relative paths only
			if err != nil {
				t.Fatal(err)
			}
			k := "resources:\n- " + relBase + "\ncomponents:\n- hook-users\n"
			if err := os.WriteFile(filepath.Join(dir, "kustomization.yaml"), []byte(k), 0o644); err != nil {
				t.Fatal(err)
			}
			built, err := kustomizeBuild(dir)
			if err != nil {
				t.Fatal(err)
			}
			var gotConf, gotArgs, gotNames []string
			for _, o := range built {
				kind, name := str(o, "kind"), str(o, "metadata", "name")
				switch {
				case kind == "ConfigMap" && strings.HasPrefix(name, "nats-config"):
					gotConf = append(gotConf, str(o, "data", "nats-server.conf"))
				case kind == "StatefulSet" && name == "nats":
					init, _ := slice(o, "spec", "template", "spec", "initContainers")[0].(map[string]any)
					for _, a := range stringList(slice(init, "args")) {
						if strings.HasPrefix(a, "--hook-user") {
							gotArgs = append(gotArgs, a)
						}
					}
				case kind == "Role" && name == "metabus-credentials":
					for _, r := range slice(o, "rules") {
						for _, n := range stringList(slice(r.(map[string]any), "resourceNames")) {
							if strings.HasPrefix(n, "metabus-nats-hook-") {
								gotNames = append(gotNames, n)
							}
						}
					}
				}
			}
			if len(gotConf) != 1 {
				t.Fatalf("%d nats-config ConfigMaps, want 1", len(gotConf))
			}
			if diff := cmp.Diff(wantConf, gotConf[0]); diff != "" {
				t.Errorf("nats-server.conf (-natscreds +kustomize):\n%s", diff)
			}
			if diff := cmp.Diff([]string{"--hook-user=hello", "--hook-user=team-b"}, gotArgs); diff != "" {
				t.Errorf("credentials init container's --hook-user args (-want +got):\n%s", diff)
			}
			slices.Sort(gotNames)
			want := []string{"metabus-nats-hook-hello", "metabus-nats-hook-hello-tls", "metabus-nats-hook-team-b", "metabus-nats-hook-team-b-tls"}
			if diff := cmp.Diff(want, gotNames); diff != "" {
				t.Errorf("credentials Role's hook Secrets (-want +got):\n%s", diff)
			}
		})
	}
}
