// Package docs holds metabus's documentation pages; its test keeps them
// honest: links and anchors resolve inside the repository, the commands
// and the example the README shows are the ones that exist, and the tests
// and metrics the pages cite exist.
package docs

import (
	"bufio"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"unicode"

	"github.com/google/go-cmp/cmp"
)

// root is the repository, from this package's directory.
const root = ".."

// pendingPages are pages the README links that other branches are writing
// (issue 32); they may be missing until those branches are merged. Once a
// page exists, TestPendingPages asks for its removal from this list, so it
// cannot outlive the merge.
var pendingPages = []string{}

// page is one Markdown file: its path from the root, its lines outside
// fenced code blocks (prose), and its code (fenced blocks and inline code
// spans).
type page struct {
	path  string
	text  string
	prose []proseLine
}

type proseLine struct {
	n    int
	text string
}

// pages reads every Markdown file of the repository except test data.
func pages(t *testing.T) []page {
	t.Helper()
	var out []page
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if name := d.Name(); path != root && (strings.HasPrefix(name, ".") || name == "testdata" || name == "node_modules" || name == "bin") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".md") {
			return nil
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(root, path)
		if err != nil {
			return err
		}
		out = append(out, parsePage(filepath.ToSlash(rel), string(data)))
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(out) < 10 {
		t.Fatalf("found %d Markdown pages under %s; the walk is broken", len(out), root)
	}
	return out
}

var fence = regexp.MustCompile("^\\s*(```|~~~)")

func parsePage(path, text string) page {
	p := page{path: path, text: text}
	inCode := false
	sc := bufio.NewScanner(strings.NewReader(text))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		if fence.MatchString(line) {
			inCode = !inCode
			continue
		}
		if !inCode {
			p.prose = append(p.prose, proseLine{n, line})
		}
	}
	return p
}

var (
	// A Markdown link or image: [text](target) or [text](target "title").
	linkRe = regexp.MustCompile(`\]\(([^)\s]+)(?:\s+"[^"]*")?\)`)
	// An inline code span, dropped before links are looked for.
	codeSpan = regexp.MustCompile("`[^`]*`")
	headRe   = regexp.MustCompile(`^(#{1,6})\s+(.*?)\s*#*\s*$`)
)

// anchors are the heading anchors GitHub gives a page: lower case,
// punctuation dropped, spaces as hyphens, a repeated one numbered.
func anchors(p page) map[string]bool {
	out := map[string]bool{}
	seen := map[string]int{}
	for _, l := range p.prose {
		m := headRe.FindStringSubmatch(l.text)
		if m == nil {
			continue
		}
		a := slug(m[2])
		if n := seen[a]; n > 0 {
			out[fmt.Sprintf("%s-%d", a, n)] = true
		} else {
			out[a] = true
		}
		seen[a]++
	}
	return out
}

func slug(heading string) string {
	// Link text and markup count as text: [x](y) is x, `x` is x.
	heading = regexp.MustCompile(`\[([^\]]*)\]\([^)]*\)`).ReplaceAllString(heading, "$1")
	var b strings.Builder
	for _, r := range strings.ToLower(heading) {
		switch {
		case unicode.IsLetter(r) || unicode.IsDigit(r) || r == '_' || r == '-':
			b.WriteRune(r)
		case r == ' ':
			b.WriteRune('-')
		}
	}
	return b.String()
}

func TestSlug(t *testing.T) {
	cases := []struct{ reason, heading, want string }{
		{"a question mark is dropped", "When is the hook called?", "when-is-the-hook-called"},
		{"parentheses and commas are dropped, hyphens kept", "Echo suppression (a metabus extension, opt-in)", "echo-suppression-a-metabus-extension-opt-in"},
		{"code spans count as their text", "`make run` and `make test`", "make-run-and-make-test"},
		{"a link counts as its text", "See [the bus](architecture.md)", "see-the-bus"},
		{"NATS: a colon is dropped, the spaces stay hyphens", "NATS: TLS, the monitoring port", "nats-tls-the-monitoring-port"},
	}
	for _, c := range cases {
		t.Run(c.reason, func(t *testing.T) {
			if got := slug(c.heading); got != c.want {
				t.Errorf("slug(%q) = %q, want %q", c.heading, got, c.want)
			}
		})
	}
}

