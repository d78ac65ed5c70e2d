package clitest

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/spf13/cobra"

	"github.com/metabus/metabus/pkg/cli"
)

// DefaultsDoc is the page, relative to the repository root, whose table
// under DefaultsHeading lists the upstream flags whose default metabus
// changes.
const (
	DefaultsDoc     = "docs/operating.md"
	DefaultsHeading = "### Defaults that differ from upstream"
)

// DocumentedDefault is one row of that table.
type DocumentedDefault struct {
	Metabus, Upstream string
}

// DefaultsAsDocumented checks the command's defaults of upstream
// Metacontroller's flags against upstream's and against the documented
// table: a flag the stage uses whose default differs from upstream's must
// be listed with both values, and a listed flag the stage uses must
// differ. Flags the stage ignores carry upstream's default and are not
// looked at, so the all-in-one, which ignores none, covers every row.
func DefaultsAsDocumented(t *testing.T, newCmd func() *cobra.Command, stage cli.Stage) {
	t.Helper()
	table, err := ReadDocumentedDefaults(RepoRoot(t))
	if err != nil {
		t.Fatal(err)
	}
	fs := newCmd().Flags()
	for _, name := range cli.UpstreamFlagNames() {
		if stage.Ignores(name) {
			continue
		}
		f := fs.Lookup(name)
		if f == nil {
			t.Errorf("--%s is not defined", name)
			continue
		}
		same, err := cli.SameAsUpstreamDefault(name, f.DefValue)
		if err != nil {
			t.Errorf("--%s: %v", name, err)
			continue
		}
		upstream, _ := cli.UpstreamDefault(name)
		row, listed := table[name]
		switch {
		case same && listed:
			t.Errorf("%s lists --%s as differing from upstream, but its default is upstream's (%q)", DefaultsDoc, name, f.DefValue)
		case !same && !listed:
			t.Errorf("--%s defaults to %q, upstream's to %q: %s does not list it under %q", name, f.DefValue, upstream, DefaultsDoc, DefaultsHeading)
		case !same && (row.Metabus != f.DefValue || row.Upstream != upstream):
			t.Errorf("%s says --%s defaults to %q (upstream %q); it is %q (upstream %q)", DefaultsDoc, name, row.Metabus, row.Upstream, f.DefValue, upstream)
		}
	}
	for name := range table {
		if _, ok := cli.UpstreamDefault(name); !ok {
			t.Errorf("%s lists --%s, which is not an upstream flag", DefaultsDoc, name)
		}
	}
}

// RepoRoot is the directory holding go.mod, above the test's directory.
func RepoRoot(t testing.TB) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("no go.mod above the test's directory")
		}
		dir = parent
	}
}

var (
	defaultsRow = regexp.MustCompile("^\\| `--([a-z0-9-]+)` \\| `([^`]*)` \\| `([^`]*)` \\|$")
	tableLine   = regexp.MustCompile(`^\|`)
)

// ReadDocumentedDefaults parses the defaults table of DefaultsDoc under
// root: its rows are `| `--flag` | `metabus` | `upstream` |`, with `""`
// for an empty default. A table row of another shape is an error, so a
// reworded table cannot silently check nothing.
func ReadDocumentedDefaults(root string) (map[string]DocumentedDefault, error) {
	data, err := os.ReadFile(filepath.Join(root, DefaultsDoc))
	if err != nil {
		return nil, err
	}
	text := string(data)
	i := strings.Index(text, "\n"+DefaultsHeading+"\n")
	if i < 0 {
		return nil, fmt.Errorf("%s has no %q section", DefaultsDoc, DefaultsHeading)
	}
	lines := strings.Split(text[i+1:], "\n")[1:]
	for len(lines) > 0 && !tableLine.MatchString(lines[0]) {
		if strings.HasPrefix(lines[0], "#") {
			return nil, fmt.Errorf("%s: no table under %q", DefaultsDoc, DefaultsHeading)
		}
		lines = lines[1:]
	}
	if len(lines) < 2 {
		return nil, fmt.Errorf("%s: no table under %q", DefaultsDoc, DefaultsHeading)
	}
	table := map[string]DocumentedDefault{}
	var errs []error
	for _, line := range lines[2:] { // the header and its separator
		if !tableLine.MatchString(line) {
			break
		}
		m := defaultsRow.FindStringSubmatch(line)
		if m == nil {
			errs = append(errs, fmt.Errorf("%s: a row of the defaults table that is not | `--flag` | `metabus` | `upstream` |: %s", DefaultsDoc, line))
			continue
		}
		if _, dup := table[m[1]]; dup {
			errs = append(errs, fmt.Errorf("%s: --%s listed twice", DefaultsDoc, m[1]))
		}
		table[m[1]] = DocumentedDefault{Metabus: unquoteEmpty(m[2]), Upstream: unquoteEmpty(m[3])}
	}
	if len(table) == 0 && len(errs) == 0 {
		errs = append(errs, fmt.Errorf("%s: the defaults table has no rows", DefaultsDoc))
	}
	return table, errors.Join(errs...)
}

// unquoteEmpty reads the table's `""` as the empty default.
func unquoteEmpty(s string) string {
	if s == `""` {
		return ""
	}
	return s
}
