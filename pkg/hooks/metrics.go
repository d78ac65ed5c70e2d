package hooks

import (
	"errors"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
)

// Metric code label values that are not HTTP status codes.
const (
	codeTimeout = "timeout"
	codeError   = "error"
)

// metrics are the hook call metrics. A nil *metrics records nothing.
type metrics struct {
	requests *prometheus.CounterVec
	duration *prometheus.HistogramVec
	inFlight *prometheus.GaugeVec
}

func newMetrics(reg prometheus.Registerer, log *zap.Logger) *metrics {
	if reg == nil {
		return nil
	}
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "metabus_hook_requests_total",
			Help: "Hook calls by result: the HTTP status code, or timeout/error when no response arrived.",
		}, []string{"controller_type", "controller", "hook", "code"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "metabus_hook_request_duration_seconds",
			Help: "Duration of hook calls, including reading and decoding the response.",
			// From loopback hooks (~100µs) up to beyond the 10s default timeout.
			Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30},
		}, []string{"controller_type", "controller", "hook"}),
		inFlight: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "metabus_hook_in_flight_requests",
			Help: "Hook calls in progress.",
		}, []string{"hook"}),
	}
	m.requests = register(reg, m.requests, log)
	m.duration = register(reg, m.duration, log)
	m.inFlight = register(reg, m.inFlight, log)
	return m
}

// register registers c, or adopts the collector already registered under the same
// description, so that several Clients (one per service in a combined process) share one
// registry without errors.
func register[T prometheus.Collector](reg prometheus.Registerer, c T, log *zap.Logger) T {
	err := reg.Register(c)
	if err == nil {
		return c
	}
	var are prometheus.AlreadyRegisteredError
	if errors.As(err, &are) {
		if existing, ok := are.ExistingCollector.(T); ok {
			return existing
		}
	}
	// Metrics must never break hook calls: keep counting into the unregistered collector.
	log.Warn("cannot register hook metrics", zap.Error(err))
	return c
}

// start records a call in flight and returns the function that records its end.
func (m *metrics) start(controllerType, controller, hook string) func(code string) {
	if m == nil {
		return func(string) {}
	}
	g := m.inFlight.WithLabelValues(hook)
	g.Inc()
	begin := time.Now()
	return func(code string) {
		g.Dec()
		m.duration.WithLabelValues(controllerType, controller, hook).Observe(time.Since(begin).Seconds())
		m.requests.WithLabelValues(controllerType, controller, hook, code).Inc()
	}
}
