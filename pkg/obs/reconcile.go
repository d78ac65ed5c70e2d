package obs

import (
	"errors"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// ReconcilerName is the controller label of the controller_runtime_*
// series of the controller objects of kind. Upstream Metacontroller
// v4.17.2 runs two controller-runtime controllers (pkg/server/server.go),
// "composite-metacontroller" and "decorator-metacontroller", which
// reconcile the CompositeController and DecoratorController objects
// themselves (starting, updating and stopping the per-controller work
// queues), not their parents. Metabus's watcher does that work (wiring a
// controller object's informers) and reports it under the same names;
// MapControllers, which upstream does not have, as "map-metacontroller".
func ReconcilerName(kind string) string {
	return strings.ToLower(strings.TrimSuffix(kind, "Controller")) + "-metacontroller"
}

// ReconcileResult is the result label of controller_runtime_reconcile_total.
type ReconcileResult int

// The results controller-runtime counts, in its order of precedence: an
// error wins over a requeue.
const (
	ReconcileSuccess ReconcileResult = iota
	ReconcileError
	ReconcileRequeue
	ReconcileRequeueAfter
)

// reconcileTimeBuckets are controller-runtime v0.24.1's
// (pkg/internal/controller/metrics/metrics.go): 5 ms to 60 s.
var reconcileTimeBuckets = []float64{0.005, 0.01, 0.025, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.35, 0.4, 0.45, 0.5,
	0.6, 0.7, 0.8, 0.9, 1.0, 1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 3.5, 4.0, 4.5, 5, 6, 7, 8, 9, 10, 15, 20, 25, 30, 40, 50, 60}

// ReconcileMetrics are controller-runtime's per-controller families
// (controller_runtime_reconcile_total{controller,result},
// _reconcile_errors_total, _terminal_reconcile_errors_total,
// _reconcile_panics_total, _reconcile_timeouts_total,
// _reconcile_time_seconds, _max_concurrent_reconciles, _active_workers),
// with controller-runtime's names, labels, types and buckets.
type ReconcileMetrics struct {
	total                            *prometheus.CounterVec
	errs, terminal, panics, timeouts *prometheus.CounterVec
	seconds                          *prometheus.HistogramVec
	maxConcurrent, activeWorkers     *prometheus.GaugeVec
}

// NewReconcileMetrics registers the families with reg (nil: none are
// exported, the methods still work).
func NewReconcileMetrics(reg prometheus.Registerer) (*ReconcileMetrics, error) {
	per := []string{"controller"}
	counter := func(name, help string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, per)
	}
	gauge := func(name, help string) *prometheus.GaugeVec {
		return prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: name, Help: help}, per)
	}
	m := &ReconcileMetrics{}
	var errs [8]error
	m.total, errs[0] = Register(reg, prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "controller_runtime_reconcile_total",
		Help: "Reconciles of controller objects per controller, by result (success, error, requeue, requeue_after).",
	}, []string{"controller", "result"}))
	m.errs, errs[1] = Register(reg, counter("controller_runtime_reconcile_errors_total",
		"Reconciles of controller objects that failed (retried with backoff), per controller."))
	m.terminal, errs[2] = Register(reg, counter("controller_runtime_terminal_reconcile_errors_total",
		"Reconciles of controller objects that failed for good (not retried), per controller."))
	m.panics, errs[3] = Register(reg, counter("controller_runtime_reconcile_panics_total",
		"Reconciles of controller objects that panicked (recovered, counted as errors and retried), per controller."))
	m.timeouts, errs[4] = Register(reg, counter("controller_runtime_reconcile_timeouts_total",
		"Reconciles of controller objects cut short by a reconcile timeout, per controller."))
	m.seconds, errs[5] = Register(reg, prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:                            "controller_runtime_reconcile_time_seconds",
		Help:                            "Seconds per reconcile of a controller object, per controller.",
		Buckets:                         reconcileTimeBuckets,
		NativeHistogramBucketFactor:     1.1,
		NativeHistogramMaxBucketNumber:  100,
		NativeHistogramMinResetDuration: time.Hour,
	}, per))
	m.maxConcurrent, errs[6] = Register(reg, gauge("controller_runtime_max_concurrent_reconciles",
		"Workers reconciling the controller's objects."))
	m.activeWorkers, errs[7] = Register(reg, gauge("controller_runtime_active_workers",
		"Workers reconciling one of the controller's objects right now."))
	return m, errors.Join(errs[:]...)
}

