package main

import (
	"strconv"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestCaughtUp(t *testing.T) {
	seenUpTo := func(max int) func(string) bool {
		return func(rv string) bool { return atLeast(strconv.Itoa(max), rv) }
	}
	cases := []struct {
		name, reason string
		e            expectation
		parentRV     string
		observed     map[string]string
		seen         func(string) bool
		want         bool
	}{
		{
			name: "nothing expected", reason: "a parent with no writes pending syncs at once",
			parentRV: "5", seen: seenUpTo(0), want: true,
		},
		{
			name: "status not yet cached", reason: "the cached parent is older than the status written",
			e: expectation{parentRV: "7"}, parentRV: "5", seen: seenUpTo(9), want: false,
		},
		{
			name: "status cached", reason: "the cached parent is the one written",
			e: expectation{parentRV: "7"}, parentRV: "7", seen: seenUpTo(0), want: true,
		},
		{
			name: "parent changed since", reason: "a later resourceVersion holds the write too",
			e: expectation{parentRV: "7"}, parentRV: "9", seen: seenUpTo(0), want: true,
		},
		{
			name: "child created, not yet cached", reason: "the status is cached but not the child: the hook would see half the sync's writes",
			e:        expectation{parentRV: "7", children: map[string]string{"c": "6"}},
			parentRV: "7", observed: map[string]string{}, seen: seenUpTo(5), want: false,
		},
		{
			name: "child created and cached", reason: "both writes cached",
			e:        expectation{parentRV: "7", children: map[string]string{"c": "6"}},
			parentRV: "7", observed: map[string]string{"c": "6"}, seen: seenUpTo(5), want: true,
		},
		{
			name: "child updated, old version cached", reason: "the cached child predates the update",
			e:        expectation{children: map[string]string{"c": "8"}},
			parentRV: "7", observed: map[string]string{"c": "6"}, seen: seenUpTo(9), want: false,
		},
		{
			name: "child created then deleted by someone", reason: "absent after the informer delivered its create: it was deleted since, and the sync must not wait for ever",
			e:        expectation{children: map[string]string{"c": "6"}},
			parentRV: "7", observed: map[string]string{}, seen: seenUpTo(8), want: true,
		},
		{
			name: "child deleted, still cached", reason: "the deletion has not reached the cache",
			e:        expectation{children: map[string]string{"c": ""}},
			parentRV: "7", observed: map[string]string{"c": "6"}, seen: seenUpTo(9), want: false,
		},
		{
			name: "child deleted and gone", reason: "the deletion reached the cache",
			e:        expectation{children: map[string]string{"c": ""}},
			parentRV: "7", observed: map[string]string{}, seen: seenUpTo(0), want: true,
		},
		{
			name: "unparseable resourceVersion", reason: "the wait is an optimisation, never a reason to stop syncing",
			e: expectation{parentRV: "x"}, parentRV: "5", seen: seenUpTo(0), want: true,
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := caughtUp(c.e, c.parentRV, c.observed, c.seen); got != c.want {
				t.Errorf("caughtUp = %v, want %v (%s)", got, c.want, c.reason)
			}
		})
	}
}

func TestDesiredStatus(t *testing.T) {
	cases := []struct {
		name, reason string
		hook         map[string]any
		gen          int64
		want         map[string]any
	}{
		{
			name: "hook status", reason: "upstream adds observedGeneration to what the hook answers",
			hook: map[string]any{"childCount": int64(1)}, gen: 3,
			want: map[string]any{"childCount": int64(1), "observedGeneration": int64(3)},
		},
		{
			name: "no status", reason: "a hook answering no status still gets observedGeneration written",
			gen: 1, want: map[string]any{"observedGeneration": int64(1)},
		},
		{
			name: "hook sets observedGeneration", reason: "the parent's generation wins, as upstream's",
			hook: map[string]any{"observedGeneration": int64(9)}, gen: 2,
			want: map[string]any{"observedGeneration": int64(2)},
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if diff := cmp.Diff(c.want, desiredStatus(c.hook, c.gen)); diff != "" {
				t.Errorf("%s: (-want +got)\n%s", c.reason, diff)
			}
		})
	}
}

func cm(meta map[string]any, data map[string]any) map[string]any {
	out := map[string]any{"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta}
	if data != nil {
		out["data"] = data
	}
	return out
}

func TestChildDiffers(t *testing.T) {
	observed := cm(map[string]any{
		"name": "p", "namespace": "default", "resourceVersion": "5", "uid": "u",
		"labels": map[string]any{"controller-uid": "pu", "team": "a"},
	}, map[string]any{"gen": "1", "extra": "x"})
	cases := []struct {
		name, reason string
		desired      map[string]any
		want         bool
	}{
		{
			name: "same", reason: "the hook's answer of a converged parent writes nothing",
			desired: cm(map[string]any{"name": "p", "labels": map[string]any{"controller-uid": "pu"}}, map[string]any{"gen": "1"}),
			want:    false,
		},
		{
			name: "data changed", reason: "a new gen is an update",
			desired: cm(map[string]any{"name": "p"}, map[string]any{"gen": "2"}),
			want:    true,
		},
		{
			name: "fields the server or others set", reason: "what desired leaves out does not count",
			desired: cm(map[string]any{"name": "p"}, nil),
			want:    false,
		},
		{
			name: "label changed", reason: "desired labels count",
			desired: cm(map[string]any{"name": "p", "labels": map[string]any{"team": "b"}}, nil),
			want:    true,
		},
		{
			name: "annotation added", reason: "desired annotations count",
			desired: cm(map[string]any{"name": "p", "annotations": map[string]any{"a": "1"}}, nil),
			want:    true,
		},
		{
			name: "other metadata", reason: "only labels and annotations of desired metadata are applied",
			desired: cm(map[string]any{"name": "p", "namespace": "default", "generateName": "x"}, nil),
			want:    false,
		},
		{
			name: "new top-level field", reason: "a field observed lacks is an update",
			desired: func() map[string]any {
				d := cm(map[string]any{"name": "p"}, nil)
				d["binaryData"] = map[string]any{"b": "AA=="}
				return d
			}(),
			want: true,
		},
		{
			name: "integer against string", reason: "values compare by type as well",
			desired: cm(map[string]any{"name": "p"}, map[string]any{"gen": int64(1)}),
			want:    true,
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := childDiffers(observed, c.desired); got != c.want {
				t.Errorf("childDiffers = %v, want %v (%s)", got, c.want, c.reason)
			}
		})
	}
}

