package hooks

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

func TestMetrics(t *testing.T) {
	ok, _ := serve(t, replyJSON(`{}`))
	fail, _ := serve(t, func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(500) })
	slow, _ := serve(t, func(w http.ResponseWriter, r *http.Request) { <-r.Context().Done() })

	reg := prometheus.NewRegistry()
	// Two Clients on one registry (one per service in a combined process) share the metrics.
	c1 := New(Options{Registerer: reg})
	c2 := New(Options{Registerer: reg})
	for _, c := range []*Client{c1, c2} {
		_ = c.Do(context.Background(), syncCall(hookAt(ok.URL)), nil)
	}
	_ = c1.Do(context.Background(), syncCall(hookAt(fail.URL)), nil)
	_ = c2.Do(context.Background(), syncCall(withTimeout(hookAt(slow.URL), 50*time.Millisecond)), nil)
	_ = c2.Do(context.Background(), syncCall(hookAt("http://127.0.0.1:1/")), nil)

	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	byName := map[string]*dto.MetricFamily{}
	for _, f := range families {
		byName[f.GetName()] = f
	}
	requests := map[string]float64{}
	for _, m := range byName["metabus_hook_requests_total"].GetMetric() {
		l := labels(m)
		if l["controller_type"] != "CompositeController" || l["controller"] != "demo" || l["hook"] != "sync" {
			t.Errorf("unexpected labels %v", l)
		}
		requests[l["code"]] += m.GetCounter().GetValue()
	}
	want := map[string]float64{"200": 2, "500": 1, codeTimeout: 1, codeError: 1}
	for code, n := range want {
		if requests[code] != n {
			t.Errorf("requests{code=%q} = %v, want %v (all: %v)", code, requests[code], n, requests)
		}
	}
	var observed uint64
	for _, m := range byName["metabus_hook_request_duration_seconds"].GetMetric() {
		observed += m.GetHistogram().GetSampleCount()
	}
	if observed != 5 {
		t.Errorf("duration observations = %d, want 5", observed)
	}
	for _, m := range byName["metabus_hook_in_flight_requests"].GetMetric() {
		if v := m.GetGauge().GetValue(); v != 0 {
			t.Errorf("in flight = %v after all calls returned, want 0", v)
		}
	}
}

func labels(m *dto.Metric) map[string]string {
	out := map[string]string{}
	for _, p := range m.GetLabel() {
		out[p.GetName()] = p.GetValue()
	}
	return out
}

// A conflicting metric of another type must not break the Client.
func TestMetricsConflict(t *testing.T) {
	reg := prometheus.NewRegistry()
	reg.MustRegister(prometheus.NewGauge(prometheus.GaugeOpts{Name: "metabus_hook_requests_total", Help: "squatter"}))
	srv, _ := serve(t, replyJSON(`{}`))
	if err := New(Options{Registerer: reg}).Do(context.Background(), syncCall(hookAt(srv.URL)), nil); err != nil {
		t.Fatalf("Do: %v", err)
	}
}
