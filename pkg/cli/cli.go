// Package cli is the command line of every metabus binary: the flags every
// service shares (Kubernetes client, NATS connection, logging, metrics and
// probes, upstream Metacontroller's flags), the cobra commands that run a
// service or an operator subcommand, and what turns the flags into clients.
// A service's main is a Service and one Execute call; an operator
// subcommand of `metabus` is a *cobra.Command added with one AddCommand
// line in cmd/metabus, using ClientFlags for its connections.
//
// Flags are parsed by pflag as kubectl's are; a service's own flags stay
// on Go's flag package (services/*/flags.go) and are bridged in. Go-style
// single-dash long flags (-workers=5), which manifests written for upstream
// may use, are accepted too.
package cli

import (
	"errors"
	"flag"
	"fmt"
	"time"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/metabus/metabus/pkg/natsx"
	"github.com/metabus/metabus/pkg/obs"
)

// KubeFlags configure the Kubernetes client.
type KubeFlags struct {
	Kubeconfig string
	// Context is the kubeconfig context to use ("" → its current one).
	Context string
	QPS     float64
	Burst   int
}

// RegisterConfig adds --kubeconfig and --context, which say which cluster
// to talk to (what an operator subcommand needs).
func (f *KubeFlags) RegisterConfig(fs *flag.FlagSet) {
	fs.StringVar(&f.Kubeconfig, "kubeconfig", "", "path to a kubeconfig (default: in-cluster, then $KUBECONFIG, then ~/.kube/config)")
	fs.StringVar(&f.Context, "context", "", "kubeconfig context to use (default: the kubeconfig's current context)")
}

// Register adds --kubeconfig, --context, --client-go-qps and
// --client-go-burst.
func (f *KubeFlags) Register(fs *flag.FlagSet) {
	f.RegisterConfig(fs)
	// Upstream defaults to 5/10, which caps it near 5 syncs/s. A fixed
	// budget is wrong for every cluster but one: 100 QPS capped a default
	// install at 33 parents/s (3 requests per parent) while the API server
	// had room for several times that. So by default there is no
	// client-side limit: concurrency is already bounded by --workers, and
	// the API server's priority and fairness pushes back with 429 and
	// Retry-After, which client-go honours (and retries) on its own.
	fs.Float64Var(&f.QPS, "client-go-qps", -1, "Kubernetes client queries per second (<= 0: no client-side limit; the API server's priority and fairness applies)")
	fs.IntVar(&f.Burst, "client-go-burst", 200, "Kubernetes client burst (with --client-go-qps > 0)")
}

// Config builds the REST config: from --kubeconfig (and --context) when
// given, else the in-cluster configuration, else $KUBECONFIG or
// ~/.kube/config.
func (f *KubeFlags) Config() (*rest.Config, error) {
	var cfg *rest.Config
	var err error
	inCluster := false
	if f.Kubeconfig == "" && f.Context == "" {
		cfg, err = rest.InClusterConfig()
		inCluster = err == nil
	}
	if !inCluster {
		rules := clientcmd.NewDefaultClientConfigLoadingRules()
		rules.ExplicitPath = f.Kubeconfig
		cfg, err = clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{CurrentContext: f.Context}).ClientConfig()
	}
	if err != nil {
		return nil, fmt.Errorf("kubernetes client config: %w", err)
	}
	cfg.QPS = float32(f.QPS)
	if f.QPS <= 0 {
		// rest.Config treats 0 as "default 5 QPS"; negative disables the
		// client-side limiter.
		cfg.QPS = -1
	}
	cfg.Burst = f.Burst
	return cfg, nil
}

// NATSFlags configure the NATS connection.
type NATSFlags struct {
	URL      string
	Creds    string
	NKeySeed string
	CAFile   string
	CertFile string
	KeyFile  string
}

// Register adds --nats-url and the credential/TLS flags.
func (f *NATSFlags) Register(fs *flag.FlagSet) {
	fs.StringVar(&f.URL, "nats-url", "nats://127.0.0.1:4222", "NATS server URL(s), comma separated")
	fs.StringVar(&f.Creds, "nats-creds", "", "NATS credentials file (per-service user with subject permissions)")
	fs.StringVar(&f.NKeySeed, "nats-nkey", "", "NATS nkey seed file")
	fs.StringVar(&f.CAFile, "nats-ca", "", "CA bundle to verify the NATS server")
	fs.StringVar(&f.CertFile, "nats-cert", "", "client certificate for NATS mTLS")
	fs.StringVar(&f.KeyFile, "nats-key", "", "client key for NATS mTLS")
}

// Options returns connection options for a named client.
func (f *NATSFlags) Options(name string) natsx.ConnOptions {
	return natsx.ConnOptions{URL: f.URL, Name: name, Creds: f.Creds, NKeySeed: f.NKeySeed, CAFile: f.CAFile, CertFile: f.CertFile, KeyFile: f.KeyFile}
}

