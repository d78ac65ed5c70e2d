package applier

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/tools/record"

	"github.com/metabus/metabus/pkg/apply"
	"github.com/metabus/metabus/pkg/bus"
	"github.com/metabus/metabus/pkg/echo"
	"github.com/metabus/metabus/pkg/events"
	"github.com/metabus/metabus/pkg/events/recorder"
	busoutcome "github.com/metabus/metabus/pkg/outcome"
)

// schedules records the work items scheduled, as "reason attempt in
// [after] [key]".
type schedules struct {
	items []string
	err   error
}

func (s *schedules) Schedule(_ context.Context, item bus.WorkItem, at time.Time) error {
	if s.err != nil {
		return s.err
	}
	in := time.Until(at).Round(time.Second)
	entry := fmt.Sprintf("%s attempt=%d in=%s", item.Reason, item.Attempt, in)
	if item.AfterSeq > 0 {
		entry += fmt.Sprintf(" after=%d", item.AfterSeq)
	}
	if item.MapKey != "" {
		entry += " key=" + item.MapKey
	}
	s.items = append(s.items, entry)
	return nil
}

// TestOutcomeOf: how each way an apply ends, once settle has done what it
// asks for, becomes the desired state's outcome.
func TestOutcomeOf(t *testing.T) {
	down := errors.New("nats: timeout")
	for _, tc := range []struct {
		reason  string
		err     error
		requeue error
		want    busoutcome.Outcome
	}{
		{reason: "applied: done", err: nil, want: busoutcome.Done()},
		{reason: "ended without a write (noop, superseded, notfound...): done", err: done(resultNoop), want: busoutcome.Done()},
		{reason: "ended, whatever a requeue says (none was owed): done", err: done(resultFinalized), requeue: down, want: busoutcome.Done()},
		{reason: "a conflict whose sync is scheduled: done, the sync is the retry", err: &requeueError{attempt: 1}, want: busoutcome.Done()},
		{reason: "a failure whose sync is scheduled with backoff: done", err: retryAfter(events.ReasonApplyError, errors.New("boom")), want: busoutcome.Done()},
		{reason: "an untyped failure whose sync is scheduled: done", err: errors.New("boom"), want: busoutcome.Done()},
		{reason: "a conflict whose sync could not be scheduled: retried in place", err: &requeueError{attempt: 1}, requeue: down, want: busoutcome.Retry(time.Second, 0)},
		{reason: "a failure whose sync could not be scheduled: retried in place", err: retryAfter("", errors.New("boom")), requeue: down, want: busoutcome.Retry(time.Second, 0)},
		{reason: "a failure while shutting down: retried (the bus leaves it to the new owner)", err: errors.New("boom"), requeue: context.Canceled, want: busoutcome.Retry(time.Second, 0)},
	} {
		t.Run(tc.reason, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, outcomeOf(tc.err, tc.requeue)); diff != "" {
				t.Errorf("outcome (-want +got):\n%s", diff)
			}
		})
	}
}

