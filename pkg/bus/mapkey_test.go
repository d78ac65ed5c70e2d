package bus

import (
	"context"
	"crypto/sha256"
	"encoding/base32"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/nats-io/nats.go/jetstream"
)

// testMapKey has the shape of a mapctl map key (52 lower-case base32
// characters of a SHA-256) without importing mapctl, which the bus must
// not depend on.
func testMapKey(input string) string {
	sum := sha256.Sum256([]byte(input))
	return strings.ToLower(base32.StdEncoding.WithPadding(base32.NoPadding).EncodeToString(sum[:]))
}

func keyedItem(ctrl, uid, mapKey string) WorkItem {
	it := item(ctrl, uid)
	it.MapKey = mapKey
	return it
}

// TestKeylessContractUnchanged pins values computed with the code before
// map keys existed: stored subjects and slots are a wire contract (stored
// messages and consumer filters depend on them), and the state keys are
// what running services hold their per-parent state under.
func TestKeylessContractUnchanged(t *testing.T) {
	cases := []struct {
		reason             string
		ctrlID, uid        string
		slot               int
		work, desired, key string
	}{
		{
			reason: "a CompositeController parent with a UUID",
			ctrlID: "cc-c1", uid: "11111111-2222-3333-4444-555555555555", slot: 258,
			work:    "mc.work.2.258.cc-c1.11111111-2222-3333-4444-555555555555",
			desired: "mc.desired.2.258.cc-c1.11111111-2222-3333-4444-555555555555",
			key:     "cc-c1/11111111-2222-3333-4444-555555555555",
		},
		{
			reason: "a DecoratorController whose name had dots",
			ctrlID: "dc-web_example_com", uid: "0f6e2c1a-9b7d-4e35-8a21-3c4d5e6f7a8b", slot: 609,
			work:    "mc.work.33.609.dc-web_example_com.0f6e2c1a-9b7d-4e35-8a21-3c4d5e6f7a8b",
			desired: "mc.desired.33.609.dc-web_example_com.0f6e2c1a-9b7d-4e35-8a21-3c4d5e6f7a8b",
			key:     "dc-web_example_com/0f6e2c1a-9b7d-4e35-8a21-3c4d5e6f7a8b",
		},
		{
			reason: "a MapController's per-parent item is keyless too",
			ctrlID: "mc-fanout", uid: "a", slot: 510,
			work:    "mc.work.62.510.mc-fanout.a",
			desired: "mc.desired.62.510.mc-fanout.a",
			key:     "mc-fanout/a",
		},
	}
	type values struct {
		Slot, SlotKey                 int
		Work, WorkKey                 string
		Desired, DesiredKey           string
		ParentKey, ItemKey, ParentTok string
	}
	for _, tc := range cases {
		t.Run(tc.reason, func(t *testing.T) {
			want := values{tc.slot, tc.slot, tc.work, tc.work, tc.desired, tc.desired, tc.key, tc.key, tc.uid}
			got := values{
				Slot: Slot(tc.ctrlID, tc.uid), SlotKey: SlotKey(tc.ctrlID, tc.uid, ""),
				Work: StoredWorkSubject(tc.ctrlID, tc.uid), WorkKey: StoredWorkSubjectKey(tc.ctrlID, tc.uid, ""),
				Desired: StoredDesiredSubject(tc.ctrlID, tc.uid), DesiredKey: StoredDesiredSubjectKey(tc.ctrlID, tc.uid, ""),
				ParentKey: ParentKey(tc.ctrlID, tc.uid), ItemKey: ItemKey(tc.ctrlID, tc.uid, ""), ParentTok: ParentToken(tc.uid, ""),
			}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("keyless contract changed (-want +got):\n%s", diff)
			}
		})
	}
}

