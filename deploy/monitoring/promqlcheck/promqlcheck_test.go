// Package promqlcheck tests metabus's dashboard and alert rules with
// Prometheus's own PromQL parser. It is a module of its own so that the
// Prometheus module, whose requirements would move the Kubernetes and
// OpenAPI libraries the metabus binaries link, stays out of metabus's
// go.mod: `make test` runs it from this directory.
package promqlcheck

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/metabus/metabus/deploy/monitoring"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/promql/parser"
	"sigs.k8s.io/yaml"
)

// grafanaVars are the dashboard's variables as a query would see them:
// Grafana substitutes them before Prometheus parses the expression.
var grafanaVars = strings.NewReplacer("$__rate_interval", "5m", "${namespace}", "metabus", "$namespace", "metabus")

// seriesNames are the names of every series metabus exports.
func seriesNames(t *testing.T) map[string]bool {
	t.Helper()
	ms, err := monitoring.Exported()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]bool{}
	for _, m := range ms {
		for _, s := range m.Series() {
			out[s] = true
		}
	}
	return out
}

// checkExpr parses a PromQL expression with Prometheus's own parser and
// returns the metric names it selects that metabus does not export.
func checkExpr(expr string, exported map[string]bool) (names []string, unknown []string, err error) {
	e, err := parser.NewParser(parser.Options{}).ParseExpr(grafanaVars.Replace(expr))
	if err != nil {
		return nil, nil, err
	}
	parser.Inspect(e, func(n parser.Node, _ []parser.Node) error {
		vs, ok := n.(*parser.VectorSelector)
		if !ok {
			return nil
		}
		name := vs.Name
		for _, m := range vs.LabelMatchers {
			if m.Name == labels.MetricName && m.Type == labels.MatchEqual {
				name = m.Value
			}
		}
		names = append(names, name)
		if !exported[name] {
			unknown = append(unknown, name)
		}
		return nil
	})
	if len(names) == 0 {
		return nil, nil, fmt.Errorf("selects no metric")
	}
	return names, unknown, nil
}

func TestCheckExpr(t *testing.T) {
	exported := map[string]bool{"metabus_x_total": true, "metabus_y_seconds_bucket": true}
	for _, tc := range []struct {
		reason, expr string
		unknown      []string
		wantErr      bool
	}{
		{reason: "an exported counter in a rate", expr: `sum by (a) (rate(metabus_x_total{namespace=~"$namespace"}[$__rate_interval]))`},
		{reason: "a histogram's buckets", expr: `histogram_quantile(0.9, sum by (le) (rate(metabus_y_seconds_bucket[5m])))`},
		{reason: "a name given as __name__", expr: `{__name__="metabus_x_total"}`},
		{reason: "a metric metabus does not export", expr: `metabus_x_total / metabus_z_total`, unknown: []string{"metabus_z_total"}},
		{reason: "a misspelt suffix", expr: `rate(metabus_y_seconds_count[5m])`, unknown: []string{"metabus_y_seconds_count"}},
		{reason: "invalid PromQL", expr: `sum by (a (metabus_x_total)`, wantErr: true},
		{reason: "no metric at all", expr: `vector(1)`, wantErr: true},
	} {
		t.Run(tc.reason, func(t *testing.T) {
			_, unknown, err := checkExpr(tc.expr, exported)
			if (err != nil) != tc.wantErr {
				t.Fatalf("error %v, want error %v", err, tc.wantErr)
			}
			if diff := cmp.Diff(tc.unknown, unknown); diff != "" {
				t.Errorf("unknown metrics (-want +got):\n%s", diff)
			}
		})
	}
}

// dashboard is what the test reads of the Grafana dashboard.
type dashboard struct {
	UID        string  `json:"uid"`
	Panels     []panel `json:"panels"`
	Templating struct {
		List []struct {
			Name       string `json:"name"`
			Definition string `json:"definition"`
		} `json:"list"`
	} `json:"templating"`
}

