// Package testnats runs, for tests, nats-server from the shipped
// deploy/nats/nats-server.conf: the services' and operators' nkey users and
// their publish/subscribe permissions as deployed, either on one node in
// the test's process (StartProduction) or as the production topology, a
// cluster of nats-server processes with routes and faults to inject
// (Cluster: node kills, lost disks, leader moves, partitions).
package testnats

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/metabus/metabus/pkg/natscreds"
)

// Services are the nkey users nats-server.conf defines, one per service.
var Services = natscreds.Services

// Operators are the nkey users nats-server.conf defines for people (the
// metabus and nats CLIs): read-only, and read plus DLQ replay and purge.
var Operators = natscreds.Operators

// Production is a running server and the seed file of each user, services
// and operators (what --nats-nkey takes).
type Production struct {
	URL   string
	Seeds map[string]string
}

// StartProduction starts nats-server in this process from conf (the path
// of deploy/nats/nats-server.conf), changed only where it names the pod's
// environment: the included cluster.conf is an empty file (a single node),
// and the listen address, monitoring port, pid file and store directory are
// local. The users' public nkeys and the server name, which the StatefulSet
// passes as environment variables ($WATCHER_NKEY..., $POD_NAME), are put in
// their place in the text, so that tests using it may run in parallel.
func StartProduction(t testing.TB, conf string) *Production {
	t.Helper()
	return StartProductionWithHooks(t, conf)
}

// StartProductionWithHooks is StartProduction with hook users (natscreds.
// HookUser with default subjects) inserted where the configuration takes
// them, as an install declares them for `metabus credentials ensure
// --hook-user`: without nkey, so that the configuration reads each one's
// public key from $HOOK_<NAME>_NKEY, set here as the users Secret sets it.
// Their seeds are Seeds["hook-<name>"].
func StartProductionWithHooks(t testing.TB, conf string, hooks ...string) *Production {
	t.Helper()
	dir := t.TempDir()
	p := &Production{Seeds: map[string]string{}}
	env := map[string]string{"POD_NAME": "nats-0"}
	for _, user := range natscreds.Users {
		pub, seedFile := NewUser(t, dir, user)
		env[natscreds.UserKey(user)] = pub
		p.Seeds[user] = seedFile
	}
	hookUsers := make([]natscreds.HookUser, len(hooks))
	for i, name := range hooks {
		id := natscreds.HookUserID(name)
		pub, seedFile := NewUser(t, dir, id)
		hookUsers[i] = natscreds.HookUser{Name: name}
		env[natscreds.UserKey(id)] = pub
		p.Seeds[id] = seedFile
	}

	data, err := os.ReadFile(conf)
	if err != nil {
		t.Fatal(err)
	}
	text, err := natscreds.InsertHookUsers(string(data), hookUsers)
	if err != nil {
		t.Fatal(err)
	}
	for name, value := range env {
		// Outside comments only.
		re := regexp.MustCompile(`(?m)^([^#\n]*)\$` + name + `\b`)
		if n := len(re.FindAllStringIndex(text, -1)); n != 1 {
			t.Fatalf("nats-server.conf: $%s is used %d times, want 1 (update testnats's substitutions)", name, n)
		}
		text = re.ReplaceAllString(text, "${1}"+strings.ReplaceAll(strconv.Quote(value), "$", "$$"))
	}
	for _, r := range []struct{ re, repl string }{
		{`(?m)^listen:.*$`, "listen: 127.0.0.1:-1"},
		{`(?m)^http_port:.*$`, "# http_port: disabled in the test"},
		{`(?m)^pid_file:.*$`, fmt.Sprintf("pid_file: %q", filepath.Join(dir, "nats.pid"))},
		{`(?m)^(\s*)store_dir:.*$`, fmt.Sprintf("${1}store_dir: %q", filepath.Join(dir, "jetstream"))},
	} {
		re := regexp.MustCompile(r.re)
		if n := len(re.FindAllStringIndex(text, -1)); n != 1 {
			t.Fatalf("nats-server.conf: %d lines match %s, want 1 (update testnats's rewrites)", n, r.re)
		}
		text = re.ReplaceAllString(text, r.repl)
	}
	m := regexp.MustCompile(`(?m)^include\s+(\S+)`).FindStringSubmatch(text)
	if m == nil {
		t.Fatal("nats-server.conf no longer includes cluster.conf")
	}
	writeFile(t, filepath.Join(dir, filepath.FromSlash(m[1])), []byte("# single node: no cluster block\n"))
	path := filepath.Join(dir, "nats-server.conf")
	writeFile(t, path, []byte(text))
	opts, err := server.ProcessConfigFile(path)
	if err != nil {
		t.Fatalf("load nats-server.conf: %v", err)
	}
	if want := len(natscreds.Users) + len(hooks); len(opts.Nkeys) != want {
		t.Fatalf("nats-server.conf defines %d nkey users, want %d", len(opts.Nkeys), want)
	}
	s := Serve(t, opts)
	if !s.JetStreamEnabled() {
		t.Fatal("JetStream is not enabled")
	}
	p.URL = s.ClientURL()
	return p
}

// Serve runs a nats-server with opts (without signal handlers or logs)
// until the test ends, once it accepts connections.
func Serve(t testing.TB, opts *server.Options) *server.Server {
	t.Helper()
	opts.NoSigs, opts.NoLog = true, true
	s, err := server.NewServer(opts)
	if err != nil {
		t.Fatal(err)
	}
	go s.Start()
	t.Cleanup(func() { s.Shutdown(); s.WaitForShutdown() })
	if !s.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats-server did not become ready")
	}
	return s
}

// NewUser creates an nkey user and writes its seed to dir/name.nk.
func NewUser(t testing.TB, dir, name string) (pub, seedFile string) {
	t.Helper()
	pub, seedFile, err := newUserFile(dir, name)
	if err != nil {
		t.Fatal(err)
	}
	return pub, seedFile
}

func writeFile(t testing.TB, path string, data []byte) {
	t.Helper()
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
}
