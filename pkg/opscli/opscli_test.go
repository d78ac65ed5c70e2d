package opscli

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/metabus/metabus/pkg/bus"
	"github.com/metabus/metabus/pkg/natsx"
)

var t0 = time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)

func workMsg(t *testing.T, seq uint64, ctrlID, uid string, item bus.WorkItem, stored time.Time) storedMsg {
	t.Helper()
	data, err := json.Marshal(item)
	if err != nil {
		t.Fatal(err)
	}
	return storedMsg{Seq: seq, Subject: bus.StoredWorkSubject(ctrlID, uid), Time: stored, Data: data}
}

func TestScanWork(t *testing.T) {
	const ctrl = "cc-hello"
	n := 8
	p := func(uid string) int { return bus.PartitionOf(bus.Slot(ctrl, uid), n) }
	cases := []struct {
		reason    string
		msgs      func(t *testing.T) []storedMsg
		delivered map[string]uint64 // by parent UID: its partition consumer's delivered stream seq
		want      workScan
	}{
		{
			reason: "a message at or below its partition's delivered sequence is in flight, above it waiting",
			msgs: func(t *testing.T) []storedMsg {
				return []storedMsg{
					workMsg(t, 10, ctrl, "a", bus.WorkItem{}, t0),
					workMsg(t, 20, ctrl, "b", bus.WorkItem{}, t0.Add(time.Second)),
				}
			},
			delivered: map[string]uint64{"a": 10, "b": 19},
			want:      workScan{inFlight: 1, waiting: 1, oldest: t0},
		},
		{
			reason: "retrying items have an attempt; the oldest is the earliest enqueue time, which may predate the stored time",
			msgs: func(t *testing.T) []storedMsg {
				return []storedMsg{
					workMsg(t, 5, ctrl, "a", bus.WorkItem{Attempt: 2, EnqueuedAt: t0.Add(-time.Minute)}, t0),
					workMsg(t, 6, ctrl, "a", bus.WorkItem{}, t0.Add(time.Second)),
				}
			},
			want: workScan{waiting: 2, retrying: 1, oldest: t0.Add(-time.Minute)},
		},
	}
	for _, c := range cases {
		t.Run(c.reason, func(t *testing.T) {
			ps := partitionState{n: n, infos: map[int]*jetstream.ConsumerInfo{}}
			for uid, seq := range c.delivered {
				ps.infos[p(uid)] = &jetstream.ConsumerInfo{Delivered: jetstream.SequenceInfo{Stream: seq}}
			}
			got := scanWork(c.msgs(t), false, ps)
			if diff := cmp.Diff(c.want, got, cmp.AllowUnexported(workScan{})); diff != "" {
				t.Errorf("scan (-want +got):\n%s", diff)
			}
		})
	}
}

