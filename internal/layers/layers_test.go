// Package layers holds the repository's layer rules as a test: which
// packages may link what. The rules are read from the build's own import
// graph (go list), so a new import that breaks a layer fails `make test`
// instead of waiting for a reviewer to notice, and the failure names the
// chain of imports that links the forbidden package: cut one of them,
// usually by moving the type or constant the core needs to a leaf package
// (as pkg/apiresource and pkg/events are).
package layers

import (
	"slices"
	"strings"
	"testing"
)

// Pure cores decide and never do I/O: they link no bus client and no
// Kubernetes client, not even client-go's helpers.
var pureCores = []string{
	"pkg/bus", "pkg/ownership", "pkg/fairq", "pkg/revstore", "pkg/rollout", "pkg/apply",
	"pkg/children", "pkg/revision", "pkg/hookwire", "pkg/hookapi", "pkg/outcome", "pkg/jsbus/drivecore",
}

// Kind cores plan what a controller kind means; they link no bus client
// and no client-go transport.
var kindCores = []string{
	"pkg/kinds", "pkg/kindtable", "pkg/composite", "pkg/decorator", "pkg/mapctl", "pkg/snapshot", "pkg/related",
}

// Leaves are the plain types and constants the cores share with the
// transports that fill or use them: they import nothing of the module, so
// that importing one can never bring a transport back into a core.
var leaves = []string{"pkg/apiresource", "pkg/events", "pkg/hookwire", "pkg/identity"}

// clientGoTransport is the package through which every client-go request
// goes (it builds the HTTP round trippers).
const clientGoTransport = "k8s.io/client-go/transport"

// class is one kind of package a layer may not link.
type class struct {
	name string
	is   func(g *graph, p string) bool
}

var (
	natsClass = class{"NATS", func(_ *graph, p string) bool {
		return strings.HasPrefix(p, "github.com/nats-io/")
	}}
	// The CloudEvents bindings to a protocol (the JetStream one), not
	// the event type and its encoding, which the wire contract uses.
	ceBindingClass = class{"a CloudEvents protocol binding", func(_ *graph, p string) bool {
		return strings.HasPrefix(p, "github.com/cloudevents/sdk-go/protocol/")
	}}
	clientGoClass = class{"client-go", func(_ *graph, p string) bool {
		return strings.HasPrefix(p, "k8s.io/client-go/")
	}}
	// A client-go transport package is k8s.io/client-go/transport and
	// every client-go package that links it, that is every one that can
	// talk to an API server: rest, dynamic, discovery, kubernetes,
	// informers, listers, metadata, restmapper, tools/cache, tools/record,
	// tools/clientcmd, util/apply... (TestClientGoTransport pins examples).
	// client-go's other packages do no I/O (util/workqueue, tools/metrics,
	// tools/clientcmd/api, tools/reference, util/cert, pkg/version...).
	clientGoTransportClass = class{"a client-go transport package", func(g *graph, p string) bool {
		return p == clientGoTransport || strings.HasPrefix(p, "k8s.io/client-go/") && g.links(p, clientGoTransport)
	}}
)

// TestCoresLinkNoTransport: pure cores link neither NATS nor client-go;
// kind cores link neither NATS nor a client-go transport package.
func TestCoresLinkNoTransport(t *testing.T) {
	g := load(t)
	for _, p := range pureCores {
		checkLinks(t, g, p, "pure core", natsClass, ceBindingClass, clientGoClass)
	}
	for _, p := range kindCores {
		checkLinks(t, g, p, "kind core", natsClass, ceBindingClass, clientGoTransportClass)
	}
}

// checkLinks fails for each chain through which p links a package of one
// of the classes.
func checkLinks(t *testing.T, g *graph, p, layer string, classes ...class) {
	t.Helper()
	t.Run(p, func(t *testing.T) {
		if _, ok := g.imports[module+p]; !ok {
			t.Fatalf("%s is not a package of the module any more: update the rule", p)
		}
		for _, c := range classes {
			for _, ch := range chains(g.imports, module+p, func(d string) bool { return c.is(g, d) }) {
				t.Errorf("%s %s links %s: %s", layer, p, c.name, render(ch))
			}
		}
	})
}

