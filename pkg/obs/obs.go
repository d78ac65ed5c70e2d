// Package obs holds what every metabus service shares for operations:
// structured logging configured with upstream-compatible --zap-* flags, the
// Prometheus registry, and the /metrics, /healthz and /readyz endpoints.
package obs

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/metabus/metabus/pkg/ownership"
)

// LogFlags are controller-runtime's zap flags, as upstream exposes them.
type LogFlags struct {
	Level   string
	Devel   bool
	Encoder string
	TimeEnc string
	// Stacktrace is the level at and above which entries carry a stack
	// trace ("" keeps the default: none in production, warn with
	// --zap-devel).
	Stacktrace string
}

// Register adds --zap-log-level, --zap-devel, --zap-encoder,
// --zap-stacktrace-level and --zap-time-encoding.
func (f *LogFlags) Register(fs *flag.FlagSet) {
	fs.StringVar(&f.Level, "zap-log-level", "", "log level: debug, info, error, or an integer verbosity (4 = API actions, 5 = diffs, 6 = hook bodies); default info, debug with --zap-devel")
	fs.BoolVar(&f.Devel, "zap-devel", false, "development logging (console encoder, debug level, stack traces on warnings)")
	fs.StringVar(&f.Encoder, "zap-encoder", "", "log encoding: json or console (default json, console with --zap-devel)")
	fs.StringVar(&f.TimeEnc, "zap-time-encoding", "iso8601", "time encoding: epoch, millis, nano, iso8601, rfc3339, rfc3339nano")
	fs.Func("zap-stacktrace-level", "level at and above which log entries carry a stack trace: info, error or panic (default none, warn with --zap-devel)",
		func(v string) error {
			if _, err := parseStacktraceLevel(v); err != nil {
				return err
			}
			f.Stacktrace = v
			return nil
		})
}

// parseStacktraceLevel accepts controller-runtime's --zap-stacktrace-level
// names.
func parseStacktraceLevel(s string) (zapcore.Level, error) {
	switch strings.ToLower(s) {
	case "info":
		return zapcore.InfoLevel, nil
	case "error":
		return zapcore.ErrorLevel, nil
	case "panic":
		return zapcore.PanicLevel, nil
	}
	return 0, fmt.Errorf("unknown stacktrace level %q (info, error or panic)", s)
}

// ParseLevel accepts level names and upstream's integer verbosities (n →
// zap level -n, so 4 logs what upstream logs at V(4)).
func ParseLevel(s string) (zapcore.Level, error) {
	if n, err := strconv.Atoi(s); err == nil {
		if n < 0 {
			return 0, fmt.Errorf("log level %d must not be negative", n)
		}
		// zap levels are int8: a larger verbosity would wrap around and
		// silence everything.
		n = min(n, 128)
		return zapcore.Level(-n), nil
	}
	var l zapcore.Level
	if err := l.UnmarshalText([]byte(strings.ToLower(s))); err != nil {
		return 0, fmt.Errorf("unknown log level %q", s)
	}
	return l, nil
}

// timeEncoders are controller-runtime's --zap-time-encoding names.
var timeEncoders = map[string]zapcore.TimeEncoder{
	"epoch":       zapcore.EpochTimeEncoder,
	"millis":      zapcore.EpochMillisTimeEncoder,
	"nano":        zapcore.EpochNanosTimeEncoder,
	"nanos":       zapcore.EpochNanosTimeEncoder,
	"iso8601":     zapcore.ISO8601TimeEncoder,
	"rfc3339":     zapcore.RFC3339TimeEncoder,
	"rfc3339nano": zapcore.RFC3339NanoTimeEncoder,
}

// NewLogger builds the process logger.
func NewLogger(f LogFlags) (*zap.Logger, error) {
	cfg := zap.NewProductionConfig()
	if f.Devel {
		cfg = zap.NewDevelopmentConfig()
	}
	if f.Level != "" {
		l, err := ParseLevel(f.Level)
		if err != nil {
			return nil, err
		}
		cfg.Level = zap.NewAtomicLevelAt(l)
	}
	if f.Encoder != "" {
		cfg.Encoding = f.Encoder
	}
	if f.TimeEnc == "" {
		f.TimeEnc = "iso8601"
	}
	if !f.Devel {
		// Errors here are operational (a hook down, a conflict), not
		// bugs: a stack trace per failed sync only buries the message.
		cfg.DisableStacktrace = true
	}
	enc, ok := timeEncoders[strings.ToLower(f.TimeEnc)]
	if !ok {
		// zap itself falls back to epoch seconds for unknown names,
		// which would hide a typo.
		return nil, fmt.Errorf("unknown zap time encoding %q (epoch, millis, nano, iso8601, rfc3339, rfc3339nano)", f.TimeEnc)
	}
	cfg.EncoderConfig.EncodeTime = enc
	// Sampling would hide repeated sync errors of different parents.
	cfg.Sampling = nil
	var opts []zap.Option
	if f.Stacktrace != "" {
		l, err := parseStacktraceLevel(f.Stacktrace)
		if err != nil {
			return nil, err
		}
		cfg.DisableStacktrace = true // replaced by the level asked for
		opts = append(opts, zap.AddStacktrace(l))
	}
	l, err := cfg.Build(opts...)
	if err != nil {
		return nil, fmt.Errorf("build logger: %w", err)
	}
	return l, nil
}

// ConsumerErrors is a partition consumer's error log (jsbus.ConsumeConfig's
// OnError): at warn, as the consumer gets over most of them, except that a
// consumer that cannot be reset (ownership.ErrCannotReset, which the
// consumer reports once per replica) is at error: every handover is
// degraded until NATS is upgraded or the permission granted.
func ConsumerErrors(log *zap.Logger, what string) func(error) {
	return func(err error) {
		if errors.Is(err, ownership.ErrCannotReset) {
			log.Error(what+": partition handovers degraded", zap.Error(err))
			return
		}
		log.Warn(what, zap.Error(err))
	}
}