// TestKeylessMessagesUnchanged: a keyless item's body has no mapKey field
// and its headers carry the parent's ParentKey as partition key, as
// before, so older services read it exactly as they did.
func TestKeylessMessagesUnchanged(t *testing.T) {
	it := item("c1", "11111111-2222-3333-4444-555555555555")
	ds := DesiredState{Controller: it.Controller, Parent: it.Parent, WorkSeq: 7, Hook: HookSync}
	cases := []struct {
		reason   string
		body     any
		ext      map[string]string
		mapKey   string
		itemKey  string
		wantKey  string
		wantBody bool // whether the body names a mapKey
	}{
		{"keyless work item", it, map[string]string{ExtReason: it.Reason}, "", it.Key(), "cc-c1/11111111-2222-3333-4444-555555555555", false},
		{"keyless desired state", ds, map[string]string{ExtWorkSeq: WorkSeqString(7)}, "", ds.Key(), "cc-c1/11111111-2222-3333-4444-555555555555", false},
		{"keyed work item", keyedItem("c1", it.Parent.UID, "k1"), map[string]string{ExtReason: it.Reason}, "k1",
			keyedItem("c1", it.Parent.UID, "k1").Key(), "cc-c1/11111111-2222-3333-4444-555555555555~k1", true},
	}
	for _, tc := range cases {
		t.Run(tc.reason, func(t *testing.T) {
			m, err := NewMsg(context.Background(), "mc.work.x.y", TypeSyncRequested, "id", it.Controller, it.Parent, tc.body,
				withItemKey(tc.ext, tc.mapKey, tc.itemKey))
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.wantKey, m.Header.Get("ce-"+ExtPartitionKey)); diff != "" {
				t.Errorf("partition key (-want +got):\n%s", diff)
			}
			if got := strings.Contains(string(m.Data), `"mapKey"`); got != tc.wantBody {
				t.Errorf("body %s: names mapKey = %v, want %v", m.Data, got, tc.wantBody)
			}
		})
	}
}

// TestParentToken: a keyed token splits back into parent UID and key, a
// keyless one is the UID, and no key or UID that would make the split
// ambiguous or leave the subject's token count is accepted.
func TestParentToken(t *testing.T) {
	key := testMapKey("input-1")
	cases := []struct {
		reason    string
		uid, key  string
		wantToken string
		wantErr   bool
	}{
		{"keyless: the UID alone", "u-1", "", "u-1", false},
		{"keyless: a UID is never checked, as before", "odd~uid", "", "odd~uid", false},
		{"keyed: UID ~ key", "u-1", key, "u-1~" + key, false},
		{"a key with the separator would split wrongly", "u-1", "a~b", "", true},
		{"a key with a dot would add a subject token", "u-1", "a.b", "", true},
		{"a wildcard key would address other subjects", "u-1", "*", "", true},
		{"a key with a space is no token", "u-1", "a b", "", true},
		{"a keyed UID with the separator would split wrongly", "u~1", key, "", true},
		{"a keyed item needs a UID", "", key, "", true},
	}
	for _, tc := range cases {
		t.Run(tc.reason, func(t *testing.T) {
			got, err := parentToken(tc.uid, tc.key)
			if (err != nil) != tc.wantErr {
				t.Fatalf("parentToken(%q, %q) error = %v, want error %v", tc.uid, tc.key, err, tc.wantErr)
			}
			if tc.wantErr {
				return
			}
			if diff := cmp.Diff(tc.wantToken, got); diff != "" {
				t.Errorf("token (-want +got):\n%s", diff)
			}
			if tc.key == "" {
				return // a keyless UID is not split: it is used as it is
			}
			uid, k := SplitParentToken(got)
			if diff := cmp.Diff([2]string{tc.uid, tc.key}, [2]string{uid, k}); diff != "" {
				t.Errorf("split back (-want +got):\n%s", diff)
			}
		})
	}
}