// TestLinks: every relative link of every page leads to a file or
// directory of the repository, and an anchor to a heading of the page it
// names; none leads outside the repository.
func TestLinks(t *testing.T) {
	all := pages(t)
	byPath := map[string]page{}
	for _, p := range all {
		byPath[p.path] = p
	}
	checked := 0
	for _, p := range all {
		for _, l := range p.prose {
			for _, m := range linkRe.FindAllStringSubmatch(codeSpan.ReplaceAllString(l.text, ""), -1) {
				target := m[1]
				if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
					continue
				}
				checked++
				file, anchor, _ := strings.Cut(target, "#")
				dest := p.path
				if file != "" {
					dest = filepath.ToSlash(filepath.Clean(filepath.Join(filepath.Dir(p.path), file)))
				}
				if dest == ".." || strings.HasPrefix(dest, "../") || filepath.IsAbs(file) {
					t.Errorf("%s:%d: link %q leads outside the repository", p.path, l.n, target)
					continue
				}
				if _, err := os.Stat(filepath.Join(root, dest)); err != nil {
					if !slices.Contains(pendingPages, dest) {
						t.Errorf("%s:%d: link %q: %s does not exist", p.path, l.n, target, dest)
					}
					continue
				}
				if anchor == "" {
					continue
				}
				destPage, ok := byPath[dest]
				if !ok {
					t.Errorf("%s:%d: link %q: an anchor into %s, which is not a Markdown page", p.path, l.n, target, dest)
					continue
				}
				if !anchors(destPage)[anchor] {
					t.Errorf("%s:%d: link %q: %s has no heading with anchor #%s", p.path, l.n, target, dest, anchor)
				}
			}
		}
	}
	if checked < 50 {
		t.Errorf("only %d relative links checked; the link pattern is broken", checked)
	}
}

// outside are references to files that are not in the repository: the
// notes the project was built from.
var outside = regexp.MustCompile(`\.\./shared\b|/work/shared|\bdesign\.md\b|jetstream-findings`)

