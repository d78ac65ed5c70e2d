package hooks

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

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

// The metacontroller_<hook>_* families carry upstream's names, labels and
// buckets, and count what upstream's promhttp instrumentation counts:
// responses only, the time to the response headers, DNS events for a host
// name.
func TestUpstreamMetrics(t *testing.T) {
	ok, _ := serve(t, replyJSON(`{}`))
	fail, _ := serve(t, func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(500) })
	reg := prometheus.NewRegistry()
	c := New(Options{Registerer: reg})
	// "localhost" makes the transport resolve a name: DNS events.
	okURL := strings.Replace(ok.URL, "127.0.0.1", "localhost", 1)
	_ = c.Do(context.Background(), syncCall(hookAt(okURL)), nil)
	_ = c.Do(context.Background(), syncCall(hookAt(okURL)), nil)
	_ = c.Do(context.Background(), syncCall(hookAt(fail.URL)), nil)
	_ = c.Do(context.Background(), syncCall(hookAt("http://127.0.0.1:1/")), nil) // no response: not counted
	finalize := syncCall(hookAt(ok.URL))
	finalize.Kind, finalize.ControllerType, finalize.ControllerName = "finalize", "DecoratorController", "deco"
	_ = c.Do(context.Background(), finalize, nil)

	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	type series struct {
		labels string
		value  float64
	}
	got := map[string][]series{}
	for _, f := range families {
		if !strings.HasPrefix(f.GetName(), "metacontroller_") {
			continue
		}
		for _, m := range f.GetMetric() {
			var v float64
			switch {
			case m.Counter != nil:
				v = m.GetCounter().GetValue()
			case m.Gauge != nil:
				v = m.GetGauge().GetValue()
			case m.Histogram != nil:
				v = float64(m.GetHistogram().GetSampleCount())
				if n := len(m.GetHistogram().GetBucket()); f.GetName() == "metacontroller_sync_request_duration_histogram_seconds" && n != len(prometheus.DefBuckets) {
					t.Errorf("%s has %d buckets, want upstream's %d (prometheus.DefBuckets)", f.GetName(), n, len(prometheus.DefBuckets))
				}
			}
			got[f.GetName()] = append(got[f.GetName()], series{fmt.Sprint(labels(m)), v})
		}
	}
	id := func(url, name, typ string, extra ...string) string {
		l := map[string]string{"url": url, "controller_name": name, "controller_type": typ}
		for i := 0; i+1 < len(extra); i += 2 {
			l[extra[i]] = extra[i+1]
		}
		return fmt.Sprint(l)
	}
	want := map[string][]series{
		"metacontroller_sync_requests_total": {
			{id(okURL, "demo", "CompositeController", "code", "200", "method", "post"), 2},
			{id(fail.URL, "demo", "CompositeController", "code", "500", "method", "post"), 1},
		},
		"metacontroller_sync_request_duration_histogram_seconds": {
			{id(okURL, "demo", "CompositeController", "method", "post"), 2},
			{id(fail.URL, "demo", "CompositeController", "method", "post"), 1},
		},
		"metacontroller_sync_in_flight_requests": {
			{id("http://127.0.0.1:1/", "demo", "CompositeController"), 0},
			{id(okURL, "demo", "CompositeController"), 0},
			{id(fail.URL, "demo", "CompositeController"), 0},
		},
		"metacontroller_sync_dns_duration_histogram_seconds": {
			{id(okURL, "demo", "CompositeController", "event", "dns_done"), 1},
			{id(okURL, "demo", "CompositeController", "event", "dns_start"), 1},
		},
		"metacontroller_finalize_requests_total": {
			{id(ok.URL, "deco", "DecoratorController", "code", "200", "method", "post"), 1},
		},
		"metacontroller_finalize_request_duration_histogram_seconds": {
			{id(ok.URL, "deco", "DecoratorController", "method", "post"), 1},
		},
		"metacontroller_finalize_in_flight_requests": {
			{id(ok.URL, "deco", "DecoratorController"), 0},
		},
	}
	sortSeries := cmpopts.SortSlices(func(a, b series) bool { return a.labels < b.labels })
	if diff := cmp.Diff(want, got, sortSeries, cmp.AllowUnexported(series{})); diff != "" {
		t.Errorf("upstream hook metrics (-want +got):\n%s", diff)
	}
}