// TestParseKeyedSubjects: every parser of subjects gives back controller,
// parent UID and key for keyed subjects, and what it always gave for
// keyless and pre-slot ones.
func TestParseKeyedSubjects(t *testing.T) {
	key := testMapKey("input-1")
	slot := SlotKey("mc-fan", "u-1", key)
	type parsed struct {
		Slot                  int
		Ctrl, UID, Key, Token string
	}
	cases := []struct {
		reason  string
		subject string
		want    parsed
	}{
		{"keyed work item", StoredWorkSubjectKey("mc-fan", "u-1", key), parsed{slot, "mc-fan", "u-1", key, "u-1~" + key}},
		{"keyed desired state", StoredDesiredSubjectKey("mc-fan", "u-1", key), parsed{slot, "mc-fan", "u-1", key, "u-1~" + key}},
		{"keyless work item", StoredWorkSubject("cc-c1", "u-2"), parsed{Slot("cc-c1", "u-2"), "cc-c1", "u-2", "", "u-2"}},
		{"keyless, stored before slots", "mc.work.5.cc-c1.u-2", parsed{5, "cc-c1", "u-2", "", "u-2"}},
	}
	for _, tc := range cases {
		t.Run(tc.reason, func(t *testing.T) {
			s, c, u, k, err := ParseStoredSubjectKey(tc.subject)
			if err != nil {
				t.Fatal(err)
			}
			_, _, token, err := ParseStoredSubject(tc.subject)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, parsed{s, c, u, k, token}); diff != "" {
				t.Errorf("ParseStoredSubjectKey(%q) (-want +got):\n%s", tc.subject, diff)
			}
		})
	}
	// Due and schedule subjects are unpartitioned: ParseKeySubject gives
	// the token, which splits into UID and key.
	for _, build := range []func(string, string) (string, error){SchedSubject, DueSubject} {
		subject, err := build("mc-fan", ParentToken("u-1", key))
		if err != nil {
			t.Fatal(err)
		}
		ctrl, token, err := ParseKeySubject(subject)
		if err != nil {
			t.Fatal(err)
		}
		uid, k := SplitParentToken(token)
		if diff := cmp.Diff([]string{"mc-fan", "u-1", key}, []string{ctrl, uid, k}); diff != "" {
			t.Errorf("ParseKeySubject(%q) (-want +got):\n%s", subject, diff)
		}
	}
	// The partition filters, built for keyless subjects, match keyed ones
	// in the partition of their slot.
	for n := 1; n <= Slots; n *= 4 {
		subject := StoredWorkSubjectKey("mc-fan", "u-1", key)
		matched := -1
		for p := range n {
			for _, f := range partitionFilters(workRoot, n, p) {
				if subjectMatches(f, subject) {
					matched = p
				}
			}
		}
		if matched != PartitionOf(slot, n) {
			t.Errorf("%d partitions: %s matched by partition %d, want %d", n, subject, matched, PartitionOf(slot, n))
		}
	}
}

// TestMapKeysSpreadOverPartitions: the keys of one parent do not all land
// in its partition (they would run one partition's owner only), and one
// key always lands in the same slot (its items never run at once and its
// desired states stay in order).
func TestMapKeysSpreadOverPartitions(t *testing.T) {
	cases := []struct {
		reason   string
		ctrlID   string
		uid      string
		keys     int
		minParts int
	}{
		{"64 inputs of one parent", "mc-fan", "11111111-2222-3333-4444-555555555555", 64, 32},
		{"16 inputs of another parent", "mc-other", "0f6e2c1a-9b7d-4e35-8a21-3c4d5e6f7a8b", 16, 10},
	}
	for _, tc := range cases {
		t.Run(tc.reason, func(t *testing.T) {
			parts := map[int]bool{}
			for i := range tc.keys {
				key := testMapKey(fmt.Sprintf("%s/input-%d", tc.uid, i))
				slot := SlotKey(tc.ctrlID, tc.uid, key)
				if again := SlotKey(tc.ctrlID, tc.uid, key); again != slot {
					t.Fatalf("key %d: slot %d then %d", i, slot, again)
				}
				if slot < 0 || slot >= Slots {
					t.Fatalf("key %d: slot %d out of range", i, slot)
				}
				parts[PartitionOf(slot, DefaultPartitions)] = true
			}
			if len(parts) < tc.minParts {
				t.Errorf("%d keys of one parent in %d of %d partitions, want at least %d", tc.keys, len(parts), DefaultPartitions, tc.minParts)
			}
		})
	}
}

