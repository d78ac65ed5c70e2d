package hookapi

import (
	"encoding/json"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/metabus/metabus/pkg/api/v1alpha1"
)

// TestRequestGoldenJSON pins the exact bytes hooks receive: field names and order, {} for empty
// maps, and finalizing always present.
func TestRequestGoldenJSON(t *testing.T) {
	controller := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "metacontroller.k8s.io/v1alpha1", "kind": "CompositeController",
		"metadata": map[string]any{"name": "cc"},
	}}
	parent := obj("example.com/v1", "Thing", "ns", "p")
	pod := obj("v1", "Pod", "ns", "p-0")
	pod.SetLabels(map[string]string{"app": "p"})

	children := NewObjectMap(v1alpha1.HookVersionV1, true)
	children.Ensure("v1", "Pod")
	children.Ensure("apps/v1", "StatefulSet")
	if err := children.Add(pod, true); err != nil {
		t.Fatal(err)
	}
	attachments := NewObjectMap(v1alpha1.HookVersionV2, true)
	attachments.Ensure("v1", "Pod")
	if err := attachments.Add(pod, true); err != nil {
		t.Fatal(err)
	}

	cases := []struct {
		reason string
		req    any
		want   string
	}{
		{
			reason: "composite sync, v1 keys, no customize hook: related is {}",
			req:    CompositeSyncRequest{Controller: controller, Parent: parent, Children: children.Map()},
			want: `{"controller":{"apiVersion":"metacontroller.k8s.io/v1alpha1","kind":"CompositeController","metadata":{"name":"cc"}},` +
				`"parent":{"apiVersion":"example.com/v1","kind":"Thing","metadata":{"name":"p","namespace":"ns"}},` +
				`"children":{"Pod.v1":{"p-0":{"apiVersion":"v1","kind":"Pod","metadata":{"labels":{"app":"p"},"name":"p-0","namespace":"ns"}}},"StatefulSet.apps/v1":{}},` +
				`"related":{},"finalizing":false}`,
		},
		{
			reason: "composite finalize",
			req:    CompositeSyncRequest{Controller: controller, Parent: parent, Children: NewObjectMap("", true).Map(), Related: ObjectMap{}, Finalizing: true},
			want: `{"controller":{"apiVersion":"metacontroller.k8s.io/v1alpha1","kind":"CompositeController","metadata":{"name":"cc"}},` +
				`"parent":{"apiVersion":"example.com/v1","kind":"Thing","metadata":{"name":"p","namespace":"ns"}},` +
				`"children":{},"related":{},"finalizing":true}`,
		},
		{
			reason: "decorator sync, v2 keys",
			req:    DecoratorSyncRequest{Controller: controller, Object: parent, Attachments: attachments.Map()},
			want: `{"controller":{"apiVersion":"metacontroller.k8s.io/v1alpha1","kind":"CompositeController","metadata":{"name":"cc"}},` +
				`"object":{"apiVersion":"example.com/v1","kind":"Thing","metadata":{"name":"p","namespace":"ns"}},` +
				`"attachments":{"Pod.v1":{"ns/p-0":{"apiVersion":"v1","kind":"Pod","metadata":{"labels":{"app":"p"},"name":"p-0","namespace":"ns"}}}},` +
				`"related":{},"finalizing":false}`,
		},
		{
			reason: "customize",
			req:    CustomizeRequest{Controller: controller, Parent: parent},
			want: `{"controller":{"apiVersion":"metacontroller.k8s.io/v1alpha1","kind":"CompositeController","metadata":{"name":"cc"}},` +
				`"parent":{"apiVersion":"example.com/v1","kind":"Thing","metadata":{"name":"p","namespace":"ns"}}}`,
		},
	}
	for _, c := range cases {
		got, err := json.Marshal(c.req)
		if err != nil {
			t.Fatalf("%s: %v", c.reason, err)
		}
		if string(got) != c.want {
			t.Errorf("%s:\n got %s\nwant %s", c.reason, got, c.want)
		}
	}
}
