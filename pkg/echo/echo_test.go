package echo

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"

	"github.com/metabus/metabus/internal/testing/natstest"
	"github.com/metabus/metabus/pkg/bus"
	"github.com/metabus/metabus/pkg/snapshot"
	"time"
)

func TestIsEcho(t *testing.T) {
	ref := map[string]string{"ctrl": "1", "parent": "10", "child": "20"}
	writes := map[string][]bus.Write{
		// Our status write from what the hook saw, then another on top.
		"parent": {{UID: "parent", From: "10", To: "11"}, {UID: "parent", From: "11", To: "12"},
			// A write against someone else's version 13.
			{UID: "parent", From: "13", To: "14"}},
		"child": {{UID: "child", From: "20", To: "21"}},
		// Objects we created, one updated by us since.
		"made":    {{UID: "made", To: "30"}},
		"made2":   {{UID: "made2", To: "40"}, {UID: "made2", From: "40", To: "41"}},
		"updated": {{UID: "updated", From: "50", To: "51"}},
	}
	of := func(uid string) []bus.Write { return writes[uid] }
	cases := []struct {
		name   string
		reason string
		ref    map[string]string
		now    map[string]string
		// creates: created objects may be echoes (a keyed item).
		creates bool
		want    bool
	}{
		{"unchanged", "the hook would see exactly what it saw", ref,
			map[string]string{"ctrl": "1", "parent": "10", "child": "20"}, false, true},
		{"own status write", "the parent is at the version our write from what the hook saw produced", ref,
			map[string]string{"ctrl": "1", "parent": "11", "child": "20"}, false, true},
		{"chain of own writes", "two of our writes in a row lead from what the hook saw", ref,
			map[string]string{"ctrl": "1", "parent": "12", "child": "21"}, false, true},
		{"own write over someone else's", "our write against a version the hook never saw carries that change along", ref,
			map[string]string{"ctrl": "1", "parent": "14", "child": "20"}, false, false},
		{"someone else changed the child", "a version we did not write is news", ref,
			map[string]string{"ctrl": "1", "parent": "12", "child": "22"}, false, false},
		{"child created", "a new object is news even if we created it", ref,
			map[string]string{"ctrl": "1", "parent": "12", "child": "21", "new": "30"}, false, false},
		{"child deleted", "a missing object is news", ref,
			map[string]string{"ctrl": "1", "parent": "12"}, false, false},
		{"replaced child", "same count, different UID", ref,
			map[string]string{"ctrl": "1", "parent": "12", "other": "21"}, false, false},
		{"controller changed", "a new controller spec may change the answer", ref,
			map[string]string{"ctrl": "2", "parent": "10", "child": "20"}, false, false},
		{"no reference", "nothing known: call the hook", nil,
			map[string]string{"ctrl": "1"}, false, false},
		{"empty version", "an object without a version is never ours",
			map[string]string{"a": "1"}, map[string]string{"a": ""}, false, false},
		{"keyed: own create", "an object we created, as we created it, is no news to a keyed item", ref,
			map[string]string{"ctrl": "1", "parent": "10", "child": "20", "made": "30"}, true, true},
		{"keyed: own create updated by us", "a chain of our writes from the create", ref,
			map[string]string{"ctrl": "1", "parent": "10", "child": "21", "made2": "41"}, true, true},
		{"keyed: create changed by someone", "a created object at a version we did not write is news", ref,
			map[string]string{"ctrl": "1", "parent": "10", "child": "20", "made": "31"}, true, false},
		{"keyed: someone else's create", "an object we never wrote is news", ref,
			map[string]string{"ctrl": "1", "parent": "10", "child": "20", "new": "30"}, true, false},
		{"keyed: update is not a create", "an object the hook never saw that we only updated did not come from us", ref,
			map[string]string{"ctrl": "1", "parent": "10", "child": "20", "updated": "51"}, true, false},
		{"keyed: deleted", "a missing object is news even with creates", ref,
			map[string]string{"ctrl": "1", "parent": "10", "made": "30"}, true, false},
		{"keyed: replaced", "one created, one of the reference gone: still news", ref,
			map[string]string{"ctrl": "1", "parent": "10", "made": "30", "made2": "41"}, true, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := IsEcho(tc.ref, tc.now, of, tc.creates); got != tc.want {
				t.Errorf("%s: IsEcho = %v, want %v", tc.reason, got, tc.want)
			}
		})
	}
}