// TestKeyedWorkDeduplicatedPerKey: MC_WORK keeps one in-flight and one
// pending item per (parent, key): keys of one parent and its per-parent
// item never collapse into each other, the same key does (refused as
// already queued, like a parent), and the server stores each under the
// subject and slot the client computes.
func TestKeyedWorkDeduplicatedPerKey(t *testing.T) {
	js := startBus(t, Options{})
	ctx := context.Background()
	pub := Publisher{JS: js}
	const uid = "11111111-2222-3333-4444-555555555555"
	keyA, keyB := testMapKey("input-a"), testMapKey("input-b")
	steps := []struct {
		reason string
		key    string
		want   bool
	}{
		{"key A: first item (the one that will be in flight)", keyA, true},
		{"key A: second item (the pending one)", keyA, true},
		{"key A: a third collapses into the pending one", keyA, false},
		{"key B of the same parent is its own item", keyB, true},
		{"key B: pending", keyB, true},
		{"the per-parent item is its own item", "", true},
		{"the per-parent item: pending", "", true},
		{"the per-parent item collapses like any parent's", "", false},
		{"key B collapses too", keyB, false},
	}
	for _, s := range steps {
		queued, err := pub.PublishWork(ctx, keyedItem("fan", uid, s.key))
		if err != nil {
			t.Fatalf("%s: %v", s.reason, err)
		}
		if queued != s.want {
			t.Errorf("%s: queued = %v, want %v", s.reason, queued, s.want)
		}
	}
	st, err := js.Stream(ctx, WorkStream)
	if err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{keyA, keyB, ""} {
		it := keyedItem("fan", uid, key)
		t.Run("stored/"+it.Key(), func(t *testing.T) {
			raw, err := st.GetLastMsgForSubject(ctx, StoredWorkSubjectKey(it.Controller.ID(), uid, key))
			if err != nil {
				t.Fatalf("not stored where the client expects (slot %d): %v", SlotKey(it.Controller.ID(), uid, key), err)
			}
			slot, ctrl, gotUID, gotKey, err := ParseStoredSubjectKey(raw.Subject)
			if err != nil {
				t.Fatal(err)
			}
			var body WorkItem
			if err := json.Unmarshal(raw.Data, &body); err != nil {
				t.Fatal(err)
			}
			want := []any{SlotKey(it.Controller.ID(), uid, key), it.Controller.ID(), uid, key, key, it.Key()}
			got := []any{slot, ctrl, gotUID, gotKey, body.MapKey, raw.Header.Get("ce-" + ExtPartitionKey)}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("stored item (-want +got): slot, controller, UID, key, body key, partition key\n%s", diff)
			}
		})
	}
	if info, err := st.Info(ctx); err != nil || info.State.Msgs != 6 {
		t.Errorf("MC_WORK holds %v messages (err %v), want 2 per key and 2 for the parent", info.State.Msgs, err)
	}
}

