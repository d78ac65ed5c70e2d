package mapctl

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/metabus/metabus/pkg/snapshot"
)

func TestConditionName(t *testing.T) {
	cases := []struct {
		reason, typ, want string
	}{
		{reason: "one word", typ: "Ready", want: "ready"},
		{reason: "camel case", typ: "ReadyToUse", want: "readyToUse"},
		{reason: "already lower camel", typ: "readyToUse", want: "readyToUse"},
		{reason: "a leading initialism is lowered whole", typ: "PVCBound", want: "pvcBound"},
		{reason: "all capitals", typ: "URL", want: "url"},
		{reason: "a later initialism is kept", typ: "HasPVC", want: "hasPVC"},
		{reason: "separators start words", typ: "ready_to-use", want: "readyToUse"},
		{reason: "a domain-prefixed type", typ: "example.com/Synced", want: "exampleComSynced"},
		{reason: "digits", typ: "Phase2Done", want: "phase2Done"},
		{reason: "nothing usable", typ: "--/", want: ""},
		{reason: "empty", typ: "", want: ""},
	}
	for _, c := range cases {
		t.Run(c.reason, func(t *testing.T) {
			if diff := cmp.Diff(c.want, ConditionName(c.typ)); diff != "" {
				t.Errorf("name of %q (-want +got):\n%s", c.typ, diff)
			}
		})
	}
}

func TestAggregate(t *testing.T) {
	cond := func(typ, status string) any { return map[string]any{"type": typ, "status": status} }
	withConds := func(conds ...any) func(*unstructured.Unstructured) {
		return withField(conds, "status", "conditions")
	}
	snapOut := func(name string, mods ...func(*unstructured.Unstructured)) *unstructured.Unstructured {
		return object("snapshot.storage.k8s.io/v1", "VolumeSnapshot", "ns", name, "", mods...)
	}
	pvcs := func(n int) snapshot.Group {
		g := snapshot.Group{APIVersion: "v1", Resource: "persistentvolumeclaims", Kind: "PersistentVolumeClaim", Namespaced: true}
		for i := range n {
			g.Objects = append(g.Objects, object("v1", "PersistentVolumeClaim", "ns", strings.Repeat("p", i+1), ""))
		}
		return g
	}
	cases := []struct {
		reason string
		in     Observed
		want   map[string]any
	}{
		{
			reason: "nothing observed: every declared resource at total 0",
			in:     Observed{Generation: 1, Inputs: []snapshot.Group{pvcs(0)}, Outputs: outputGroups(nil, nil)},
			want: map[string]any{
				"observedGeneration": int64(1),
				"inputs":             map[string]any{"persistentvolumeclaims": map[string]any{"total": int64(0)}},
				"outputs": map[string]any{
					"volumesnapshots": map[string]any{"total": int64(0)},
					"configmaps":      map[string]any{"total": int64(0)},
				},
			},
		},
		{
			reason: "totals and condition counts: True counts, a type seen only False or Unknown is 0",
			in: Observed{Generation: 7, Inputs: []snapshot.Group{pvcs(3)}, Outputs: outputGroups(
				[]*unstructured.Unstructured{
					snapOut("a", withConds(cond("Ready", "True"), cond("ReadyToUse", "False"))),
					snapOut("b", withConds(cond("Ready", "True"), cond("Degraded", "Unknown"))),
					snapOut("c", withConds(cond("Ready", "False"))),
					snapOut("d"),
				},
				[]*unstructured.Unstructured{cm("x", kA)},
			)},
			want: map[string]any{
				"observedGeneration": int64(7),
				"inputs":             map[string]any{"persistentvolumeclaims": map[string]any{"total": int64(3)}},
				"outputs": map[string]any{
					"volumesnapshots": map[string]any{"total": int64(4), "ready": int64(2), "readyToUse": int64(0), "degraded": int64(0)},
					"configmaps":      map[string]any{"total": int64(1)},
				},
			},
		},
		{
			reason: "types that share a name count an output once; a type named like total is dropped; malformed conditions are skipped",
			in: Observed{Outputs: outputGroups([]*unstructured.Unstructured{
				snapOut("a", withConds(cond("Ready", "True"), cond("ready", "True"), cond("Total", "True"))),
				snapOut("b", withConds(cond("ready", "True"), "not-a-map", map[string]any{"type": int64(3), "status": "True"}, map[string]any{"type": "Synced"})),
				snapOut("c", withField("not-a-list", "status", "conditions")),
				snapOut("d", withField("not-a-map", "status")),
			}, nil)},
			want: map[string]any{
				"observedGeneration": int64(0),
				"inputs":             map[string]any{},
				"outputs": map[string]any{
					"volumesnapshots": map[string]any{"total": int64(4), "ready": int64(2), "synced": int64(0)},
					"configmaps":      map[string]any{"total": int64(0)},
				},
			},
		},
		{
			reason: "two resources of one plural in different groups are told apart by group (the core one keeps the plain name)",
			in: Observed{
				Inputs: []snapshot.Group{
					{APIVersion: "v1", Resource: "configmaps", Objects: []*unstructured.Unstructured{cm("a", "")}},
					{APIVersion: "example.com/v1", Resource: "configmaps"},
					{APIVersion: "v1", Resource: "secrets"},
				},
			},
			want: map[string]any{
				"observedGeneration": int64(0),
				"inputs": map[string]any{
					"configmaps":             map[string]any{"total": int64(1)},
					"configmaps.example.com": map[string]any{"total": int64(0)},
					"secrets":                map[string]any{"total": int64(0)},
				},
				"outputs": map[string]any{},
			},
		},
	}
	for _, c := range cases {
		t.Run(c.reason, func(t *testing.T) {
			if diff := cmp.Diff(c.want, Aggregate(c.in)); diff != "" {
				t.Errorf("status (-want +got):\n%s", diff)
			}
		})
	}
}