func obj(uid, rv string) *unstructured.Unstructured {
	u := &unstructured.Unstructured{Object: map[string]any{}}
	u.SetUID(types.UID(uid))
	u.SetResourceVersion(rv)
	return u
}

func TestInputs(t *testing.T) {
	cases := []struct {
		name   string
		reason string
		snap   *snapshot.Response
		want   map[string]string
	}{
		{"all objects", "controller, parent, children and related are all inputs", &snapshot.Response{
			Controller: obj("c", "1"), Parent: obj("p", "2"),
			Children: []snapshot.Group{{Objects: []*unstructured.Unstructured{obj("k1", "3"), obj("k2", "4")}}, {}},
			Related:  []snapshot.Group{{Objects: []*unstructured.Unstructured{obj("r", "5")}}},
		}, map[string]string{"c": "1", "p": "2", "k1": "3", "k2": "4", "r": "5"}},
		{"adoption pending", "an adoption changes what the parent owns", &snapshot.Response{
			Controller: obj("c", "1"), Parent: obj("p", "2"),
			Children: []snapshot.Group{{Objects: []*unstructured.Unstructured{obj("k1", "3")}, Adopt: []*unstructured.Unstructured{obj("k1", "3")}}},
		}, nil},
		{"release pending", "a release changes what the parent owns", &snapshot.Response{
			Controller: obj("c", "1"), Parent: obj("p", "2"),
			Children: []snapshot.Group{{Release: []*unstructured.Unstructured{obj("k1", "3")}}},
		}, nil},
		{"no parent", "nothing to compare", &snapshot.Response{Controller: obj("c", "1")}, nil},
		{"keyed", "a map key's hook is shown the controller, the key's input and the key's outputs; the parent, whose status the per-parent item keeps rewriting, is left out", &snapshot.Response{
			Controller: obj("c", "1"), Parent: obj("p", "2"), MapKey: "k", Input: obj("in", "7"),
			Children: []snapshot.Group{{Objects: []*unstructured.Unstructured{obj("o1", "3")}}, {}},
		}, map[string]string{"c": "1", "in": "7", "o1": "3"}},
		{"keyed and detached", "a detached key has no input: the controller and the outputs are all", &snapshot.Response{
			Controller: obj("c", "1"), Parent: obj("p", "2"), MapKey: "k",
			Children: []snapshot.Group{{Objects: []*unstructured.Unstructured{obj("o1", "3")}}},
		}, map[string]string{"c": "1", "o1": "3"}},
		{"keyed adoption pending", "ownership changes are news for a key too", &snapshot.Response{
			Controller: obj("c", "1"), Parent: obj("p", "2"), MapKey: "k", Input: obj("in", "7"),
			Children: []snapshot.Group{{Objects: []*unstructured.Unstructured{obj("o1", "3")}, Adopt: []*unstructured.Unstructured{obj("o1", "3")}}},
		}, nil},
		{"summary", "a per-parent summary is computed from caches, not shown objects: never an echo", &snapshot.Response{
			Controller: obj("c", "1"), Parent: obj("p", "2"), Summary: map[string]any{"inputs": int64(3)},
		}, nil},
		{"empty summary", "an empty summary is a summary all the same", &snapshot.Response{
			Controller: obj("c", "1"), Parent: obj("p", "2"), Summary: map[string]any{},
		}, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, Inputs(tc.snap)); diff != "" {
				t.Errorf("%s: Inputs (-want +got):\n%s", tc.reason, diff)
			}
		})
	}
}

