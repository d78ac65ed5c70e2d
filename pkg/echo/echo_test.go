package echo

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"

	"github.com/metabus/metabus/pkg/bus"
	"github.com/metabus/metabus/pkg/snapshot"
)

func TestIsEcho(t *testing.T) {
	last := &bus.Applied{
		Inputs: map[string]string{"ctrl": "1", "parent": "10", "child": "20"},
		Wrote:  map[string]string{"parent": "12", "child": "21"},
	}
	cases := []struct {
		name   string
		reason string
		last   *bus.Applied
		now    map[string]string
		want   bool
	}{
		{"unchanged", "the hook would see exactly what it saw", last,
			map[string]string{"ctrl": "1", "parent": "10", "child": "20"}, true},
		{"own status write", "the parent is at the version our status write produced", last,
			map[string]string{"ctrl": "1", "parent": "12", "child": "20"}, true},
		{"own writes everywhere", "parent and child both at our versions", last,
			map[string]string{"ctrl": "1", "parent": "12", "child": "21"}, true},
		{"someone else changed the child", "a version we did not write is news", last,
			map[string]string{"ctrl": "1", "parent": "12", "child": "22"}, false},
		{"parent changed after our write", "a later version than ours is news", last,
			map[string]string{"ctrl": "1", "parent": "13", "child": "20"}, false},
		{"child created", "a new object is news even if we created it", last,
			map[string]string{"ctrl": "1", "parent": "12", "child": "21", "new": "30"}, false},
		{"child deleted", "a missing object is news", last,
			map[string]string{"ctrl": "1", "parent": "12"}, false},
		{"replaced child", "same count, different UID", last,
			map[string]string{"ctrl": "1", "parent": "12", "other": "21"}, false},
		{"controller changed", "a new controller spec may change the answer", last,
			map[string]string{"ctrl": "2", "parent": "10", "child": "20"}, false},
		{"no note", "nothing known: call the hook", nil,
			map[string]string{"ctrl": "1"}, false},
		{"note without inputs", "a rolling sync's note never matches", &bus.Applied{Wrote: map[string]string{"a": "1"}},
			map[string]string{}, false},
		{"empty version", "an object without a version is never ours", &bus.Applied{
			Inputs: map[string]string{"a": "1"}, Wrote: map[string]string{"a": ""}},
			map[string]string{"a": ""}, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := IsEcho(tc.last, tc.now); got != tc.want {
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
	b.Record(&bus.Applied{Controller: ctrl, ParentUID: "p", WorkSeq: 5,
		Inputs: map[string]string{"p": "1"}, Wrote: map[string]string{"p": "2", "k": "7"}})

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
		if !b.Echo(ctrl.ID(), "p", map[string]string{"p": "2"}) {
			t.Error("a sync seeing only our status write must be an echo")
		}
	})
	t.Run("older note ignored", func(t *testing.T) {
		b.Record(&bus.Applied{Controller: ctrl, ParentUID: "p", WorkSeq: 4, Inputs: map[string]string{"p": "0"}})
		if !b.Echo(ctrl.ID(), "p", map[string]string{"p": "2"}) {
			t.Error("an older note replaced a newer one")
		}
	})
	t.Run("bounded", func(t *testing.T) {
		for _, uid := range []string{"q1", "q2", "q3", "q4", "q5"} {
			b.Record(&bus.Applied{Controller: ctrl, ParentUID: uid, WorkSeq: 9, Inputs: map[string]string{uid: "1"}})
		}
		if b.Echo(ctrl.ID(), "p", map[string]string{"p": "2"}) {
			t.Error("a note survived two generations of newer ones")
		}
		if !b.Echo(ctrl.ID(), "q5", map[string]string{"q5": "1"}) {
			t.Error("the newest note was dropped")
		}
	})
	t.Run("nil book", func(t *testing.T) {
		var nb *Book
		if nb.Wrote("x", "y", "1") || nb.Echo("x", "y", map[string]string{"y": "1"}) {
			t.Error("a nil book must know nothing")
		}
	})
}