func TestMergeStatus(t *testing.T) {
	computed := map[string]any{
		"observedGeneration": int64(2),
		"inputs":             map[string]any{"persistentvolumeclaims": map[string]any{"total": int64(3)}},
		"outputs":            map[string]any{"volumesnapshots": map[string]any{"total": int64(3), "ready": int64(1)}},
	}
	cases := []struct {
		reason      string
		current     map[string]any
		wantMerged  map[string]any
		wantChanged bool
	}{
		{reason: "no status yet", current: nil, wantMerged: computed, wantChanged: true},
		{
			reason: "unchanged, even with numbers decoded as float64",
			current: map[string]any{
				"observedGeneration": float64(2),
				"inputs":             map[string]any{"persistentvolumeclaims": map[string]any{"total": float64(3)}},
				"outputs":            map[string]any{"volumesnapshots": map[string]any{"ready": int64(1), "total": int32(3)}},
			},
			wantMerged: computed, wantChanged: false,
		},
		{
			reason: "other writers' fields are kept and do not count as a change",
			current: map[string]any{
				"observedGeneration": int64(2), "inputs": computed["inputs"], "outputs": computed["outputs"],
				"phase": "Active",
			},
			wantMerged: map[string]any{
				"observedGeneration": int64(2), "inputs": computed["inputs"], "outputs": computed["outputs"],
				"phase": "Active",
			},
			wantChanged: false,
		},
		{
			reason:      "a new generation is a change",
			current:     map[string]any{"observedGeneration": int64(1), "inputs": computed["inputs"], "outputs": computed["outputs"]},
			wantMerged:  computed,
			wantChanged: true,
		},
		{
			reason: "a resource dropped from the spec leaves the status (inputs and outputs are replaced whole)",
			current: map[string]any{
				"observedGeneration": int64(2),
				"inputs": map[string]any{
					"persistentvolumeclaims": map[string]any{"total": int64(3)},
					"configmaps":             map[string]any{"total": int64(9)},
				},
				"outputs": computed["outputs"],
			},
			wantMerged:  computed,
			wantChanged: true,
		},
		{
			reason: "a condition count that changed",
			current: map[string]any{
				"observedGeneration": int64(2), "inputs": computed["inputs"],
				"outputs": map[string]any{"volumesnapshots": map[string]any{"total": int64(3), "ready": int64(0)}},
			},
			wantMerged:  computed,
			wantChanged: true,
		},
	}
	for _, c := range cases {
		t.Run(c.reason, func(t *testing.T) {
			var before map[string]any
			if c.current != nil {
				before = map[string]any{}
				for k, v := range c.current {
					before[k] = v
				}
			}
			merged, changed, err := MergeStatus(c.current, computed)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(c.wantMerged, merged); diff != "" {
				t.Errorf("merged (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(c.wantChanged, changed); diff != "" {
				t.Errorf("changed (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(before, c.current); diff != "" {
				t.Errorf("current was modified (-before +after):\n%s", diff)
			}
		})
	}

	t.Run("a value that is not JSON is an error, not a panic", func(t *testing.T) {
		_, _, err := MergeStatus(map[string]any{"inputs": func() {}}, computed)
		if err == nil || !strings.Contains(err.Error(), "compare status.inputs") {
			t.Errorf("error %v, want one naming status.inputs", err)
		}
	})
}
