// Package cli holds the flags every metabus service shares (Kubernetes
// client, NATS connection, logging, metrics and probes) and turns them into
// clients, so that each service's main stays a few lines: flags, then Run.
package cli

import (
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
	QPS        float64
	Burst      int
}

// Register adds --kubeconfig, --client-go-qps and --client-go-burst.
func (f *KubeFlags) Register(fs *flag.FlagSet) {
	fs.StringVar(&f.Kubeconfig, "kubeconfig", "", "path to a kubeconfig (default: in-cluster, then $KUBECONFIG, then ~/.kube/config)")
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

// Config builds the REST config.
func (f *KubeFlags) Config() (*rest.Config, error) {
	var cfg *rest.Config
	var err error
	if f.Kubeconfig != "" {
		cfg, err = clientcmd.BuildConfigFromFlags("", f.Kubeconfig)
	} else if cfg, err = rest.InClusterConfig(); err != nil {
		rules := clientcmd.NewDefaultClientConfigLoadingRules()
		cfg, err = clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{}).ClientConfig()
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

// CommonFlags are the flags of every service.
type CommonFlags struct {
	Kube        KubeFlags
	NATS        NATSFlags
	Log         obs.LogFlags
	MetricsAddr string
	HealthAddr  string
	PprofAddr   string

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
}
