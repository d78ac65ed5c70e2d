package obs

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	clientmetrics "k8s.io/client-go/tools/metrics"
)

// Register registers c with reg, or returns the collector already
// registered there under the same description, so that the services of
// one process (the all-in-one binary) share one registry and their
// metrics. A conflicting registration (same name, other labels or type)
// is an error; callers keep counting into c, unregistered, because
// metrics must never stop the work they measure.
func Register[T prometheus.Collector](reg prometheus.Registerer, c T) (T, error) {
	if reg == nil {
		return c, nil
	}
	err := reg.Register(c)
	if err == nil {
		return c, nil
	}
	var are prometheus.AlreadyRegisteredError
	if errors.As(err, &are) {
		if existing, ok := are.ExistingCollector.(T); ok {
			return existing, nil
		}
	}
	return c, fmt.Errorf("register metrics: %w", err)
}

// MustRegister is Register for the process's own fixed metric families,
// where a conflict is a programming error.
func MustRegister[T prometheus.Collector](reg prometheus.Registerer, c T) T {
	c, err := Register(reg, c)
	if err != nil {
		panic(err)
	}
	return c
}

// restClientRequests is client-go's request counter as controller-runtime
// v0.24 exposes it (pkg/metrics/client_go_adapter.go), which upstream
// Metacontroller serves: rest_client_requests_total{code,method,host}.
// client-go reports every request attempt to one process-wide hook, so the
// counter is process-wide too: registries of the same process (tests run
// several metabus instances in one) all show the same figures.
var restClientRequests = prometheus.NewCounterVec(prometheus.CounterOpts{
	Name: "rest_client_requests_total",
	Help: "Kubernetes API requests by status code (or <error>), method and host, as client-go reports them.",
}, []string{"code", "method", "host"})

var installRESTClientMetrics sync.Once

type restResult struct{}

func (restResult) Increment(_ context.Context, code, method, host string) {
	restClientRequests.WithLabelValues(code, method, host).Inc()
}

// RegisterRESTClientMetrics makes client-go count every API request into
// rest_client_requests_total and adds that counter to reg. client-go takes
// the first hook installed in a process and ignores later ones.
func RegisterRESTClientMetrics(reg prometheus.Registerer) error {
	installRESTClientMetrics.Do(func() {
		clientmetrics.Register(clientmetrics.RegisterOpts{RequestResult: restResult{}})
	})
	_, err := Register(reg, restClientRequests)
	return err
}

// LeaderMetrics is leader_election_master_status{name}, as
// controller-runtime v0.24 registers it for client-go's leader election
// (pkg/metrics/leaderelection.go): 1 while this process holds the Lease
// called name, 0 once it lost it. Like upstream, a replica that never led
// has no series.
type LeaderMetrics struct{ status *prometheus.GaugeVec }

// NewLeaderMetrics registers the gauge with reg (nil: records nothing).
func NewLeaderMetrics(reg prometheus.Registerer) (*LeaderMetrics, error) {
	g, err := Register(reg, prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "leader_election_master_status",
		Help: "1 while this process holds the named leader-election Lease, 0 after it lost it.",
	}, []string{"name"}))
	return &LeaderMetrics{status: g}, err
}

// Leading records that this process leads (or no longer leads) name.
func (m *LeaderMetrics) Leading(name string, leading bool) {
	if m == nil {
		return
	}
	v := 0.0
	if leading {
		v = 1
	}
	m.status.WithLabelValues(name).Set(v)
}

// RegisterNATSConnected adds metabus_nats_connected{service}: 1 while the
// service's NATS connection is up, 0 while it is down or reconnecting.
// The "NATS unreachable" alert watches it.
func RegisterNATSConnected(reg prometheus.Registerer, service string, connected func() bool) error {
	_, err := Register(reg, prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name:        "metabus_nats_connected",
		Help:        "1 while this service's NATS connection is up, 0 while it is down or reconnecting.",
		ConstLabels: prometheus.Labels{"service": service},
	}, func() float64 {
		if connected() {
			return 1
		}
		return 0
	}))
	return err
}

// PartitionMetrics count this replica's partition ownership (the bus's
// lease-based assignment of partition consumers to replicas): how many
// partitions it consumes, and every claim, hand-back and loss. They
// implement jsbus.OwnershipObserver.
type PartitionMetrics struct {
	held     *prometheus.GaugeVec
	claims   *prometheus.CounterVec
	releases *prometheus.CounterVec
}

// NewPartitionMetrics registers the partition ownership metrics with reg
// (nil: none are exported, the methods still work).
func NewPartitionMetrics(reg prometheus.Registerer) (*PartitionMetrics, error) {
	var errs []error
	m := &PartitionMetrics{}
	var err error
	m.held, err = Register(reg, prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "metabus_bus_partitions_held",
		Help: "Partitions of a stage this replica consumes (holds the lease of).",
	}, []string{"stage"}))
	errs = append(errs, err)
	m.claims, err = Register(reg, prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "metabus_bus_partition_claims_total",
		Help: "Partitions this replica took over (claimed their lease).",
	}, []string{"stage"}))
	errs = append(errs, err)
	m.releases, err = Register(reg, prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "metabus_bus_partition_releases_total",
		Help: "Partitions this replica stopped consuming, by reason: handed_back (rebalance, shutdown, partition-count change) or lost (lease not renewed in time).",
	}, []string{"stage", "reason"}))
	errs = append(errs, err)
	return m, errors.Join(errs...)
}

// PartitionClaimed implements jsbus.OwnershipObserver.
func (m *PartitionMetrics) PartitionClaimed(stage string) {
	if m == nil {
		return
	}
	m.held.WithLabelValues(stage).Inc()
	m.claims.WithLabelValues(stage).Inc()
}

// PartitionReleased implements jsbus.OwnershipObserver.
func (m *PartitionMetrics) PartitionReleased(stage string, lost bool) {
	if m == nil {
		return
	}
	reason := "handed_back"
	if lost {
		reason = "lost"
	}
	m.held.WithLabelValues(stage).Dec()
	m.releases.WithLabelValues(stage, reason).Inc()
}