func TestSummarize(t *testing.T) {
	ctrlA := controllerObj{Kind: "CompositeController", Name: "a", ID: "cc-a"}
	ctrlB := controllerObj{Kind: "DecoratorController", Name: "b", ID: "dc-b"}
	lastErr := &bus.Record{Stage: bus.WorkStage, Parent: bus.ObjectRef{Namespace: "ns", Name: "p1"}, Started: t0.Add(-time.Minute), Seconds: 1, Result: "error", Error: "HTTP 500"}
	in := statusInput{
		now: t0, window: 5 * time.Minute,
		controllers: []controllerObj{ctrlA, ctrlB},
		owners: map[string]*ownership{
			bus.WorkStage: {members: []string{"d1", "d2"}, leases: map[string]string{"2-p00": "d1", "2-p01": "d2"}},
			// Partition 1 unowned; a3 holds a lease though its member entry expired.
			bus.DesiredStage: {members: []string{"a1"}, leases: map[string]string{"2-p00": "a3"}},
		},
		partitions: map[string]partitionState{
			bus.WorkStage: {n: 2, infos: map[int]*jetstream.ConsumerInfo{
				0: {NumPending: 3, NumAckPending: 2, NumRedelivered: 1}, 1: {NumPending: 1},
			}},
			bus.DesiredStage: {n: 2, infos: map[int]*jetstream.ConsumerInfo{0: {}, 1: {}}},
		},
		work:    map[string]uint64{bus.StoredWorkSubject("cc-a", "u1"): 2, bus.StoredWorkSubject("dc-b", "u2"): 1},
		desired: map[string]uint64{bus.StoredDesiredSubject("cc-a", "u1"): 1},
		sched:   map[string]uint64{"mc.sched.cc-a.u1": 1},
		dlq:     map[string]uint64{bus.DLQSubject("work", "dc-b", "u9"): 2},
		scans:   map[string]workScan{"cc-a": {waiting: 1, inFlight: 1, retrying: 1, oldest: t0.Add(-30 * time.Second)}},
		replies: []bus.InspectReply{
			{Member: "d1", Stage: bus.WorkStage, Since: t0.Add(-time.Hour), Controllers: []bus.ControllerActivity{{
				Controller: "cc-a",
				Minutes: []bus.MinuteCount{
					{Start: t0.Add(-10 * time.Minute), Calls: 100, Errors: 100}, // outside the window
					{Start: t0.Add(-5 * time.Minute), Calls: 3, Errors: 1},      // ends inside it
					{Start: t0.Add(-time.Minute), Calls: 4},
				},
				LastError: lastErr,
			}}},
			{Member: "a1", Stage: bus.DesiredStage, Since: t0.Add(-time.Hour), Controllers: []bus.ControllerActivity{{
				Controller: "cc-a", Minutes: []bus.MinuteCount{{Start: t0.Add(-time.Minute), Calls: 2, Errors: 1}},
			}}},
		},
		watchers: 2, revisions: 1, leader: "w-0",
	}
	since := t0.Add(-time.Hour)
	oldest := t0.Add(-30 * time.Second)
	want := Status{
		Time: t0, WindowSeconds: 300,
		Stages: []StageStatus{
			{Stage: "watcher", Replicas: 2, Leader: "w-0"},
			{Stage: "dispatcher", Replicas: 2, Partitions: 2, Waiting: 4, InFlight: 2, Redelivered: 1, Members: []MemberStatus{
				{ID: "d1", Partitions: 1, Answered: true, Since: &since}, {ID: "d2", Partitions: 1},
			}},
			{Stage: "applier", Replicas: 1, Partitions: 2, Unowned: 1, Members: []MemberStatus{
				{ID: "a1", Answered: true, Since: &since}, {ID: "a3", Partitions: 1},
			}},
			{Stage: "revisions", Replicas: 1},
		},
		Controllers: []ControllerStatus{
			{Controller: "compositecontroller/a", Kind: "CompositeController", Name: "a", ID: "cc-a",
				Queued: 2, Waiting: 1, InFlight: 1, Retrying: 1, Oldest: &oldest, Desired: 1, Scheduled: 1,
				HookCalls: 7, HookErrors: 1, Applies: 2, ApplyErrors: 1,
				LastError: &ErrorSummary{Time: t0.Add(-59 * time.Second), Stage: bus.WorkStage, Parent: "ns/p1", Message: "HTTP 500"}},
			{Controller: "decoratorcontroller/b", Kind: "DecoratorController", Name: "b", ID: "dc-b", Queued: 1, DLQ: 2},
		},
	}
	if diff := cmp.Diff(want, summarize(in)); diff != "" {
		t.Errorf("summary (-want +got):\n%s", diff)
	}
}