func TestBook(t *testing.T) {
	ctrl := bus.ControllerRef{Kind: "CompositeController", Name: "c"}
	other := bus.ControllerRef{Kind: "DecoratorController", Name: "d"}
	b := NewBook(2)
	b.Record(&bus.Applied{Controller: ctrl, ParentUID: "p", WorkSeq: 5, Inputs: map[string]string{"p": "1"},
		Writes: []bus.Write{{UID: "p", From: "1", To: "2"}, {UID: "k", From: "6", To: "7"}}})

	t.Run("own write", func(t *testing.T) {
		if !b.Wrote(ctrl.ID(), "k", "7") {
			t.Error("the controller's own write of k is not recognised")
		}
	})
	t.Run("other controller", func(t *testing.T) {
		if b.Wrote(other.ID(), "k", "7") {
			t.Error("one controller's write must be news to another")
		}
	})
	t.Run("other version", func(t *testing.T) {
		if b.Wrote(ctrl.ID(), "k", "8") {
			t.Error("a later version is someone else's change")
		}
	})
	t.Run("echo", func(t *testing.T) {
		if !b.Echo(ctrl.ID(), "p", "", map[string]string{"p": "2"}) {
			t.Error("a sync seeing only our status write must be an echo")
		}
	})
	t.Run("older note keeps newer reference", func(t *testing.T) {
		b.Record(&bus.Applied{Controller: ctrl, ParentUID: "p", WorkSeq: 4, Inputs: map[string]string{"p": "0"}})
		if !b.Echo(ctrl.ID(), "p", "", map[string]string{"p": "2"}) {
			t.Error("an older note replaced a newer reference")
		}
	})
	t.Run("later call is the reference", func(t *testing.T) {
		// The hook was called again (seq 6) with the parent at 3, someone
		// else's change; our write 1→2 no longer leads there.
		b.Called(ctrl.ID(), "p", "", 6, map[string]string{"p": "3"})
		if b.Echo(ctrl.ID(), "p", "", map[string]string{"p": "2"}) {
			t.Error("a write from before the latest call's view must not be an echo")
		}
		if !b.Echo(ctrl.ID(), "p", "", map[string]string{"p": "3"}) {
			t.Error("what the latest call saw must be an echo")
		}
	})
	t.Run("call without inputs", func(t *testing.T) {
		b.Called(ctrl.ID(), "p", "", 7, nil)
		if b.Echo(ctrl.ID(), "p", "", map[string]string{"p": "3"}) {
			t.Error("after a call with unknown inputs nothing is an echo")
		}
	})
	t.Run("recent writes", func(t *testing.T) {
		for i, rv := range []string{"10", "11", "12", "13", "14"} {
			b.Record(&bus.Applied{Controller: ctrl, ParentUID: "q", WorkSeq: uint64(10 + i),
				Writes: []bus.Write{{UID: "x", From: "0", To: rv}}})
		}
		for rv, want := range map[string]bool{"10": false, "11": true, "14": true} {
			if got := b.Wrote(ctrl.ID(), "x", rv); got != want {
				t.Errorf("Wrote(x, %s) = %v, want %v (the last %d writes count)", rv, got, want, recentWrites)
			}
		}
	})
	t.Run("bounded", func(t *testing.T) {
		for _, uid := range []string{"q1", "q2", "q3", "q4", "q5"} {
			b.Record(&bus.Applied{Controller: ctrl, ParentUID: uid, WorkSeq: 99, Inputs: map[string]string{uid: "1"}})
		}
		if b.Echo(ctrl.ID(), "p", "", map[string]string{"p": "3"}) {
			t.Error("a reference survived two generations of newer ones")
		}
		if !b.Echo(ctrl.ID(), "q5", "", map[string]string{"q5": "1"}) {
			t.Error("the newest reference was dropped")
		}
	})
	t.Run("nil book", func(t *testing.T) {
		var nb *Book
		if nb.Wrote("x", "y", "1") || nb.Echo("x", "y", "", map[string]string{"y": "1"}) {
			t.Error("a nil book must know nothing")
		}
	})
}

func TestBookInFlight(t *testing.T) {
	ctrl := bus.ControllerRef{Kind: "CompositeController", Name: "c"}.ID()
	b := NewBook(0)
	b.Called(ctrl, "p", "", 1, map[string]string{"p": "1"})
	now := map[string]string{"p": "2"}

	t.Run("nothing in flight", func(t *testing.T) {
		if b.Await(ctrl, now) != nil {
			t.Error("no write in flight, yet Await returned a channel")
		}
	})
	finish := b.Begin(ctrl, "p", "1")
	wait := b.Await(ctrl, now)
	t.Run("in flight", func(t *testing.T) {
		if wait == nil {
			t.Fatal("a write in flight on an input must be awaitable")
		}
		if b.Echo(ctrl, "p", "", now) {
			t.Error("before the write returns, its result is unknown")
		}
	})
	finish("2")
	t.Run("returned", func(t *testing.T) {
		select {
		case <-wait:
		default:
			t.Fatal("Await's channel did not close when the write returned")
		}
		if !b.Echo(ctrl, "p", "", now) {
			t.Error("once the write returned, its result is an echo")
		}
		if b.Await(ctrl, now) != nil {
			t.Error("a returned write is still in flight")
		}
	})
	t.Run("failed write", func(t *testing.T) {
		done := b.Begin(ctrl, "p", "2")
		done("")
		if b.Echo(ctrl, "p", "", map[string]string{"p": "3"}) {
			t.Error("a failed write produced nothing of ours")
		}
	})
	t.Run("other controller", func(t *testing.T) {
		done := b.Begin(ctrl, "p", "2")
		defer done("")
		if b.Await(bus.ControllerRef{Kind: "DecoratorController", Name: "d"}.ID(), now) != nil {
			t.Error("one controller's write in flight is no reason for another to wait")
		}
	})
}

