// Package layers holds the repository's layer rules as a test: which
// packages may link what. The rules are read from the build's own import
// graph (go list), so a new import that breaks a layer fails `make test`
// instead of waiting for a reviewer to notice.
package layers

import (
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
)

const module = "github.com/metabus/metabus/"

// pkg is one package of the module as the build sees it.
type pkg struct {
	imports []string // direct, without tests
	deps    []string // transitive, without tests
}

// graph lists every package of the module with its imports and deps.
func graph(t *testing.T) map[string]pkg {
	t.Helper()
	goBin, err := exec.LookPath("go")
	if err != nil {
		goBin = filepath.Join(runtime.GOROOT(), "bin", "go")
	}
	cmd := exec.Command(goBin, "list", "-f", "{{.ImportPath}}\t{{join .Imports \" \"}}\t{{join .Deps \" \"}}", module+"...")
	cmd.Dir = "../.."
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	g := map[string]pkg{}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Split(line, "\t")
		if len(f) != 3 {
			t.Fatalf("go list line %q: want 3 fields", line)
		}
		g[strings.TrimPrefix(f[0], module)] = pkg{imports: strings.Fields(f[1]), deps: strings.Fields(f[2])}
	}
	if len(g) < 50 {
		t.Fatalf("go list found %d packages; the pattern is broken", len(g))
	}
	return g
}

// Pure cores decide and never do I/O: they link no bus client and no
// Kubernetes client.
var pureCores = []string{
	"pkg/bus", "pkg/ownership", "pkg/fairq", "pkg/revstore", "pkg/rollout", "pkg/apply",
	"pkg/children", "pkg/revision", "pkg/hookwire", "pkg/hookapi", "pkg/outcome",
}

// Kind cores plan what a controller kind means; they link no bus client.
// (They still link client-go through pkg/discovery and pkg/events, which
// hold a client beside the types the cores need: issue 33 moves those
// types to leaf packages and then adds client-go to this rule.)
var kindCores = []string{
	"pkg/kinds", "pkg/kindtable", "pkg/composite", "pkg/decorator", "pkg/mapctl", "pkg/snapshot", "pkg/related",
}

// transports are the packages that talk to NATS or the API server.
func transport(dep string) (string, bool) {
	switch {
	case strings.HasPrefix(dep, "github.com/nats-io/"):
		return "NATS", true
	case strings.HasPrefix(dep, "github.com/cloudevents/sdk-go/protocol/"):
		return "a CloudEvents protocol binding", true
	case strings.HasPrefix(dep, "k8s.io/client-go/"):
		return "client-go", true
	}
	return "", false
}

// TestCoresLinkNoTransport: pure cores link neither NATS nor client-go;
// kind cores link no NATS.
func TestCoresLinkNoTransport(t *testing.T) {
	g := graph(t)
	check := func(p string, forbidden func(kind string) bool) {
		t.Run(p, func(t *testing.T) {
			pk, ok := g[p]
			if !ok {
				t.Fatalf("%s is not a package of the module any more: update the rule", p)
			}
			for _, d := range pk.deps {
				if kind, ok := transport(d); ok && forbidden(kind) {
					t.Errorf("%s links %s (%s)", p, d, kind)
				}
			}
		})
	}
	for _, p := range pureCores {
		check(p, func(string) bool { return true })
	}
	for _, p := range kindCores {
		check(p, func(kind string) bool { return kind != "client-go" })
	}
}

// TestServicesStandAlone: no service imports another (they meet only on
// the bus), and no library package imports a service. pkg/allinone, which
// composes the four services in one process, is the one exception until
// it moves under cmd/metabus.
func TestServicesStandAlone(t *testing.T) {
	g := graph(t)
	checked := 0
	for p, pk := range g {
		for _, imp := range pk.imports {
			rel, ok := strings.CutPrefix(imp, module)
			if !ok || !strings.HasPrefix(rel, "services/") {
				continue
			}
			checked++
			switch {
			case strings.HasPrefix(p, "services/") && service(p) != service(rel):
				t.Errorf("service %s imports service %s: services meet only on the bus", p, rel)
			case (strings.HasPrefix(p, "pkg/") || strings.HasPrefix(p, "sdk/")) && p != "pkg/allinone":
				t.Errorf("library package %s imports service %s", p, rel)
			}
		}
	}
	if checked == 0 {
		t.Error("no import of a service found at all (cmd/ imports them): the graph is wrong")
	}
}

// service is the service a services/ package belongs to.
func service(p string) string {
	parts := strings.SplitN(p, "/", 3)
	if len(parts) < 2 {
		return p
	}
	return parts[1]
}

// TestSDKStandsAlone: the SDK for hook authors links nothing of metabus
// but the wire contract, and none of the heavy dependencies a hook author
// should not inherit (zap it does link: the CloudEvents sdk logs with it).
func TestSDKStandsAlone(t *testing.T) {
	g := graph(t)
	allowed := []string{"pkg/hookwire", "sdk/hook"}
	found := 0
	for p, pk := range g {
		if !strings.HasPrefix(p, "sdk/") {
			continue
		}
		found++
		for _, d := range pk.deps {
			if rel, ok := strings.CutPrefix(d, module); ok && !slices.Contains(allowed, rel) {
				t.Errorf("%s links %s: the SDK may link only %v of metabus", p, rel, allowed)
			}
			for _, heavy := range []string{"k8s.io/client-go/", "github.com/nats-io/nats-server/", "github.com/prometheus/"} {
				if strings.HasPrefix(d, heavy) {
					t.Errorf("%s links %s", p, d)
				}
			}
		}
	}
	if found == 0 {
		t.Error("no package under sdk/: update the rule")
	}
}
