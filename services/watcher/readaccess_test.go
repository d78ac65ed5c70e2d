package watcher

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/record"

	"github.com/metabus/metabus/pkg/events/recorder"
	ctlid "github.com/metabus/metabus/pkg/identity"
	"github.com/metabus/metabus/pkg/readaccess"
	"github.com/metabus/metabus/pkg/snapshot"
)

// grants is a fake SubjectAccessReview: "<resource> <namespace> <verb>"
// entries allowed ("" namespace: cluster-wide), or an error for every
// review. It counts the reviews asked.
type grants struct {
	mu      sync.Mutex
	allowed []string
	err     error
	asked   int
}

func (g *grants) review(_ context.Context, s readaccess.Scope, verb string) (bool, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.asked++
	if g.err != nil {
		return false, g.err
	}
	return slices.Contains(g.allowed, s.Resource+" "+s.Namespace+" "+verb), nil
}

func (g *grants) count() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.asked
}

// TestSnapshotReadAccess: a controller acting as a ServiceAccount is sent
// only what the account may list and watch; the rest is withheld, with one
// Event per scope on the controller, and a scope not yet answered is never
// sent.
func TestSnapshotReadAccess(t *testing.T) {
	app := map[string]string{"app": "x"}
	objs := []runtime.Object{
		thing("p", "10", map[string]string{"deco": "yes"}, map[string]any{"app": "x"}),
		configMap("kept", "20", app, nil, "p"),
	}
	account := ctlid.Identity{Namespace: "team", Name: "reader"}
	both := func(res, ns string) []string { return []string{res + " " + ns + " list", res + " " + ns + " watch"} }
	type summary struct {
		Result, Message string
		Children        []string
		Events          []string
		Withheld        float64
	}
	cases := []struct {
		reason   string
		identity ctlid.Identity
		grants   *grants
		want     summary
		// reviews is how many reviews the two snapshots ask.
		reviews int
	}{
		{
			reason: "no identity: everything, as upstream, and no review at all",
			want:   summary{Result: snapshot.OK, Children: []string{"kept"}},
		},
		{
			reason:   "parents and children readable cluster-wide: everything, reviewed once",
			identity: account, grants: &grants{allowed: slices.Concat(both("things", ""), both("configmaps", ""))},
			want:    summary{Result: snapshot.OK, Children: []string{"kept"}},
			reviews: 4,
		},
		{
			reason:   "children readable in the parent's namespace only: everything",
			identity: account, grants: &grants{allowed: slices.Concat(both("things", ""), both("configmaps", "ns"))},
			want:    summary{Result: snapshot.OK, Children: []string{"kept"}},
			reviews: 5,
		},
		{
			reason:   "children not readable: withheld, one Event for both snapshots, each counted",
			identity: account, grants: &grants{allowed: slices.Concat(both("things", ""), []string{"configmaps ns list"})},
			want: summary{Result: snapshot.OK, Withheld: 2, Events: []string{"Warning ReadWithheld ServiceAccount team/reader may not list and watch " +
				"configmaps in namespace ns: its objects are withheld from the hooks (granting list and watch brings them in within --read-recheck-interval)"}},
			reviews: 5,
		},
		{
			reason:   "parent not readable: as if it did not exist",
			identity: account, grants: &grants{allowed: both("configmaps", "")},
			want: summary{Result: snapshot.NotFound, Message: "parent withheld: ServiceAccount team/reader may not read it", Withheld: 2,
				Events: []string{"Warning ReadWithheld ServiceAccount team/reader may not list and watch things.example.com in namespace ns: " +
					"its objects are withheld from the hooks (granting list and watch brings them in within --read-recheck-interval)"}},
			reviews: 2,
		},
		{
			reason:   "reviews failing: nothing sent, retried",
			identity: account, grants: &grants{err: errors.New("apiserver down")},
			want: summary{Result: snapshot.Retry, Message: "read access of ServiceAccount team/reader to things.example.com in namespace ns not reviewed yet: " +
				"review of list for things.example.com (cluster-wide): apiserver down"},
			reviews: 2,
		},
	}
	for _, tc := range cases {
		t.Run(tc.reason, func(t *testing.T) {
			w, wr := wired(t, compositeObj, objs...)
			fake := record.NewFakeRecorder(10)
			w.rec = &recorder.Recorder{EventRecorder: fake}
			if tc.grants == nil {
				tc.grants = &grants{}
			}
			w.reads = readaccess.NewCache(tc.grants.review, readaccess.Options{})
			wr.identity = tc.identity
			var resp *snapshot.Response
			for range 2 {
				var err error
				resp, err = w.Snapshot(context.Background(), snapshot.Request{Controller: wr.ref, ParentUID: "p-uid"})
				if err != nil {
					t.Fatal(err)
				}
			}
			got := summary{Result: resp.Result, Message: resp.Message, Withheld: testutil.ToFloat64(w.metrics.withheld)}
			for _, g := range resp.Children {
				for _, o := range g.Objects {
					got.Children = append(got.Children, o.GetName())
				}
			}
			sort.Strings(got.Children)
			close(fake.Events)
			for e := range fake.Events {
				got.Events = append(got.Events, e)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("snapshot (-want +got):\n%s", diff)
			}
			if n := tc.grants.count(); n != tc.reviews {
				t.Errorf("%d reviews asked, want %d (answers are cached)", n, tc.reviews)
			}
		})
	}
}