// TestKeyedDesiredStatesOrderedPerKey: desired states of one key are
// applied in order, and keys of a parent and its per-parent desired state
// are independent: a per-parent state that takes long holds none of the
// keys.
func TestKeyedDesiredStatesOrderedPerKey(t *testing.T) {
	js := startBus(t, Options{})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pub := Publisher{JS: js}
	const uid = "11111111-2222-3333-4444-555555555555"
	keys := []string{testMapKey("input-a"), testMapKey("input-b"), ""}
	ctrl := ControllerRef{Kind: "MapController", Name: "fan"}
	const perKey = 5
	want := map[string][]uint64{}
	seq := uint64(0)
	for i := 0; i < perKey; i++ {
		for _, k := range keys { // interleaved, as parallel syncs publish
			seq++
			ds := DesiredState{Controller: ctrl, Parent: item("fan", uid).Parent, MapKey: k, WorkSeq: seq, Hook: HookSync}
			if err := pub.PublishDesired(ctx, ds); err != nil {
				t.Fatal(err)
			}
			want[ds.Key()] = append(want[ds.Key()], seq)
		}
	}
	// The applier's superseded check reads the last desired state of the
	// item's own stored subject: per key.
	st, err := js.Stream(ctx, DesiredStream)
	if err != nil {
		t.Fatal(err)
	}
	lastOf := map[string]uint64{}
	wantLast := map[string]uint64{}
	for _, k := range keys {
		raw, err := st.GetLastMsgForSubject(ctx, StoredDesiredSubjectKey(ctrl.ID(), uid, k))
		if err != nil {
			t.Fatalf("last desired state of key %q: %v", k, err)
		}
		var ds DesiredState
		if err := json.Unmarshal(raw.Data, &ds); err != nil {
			t.Fatal(err)
		}
		lastOf[ds.Key()] = ds.WorkSeq
		wantLast[ds.Key()] = want[ds.Key()][perKey-1]
	}
	if diff := cmp.Diff(wantLast, lastOf); diff != "" {
		t.Errorf("last desired state per key (-want +got):\n%s", diff)
	}

	var mu sync.Mutex
	got := map[string][]uint64{}
	keyedDone := make(chan struct{})
	var keyedOnce sync.Once
	allDone := make(chan struct{})
	var allOnce sync.Once
	consumed := make(chan struct{})
	defer func() { cancel(); <-consumed }() // no handler outlives the test
	go func() {
		defer close(consumed)
		_ = Consume(ctx, js, ConsumeConfig{Stream: DesiredStream, Prefix: DesiredConsumerPrefix, Stage: DesiredStage,
			PerController: 8, Ordered: true},
			func(hctx context.Context, m jetstream.Msg) {
				var ds DesiredState
				if err := Decode(m, TypeDesired, &ds); err != nil {
					t.Error(err)
					_ = m.Term()
					return
				}
				if ds.MapKey == "" {
					// The per-parent state waits until every keyed one
					// ran: were they serialized with it, they never would.
					select {
					case <-keyedDone:
					case <-hctx.Done():
						return
					case <-time.After(15 * time.Second):
						t.Error("keyed desired states waited for the per-parent one")
					}
				}
				mu.Lock()
				got[ds.Key()] = append(got[ds.Key()], ds.WorkSeq)
				keyed := 0
				for _, k := range keys[:2] {
					keyed += len(got[ItemKey(ctrl.ID(), uid, k)])
				}
				total := keyed + len(got[ItemKey(ctrl.ID(), uid, "")])
				mu.Unlock()
				if err := m.Ack(); err != nil {
					t.Error(err)
				}
				if keyed == 2*perKey {
					keyedOnce.Do(func() { close(keyedDone) })
				}
				if total == 3*perKey {
					allOnce.Do(func() { close(allDone) })
				}
			})
	}()
	select {
	case <-allDone:
	case <-time.After(30 * time.Second):
		t.Fatal("desired states not all applied")
	}
	mu.Lock()
	defer mu.Unlock()
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("desired states applied per key (-want +got):\n%s", diff)
	}
}