// Reconciles are one controller's children of every family, resolved
// once so that counting a reconcile looks nothing up.
type Reconciles struct {
	results                [4]prometheus.Counter // by ReconcileResult
	errs, terminal, panics prometheus.Counter
	seconds                prometheus.Observer
	active                 prometheus.Gauge
}

// Controller returns the children of controller, which runs workers
// reconcile workers, initialised as controller-runtime does when a
// controller starts: every counter at 0 (so that its series exist before
// the first reconcile), the worker gauges set.
func (m *ReconcileMetrics) Controller(controller string, workers int) *Reconciles {
	if m == nil {
		return nil
	}
	r := &Reconciles{
		errs:     m.errs.WithLabelValues(controller),
		terminal: m.terminal.WithLabelValues(controller),
		panics:   m.panics.WithLabelValues(controller),
		seconds:  m.seconds.WithLabelValues(controller),
		active:   m.activeWorkers.WithLabelValues(controller),
	}
	// Metabus sets no reconcile timeout (controller-runtime's default
	// either): the series exists, as upstream's does, and stays 0.
	m.timeouts.WithLabelValues(controller)
	for res, label := range [...]string{
		ReconcileSuccess: "success", ReconcileError: "error",
		ReconcileRequeue: "requeue", ReconcileRequeueAfter: "requeue_after",
	} {
		r.results[res] = m.total.WithLabelValues(controller, label)
	}
	// WithLabelValues created the counters at 0; the gauges are set.
	m.maxConcurrent.WithLabelValues(controller).Set(float64(workers))
	r.active.Set(0)
	return r
}

// Begin records that a worker started a reconcile; pass its result to End.
func (r *Reconciles) Begin() time.Time {
	if r != nil {
		r.active.Inc()
	}
	return time.Now()
}

// End records the end of the reconcile that began at begin. A terminal
// error is an error that is not retried; it counts as an error too, as in
// controller-runtime.
func (r *Reconciles) End(begin time.Time, res ReconcileResult, terminal bool) {
	if r == nil {
		return
	}
	r.active.Dec()
	r.seconds.Observe(time.Since(begin).Seconds())
	if res == ReconcileError {
		r.errs.Inc()
		if terminal {
			r.terminal.Inc()
		}
	}
	r.results[res].Inc()
}

// Panicked counts a reconcile that panicked; its End follows, with an error.
func (r *Reconciles) Panicked() {
	if r != nil {
		r.panics.Inc()
	}
}

// RegisterUnservedUpstreamMetrics adds the families controller-runtime
// v0.24.1 registers at init for servers that upstream Metacontroller links
// but never runs, so that its /metrics always shows them at 0: the
// certificate watcher's certwatcher_read_certificate_total and
// certwatcher_read_certificate_errors_total (pkg/certwatcher/metrics; the
// metrics endpoint serves plain HTTP, no certificate is read), and the
// webhook servers' controller_runtime_webhook_panics_total and
// controller_runtime_conversion_webhook_panics_total (pkg/webhook/admission
// and pkg/webhook/conversion metrics; no webhook is served). Metabus serves
// no webhook and reads no certificate file either, so they are 0 here for
// the same reason; they exist so that queries naming them find a series.
func RegisterUnservedUpstreamMetrics(reg prometheus.Registerer) error {
	var errs []error
	for _, c := range []struct{ name, help string }{
		{"certwatcher_read_certificate_total", "Certificate reads by a certificate watcher (metabus runs none: always 0)."},
		{"certwatcher_read_certificate_errors_total", "Failed certificate reads by a certificate watcher (metabus runs none: always 0)."},
		{"controller_runtime_webhook_panics_total", "Panics serving an admission webhook (metabus serves none: always 0)."},
		{"controller_runtime_conversion_webhook_panics_total", "Panics serving a conversion webhook (metabus serves none: always 0)."},
	} {
		_, err := Register(reg, prometheus.NewCounter(prometheus.CounterOpts{Name: c.name, Help: c.help}))
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}