func TestMergeChild(t *testing.T) {
	observed := func() map[string]any {
		return cm(map[string]any{
			"name": "p", "namespace": "default", "resourceVersion": "5",
			"labels": map[string]any{"controller-uid": "pu", "team": "a"},
		}, map[string]any{"gen": "1", "extra": "x"})
	}
	cases := []struct {
		name, reason string
		desired      map[string]any
		want         map[string]any
	}{
		{
			name: "data merged", reason: "desired keys replace, observed's others stay, the resourceVersion makes the write conditional",
			desired: cm(map[string]any{"name": "p"}, map[string]any{"gen": "2"}),
			want: cm(map[string]any{
				"name": "p", "namespace": "default", "resourceVersion": "5",
				"labels": map[string]any{"controller-uid": "pu", "team": "a"},
			}, map[string]any{"gen": "2", "extra": "x"}),
		},
		{
			name: "labels merged", reason: "desired labels merge into observed's; other desired metadata is not applied",
			desired: cm(map[string]any{"name": "p", "generateName": "g", "labels": map[string]any{"team": "b"}}, nil),
			want: cm(map[string]any{
				"name": "p", "namespace": "default", "resourceVersion": "5",
				"labels": map[string]any{"controller-uid": "pu", "team": "b"},
			}, map[string]any{"gen": "1", "extra": "x"}),
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			o := observed()
			got := mergeChild(o, c.desired)
			if diff := cmp.Diff(c.want, got); diff != "" {
				t.Errorf("%s: (-want +got)\n%s", c.reason, diff)
			}
			if diff := cmp.Diff(observed(), o); diff != "" {
				t.Errorf("observed was modified: (-before +after)\n%s", diff)
			}
		})
	}
}

func TestNewChild(t *testing.T) {
	owner := ownerRef{apiVersion: "bench.metabus.dev/v1", kind: "Bench", namespace: "default", name: "p", uid: "pu"}
	ref := []any{map[string]any{
		"apiVersion": "bench.metabus.dev/v1", "kind": "Bench", "name": "p", "uid": "pu",
		"controller": true, "blockOwnerDeletion": true,
	}}
	cases := []struct {
		name, reason string
		desired      map[string]any
		generate     bool
		want         map[string]any
	}{
		{
			name: "generated selector", reason: "upstream labels every desired child controller-uid when it generates the selector, and owns it",
			desired:  cm(map[string]any{"name": "p"}, map[string]any{"gen": "1"}),
			generate: true,
			want: cm(map[string]any{
				"name": "p", "namespace": "default", "ownerReferences": ref,
				"labels": map[string]any{"controller-uid": "pu"},
			}, map[string]any{"gen": "1"}),
		},
		{
			name: "own controller-uid kept", reason: "a label the hook sets is not replaced",
			desired:  cm(map[string]any{"name": "p", "labels": map[string]any{"controller-uid": "x", "a": "b"}}, nil),
			generate: true,
			want: cm(map[string]any{
				"name": "p", "namespace": "default", "ownerReferences": ref,
				"labels": map[string]any{"controller-uid": "x", "a": "b"},
			}, nil),
		},
		{
			name: "selector not generated", reason: "no label added",
			desired: cm(map[string]any{"name": "p"}, nil),
			want:    cm(map[string]any{"name": "p", "namespace": "default", "ownerReferences": ref}, nil),
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			before := cmp.Diff(nil, c.desired)
			got := newChild(withSelectorLabel(c.desired, owner.uid, c.generate), owner)
			if diff := cmp.Diff(c.want, got); diff != "" {
				t.Errorf("%s: (-want +got)\n%s", c.reason, diff)
			}
			if after := cmp.Diff(nil, c.desired); after != before {
				t.Errorf("desired was modified")
			}
		})
	}
}

func TestParseParent(t *testing.T) {
	cases := []struct {
		name, reason, in, want, kind string
		err                          bool
	}{
		{name: "group", reason: "a CRD's resource", in: "bench.metabus.dev/v1/benches/Bench", want: "bench.metabus.dev/v1, Resource=benches", kind: "Bench"},
		{name: "core", reason: "the core group has no group part", in: "v1/configmaps/ConfigMap", want: "/v1, Resource=configmaps", kind: "ConfigMap"},
		{name: "no kind", reason: "the kind is needed to map children to parents", in: "bench.metabus.dev/v1/benches/", err: true},
		{name: "too short", reason: "a bare resource is ambiguous", in: "benches/Bench", err: true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			gvr, kind, err := parseParent(c.in)
			if (err != nil) != c.err {
				t.Fatalf("error %v, want error %v (%s)", err, c.err, c.reason)
			}
			if c.err {
				return
			}
			if diff := cmp.Diff(c.want+" "+c.kind, gvr.String()+" "+kind); diff != "" {
				t.Errorf("%s: (-want +got)\n%s", c.reason, diff)
			}
		})
	}
}
