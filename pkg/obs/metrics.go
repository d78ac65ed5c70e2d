package obs

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	clientmetrics "k8s.io/client-go/tools/metrics"

	"github.com/metabus/metabus/pkg/natsx"
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

// NATSConn is what the NATS metrics read of a connection (*nats.Conn).
type NATSConn interface {
	IsConnected() bool
	// ConnectedServerVersion is the version the server announced, "" while
	// not connected.
	ConnectedServerVersion() string
}

// RegisterNATS adds a service's NATS connection metrics:
//
//   - metabus_nats_connected{service}: 1 while the connection is up, 0
//     while it is down or reconnecting (the "NATS unreachable" alert);
//   - metabus_nats_server_info{service,version}: 1, labelled with the
//     version of the server connected to (no series while disconnected);
//   - metabus_nats_consumer_reset_supported{service}: 1 if that server can
//     reset consumers (natsx.MinResetVersion or later), 0 if not, so that
//     every partition handover waits and redelivers (the
//     MetabusNATSConsumerResetUnsupported alert; no series while
//     disconnected).
//
// They are read at each scrape, so a reconnection to a server of another
// release (a rolling upgrade) shows at once.
func RegisterNATS(reg prometheus.Registerer, service string, nc NATSConn) error {
	_, err := Register(reg, prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name:        "metabus_nats_connected",
		Help:        "1 while this service's NATS connection is up, 0 while it is down or reconnecting.",
		ConstLabels: prometheus.Labels{"service": service},
	}, func() float64 {
		if nc.IsConnected() {
			return 1
		}
		return 0
	}))
	_, serr := Register(reg, &natsServerCollector{nc: nc, labels: prometheus.Labels{"service": service}})
	return errors.Join(err, serr)
}

// natsServerCollector exports the connected server's version and whether
// it can reset consumers.
type natsServerCollector struct {
	nc     NATSConn
	labels prometheus.Labels
}

func (c *natsServerCollector) descs() (info, reset *prometheus.Desc) {
	info = prometheus.NewDesc("metabus_nats_server_info",
		"1, labelled with the version of the NATS server this service is connected to (no series while disconnected).",
		[]string{"version"}, c.labels)
	reset = prometheus.NewDesc("metabus_nats_consumer_reset_supported",
		"1 if the NATS server this service is connected to can reset consumers (nats-server "+natsx.MinResetVersion+
			" or later), 0 if not: then every partition handover waits for the reset to time out and redelivers what was pending.",
		nil, c.labels)
	return info, reset
}

// Describe implements prometheus.Collector.
func (c *natsServerCollector) Describe(ch chan<- *prometheus.Desc) {
	info, reset := c.descs()
	ch <- info
	ch <- reset
}

// Collect implements prometheus.Collector.
func (c *natsServerCollector) Collect(ch chan<- prometheus.Metric) {
	v := c.nc.ConnectedServerVersion()
	if v == "" {
		return
	}
	info, reset := c.descs()
	ch <- prometheus.MustNewConstMetric(info, prometheus.GaugeValue, 1, v)
	supported := 0.0
	if ok, _ := natsx.ConsumerResetSupported(v); ok {
		supported = 1
	}
	ch <- prometheus.MustNewConstMetric(reset, prometheus.GaugeValue, supported)
}

// PartitionMetrics count this replica's partition ownership (the bus's
// lease-based assignment of partition consumers to replicas): how many
// partitions it consumes, and every claim, hand-back and loss. They
// implement jsbus.OwnershipObserver.
type PartitionMetrics struct {
	held        *prometheus.GaugeVec
	claims      *prometheus.CounterVec
	releases    *prometheus.CounterVec
	resetFailed *prometheus.CounterVec
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
	m.resetFailed, err = Register(reg, prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "metabus_bus_consumer_reset_failures_total",
		Help: "Consumer resets at a partition handover that failed, by reason: unsupported (the NATS server, before " + natsx.MinResetVersion +
			", or the user's permissions cannot reset: the handover redelivers after AckWait), no_answer or error (tried again).",
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

// ConsumerResetFailed implements jsbus.OwnershipObserver.
func (m *PartitionMetrics) ConsumerResetFailed(stage, reason string) {
	if m == nil {
		return
	}
	m.resetFailed.WithLabelValues(stage, reason).Inc()
}
