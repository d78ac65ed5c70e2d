package jsbus

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/metabus/metabus/pkg/bus"
)

// TestOldestDeletesSuperseded: before a desired state runs, the older ones
// of its item still in the stream are deleted (a finalizer release is
// kept: it runs whenever it comes back), other items' are untouched, and
// a desired state no longer in the stream does not run.
func TestOldestDeletesSuperseded(t *testing.T) {
	js := startBus(t, bus.Options{})
	ctx := context.Background()
	pub := Publisher{JS: js}
	const uid, other = "00000000-0000-0000-0000-0000000000d1", "00000000-0000-0000-0000-0000000000d2"
	publish := func(uid string, workSeq uint64, hook string) uint64 {
		t.Helper()
		ds := desired("c", uid, workSeq)
		ds.Hook = hook
		if err := pub.PublishDesired(ctx, ds); err != nil {
			t.Fatal(err)
		}
		s, err := js.Stream(ctx, bus.DesiredStream)
		if err != nil {
			t.Fatal(err)
		}
		m, err := s.GetLastMsgForSubject(ctx, bus.StoredDesiredSubjectKey(ds.Controller.ID(), uid, ""))
		if err != nil {
			t.Fatal(err)
		}
		return m.Sequence
	}
	release := publish(uid, 1, bus.HookRelease)
	older := publish(uid, 2, bus.HookSync)
	otherItem := publish(other, 3, bus.HookSync)
	newer := publish(uid, 4, bus.HookSync)
	subj := bus.StoredDesiredSubjectKey(bus.ControllerID("CompositeController", "c"), uid, "")
	keep := func(_ nats.Header, data []byte) bool {
		var ds bus.DesiredState
		return json.Unmarshal(data, &ds) == nil && ds.Hook == bus.HookRelease
	}
	left := func() []uint64 {
		t.Helper()
		s, err := js.Stream(ctx, bus.DesiredStream)
		if err != nil {
			t.Fatal(err)
		}
		var out []uint64
		for _, seq := range []uint64{release, older, otherItem, newer} {
			if _, err := s.GetMsg(ctx, seq); err == nil {
				out = append(out, seq)
			} else if err != jetstream.ErrMsgNotFound {
				t.Fatal(err)
			}
		}
		return out
	}
	cases := []struct {
		reason   string
		seq      uint64
		wantRun  bool
		wantLeft []uint64
	}{
		{"the newest runs once the older sync is deleted; the release and the other parent's stay",
			newer, true, []uint64{release, otherItem, newer}},
		{"the deleted one no longer runs", older, false, []uint64{release, otherItem, newer}},
		{"the release, oldest of all, runs", release, true, []uint64{release, otherItem, newer}},
	}
	for _, c := range cases {
		t.Run(c.reason, func(t *testing.T) {
			run, err := oldest(ctx, ownerAPI{js}, bus.DesiredStream, subj, c.seq, keep)
			if err != nil {
				t.Fatal(err)
			}
			if run != c.wantRun {
				t.Errorf("run = %v, want %v", run, c.wantRun)
			}
			if diff := cmp.Diff(c.wantLeft, left()); diff != "" {
				t.Errorf("left in the stream (-want +got):\n%s", diff)
			}
		})
	}
}
