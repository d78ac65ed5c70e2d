package main

// Pure helpers: parsing the API server's request counter and /proc files,
// classifying requests, and summarising figures. Covered by stats_test.go.

import (
	"bufio"
	"errors"
	"fmt"
	"math"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
)

// reqKey names one series of API requests: the API server's verb (GET,
// LIST, WATCH, POST, PUT, PATCH, APPLY, DELETE, DELETECOLLECTION, ...) and
// the resource, with "/subresource" when there is one.
type reqKey struct {
	Verb     string
	Resource string
}

func (k reqKey) String() string { return k.Verb + " " + k.Resource }

// reqCounts is a number of requests per series.
type reqCounts map[reqKey]int64

// parseRequestTotals sums apiserver_request_total from a Prometheus text
// exposition by verb and resource[/subresource], over all other labels
// (code, group, version, scope, ...). Series without a resource
// (non-resource URLs such as /metrics or discovery) are left out.
func parseRequestTotals(text string) (reqCounts, error) {
	const name = "apiserver_request_total"
	out := reqCounts{}
	sc := bufio.NewScanner(strings.NewReader(text))
	sc.Buffer(make([]byte, 0, 64<<10), 4<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, name+"{") {
			continue
		}
		labels, rest, err := parseLabels(line[len(name)+1:])
		if err != nil {
			return nil, fmt.Errorf("%w in %q", err, line)
		}
		fields := strings.Fields(rest)
		if len(fields) == 0 {
			return nil, fmt.Errorf("no value in %q", line)
		}
		v, err := strconv.ParseFloat(fields[0], 64)
		if err != nil {
			return nil, fmt.Errorf("bad value in %q: %w", line, err)
		}
		res := labels["resource"]
		if res == "" {
			continue
		}
		if sub := labels["subresource"]; sub != "" {
			res += "/" + sub
		}
		out[reqKey{Verb: labels["verb"], Resource: res}] += int64(math.Round(v))
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	return out, nil
}

// parseLabels reads `a="x",b="y\"z"}` (the part after the opening brace)
// and returns the labels and what follows the closing brace.
func parseLabels(s string) (map[string]string, string, error) {
	labels := map[string]string{}
	i := 0
	for {
		for i < len(s) && (s[i] == ',' || s[i] == ' ') {
			i++
		}
		if i >= len(s) {
			return nil, "", errors.New("unterminated label set")
		}
		if s[i] == '}' {
			return labels, s[i+1:], nil
		}
		eq := strings.IndexByte(s[i:], '=')
		if eq < 0 || i+eq+1 >= len(s) || s[i+eq+1] != '"' {
			return nil, "", errors.New("malformed label")
		}
		key := s[i : i+eq]
		i += eq + 2
		var b strings.Builder
		for {
			if i >= len(s) {
				return nil, "", errors.New("unterminated label value")
			}
			c := s[i]
			if c == '\\' && i+1 < len(s) {
				switch s[i+1] {
				case 'n':
					b.WriteByte('\n')
				default:
					b.WriteByte(s[i+1])
				}
				i += 2
				continue
			}
			if c == '"' {
				i++
				break
			}
			b.WriteByte(c)
			i++
		}
		labels[key] = b.String()
	}
}

// sub returns after-before per series, dropping zeros.
func (after reqCounts) sub(before reqCounts) reqCounts {
	d := reqCounts{}
	for k, v := range after {
		if n := v - before[k]; n != 0 {
			d[k] = n
		}
	}
	for k, v := range before {
		if _, ok := after[k]; !ok && v != 0 {
			d[k] = -v
		}
	}
	return d
}

// isWatch reports whether an API server verb is a watch (or a streaming
// connection), which the figures leave out.
func isWatch(verb string) bool {
	switch verb {
	case "WATCH", "WATCHLIST", "CONNECT":
		return true
	}
	return false
}

// verbColumns are the verbs the figures report; verbColumn folds the API
// server's other non-watch verbs into them.
var verbColumns = []string{"GET", "LIST", "POST", "PUT", "PATCH", "DELETE"}

func verbColumn(verb string) string {
	switch verb {
	case "APPLY":
		return "PATCH"
	case "DELETECOLLECTION":
		return "DELETE"
	case "CREATE":
		return "POST"
	case "UPDATE":
		return "PUT"
	}
	return verb
}

// byVerb sums counts per reported verb column, without watches and without
// the resources in skip.
func (c reqCounts) byVerb(skip map[string]bool) map[string]int64 {
	out := map[string]int64{}
	for k, v := range c {
		if isWatch(k.Verb) || skip[k.Resource] {
			continue
		}
		out[verbColumn(k.Verb)] += v
	}
	return out
}