type panel struct {
	Title   string  `json:"title"`
	Type    string  `json:"type"`
	Panels  []panel `json:"panels"` // a collapsed row's
	Targets []struct {
		Expr string `json:"expr"`
	} `json:"targets"`
}

func readDashboard(t *testing.T) dashboard {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("..", "metabus-dashboard.json"))
	if err != nil {
		t.Fatal(err)
	}
	var d dashboard
	if err := json.Unmarshal(data, &d); err != nil {
		t.Fatalf("metabus-dashboard.json: %v", err)
	}
	return d
}

var labelValues = regexp.MustCompile(`^label_values\(([a-zA-Z_:][a-zA-Z0-9_:]*)\s*,\s*[a-zA-Z_][a-zA-Z0-9_]*\)$`)

// TestDashboard parses every query of the dashboard with Prometheus's
// parser and checks that each metric it reads is one metabus exports, and
// that the dashboard shows what operators need.
func TestDashboard(t *testing.T) {
	exported := seriesNames(t)
	d := readDashboard(t)
	used := map[string]bool{}
	var walk func(ps []panel)
	queries := 0
	walk = func(ps []panel) {
		for _, p := range ps {
			walk(p.Panels)
			if p.Type != "row" && len(p.Targets) == 0 {
				t.Errorf("panel %q has no query", p.Title)
			}
			for _, tg := range p.Targets {
				queries++
				names, unknown, err := checkExpr(tg.Expr, exported)
				if err != nil {
					t.Errorf("panel %q: %q: %v", p.Title, tg.Expr, err)
				}
				if len(unknown) > 0 {
					t.Errorf("panel %q reads %v, which metabus does not export: %s", p.Title, unknown, tg.Expr)
				}
				for _, n := range names {
					used[n] = true
				}
			}
		}
	}
	walk(d.Panels)
	for _, v := range d.Templating.List {
		if v.Definition == "" {
			continue
		}
		m := labelValues.FindStringSubmatch(v.Definition)
		if m == nil || !exported[m[1]] {
			t.Errorf("variable %s: %q is not label_values of an exported metric", v.Name, v.Definition)
		}
	}
	// What issue 27 asks the dashboard to show, by the metric showing it.
	for what, metric := range map[string]string{
		"throughput per controller":           "workqueue_adds_total",
		"syncs per controller":                "metabus_dispatcher_syncs_total",
		"applies per controller":              "metabus_applier_applies_total",
		"queue latency per controller":        "workqueue_queue_duration_seconds_bucket",
		"sync latency per controller":         "workqueue_work_duration_seconds_bucket",
		"apply latency":                       "metabus_applier_apply_duration_seconds_bucket",
		"hook latency":                        "metabus_hook_request_duration_seconds_bucket",
		"hook errors":                         "metabus_hook_requests_total",
		"queue depth":                         "workqueue_depth",
		"queue age":                           "metabus_bus_oldest_message_age_seconds",
		"DLQ":                                 "metabus_bus_dlq_messages",
		"redeliveries":                        "metabus_bus_consumer_redelivered_messages",
		"retries":                             "workqueue_retries_total",
		"partition ownership":                 "metabus_bus_partitions_held",
		"partitions without owner":            "metabus_bus_partitions_unowned",
		"rebalances":                          "metabus_bus_partition_claims_total",
		"API request rates":                   "rest_client_requests_total",
		"CPU":                                 "process_cpu_seconds_total",
		"memory":                              "process_resident_memory_bytes",
		"NATS connection":                     "metabus_nats_connected",
		"the watcher's leader-election Lease": "leader_election_master_status",
	} {
		if !used[metric] {
			t.Errorf("the dashboard does not show %s (%s)", what, metric)
		}
	}
	t.Logf("%d queries checked, %d metrics read", queries, len(used))
}

