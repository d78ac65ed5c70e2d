// Package obstest reads a Prometheus registry in tests.
package obstest

import (
	"fmt"
	"sort"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// Each gathers g and calls fn for every series with its key,
// `name{label="value",...}` (labels sorted; just the name without labels),
// and its value: a counter's or gauge's value, a histogram's sample count.
func Each(t testing.TB, g prometheus.Gatherer, fn func(mf *dto.MetricFamily, m *dto.Metric, key string, value float64)) {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			var pairs []string
			for _, l := range m.GetLabel() {
				pairs = append(pairs, fmt.Sprintf("%s=%q", l.GetName(), l.GetValue()))
			}
			sort.Strings(pairs)
			key := mf.GetName()
			if len(pairs) > 0 {
				key += "{" + strings.Join(pairs, ",") + "}"
			}
			fn(mf, m, key, m.GetCounter().GetValue()+m.GetGauge().GetValue()+float64(m.GetHistogram().GetSampleCount()))
		}
	}
}

// Series returns every series of g by key (see Each).
func Series(t testing.TB, g prometheus.Gatherer) map[string]float64 {
	t.Helper()
	out := map[string]float64{}
	Each(t, g, func(_ *dto.MetricFamily, _ *dto.Metric, key string, v float64) { out[key] = v })
	return out
}
