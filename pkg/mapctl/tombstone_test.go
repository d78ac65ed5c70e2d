package mapctl

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/metabus/metabus/pkg/hookapi"
	"github.com/metabus/metabus/pkg/snapshot"
)

func TestDecideTombstone(t *testing.T) {
	// One detached key's outputs (ForKey), under namespaced parent "ns".
	outputs := outputGroups(
		[]*unstructured.Unstructured{snap("s-1", kA), snap("s-2", kA), snap("s-gone", kA, deleting)},
		[]*unstructured.Unstructured{cm("c-1", kA)},
	)
	// A cluster-scoped output type, for a cluster-scoped parent.
	clusterOutputs := []snapshot.Group{
		{APIVersion: "storage.k8s.io/v1", Resource: "storageclasses", Kind: "StorageClass", Objects: []*unstructured.Unstructured{
			object("storage.k8s.io/v1", "StorageClass", "", "sc-1", "", withKey(kA)),
			object("storage.k8s.io/v1", "StorageClass", "", "sc-2", "", withKey(kA)),
		}},
		{APIVersion: "v1", Resource: "configmaps", Kind: "ConfigMap", Namespaced: true, Objects: []*unstructured.Unstructured{cm("c-1", kA)}},
	}
	entry := func(apiVersion, kind, namespace, name string) *unstructured.Unstructured {
		return object(apiVersion, kind, namespace, name, "")
	}
	answer := func(entries ...*unstructured.Unstructured) *hookapi.TombstoneResponse {
		return &hookapi.TombstoneResponse{Outputs: entries}
	}
	cases := []struct {
		reason      string
		outputs     []snapshot.Group
		answer      *hookapi.TombstoneResponse
		parentNS    string
		wantKeep    [][]string
		wantDelete  [][]string
		wantUnknown []string
	}{
		{
			reason:  "no tombstone hook: every output goes (those already going are left alone)",
			outputs: outputs, parentNS: "ns",
			wantKeep: [][]string{{}, {}}, wantDelete: [][]string{{"ns/s-1", "ns/s-2"}, {"ns/c-1"}}, wantUnknown: nil,
		},
		{
			reason:  "an empty answer keeps nothing",
			outputs: outputs, answer: answer(), parentNS: "ns",
			wantKeep: [][]string{{}, {}}, wantDelete: [][]string{{"ns/s-1", "ns/s-2"}, {"ns/c-1"}},
		},
		{
			reason:  "the listed outputs are kept, the rest deleted",
			outputs: outputs, parentNS: "ns",
			answer:   answer(entry("snapshot.storage.k8s.io/v1", "VolumeSnapshot", "ns", "s-2")),
			wantKeep: [][]string{{"ns/s-2"}, {}}, wantDelete: [][]string{{"ns/s-1"}, {"ns/c-1"}},
		},
		{
			reason:  "an entry without a namespace means the parent's; another version of the group names the same object",
			outputs: outputs, parentNS: "ns",
			answer: answer(
				entry("snapshot.storage.k8s.io/v1beta1", "VolumeSnapshot", "", "s-1"),
				entry("v1", "ConfigMap", "", "c-1"),
			),
			wantKeep: [][]string{{"ns/s-1"}, {"ns/c-1"}}, wantDelete: [][]string{{"ns/s-2"}, {}},
		},
		{
			reason:  "entries naming nothing observed are ignored and reported: other names, namespaces, groups, kinds",
			outputs: outputs, parentNS: "ns",
			answer: answer(
				entry("snapshot.storage.k8s.io/v1", "VolumeSnapshot", "ns", "s-9"),
				entry("snapshot.storage.k8s.io/v1", "VolumeSnapshot", "other", "s-1"),
				entry("example.com/v1", "VolumeSnapshot", "ns", "s-1"),
				entry("v1", "Secret", "ns", "c-1"),
				entry("a/b/c", "ConfigMap", "ns", "c-1"),
			),
			wantKeep:    [][]string{{}, {}},
			wantDelete:  [][]string{{"ns/s-1", "ns/s-2"}, {"ns/c-1"}},
			wantUnknown: []string{"ns/s-9", "other/s-1", "ns/s-1", "ns/c-1", "ns/c-1"},
		},
		{
			reason:  "an output already being deleted cannot be kept; it is not unknown either",
			outputs: outputs, parentNS: "ns",
			answer:   answer(entry("snapshot.storage.k8s.io/v1", "VolumeSnapshot", "ns", "s-gone")),
			wantKeep: [][]string{{}, {}}, wantDelete: [][]string{{"ns/s-1", "ns/s-2"}, {"ns/c-1"}},
		},
		{
			reason:  "a nil entry is skipped, listing one output twice keeps it once",
			outputs: outputs, parentNS: "ns",
			answer: answer(nil,
				entry("v1", "ConfigMap", "ns", "c-1"),
				entry("v1", "ConfigMap", "ns", "c-1"),
			),
			wantKeep: [][]string{{}, {"ns/c-1"}}, wantDelete: [][]string{{"ns/s-1", "ns/s-2"}, {}},
		},
		{
			reason:  "cluster-scoped output: the entry's namespace is ignored; a cluster-scoped parent has no namespace to default to",
			outputs: clusterOutputs,
			answer: answer(
				entry("storage.k8s.io/v1", "StorageClass", "whatever", "sc-2"),
				entry("v1", "ConfigMap", "", "c-1"),
			),
			wantKeep:    [][]string{{"sc-2"}, {}},
			wantDelete:  [][]string{{"sc-1"}, {"ns/c-1"}},
			wantUnknown: []string{"c-1"},
		},
	}
	for _, c := range cases {
		t.Run(c.reason, func(t *testing.T) {
			d := DecideTombstone(c.outputs, c.answer, c.parentNS)
			if diff := cmp.Diff(c.wantKeep, groupNames(d.Keep)); diff != "" {
				t.Errorf("keep (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(c.wantDelete, groupNames(d.Delete)); diff != "" {
				t.Errorf("delete (-want +got):\n%s", diff)
			}
			var unknown []string
			if d.Unknown != nil {
				unknown = names(d.Unknown)
			}
			if diff := cmp.Diff(c.wantUnknown, unknown); diff != "" {
				t.Errorf("unknown (-want +got):\n%s", diff)
			}
			for i := range c.outputs {
				for _, g := range []snapshot.Group{d.Keep[i], d.Delete[i]} {
					if g.Resource != c.outputs[i].Resource || g.Kind != c.outputs[i].Kind || g.Namespaced != c.outputs[i].Namespaced || g.Objects == nil {
						t.Errorf("group %d lost its resource or has nil Objects: %+v", i, g)
					}
				}
			}
		})
	}
}
