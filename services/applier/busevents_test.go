package applier

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/tools/record"

	"github.com/metabus/metabus/internal/testing/natstest"
	"github.com/metabus/metabus/pkg/bus"
	"github.com/metabus/metabus/pkg/events"
	"github.com/metabus/metabus/pkg/events/recorder"
)

// TestSettlePublishesBusEvents: with --bus-events, settling a desired
// state publishes its desired-state event and an applied event with the
// outcome and the children the write log recorded; a nak (shutdown)
// publishes nothing, as does an applier without the flag.
func TestSettlePublishesBusEvents(t *testing.T) {
	nc, _ := natstest.Start(t)
	cm := func(name string) *unstructured.Unstructured {
		return &unstructured.Unstructured{Object: map[string]any{"apiVersion": "v1", "kind": "ConfigMap",
			"metadata": map[string]any{"namespace": "ns", "name": name}}}
	}
	tests := []struct {
		reason    string
		off       bool
		err       error
		cancelled bool
		writes    func(ctx context.Context)
		want      *bus.AppliedEvent // nil: nothing published
	}{
		{reason: "applied: what was created, updated and deleted, and the status", writes: func(ctx context.Context) {
			noteChange(ctx, changeCreated, cm("a"), "uid-a", "11")
			noteChange(ctx, changeUpdated, cm("b"), "uid-b", "12")
			noteChange(ctx, changeDeleted, cm("c"), "", "")
			noteStatusWritten(ctx)
		}, want: &bus.AppliedEvent{Outcome: bus.OutcomeApplied, StatusWritten: true,
			Created: []bus.ChildChange{{APIVersion: "v1", Kind: "ConfigMap", Namespace: "ns", Name: "a", UID: "uid-a", ResourceVersion: "11"}},
			Updated: []bus.ChildChange{{APIVersion: "v1", Kind: "ConfigMap", Namespace: "ns", Name: "b", UID: "uid-b", ResourceVersion: "12"}},
			Deleted: []bus.ChildChange{{APIVersion: "v1", Kind: "ConfigMap", Namespace: "ns", Name: "c"}}}},
		{reason: "nothing to do: unchanged", err: done(resultNoop), want: &bus.AppliedEvent{Outcome: bus.OutcomeUnchanged}},
		{reason: "superseded: skipped, with why", err: done(resultSuperseded), want: &bus.AppliedEvent{Outcome: bus.OutcomeSkipped, Reason: "superseded"}},
		{reason: "a conflict: requeued, with the error", err: &requeueError{attempt: 1},
			want: &bus.AppliedEvent{Outcome: bus.OutcomeConflict, Reason: "conflict", Message: (&requeueError{}).Error()}},
		{reason: "a failure: its Event reason and message, and what was written before it", err: retryAfter(events.ReasonApplyError, errors.New("boom")),
			writes: func(ctx context.Context) { noteChange(ctx, changeCreated, cm("a"), "uid-a", "11") },
			want: &bus.AppliedEvent{Outcome: bus.OutcomeFailed, Reason: events.ReasonApplyError, Message: "boom",
				Created: []bus.ChildChange{{APIVersion: "v1", Kind: "ConfigMap", Namespace: "ns", Name: "a", UID: "uid-a", ResourceVersion: "11"}}}},
		{reason: "shutting down: retried, no event (the redelivery settles it)", err: retryAfter("", errors.New("boom")), cancelled: true},
		{reason: "without --bus-events: nothing", off: true},
	}
	for i, tt := range tests {
		t.Run(tt.reason, func(t *testing.T) {
			sub, err := nc.SubscribeSync(bus.EventsRoot + ".>")
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = sub.Unsubscribe() }()
			a := &Applier{log: zap.NewNop(), metrics: newMetrics(prometheus.NewRegistry()), sched: &schedules{},
				rec: &recorder.Recorder{EventRecorder: record.NewFakeRecorder(4)}, nc: nc, cfg: Config{BusEvents: !tt.off}}
			ds := &bus.DesiredState{
				Controller: bus.ControllerRef{Kind: "CompositeController", Name: "things", UID: "cc-uid"},
				Parent:     bus.ObjectRef{APIVersion: "example.com/v1", Kind: "Thing", Resource: "things", Namespace: "ns", Name: "web", UID: "p-uid"},
				Attempt:    1, WorkSeq: uint64(100 + i), Hook: bus.HookSync,
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			wl := a.newWriteLog(ds)
			if tt.writes != nil {
				tt.writes(withWriteLog(ctx, wl))
			}
			if tt.cancelled {
				cancel()
			}
			a.settle(ctx, ds, wl, time.Now(), tt.err)
			if err := nc.Flush(); err != nil {
				t.Fatal(err)
			}
			var got *bus.AppliedEvent
			kinds := map[string]int{}
			for {
				m, err := sub.NextMsg(200 * time.Millisecond)
				if err != nil {
					break
				}
				kinds[m.Header.Get("ce-type")]++
				if m.Header.Get("ce-type") == bus.TypeApplied {
					got = &bus.AppliedEvent{}
					if err := json.Unmarshal(m.Data, got); err != nil {
						t.Fatal(err)
					}
				}
			}
			if tt.want == nil {
				if len(kinds) != 0 {
					t.Errorf("published %v, want nothing", kinds)
				}
				return
			}
			if diff := cmp.Diff(map[string]int{bus.TypeDesired: 1, bus.TypeApplied: 1}, kinds); diff != "" {
				t.Errorf("events by type (-want +got):\n%s", diff)
			}
			if got == nil {
				return
			}
			if got.WorkSeq != ds.WorkSeq || got.Parent.UID != "p-uid" || got.Hook != bus.HookSync || got.AppliedAt.IsZero() {
				t.Errorf("applied event of seq %d, parent %q, hook %q, at %v", got.WorkSeq, got.Parent.UID, got.Hook, got.AppliedAt)
			}
			ignore := cmpopts.IgnoreFields(bus.AppliedEvent{}, "Controller", "Parent", "WorkSeq", "Hook", "ProducedAt", "AppliedAt")
			if diff := cmp.Diff(tt.want, got, ignore); diff != "" {
				t.Errorf("applied event (-want +got):\n%s", diff)
			}
		})
	}
}