// NewRegistry returns a registry with the Go and process collectors,
// configured as controller-runtime v0.24.1 registers them for upstream
// Metacontroller: the Go collector exports every runtime/metrics figure
// (go_sched_*, go_gc_*, ...) besides the classic go_memstats_* ones. They
// cost nothing between scrapes.
func NewRegistry() *prometheus.Registry {
	r := prometheus.NewRegistry()
	r.MustRegister(collectors.NewGoCollector(collectors.WithGoCollectorRuntimeMetrics(collectors.MetricsAll)),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return r
}

// Health aggregates readiness checks of the components of a process. A
// process is ready once at least one check is registered and every check
// passes: components register a failing check as soon as they are built
// (Pending) and replace it once they work, so that a process whose
// components have not started yet is never reported ready.
type Health struct {
	mu     sync.Mutex
	checks map[string]func() error
}

// ErrNoChecks is Ready's answer before any component registered a check.
var ErrNoChecks = errors.New("starting: no component has reported yet")

// Pending registers a check that fails with why, for a component that is
// starting; it replaces the check later with SetReady.
func (h *Health) Pending(name, why string) {
	err := errors.New(why)
	h.SetReady(name, func() error { return err })
}

// SetReady registers (or replaces) a named readiness check.
func (h *Health) SetReady(name string, check func() error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.checks == nil {
		h.checks = map[string]func() error{}
	}
	h.checks[name] = check
}

// Ready runs every check, outside the lock: a check may wait on a probe
// (ProbeOnAsk), and components report their state meanwhile.
func (h *Health) Ready() error {
	h.mu.Lock()
	if len(h.checks) == 0 {
		h.mu.Unlock()
		return ErrNoChecks
	}
	names := make([]string, 0, len(h.checks))
	checks := make([]func() error, 0, len(h.checks))
	for name, c := range h.checks {
		names = append(names, name)
		checks = append(checks, c)
	}
	h.mu.Unlock()
	var errs []error
	for i, c := range checks {
		if err := c(); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", names[i], err))
		}
	}
	return errors.Join(errs...)
}

// ProbeOnAsk returns a readiness check that probes only when asked: a
// check made more than maxAge after the last probe started starts another
// (bounded by timeout; one at a time) and waits up to wait for it, then
// reports the latest result. Until a probe has returned it fails with "not
// checked yet". So a process nobody asks makes no probe requests, one
// asked by a kubelet makes one per readiness probe, and an answer is
// never held longer than wait by a slow probed server. It replaces a
// background poll that woke the process and the probed server every few
// seconds for an answer nobody read.
func ProbeOnAsk(ctx context.Context, maxAge, wait, timeout time.Duration, probe func(context.Context) error) func() error {
	var (
		mu      sync.Mutex
		last    = errors.New("not checked yet")
		started time.Time     // of the last probe
		running chan struct{} // closed when the running probe returns
	)
	run := func(done chan struct{}) {
		pctx, cancel := context.WithTimeout(ctx, timeout)
		err := probe(pctx)
		cancel()
		mu.Lock()
		if ctx.Err() == nil {
			last = err
		}
		running = nil
		mu.Unlock()
		close(done)
	}
	return func() error {
		mu.Lock()
		done := running
		if done == nil && (started.IsZero() || time.Since(started) > maxAge) && ctx.Err() == nil {
			done = make(chan struct{})
			running, started = done, time.Now()
			go run(done)
		}
		mu.Unlock()
		if done != nil {
			t := time.NewTimer(wait)
			select {
			case <-done:
			case <-t.C:
			case <-ctx.Done():
			}
			t.Stop()
		}
		mu.Lock()
		defer mu.Unlock()
		return last
	}
}

// Serve runs the metrics endpoint on metricsAddr and the probes on
// healthAddr ("0" or "" disables one; the same address serves both) until
// ctx is done.
func Serve(ctx context.Context, log *zap.Logger, metricsAddr, healthAddr string, reg prometheus.Gatherer, h *Health) error {
	muxes := map[string]*http.ServeMux{}
	mux := func(addr string) *http.ServeMux {
		if m, ok := muxes[addr]; ok {
			return m
		}
		m := http.NewServeMux()
		muxes[addr] = m
		return m
	}
	if metricsAddr != "" && metricsAddr != "0" {
		mux(metricsAddr).Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	}
	if healthAddr != "" && healthAddr != "0" {
		m := mux(healthAddr)
		m.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok")) })
		m.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
			if err := h.Ready(); err != nil {
				http.Error(w, err.Error(), http.StatusServiceUnavailable)
				return
			}
			_, _ = w.Write([]byte("ok"))
		})
	}
	var wg sync.WaitGroup
	errc := make(chan error, len(muxes))
	for addr, m := range muxes {
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			return fmt.Errorf("listen on %s: %w", addr, err)
		}
		srv := &http.Server{Handler: m, ReadHeaderTimeout: 5 * time.Second}
		wg.Add(1)
		go func() {
			defer wg.Done()
			log.Info("serving metrics/health", zap.String("address", ln.Addr().String()))
			if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
				errc <- err
			}
		}()
		go func() {
			<-ctx.Done()
			sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			_ = srv.Shutdown(sctx)
		}()
	}
	wg.Wait()
	select {
	case err := <-errc:
		return err
	default:
		return nil
	}
}

// Tracer observes per-parent processing, for tests that check that no
// parent is ever handled by two replicas at once: it is called when a
// replica starts handling a parent, and the returned func when it stops.
type Tracer func(stage, parentUID string) (end func())