// TestKeyedSchedulesPerKey: a key's schedule neither replaces another
// key's nor the per-parent one, and the relay brings a fired keyed
// schedule back as a keyed work item.
func TestKeyedSchedulesPerKey(t *testing.T) {
	js := startBus(t, Options{})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pub := Publisher{JS: js}
	const uid = "99999999-2222-3333-4444-555555555555"
	keyA, keyB := testMapKey("input-a"), testMapKey("input-b")
	for _, k := range []string{keyA, keyB, ""} {
		if err := pub.Schedule(ctx, keyedItem("sched", uid, k), time.Now().Add(time.Hour)); err != nil {
			t.Fatal(err)
		}
	}
	sched, err := js.Stream(ctx, SchedStream)
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{keyA, keyB, ""} {
		subject, err := SchedSubject(ControllerID("CompositeController", "sched"), ParentToken(uid, k))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := sched.GetLastMsgForSubject(ctx, subject); err != nil {
			t.Errorf("schedule of key %q missing: %v", k, err)
		}
	}
	// Key A's retry fires now: it replaces key A's hour-long schedule only.
	relayErrs := make(chan error, 16)
	go func() { _ = RunRelay(ctx, js, func(err error) { relayErrs <- err }) }()
	retry := keyedItem("sched", uid, keyA)
	retry.Reason, retry.Attempt = ReasonRetry, 2
	if err := pub.Schedule(ctx, retry, time.Now()); err != nil {
		t.Fatal(err)
	}
	work, err := js.Stream(ctx, WorkStream)
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		raw, err := work.GetLastMsgForSubject(ctx, StoredWorkSubjectKey(retry.Controller.ID(), uid, keyA))
		if err == nil {
			var got WorkItem
			if err := json.Unmarshal(raw.Data, &got); err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff([]any{keyA, ReasonRetry, 2}, []any{got.MapKey, got.Reason, got.Attempt}); diff != "" {
				t.Errorf("relayed item (-want +got): key, reason, attempt\n%s", diff)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("key A's schedule never reached MC_WORK: %v", err)
		}
		select {
		case err := <-relayErrs:
			t.Fatalf("relay: %v", err)
		case <-time.After(200 * time.Millisecond):
		}
	}
	if info, err := work.Info(ctx); err != nil || info.State.Msgs != 1 {
		t.Errorf("MC_WORK holds %v messages (err %v), want key A's retry only", info.State.Msgs, err)
	}
}

// TestKeyedPoisonMessageDeadLettered: the DLQ worker parses a keyed stored
// subject, parks the message under the key's own DLQ subject, reports the
// key, and frees the key's per-subject slot.
func TestKeyedPoisonMessageDeadLettered(t *testing.T) {
	js := startBus(t, Options{WorkAckWait: 200 * time.Millisecond})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	dead := make(chan DeadLetter, 1)
	dlqErrs := make(chan error, 16)
	go func() { _ = RunDLQ(ctx, js, func(d DeadLetter) { dead <- d }, func(err error) { dlqErrs <- err }) }()
	key := testMapKey("poison-input")
	it := keyedItem("poison", "dead-0000-1111", key)
	if _, err := (Publisher{JS: js}).PublishWork(ctx, it); err != nil {
		t.Fatal(err)
	}
	part := PartitionOf(SlotKey(it.Controller.ID(), it.Parent.UID, key), DefaultPartitions)
	cons, err := js.Consumer(ctx, WorkStream, PartitionConsumerName(WorkConsumerPrefix, DefaultPartitions, part))
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	var got DeadLetter
	for got.Subject == "" && time.Now().Before(deadline) {
		b, err := cons.Fetch(1, jetstream.FetchMaxWait(300*time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		for range b.Messages() { // never acked: a handler that crashes every time
		}
		select {
		case got = <-dead:
		case err := <-dlqErrs:
			t.Fatalf("dead-letter worker: %v", err)
		default:
		}
	}
	want := DeadLetter{Stream: WorkStream, Subject: StoredWorkSubjectKey(it.Controller.ID(), it.Parent.UID, key),
		Deliveries: MaxDeliver, Parent: it.Parent, MapKey: key}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Fatalf("dead letter (-want +got):\n%s", diff)
	}
	dlq, err := js.Stream(ctx, DLQStream)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := dlq.GetLastMsgForSubject(ctx, DLQSubject("work", it.Controller.ID(), ParentToken(it.Parent.UID, key))); err != nil {
		t.Errorf("message not parked under the key's DLQ subject: %v", err)
	}
	for i := 0; i < 2; i++ {
		if queued, err := (Publisher{JS: js}).PublishWork(ctx, it); err != nil || !queued {
			t.Errorf("publish %d after dead-lettering: queued=%v err=%v", i, queued, err)
		}
	}
}
