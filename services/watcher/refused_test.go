package watcher

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/metabus/metabus/pkg/bus"
	"github.com/metabus/metabus/pkg/jsbus"
)

// TestRefusedChangeLandsOnceThereIsRoom: a parent's MC_WORK subject holds
// two items (the per-subject limit), one of which a dispatcher has already
// acked without waiting for the server, while it runs the other. A real
// change refused then must not be counted as covered by the queued items:
// the running one took its snapshot before the change. A CI run lost a
// MapController output's count that way. The change is published again
// once there is room, and a resync refused at the same moment is not
// (the queued items sync the parent at about the time it asked for).
func TestRefusedChangeLandsOnceThereIsRoom(t *testing.T) {
	ctx, js := busForTest(t)
	pub := jsbus.Publisher{JS: js}
	ctrl := bus.ControllerRef{Kind: "CompositeController", Name: "c"}
	parents := map[string]string{"change": "u-change", "resync": "u-resync"}
	for name, uid := range parents {
		for i := 0; i < 2; i++ { // no dispatcher: both stay
			it := bus.WorkItem{Controller: ctrl, Reason: bus.ReasonEvent,
				Parent: bus.ObjectRef{APIVersion: "example.com/v1", Kind: "Thing", Resource: "things", Namespace: "ns", Name: name, UID: uid}}
			if queued, err := pub.PublishWork(ctx, it); err != nil || !queued {
				t.Fatalf("fill %s's queue: queued %v, %v", name, queued, err)
			}
		}
	}
	stream, err := js.Stream(ctx, bus.WorkStream)
	if err != nil {
		t.Fatal(err)
	}
	count := func(uid string) uint64 {
		subject := bus.StoredWorkSubjectKey(ctrl.ID(), uid, "")
		info, err := stream.Info(ctx, jetstream.WithSubjectFilter(subject))
		if err != nil {
			t.Fatal(err)
		}
		return info.State.Subjects[subject]
	}

	o := outboxForTest(t, pub, js)
	go o.runPublisher(ctx)
	go o.runResyncPacer(ctx)
	o.add(entry{ref: ctrl, parentRes: thingsRes, reason: bus.ReasonEvent, gvr: thingsGVR, rv: "7",
		parent: testObject("example.com/v1", "Thing", "ns", "change", parents["change"], "7")})
	o.add(entry{ref: ctrl, parentRes: thingsRes, reason: bus.ReasonResync,
		parent: testObject("example.com/v1", "Thing", "ns", "resync", parents["resync"], "1")})
	time.Sleep(500 * time.Millisecond) // both refused by now, probably more than once

	// The acked item's removal arrives: one message of each subject goes.
	for _, uid := range parents {
		first, err := stream.GetMsg(ctx, 0, jetstream.WithGetMsgSubject(bus.StoredWorkSubjectKey(ctrl.ID(), uid, "")))
		if err != nil {
			t.Fatal(err)
		}
		if err := stream.DeleteMsg(ctx, first.Sequence); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(10 * time.Second)
	for count(parents["change"]) < 2 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if n := count(parents["change"]); n != 2 {
		t.Fatalf("the refused change's parent has %d items in MC_WORK, want 2: the change was dropped as already queued", n)
	}
	last, err := stream.GetLastMsgForSubject(ctx, bus.StoredWorkSubjectKey(ctrl.ID(), parents["change"], ""))
	if err != nil {
		t.Fatal(err)
	}
	var got bus.WorkItem
	if err := bus.DecodeEvent(last.Subject, bus.Header(last.Header), last.Data, bus.TypeSyncRequested, &got); err != nil {
		t.Fatal(err)
	}
	if got.MinResourceVersions[grKey(thingsGVR)] != "7" {
		t.Errorf("the landed change asks for resourceVersions %v, want %s at 7", got.MinResourceVersions, grKey(thingsGVR))
	}
	time.Sleep(time.Second)
	if n := count(parents["resync"]); n != 1 {
		t.Errorf("the refused resync's parent has %d items in MC_WORK, want 1 (a refused resync is covered)", n)
	}
}

func TestMustLand(t *testing.T) {
	for _, c := range []struct {
		reason, itemReason string
		want               bool
	}{
		{"a real change must reach a sync that starts after it", bus.ReasonEvent, true},
		{"a release: the queued syncs would not release the finalizer", bus.ReasonRelease, true},
		{"a resync is covered by the queued syncs", bus.ReasonResync, false},
	} {
		t.Run(c.reason, func(t *testing.T) {
			if diff := cmp.Diff(c.want, mustLand(&bus.WorkItem{Reason: c.itemReason})); diff != "" {
				t.Errorf("mustLand(%s) (-want +got):\n%s", c.itemReason, diff)
			}
		})
	}
}