func TestDLQEntryAndFilter(t *testing.T) {
	body, _ := json.Marshal(bus.WorkItem{
		Controller: bus.ControllerRef{Kind: "CompositeController", Name: "hello"},
		Parent:     bus.ObjectRef{Kind: "HelloWorld", Namespace: "ns", Name: "p", UID: "u1"}, MapKey: "",
	})
	m := storedMsg{Seq: 7, Subject: bus.DLQSubject("work", "cc-hello", "u1"), Time: t0, Data: body, Header: nats.Header{
		"Metabus-Dead-Reason": {"max deliveries exceeded"}, "Metabus-Deliveries": {"5"},
		"Metabus-Original-Subject": {"mc.work.1.1.cc-hello.u1"}, "Ce-Type": {bus.TypeSyncRequested},
	}}
	e := dlqEntry(m)
	want := DLQEntry{Seq: 7, Time: t0, Stage: "work", Controller: bus.ControllerRef{Kind: "CompositeController", Name: "hello"},
		Parent: bus.ObjectRef{Kind: "HelloWorld", Namespace: "ns", Name: "p", UID: "u1"}, Deliveries: 5,
		Reason: "max deliveries exceeded", OriginalSubject: "mc.work.1.1.cc-hello.u1", Type: bus.TypeSyncRequested, Body: body}
	if diff := cmp.Diff(want, e); diff != "" {
		t.Fatalf("entry (-want +got):\n%s", diff)
	}
	cases := []struct {
		reason string
		f      DLQFilter
		want   bool
	}{
		{reason: "no filter", want: true},
		{reason: "its controller by kind and name", f: DLQFilter{Controller: "cc/hello"}, want: true},
		{reason: "its controller by name only", f: DLQFilter{Controller: "hello"}, want: true},
		{reason: "another kind of the same name", f: DLQFilter{Controller: "decoratorcontroller/hello"}},
		{reason: "its parent", f: DLQFilter{Parent: "ns/p"}, want: true},
		{reason: "a parent of that name elsewhere", f: DLQFilter{Parent: "other/p"}},
		{reason: "its stage", f: DLQFilter{Stage: "work"}, want: true},
		{reason: "the other stage", f: DLQFilter{Stage: "desired"}},
		{reason: "its number", f: DLQFilter{Seqs: []uint64{3, 7}}, want: true},
		{reason: "other numbers", f: DLQFilter{Seqs: []uint64{8}}},
	}
	for _, c := range cases {
		t.Run(c.reason, func(t *testing.T) {
			got, err := c.f.match(e)
			if err != nil || got != c.want {
				t.Errorf("match = %v, %v; want %v", got, err, c.want)
			}
		})
	}
	if got := dlqSubjectFilter(DLQFilter{Controller: "cc/hello", Stage: "work"}); got != "mc.dlq.work.cc-hello.*" {
		t.Errorf("subject filter %q", got)
	}
	if got := dlqSubjectFilter(DLQFilter{Controller: "hello"}); got != "mc.dlq.*.*.*" {
		t.Errorf("a bare name may be of any kind: subject filter %q", got)
	}
}

func TestParseControllerRef(t *testing.T) {
	cases := []struct {
		in, kind, name string
		code           int
	}{
		{in: "cc/hello", kind: "CompositeController", name: "hello"},
		{in: "CompositeController/hello", kind: "CompositeController", name: "hello"},
		{in: "decoratorcontrollers/d", kind: "DecoratorController", name: "d"},
		{in: "mapcontroller/m", kind: "MapController", name: "m"},
		{in: "hello", name: "hello"},
		{in: "xx/hello", code: ExitUsage},
		{in: "cc/", code: ExitUsage},
	}
	for _, c := range cases {
		t.Run(c.in, func(t *testing.T) {
			kind, name, err := ParseControllerRef(c.in)
			if Code(err) != c.code || kind != c.kind || name != c.name {
				t.Errorf("got %q %q %v (exit %d), want %q %q exit %d", kind, name, err, Code(err), c.kind, c.name, c.code)
			}
		})
	}
}