// String lists the series, sorted, e.g. "POST configmaps=3, PUT benches/status=2".
func (c reqCounts) String() string {
	var parts []string
	for k, v := range c {
		parts = append(parts, fmt.Sprintf("%s=%d", k, v))
	}
	slices.Sort(parts)
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, ", ")
}

// classifyRequest names a client request the way the API server's request
// counter does, so the harness can subtract its own traffic. ok is false for
// non-resource paths (discovery, /metrics, /readyz), which the counter's
// resource series do not include.
func classifyRequest(method string, u *url.URL, contentType string) (k reqKey, ok bool) {
	segs := strings.Split(strings.Trim(u.Path, "/"), "/")
	gvLen := 0
	switch {
	case len(segs) > 0 && segs[0] == "api":
		gvLen = 2
	case len(segs) > 0 && segs[0] == "apis":
		gvLen = 3
	}
	if gvLen == 0 || len(segs) <= gvLen {
		return reqKey{}, false
	}
	rest := segs[gvLen:]
	if rest[0] == "namespaces" && len(rest) >= 3 {
		rest = rest[2:]
	}
	k.Resource = rest[0]
	if len(rest) >= 3 {
		k.Resource += "/" + rest[2]
	}
	item := len(rest) >= 2
	switch method {
	case http.MethodGet:
		switch w := u.Query().Get("watch"); {
		case w == "true" || w == "1":
			k.Verb = "WATCH"
		case item:
			k.Verb = "GET"
		default:
			k.Verb = "LIST"
		}
	case http.MethodDelete:
		k.Verb = "DELETE"
		if !item {
			k.Verb = "DELETECOLLECTION"
		}
	case http.MethodPatch:
		k.Verb = "PATCH"
		if strings.HasPrefix(contentType, "application/apply-patch") {
			k.Verb = "APPLY"
		}
	default:
		k.Verb = strings.ToUpper(method)
	}
	return k, true
}

// clockTicks is USER_HZ, the unit of utime and stime in /proc/<pid>/stat;
// 100 on every mainstream Linux architecture.
const clockTicks = 100

// parseStatCPU returns utime+stime in clock ticks from the contents of
// /proc/<pid>/stat. The command name (field 2) may hold spaces and
// parentheses, so fields are counted from the last ')'.
func parseStatCPU(stat string) (uint64, error) {
	i := strings.LastIndexByte(stat, ')')
	if i < 0 {
		return 0, errors.New("no ')' in stat")
	}
	f := strings.Fields(stat[i+1:])
	// f[0] is field 3 (state); utime and stime are fields 14 and 15.
	if len(f) < 13 {
		return 0, fmt.Errorf("stat has %d fields after the command", len(f))
	}
	u, err := strconv.ParseUint(f[11], 10, 64)
	if err != nil {
		return 0, fmt.Errorf("utime: %w", err)
	}
	s, err := strconv.ParseUint(f[12], 10, 64)
	if err != nil {
		return 0, fmt.Errorf("stime: %w", err)
	}
	return u + s, nil
}

// parseSchedstat returns the CPU time in nanoseconds from the contents of
// /proc/<pid>/task/<tid>/schedstat: its first field, the time the thread
// has run, kept by the scheduler to the nanosecond (utime and stime tick
// every 10 ms).
func parseSchedstat(s string) (uint64, error) {
	f := strings.Fields(s)
	if len(f) != 3 {
		return 0, fmt.Errorf("schedstat %q: want 3 fields", s)
	}
	ns, err := strconv.ParseUint(f[0], 10, 64)
	if err != nil {
		return 0, fmt.Errorf("schedstat run time: %w", err)
	}
	return ns, nil
}

// parseVmRSS returns VmRSS in bytes from the contents of /proc/<pid>/status.
func parseVmRSS(status string) (int64, error) {
	for line := range strings.SplitSeq(status, "\n") {
		rest, ok := strings.CutPrefix(line, "VmRSS:")
		if !ok {
			continue
		}
		f := strings.Fields(rest)
		if len(f) != 2 || f[1] != "kB" {
			return 0, fmt.Errorf("unexpected VmRSS line %q", line)
		}
		kb, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil {
			return 0, fmt.Errorf("VmRSS: %w", err)
		}
		return kb << 10, nil
	}
	return 0, errors.New("no VmRSS line (process gone?)")
}

