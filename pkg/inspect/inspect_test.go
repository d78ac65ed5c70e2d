package inspect

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/nats-io/nats.go"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/metabus/metabus/internal/testing/natstest"
	"github.com/metabus/metabus/pkg/bus"
)

var (
	ctrlA = bus.ControllerRef{Kind: "CompositeController", Name: "a"}
	ctrlB = bus.ControllerRef{Kind: "DecoratorController", Name: "b"}
)

func item(ctrl bus.ControllerRef, uid, key string) bus.WorkItem {
	return bus.WorkItem{Controller: ctrl, Parent: bus.ObjectRef{Namespace: "ns", Name: "p-" + uid, UID: uid}, MapKey: key, Reason: bus.ReasonEvent}
}

// clock is a settable clock for the book.
type clock struct{ t time.Time }

func (c *clock) now() time.Time { return c.t }

func newBook(c *clock, capacity int) *Book {
	b := New(bus.WorkStage, "m1", capacity)
	b.now = c.now
	b.since = c.t
	return b
}

// sync records one sync of it with the given hook calls (nil: a hook call
// that failed).
func syncOnce(b *Book, it bus.WorkItem, seq uint64, result string, err error, hooks ...error) {
	s := b.StartSync(it, seq)
	for _, h := range hooks {
		s.Hook(bus.HookSync, 10*time.Millisecond, h)
	}
	b.Done(s, result, err)
}

func TestActivity(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 10, 0, 30, 0, time.UTC)
	fail := errors.New("hook returned HTTP 500")
	cases := []struct {
		reason string
		steps  func(b *Book, c *clock)
		want   []bus.ControllerActivity
	}{
		{
			reason: "hook calls and their errors count per minute; the last error is the last failed sync",
			steps: func(b *Book, c *clock) {
				syncOnce(b, item(ctrlA, "u1", ""), 1, "ok", nil, nil)
				syncOnce(b, item(ctrlA, "u2", ""), 2, "error", fail, fail)
				c.t = t0.Add(time.Minute)
				syncOnce(b, item(ctrlA, "u1", ""), 3, "ok", nil, nil, nil)
			},
			want: []bus.ControllerActivity{{
				Controller: ctrlA.ID(),
				Minutes: []bus.MinuteCount{
					{Start: t0.Truncate(time.Minute), Calls: 2, Errors: 1},
					{Start: t0.Truncate(time.Minute).Add(time.Minute), Calls: 2},
				},
				LastError: &bus.Record{Stage: bus.WorkStage, Member: "m1", Controller: ctrlA, Parent: item(ctrlA, "u2", "").Parent,
					WorkSeq: 2, Reason: bus.ReasonEvent, Started: t0, Result: "error", Error: fail.Error(),
					Hooks: []bus.HookCallRecord{{Hook: bus.HookSync, Seconds: 0.01, Error: fail.Error()}}},
			}},
		},
		{
			reason: "a sync without hook calls (an echo) counts nothing, but is recorded",
			steps: func(b *Book, c *clock) {
				syncOnce(b, item(ctrlA, "u1", ""), 1, "echo", nil)
			},
			want: []bus.ControllerActivity{{Controller: ctrlA.ID()}},
		},
		{
			reason: "minutes older than the window are dropped, and a reused slot starts over",
			steps: func(b *Book, c *clock) {
				syncOnce(b, item(ctrlA, "u1", ""), 1, "ok", nil, nil)
				c.t = t0.Add(bus.ActivityMinutes * time.Minute)
				syncOnce(b, item(ctrlA, "u1", ""), 2, "ok", nil, nil)
			},
			want: []bus.ControllerActivity{{
				Controller: ctrlA.ID(),
				Minutes:    []bus.MinuteCount{{Start: t0.Truncate(time.Minute).Add(bus.ActivityMinutes * time.Minute), Calls: 1}},
			}},
		},
	}
	for _, c := range cases {
		t.Run(c.reason, func(t *testing.T) {
			cl := &clock{t: t0}
			b := newBook(cl, 0)
			c.steps(b, cl)
			got := b.Reply(bus.InspectRequest{})
			if diff := cmp.Diff(c.want, got.Controllers); diff != "" {
				t.Errorf("activity (-want +got):\n%s", diff)
			}
		})
	}
}