func TestDecodeTail(t *testing.T) {
	ctrl := bus.ControllerRef{Kind: "CompositeController", Name: "hello"}
	parent := bus.ObjectRef{Namespace: "ns", Name: "p", UID: "u1"}
	enc := func(v any) []byte { b, _ := json.Marshal(v); return b }
	cases := []struct {
		reason string
		msg    *nats.Msg
		want   string // formatted line without the time
	}{
		{
			reason: "a work item",
			msg: &nats.Msg{Subject: "mc.work.cc-hello.u1", Header: nats.Header{"ce-time": {t0.Format(time.RFC3339Nano)}},
				Data: enc(bus.WorkItem{Controller: ctrl, Parent: parent, Reason: bus.ReasonEvent})},
			want: "WORK     compositecontroller/hello ns/p reason=event",
		},
		{
			reason: "a scheduled retry, with its time",
			msg: &nats.Msg{Subject: "mc.sched.cc-hello.u1", Header: nats.Header{"Nats-Schedule": {"@at 2026-01-01T12:00:04Z"}},
				Data: enc(bus.WorkItem{Controller: ctrl, Parent: parent, Reason: bus.ReasonRetry, Attempt: 3})},
			want: "SCHEDULE compositecontroller/hello ns/p reason=retry attempt=3 at=2026-01-01T12:00:04Z",
		},
		{
			reason: "a desired state of a map key",
			msg: &nats.Msg{Subject: "mc.desired.cc-hello.u1~k", Data: enc(bus.DesiredState{Controller: ctrl, Parent: parent, MapKey: "k",
				WorkSeq: 9, Hook: bus.HookSync, Status: map[string]any{"x": 1.0}, ResyncAfterSeconds: 5})},
			want: "DESIRED  compositecontroller/hello ns/p~k hook=sync seq=9 children=0 status=set resyncAfter=5s",
		},
		{
			reason: "a failed sync's record",
			msg: &nats.Msg{Subject: "mc.trace.work.cc-hello.u1", Data: enc(bus.Record{Stage: bus.WorkStage, Controller: ctrl, Parent: parent,
				WorkSeq: 9, Started: t0, Seconds: 0.002, Result: "error", Error: "sync hook failed: HTTP 500",
				Hooks: []bus.HookCallRecord{{Hook: "sync", Seconds: 0.0015, Error: "HTTP 500"}}})},
			want: `SYNC     compositecontroller/hello ns/p result=error seq=9 hook=sync(1.5ms) hook-error="HTTP 500" took=2ms error="sync hook failed: HTTP 500"`,
		},
		{
			reason: "an apply's record",
			msg: &nats.Msg{Subject: "mc.trace.desired.cc-hello.u1", Data: enc(bus.Record{Stage: bus.DesiredStage, Controller: ctrl, Parent: parent,
				WorkSeq: 9, Reason: "sync", Started: t0, Seconds: 0.01, Result: "ok", Writes: []bus.Write{{UID: "c", To: "5"}}})},
			want: "APPLY    compositecontroller/hello ns/p result=ok hook=sync seq=9 writes=1 took=10ms",
		},
	}
	for _, c := range cases {
		t.Run(c.reason, func(t *testing.T) {
			l, ok := decodeTail(c.msg, t0)
			if !ok {
				t.Fatal("not decoded")
			}
			got := formatTail(l)
			if _, rest, _ := strings.Cut(got, " "); rest != c.want {
				t.Errorf("line\n got %q\nwant %q", rest, c.want)
			}
		})
	}
	if _, ok := decodeTail(&nats.Msg{Subject: "mc.work.cc-hello.u1", Data: []byte("not json")}, t0); ok {
		t.Error("a malformed message was decoded")
	}
}

func TestTailEventRedactsSecrets(t *testing.T) {
	ds := map[string]any{"children": []any{map[string]any{"apiVersion": "v1", "kind": "Secret", "metadata": map[string]any{"name": "s"},
		"stringData": map[string]any{"password": "hunter2"}}}}
	data, _ := json.Marshal(ds)
	m := &nats.Msg{Subject: "mc.desired.cc-hello.u1", Data: data, Header: nats.Header{
		"ce-specversion": {"1.0"}, "ce-id": {"1"}, "ce-type": {bus.TypeDesired}, "ce-source": {"/x"}, "ce-datacontenttype": {"application/json"},
	}}
	ev, err := tailEvent(m)
	if err != nil {
		t.Fatal(err)
	}
	out, _ := json.Marshal(ev)
	if strings.Contains(string(out), "hunter2") || !strings.Contains(string(out), `"password":""`) {
		t.Errorf("event %s: want the Secret's value blanked", out)
	}
}

func TestNamedWrites(t *testing.T) {
	applies := []bus.Record{{WorkSeq: 3, Writes: []bus.Write{{UID: "c1", To: "7"}, {UID: "p", From: "4", To: "8"}, {UID: "gone", From: "1", To: "2"}}}}
	names := map[string]string{"c1": "Pod ns/a", "p": "parent ns/p"}
	want := []WriteInfo{
		{WorkSeq: 3, Object: "Pod ns/a", UID: "c1", To: "7"},
		{WorkSeq: 3, Object: "parent ns/p", UID: "p", From: "4", To: "8"},
		{WorkSeq: 3, Object: "(gone or not a child)", UID: "gone", From: "1", To: "2"},
	}
	if diff := cmp.Diff(want, namedWrites(applies, names)); diff != "" {
		t.Errorf("writes (-want +got):\n%s", diff)
	}
}