// ruleFile is a Prometheus rule file.
type ruleFile struct {
	Groups []struct {
		Name  string `json:"name"`
		Rules []struct {
			Alert       string            `json:"alert"`
			Record      string            `json:"record"`
			Expr        string            `json:"expr"`
			For         string            `json:"for"`
			Labels      map[string]string `json:"labels"`
			Annotations map[string]string `json:"annotations"`
		} `json:"rules"`
	} `json:"groups"`
}

// TestAlertRules parses every rule expression with Prometheus's parser,
// checks that each metric it reads is one metabus exports, that the alerts
// issue 27 asks for exist, and that each says what to do.
func TestAlertRules(t *testing.T) {
	exported := seriesNames(t)
	data, err := os.ReadFile(filepath.Join("..", "metabus-rules.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var rf ruleFile
	if err := yaml.UnmarshalStrict(data, &rf); err != nil {
		t.Fatalf("metabus-rules.yaml: %v", err)
	}
	var alerts []string
	for _, g := range rf.Groups {
		for _, r := range g.Rules {
			alerts = append(alerts, r.Alert)
			if r.Alert == "" {
				t.Errorf("group %s: a rule that is not an alert (%q)", g.Name, r.Record)
			}
			if _, unknown, err := checkExpr(r.Expr, exported); err != nil {
				t.Errorf("alert %s: %v", r.Alert, err)
			} else if len(unknown) > 0 {
				t.Errorf("alert %s reads %v, which metabus does not export", r.Alert, unknown)
			}
			if r.For == "" {
				t.Errorf("alert %s fires on a single evaluation (no for:)", r.Alert)
			}
			if s := r.Labels["severity"]; s != "warning" && s != "critical" {
				t.Errorf("alert %s: severity %q", r.Alert, s)
			}
			for _, a := range []string{"summary", "description", "runbook_url"} {
				if strings.TrimSpace(r.Annotations[a]) == "" {
					t.Errorf("alert %s has no %s annotation", r.Alert, a)
				}
			}
			if _, _, err := runbookPage(r.Annotations["runbook_url"]); err != nil {
				t.Errorf("alert %s: %v", r.Alert, err)
			}
		}
	}
	sort.Strings(alerts)
	// DLQ not empty, oldest item too old, hook error ratio, a stage with
	// no partition owner, NATS unreachable; and the bus unreadable, without
	// which the first ones stay silent.
	// And a NATS server too old to reset consumers (issue 32), which
	// degrades every handover without failing anything.
	want := []string{"MetabusBusUnreadable", "MetabusDeadLetters", "MetabusHookErrors", "MetabusNATSConsumerResetUnsupported",
		"MetabusNATSUnreachable", "MetabusPartitionsUnowned", "MetabusWorkItemTooOld"}
	if diff := cmp.Diff(want, alerts); diff != "" {
		t.Errorf("alerts (-want +got):\n%s", diff)
	}
}

// runbookBase is where a runbook_url must lead: a page of this repository.
const runbookBase = "https://github.com/metabus/metabus/blob/main/"

// runbookPage splits a runbook_url into the repository file it leads to
// (README.md, where the runbook is, or a page under docs/) and its anchor.
func runbookPage(url string) (file, anchor string, err error) {
	rest, ok := strings.CutPrefix(url, runbookBase)
	if !ok {
		return "", "", fmt.Errorf("runbook_url %q is not a page of %s", url, runbookBase)
	}
	file, anchor, ok = strings.Cut(rest, "#")
	if !ok || anchor == "" {
		return "", "", fmt.Errorf("runbook_url %q names no section (#anchor)", url)
	}
	if file != "README.md" && !(strings.HasPrefix(file, "docs/") && strings.HasSuffix(file, ".md") && !strings.Contains(file, "..")) {
		return "", "", fmt.Errorf("runbook_url %q leads to neither README.md nor a docs/ page", url)
	}
	return file, anchor, nil
}

// headingAnchor is the anchor GitHub gives a Markdown heading's text:
// lower case, punctuation dropped, spaces as hyphens.
func headingAnchor(text string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(strings.TrimSpace(text)) {
		switch {
		case r == ' ':
			b.WriteRune('-')
		case r == '-' || r == '_' || r >= 'a' && r <= 'z' || r >= '0' && r <= '9':
			b.WriteRune(r)
		}
	}
	return b.String()
}

var heading = regexp.MustCompile(`(?m)^(#{1,6})\s+(.+?)\s*$`)

// section returns the Markdown section whose heading has anchor: from its
// heading to the next heading of the same or a higher level.
func section(md, anchor string) (string, bool) {
	hs := heading.FindAllStringSubmatchIndex(md, -1)
	for i, h := range hs {
		if headingAnchor(md[h[4]:h[5]]) != anchor {
			continue
		}
		level := h[3] - h[2]
		for _, next := range hs[i+1:] {
			if next[3]-next[2] <= level {
				return md[h[0]:next[0]], true
			}
		}
		return md[h[0]:], true
	}
	return "", false
}

func TestSection(t *testing.T) {
	md := "# T\n## Dashboard and alerts\n`A`\n### Sub\n`B`\n## Next\n`C`\n## Server version (2.14+)\n`D`\n"
	for _, tc := range []struct {
		reason, anchor, want string
		found                bool
	}{
		{reason: "a section with its subsections", anchor: "dashboard-and-alerts", want: "## Dashboard and alerts\n`A`\n### Sub\n`B`\n", found: true},
		{reason: "a subsection ends at the next section", anchor: "sub", want: "### Sub\n`B`\n", found: true},
		{reason: "the last section runs to the end; punctuation leaves the anchor", anchor: "server-version-214", want: "## Server version (2.14+)\n`D`\n", found: true},
		{reason: "no such heading", anchor: "missing"},
	} {
		t.Run(tc.reason, func(t *testing.T) {
			got, found := section(md, tc.anchor)
			if found != tc.found || got != tc.want {
				t.Errorf("section(%q) = %q, %v; want %q, %v", tc.anchor, got, found, tc.want, tc.found)
			}
		})
	}
}

// TestRunbooks: every alert's runbook_url leads to a section of the README
// or of a docs/ page that covers it (names it in code).
func TestRunbooks(t *testing.T) {
	data, err := os.ReadFile(filepath.Join("..", "metabus-rules.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var rf ruleFile
	if err := yaml.UnmarshalStrict(data, &rf); err != nil {
		t.Fatalf("metabus-rules.yaml: %v", err)
	}
	for _, g := range rf.Groups {
		for _, r := range g.Rules {
			file, anchor, err := runbookPage(r.Annotations["runbook_url"])
			if err != nil {
				t.Errorf("alert %s: %v", r.Alert, err)
				continue
			}
			md, err := os.ReadFile(filepath.Join("..", "..", "..", filepath.FromSlash(file)))
			if err != nil {
				t.Errorf("alert %s: runbook %s: %v", r.Alert, file, err)
				continue
			}
			sec, ok := section(string(md), anchor)
			if !ok {
				t.Errorf("alert %s: %s has no section #%s", r.Alert, file, anchor)
				continue
			}
			if !strings.Contains(sec, "`"+r.Alert+"`") {
				t.Errorf("alert %s: its runbook, %s#%s, does not cover it", r.Alert, file, anchor)
			}
		}
	}
}

// TestHelmCopies: the chart ships the same dashboard and rules (a chart
// cannot read files outside its directory).
func TestHelmCopies(t *testing.T) {
	for _, name := range []string{"metabus-dashboard.json", "metabus-rules.yaml"} {
		want, err := os.ReadFile(filepath.Join("..", name))
		if err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(filepath.Join("..", "..", "helm", "metabus", "files", "monitoring", name))
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(want, got) {
			t.Errorf("deploy/helm/metabus/files/monitoring/%s differs from deploy/monitoring/%s: copy it", name, name)
		}
	}
}