// TestClientGoTransport pins what counts as a client-go transport
// package, so that the kind cores' rule cannot pass by defining nothing
// (a client-go release that renamed the transport package, say).
func TestClientGoTransport(t *testing.T) {
	g := load(t)
	for _, tc := range []struct {
		reason, pkg string
		want        bool
	}{
		{reason: "the round trippers themselves", pkg: clientGoTransport, want: true},
		{reason: "the REST client", pkg: "k8s.io/client-go/rest", want: true},
		{reason: "the dynamic client", pkg: "k8s.io/client-go/dynamic", want: true},
		{reason: "informers' list-watch", pkg: "k8s.io/client-go/tools/cache", want: true},
		{reason: "the Event recorder", pkg: "k8s.io/client-go/tools/record", want: true},
		{reason: "a work queue does no I/O", pkg: "k8s.io/client-go/util/workqueue"},
		{reason: "metric hooks do no I/O", pkg: "k8s.io/client-go/tools/metrics"},
		{reason: "not client-go at all", pkg: "k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"},
	} {
		t.Run(tc.reason, func(t *testing.T) {
			if _, ok := g.imports[tc.pkg]; !ok {
				t.Fatalf("%s is linked by no package of the module: pick another example", tc.pkg)
			}
			if got := clientGoTransportClass.is(g, tc.pkg); got != tc.want {
				t.Errorf("%s is a client-go transport package: %v, want %v", tc.pkg, got, tc.want)
			}
		})
	}
}

// TestLeavesStayLeaves: a leaf imports no package of the module and links
// no transport.
func TestLeavesStayLeaves(t *testing.T) {
	g := load(t)
	for _, p := range leaves {
		checkLinks(t, g, p, "leaf", natsClass, ceBindingClass, clientGoClass,
			class{"a package of the module", func(_ *graph, d string) bool { return strings.HasPrefix(d, module) }})
	}
}

// TestServicesStandAlone: no service links another (they meet only on
// the bus), and no library package links a service. The composition of
// the four services in one process is internal/allinone, above them.
func TestServicesStandAlone(t *testing.T) {
	g := load(t)
	checked := 0
	for _, full := range g.inModule() {
		p := short(full)
		switch {
		case strings.HasPrefix(p, "services/"):
			checked++
			other := func(d string) bool {
				rel, ok := strings.CutPrefix(d, module)
				return ok && strings.HasPrefix(rel, "services/") && service(rel) != service(p)
			}
			for _, ch := range chains(g.imports, full, other) {
				t.Errorf("service %s links another service: %s; services meet only on the bus", p, render(ch))
			}
		case strings.HasPrefix(p, "pkg/") || strings.HasPrefix(p, "sdk/"):
			checked++
			for _, ch := range chains(g.imports, full, isService) {
				t.Errorf("library package %s links a service: %s", p, render(ch))
			}
		}
	}
	if checked == 0 {
		t.Error("no package under services/, pkg/ or sdk/: the graph is wrong")
	}
	// The check must be able to see an import of a service at all.
	if !slices.ContainsFunc(g.imports[module+"internal/allinone"], isService) {
		t.Error("internal/allinone imports no service: the graph is wrong")
	}
}

// TestHarnessesOnlyInTests: the test harnesses (internal/testing/...: a
// control plane, NATS clusters, certificates, fakes) are linked by tests,
// the development tools under hack/ and each other, never by what ships:
// the services, the libraries, the SDK and the binaries under cmd/.
func TestHarnessesOnlyInTests(t *testing.T) {
	shipping := func(p string) bool {
		return !strings.HasPrefix(p, "internal/testing/") && !strings.HasPrefix(p, "hack/") && !strings.HasPrefix(p, "e2e") &&
			!strings.HasPrefix(p, "internal/layers")
	}
	harness := func(d string) bool { return strings.HasPrefix(d, module+"internal/testing/") }
	if forbidLinks(t, load(t), shipping, harness, "a test harness", "harnesses are for tests and hack/ only") == 0 {
		t.Error("no shipping package found: the graph is wrong")
	}
}