func TestReplyFilters(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 10, 0, 0, 0, time.UTC)
	cl := &clock{t: t0}
	b := newBook(cl, 0)
	syncOnce(b, item(ctrlA, "u1", ""), 1, "ok", nil, nil)
	syncOnce(b, item(ctrlA, "u1", "k1"), 2, "ok", nil, nil)
	syncOnce(b, item(ctrlA, "u2", ""), 3, "ok", nil, nil)
	syncOnce(b, item(ctrlB, "u1", ""), 4, "ok", nil, nil)
	syncOnce(b, item(ctrlA, "u1", ""), 5, "ok", nil, nil) // replaces seq 1
	seqs := func(r bus.InspectReply) []uint64 {
		var out []uint64
		for _, rec := range r.Records {
			out = append(out, rec.WorkSeq)
		}
		return out
	}
	ctrls := func(r bus.InspectReply) []string {
		var out []string
		for _, a := range r.Controllers {
			out = append(out, a.Controller)
		}
		return out
	}
	cases := []struct {
		reason    string
		req       bus.InspectRequest
		wantSeqs  []uint64
		wantCtrls []string
	}{
		{reason: "no filter: every controller's activity, no records", req: bus.InspectRequest{}, wantCtrls: []string{ctrlA.ID(), ctrlB.ID()}},
		{reason: "a controller: its activity only", req: bus.InspectRequest{Controller: ctrlB.ID()}, wantCtrls: []string{ctrlB.ID()}},
		{reason: "a parent: the last record of each of its items, of every controller", req: bus.InspectRequest{ParentUID: "u1"}, wantSeqs: []uint64{2, 4, 5}},
		{reason: "a parent of a controller: its items and the controller's activity", req: bus.InspectRequest{ParentUID: "u1", Controller: ctrlA.ID()},
			wantSeqs: []uint64{2, 5}, wantCtrls: []string{ctrlA.ID()}},
	}
	for _, c := range cases {
		t.Run(c.reason, func(t *testing.T) {
			got := b.Reply(c.req)
			sortU := func(s []uint64) []uint64 {
				for i := 1; i < len(s); i++ {
					for j := i; j > 0 && s[j] < s[j-1]; j-- {
						s[j], s[j-1] = s[j-1], s[j]
					}
				}
				return s
			}
			sortS := func(s []string) []string {
				for i := 1; i < len(s); i++ {
					for j := i; j > 0 && s[j] < s[j-1]; j-- {
						s[j], s[j-1] = s[j-1], s[j]
					}
				}
				return s
			}
			if diff := cmp.Diff(c.wantSeqs, sortU(seqs(got))); diff != "" {
				t.Errorf("records (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(c.wantCtrls, sortS(ctrls(got))); diff != "" {
				t.Errorf("controllers (-want +got):\n%s", diff)
			}
		})
	}
}

// TestLastCallKept: a sync merged into an earlier call (no hook called)
// does not hide that call: a parent's records are its item's last record
// and, while that one called no hook, the last that did.
func TestLastCallKept(t *testing.T) {
	type rec struct {
		Seq    uint64
		Result string
	}
	cases := []struct {
		reason string
		syncs  []rec // in order; "merged" calls no hook
		want   []rec
	}{
		{reason: "a call alone", syncs: []rec{{1, "ok"}}, want: []rec{{1, "ok"}}},
		{reason: "merged syncs after a call keep that call", syncs: []rec{{1, "ok"}, {2, "ok"}, {3, "merged"}, {4, "merged"}},
			want: []rec{{4, "merged"}, {2, "ok"}}},
		{reason: "a new call replaces the kept one", syncs: []rec{{1, "ok"}, {2, "merged"}, {3, "error"}}, want: []rec{{3, "error"}}},
		{reason: "nothing to keep when no sync called a hook", syncs: []rec{{1, "merged"}}, want: []rec{{1, "merged"}}},
	}
	for _, c := range cases {
		t.Run(c.reason, func(t *testing.T) {
			b := newBook(&clock{t: time.Date(2026, 1, 1, 10, 0, 0, 0, time.UTC)}, 0)
			for _, s := range c.syncs {
				if s.Result == "merged" {
					syncOnce(b, item(ctrlA, "u1", ""), s.Seq, s.Result, nil)
				} else {
					syncOnce(b, item(ctrlA, "u1", ""), s.Seq, s.Result, nil, nil)
				}
			}
			var got []rec
			for _, r := range b.Reply(bus.InspectRequest{ParentUID: "u1"}).Records {
				got = append(got, rec{r.WorkSeq, r.Result})
			}
			if diff := cmp.Diff(c.want, got); diff != "" {
				t.Errorf("records (-want +got):\n%s", diff)
			}
		})
	}
}