// TestNoPathOutsideRepository: no file of the repository (pages, code
// blocks, code comments, manifests, scripts) points at a file outside it:
// a reader of the repository alone must be able to follow every reference.
func TestNoPathOutsideRepository(t *testing.T) {
	self := filepath.Join("docs", "docs_test.go") // holds the pattern itself
	checked := 0
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		if d.IsDir() {
			switch d.Name() {
			case ".git", "bin", "node_modules", ".cache":
				return filepath.SkipDir
			}
			return nil
		}
		if rel == self || !textFile(d.Name()) {
			return nil
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		checked++
		for n, line := range strings.Split(string(data), "\n") {
			if m := outside.FindString(line); m != "" {
				t.Errorf("%s:%d: %q refers to a file outside the repository", rel, n+1, m)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if checked < 200 {
		t.Errorf("only %d files checked; the walk is broken", checked)
	}
}

// textFile says whether a file's name marks it as text a person reads.
func textFile(name string) bool {
	switch filepath.Ext(name) {
	case ".go", ".md", ".yaml", ".yml", ".conf", ".sh", ".py", ".js", ".tpl", ".txt", ".json", ".tsv":
		return true
	}
	switch name {
	case "Makefile", "Dockerfile", "run":
		return true
	}
	return false
}

// makeTargets are the Makefile's rule names.
func makeTargets(t *testing.T) map[string]bool {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(root, "Makefile"))
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^([a-zA-Z0-9_.-]+):`).FindAllStringSubmatch(string(data), -1) {
		out[m[1]] = true
	}
	return out
}

var makeCmd = regexp.MustCompile(`(?:^|[\s(` + "`" + `])make ([a-z][a-z0-9-]*)`)

// TestMakeTargets: the README's two commands are Makefile targets, and so
// is every `make X` any page shows (in code, where a command is).
func TestMakeTargets(t *testing.T) {
	targets := makeTargets(t)
	readme := readPage(t, "README.md")
	block := codeBlockAfter(t, readme, "## Two commands")
	var two []string
	for _, m := range makeCmd.FindAllStringSubmatch(block, -1) {
		two = append(two, m[1])
	}
	if diff := cmp.Diff([]string{"run", "test"}, two); diff != "" {
		t.Errorf("the README's two commands (-want +got):\n%s", diff)
	}
	for _, p := range pages(t) {
		for n, line := range strings.Split(p.text, "\n") {
			for _, m := range makeCmd.FindAllStringSubmatch(line, -1) {
				if !targets[m[1]] && inCode(line, "make "+m[1]) {
					t.Errorf("%s:%d: `make %s`: the Makefile has no target %s", p.path, n+1, m[1], m[1])
				}
			}
		}
	}
	for _, want := range []string{"run", "test"} {
		if !targets[want] {
			t.Errorf("the Makefile has no %q target", want)
		}
	}
}

// inCode says whether s appears in line inside a code span, or line is a
// command in a code block (no prose around it).
func inCode(line, s string) bool {
	for _, span := range codeSpan.FindAllString(line, -1) {
		if strings.Contains(span, s) {
			return true
		}
	}
	return strings.HasPrefix(strings.TrimSpace(line), s)
}

func readPage(t *testing.T, path string) string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(root, path))
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}

// codeBlockAfter is the first fenced code block after the heading.
func codeBlockAfter(t *testing.T, text, heading string) string {
	t.Helper()
	return codeBlocksAfter(t, text, heading, 1)[0]
}

// codeBlocksAfter are the first n fenced code blocks after the heading,
// within its section.
func codeBlocksAfter(t *testing.T, text, heading string, n int) []string {
	t.Helper()
	i := strings.Index(text, "\n"+heading+"\n")
	if i < 0 {
		t.Fatalf("no %q section", heading)
	}
	section := text[i+len(heading)+2:]
	if j := strings.Index(section, "\n## "); j >= 0 {
		section = section[:j]
	}
	var blocks []string
	for len(blocks) < n {
		start := strings.Index(section, "```")
		if start < 0 {
			t.Fatalf("%q has %d code blocks, want %d", heading, len(blocks), n)
		}
		body := section[start+3:]
		body = body[strings.Index(body, "\n")+1:]
		end := strings.Index(body, "```")
		if end < 0 {
			t.Fatalf("%q: an unclosed code block", heading)
		}
		blocks = append(blocks, body[:end])
		section = body[end+3:]
	}
	return blocks
}

// TestReadmeExample: the README's example is the HelloWorld controller
// that `make run` and docker-compose install, with the hook URL
// docker-compose gives it, and its hook is the function docker-compose
// serves (which deploy's TestDockerCompose holds equal to the Go hook the
// e2e suite and `make run` serve).
func TestReadmeExample(t *testing.T) {
	readme := readPage(t, "README.md")
	blocks := codeBlocksAfter(t, readme, "## An example", 2)

	compose := readPage(t, "docker-compose.yaml")
	m := regexp.MustCompile(`sed 's#HOOK_URL#([^#]+)#' /example/controller.yaml`).FindStringSubmatch(compose)
	if m == nil {
		t.Fatal("docker-compose.yaml no longer substitutes HOOK_URL in the example's controller.yaml")
	}
	manifest := readPage(t, "examples/helloworld/manifests/controller.yaml")
	var want []string
	for _, line := range strings.Split(manifest, "\n") {
		if strings.HasPrefix(line, "#") {
			continue
		}
		want = append(want, strings.ReplaceAll(line, "HOOK_URL", m[1]))
	}
	if diff := cmp.Diff(strings.TrimSpace(strings.Join(want, "\n")), strings.TrimSpace(blocks[0])); diff != "" {
		t.Errorf("the README's CompositeController is not examples/helloworld/manifests/controller.yaml as docker-compose applies it (-want +got):\n%s", diff)
	}

	hook := readPage(t, "examples/helloworld/hook/sync.py")
	if !strings.HasPrefix(strings.TrimSpace(blocks[1]), "def sync(request):") || !strings.Contains(hook, blocks[1]) {
		t.Errorf("the README's hook is not the sync function of examples/helloworld/hook/sync.py:\n%s", blocks[1])
	}
}

// testFuncs are the names of the repository's tests, benchmarks and fuzz
// targets.
func testFuncs(t *testing.T) map[string]bool {
	t.Helper()
	out := map[string]bool{}
	decl := regexp.MustCompile(`(?m)^func ((?:Test|Benchmark|Fuzz)\w+)\(`)
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && path != root && strings.HasPrefix(d.Name(), ".") {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, "_test.go") {
			return nil
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for _, m := range decl.FindAllStringSubmatch(string(data), -1) {
			out[m[1]] = true
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestCitedTestsExist: a test a page names as evidence (`TestX`, or
// `TestX*` for a family) exists, so a claim cannot outlive its test.
func TestCitedTestsExist(t *testing.T) {
	funcs := testFuncs(t)
	cited := regexp.MustCompile("`((?:Test|Benchmark|Fuzz)[A-Z]\\w*)(\\*?)`")
	n := 0
	for _, p := range pages(t) {
		for i, line := range strings.Split(p.text, "\n") {
			for _, m := range cited.FindAllStringSubmatch(line, -1) {
				n++
				name, family := m[1], m[2] == "*"
				found := funcs[name]
				if family {
					for f := range funcs {
						if strings.HasPrefix(f, name) {
							found = true
							break
						}
					}
				}
				if !found {
					t.Errorf("%s:%d: cites %s, which no _test.go file defines", p.path, i+1, m[0])
				}
			}
		}
	}
	if n < 20 {
		t.Errorf("only %d cited tests found; the pattern is broken", n)
	}
}

// TestReadmeFacts: the Go version and the release the README states are
// go.mod's and the chart's.
func TestReadmeFacts(t *testing.T) {
	readme := readPage(t, "README.md")
	gomod := readPage(t, "go.mod")
	m := regexp.MustCompile(`(?m)^go (\d+\.\d+)`).FindStringSubmatch(gomod)
	if m == nil {
		t.Fatal("go.mod has no go directive")
	}
	if !strings.Contains(readme, "with Go "+m[1]+" ") {
		t.Errorf("the README does not say the Go go.mod asks for (%s)", m[1])
	}
	chart := readPage(t, "deploy/helm/metabus/Chart.yaml")
	v := regexp.MustCompile(`(?m)^appVersion:\s*"?([^"\s]+)"?`).FindStringSubmatch(chart)
	if v == nil {
		t.Fatal("Chart.yaml has no appVersion")
	}
	if !strings.Contains(readme, "This installs version "+v[1]+":") {
		t.Errorf("the README does not say it installs the chart's appVersion %s", v[1])
	}
}

// TestPendingPages: a page another branch was writing exists now, so it
// leaves pendingPages and TestLinks checks links to it like any other.
func TestPendingPages(t *testing.T) {
	for _, p := range pendingPages {
		if _, err := os.Stat(filepath.Join(root, p)); err == nil {
			t.Errorf("%s exists: remove it from pendingPages", p)
		}
	}
}

// exportedMetrics are the metric names of deploy/monitoring/metrics, the
// lists the e2e scrape test (TestMetrics) holds a live metabus to.
func exportedMetrics(t *testing.T) map[string]bool {
	t.Helper()
	out := map[string]bool{}
	for _, list := range []string{"upstream.txt", "metabus.txt"} {
		for _, line := range strings.Split(readPage(t, "deploy/monitoring/metrics/"+list), "\n") {
			if f := strings.Fields(line); len(f) > 0 && !strings.HasPrefix(f[0], "#") {
				out[f[0]] = true
			}
		}
	}
	if len(out) < 20 {
		t.Fatalf("only %d metrics listed in deploy/monitoring/metrics; their format changed", len(out))
	}
	return out
}

var metricSpan = regexp.MustCompile("`((?:metacontroller|metabus|workqueue|rest_client|leader_election)_[a-z0-9_<>]+)(?:\\{[^`]*\\})?(?: [^`]*)?`")

// TestCitedMetricsExist: a metric a page names in code (`metabus_x`,
// `metabus_x{label}`, `metacontroller_<hook>_y`) is one metabus exports,
// so a renamed or dropped metric cannot live on in the docs.
func TestCitedMetricsExist(t *testing.T) {
	exported := exportedMetrics(t)
	n := 0
	for _, p := range pages(t) {
		for i, line := range strings.Split(p.text, "\n") {
			for _, m := range metricSpan.FindAllStringSubmatch(line, -1) {
				n++
				if !exported[m[1]] {
					t.Errorf("%s:%d: %s is not in deploy/monitoring/metrics", p.path, i+1, m[1])
				}
			}
		}
	}
	if n < 20 {
		t.Errorf("only %d cited metrics found; the pattern is broken", n)
	}
}
