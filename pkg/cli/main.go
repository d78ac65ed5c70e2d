package cli

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/pprof"
	"os"
	"runtime"
	"runtime/debug"
	"sync"
	"time"

	"github.com/go-logr/zapr"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/pflag"
	"go.uber.org/zap"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"

	"github.com/metabus/metabus/pkg/kubeapi"
	"github.com/metabus/metabus/pkg/natsx"
	"github.com/metabus/metabus/pkg/obs"
	"github.com/metabus/metabus/pkg/version"
)

// Env is what a service's run function gets.
type Env struct {
	// Name is the binary's name, the NATS connection's name.
	Name  string
	Flags *CommonFlags
	// REST is the Kubernetes client configuration from the flags.
	REST     *rest.Config
	Log      *zap.Logger
	Registry *prometheus.Registry
	Health   *obs.Health
	// check is the name of the stage's readiness check, pending until the
	// service registers its own under the same name.
	check string
	// stage is what the binary runs.
	stage Stage
}

// ConnectNATS connects to the NATS server of the flags, waiting (with
// backoff, each failure logged and shown by /readyz) for one that is not
// reachable yet, until ctx is done.
func (e Env) ConnectNATS(ctx context.Context) (*nats.Conn, jetstream.JetStream, error) {
	opts := e.Flags.NATS.Options(e.Name)
	opts.Logger = e.Log
	if e.stage != AllInOne && e.stage != "" {
		// A service replies on its own inbox prefix: its NATS user may
		// subscribe to that one only (deploy/nats/nats-server.conf).
		opts.InboxPrefix = natsx.ServiceInboxPrefix(string(e.stage))
	}
	return natsx.Dial(ctx, opts, natsx.DefaultBackoff, func(err error, next time.Duration) {
		e.Log.Warn("NATS not reachable yet; retrying", zap.Error(err), zap.Duration("retryIn", next))
		e.Health.Pending(e.check, "waiting for NATS: "+err.Error())
	})
}

// /readyz's API server check (obs.ProbeOnAsk): an answer at most
// apiProbeMaxAge old, a probe bounded by apiProbeTimeout, a /readyz held
// at most apiProbeWait for it (the deployed readiness probes allow 5 s).
var (
	apiProbeMaxAge  = time.Second
	apiProbeWait    = 2 * time.Second
	apiProbeTimeout = 3 * time.Second
)

// runService sets up logging, metrics and probes, logs the build and the
// upstream flags the stage ignores, and runs s until ctx is done.
func runService(ctx context.Context, s Service, common *CommonFlags, flags *pflag.FlagSet) error {
	setGCPercent()
	base, err := obs.NewLogger(common.Log)
	if err != nil {
		return invalidError{err}
	}
	defer func() { _ = base.Sync() }()
	// client-go (leader election, event broadcasting) logs through klog:
	// send it to the same structured log.
	klog.SetLogger(zapr.NewLogger(base.Named("client-go")))
	log := base.Named(s.Name)
	info := version.Get()
	log.Info("starting "+s.Name, zap.String("version", info.Version), zap.String("revision", info.Revision), zap.String("goVersion", info.GoVersion))
	for _, name := range UpstreamFlagNames() {
		if why := ignoredReason(s.Stage, name); why != "" && flags.Changed(name) {
			log.Info(fmt.Sprintf("--%s is ignored by this stage because %s", name, why), zap.String("flag", name), zap.String("stage", string(s.Stage)))
		}
	}

	// Stopped (LIFO) before the servers are waited for.
	var wg sync.WaitGroup
	defer wg.Wait()
	ctx, stop := context.WithCancel(ctx)
	defer stop()
	reg := obs.NewRegistry()
	if err := version.Register(reg); err != nil {
		return fmt.Errorf("register %s: %w", version.BuildInfoName, err)
	}
	health := &obs.Health{}
	check := string(s.Stage)
	health.Pending(check, "starting")
	serveErr := make(chan error, 1)
	wg.Add(1)
	go func() {
		defer wg.Done()
		if err := obs.Serve(ctx, base, common.MetricsAddr, common.HealthAddr, reg, health); err != nil {
			log.Error("metrics/health server", zap.Error(err))
			serveErr <- err
			stop()
		}
	}()
	if common.PprofAddr != "" && common.PprofAddr != "0" {
		wg.Add(1)
		go func() { defer wg.Done(); servePprof(ctx, base, common.PprofAddr) }()
	} else {
		// Without /debug/pprof nobody can read a heap profile, so do not
		// sample for one: the samples' call stacks are kept for the
		// process's life (about 1.5 MB after the B1 benchmark).
		runtime.MemProfileRate = 0
	}
	restCfg, err := common.Kube.Config()
	if err != nil {
		log.Error(s.Name+" cannot start", zap.Error(err))
		return reportedError{err}
	}
	probe, err := apiServerProbe(restCfg, log)
	if err != nil {
		log.Error(s.Name+" cannot start", zap.Error(err))
		return reportedError{err}
	}
	health.SetReady("kubernetes", obs.ProbeOnAsk(ctx, apiProbeMaxAge, apiProbeWait, apiProbeTimeout, probe))

	env := Env{Name: s.Name, Flags: common, REST: restCfg, Log: log, Registry: reg, Health: health, check: check, stage: s.Stage}
	if err := s.Run(ctx, env); err != nil && ctx.Err() == nil {
		log.Error(s.Name+" stopped", zap.Error(err))
		return reportedError{err}
	}
	select {
	case err := <-serveErr:
		// Without its probes the process would be restarted anyway; say
		// why it stopped.
		return reportedError{err}
	default:
	}
	log.Info(s.Name + " stopped")
	return nil
}

