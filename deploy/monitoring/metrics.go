// Package monitoring holds metabus's Grafana dashboard and Prometheus alert
// rules, and the list of metrics metabus exports (metrics/upstream.txt,
// taken from upstream Metacontroller's source; metrics/metabus.txt, its
// own), which the e2e scrape test checks against a live metabus and the
// dashboard and rules test checks every PromQL expression against.
package monitoring

import (
	"bufio"
	"bytes"
	"embed"
	"fmt"
	"slices"
	"strings"
)

//go:embed metrics/upstream.txt metrics/metabus.txt
var lists embed.FS

// HookTypes are the values of <hook> in upstream.txt: upstream's hook
// types, then metabus's MapController hooks.
var HookTypes = []string{"sync", "finalize", "customize", "map", "tombstone"}

// upstreamHooks are the hook types upstream itself has.
var upstreamHooks = []string{"sync", "finalize", "customize"}

// Metric is one exported metric family.
type Metric struct {
	Name string
	// Type is counter, gauge, histogram or summary.
	Type string
	// Labels are the label names of every series, sorted.
	Labels []string
	// Optional families appear only once what they count has happened.
	Optional bool
	// Upstream marks upstream-compatible families (upstream.txt).
	Upstream bool
}

// Exported returns every metric family metabus exports, <hook> expanded
// (map and tombstone optional: only MapControllers call them).
func Exported() ([]Metric, error) {
	var out []Metric
	for _, f := range []struct {
		file     string
		upstream bool
	}{{"metrics/upstream.txt", true}, {"metrics/metabus.txt", false}} {
		data, err := lists.ReadFile(f.file)
		if err != nil {
			return nil, err
		}
		ms, err := parse(data, f.upstream)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", f.file, err)
		}
		out = append(out, ms...)
	}
	return out, nil
}

func parse(data []byte, upstream bool) ([]Metric, error) {
	var out []Metric
	sc := bufio.NewScanner(bytes.NewReader(data))
	for line := 1; sc.Scan(); line++ {
		text := strings.TrimSpace(sc.Text())
		if text == "" || strings.HasPrefix(text, "#") {
			continue
		}
		f := strings.Fields(text)
		if len(f) < 3 || len(f) > 4 || len(f) == 4 && f[3] != "optional" {
			return nil, fmt.Errorf("line %d: want <name> <type> <labels> [optional], got %q", line, text)
		}
		switch f[1] {
		case "counter", "gauge", "histogram", "summary":
		default:
			return nil, fmt.Errorf("line %d: unknown type %q", line, f[1])
		}
		m := Metric{Name: f[0], Type: f[1], Optional: len(f) == 4, Upstream: upstream}
		if f[2] != "-" {
			m.Labels = strings.Split(f[2], ",")
			if !slices.IsSorted(m.Labels) {
				return nil, fmt.Errorf("line %d: labels %v not sorted", line, m.Labels)
			}
		}
		if !strings.Contains(m.Name, "<hook>") {
			out = append(out, m)
			continue
		}
		for _, h := range HookTypes {
			e := m
			e.Name = strings.ReplaceAll(m.Name, "<hook>", h)
			e.Optional = m.Optional || !slices.Contains(upstreamHooks, h)
			out = append(out, e)
		}
	}
	return out, sc.Err()
}

// Series returns the names of the series a family exposes: a histogram's
// _bucket, _sum and _count, a summary's quantiles (its own name), _sum and
// _count.
func (m Metric) Series() []string {
	switch m.Type {
	case "histogram":
		return []string{m.Name + "_bucket", m.Name + "_sum", m.Name + "_count"}
	case "summary":
		return []string{m.Name, m.Name + "_sum", m.Name + "_count"}
	}
	return []string{m.Name}
}
