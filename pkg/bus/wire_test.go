package bus

import (
	"crypto/sha256"
	"encoding/base32"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func item(ctrl, uid string) WorkItem {
	return WorkItem{
		Controller: ControllerRef{Kind: "CompositeController", Name: ctrl},
		Parent:     ObjectRef{APIVersion: "example.com/v1", Kind: "Thing", Resource: "things", Namespace: "ns", Name: "a", UID: uid},
		Reason:     ReasonEvent,
	}
}

func keyedItem(ctrl, uid, mapKey string) WorkItem {
	it := item(ctrl, uid)
	it.MapKey = mapKey
	return it
}

func TestControllerID(t *testing.T) {
	for _, tc := range []struct{ kind, name, want, reason string }{
		{"CompositeController", "hello-controller", "cc-hello-controller", "the prefix of existing streams' subjects"},
		{"DecoratorController", "svc.per.pod", "dc-svc_per_pod", "dots map to underscores, which names cannot contain"},
		{"MapController", "snap", "mc-snap", "a new kind gets its initials"},
	} {
		t.Run(tc.reason, func(t *testing.T) {
			id := ControllerID(tc.kind, tc.name)
			if id != tc.want || !validToken(id) {
				t.Errorf("ControllerID(%q, %q) = %q, want %q, a subject token", tc.kind, tc.name, id, tc.want)
			}
		})
	}
}

func TestPartitionFilters(t *testing.T) {
	for _, tc := range []struct {
		reason string
		n, p   int
		want   []string // first filters
		count  int
	}{
		{reason: "the default layout: one wildcard per partition", n: 64, p: 7, want: []string{"mc.work.7.*.>"}, count: 1},
		{reason: "fewer partitions: the groups congruent to p", n: 8, p: 3, want: []string{"mc.work.3.*.>", "mc.work.11.*.>", "mc.work.19.*.>"}, count: 8},
		{reason: "one partition: every group", n: 1, p: 0, want: []string{"mc.work.0.*.>", "mc.work.1.*.>"}, count: 64},
		{reason: "more partitions: whole slots within the group", n: 128, p: 7, want: []string{"mc.work.7.7.>", "mc.work.7.135.>", "mc.work.7.263.>"}, count: 8},
		{reason: "one slot per partition", n: 1024, p: 1000, want: []string{"mc.work.40.1000.>"}, count: 1},
	} {
		t.Run(tc.reason, func(t *testing.T) {
			got := PartitionFilters(workRoot, tc.n, tc.p)
			if len(got) != tc.count {
				t.Errorf("%d filters, want %d", len(got), tc.count)
			}
			if diff := cmp.Diff(tc.want, got[:min(len(got), len(tc.want))]); diff != "" {
				t.Errorf("filters (-want +got):\n%s", diff)
			}
		})
	}
	// Every stored subject matches exactly the partition of its slot, in
	// every layout; a subject stored before slots (<root>.<slot mod
	// 64>.<ctrl>.<uid>) matches it too when the count divides 64.
	for n := 1; n <= Slots; n *= 2 {
		filters := make([][]string, n)
		for p := range n {
			filters[p] = PartitionFilters(workRoot, n, p)
		}
		for slot := range Slots {
			subjects := []string{fmt.Sprintf("mc.work.%d.%d.cc-x.uid", slot%groups, slot)}
			if n <= groups {
				subjects = append(subjects, fmt.Sprintf("mc.work.%d.cc-x.uid", slot%groups))
			}
			for _, subj := range subjects {
				var in []int
				for p := range n {
					if slices.ContainsFunc(filters[p], func(f string) bool { return subjectMatches(f, subj) }) {
						in = append(in, p)
					}
				}
				if len(in) != 1 || in[0] != PartitionOf(slot, n) {
					t.Fatalf("n=%d: %s matched by partitions %v, want only %d", n, subj, in, PartitionOf(slot, n))
				}
			}
		}
	}
	for _, n := range []int{0, 3, 100, 2048} {
		if ValidPartitions(n) == nil {
			t.Errorf("%d partitions accepted", n)
		}
	}
}

func TestParsePartitionConsumer(t *testing.T) {
	type out struct {
		Suffix string
		N      int
		OK     bool
	}
	for _, tc := range []struct {
		reason, name string
		want         out
	}{
		{reason: "current layout", name: "work-64-p07", want: out{"64-p07", 64, true}},
		{reason: "a layout of 1024", name: "work-1024-p1000", want: out{"1024-p1000", 1024, true}},
		{reason: "legacy name: 64 partitions, lease lease.<stage>.pNN", name: "work-p07", want: out{"p07", LegacyPartitions, true}},
		{reason: "another prefix", name: "desired-64-p07", want: out{}},
		{reason: "not a partition consumer", name: "work-relay", want: out{}},
		{reason: "garbage after p", name: "work-64-pxx", want: out{}},
		{reason: "garbage count", name: "work-x-p01", want: out{}},
	} {
		t.Run(tc.reason, func(t *testing.T) {
			s, n, ok := ParsePartitionConsumer(WorkConsumerPrefix, tc.name)
			if diff := cmp.Diff(tc.want, out{s, n, ok}); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}

// TestPartitionsOf: a stream's partition count comes from its metadata; a
// stream without the key was made before the setting existed, with the 64
// partitions of those releases, and keeps them: the count of a new
// installation (DefaultPartitions) must never be read into an old one.
func TestPartitionsOf(t *testing.T) {
	type out struct {
		N   int
		Err bool
	}
	for _, tc := range []struct {
		reason string
		md     map[string]string
		want   out
	}{
		{reason: "set by Ensure", md: map[string]string{PartitionsMetadata: "16"}, want: out{N: 16}},
		{reason: "an installation made with 64", md: map[string]string{PartitionsMetadata: "64"}, want: out{N: 64}},
		{reason: "a stream from before the setting has the legacy count", md: nil, want: out{N: LegacyPartitions}},
		{reason: "other metadata only", md: map[string]string{"_nats.req.level": "1"}, want: out{N: LegacyPartitions}},
		{reason: "not a number", md: map[string]string{PartitionsMetadata: "many"}, want: out{Err: true}},
		{reason: "not a power of two", md: map[string]string{PartitionsMetadata: "12"}, want: out{Err: true}},
		{reason: "beyond the slots", md: map[string]string{PartitionsMetadata: "2048"}, want: out{Err: true}},
	} {
		t.Run(tc.reason, func(t *testing.T) {
			n, err := PartitionsOf(tc.md)
			if diff := cmp.Diff(tc.want, out{N: n, Err: err != nil}); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}

func TestParseWeight(t *testing.T) {
	cases := []struct {
		reason, in string
		want       int
		wantErr    bool
	}{
		{reason: "absent is 1", in: "", want: 1},
		{reason: "a plain integer", in: "5", want: 5},
		{reason: "the maximum", in: "100", want: 100},
		{reason: "over the maximum", in: "101", want: 1, wantErr: true},
		{reason: "zero", in: "0", want: 1, wantErr: true},
		{reason: "not a number", in: "high", want: 1, wantErr: true},
	}
	for _, c := range cases {
		t.Run(c.reason, func(t *testing.T) {
			got, err := ParseWeight(c.in)
			if got != c.want || (err != nil) != c.wantErr {
				t.Errorf("ParseWeight(%q) = %d, %v; want %d, error %v", c.in, got, err, c.want, c.wantErr)
			}
		})
	}
}

// testMapKey has the shape of a mapctl map key (52 lower-case base32
// characters of a SHA-256) without importing mapctl, which the bus must
// not depend on.
func testMapKey(input string) string {
	sum := sha256.Sum256([]byte(input))
	return strings.ToLower(base32.StdEncoding.WithPadding(base32.NoPadding).EncodeToString(sum[:]))
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
			m, err := NewEvent("mc.work.x.y", TypeSyncRequested, "id", it.Controller, it.Parent, tc.body,
				WithItemKey(tc.ext, tc.mapKey, tc.itemKey))
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
			got, err := CheckedParentToken(tc.uid, tc.key)
			if (err != nil) != tc.wantErr {
				t.Fatalf("CheckedParentToken(%q, %q) error = %v, want error %v", tc.uid, tc.key, err, tc.wantErr)
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
			for _, f := range PartitionFilters(workRoot, n, p) {
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
	// The most partitions an installation has unless it asks for more
	// (LegacyPartitions; new ones get fewer): the spread is the slots'.
	const spreadPartitions = LegacyPartitions
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
				parts[PartitionOf(slot, spreadPartitions)] = true
			}
			if len(parts) < tc.minParts {
				t.Errorf("%d keys of one parent in %d of %d partitions, want at least %d", tc.keys, len(parts), spreadPartitions, tc.minParts)
			}
		})
	}
}

// subjectMatches is NATS subject matching with * and > wildcards.
func subjectMatches(filter, subject string) bool {
	f, s := strings.Split(filter, "."), strings.Split(subject, ".")
	for i, tok := range f {
		switch {
		case tok == ">":
			return len(s) > i
		case i >= len(s):
			return false
		case tok != "*" && tok != s[i]:
			return false
		}
	}
	return len(f) == len(s)
}

// No stream is compressed: nats-server's recovery of a compressed file
// store after a SIGKILL lost a replica of MC_DESIRED in a clustered fault
// run (see DesiredStreamConfig), and none of the uncompressed streams.
func TestNoStreamCompressed(t *testing.T) {
	for _, o := range []Options{{}, {Replicas: 3}} {
		for _, c := range []StreamConfig{WorkStreamConfig(o), DesiredStreamConfig(o), SchedStreamConfig(o),
			AdvisoryStreamConfig(o), DLQStreamConfig(o)} {
			if c.Compressed {
				t.Errorf("%s (replicas %d) is compressed", c.Name, o.Replicas)
			}
		}
	}
}

func TestNextAttempt(t *testing.T) {
	tests := []struct {
		reason string
		prev   int
		ours   bool
		want   int
	}{
		{reason: "a hook failure counts one more", prev: 0, want: 1},
		{reason: "hook failures go on counting past the own-failure bound", prev: 9, want: 10},
		{reason: "metabus's own failure counts one more while short", prev: 2, ours: true, want: 3},
		{reason: "metabus's own failures stop at the bound", prev: OwnFailureAttempts, ours: true, want: OwnFailureAttempts},
		{reason: "metabus's own failure keeps a count the hook raised", prev: 9, ours: true, want: 9},
		{reason: "a hook failure after own failures goes on from the bound", prev: OwnFailureAttempts, want: OwnFailureAttempts + 1},
		{reason: "a negative count is no count", prev: -3, ours: true, want: 1},
	}
	for _, tt := range tests {
		t.Run(tt.reason, func(t *testing.T) {
			if diff := cmp.Diff(tt.want, NextAttempt(tt.prev, tt.ours)); diff != "" {
				t.Errorf("NextAttempt(%d, %v) (-want +got):\n%s", tt.prev, tt.ours, diff)
			}
		})
	}
	if got := Backoff(OwnFailureAttempts); got != 16*time.Second {
		t.Errorf("Backoff(OwnFailureAttempts) = %s, want 16s (the bound its doc states)", got)
	}
}
