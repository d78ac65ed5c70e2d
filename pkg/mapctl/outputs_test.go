package mapctl

import (
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/metabus/metabus/pkg/children"
	"github.com/metabus/metabus/pkg/snapshot"
)

// Three inputs and their keys (their order is whatever the hash makes it).
var (
	refA = InputRef{Kind: "PersistentVolumeClaim", Namespace: "ns", Name: "a", UID: "ua"}
	refB = InputRef{Kind: "PersistentVolumeClaim", Namespace: "ns", Name: "b", UID: "ub"}
	refC = InputRef{Kind: "PersistentVolumeClaim", Namespace: "ns", Name: "c", UID: "uc"}
	kA   = refA.Key()
	kB   = refB.Key()
	kC   = refC.Key()
)

func snap(name, key string, mods ...func(*unstructured.Unstructured)) *unstructured.Unstructured {
	return object("snapshot.storage.k8s.io/v1", "VolumeSnapshot", "ns", name, "", append([]func(*unstructured.Unstructured){withKey(key)}, mods...)...)
}

func cm(name, key string, mods ...func(*unstructured.Unstructured)) *unstructured.Unstructured {
	return object("v1", "ConfigMap", "ns", name, "", append([]func(*unstructured.Unstructured){withKey(key)}, mods...)...)
}

func sortedKeys(keys ...string) []string {
	s := slices.Clone(keys)
	slices.Sort(s)
	return s
}

func TestForKey(t *testing.T) {
	untagged := object("v1", "ConfigMap", "ns", "hand-made", "")
	groups := outputGroups(
		[]*unstructured.Unstructured{snap("a-1", kA), snap("b-1", kB), snap("a-2", kA, deleting)},
		[]*unstructured.Unstructured{cm("b-cm", kB), untagged, cm("edited", "not-a-key")},
	)
	groups[0].Adopt = groups[0].Objects[:1]
	cases := []struct {
		reason string
		key    string
		want   [][]string
	}{
		{reason: "one key's outputs of every type, those being deleted included (the hook sees what exists)", key: kA, want: [][]string{{"ns/a-1", "ns/a-2"}, {}}},
		{reason: "another key", key: kB, want: [][]string{{"ns/b-1"}, {"ns/b-cm"}}},
		{reason: "a new input: every type present, empty", key: kC, want: [][]string{{}, {}}},
		{reason: "an untagged or hand-edited output belongs to no key", key: "not-a-key", want: [][]string{{}, {}}},
	}
	for _, c := range cases {
		t.Run(c.reason, func(t *testing.T) {
			got := ForKey(groups, c.key)
			if diff := cmp.Diff(c.want, groupNames(got)); diff != "" {
				t.Errorf("outputs (-want +got):\n%s", diff)
			}
			for i, g := range got {
				want := snapshot.Group{APIVersion: groups[i].APIVersion, Resource: groups[i].Resource, Kind: groups[i].Kind, Namespaced: groups[i].Namespaced, Objects: g.Objects}
				if diff := cmp.Diff(want, g); diff != "" {
					t.Errorf("group %d keeps its resource and drops claims (-want +got):\n%s", i, diff)
				}
				if g.Objects == nil {
					t.Errorf("group %d: nil Objects, want empty (the hook's map lists every type)", i)
				}
			}
		})
	}
}