// forbidLinks reports every chain of imports from a module package that
// checked accepts (by its short path) to a package forbidden accepts, and
// returns how many packages it checked.
func forbidLinks(t *testing.T, g *graph, checked, forbidden func(string) bool, what, advice string) int {
	t.Helper()
	n := 0
	for _, full := range g.inModule() {
		p := short(full)
		if !checked(p) {
			continue
		}
		n++
		for _, ch := range chains(g.imports, full, forbidden) {
			t.Errorf("%s links %s: %s; %s", p, what, render(ch), advice)
		}
	}
	return n
}

func isService(d string) bool { return strings.HasPrefix(d, module+"services/") }

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
	g := load(t)
	allowed := []string{"pkg/hookwire", "sdk/hook"}
	found := 0
	for _, full := range g.inModule() {
		p := short(full)
		if !strings.HasPrefix(p, "sdk/") {
			continue
		}
		found++
		forbidden := func(d string) bool {
			if rel, ok := strings.CutPrefix(d, module); ok {
				return !slices.Contains(allowed, rel)
			}
			for _, heavy := range []string{"k8s.io/client-go/", "github.com/nats-io/nats-server/", "github.com/prometheus/"} {
				if strings.HasPrefix(d, heavy) {
					return true
				}
			}
			return false
		}
		for _, ch := range chains(g.imports, full, forbidden) {
			t.Errorf("%s links %s: %s; the SDK may link only %v of metabus, and no client-go, nats-server or Prometheus", p, short(ch[len(ch)-1]), render(ch), allowed)
		}
	}
	if found == 0 {
		t.Error("no package under sdk/: update the rule")
	}
}

// TestBinariesLinkNoTypedClientset: no binary under cmd/ links client-go's
// typed clientset (k8s.io/client-go/kubernetes). Importing it runs the
// registration of every built-in API group at start: its code and type
// data touched and its scheme kept on the heap in every process, for a
// controller that talks to the API server through dynamic and JSON
// clients (pkg/kubeapi) only. Measured when it was last cut: the
// all-in-one's file-backed RSS 27 MiB against 35 with it.
func TestBinariesLinkNoTypedClientset(t *testing.T) {
	typed := func(d string) bool {
		return d == "k8s.io/client-go/kubernetes" || strings.HasPrefix(d, "k8s.io/client-go/kubernetes/")
	}
	if forbidLinks(t, load(t), isBinary, typed, "client-go's typed clientset", "use the dynamic client or pkg/kubeapi") == 0 {
		t.Error("no binary under cmd/ found: the graph is wrong")
	}
}

// TestStagesLinkNoNATSServer: the stage binaries connect to a server and
// run none, so they must not link nats-server: its package init starts a
// /proc sampler that wakes every process linking it once a second for its
// life (issue 31's idle CPU per stage replica), and its code adds to the
// resident set. Only the all-in-one (cmd/metabus) embeds a server, through
// pkg/embeddednats.
func TestStagesLinkNoNATSServer(t *testing.T) {
	stage := func(p string) bool { return isBinary(p) && p != "cmd/metabus" }
	server := func(d string) bool { return strings.HasPrefix(d, "github.com/nats-io/nats-server/") }
	if forbidLinks(t, load(t), stage, server, "nats-server", "only the all-in-one embeds one (pkg/embeddednats)") == 0 {
		t.Error("no stage binary under cmd/ found: the graph is wrong")
	}
}

// isBinary tells the binaries that ship (cmd/...) by their short path.
func isBinary(p string) bool { return strings.HasPrefix(p, "cmd/") }