// The values of upstream's --apply-strategy.
const (
	ApplyDynamic    = "dynamic-apply"
	ApplyServerSide = "server-side-apply"
)

// LeaseLock is the only --leader-election-resource-lock metabus supports.
const LeaseLock = "leases"

// CommonFlags are the flags of every service.
type CommonFlags struct {
	Kube        KubeFlags
	NATS        NATSFlags
	Log         obs.LogFlags
	MetricsAddr string
	HealthAddr  string
	PprofAddr   string

	// ApplyStrategy is upstream's --apply-strategy: how children are
	// applied, ApplyDynamic (default) or ApplyServerSide (the parent's
	// status is written the same way under both, as upstream).
	ApplyStrategy string
	// SSAFieldManager is upstream's --apply-strategy-ssa-field-manager,
	// the field manager of server-side apply.
	SSAFieldManager string
	// LeaderElectionResourceLock is upstream's
	// --leader-election-resource-lock; only LeaseLock is supported.
	LeaderElectionResourceLock string

	// Shared by several services (registered once in the all-in-one).
	Workers           int
	MaxInFlight       int
	DiscoveryInterval time.Duration
	SnapshotWait      time.Duration
	EventsQPS         float64
	EventsBurst       int
}

// Register adds all common flags.
func (f *CommonFlags) Register(fs *flag.FlagSet, defaultMetrics, defaultHealth string) {
	f.Kube.Register(fs)
	f.NATS.Register(fs)
	f.Log.Register(fs)
	fs.StringVar(&f.MetricsAddr, "metrics-address", defaultMetrics, "address of the Prometheus /metrics endpoint (\"0\" disables)")
	fs.StringVar(&f.HealthAddr, "health-probe-bind-address", defaultHealth, "address of /healthz and /readyz (\"0\" disables)")
	fs.StringVar(&f.PprofAddr, "pprof-address", "0", "address of /debug/pprof (\"0\" disables; as upstream)")
	fs.IntVar(&f.Workers, "workers", 16, "concurrent syncs (dispatcher) and applies (applier) per controller in each replica, as upstream's per-controller workers")
	fs.IntVar(&f.MaxInFlight, "max-in-flight", 256, "concurrent syncs (dispatcher) and applies (applier) per replica across controllers; shared fairly when reached")
	fs.DurationVar(&f.DiscoveryInterval, "discovery-interval", 30*time.Second, "how often API discovery is refreshed")
	fs.DurationVar(&f.SnapshotWait, "snapshot-wait", 5*time.Second, "how long a sync waits for fresh observed state before rescheduling itself")
	// Upstream's defaults: one event per object per 5 minutes after a
	// burst of 25.
	fs.Float64Var(&f.EventsQPS, "events-qps", 1.0/300, "per-object Kubernetes Event rate")
	fs.IntVar(&f.EventsBurst, "events-burst", 25, "per-object Kubernetes Event burst")
	fs.StringVar(&f.ApplyStrategy, "apply-strategy", ApplyDynamic, "how children are applied: "+ApplyDynamic+" or "+ApplyServerSide+" (as upstream)")
	fs.StringVar(&f.SSAFieldManager, "apply-strategy-ssa-field-manager", "metacontroller", "field manager of server-side apply (as upstream)")
	fs.StringVar(&f.LeaderElectionResourceLock, "leader-election-resource-lock", LeaseLock, "kind of object holding the leader-election lock; only \""+LeaseLock+"\" (Lease objects) is supported")
}

// Validate refuses values upstream's flags do not take, and those metabus
// does not support, with a message that says what to use instead. Flags a
// stage ignores are not checked (ignores says which).
func (f *CommonFlags) Validate(ignores func(flag string) bool) error {
	var errs []error
	if !ignores("apply-strategy") {
		switch f.ApplyStrategy {
		case ApplyDynamic, ApplyServerSide:
		default:
			errs = append(errs, fmt.Errorf("--apply-strategy=%q: unknown apply strategy (use %q or %q)", f.ApplyStrategy, ApplyDynamic, ApplyServerSide))
		}
	}
	if !ignores("apply-strategy-ssa-field-manager") && f.SSAFieldManager == "" {
		errs = append(errs, errors.New("--apply-strategy-ssa-field-manager must not be empty"))
	}
	if !ignores("leader-election-resource-lock") && f.LeaderElectionResourceLock != LeaseLock {
		errs = append(errs, fmt.Errorf("--leader-election-resource-lock=%q is not supported: metabus holds its leader-election lock in a Lease "+
			"(coordination.k8s.io); use --leader-election-resource-lock=%s, the default, or leave the flag out", f.LeaderElectionResourceLock, LeaseLock))
	}
	return errors.Join(errs...)
}
