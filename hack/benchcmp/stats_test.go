package main

import (
	"math"
	"net/url"
	"strings"
	"testing"
)

func TestParseRequestTotals(t *testing.T) {
	text := `# HELP apiserver_request_total [STABLE] Counter of apiserver requests
# TYPE apiserver_request_total counter
apiserver_request_total{code="201",component="apiserver",dry_run="",group="",resource="configmaps",scope="resource",subresource="",verb="POST",version="v1"} 2001
apiserver_request_total{code="409",component="apiserver",dry_run="",group="",resource="configmaps",scope="resource",subresource="",verb="POST",version="v1"} 3
apiserver_request_total{code="200",component="apiserver",dry_run="",group="bench.metabus.dev",resource="benches",scope="resource",subresource="status",verb="PUT",version="v1"} 1.5e+03
apiserver_request_total{code="200",component="apiserver",dry_run="",group="",resource="",scope="",subresource="/readyz",verb="GET",version=""} 7
apiserver_request_total{code="0",component="apiserver",dry_run="",group="",resource="pods",scope="namespace",subresource="",verb="WATCH",version="v1"} 4
apiserver_request_totally_other{verb="GET",resource="x"} 9
apiserver_request_total{a="q\"uo}te",resource="x",verb="LIST"} 2
`
	got, err := parseRequestTotals(text)
	if err != nil {
		t.Fatal(err)
	}
	want := reqCounts{
		{"POST", "configmaps"}:    2004,
		{"PUT", "benches/status"}: 1500,
		{"WATCH", "pods"}:         4,
		{"LIST", "x"}:             2,
	}
	if len(got) != len(want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %d, want %d", k, got[k], v)
		}
	}
	if _, err := parseRequestTotals(`apiserver_request_total{verb="GET" 3`); err == nil {
		t.Error("malformed line: no error")
	}
}

func TestSubAndByVerb(t *testing.T) {
	before := reqCounts{{"GET", "benches"}: 5, {"WATCH", "benches"}: 1, {"PUT", "leases"}: 3}
	after := reqCounts{{"GET", "benches"}: 7, {"WATCH", "benches"}: 2, {"PUT", "leases"}: 4,
		{"APPLY", "configmaps"}: 2, {"PATCH", "benches"}: 1, {"DELETECOLLECTION", "configmaps"}: 1}
	d := after.sub(before)
	got := d.byVerb(map[string]bool{"leases": true})
	want := map[string]int64{"GET": 2, "PATCH": 3, "DELETE": 1}
	if len(got) != len(want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %d, want %d", k, got[k], v)
		}
	}
}

func TestControllerRequests(t *testing.T) {
	a := apiSnapshot{
		server: reqCounts{{"POST", "benches"}: 1, {"PUT", "leases"}: 1},
		own:    reqCounts{{"POST", "benches"}: 1},
	}
	b := apiSnapshot{
		server: reqCounts{{"POST", "benches"}: 11, {"POST", "configmaps"}: 10, {"PUT", "leases"}: 3},
		own:    reqCounts{{"POST", "benches"}: 11},
	}
	got := controllerRequests(a, b)
	if len(got) != 1 || got[reqKey{"POST", "configmaps"}] != 10 {
		t.Errorf("got %v, want only POST configmaps=10", got)
	}
}

func TestClassifyRequest(t *testing.T) {
	cases := []struct {
		method, url, ctype string
		want               reqKey
		ok                 bool
	}{
		{"GET", "/api/v1/namespaces/default/configmaps?limit=500", "", reqKey{"LIST", "configmaps"}, true},
		{"GET", "/api/v1/namespaces/default/configmaps?watch=true", "", reqKey{"WATCH", "configmaps"}, true},
		{"GET", "/api/v1/namespaces/default/configmaps/x", "", reqKey{"GET", "configmaps"}, true},
		{"PUT", "/apis/bench.metabus.dev/v1/namespaces/default/benches/p/status", "", reqKey{"PUT", "benches/status"}, true},
		{"POST", "/apis/bench.metabus.dev/v1/namespaces/default/benches", "", reqKey{"POST", "benches"}, true},
		{"PATCH", "/apis/metacontroller.k8s.io/v1alpha1/compositecontrollers/bench", "application/merge-patch+json", reqKey{"PATCH", "compositecontrollers"}, true},
		{"PATCH", "/api/v1/namespaces/default/configmaps/x", "application/apply-patch+yaml", reqKey{"APPLY", "configmaps"}, true},
		{"DELETE", "/api/v1/namespaces/default/configmaps", "", reqKey{"DELETECOLLECTION", "configmaps"}, true},
		{"GET", "/api/v1/namespaces/default", "", reqKey{"GET", "namespaces"}, true},
		{"GET", "/api/v1/namespaces", "", reqKey{"LIST", "namespaces"}, true},
		{"GET", "/apis/bench.metabus.dev/v1", "", reqKey{}, false},
		{"GET", "/metrics", "", reqKey{}, false},
	}
	for _, c := range cases {
		u, err := url.Parse(c.url)
		if err != nil {
			t.Fatal(err)
		}
		got, ok := classifyRequest(c.method, u, c.ctype)
		if got != c.want || ok != c.ok {
			t.Errorf("%s %s = %v, %v; want %v, %v", c.method, c.url, got, ok, c.want, c.ok)
		}
	}
}