func TestKeysAndDetached(t *testing.T) {
	untagged := object("v1", "ConfigMap", "ns", "hand-made", "")
	cases := []struct {
		reason       string
		groups       []snapshot.Group
		live         map[string]bool
		wantKeys     []string
		wantUntagged []string
		wantDetached []string
	}{
		{reason: "no outputs", groups: outputGroups(nil, nil), wantKeys: nil, wantUntagged: []string{}, wantDetached: nil},
		{
			reason:       "every input live: nothing detached",
			groups:       outputGroups([]*unstructured.Unstructured{snap("a-1", kA), snap("b-1", kB)}, []*unstructured.Unstructured{cm("a-cm", kA)}),
			live:         map[string]bool{kA: true, kB: true},
			wantKeys:     sortedKeys(kA, kB),
			wantUntagged: []string{},
		},
		{
			reason:       "an input gone: its key is detached, once, whatever the number of its outputs",
			groups:       outputGroups([]*unstructured.Unstructured{snap("a-1", kA), snap("b-1", kB), snap("b-2", kB)}, []*unstructured.Unstructured{cm("b-cm", kB)}),
			live:         map[string]bool{kA: true},
			wantKeys:     sortedKeys(kA, kB),
			wantUntagged: []string{},
			wantDetached: []string{kB},
		},
		{
			reason:       "several gone, sorted; live keys without outputs are irrelevant",
			groups:       outputGroups([]*unstructured.Unstructured{snap("c-1", kC), snap("b-1", kB)}, []*unstructured.Unstructured{cm("a-cm", kA)}),
			live:         map[string]bool{kA: true, "other": true},
			wantKeys:     sortedKeys(kA, kB, kC),
			wantUntagged: []string{},
			wantDetached: sortedKeys(kB, kC),
		},
		{
			reason:       "a key whose outputs are all being deleted needs no tombstone call",
			groups:       outputGroups([]*unstructured.Unstructured{snap("b-1", kB, deleting)}, []*unstructured.Unstructured{cm("c-cm", kC, deleting), cm("c-cm2", kC)}),
			live:         map[string]bool{},
			wantKeys:     sortedKeys(kB, kC),
			wantUntagged: []string{},
			wantDetached: []string{kC},
		},
		{
			reason:       "untagged outputs are never detached",
			groups:       outputGroups(nil, []*unstructured.Unstructured{untagged, cm("edited", "mine")}),
			live:         map[string]bool{},
			wantUntagged: []string{"ns/hand-made", "ns/edited"},
		},
	}
	for _, c := range cases {
		t.Run(c.reason, func(t *testing.T) {
			keys, untagged := Keys(c.groups)
			if diff := cmp.Diff(c.wantKeys, keys); diff != "" {
				t.Errorf("keys (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(c.wantUntagged, names(untagged)); diff != "" {
				t.Errorf("untagged (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(c.wantDetached, Detached(c.groups, c.live)); diff != "" {
				t.Errorf("detached (-want +got):\n%s", diff)
			}
		})
	}
}

func TestOutputOwner(t *testing.T) {
	cases := []struct {
		reason string
		parent *unstructured.Unstructured
		input  InputRef
		want   children.Owner
	}{
		{
			reason: "namespaced parent: the key as label and selector, the input as annotation",
			parent: object("ctl.example.com/v1", "SnapshotSchedule", "ns", "p", "p-uid"),
			input:  refA,
			want: children.Owner{
				APIVersion: "ctl.example.com/v1", Kind: "SnapshotSchedule", Namespace: "ns", Name: "p", UID: "p-uid", Namespaced: true,
				ExtraLabels:      map[string]string{MapKeyLabel: kA},
				ExtraAnnotations: map[string]string{InputAnnotation: "/PersistentVolumeClaim/ns/a/ua"},
			},
		},
		{
			reason: "cluster-scoped parent",
			parent: object("ctl.example.com/v1", "Schedule", "", "p", "p-uid"),
			input:  InputRef{Group: "storage.k8s.io", Kind: "StorageClass", Name: "fast", UID: "u"},
			want: children.Owner{
				APIVersion: "ctl.example.com/v1", Kind: "Schedule", Name: "p", UID: "p-uid",
				ExtraLabels:      map[string]string{MapKeyLabel: InputRef{Group: "storage.k8s.io", Kind: "StorageClass", Name: "fast", UID: "u"}.Key()},
				ExtraAnnotations: map[string]string{InputAnnotation: "storage.k8s.io/StorageClass//fast/u"},
			},
		},
	}
	for _, c := range cases {
		t.Run(c.reason, func(t *testing.T) {
			got := OutputOwner(c.parent, c.input)
			sel := got.Selector
			got.Selector = nil
			if diff := cmp.Diff(c.want, got); diff != "" {
				t.Errorf("owner (-want +got):\n%s", diff)
			}
			// The selector holds exactly the outputs the tag makes.
			if sel == nil || !sel.Matches(labels.Set(c.want.ExtraLabels)) || sel.Matches(labels.Set{MapKeyLabel: kB}) {
				t.Errorf("selector %v does not select by this key only", sel)
			}
		})
	}
}
