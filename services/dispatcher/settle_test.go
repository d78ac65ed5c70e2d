package dispatcher

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	dto "github.com/prometheus/client_model/go"
	"go.uber.org/zap"
	"k8s.io/client-go/tools/record"

	"github.com/metabus/metabus/pkg/bus"
	"github.com/metabus/metabus/pkg/echo"
	"github.com/metabus/metabus/pkg/events/recorder"
	"github.com/metabus/metabus/pkg/obs"
	"github.com/metabus/metabus/pkg/outcome"
)

// TestOutcomeOf: how each way a sync ends, once resolve has done what it
// asks for, becomes the work item's outcome.
func TestOutcomeOf(t *testing.T) {
	down := errors.New("nats: timeout")
	for _, tc := range []struct {
		reason  string
		err     error
		requeue error
		want    outcome.Outcome
	}{
		{reason: "a published answer is done", err: nil, want: outcome.Done()},
		{reason: "a sync settled without an answer (echo, skipped, parent gone) is done", err: settled{result: "echo", forget: true}, want: outcome.Done()},
		{reason: "a failure whose retry was scheduled is done: the retry is a new work item", err: failure(errors.New("hook 500")), want: outcome.Done()},
		{reason: "a quiet failure whose retry was scheduled is done", err: quietFailure(errors.New("snapshot not fresh")), want: outcome.Done()},
		{reason: "an untyped error is a failure: done once its retry is scheduled", err: errors.New("unexpected"), want: outcome.Done()},
		{reason: "a throttled sync scheduled after its Retry-After is done", err: &throttled{after: time.Minute, err: errors.New("429")}, want: outcome.Done()},
		{reason: "a failure whose retry could not be scheduled is retried in place", err: failure(errors.New("hook 500")), requeue: down, want: outcome.Retry(time.Second, 0)},
		{reason: "a throttled sync that could not be scheduled is retried in place", err: &throttled{after: time.Minute, err: errors.New("429")}, requeue: down, want: outcome.Retry(time.Second, 0)},
		{reason: "a failure while shutting down is retried in place (the bus leaves it to the new owner)", err: failure(errors.New("hook 500")), requeue: context.Canceled, want: outcome.Retry(time.Second, 0)},
		{reason: "an unreachable bus is retried in place", err: published("publish desired state", down), want: outcome.Retry(time.Second, 0)},
		{reason: "a cancelled sync is retried in place (the bus leaves it to the new owner)", err: cancelled(), want: outcome.Retry(time.Second, 0)},
	} {
		t.Run(tc.reason, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, outcomeOf(tc.err, tc.requeue)); diff != "" {
				t.Errorf("outcome (-want +got):\n%s", diff)
			}
		})
	}
}

// TestSettle: every way a sync ends becomes one metric label and one
// outcome, after the tracer's span has closed.
func TestSettle(t *testing.T) {
	item := bus.WorkItem{Controller: bus.ControllerRef{Kind: "CompositeController", Name: "c"},
		Parent: bus.ObjectRef{Namespace: "ns", Name: "p", UID: "u"}, Reason: bus.ReasonEvent}
	type result struct {
		Log      []string
		Outcome  outcome.Outcome
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
			want: result{Log: []string{"trace end"}, Outcome: outcome.Done(), Label: 1}},
		{reason: "an echo is acked and ends the parent's failures", err: settled{result: "echo", forget: true}, label: "echo", failures: 2,
			want: result{Log: []string{"trace end"}, Outcome: outcome.Done(), Label: 1}},
		{reason: "an invalid controller is acked, the failures kept", err: settled{result: "invalid"}, label: "invalid", failures: 2,
			want: result{Log: []string{"trace end"}, Outcome: outcome.Done(), Label: 1, Failures: 2}},
		{reason: "an unreachable bus is retried in place", err: published("publish desired state", errors.New("timeout")), label: "error",
			want: result{Log: []string{"trace end"}, Outcome: outcome.Retry(time.Second, 0), Label: 1, Retries: 1, InPlace: true}},
		{reason: "shutting down is retried, which the bus leaves to the new owner: no in-place retry counted", err: cancelled(), label: "cancelled",
			want: result{Log: []string{"trace end"}, Outcome: outcome.Retry(time.Second, 0), Label: 1}},
	} {
		t.Run(tc.reason, func(t *testing.T) {
			d := &Dispatcher{log: zap.NewNop(), metrics: newMetrics(nil), echoes: echo.NewBook(0),
				rec: &recorder.Recorder{EventRecorder: record.NewFakeRecorder(10)}}
			if tc.failures > 0 {
				d.failures.record(d.failureKey(item), tc.failures, time.Now())
			}
			var log []string
			label, out, inPlace := d.settle(context.Background(), item, time.Now(), tc.err, func() { log = append(log, "trace end") })
			if label != tc.label {
				t.Errorf("settle returned the label %q, want %q (the inspect record keeps it)", label, tc.label)
			}
			var retries dto.Metric
			queue := obs.QueueName(item.Controller.Kind, item.Controller.Name)
			if err := d.metrics.queues.RetriesCounter(queue).Write(&retries); err != nil {
				t.Fatal(err)
			}
			got := result{Log: log, Outcome: out, Label: counterValue(t, d, item.Controller, tc.label),
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
