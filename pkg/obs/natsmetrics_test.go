package obs

import (
	"fmt"
	"sort"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/metabus/metabus/pkg/ownership"
)

// fakeConn is a NATS connection as the metrics read it.
type fakeConn struct {
	connected bool
	version   string
}

func (c fakeConn) IsConnected() bool { return c.connected }
func (c fakeConn) ConnectedServerVersion() string {
	if !c.connected {
		return ""
	}
	return c.version
}

// gathered is every sample of reg, as "name{label=value,...} value".
func gathered(t *testing.T, reg *prometheus.Registry) []string {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			var ls []string
			for _, l := range m.GetLabel() {
				ls = append(ls, l.GetName()+"="+l.GetValue())
			}
			v := m.GetGauge().GetValue() + m.GetCounter().GetValue()
			out = append(out, fmt.Sprintf("%s{%s} %g", mf.GetName(), strings.Join(ls, ","), v))
		}
	}
	sort.Strings(out)
	return out
}

func TestRegisterNATS(t *testing.T) {
	for _, tc := range []struct {
		reason string
		conn   fakeConn
		want   []string
	}{
		{reason: "the tested release resets consumers", conn: fakeConn{connected: true, version: "2.15.2"}, want: []string{
			"metabus_nats_connected{service=applier} 1",
			"metabus_nats_consumer_reset_supported{service=applier} 1",
			"metabus_nats_server_info{service=applier,version=2.15.2} 1",
		}},
		{reason: "the minimum resets consumers", conn: fakeConn{connected: true, version: "2.14.0"}, want: []string{
			"metabus_nats_connected{service=applier} 1",
			"metabus_nats_consumer_reset_supported{service=applier} 1",
			"metabus_nats_server_info{service=applier,version=2.14.0} 1",
		}},
		{reason: "a 2.12 server does not", conn: fakeConn{connected: true, version: "2.12.15"}, want: []string{
			"metabus_nats_connected{service=applier} 1",
			"metabus_nats_consumer_reset_supported{service=applier} 0",
			"metabus_nats_server_info{service=applier,version=2.12.15} 1",
		}},
		{reason: "a version that does not parse is not taken as able", conn: fakeConn{connected: true, version: "banana"}, want: []string{
			"metabus_nats_connected{service=applier} 1",
			"metabus_nats_consumer_reset_supported{service=applier} 0",
			"metabus_nats_server_info{service=applier,version=banana} 1",
		}},
		{reason: "disconnected: no server to describe", conn: fakeConn{version: "2.15.2"}, want: []string{
			"metabus_nats_connected{service=applier} 0",
		}},
	} {
		t.Run(tc.reason, func(t *testing.T) {
			reg := prometheus.NewPedanticRegistry()
			if err := RegisterNATS(reg, "applier", tc.conn); err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, gathered(t, reg)); diff != "" {
				t.Errorf("samples (-want +got):\n%s", diff)
			}
		})
	}
}

// The services of one process share a registry: each has its own series.
func TestRegisterNATSSharedRegistry(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	for _, svc := range []string{"applier", "dispatcher", "applier"} {
		if err := RegisterNATS(reg, svc, fakeConn{connected: true, version: "2.15.2"}); err != nil {
			t.Fatalf("%s: %v", svc, err)
		}
	}
	if got := len(gathered(t, reg)); got != 6 {
		t.Errorf("%d samples, want 3 per service:\n%s", got, strings.Join(gathered(t, reg), "\n"))
	}
}

func TestPartitionMetricsResetFailures(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	m, err := NewPartitionMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	m.ConsumerResetFailed("desired", "unsupported")
	m.ConsumerResetFailed("desired", "unsupported")
	m.ConsumerResetFailed("work", "no_answer")
	want := []string{
		"metabus_bus_consumer_reset_failures_total{reason=no_answer,stage=work} 1",
		"metabus_bus_consumer_reset_failures_total{reason=unsupported,stage=desired} 2",
	}
	if diff := cmp.Diff(want, gathered(t, reg)); diff != "" {
		t.Errorf("samples (-want +got):\n%s", diff)
	}
}

func TestConsumerErrors(t *testing.T) {
	core, logs := observer.New(zapcore.DebugLevel)
	onError := ConsumerErrors(zap.New(core), "work consumer")
	onError(fmt.Errorf("reset consumer MC_WORK/p1: %w", ownership.ErrCannotReset))
	onError(fmt.Errorf("consume MC_WORK partition p1: timeout"))
	var got []string
	for _, e := range logs.All() {
		got = append(got, e.Level.String()+" "+e.Message)
	}
	want := []string{"error work consumer: partition handovers degraded", "warn work consumer"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("logged (-want +got):\n%s", diff)
	}
}
