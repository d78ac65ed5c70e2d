package main

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"k8s.io/apimachinery/pkg/types"
)

// TestReplacedNamesEachChildsLife: a parent that controlled two
// ConfigMaps is reported with both, oldest first (resourceVersion breaks
// a tie of creation seconds), with the gen each was created with, when it
// was deleted, and when the parent's deletion began: what tells a stale
// answer applied after the finalize hook's from any other replacement.
func TestReplacedNamesEachChildsLife(t *testing.T) {
	at := func(s string) time.Time {
		tm, err := time.Parse("15:04:05.000", s)
		if err != nil {
			t.Fatal(err)
		}
		return tm
	}
	tr := &childTracker{
		children: map[types.UID]map[types.UID]*childLife{
			"p1": {
				"cm-b": {parent: "p-00056", created: at("19:08:36.000"), gen: "8", rv: "2320", deleted: at("19:09:12.500")},
				"cm-a": {parent: "p-00056", created: at("19:08:19.000"), gen: "6", rv: "1673", deleted: at("19:08:34.100")},
			},
			"p2": {"cm-c": {parent: "p-00001", created: at("19:08:00.000"), gen: "1", rv: "9"}},
			"p3": {
				"cm-e": {parent: "p-00002", created: at("19:08:00.000"), gen: "3", rv: "120"},
				"cm-d": {parent: "p-00002", created: at("19:08:00.000"), gen: "2", rv: "99", deleted: at("19:08:00.900")},
			},
		},
		deleting: map[types.UID]time.Time{"p1": at("19:08:23.000")},
	}
	want := []string{
		"p-00002 (uid p3) controlled 2 different ConfigMaps over its life: cm-d created 19:08:00.000 with gen 2 (resourceVersion 99), deleted by 19:08:00.900; cm-e created 19:08:00.000 with gen 3 (resourceVersion 120)",
		"p-00056 (uid p1) controlled 2 different ConfigMaps over its life: cm-a created 19:08:19.000 with gen 6 (resourceVersion 1673), deleted by 19:08:34.100; cm-b created 19:08:36.000 with gen 8 (resourceVersion 2320), deleted by 19:09:12.500; the parent was being deleted from 19:08:23.000",
	}
	if diff := cmp.Diff(want, sorted(tr.replaced())); diff != "" {
		t.Errorf("replaced (-want +got):\n%s", diff)
	}
}

// TestObservedGenerationGoingBack: the generation a parent's status
// records going back is an order violation, as the held answer of
// generation 3 applied after the finalize answer of generation 5 showed
// (its child and status gens did not go back: the finalize answer has
// none).
func TestObservedGenerationGoingBack(t *testing.T) {
	tr := &childTracker{gens: map[genKey]genSeen{}}
	k := genKey{"p1", "observedGeneration"}
	for _, g := range []struct {
		gen int64
		rv  string
	}{{1, "1681"}, {5, "2237"}, {3, "2342"}, {5, "2681"}} {
		tr.sawGen(k, "p-00056", g.gen, g.rv)
	}
	got, versions := tr.genRegressions()
	want := []string{"p-00056 (uid p1): the observedGeneration showed gen 3 at resourceVersion 2342, after gen 5 at 2237"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("regressions (-want +got):\n%s", diff)
	}
	if versions != 4 {
		t.Errorf("versions looked at: %d, want 4", versions)
	}
}
