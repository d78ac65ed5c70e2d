package clitest

import (
	"errors"
	"fmt"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

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
	table, err := ReadDocumentedDefaults(repoPath(t, DefaultsDoc))
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

var (
	defaultsRow = regexp.MustCompile("^\\| `--([a-z0-9-]+)` \\| `([^`]*)` \\| `([^`]*)` \\|$")
	tableLine   = regexp.MustCompile(`^\|`)
)

// ReadDocumentedDefaults parses the defaults table of DefaultsDoc, at
// path: its rows are `| `--flag` | `metabus` | `upstream` |`, with `""`
// for an empty default. A table row of another shape is an error, so a
// reworded table cannot silently check nothing.
func ReadDocumentedDefaults(path string) (map[string]DocumentedDefault, error) {
	data, err := os.ReadFile(path)
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

// FlagsDoc and FlagsTableHeading locate the table of every service's
// flags and their defaults.
const (
	FlagsDoc          = "docs/operating.md"
	FlagsTableHeading = "| flag | default | meaning |"
)

var (
	flagName = regexp.MustCompile("`--([a-z0-9-]+)`")
	fraction = regexp.MustCompile(`^(\d+)/(\d+)$`)
)

// FlagTableAsDocumented checks the defaults the flags tables of FlagsDoc
// (every service's, then each service's own) give against the command's:
// a row names flags (`--a`, `--b`) and their
// defaults in the same order, comma separated, each possibly followed by
// a parenthetical; "none" is an empty default, an empty cell says each
// flag has none (empty or false). Rows naming no flag (environment
// variables) are not looked at, nor flags the stage ignores (they carry
// upstream's defaults, which TestDefaultsAsDocumented checks). A flag the
// command does not define is another service's, except for the
// all-in-one, which defines them all.
func FlagTableAsDocumented(t *testing.T, newCmd func() *cobra.Command, stage cli.Stage) {
	t.Helper()
	data, err := os.ReadFile(repoPath(t, FlagsDoc))
	if err != nil {
		t.Fatal(err)
	}
	tables := strings.Split(string(data), "\n"+FlagsTableHeading+"\n")[1:]
	if len(tables) < 4 {
		t.Fatalf("%s has %d tables headed %q, want every service's and the watcher's, dispatcher's and revisions service's", FlagsDoc, len(tables), FlagsTableHeading)
	}
	cmd := newCmd()
	fs := cmd.Flags()
	rows := 0
	var lines []string
	for _, table := range tables {
		for _, line := range strings.Split(table, "\n")[1:] { // after the separator
			if !strings.HasPrefix(line, "|") {
				break
			}
			lines = append(lines, line)
		}
	}
	for _, line := range lines {
		cells := strings.Split(strings.Trim(line, "|"), "|")
		if len(cells) < 3 {
			t.Errorf("%s: a flags table row with %d cells: %s", FlagsDoc, len(cells), line)
			continue
		}
		var names []string
		for _, m := range flagName.FindAllStringSubmatch(cells[0], -1) {
			names = append(names, m[1])
		}
		if len(names) == 0 {
			continue
		}
		rows++
		defaults := splitTopLevel(strings.TrimSpace(cells[1]))
		if len(defaults) != 0 && len(defaults) != len(names) {
			t.Errorf("%s: %d defaults for %d flags: %s", FlagsDoc, len(defaults), len(names), line)
			continue
		}
		for k, name := range names {
			if stage.Ignores(name) {
				continue
			}
			f := fs.Lookup(name)
			if f == nil {
				if stage == cli.AllInOne {
					t.Errorf("%s lists --%s, which %s does not define", FlagsDoc, name, cmd.Name())
				}
				continue
			}
			if len(defaults) == 0 {
				if f.DefValue != "" && f.DefValue != "false" {
					t.Errorf("%s gives --%s no default; it has %q", FlagsDoc, name, f.DefValue)
				}
				continue
			}
			if doc := docValue(defaults[k]); !sameValue(doc, f.DefValue) {
				t.Errorf("%s says --%s defaults to %q; it is %q", FlagsDoc, name, doc, f.DefValue)
			}
		}
	}
	if rows < 25 {
		t.Errorf("%s: only %d flag rows found; the table's shape changed", FlagsDoc, rows)
	}
}

// splitTopLevel splits a cell at the commas outside parentheses.
func splitTopLevel(cell string) []string {
	if cell == "" {
		return nil
	}
	var out []string
	depth, start := 0, 0
	for i, r := range cell {
		switch r {
		case '(':
			depth++
		case ')':
			depth--
		case ',':
			if depth == 0 {
				out = append(out, strings.TrimSpace(cell[start:i]))
				start = i + 1
			}
		}
	}
	return append(out, strings.TrimSpace(cell[start:]))
}

// docValue is a documented default without its parenthetical and code
// marks, "none" as empty.
func docValue(s string) string {
	if i := strings.Index(s, " ("); i >= 0 {
		s = s[:i]
	}
	s = strings.Trim(s, "`")
	if s == "none" {
		return ""
	}
	return s
}

// sameValue compares a documented default with a flag's: as text, as
// numbers (1/300 is 0.0033…) or as durations (30m is 30m0s).
func sameValue(doc, flag string) bool {
	if doc == flag {
		return true
	}
	if m := fraction.FindStringSubmatch(doc); m != nil {
		a, _ := strconv.ParseFloat(m[1], 64)
		b, _ := strconv.ParseFloat(m[2], 64)
		doc = strconv.FormatFloat(a/b, 'g', -1, 64)
	}
	if a, err := strconv.ParseFloat(doc, 64); err == nil {
		b, err := strconv.ParseFloat(flag, 64)
		return err == nil && a == b
	}
	if a, err := time.ParseDuration(doc); err == nil {
		b, err := time.ParseDuration(flag)
		return err == nil && a == b
	}
	return false
}
