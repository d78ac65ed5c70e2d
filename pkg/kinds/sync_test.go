package kinds

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/metabus/metabus/pkg/api/v1alpha1"
	"github.com/metabus/metabus/pkg/snapshot"
)

// TestObjectMaps: owned and related objects are keyed as the hook's
// version asks, and every declared group appears even when empty (a hook
// indexes it without checking).
func TestObjectMaps(t *testing.T) {
	v2 := v1alpha1.HookVersionV2
	cm := func(name string) *unstructured.Unstructured {
		u := &unstructured.Unstructured{}
		u.SetAPIVersion("v1")
		u.SetKind("ConfigMap")
		u.SetNamespace("ns")
		u.SetName(name)
		return u
	}
	snap := &snapshot.Response{
		Children: []snapshot.Group{
			{APIVersion: "v1", Kind: "ConfigMap", Resource: "configmaps", Namespaced: true, Objects: []*unstructured.Unstructured{cm("a")}},
			{APIVersion: "apps/v1", Kind: "Deployment", Resource: "deployments", Namespaced: true},
		},
		Related: []snapshot.Group{{APIVersion: "v1", Kind: "ConfigMap", Resource: "configmaps", Namespaced: true, Objects: []*unstructured.Unstructured{cm("r")}}},
	}
	for _, tc := range []struct {
		reason                 string
		hook                   *v1alpha1.Hook
		wantOwned, wantRelated map[string][]string
	}{
		{"v1 (the default) keys namespaced objects of a namespaced parent by name", &v1alpha1.Hook{},
			map[string][]string{"ConfigMap.v1": {"a"}, "Deployment.apps/v1": {}}, map[string][]string{"ConfigMap.v1": {"r"}}},
		{"v2 keys them namespace/name", &v1alpha1.Hook{Version: &v2},
			map[string][]string{"ConfigMap.v1": {"ns/a"}, "Deployment.apps/v1": {}}, map[string][]string{"ConfigMap.v1": {"ns/r"}}},
	} {
		t.Run(tc.reason, func(t *testing.T) {
			owned, related, err := ObjectMaps(tc.hook, true, snap)
			if err != nil {
				t.Fatal(err)
			}
			keys := func(m map[string]map[string]*unstructured.Unstructured) map[string][]string {
				out := map[string][]string{}
				for gvk, objs := range m {
					out[gvk] = []string{}
					for k := range objs {
						out[gvk] = append(out[gvk], k)
					}
				}
				return out
			}
			if diff := cmp.Diff(tc.wantOwned, keys(owned)); diff != "" {
				t.Errorf("owned (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.wantRelated, keys(related)); diff != "" {
				t.Errorf("related (-want +got):\n%s", diff)
			}
		})
	}
}

func TestOneCall(t *testing.T) {
	for _, tc := range []struct {
		reason  string
		calls   []HookCall
		wantErr bool
	}{
		{"one call", []HookCall{{Request: 1}}, false},
		{"no answer is an error, not an empty desired state", nil, true},
		{"two answers for a kind that calls once", []HookCall{{}, {}}, true},
	} {
		t.Run(tc.reason, func(t *testing.T) {
			if _, err := OneCall(tc.calls); (err != nil) != tc.wantErr {
				t.Errorf("OneCall: err %v, want error %v", err, tc.wantErr)
			}
		})
	}
}