// TestSuperseded: a conflict requeue may be skipped only once a later
// hook call of the same parent is known and was applied completely.
func TestSuperseded(t *testing.T) {
	ctrl := bus.ControllerRef{Kind: "CompositeController", Name: "c"}
	in := map[string]string{"p": "1"}
	for _, tc := range []struct {
		reason string
		book   func(b *Book)
		seq    uint64
		want   bool
	}{
		{"a later call, applied completely", func(b *Book) {
			b.Called(ctrl.ID(), "p", "", 5, in)
			b.Record(&bus.Applied{Controller: ctrl, ParentUID: "p", WorkSeq: 5, Inputs: in})
		}, 4, true},
		{"a later call whose apply is not known to be done", func(b *Book) {
			b.Called(ctrl.ID(), "p", "", 5, in)
		}, 4, false},
		{"a later call, with an even later one not applied yet", func(b *Book) {
			b.Record(&bus.Applied{Controller: ctrl, ParentUID: "p", WorkSeq: 5, Inputs: in})
			b.Called(ctrl.ID(), "p", "", 6, in)
		}, 4, false},
		{"writes-only notes say nothing about completion", func(b *Book) {
			b.Called(ctrl.ID(), "p", "", 5, in)
			b.Record(&bus.Applied{Controller: ctrl, ParentUID: "p", WorkSeq: 5, Writes: []bus.Write{{UID: "x", From: "1", To: "2"}}})
		}, 4, false},
		{"the requeue is of the latest call itself", func(b *Book) {
			b.Called(ctrl.ID(), "p", "", 5, in)
			b.Record(&bus.Applied{Controller: ctrl, ParentUID: "p", WorkSeq: 5, Inputs: in})
		}, 5, false},
		{"no call known for the parent", func(*Book) {}, 1, false},
	} {
		t.Run(tc.reason, func(t *testing.T) {
			b := NewBook(0)
			tc.book(b)
			if got := b.Superseded(ctrl.ID(), "p", "", tc.seq); got != tc.want {
				t.Errorf("Superseded(%d) = %v, want %v", tc.seq, got, tc.want)
			}
		})
	}
}

// TestBookKeys: the keys of one parent, and its per-parent item, each keep
// their own reference and completion: one key's call or note never makes
// another's sync an echo, nor settles another's conflict requeue.
func TestBookKeys(t *testing.T) {
	ctrl := bus.ControllerRef{Kind: "MapController", Name: "m"}
	inA := map[string]string{"c": "1", "inA": "5"}
	inB := map[string]string{"c": "1", "inB": "6"}
	type verdicts struct {
		EchoA, EchoB, EchoParent             bool
		SupersededA, SupersededB, Superseded bool
	}
	for _, tc := range []struct {
		reason string
		book   func(b *Book)
		want   verdicts
	}{
		{reason: "a call of key a is a reference for key a only", book: func(b *Book) {
			b.Called(ctrl.ID(), "p", "a", 5, inA)
		}, want: verdicts{EchoA: true}},
		{reason: "an applier's note of key b (a call applied completely) is key b's reference and supersedes key b's older requeues only", book: func(b *Book) {
			b.Record(&bus.Applied{Controller: ctrl, ParentUID: "p", MapKey: "b", WorkSeq: 5, Inputs: inB})
		}, want: verdicts{EchoB: true, SupersededB: true}},
		{reason: "a later call of key b does not replace key a's reference", book: func(b *Book) {
			b.Called(ctrl.ID(), "p", "a", 5, inA)
			b.Called(ctrl.ID(), "p", "b", 9, inB)
		}, want: verdicts{EchoA: true, EchoB: true}},
		{reason: "a per-parent call is no key's reference", book: func(b *Book) {
			b.Called(ctrl.ID(), "p", "", 5, inA)
		}, want: verdicts{EchoParent: true}},
		{reason: "key a's call not known to be applied supersedes nothing, while key b's applied one does", book: func(b *Book) {
			b.Called(ctrl.ID(), "p", "a", 9, inA)
			b.Called(ctrl.ID(), "p", "b", 9, inB)
			b.Record(&bus.Applied{Controller: ctrl, ParentUID: "p", MapKey: "b", WorkSeq: 9, Inputs: inB})
		}, want: verdicts{EchoA: true, EchoB: true, SupersededB: true}},
	} {
		t.Run(tc.reason, func(t *testing.T) {
			b := NewBook(0)
			tc.book(b)
			got := verdicts{
				EchoA:       b.Echo(ctrl.ID(), "p", "a", inA),
				EchoB:       b.Echo(ctrl.ID(), "p", "b", inB),
				EchoParent:  b.Echo(ctrl.ID(), "p", "", inA),
				SupersededA: b.Superseded(ctrl.ID(), "p", "a", 1),
				SupersededB: b.Superseded(ctrl.ID(), "p", "b", 1),
				Superseded:  b.Superseded(ctrl.ID(), "p", "", 1),
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("verdicts (-want +got):\n%s", diff)
			}
		})
	}
}

