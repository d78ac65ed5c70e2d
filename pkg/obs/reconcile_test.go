package obs

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/metabus/metabus/internal/testing/obstest"
)

func TestReconcilerName(t *testing.T) {
	for _, tc := range []struct{ reason, kind, want string }{
		{"upstream's composite controller-runtime controller", "CompositeController", "composite-metacontroller"},
		{"upstream's decorator controller-runtime controller", "DecoratorController", "decorator-metacontroller"},
		{"metabus's MapControllers, named likewise", "MapController", "map-metacontroller"},
	} {
		t.Run(tc.reason, func(t *testing.T) {
			if got := ReconcilerName(tc.kind); got != tc.want {
				t.Errorf("ReconcilerName(%q) = %q, want %q", tc.kind, got, tc.want)
			}
		})
	}
}

// A controller's series exist from its start (counters at 0, its worker
// count set), as controller-runtime initialises them, and each reconcile
// lands in its result, the error counters and the histogram; the active
// worker gauge shows the reconcile in progress.
func TestReconcileMetrics(t *testing.T) {
	reg := prometheus.NewRegistry()
	m, err := NewReconcileMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	// Another service of the same process shares the families.
	m2, err := NewReconcileMetrics(reg)
	if err != nil {
		t.Fatalf("second registration: %v", err)
	}
	c := m.Controller("composite-metacontroller", 1)
	m2.Controller("decorator-metacontroller", 3)

	wantStart := map[string]float64{
		`controller_runtime_active_workers{controller="composite-metacontroller"}`:                         0,
		`controller_runtime_active_workers{controller="decorator-metacontroller"}`:                         0,
		`controller_runtime_max_concurrent_reconciles{controller="composite-metacontroller"}`:              1,
		`controller_runtime_max_concurrent_reconciles{controller="decorator-metacontroller"}`:              3,
		`controller_runtime_reconcile_errors_total{controller="composite-metacontroller"}`:                 0,
		`controller_runtime_reconcile_errors_total{controller="decorator-metacontroller"}`:                 0,
		`controller_runtime_reconcile_panics_total{controller="composite-metacontroller"}`:                 0,
		`controller_runtime_reconcile_panics_total{controller="decorator-metacontroller"}`:                 0,
		`controller_runtime_reconcile_timeouts_total{controller="composite-metacontroller"}`:               0,
		`controller_runtime_reconcile_timeouts_total{controller="decorator-metacontroller"}`:               0,
		`controller_runtime_terminal_reconcile_errors_total{controller="composite-metacontroller"}`:        0,
		`controller_runtime_terminal_reconcile_errors_total{controller="decorator-metacontroller"}`:        0,
		`controller_runtime_reconcile_total{controller="composite-metacontroller",result="error"}`:         0,
		`controller_runtime_reconcile_total{controller="composite-metacontroller",result="requeue"}`:       0,
		`controller_runtime_reconcile_total{controller="composite-metacontroller",result="requeue_after"}`: 0,
		`controller_runtime_reconcile_total{controller="composite-metacontroller",result="success"}`:       0,
		`controller_runtime_reconcile_total{controller="decorator-metacontroller",result="error"}`:         0,
		`controller_runtime_reconcile_total{controller="decorator-metacontroller",result="requeue"}`:       0,
		`controller_runtime_reconcile_total{controller="decorator-metacontroller",result="requeue_after"}`: 0,
		`controller_runtime_reconcile_total{controller="decorator-metacontroller",result="success"}`:       0,
		`controller_runtime_reconcile_time_seconds{controller="composite-metacontroller"}`:                 0,
		`controller_runtime_reconcile_time_seconds{controller="decorator-metacontroller"}`:                 0,
	}
	if diff := cmp.Diff(wantStart, obstest.Series(t, reg)); diff != "" {
		t.Errorf("before any reconcile (-want +got):\n%s", diff)
	}

	begin := c.Begin()
	if got := obstest.Series(t, reg)[`controller_runtime_active_workers{controller="composite-metacontroller"}`]; got != 1 {
		t.Errorf("active workers during a reconcile = %v, want 1", got)
	}
	c.End(begin, ReconcileSuccess, false)
	c.End(c.Begin(), ReconcileError, false)
	c.Panicked()
	c.End(c.Begin(), ReconcileError, false)
	c.End(c.Begin(), ReconcileError, true)
	c.End(c.Begin(), ReconcileRequeueAfter, false)

	got := obstest.Series(t, reg)
	want := map[string]float64{
		`controller_runtime_active_workers{controller="composite-metacontroller"}`:                         0,
		`controller_runtime_reconcile_errors_total{controller="composite-metacontroller"}`:                 3,
		`controller_runtime_reconcile_panics_total{controller="composite-metacontroller"}`:                 1,
		`controller_runtime_terminal_reconcile_errors_total{controller="composite-metacontroller"}`:        1,
		`controller_runtime_reconcile_total{controller="composite-metacontroller",result="error"}`:         3,
		`controller_runtime_reconcile_total{controller="composite-metacontroller",result="requeue_after"}`: 1,
		`controller_runtime_reconcile_total{controller="composite-metacontroller",result="success"}`:       1,
		`controller_runtime_reconcile_time_seconds{controller="composite-metacontroller"}`:                 5, // observations
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %v, want %v", k, got[k], v)
		}
	}
	if upper := reconcileTimeBuckets[len(reconcileTimeBuckets)-1]; len(reconcileTimeBuckets) != 40 || upper != 60 {
		t.Errorf("%d buckets up to %v, controller-runtime has 40 up to 60", len(reconcileTimeBuckets), upper)
	}
}

// A nil *Reconciles (no metrics) records nothing and does not panic.
func TestReconcilesNil(t *testing.T) {
	var m *ReconcileMetrics
	c := m.Controller("composite-metacontroller", 1)
	c.Panicked()
	c.End(c.Begin(), ReconcileError, true)
	if elapsed := time.Since(c.Begin()); elapsed < 0 {
		t.Errorf("Begin returned a time in the future: %v", elapsed)
	}
}

func TestRegisterUnservedUpstreamMetrics(t *testing.T) {
	reg := prometheus.NewRegistry()
	for i := range 2 { // the second, from another service of the process, shares them
		if err := RegisterUnservedUpstreamMetrics(reg); err != nil {
			t.Fatalf("registration %d: %v", i+1, err)
		}
	}
	want := map[string]float64{
		"certwatcher_read_certificate_errors_total":          0,
		"certwatcher_read_certificate_total":                 0,
		"controller_runtime_conversion_webhook_panics_total": 0,
		"controller_runtime_webhook_panics_total":            0,
	}
	if diff := cmp.Diff(want, obstest.Series(t, reg)); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
}