// TestReadViewObjects: filtering never changes the slice it is given (an
// informer's), and keeps it as is when nothing is withheld.
func TestReadViewObjects(t *testing.T) {
	g := &grants{allowed: []string{"configmaps a list", "configmaps a watch", "configmaps  list"}}
	v := &readView{ctx: context.Background(), reads: readaccess.NewCache(g.review, readaccess.Options{}), id: ctlid.Identity{Namespace: "t", Name: "r"}}
	obj := func(ns string) *unstructured.Unstructured {
		u := &unstructured.Unstructured{}
		u.SetNamespace(ns)
		u.SetName(ns)
		return u
	}
	in := []*unstructured.Unstructured{obj("a"), obj("b"), obj("a")}
	orig := slices.Clone(in)
	out := v.objects("", "configmaps", in)
	var names []string
	for _, o := range out {
		names = append(names, o.GetName())
	}
	allA := []*unstructured.Unstructured{in[0], in[2]}
	if diff := cmp.Diff([]any{[]string{"a", "a"}, true, true}, []any{names, slices.Equal(in, orig), &v.objects("", "configmaps", allA)[0] == &allA[0]}); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
	var none *readView
	if got := none.objects("", "configmaps", in); len(got) != 3 {
		t.Errorf("no identity kept %d of 3", len(got))
	}
}

// TestParentWithheldNotQueued: a parent the controller's account is known
// not to read makes no work item (its snapshot would only answer
// NotFound), with one Event however many times it changes; one not
// reviewed yet is queued, for its snapshot to ask (a cluster-wide denial
// alone says nothing of the parent's namespace).
func TestParentWithheldNotQueued(t *testing.T) {
	account := ctlid.Identity{Namespace: "team", Name: "reader"}
	for _, c := range []struct {
		reason           string
		grants           *grants
		precheck, ensure bool
		want             []pendingItem
		events           int
	}{
		{reason: "denied in the parent's namespace: nothing queued, one Event", grants: &grants{}, precheck: true, ensure: true, events: 1},
		{reason: "denied cluster-wide only: queued, the snapshot asks about the namespace", grants: &grants{}, precheck: true,
			want: []pendingItem{{Parent: "p", Reason: "resync"}}},
		{reason: "allowed: queued", grants: &grants{allowed: []string{"things  list", "things  watch"}}, precheck: true,
			want: []pendingItem{{Parent: "p", Reason: "resync"}}},
		{reason: "not reviewed yet: queued, the snapshot asks", grants: &grants{}, want: []pendingItem{{Parent: "p", Reason: "resync"}}},
	} {
		t.Run(c.reason, func(t *testing.T) {
			w, wr := wired(t, compositeObj, thing("p", "10", map[string]string{"deco": "yes"}, map[string]any{"app": "x"}))
			fake := record.NewFakeRecorder(10)
			w.rec = &recorder.Recorder{EventRecorder: fake}
			w.reads = readaccess.NewCache(c.grants.review, readaccess.Options{})
			wr.identity = account
			if c.precheck {
				w.precheckReads(context.Background(), account, wr.plan)
			}
			if c.ensure {
				if _, err := w.reads.Ensure(context.Background(), readaccess.Scope{Identity: account, Group: "example.com", Resource: "things", Namespace: "ns"}); err != nil {
					t.Fatal(err)
				}
			}
			w.out.shutDown()
			w.out = newOutbox(w.log, nil, nil, 0)
			w.out.metrics = w.metrics
			wr.resync("resync")
			wr.resync("resync")
			close(fake.Events)
			if diff := cmp.Diff(c.want, pendingItems(w)); diff != "" {
				t.Errorf("work items (-want +got):\n%s", diff)
			}
			if n := len(fake.Events); n != c.events {
				t.Errorf("%d Events, want %d", n, c.events)
			}
		})
	}
}

