package hooks

import (
	"crypto/tls"
	"net/http"
	"net/http/httptrace"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/metabus/metabus/pkg/obs"
)

// Metric code label values that are not HTTP status codes.
const (
	codeTimeout = "timeout"
	codeError   = "error"
)

// metrics are the hook call metrics: metabus's own metabus_hook_* families,
// and upstream Metacontroller's metacontroller_<hook>_* families. A nil
// *metrics records nothing.
type metrics struct {
	requests *prometheus.CounterVec
	duration *prometheus.HistogramVec
	inFlight *prometheus.GaugeVec

	reg prometheus.Registerer
	log *zap.Logger
	mu  sync.Mutex
	// upstream holds the metacontroller_<hook>_* families by hook kind,
	// registered on the kind's first call.
	upstream map[string]*upstreamHook
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
		reg:      reg,
		log:      log,
		upstream: map[string]*upstreamHook{},
	}
	m.requests = register(reg, m.requests, log)
	m.duration = register(reg, m.duration, log)
	m.inFlight = register(reg, m.inFlight, log)
	return m
}

// register registers c, or adopts the collector already registered under
// the same description, so that several Clients (one per service in a
// combined process) share one registry without errors.
func register[T prometheus.Collector](reg prometheus.Registerer, c T, log *zap.Logger) T {
	c, err := obs.Register(reg, c)
	if err != nil {
		// Metrics must never break hook calls: keep counting into the unregistered collector.
		log.Warn("cannot register hook metrics", zap.Error(err))
	}
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

// upstreamHook is one hook kind's metacontroller_<hook>_* families, as
// upstream Metacontroller v4.17.2 exports them (pkg/metrics/http.go, which
// instruments each hook's HTTP client with client_golang's promhttp round
// tripper helpers): the same names, label names and buckets. Upstream
// registers one collector per (controller, hook, url) with the labels url,
// controller_name and controller_type as constant labels; here they are
// ordinary labels of one collector per hook kind, which exposes the same
// series. As in upstream:
//   - requests_total{code,method} counts responses (a call that got none,
//     a timeout or a refused connection, is not counted; metabus_hook_*
//     counts those);
//   - request_duration_histogram_seconds{method} is the time to the
//     response's headers, for calls that got one;
//   - in_flight_requests counts calls waiting for their response headers;
//   - dns_duration_histogram_seconds and tls_duration_histogram_seconds
//     {event} record, at the start and end of a DNS lookup and a TLS
//     handshake, the seconds since the request started (only calls that
//     open a new connection have those events);
//   - method is "post", the only method hooks are called with, in
//     promhttp's lower case.
//
// The url label is the webhook's URL with any password masked.
type upstreamHook struct {
	requests *prometheus.CounterVec
	duration *prometheus.HistogramVec
	inFlight *prometheus.GaugeVec
	dns, tls *prometheus.HistogramVec
}

// upstreamFor returns hook's families, registering them on first use.
func (m *metrics) upstreamFor(hook string) *upstreamHook {
	m.mu.Lock()
	defer m.mu.Unlock()
	if u := m.upstream[hook]; u != nil {
		return u
	}
	const ns = "metacontroller"
	ident := []string{"url", "controller_name", "controller_type"}
	with := func(extra ...string) []string { return append(append([]string{}, ident...), extra...) }
	u := &upstreamHook{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: ns, Subsystem: hook, Name: "requests_total",
			Help: "Responses received from the " + hook + " hook, by status code and method.",
		}, with("code", "method")),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: ns, Subsystem: hook, Name: "request_duration_histogram_seconds",
			Help:    "Seconds from sending a " + hook + " hook request to its response headers.",
			Buckets: prometheus.DefBuckets,
		}, with("method")),
		inFlight: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: ns, Subsystem: hook, Name: "in_flight_requests",
			Help: hook + " hook requests waiting for their response headers.",
		}, ident),
		dns: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: ns, Subsystem: hook, Name: "dns_duration_histogram_seconds",
			Help:    "Seconds since the " + hook + " hook request started, at the start and end of its DNS lookup.",
			Buckets: []float64{.005, .01, .025, .05},
		}, with("event")),
		tls: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: ns, Subsystem: hook, Name: "tls_duration_histogram_seconds",
			Help:    "Seconds since the " + hook + " hook request started, at the start and end of its TLS handshake.",
			Buckets: []float64{.05, .1, .25, .5},
		}, with("event")),
	}
	u.requests = register(m.reg, u.requests, m.log)
	u.duration = register(m.reg, u.duration, m.log)
	u.inFlight = register(m.reg, u.inFlight, m.log)
	u.dns = register(m.reg, u.dns, m.log)
	u.tls = register(m.reg, u.tls, m.log)
	m.upstream[hook] = u
	return u
}

// roundTrip sends req through client, recording the upstream metrics of
// the call (controllerType, controller, hook) to url.
func (m *metrics) roundTrip(client *http.Client, req *http.Request, controllerType, controller, hook, url string) (*http.Response, error) {
	if m == nil {
		return client.Do(req)
	}
	u := m.upstreamFor(hook)
	inFlight := u.inFlight.WithLabelValues(url, controller, controllerType)
	begin := time.Now()
	since := func() float64 { return time.Since(begin).Seconds() }
	event := func(h *prometheus.HistogramVec, name string) {
		h.WithLabelValues(url, controller, controllerType, name).Observe(since())
	}
	trace := &httptrace.ClientTrace{
		DNSStart:          func(httptrace.DNSStartInfo) { event(u.dns, "dns_start") },
		DNSDone:           func(httptrace.DNSDoneInfo) { event(u.dns, "dns_done") },
		TLSHandshakeStart: func() { event(u.tls, "tls_handshake_start") },
		TLSHandshakeDone:  func(tls.ConnectionState, error) { event(u.tls, "tls_handshake_done") },
	}
	req = req.WithContext(httptrace.WithClientTrace(req.Context(), trace))
	inFlight.Inc()
	res, err := client.Do(req)
	inFlight.Dec()
	if err == nil {
		u.duration.WithLabelValues(url, controller, controllerType, "post").Observe(since())
		u.requests.WithLabelValues(url, controller, controllerType, httpCode(res.StatusCode), "post").Inc()
	}
	return res, err
}
