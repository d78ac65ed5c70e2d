package layers

import (
	"fmt"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"
)

const module = "github.com/metabus/metabus/"

// graph is the build's import graph: every package of the module and
// every package it links (standard library included), without tests.
type graph struct {
	imports map[string][]string // full import path → direct imports
	deps    map[string][]string // full import path → transitive deps
}

// inModule lists the module's own packages, sorted.
func (g *graph) inModule() []string {
	var ps []string
	for p := range g.imports {
		if strings.HasPrefix(p, module) {
			ps = append(ps, p)
		}
	}
	slices.Sort(ps)
	return ps
}

// links reports whether p links dep (imports it, directly or not).
func (g *graph) links(p, dep string) bool { return slices.Contains(g.deps[p], dep) }

var loaded struct {
	once sync.Once
	g    *graph
	err  error
}

// load reads the graph once per test binary (go list -deps, ~2s).
func load(t *testing.T) *graph {
	t.Helper()
	loaded.once.Do(func() { loaded.g, loaded.err = list() })
	if loaded.err != nil {
		t.Fatal(loaded.err)
	}
	return loaded.g
}

func list() (*graph, error) {
	goBin, err := exec.LookPath("go")
	if err != nil {
		goBin = filepath.Join(runtime.GOROOT(), "bin", "go")
	}
	cmd := exec.Command(goBin, "list", "-deps", "-f", "{{.ImportPath}}\t{{join .Imports \" \"}}\t{{join .Deps \" \"}}", module+"...")
	cmd.Dir = "../.."
	out, err := cmd.CombinedOutput()
	if err != nil {
		return nil, fmt.Errorf("go list: %w\n%s", err, out)
	}
	g := &graph{imports: map[string][]string{}, deps: map[string][]string{}}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Split(line, "\t")
		if len(f) != 3 {
			return nil, fmt.Errorf("go list line %q: want 3 fields", line)
		}
		g.imports[f[0]], g.deps[f[0]] = strings.Fields(f[1]), strings.Fields(f[2])
	}
	if n := len(g.inModule()); n < 50 {
		return nil, fmt.Errorf("go list found %d packages of the module; the pattern is broken", n)
	}
	return g, nil
}

// chains returns, for each direct import of from through which from
// links a package forbidden reports, the shortest import chain from from
// to the nearest such package: the imports a fix must cut. Imports are
// followed in their listed (sorted) order, so the answer is stable.
func chains(imports map[string][]string, from string, forbidden func(string) bool) [][]string {
	var out [][]string
	for _, d := range imports[from] {
		if c := shortest(imports, d, forbidden); c != nil {
			out = append(out, append([]string{from}, c...))
		}
	}
	return out
}

// shortest is the shortest import chain from start to a forbidden package
// (breadth first), nil if start links none.
func shortest(imports map[string][]string, start string, forbidden func(string) bool) []string {
	prev := map[string]string{start: ""}
	queue := []string{start}
	for len(queue) > 0 {
		p := queue[0]
		queue = queue[1:]
		if forbidden(p) {
			var c []string
			for ; p != ""; p = prev[p] {
				c = append(c, p)
			}
			slices.Reverse(c)
			return c
		}
		for _, d := range imports[p] {
			if _, seen := prev[d]; !seen {
				prev[d] = p
				queue = append(queue, d)
			}
		}
	}
	return nil
}

// short names a package of the module by its path in the repository.
func short(p string) string { return strings.TrimPrefix(p, module) }

// render writes a chain as "a → b → c", the module's packages shortened.
func render(c []string) string {
	s := make([]string, len(c))
	for i, p := range c {
		s[i] = short(p)
	}
	return strings.Join(s, " → ")
}

func TestChains(t *testing.T) {
	// core imports leaf and mid; mid imports both client and leaf;
	// client imports wire, the forbidden package; other links it too,
	// through a longer way.
	imports := map[string][]string{
		"core":   {"leaf", "mid", "other"},
		"mid":    {"client", "leaf"},
		"client": {"wire"},
		"other":  {"x"},
		"x":      {"y"},
		"y":      {"wire", "client"},
		"cycle":  {"loop"},
		"loop":   {"cycle"},
	}
	forbidden := func(p string) bool { return p == "wire" }
	for _, tc := range []struct {
		reason    string
		from      string
		forbidden func(string) bool
		want      [][]string
	}{
		{reason: "one chain per direct import that links the package, each the shortest", from: "core", forbidden: forbidden,
			want: [][]string{{"core", "mid", "client", "wire"}, {"core", "other", "x", "y", "wire"}}},
		{reason: "a direct import of the forbidden package is a chain of two", from: "client", forbidden: forbidden,
			want: [][]string{{"client", "wire"}}},
		{reason: "the nearest forbidden package ends the chain", from: "core", forbidden: func(p string) bool { return p == "wire" || p == "client" },
			want: [][]string{{"core", "mid", "client"}, {"core", "other", "x", "y", "wire"}}},
		{reason: "a package linking nothing forbidden has no chain", from: "leaf", forbidden: forbidden},
		{reason: "an import cycle ends the search", from: "cycle", forbidden: forbidden},
		{reason: "a package outside the graph has no chain", from: "absent", forbidden: forbidden},
	} {
		t.Run(tc.reason, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, chains(imports, tc.from, tc.forbidden)); diff != "" {
				t.Errorf("chains(%q) (-want +got):\n%s", tc.from, diff)
			}
		})
	}
}

func TestRender(t *testing.T) {
	got := render([]string{module + "pkg/mapctl", module + "pkg/events", "k8s.io/client-go/tools/record"})
	if want := "pkg/mapctl → pkg/events → k8s.io/client-go/tools/record"; got != want {
		t.Errorf("render = %q, want %q", got, want)
	}
}