// percentile returns the p-th percentile (0..100) of xs by the nearest-rank
// method; NaN for no samples.
func percentile(xs []float64, p float64) float64 {
	if len(xs) == 0 {
		return math.NaN()
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	rank := int(math.Ceil(p / 100 * float64(len(s))))
	rank = min(max(rank, 1), len(s))
	return s[rank-1]
}

// spread is the median, minimum and maximum of xs, with n the number of
// samples; NaNs (figures a round could not produce) are left out.
type spread struct {
	Median, Min, Max float64
	N                int
}

func summarize(xs []float64) spread {
	var s []float64
	for _, x := range xs {
		if !math.IsNaN(x) {
			s = append(s, x)
		}
	}
	if len(s) == 0 {
		return spread{Median: math.NaN(), Min: math.NaN(), Max: math.NaN()}
	}
	slices.Sort(s)
	m := s[len(s)/2]
	if len(s)%2 == 0 {
		m = (s[len(s)/2-1] + s[len(s)/2]) / 2
	}
	return spread{Median: m, Min: s[0], Max: s[len(s)-1], N: len(s)}
}

// formatSpread prints one table cell: "—" without samples, the value for
// one sample, otherwise "median [min–max]". prec is the number of decimals.
func formatSpread(s spread, prec int) string {
	if s.N == 0 {
		return "—"
	}
	f := func(x float64) string { return strconv.FormatFloat(x, 'f', prec, 64) }
	if s.N == 1 || s.Min == s.Max {
		return f(s.Median)
	}
	return fmt.Sprintf("%s [%s–%s]", f(s.Median), f(s.Min), f(s.Max))
}

// formatYesNo prints a cell for a yes(1)/no(0) figure over rounds: "yes",
// "no", or "k/n yes" when the rounds disagree.
func formatYesNo(xs []float64) string {
	yes, n := 0, 0
	for _, x := range xs {
		if math.IsNaN(x) {
			continue
		}
		n++
		if x != 0 {
			yes++
		}
	}
	switch {
	case n == 0:
		return "—"
	case yes == n:
		return "yes"
	case yes == 0:
		return "no"
	}
	return fmt.Sprintf("%d/%d yes", yes, n)
}

// parseContenders splits the -only list, checking names and dropping
// duplicates while keeping the canonical order raw, metabus, baseline,
// upstream.
func parseContenders(list string) ([]string, error) {
	known := []string{"raw", "raw-contract", "contract-floor", "metabus", "metabus-ssa", "metabus-echo", "metabus-identity", "metabus-split", "baseline", "upstream"}
	want := map[string]bool{}
	for f := range strings.SplitSeq(list, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		if !slices.Contains(known, f) {
			return nil, fmt.Errorf("unknown contender %q (want some of %s)", f, strings.Join(known, ","))
		}
		want[f] = true
	}
	var out []string
	for _, k := range known {
		if want[k] {
			out = append(out, k)
		}
	}
	if len(out) == 0 {
		return nil, errors.New("no contender selected")
	}
	return out, nil
}

// scenarioNames are the scenarios in the order they run.
var scenarioNames = []string{"B1", "B2", "B3", "B4", "B5", "B6", "B7", "B8", "B9", "B10", "B11"}

// defaultScenarios are what "default" selects: the scale reports B9-B11
// (issue 31) take long and need upstream beside metabus to mean anything,
// so they run when named (make bench-scale) or with "all".
var defaultScenarios = scenarioNames[:8]

// parseScenarios reads the -scenarios list: "default" (B1-B8), "all", or
// names such as "B2,b6" (case does not matter).
func parseScenarios(list string) (map[string]bool, error) {
	out := map[string]bool{}
	for f := range strings.SplitSeq(list, ",") {
		f = strings.ToUpper(strings.TrimSpace(f))
		switch {
		case f == "":
		case f == "ALL":
			for _, n := range scenarioNames {
				out[n] = true
			}
		case f == "DEFAULT":
			for _, n := range defaultScenarios {
				out[n] = true
			}
		case slices.Contains(scenarioNames, f):
			out[f] = true
		default:
			return nil, fmt.Errorf("unknown scenario %q (want default, all or some of %s)", f, strings.Join(scenarioNames, ","))
		}
	}
	if len(out) == 0 {
		return nil, errors.New("no scenario selected")
	}
	return out, nil
}

// formatPair prints a cell of two figures, "a / b"; +Inf (a figure beyond
// a cap) prints as ">cap".
func formatPair(a, b spread, prec int, capMS float64) string {
	f := func(s spread) string {
		cell := formatSpread(s, prec)
		return strings.ReplaceAll(cell, "+Inf", ">"+strconv.FormatFloat(capMS, 'f', 0, 64))
	}
	if a.N == 0 && b.N == 0 {
		return "—"
	}
	return f(a) + " / " + f(b)
}
