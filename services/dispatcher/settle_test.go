package dispatcher

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/nats-io/nats.go/jetstream"
	dto "github.com/prometheus/client_model/go"
	"go.uber.org/zap"
	"k8s.io/client-go/tools/record"

	"github.com/metabus/metabus/pkg/bus"
	"github.com/metabus/metabus/pkg/echo"
	"github.com/metabus/metabus/pkg/events/recorder"
	"github.com/metabus/metabus/pkg/obs"
)

// settledMsg records how a work item was settled; other Msg methods are
// not expected (calling one panics on the nil embedded interface).
type settledMsg struct {
	jetstream.Msg
	log *[]string
}

func (m settledMsg) Ack() error { *m.log = append(*m.log, "ack"); return nil }
func (m settledMsg) NakWithDelay(d time.Duration) error {
	*m.log = append(*m.log, "nak "+d.String())
	return nil
}

// TestSettle: every way a sync ends becomes one metric label and one ack
// or nak, after the tracer's span has closed.
func TestSettle(t *testing.T) {
	item := bus.WorkItem{Controller: bus.ControllerRef{Kind: "CompositeController", Name: "c"},
		Parent: bus.ObjectRef{Namespace: "ns", Name: "p", UID: "u"}, Reason: bus.ReasonEvent}
	type result struct {
		Log      []string
		Label    float64
		Failures int
		// Retries is workqueue_retries_total; InPlace whether the item
		// runs again in place.
		Retries float64
		InPlace bool
	}
	for _, tc := range []struct {
		reason   string
		err      error
		label    string
		failures int // before the sync
		want     result
	}{
		{reason: "a published answer is acked and ends the parent's failures", err: nil, label: "ok", failures: 2,
			want: result{Log: []string{"trace end", "ack"}, Label: 1}},
		{reason: "an echo is acked and ends the parent's failures", err: settled{result: "echo", forget: true}, label: "echo", failures: 2,
			want: result{Log: []string{"trace end", "ack"}, Label: 1}},
		{reason: "an invalid controller is acked, the failures kept", err: settled{result: "invalid"}, label: "invalid", failures: 2,
			want: result{Log: []string{"trace end", "ack"}, Label: 1, Failures: 2}},
		{reason: "an unreachable bus is left for redelivery", err: published("publish desired state", errors.New("timeout")), label: "error",
			want: result{Log: []string{"trace end", "nak 1s"}, Label: 1, Retries: 1, InPlace: true}},
		{reason: "shutting down is left for redelivery", err: cancelled(), label: "cancelled",
			want: result{Log: []string{"trace end", "nak 1s"}, Label: 1}},
	} {
		t.Run(tc.reason, func(t *testing.T) {
			d := &Dispatcher{log: zap.NewNop(), metrics: newMetrics(nil), echoes: echo.NewBook(0),
				rec: &recorder.Recorder{EventRecorder: record.NewFakeRecorder(10)}}
			if tc.failures > 0 {
				d.failures.record(d.failureKey(item), tc.failures, time.Now())
			}
			var log []string
			label, inPlace := d.settle(context.Background(), settledMsg{log: &log}, item, time.Now(), tc.err, func() { log = append(log, "trace end") })
			if label != tc.label {
				t.Errorf("settle returned the label %q, want %q (the inspect record keeps it)", label, tc.label)
			}
			var retries dto.Metric
			queue := obs.QueueName(item.Controller.Kind, item.Controller.Name)
			if err := d.metrics.queues.RetriesCounter(queue).Write(&retries); err != nil {
				t.Fatal(err)
			}
			got := result{Log: log, Label: counterValue(t, d, item.Controller, tc.label),
				Failures: d.failures.get(d.failureKey(item)), Retries: retries.GetCounter().GetValue(), InPlace: inPlace}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("settle (-want +got):\n%s", diff)
			}
		})
	}
}

func counterValue(t *testing.T, d *Dispatcher, ctrl bus.ControllerRef, label string) float64 {
	var m dto.Metric
	if err := d.metrics.syncs.WithLabelValues(ctrl.Kind, ctrl.Name, label).Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}