// TestNotesOverNATS: a book records the notes other processes broadcast,
// and skips its own process's (recorded directly when made).
func TestNotesOverNATS(t *testing.T) {
	nc, _ := natstest.Start(t)
	ctrl := bus.ControllerRef{Kind: "CompositeController", Name: "c"}
	b, elsewhere := NewBook(0), NewBook(0)
	if b.Origin() == "" || b.Origin() == elsewhere.Origin() {
		t.Fatalf("books need distinct origins: %q, %q", b.Origin(), elsewhere.Origin())
	}
	sub, err := b.Subscribe(nc)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	note := func(uid string) *bus.Applied {
		return &bus.Applied{Controller: ctrl, ParentUID: "p", WorkSeq: 1, Writes: []bus.Write{{UID: uid, From: "1", To: "2"}}}
	}
	for _, n := range []struct {
		uid, origin string
	}{{"own", b.Origin()}, {"other", elsewhere.Origin()}, {"unnamed", ""}} {
		if err := Publish(nc, note(n.uid), n.origin); err != nil {
			t.Fatal(err)
		}
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for !(b.Wrote(ctrl.ID(), "other", "2") && b.Wrote(ctrl.ID(), "unnamed", "2")) {
		if time.Now().After(deadline) {
			t.Fatalf("notes of other processes not recorded: other %v, unnamed %v", b.Wrote(ctrl.ID(), "other", "2"), b.Wrote(ctrl.ID(), "unnamed", "2"))
		}
		time.Sleep(10 * time.Millisecond)
	}
	// Published first, so delivered before the others on one connection.
	if b.Wrote(ctrl.ID(), "own", "2") {
		t.Error("the book recorded its own process's note from NATS; it must skip it (recorded directly when made)")
	}
	var nilBook *Book
	if nilBook.Origin() != "" {
		t.Error("a nil book has an origin")
	}
}

// TestAnswers: a published answer is outstanding from Expect until the
// Done note of its work sequence, or a later one of its item, arrives;
// what that note says was written is handed out once.
func TestAnswers(t *testing.T) {
	ctrl := bus.ControllerRef{Kind: "CompositeController", Name: "c"}
	done := func(key string, seq uint64, fresh map[string]string) *bus.Applied {
		return &bus.Applied{Controller: ctrl, ParentUID: "p", MapKey: key, WorkSeq: seq, Done: true, Fresh: fresh}
	}
	type step struct {
		expect uint64       // Expect this work sequence, when not 0
		cancel bool         // cancel that expectation at once (a failed publish)
		note   *bus.Applied // then record this note, when not nil
	}
	type want struct {
		applying bool
		written  map[string]string
	}
	fresh := map[string]string{"/configmaps": "12", "example.com/things": "13"}
	cases := []struct {
		reason string
		key    string
		steps  []step
		want   want
	}{
		{reason: "nothing published: nothing to wait for", want: want{}},
		{reason: "published, no note yet: outstanding", steps: []step{{expect: 5}}, want: want{applying: true}},
		{reason: "its Done note ends it and hands out what it wrote", steps: []step{{expect: 5, note: done("", 5, fresh)}},
			want: want{written: fresh}},
		{reason: "a later answer's Done note ends it too (an item's answers apply in order)",
			steps: []step{{expect: 5, note: done("", 7, fresh)}}, want: want{written: fresh}},
		{reason: "an earlier answer's Done note does not", steps: []step{{expect: 5, note: done("", 4, fresh)}},
			want: want{applying: true}},
		{reason: "a note without Done (a write as it happens) does not",
			steps: []step{{expect: 5, note: &bus.Applied{Controller: ctrl, ParentUID: "p", WorkSeq: 5,
				Writes: []bus.Write{{UID: "x", From: "1", To: "2"}}}}}, want: want{applying: true}},
		{reason: "another key's Done note does not", steps: []step{{expect: 5, note: done("k", 5, fresh)}},
			want: want{applying: true}},
		{reason: "a Done note that came before an answer was expected does not end it",
			steps: []step{{note: done("", 5, fresh)}, {expect: 6}}, want: want{applying: true}},
		{reason: "a failed publish is not waited for", steps: []step{{expect: 5, cancel: true}}, want: want{}},
		{reason: "a newer answer replaces an ended one", steps: []step{{expect: 5, note: done("", 5, fresh)}, {expect: 6}},
			want: want{applying: true}},
	}
	for _, tc := range cases {
		t.Run(tc.reason, func(t *testing.T) {
			b := NewBook(0)
			for _, s := range tc.steps {
				if s.expect != 0 {
					cancel := b.Expect(ctrl.ID(), "p", tc.key, s.expect)
					if s.cancel {
						cancel()
					}
				}
				if s.note != nil {
					b.Record(s.note)
				}
			}
			ch := b.Applying(ctrl.ID(), "p", tc.key)
			got := want{applying: ch != nil, written: b.Written(ctrl.ID(), "p", tc.key)}
			if diff := cmp.Diff(tc.want, got, cmp.AllowUnexported(want{})); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
			if got.written != nil {
				if again := b.Written(ctrl.ID(), "p", tc.key); again != nil {
					t.Errorf("Written handed out %v twice", again)
				}
			}
		})
	}
}

// TestApplyingCloses: the channel Applying returns closes when the Done
// note arrives, so a waiting sync goes on at once.
func TestApplyingCloses(t *testing.T) {
	ctrl := bus.ControllerRef{Kind: "CompositeController", Name: "c"}
	b := NewBook(0)
	b.Expect(ctrl.ID(), "p", "", 3)
	ch := b.Applying(ctrl.ID(), "p", "")
	select {
	case <-ch:
		t.Fatal("closed before the Done note")
	default:
	}
	b.Record(&bus.Applied{Controller: ctrl, ParentUID: "p", WorkSeq: 3, Done: true})
	select {
	case <-ch:
	default:
		t.Fatal("not closed by the Done note")
	}
	if b.Applying(ctrl.ID(), "p", "") != nil {
		t.Error("still outstanding after its Done note")
	}
}

// TestShown: only exactly what the item's latest call was shown is a
// repeat; any object added, removed or at another version is not, nor is
// anything after a call whose inputs were not just objects.
func TestShown(t *testing.T) {
	ref := map[string]string{"ctrl": "1", "parent": "10", "child": "20"}
	cases := []struct {
		reason string
		called map[string]string // the latest call's inputs (nil: not objects alone)
		key    string            // the item asked about
		now    map[string]string
		want   bool
	}{
		{reason: "the same objects at the same versions", called: ref, now: ref, want: true},
		{reason: "the parent at a newer version (our own status write included)", called: ref,
			now: map[string]string{"ctrl": "1", "parent": "11", "child": "20"}},
		{reason: "a child more", called: ref, now: map[string]string{"ctrl": "1", "parent": "10", "child": "20", "new": "30"}},
		{reason: "a child less", called: ref, now: map[string]string{"ctrl": "1", "parent": "10"}},
		{reason: "the controller changed", called: ref, now: map[string]string{"ctrl": "2", "parent": "10", "child": "20"}},
		{reason: "a call whose inputs were not just objects", called: nil, now: ref},
		{reason: "another key of the parent", called: ref, key: "k", now: ref},
		{reason: "nothing shown now (inputs not just objects)", called: ref, now: nil},
	}
	for _, tc := range cases {
		t.Run(tc.reason, func(t *testing.T) {
			b := NewBook(0)
			b.Called("ctrl", "p", "", 1, tc.called)
			if got := b.Shown("ctrl", "p", tc.key, tc.now); got != tc.want {
				t.Errorf("Shown = %v, want %v", got, tc.want)
			}
		})
	}
}
