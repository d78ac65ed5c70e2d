package hookapi

import (
	"encoding/json"
	"testing"

	"github.com/google/go-cmp/cmp"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

func uobj(m map[string]any) *unstructured.Unstructured { return &unstructured.Unstructured{Object: m} }

func TestEncoderMatchesJSONMarshal(t *testing.T) {
	ctrl := uobj(map[string]any{"apiVersion": "metacontroller.k8s.io/v1alpha1", "kind": "CompositeController",
		"metadata": map[string]any{"name": "c", "uid": "u-1", "resourceVersion": "7"},
		"spec":     map[string]any{"generateSelector": true, "resyncPeriodSeconds": int64(30)}})
	parent := uobj(map[string]any{"apiVersion": "x/v1", "kind": "P",
		"metadata": map[string]any{"name": "p", "namespace": "ns", "annotations": map[string]any{"html": "<a href=\"x\">&</a>", "sep": "line\u2028para\u2029"}},
		"spec":     map[string]any{"n": int64(3), "f": 1.25, "list": []any{"a", int64(1), nil, true, map[string]any{}}, "empty": map[string]any{}, "none": nil}})
	child := uobj(map[string]any{"apiVersion": "v1", "kind": "ConfigMap", "metadata": map[string]any{"name": "ü-ñ"}, "data": map[string]any{"k": "v\t\"q\"\\"}})
	type typedCtrl struct {
		Name string `json:"name"`
		N    int    `json:"n,omitempty"`
	}
	type withOptions struct {
		Parent *unstructured.Unstructured `json:"parent,omitempty"`
	}
	for _, tc := range []struct {
		reason string
		req    any
	}{
		{"a composite sync request with children and related objects", CompositeSyncRequest{Controller: ctrl, Parent: parent,
			Children: ObjectMap{"ConfigMap.v1": {"b": child, "a": child}, "Secret.v1": {}}, Related: ObjectMap{"Z.v1": nil}, Finalizing: true}},
		{"nil maps are {} and a nil parent null", CompositeSyncRequest{Controller: ctrl}},
		{"a pointer to a request", &CompositeSyncRequest{Controller: ctrl, Parent: parent}},
		{"a nil object inside an object map is null", CompositeSyncRequest{Children: ObjectMap{"ConfigMap.v1": {"x": nil}}}},
		{"a decorator request", DecoratorSyncRequest{Controller: ctrl, Object: parent, Attachments: ObjectMap{"ConfigMap.v1": {"ns/c": child}}}},
		{"a customize request", CustomizeRequest{Controller: ctrl, Parent: parent}},
		{"a map request", MapRequest{Controller: ctrl, Parent: parent, MapKey: "k<&>", Input: child, Outputs: ObjectMap{}}},
		{"a tombstone request", TombstoneRequest{Controller: ctrl, Parent: parent, MapKey: "k", Outputs: ObjectMap{"ConfigMap.v1": {"c": child}}}},
		{"a controller that is not unstructured is marshalled as it is", CustomizeRequest{Controller: typedCtrl{Name: "<c>"}, Parent: parent}},
		{"a controller without a UID is not cached", CustomizeRequest{Controller: uobj(map[string]any{"kind": "X"}), Parent: parent}},
		{"an object with a nil map", CustomizeRequest{Controller: ctrl, Parent: &unstructured.Unstructured{}}},
		{"a struct with tag options is left to json.Marshal", withOptions{}},
		{"not a struct", map[string]any{"b": 1, "a": "<"}},
	} {
		t.Run(tc.reason, func(t *testing.T) {
			var e Encoder
			for range 2 { // the second time from the controller cache
				got, err := e.Encode(tc.req)
				if err != nil {
					t.Fatal(err)
				}
				want, err := json.Marshal(tc.req)
				if err != nil {
					t.Fatal(err)
				}
				if diff := cmp.Diff(string(want), string(got)); diff != "" {
					t.Fatalf("Encode differs from json.Marshal (-want +got):\n%s", diff)
				}
			}
		})
	}
}

// TestEncoderControllerCache: a controller's encoding is reused only for
// the resourceVersion it was made from.
func TestEncoderControllerCache(t *testing.T) {
	var e Encoder
	ctrl := uobj(map[string]any{"kind": "CompositeController", "metadata": map[string]any{"uid": "u", "resourceVersion": "1"}, "spec": map[string]any{"v": "old"}})
	if _, err := e.Encode(CustomizeRequest{Controller: ctrl}); err != nil {
		t.Fatal(err)
	}
	next := uobj(map[string]any{"kind": "CompositeController", "metadata": map[string]any{"uid": "u", "resourceVersion": "2"}, "spec": map[string]any{"v": "new"}})
	got, err := e.Encode(CustomizeRequest{Controller: next})
	if err != nil {
		t.Fatal(err)
	}
	want, _ := json.Marshal(CustomizeRequest{Controller: next})
	if diff := cmp.Diff(string(want), string(got)); diff != "" {
		t.Errorf("a new controller version was encoded from the cache (-want +got):\n%s", diff)
	}
}

func BenchmarkEncodeSyncRequest(b *testing.B) {
	ctrl := uobj(map[string]any{"apiVersion": "metacontroller.k8s.io/v1alpha1", "kind": "CompositeController",
		"metadata": map[string]any{"name": "bench", "uid": "u-1", "resourceVersion": "7"},
		"spec": map[string]any{"generateSelector": true, "parentResource": map[string]any{"apiVersion": "bench/v1", "resource": "benches"},
			"childResources": []any{map[string]any{"apiVersion": "v1", "resource": "configmaps", "updateStrategy": map[string]any{"method": "InPlace"}}},
			"hooks":          map[string]any{"sync": map[string]any{"webhook": map[string]any{"url": "http://127.0.0.1:9999/sync"}}}}})
	parent := uobj(map[string]any{"apiVersion": "bench/v1", "kind": "Bench", "metadata": map[string]any{"name": "p-1", "namespace": "default", "uid": "0d4c4b58", "resourceVersion": "123", "labels": map[string]any{"controller-uid": "0d4c4b58"}},
		"spec": map[string]any{"gen": int64(3)}, "status": map[string]any{"childCount": int64(1), "observedGen": int64(2)}})
	child := uobj(map[string]any{"apiVersion": "v1", "kind": "ConfigMap", "metadata": map[string]any{"name": "p-1", "namespace": "default", "uid": "1d4c", "ownerReferences": []any{map[string]any{"apiVersion": "bench/v1", "kind": "Bench", "name": "p-1", "uid": "0d4c4b58", "controller": true}}}, "data": map[string]any{"gen": "2"}})
	req := CompositeSyncRequest{Controller: ctrl, Parent: parent, Children: ObjectMap{"ConfigMap.v1": {"p-1": child}}, Related: ObjectMap{}}
	b.Run("json.Marshal", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := json.Marshal(req); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("Encoder", func(b *testing.B) {
		var e Encoder
		b.ReportAllocs()
		for b.Loop() {
			if _, err := e.Encode(req); err != nil {
				b.Fatal(err)
			}
		}
	})
}
