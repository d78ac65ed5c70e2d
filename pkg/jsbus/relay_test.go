package jsbus

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/metabus/metabus/pkg/bus"
)

// TestRelayLeavesNoDueMessages (issue 13 #13): MC_SCHED kept every fired
// mc.due.<ctrl>.<uid> message forever, one per parent ever scheduled. The
// relay must remove what it has relayed (or cannot ever relay), while a
// schedule that has not fired yet stays.
func TestRelayLeavesNoDueMessages(t *testing.T) {
	cases := []struct {
		reason string
		// prepare stores what the relay meets and returns the subjects that
		// must be empty and the ones that must still hold a message.
		prepare    func(t *testing.T, ctx context.Context, js jetstream.JetStream) (gone, kept []string)
		wantWorkOf string // parent UID expected in MC_WORK
	}{
		{
			reason: "a fired schedule's due message is deleted once relayed",
			prepare: func(t *testing.T, ctx context.Context, js jetstream.JetStream) ([]string, []string) {
				it := item("due", "due-0000-fired")
				if err := (Publisher{JS: js}).Schedule(ctx, it, time.Now()); err != nil {
					t.Fatal(err)
				}
				return []string{dueSubject(t, it), schedSubject(t, it)}, nil
			},
			wantWorkOf: "due-0000-fired",
		},
		{
			reason: "a malformed due message is deleted, not kept forever",
			prepare: func(t *testing.T, ctx context.Context, js jetstream.JetStream) ([]string, []string) {
				it := item("due", "due-0000-garbage")
				subj := dueSubject(t, it)
				if _, err := js.Publish(ctx, subj, []byte("not a work item")); err != nil {
					t.Fatal(err)
				}
				return []string{subj}, nil
			},
		},
		{
			reason: "a schedule that has not fired stays until it does",
			prepare: func(t *testing.T, ctx context.Context, js jetstream.JetStream) ([]string, []string) {
				later := item("due", "due-0000-later")
				if err := (Publisher{JS: js}).Schedule(ctx, later, time.Now().Add(time.Hour)); err != nil {
					t.Fatal(err)
				}
				now := item("due", "due-0000-now")
				if err := (Publisher{JS: js}).Schedule(ctx, now, time.Now()); err != nil {
					t.Fatal(err)
				}
				return []string{dueSubject(t, now), dueSubject(t, later)}, []string{schedSubject(t, later)}
			},
			wantWorkOf: "due-0000-now",
		},
	}
	for _, tc := range cases {
		t.Run(tc.reason, func(t *testing.T) {
			js := startBus(t, bus.Options{})
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			gone, kept := tc.prepare(t, ctx, js)
			rctx, rcancel := context.WithCancel(ctx)
			defer rcancel()
			go func() {
				_ = RunRelay(rctx, js, func(err error) {
					if rctx.Err() == nil {
						t.Logf("relay: %v", err)
					}
				})
			}()

			sched, err := js.Stream(ctx, bus.SchedStream)
			if err != nil {
				t.Fatal(err)
			}
			deadline := time.Now().Add(10 * time.Second)
			// Relayed first (a due message not yet fired is not gone).
			if tc.wantWorkOf != "" {
				work, err := js.Stream(ctx, bus.WorkStream)
				if err != nil {
					t.Fatal(err)
				}
				subj := bus.StoredWorkSubject(bus.ControllerID("CompositeController", "due"), tc.wantWorkOf)
				for {
					_, err := work.GetLastMsgForSubject(ctx, subj)
					if err == nil {
						break
					}
					if !errors.Is(err, jetstream.ErrMsgNotFound) {
						t.Fatal(err)
					}
					if time.Now().After(deadline) {
						t.Fatalf("%s: relayed item never reached %s", tc.reason, bus.WorkStream)
					}
					time.Sleep(50 * time.Millisecond)
				}
			}
			for _, subj := range gone {
				for {
					_, err := sched.GetLastMsgForSubject(ctx, subj)
					if errors.Is(err, jetstream.ErrMsgNotFound) {
						break
					}
					if err != nil {
						t.Fatal(err)
					}
					if time.Now().After(deadline) {
						t.Fatalf("%s: %s still stored in %s", tc.reason, subj, bus.SchedStream)
					}
					time.Sleep(100 * time.Millisecond)
				}
			}
			for _, subj := range kept {
				if _, err := sched.GetLastMsgForSubject(ctx, subj); err != nil {
					t.Errorf("%s: %s gone from %s: %v", tc.reason, subj, bus.SchedStream, err)
				}
			}
		})
	}
}

func dueSubject(t *testing.T, it bus.WorkItem) string {
	t.Helper()
	s, err := bus.DueSubject(it.Controller.ID(), it.Parent.UID)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func schedSubject(t *testing.T, it bus.WorkItem) string {
	t.Helper()
	s, err := bus.SchedSubject(it.Controller.ID(), it.Parent.UID)
	if err != nil {
		t.Fatal(err)
	}
	return s
}