func TestExitCodes(t *testing.T) {
	cases := []struct {
		reason string
		err    error
		want   int
	}{
		{reason: "success", want: ExitOK},
		{reason: "a plain error fails", err: errors.New("connection refused"), want: ExitError},
		{reason: "usage", err: Usage("bad"), want: ExitUsage},
		{reason: "not found, wrapped", err: errors.Join(errors.New("x"), NotFound("no parent")), want: ExitNotFound},
	}
	for _, c := range cases {
		t.Run(c.reason, func(t *testing.T) {
			if got := Code(c.err); got != c.want {
				t.Errorf("Code = %d, want %d", got, c.want)
			}
		})
	}
	if _, err := ParseFormat("xml"); Code(err) != ExitUsage {
		t.Errorf("-o xml: %v", err)
	}
}

func TestAge(t *testing.T) {
	for d, want := range map[time.Duration]string{0: "-", 45 * time.Second: "45s", 3*time.Minute + 12*time.Second: "3m12s",
		42 * time.Minute: "42m", 5*time.Hour + 3*time.Minute: "5h3m", 52 * time.Hour: "2d4h"} {
		if got := Age(d); got != want {
			t.Errorf("Age(%s) = %q, want %q", d, got, want)
		}
	}
}

func TestInboxPrefix(t *testing.T) {
	// The operators' NATS permissions (deploy/nats/nats-server.conf) let
	// them subscribe to this prefix only, as each service to its own.
	if want := natsx.ServiceInboxPrefix("operator"); InboxPrefix != want {
		t.Errorf("InboxPrefix %q, want %q", InboxPrefix, want)
	}
}

func TestNATSServerStatus(t *testing.T) {
	for _, tc := range []struct {
		reason, version string
		want            *NATSServer
		line            []string // what the table's line says
	}{
		{reason: "the tested release", version: natsx.BuiltServerVersion,
			want: &NATSServer{Name: "n1", Version: natsx.BuiltServerVersion, ConsumerReset: true, MinimumVersion: natsx.MinResetVersion},
			line: []string{"NATS server " + natsx.BuiltServerVersion + " (n1)", "consumer reset supported"}},
		{reason: "a server before 2.14", version: "2.12.15",
			want: &NATSServer{Name: "n1", Version: "2.12.15", MinimumVersion: natsx.MinResetVersion},
			line: []string{"NATS server 2.12.15 (n1)", "NOT supported", "needs " + natsx.MinResetVersion, "AckWait", natsx.ServerImage}},
		{reason: "a version that does not parse", version: "banana",
			want: &NATSServer{Name: "n1", Version: "banana", MinimumVersion: natsx.MinResetVersion, Error: `nats-server version "banana": want MAJOR.MINOR.PATCH`},
			line: []string{"NATS server banana (n1)", "consumer reset unknown", "MAJOR.MINOR.PATCH"}},
	} {
		t.Run(tc.reason, func(t *testing.T) {
			got := natsServerStatus(tc.version, "n1")
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
			var out strings.Builder
			if err := WriteStatus(&out, &Status{NATS: got}); err != nil {
				t.Fatal(err)
			}
			first, _, _ := strings.Cut(out.String(), "\n")
			for _, s := range tc.line {
				if !strings.Contains(first, s) {
					t.Errorf("first line %q does not say %q", first, s)
				}
			}
		})
	}
}

func TestReplayWeight(t *testing.T) {
	for _, tc := range []struct {
		reason         string
		asked, granted int
		want           int
	}{
		{"no annotation, no grant: the wire's 1", 1, 0, 0},
		{"an ask the watcher granted in full", 10, 10, 10},
		{"an ask above the operator's bound keeps the grant", 100, 5, 5},
		{"an ask the policy refused (weight 1 on the wire) stays 1", 50, 0, 0},
		{"an annotation lowered since the item was parked lowers it", 3, 10, 3},
		{"an annotation removed since: 1", 1, 10, 0},
	} {
		t.Run(tc.reason, func(t *testing.T) {
			if got := replayWeight(tc.asked, tc.granted); got != tc.want {
				t.Errorf("replayWeight(%d, %d) = %d, want %d", tc.asked, tc.granted, got, tc.want)
			}
		})
	}
}
