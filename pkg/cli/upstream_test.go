package cli

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// TestSameAsUpstreamDefault: a default is compared with upstream's as
// upstream's type, so a flag set's spelling of the same value (30m0s for
// 30m) is not taken for a difference, and a real one is.
func TestSameAsUpstreamDefault(t *testing.T) {
	cases := []struct {
		reason  string
		name    string
		value   string
		want    bool
		wantErr bool
	}{
		{reason: "a duration printed by Go's flag package is upstream's 30m", name: "cache-flush-interval", value: "30m0s", want: true},
		{reason: "another duration differs", name: "cache-flush-interval", value: "10m0s", want: false},
		{reason: "a rate printed in full is upstream's 1/300", name: "events-qps", value: "0.0033333333333333335", want: true},
		{reason: "metabus's unlimited client rate differs from upstream's 5", name: "client-go-qps", value: "-1", want: false},
		{reason: "an int compares as an int", name: "workers", value: "5", want: true},
		{reason: "metabus's 16 workers differ", name: "workers", value: "16", want: false},
		{reason: "a bool compares as a bool", name: "leader-election", value: "false", want: true},
		{reason: "a string compares exactly", name: "leader-election-id", value: "metabus-watcher", want: false},
		{reason: "an empty string default is upstream's empty one", name: "zap-time-encoding", value: "", want: true},
		{reason: "a value that does not parse as upstream's type is an error", name: "workers", value: "many", wantErr: true},
		{reason: "a flag upstream does not have is an error", name: "nats-url", value: "nats://127.0.0.1:4222", wantErr: true},
	}
	for _, c := range cases {
		t.Run(c.reason, func(t *testing.T) {
			got, err := SameAsUpstreamDefault(c.name, c.value)
			if (err != nil) != c.wantErr {
				t.Fatalf("SameAsUpstreamDefault(%q, %q) error = %v, want error %v", c.name, c.value, err, c.wantErr)
			}
			if err == nil && got != c.want {
				t.Errorf("SameAsUpstreamDefault(%q, %q) = %v, want %v", c.name, c.value, got, c.want)
			}
		})
	}
}

// TestUpstreamDefault: every upstream flag has its default, and a flag
// upstream lacks has none.
func TestUpstreamDefault(t *testing.T) {
	for _, name := range UpstreamFlagNames() {
		if _, ok := UpstreamDefault(name); !ok {
			t.Errorf("UpstreamDefault(%q): not found", name)
		}
	}
	if def, ok := UpstreamDefault("max-in-flight"); ok {
		t.Errorf("UpstreamDefault(max-in-flight) = %q, true; metabus's own flag is not upstream's", def)
	}
	if def, _ := UpstreamDefault("leader-election-id"); def != "metacontroller" {
		t.Errorf("UpstreamDefault(leader-election-id) = %q, want metacontroller", def)
	}
}

// TestIgnoredFlagsAsDocumented: the table of upstream flags in
// docs/operating.md says, for every upstream flag, which binaries honour
// it and which ignore it, as ignoredBy does.
func TestIgnoredFlagsAsDocumented(t *testing.T) {
	data, err := os.ReadFile(filepath.Join("..", "..", "docs", "operating.md"))
	if err != nil {
		t.Fatal(err)
	}
	const heading = "| upstream flag | honoured by | ignored by (why) |"
	_, table, ok := strings.Cut(string(data), "\n"+heading+"\n")
	if !ok {
		t.Fatalf("docs/operating.md has no table headed %q", heading)
	}
	stages := []Stage{AllInOne, Watcher, Dispatcher, Applier, Revisions}
	flagRe := regexp.MustCompile("`--([a-z0-9-]+)`")
	stageWords := func(cell string) []Stage {
		// Stage names outside the parentheses that say why.
		cell = regexp.MustCompile(`\([^)]*\)`).ReplaceAllString(cell, "")
		if strings.TrimSpace(cell) == "all" {
			return stages
		}
		var out []Stage
		for _, w := range strings.Split(cell, ",") {
			if w = strings.TrimSpace(w); w != "" {
				out = append(out, Stage(w))
			}
		}
		return out
	}
	seen := map[string]bool{}
	for _, line := range strings.Split(table, "\n")[1:] {
		if !strings.HasPrefix(line, "|") {
			break
		}
		cells := strings.Split(strings.Trim(line, "|"), "|")
		if len(cells) != 3 {
			t.Errorf("a row with %d cells: %s", len(cells), line)
			continue
		}
		honoured, ignored := stageWords(cells[1]), stageWords(cells[2])
		for _, s := range append(append([]Stage{}, honoured...), ignored...) {
			if !slices.Contains(stages, s) {
				t.Errorf("%q is no binary: %s", s, line)
			}
		}
		for _, m := range flagRe.FindAllStringSubmatch(cells[0], -1) {
			name := m[1]
			if seen[name] {
				t.Errorf("--%s is in two rows", name)
			}
			seen[name] = true
			for _, s := range stages {
				inH, inI := slices.Contains(honoured, s), slices.Contains(ignored, s)
				switch {
				case inH == inI:
					t.Errorf("--%s: the table says %s both honours and ignores it, or neither", name, s)
				case inI != s.Ignores(name):
					t.Errorf("--%s: the table says %s ignores it: %v; it does: %v", name, s, inI, s.Ignores(name))
				}
			}
		}
	}
	for _, name := range UpstreamFlagNames() {
		if !seen[name] {
			t.Errorf("--%s, an upstream flag, is not in the table", name)
		}
	}
}