// apiServerProbe asks the API server's /readyz, logging when the answer
// changes. A 403 still means the server answers (an RBAC that does not
// grant /readyz to the service's account); a 401 means the credentials do
// not work, so nothing else will.
func apiServerProbe(cfg *rest.Config, log *zap.Logger) (func(context.Context) error, error) {
	cfg = rest.CopyConfig(cfg)
	cfg.Timeout = apiProbeTimeout
	// A JSON REST client, not a typed clientset: that would link and
	// register every built-in API group in each binary, its code pages
	// and heap paid for a GET of /readyz.
	rc, err := kubeapi.NewREST(cfg)
	if err != nil {
		return nil, fmt.Errorf("kubernetes client: %w", err)
	}
	var mu sync.Mutex
	var was error = errors.New("not checked yet")
	return func(ctx context.Context) error {
		err := rc.Get().AbsPath("/readyz").Do(ctx).Error()
		if apierrors.IsForbidden(err) {
			err = nil
		}
		if err != nil {
			err = fmt.Errorf("API server %s not answering: %w", cfg.Host, err)
		}
		mu.Lock()
		defer mu.Unlock()
		switch {
		case err != nil && (was == nil || was.Error() != err.Error()):
			log.Warn("Kubernetes API server not ready", zap.Error(err))
		case err == nil && was != nil:
			log.Info("Kubernetes API server answering", zap.String("host", cfg.Host))
		}
		was = err
		return err
	}, nil
}

// DefaultGCPercent is the garbage collector's target (GOGC) unless the
// environment sets one. A controller's heap is mostly long-lived caches
// (informers, echo notes), so Go's default of 100 lets the heap grow to
// twice that before collecting; 75 measured 10-13 MiB less RSS after the
// B1 benchmark (2,000 parents: 78-83 against 91-95 MiB) for 3-4% more CPU
// per parent, with the same throughput. Prometheus defaults to 75 for
// the same reason.
const DefaultGCPercent = 75

// setGCPercent applies DefaultGCPercent unless $GOGC is set.
func setGCPercent() {
	if _, set := os.LookupEnv("GOGC"); !set {
		debug.SetGCPercent(DefaultGCPercent)
	}
}

// servePprof serves the runtime profiles on their own address (never on the
// metrics port, which is often scraped from outside the pod) until ctx ends.
func servePprof(ctx context.Context, log *zap.Logger, addr string) {
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	srv := &http.Server{Addr: addr, Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		<-ctx.Done()
		_ = srv.Close()
	}()
	if err := srv.ListenAndServe(); err != nil && !errors.Is(err, http.ErrServerClosed) {
		log.Error("pprof server", zap.Error(err))
	}
}
