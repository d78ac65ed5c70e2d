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
)

// LogFlags are controller-runtime's zap flags, as upstream exposes them.
type LogFlags struct {
	Level   string
	Devel   bool
	Encoder string
	TimeEnc string
}

// Register adds --zap-log-level, --zap-devel, --zap-encoder and
// --zap-time-encoding.
func (f *LogFlags) Register(fs *flag.FlagSet) {
	fs.StringVar(&f.Level, "zap-log-level", "", "log level: debug, info, error, or an integer verbosity (4 = API actions, 5 = diffs, 6 = hook bodies); default info, debug with --zap-devel")
	fs.BoolVar(&f.Devel, "zap-devel", false, "development logging (console encoder, debug level, stack traces on warnings)")
	fs.StringVar(&f.Encoder, "zap-encoder", "", "log encoding: json or console (default json, console with --zap-devel)")
	fs.StringVar(&f.TimeEnc, "zap-time-encoding", "iso8601", "time encoding: epoch, millis, nano, iso8601, rfc3339, rfc3339nano")
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
	l, err := cfg.Build()
	if err != nil {
		return nil, fmt.Errorf("build logger: %w", err)
	}
	return l, nil
}

// NewRegistry returns a registry with the Go and process collectors.
func NewRegistry() *prometheus.Registry {
	r := prometheus.NewRegistry()
	r.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return r
}

// Health aggregates readiness checks of the components of a process.
type Health struct {
	mu     sync.Mutex
	checks map[string]func() error
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

// Ready runs every check.
func (h *Health) Ready() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	var errs []error
	for name, c := range h.checks {
		if err := c(); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", name, err))
		}
	}
	return errors.Join(errs...)
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