func TestParseStatCPU(t *testing.T) {
	stat := "4242 (kube (api) server) S 1 4242 4242 0 -1 4194560 5000 0 0 0 1234 567 0 0 20 0 12 0 100 1000000 2000 18446744073709551615\n"
	got, err := parseStatCPU(stat)
	if err != nil || got != 1801 {
		t.Errorf("got %d, %v; want 1801", got, err)
	}
	if _, err := parseStatCPU("4242 (x) S 1 2"); err == nil {
		t.Error("short stat: no error")
	}
}

func TestParseVmRSS(t *testing.T) {
	got, err := parseVmRSS("Name:\tmetabus\nVmHWM:\t  9000 kB\nVmRSS:\t   51200 kB\nThreads:\t12\n")
	if err != nil || got != 50<<20 {
		t.Errorf("got %d, %v; want %d", got, err, 50<<20)
	}
	if _, err := parseVmRSS("Name:\tzombie\n"); err == nil {
		t.Error("no VmRSS: no error")
	}
}

func TestPercentile(t *testing.T) {
	var xs []float64
	for i := 100; i >= 1; i-- {
		xs = append(xs, float64(i))
	}
	if p := percentile(xs, 50); p != 50 {
		t.Errorf("p50 = %v", p)
	}
	if p := percentile(xs, 99); p != 99 {
		t.Errorf("p99 = %v", p)
	}
	if p := percentile([]float64{3}, 99); p != 3 {
		t.Errorf("p99 of one = %v", p)
	}
	if !math.IsNaN(percentile(nil, 50)) {
		t.Error("p50 of none is not NaN")
	}
}

func TestSummarizeAndFormat(t *testing.T) {
	nan := math.NaN()
	cases := []struct {
		xs   []float64
		want string
	}{
		{nil, "—"},
		{[]float64{nan}, "—"},
		{[]float64{3.14159}, "3.14"},
		{[]float64{2, 4}, "3.00 [2.00–4.00]"},
		{[]float64{5, nan, 1, 3}, "3.00 [1.00–5.00]"},
		{[]float64{2, 2}, "2.00"},
	}
	for _, c := range cases {
		if got := formatSpread(summarize(c.xs), 2); got != c.want {
			t.Errorf("%v: got %q, want %q", c.xs, got, c.want)
		}
	}
	for xs, want := range map[*[]float64]string{
		{1, 1}:   "yes",
		{0}:      "no",
		{1, 0}:   "1/2 yes",
		{nan}:    "—",
		{nan, 1}: "yes",
	} {
		if got := formatYesNo(*xs); got != want {
			t.Errorf("%v: got %q, want %q", *xs, got, want)
		}
	}
}

func TestParseContenders(t *testing.T) {
	got, err := parseContenders("upstream, raw,upstream")
	if err != nil || len(got) != 2 || got[0] != "raw" || got[1] != "upstream" {
		t.Errorf("got %v, %v", got, err)
	}
	if got, err := parseContenders("metabus-ssa,metabus,raw"); err != nil || strings.Join(got, ",") != "raw,metabus,metabus-ssa" {
		t.Errorf("got %v, %v: want the table's order", got, err)
	}
	if got, err := parseContenders("upstream,metabus,contract-floor"); err != nil || strings.Join(got, ",") != "contract-floor,metabus,upstream" {
		t.Errorf("got %v, %v: want the floor after the harness's writers, before the controllers", got, err)
	}
	if _, err := parseContenders("raw,kind"); err == nil {
		t.Error("unknown contender: no error")
	}
	if _, err := parseContenders(" , "); err == nil {
		t.Error("empty list: no error")
	}
}

func TestParseScenarios(t *testing.T) {
	got, err := parseScenarios("b6, B2")
	if err != nil || len(got) != 2 || !got["B2"] || !got["B6"] {
		t.Errorf("got %v, %v", got, err)
	}
	if got, err := parseScenarios("all"); err != nil || len(got) != len(scenarioNames) {
		t.Errorf("all: got %v, %v", got, err)
	}
	if got, err := parseScenarios("default"); err != nil || len(got) != 8 || !got["B8"] || got["B9"] {
		t.Errorf("default: got %v, %v, want B1-B8", got, err)
	}
	if _, err := parseScenarios("B12"); err == nil {
		t.Error("unknown scenario: no error")
	}
	if _, err := parseScenarios(" , "); err == nil {
		t.Error("empty list: no error")
	}
}

func TestFormatPair(t *testing.T) {
	one := func(x float64) spread { return summarize([]float64{x}) }
	if got, want := formatPair(one(12.34), one(math.Inf(1)), 1, 30000), "12.3 / >30000"; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
	if got, want := formatPair(summarize(nil), summarize(nil), 1, 30000), "—"; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
}