func TestCapacity(t *testing.T) {
	b := New(bus.DesiredStage, "m", 3)
	for i := range 10 {
		ds := &bus.DesiredState{Controller: ctrlA, Parent: bus.ObjectRef{UID: string(rune('a' + i))}, WorkSeq: uint64(i)}
		b.Applied(ds, time.Now(), "ok", nil, nil)
	}
	if n := len(b.items); n != 3 {
		t.Errorf("%d records kept, want the capacity, 3", n)
	}
}

func TestAnswerKeepsIdentitiesOnly(t *testing.T) {
	b := New(bus.WorkStage, "m", 0)
	s := b.StartSync(item(ctrlA, "u1", ""), 1)
	secret := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "v1", "kind": "Secret", "metadata": map[string]any{"name": "s", "namespace": "ns"},
		"stringData": map[string]any{"password": "hunter2"},
	}}
	s.Answer(&bus.DesiredState{Hook: bus.HookSync, Parent: item(ctrlA, "u1", "").Parent, Children: []*unstructured.Unstructured{secret}, Status: map[string]any{"ready": true}})
	b.Done(s, "ok", nil)
	data, err := json.Marshal(b.Reply(bus.InspectRequest{ParentUID: "u1"}))
	if err != nil {
		t.Fatal(err)
	}
	if got := string(data); !json.Valid(data) || contains(got, "hunter2") || !contains(got, `"kind":"Secret"`) || !contains(got, `"ready":true`) {
		t.Errorf("reply %s: want the Secret's identity and the status, never its data", got)
	}
}

func contains(s, sub string) bool { return strings.Contains(s, sub) }

// TestServeGatherAndTrace: replicas answer inspect requests over NATS,
// every one of them, and publish records only while someone tails.
func TestServeGatherAndTrace(t *testing.T) {
	nc, _ := natstest.Start(t)
	ctx := context.Background()
	b1, b2 := New(bus.WorkStage, "r1", 0), New(bus.WorkStage, "r2", 0)
	for _, b := range []*Book{b1, b2} {
		stop, err := b.Serve(nc)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(stop)
	}
	syncOnce(b1, item(ctrlA, "u1", ""), 1, "ok", nil, nil)
	syncOnce(b2, item(ctrlA, "u1", ""), 2, "error", errors.New("boom"), errors.New("boom"))
	replies, err := Gather(ctx, nc, bus.WorkStage, bus.InspectRequest{ParentUID: "u1"}, 2, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	members := map[string]uint64{}
	for _, r := range replies {
		for _, rec := range r.Records {
			members[r.Member] = rec.WorkSeq
		}
	}
	if diff := cmp.Diff(map[string]uint64{"r1": 1, "r2": 2}, members); diff != "" {
		t.Errorf("replies (-want +got):\n%s", diff)
	}
	if other, err := Gather(ctx, nc, bus.DesiredStage, bus.InspectRequest{}, 0, 200*time.Millisecond); err != nil || len(other) != 0 {
		t.Errorf("the desired stage has no replicas here: %v %v", other, err)
	}

	traces := make(chan *nats.Msg, 16)
	sub, err := nc.ChanSubscribe(bus.TraceFilter("", ""), traces)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	syncOnce(b1, item(ctrlA, "u3", ""), 3, "ok", nil, nil)
	_ = nc.Flush()
	select {
	case m := <-traces:
		t.Fatalf("a record was published on %s while nobody tailed", m.Subject)
	case <-time.After(200 * time.Millisecond):
	}
	tctx, stop := context.WithCancel(ctx)
	defer stop()
	go func() { _ = Announce(tctx, nc) }()
	deadline := time.After(5 * time.Second)
	for {
		syncOnce(b1, item(ctrlA, "u4", ""), 4, "ok", nil, nil)
		select {
		case m := <-traces:
			if want := bus.TraceSubject(bus.WorkStage, ctrlA.ID(), "u4"); m.Subject != want {
				t.Errorf("trace on %s, want %s", m.Subject, want)
			}
			return
		case <-time.After(50 * time.Millisecond):
		case <-deadline:
			t.Fatal("no trace record while tailing")
		}
	}
}