func TestSettle(t *testing.T) {
	forbidden := apierrors.NewForbidden(schema.GroupResource{Resource: "configmaps"}, "a",
		errors.New(`User "system:serviceaccount:metabus:applier" cannot create resource "configmaps" in API group "" in the namespace "ns"`))
	forbidden.ErrStatus.Message = `configmaps "a" is forbidden: User "system:serviceaccount:metabus:applier" cannot create resource "configmaps" in API group "" in the namespace "ns"`
	tests := []struct {
		reason    string
		err       error
		cancelled bool
		schedErr  error
		inputs    bool
		want      string // result label
		wantOut   busoutcome.Outcome
		wantSched []string
		wantEvent string // reason of the Event, "" none
		wantNote  bool
	}{
		{reason: "applied: ack, and the applied note", err: nil, inputs: true, want: "ok", wantOut: busoutcome.Done(), wantNote: true},
		{reason: "no-op: ack, and the applied note", err: done(resultNoop), inputs: true, want: "noop", wantOut: busoutcome.Done(), wantNote: true},
		{reason: "finalized: ack without a note", err: done(resultFinalized), inputs: true, want: "finalized", wantOut: busoutcome.Done()},
		{reason: "parent gone: ack", err: done(resultNotFound), want: "notfound", wantOut: busoutcome.Done()},
		{reason: "superseded: ack", err: done(resultSuperseded), inputs: true, want: "superseded", wantOut: busoutcome.Done()},
		{
			reason: "conflict: sync again now through the schedule, keeping the attempt and naming the sync it repeats",
			err:    &requeueError{attempt: 2}, want: "conflict", wantOut: busoutcome.Done(),
			wantSched: []string{"conflict attempt=2 in=0s after=7"},
		},
		{
			reason: "apply error with a reason: Event, and backoff from the attempt",
			err:    retryAfter(events.ReasonApplyError, errors.New("boom")), want: "error", wantOut: busoutcome.Done(),
			wantSched: []string{"retry attempt=2 in=2s"}, wantEvent: events.ReasonApplyError,
		},
		{
			reason: "transient failure without a reason: no Event, still the backoff",
			err:    retryAfter("", errors.New("not fresh")), want: "error", wantOut: busoutcome.Done(),
			wantSched: []string{"retry attempt=2 in=2s"},
		},
		{
			reason: "RBAC refused a write: ApplyForbidden, with the longer backoff",
			err:    retryAfter(events.ReasonApplyError, fmt.Errorf("create ConfigMap ns/a: %w", forbidden)), want: "error", wantOut: busoutcome.Done(),
			wantSched: []string{"retry attempt=2 in=2m0s"}, wantEvent: events.ReasonApplyForbidden,
		},
		{
			reason: "failure while shutting down: retried (by another replica, the lease being lost), nothing scheduled",
			err:    retryAfter(events.ReasonApplyError, errors.New("boom")), cancelled: true, want: "cancelled", wantOut: busoutcome.Retry(time.Second, 0),
		},
		{
			reason: "the retry cannot be scheduled: retried in place, so the message comes back",
			err:    retryAfter("", errors.New("boom")), schedErr: errors.New("nats down"), want: "error", wantOut: busoutcome.Retry(time.Second, 0),
			wantSched: nil,
		},
		{
			reason: "the requeue cannot be scheduled: retried in place",
			err:    &requeueError{attempt: 1}, schedErr: errors.New("nats down"), want: "conflict", wantOut: busoutcome.Retry(time.Second, 0),
		},
	}
	for _, tt := range tests {
		t.Run(tt.reason, func(t *testing.T) {
			fake := record.NewFakeRecorder(4)
			sched := &schedules{err: tt.schedErr}
			reg := prometheus.NewRegistry()
			book := echo.NewBook(16)
			a := &Applier{log: zap.NewNop(), metrics: newMetrics(reg), sched: sched,
				rec: &recorder.Recorder{EventRecorder: fake}, echoes: book}
			ds := &bus.DesiredState{
				Controller: bus.ControllerRef{Kind: "CompositeController", Name: "things", UID: "cc-uid"},
				Parent:     bus.ObjectRef{APIVersion: "example.com/v1", Kind: "Thing", Resource: "things", Namespace: "ns", Name: "web", UID: "p-uid"},
				Attempt:    1, WorkSeq: 7,
			}
			if tt.inputs {
				ds.Inputs = map[string]string{"p-uid": "41"}
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			if tt.cancelled {
				cancel()
			}
			book.Expect(ds.Controller.ID(), ds.Parent.UID, ds.MapKey, ds.WorkSeq)
			out := a.settle(ctx, ds, &writeLog{}, time.Now(), tt.err)
			// Every Done outcome ends the dispatcher's wait for it; a
			// retry leaves it to the next run.
			if ended := book.Applying(ds.Controller.ID(), ds.Parent.UID, ds.MapKey) == nil; ended != (tt.wantOut == busoutcome.Done()) {
				t.Errorf("Done note recorded: %v, want %v", ended, tt.wantOut == busoutcome.Done())
			}

			if diff := cmp.Diff(tt.wantOut, out); diff != "" {
				t.Errorf("outcome (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tt.wantSched, sched.items); diff != "" {
				t.Errorf("schedules (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(map[string]float64{tt.want: 1}, results(t, reg)); diff != "" {
				t.Errorf("applies by result (-want +got):\n%s", diff)
			}
			var event string
			select {
			case e := <-fake.Events:
				event = e
			default:
			}
			if tt.wantEvent == "" && event != "" {
				t.Errorf("unexpected Event %q", event)
			}
			if tt.wantEvent != "" && !strings.Contains(event, tt.wantEvent) {
				t.Errorf("Event %q, want reason %s", event, tt.wantEvent)
			}
			noted := book.Echo(ds.Controller.ID(), ds.Parent.UID, ds.MapKey, map[string]string{"p-uid": "41"})
			if noted != tt.wantNote {
				t.Errorf("applied note recorded: %v, want %v", noted, tt.wantNote)
			}
		})
	}
}

// results reads metabus_applier_applies_total by result.
func results(t *testing.T, reg *prometheus.Registry) map[string]float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() != "metabus_applier_applies_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "result" {
					out[l.GetValue()] += m.GetCounter().GetValue()
				}
			}
		}
	}
	return out
}