// TestKeyedSnapshotReadAccess: a MapController acting as an account is
// sent, and its summary counts, only the inputs and outputs the account
// may read; a key whose input it may not read is not synced at all (never
// a detached key, whose outputs a tombstone would remove).
func TestKeyedSnapshotReadAccess(t *testing.T) {
	objs := []runtime.Object{
		thing("p", "10", nil, map[string]any{"app": "x"}),
		widget("ns", "w1", "20", map[string]string{"app": "x"}),
		output("o1", "30", "p", "key-w1"),
	}
	things := []string{"things  list", "things  watch"}
	type summary struct {
		Result, Message, Input string
		Children               [][]string
		Summary                map[string]any
	}
	for _, c := range []struct {
		reason  string
		allowed []string
		mapKey  string
		want    summary
	}{
		{reason: "inputs not readable: the key is not synced", allowed: slices.Concat(things, []string{"configmaps  list", "configmaps  watch"}), mapKey: "key-w1",
			want: summary{Result: snapshot.NotFound, Message: "map key key-w1's input withheld: ServiceAccount team/reader may not read it"}},
		{reason: "inputs not readable: the summary counts none", allowed: slices.Concat(things, []string{"configmaps  list", "configmaps  watch"}),
			want: summary{Result: snapshot.OK, Summary: map[string]any{"inputs": []any{[]string(nil)}, "outputs": []any{[]string{"o1"}}}}},
		{reason: "outputs not readable: the input alone", allowed: slices.Concat(things, []string{"widgets  list", "widgets  watch"}), mapKey: "key-w1",
			want: summary{Result: snapshot.OK, Input: "w1", Children: [][]string{{}}}},
		{reason: "outputs not readable: the summary counts none", allowed: slices.Concat(things, []string{"widgets  list", "widgets  watch"}),
			want: summary{Result: snapshot.OK, Summary: map[string]any{"inputs": []any{[]string{"w1"}}, "outputs": []any{[]string(nil)}}}},
	} {
		t.Run(c.reason, func(t *testing.T) {
			w, wr := wiredKeyed(t, objs...)
			w.rec = &recorder.Recorder{EventRecorder: record.NewFakeRecorder(10)}
			w.reads = readaccess.NewCache((&grants{allowed: c.allowed}).review, readaccess.Options{})
			wr.identity = ctlid.Identity{Namespace: "team", Name: "reader"}
			resp, err := w.Snapshot(context.Background(), snapshot.Request{Controller: wr.ref, ParentUID: "p-uid", MapKey: c.mapKey})
			if err != nil {
				t.Fatal(err)
			}
			got := summary{Result: resp.Result, Message: resp.Message, Summary: resp.Summary}
			if resp.Input != nil {
				got.Input = resp.Input.GetName()
			}
			for _, g := range resp.Children {
				names := []string{}
				for _, o := range g.Objects {
					names = append(names, o.GetName())
				}
				got.Children = append(got.Children, names)
			}
			if diff := cmp.Diff(c.want, got); diff != "" {
				t.Errorf("snapshot (-want +got):\n%s", diff)
			}
		})
	}
}

// BenchmarkSnapshotReadAccess: the cost of checking reads in a snapshot of
// a parent with 100 children, once the reviews are cached, against a
// controller with no identity (no check at all). Reviews: 0 per
// snapshot.
func BenchmarkSnapshotReadAccess(b *testing.B) {
	objs := []runtime.Object{thing("p", "10", map[string]string{"deco": "yes"}, map[string]any{"app": "x"})}
	for i := range 100 {
		objs = append(objs, configMap(fmt.Sprintf("c%d", i), fmt.Sprint(100+i), map[string]string{"app": "x"}, nil, "p"))
	}
	for _, c := range []struct {
		name     string
		identity ctlid.Identity
		allowed  []string
	}{
		{name: "no-identity"},
		{name: "cluster-wide", identity: ctlid.Identity{Namespace: "team", Name: "reader"},
			allowed: []string{"things  list", "things  watch", "configmaps  list", "configmaps  watch"}},
		{name: "per-namespace", identity: ctlid.Identity{Namespace: "team", Name: "reader"},
			allowed: []string{"things ns list", "things ns watch", "configmaps ns list", "configmaps ns watch"}},
	} {
		b.Run(c.name, func(b *testing.B) {
			w, wr := wired(b, compositeObj, objs...)
			g := &grants{allowed: c.allowed}
			w.reads = readaccess.NewCache(g.review, readaccess.Options{})
			wr.identity = c.identity
			req := snapshot.Request{Controller: wr.ref, ParentUID: "p-uid"}
			if resp, _ := w.Snapshot(context.Background(), req); resp.Result != snapshot.OK || len(resp.Children[0].Objects) != 100 {
				b.Fatalf("snapshot %s %s with %d children", resp.Result, resp.Message, len(resp.Children))
			}
			asked := g.count()
			b.ResetTimer()
			for range b.N {
				_, _ = w.Snapshot(context.Background(), req)
			}
			b.StopTimer()
			if n := g.count() - asked; n != 0 {
				b.Errorf("%d reviews asked after the first snapshot", n)
			}
		})
	}
}
