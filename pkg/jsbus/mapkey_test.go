package jsbus

import (
	"context"
	"crypto/sha256"
	"encoding/base32"
	"encoding/json"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/metabus/metabus/pkg/bus"
	"github.com/metabus/metabus/pkg/outcome"
)

// testMapKey has the shape of a mapctl map key (52 lower-case base32
// characters of a SHA-256) without importing mapctl.
func testMapKey(input string) string {
	sum := sha256.Sum256([]byte(input))
	return strings.ToLower(base32.StdEncoding.WithPadding(base32.NoPadding).EncodeToString(sum[:]))
}

func keyedItem(ctrl, uid, mapKey string) bus.WorkItem {
	it := item(ctrl, uid)
	it.MapKey = mapKey
	return it
}

// TestKeyedWorkDeduplicatedPerKey: MC_WORK keeps one in-flight and one
// pending item per (parent, key): keys of one parent and its per-parent
// item never collapse into each other, the same key does (refused as
// already queued, like a parent), and the server stores each under the
// subject and slot the client computes.
func TestKeyedWorkDeduplicatedPerKey(t *testing.T) {
	js := startBus(t, bus.Options{})
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
	st, err := js.Stream(ctx, bus.WorkStream)
	if err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{keyA, keyB, ""} {
		it := keyedItem("fan", uid, key)
		t.Run("stored/"+it.Key(), func(t *testing.T) {
			raw, err := st.GetLastMsgForSubject(ctx, bus.StoredWorkSubjectKey(it.Controller.ID(), uid, key))
			if err != nil {
				t.Fatalf("not stored where the client expects (slot %d): %v", bus.SlotKey(it.Controller.ID(), uid, key), err)
			}
			slot, ctrl, gotUID, gotKey, err := bus.ParseStoredSubjectKey(raw.Subject)
			if err != nil {
				t.Fatal(err)
			}
			var body bus.WorkItem
			if err := json.Unmarshal(raw.Data, &body); err != nil {
				t.Fatal(err)
			}
			want := []any{bus.SlotKey(it.Controller.ID(), uid, key), it.Controller.ID(), uid, key, key, it.Key()}
			got := []any{slot, ctrl, gotUID, gotKey, body.MapKey, raw.Header.Get("ce-" + bus.ExtPartitionKey)}
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
	js := startBus(t, bus.Options{})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pub := Publisher{JS: js}
	const uid = "11111111-2222-3333-4444-555555555555"
	keys := []string{testMapKey("input-a"), testMapKey("input-b"), ""}
	ctrl := bus.ControllerRef{Kind: "MapController", Name: "fan"}
	const perKey = 5
	want := map[string][]uint64{}
	seq := uint64(0)
	for i := 0; i < perKey; i++ {
		for _, k := range keys { // interleaved, as parallel syncs publish
			seq++
			ds := bus.DesiredState{Controller: ctrl, Parent: item("fan", uid).Parent, MapKey: k, WorkSeq: seq, Hook: bus.HookSync}
			if err := pub.PublishDesired(ctx, ds); err != nil {
				t.Fatal(err)
			}
			want[ds.Key()] = append(want[ds.Key()], seq)
		}
	}
	// The applier's superseded check reads the last desired state of the
	// item's own stored subject: per key.
	st, err := js.Stream(ctx, bus.DesiredStream)
	if err != nil {
		t.Fatal(err)
	}
	lastOf := map[string]uint64{}
	wantLast := map[string]uint64{}
	for _, k := range keys {
		raw, err := st.GetLastMsgForSubject(ctx, bus.StoredDesiredSubjectKey(ctrl.ID(), uid, k))
		if err != nil {
			t.Fatalf("last desired state of key %q: %v", k, err)
		}
		var ds bus.DesiredState
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
		_ = Consume(ctx, js, ConsumeConfig{Stream: bus.DesiredStream, Prefix: bus.DesiredConsumerPrefix, Stage: bus.DesiredStage,
			PerController: 8, Ordered: true},
			func(hctx context.Context, m jetstream.Msg) outcome.Outcome {
				var ds bus.DesiredState
				if err := Decode(m, bus.TypeDesired, &ds); err != nil {
					t.Error(err)
					return outcome.Terminal("malformed")
				}
				if ds.MapKey == "" {
					// The per-parent state waits until every keyed one
					// ran: were they serialized with it, they never would.
					select {
					case <-keyedDone:
					case <-hctx.Done():
						return outcome.Outcome{}
					case <-time.After(15 * time.Second):
						t.Error("keyed desired states waited for the per-parent one")
					}
				}
				mu.Lock()
				got[ds.Key()] = append(got[ds.Key()], ds.WorkSeq)
				keyed := 0
				for _, k := range keys[:2] {
					keyed += len(got[bus.ItemKey(ctrl.ID(), uid, k)])
				}
				total := keyed + len(got[bus.ItemKey(ctrl.ID(), uid, "")])
				mu.Unlock()
				if keyed == 2*perKey {
					keyedOnce.Do(func() { close(keyedDone) })
				}
				if total == 3*perKey {
					allOnce.Do(func() { close(allDone) })
				}
				return outcome.Done()
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
	js := startBus(t, bus.Options{})
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
	sched, err := js.Stream(ctx, bus.SchedStream)
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{keyA, keyB, ""} {
		subject, err := bus.SchedSubject(bus.ControllerID("CompositeController", "sched"), bus.ParentToken(uid, k))
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
	retry.Reason, retry.Attempt = bus.ReasonRetry, 2
	if err := pub.Schedule(ctx, retry, time.Now()); err != nil {
		t.Fatal(err)
	}
	work, err := js.Stream(ctx, bus.WorkStream)
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		raw, err := work.GetLastMsgForSubject(ctx, bus.StoredWorkSubjectKey(retry.Controller.ID(), uid, keyA))
		if err == nil {
			var got bus.WorkItem
			if err := json.Unmarshal(raw.Data, &got); err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff([]any{keyA, bus.ReasonRetry, 2}, []any{got.MapKey, got.Reason, got.Attempt}); diff != "" {
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
	t.Parallel() // waits out leases and AckWaits, on a server of its own
	js := startBus(t, bus.Options{WorkAckWait: 200 * time.Millisecond})
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
	part := bus.PartitionOf(bus.SlotKey(it.Controller.ID(), it.Parent.UID, key), bus.DefaultPartitions)
	cons, err := js.Consumer(ctx, bus.WorkStream, bus.PartitionConsumerName(bus.WorkConsumerPrefix, bus.DefaultPartitions, part))
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
	want := DeadLetter{Stream: bus.WorkStream, Subject: bus.StoredWorkSubjectKey(it.Controller.ID(), it.Parent.UID, key),
		Deliveries: bus.MaxDeliver, Parent: it.Parent, MapKey: key}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Fatalf("dead letter (-want +got):\n%s", diff)
	}
	dlq, err := js.Stream(ctx, bus.DLQStream)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := dlq.GetLastMsgForSubject(ctx, bus.DLQSubject("work", it.Controller.ID(), bus.ParentToken(it.Parent.UID, key))); err != nil {
		t.Errorf("message not parked under the key's DLQ subject: %v", err)
	}
	for i := 0; i < 2; i++ {
		if queued, err := (Publisher{JS: js}).PublishWork(ctx, it); err != nil || !queued {
			t.Errorf("publish %d after dead-lettering: queued=%v err=%v", i, queued, err)
		}
	}
}