// TestNoteDone: the Done note carries the applier's strategy and what the
// apply wrote per resource whatever the opt-in, but lists the writes themselves (which watchers
// drop as echoes) only for a desired state that lists its inputs.
func TestNoteDone(t *testing.T) {
	for _, optedIn := range []bool{false, true} {
		t.Run(fmt.Sprintf("echo suppression %v", optedIn), func(t *testing.T) {
			book := echo.NewBook(16)
			a := &Applier{log: zap.NewNop(), echoes: book, cfg: Config{Strategy: apply.ServerSideApply}}
			ds := &bus.DesiredState{
				Controller: bus.ControllerRef{Kind: "CompositeController", Name: "things"},
				Parent:     bus.ObjectRef{APIVersion: "example.com/v1", Resource: "things", UID: "p-uid"}, WorkSeq: 3,
			}
			if optedIn {
				ds.Inputs = map[string]string{"p-uid": "41"}
			}
			wl := &writeLog{}
			ctx := withWriteLog(context.Background(), wl)
			noteCreated(ctx, "/configmaps", written{UID: "cm", ResourceVersion: "50"})
			noteCreated(ctx, "/configmaps", written{UID: "cm2", ResourceVersion: "49"})
			parent := &unstructured.Unstructured{Object: map[string]any{}}
			parent.SetUID("p-uid")
			parent.SetResourceVersion("41")
			out := parent.DeepCopy()
			out.SetResourceVersion("51")
			startWrite(ctx, "example.com/things", parent)(out)
			book.Expect(ds.Controller.ID(), "p-uid", "", 3)
			a.noteDone(ds, wl, true)
			want := map[string]string{"/configmaps": "50", "example.com/things": "51"}
			if diff := cmp.Diff(want, book.Written(ds.Controller.ID(), "p-uid", "")); diff != "" {
				t.Errorf("written (-want +got):\n%s", diff)
			}
			if got := book.Wrote(ds.Controller.ID(), "p-uid", "51"); got != optedIn {
				t.Errorf("the status write is known as this controller's: %v, want %v", got, optedIn)
			}
			// The note says which strategy applied it: a separate
			// dispatcher judges answers that would write nothing by it.
			if got, ok := book.ApplierStrategy(); got != string(apply.ServerSideApply) || !ok {
				t.Errorf("the book learned the appliers' strategy %q (%v), want %q", got, ok, apply.ServerSideApply)
			}
		})
	}
}
