package render

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/google/go-cmp/cmp"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/metabus/metabus/pkg/bus"
	"github.com/metabus/metabus/pkg/hooks"
)

func TestFieldChanges(t *testing.T) {
	cases := []struct {
		reason        string
		before, after map[string]any
		want          []FieldChange
	}{
		{reason: "equal objects: nothing", before: map[string]any{"a": 1}, after: map[string]any{"a": 1}},
		{reason: "numbers compare by value, int64 and float64 alike", before: map[string]any{"a": int64(1)}, after: map[string]any{"a": 1.0}},
		{reason: "added, removed and changed leaves, sorted by path",
			before: map[string]any{"spec": map[string]any{"x": "a", "gone": true}},
			after:  map[string]any{"spec": map[string]any{"x": "b", "new": map[string]any{"deep": 1}}},
			want: []FieldChange{
				{Path: "spec.gone", Before: true},
				{Path: "spec.new.deep", After: 1},
				{Path: "spec.x", Before: "a", After: "b"},
			}},
		{reason: "lists of the same length item by item",
			before: map[string]any{"c": []any{map[string]any{"n": "a", "cmd": "x"}, "same"}},
			after:  map[string]any{"c": []any{map[string]any{"n": "a", "cmd": "y"}, "same"}},
			want:   []FieldChange{{Path: "c[0].cmd", Before: "x", After: "y"}}},
		{reason: "lists of another length as a whole",
			before: map[string]any{"c": []any{"a"}}, after: map[string]any{"c": []any{"a", "b"}},
			want: []FieldChange{{Path: "c", Before: []any{"a"}, After: []any{"a", "b"}}}},
	}
	for _, c := range cases {
		t.Run(c.reason, func(t *testing.T) {
			if diff := cmp.Diff(c.want, FieldChanges(c.before, c.after)); diff != "" {
				t.Errorf("changes (-want +got):\n%s", diff)
			}
		})
	}
}

func TestMergeChanges(t *testing.T) {
	before := map[string]any{"keep": "1", "drop": "2", "change": "3"}
	patch := map[string]any{"drop": nil, "change": "4", "add": "5", "keep": "1", "absent": nil}
	want := []FieldChange{
		{Path: "metadata.labels.add", After: "5"},
		{Path: "metadata.labels.change", Before: "3", After: "4"},
		{Path: "metadata.labels.drop", Before: "2"},
	}
	if diff := cmp.Diff(want, mergeChanges("metadata.labels", before, patch)); diff != "" {
		t.Errorf("changes (-want +got):\n%s", diff)
	}
}

func TestOffline(t *testing.T) {
	parent := obj("example.com/v1", "Policy", "ns", "p", nil)
	resolve := Offline(parent, obj("example.com/v1", "Box", "", "b", nil))
	cases := []struct {
		apiVersion, resource, kind string
		namespaced                 bool
		fails                      bool
	}{
		{apiVersion: "example.com/v1", resource: "policies", kind: "Policy", namespaced: true},
		{apiVersion: "example.com/v1", resource: "boxes", kind: "Box"},
		{apiVersion: "v1", resource: "configmaps", kind: "ConfigMap", namespaced: true},
		{apiVersion: "apps/v1", resource: "deployments", kind: "Deployment", namespaced: true},
		{apiVersion: "rbac.authorization.k8s.io/v1", resource: "clusterroles", kind: "ClusterRole"},
		{apiVersion: "example.com/v1", resource: "widgets", fails: true},
	}
	for _, c := range cases {
		t.Run(c.resource, func(t *testing.T) {
			r, err := resolve(c.apiVersion, c.resource)
			if c.fails {
				if err == nil {
					t.Errorf("resolved %v, want an error", r)
				}
				return
			}
			if err != nil || r.Kind != c.kind || r.Namespaced != c.namespaced || r.APIVersion() != c.apiVersion || r.GVR.Resource != c.resource {
				t.Errorf("got %+v, %v", r, err)
			}
		})
	}
}

func obj(apiVersion, kind, ns, name string, extra map[string]any) *unstructured.Unstructured {
	md := map[string]any{"name": name}
	if ns != "" {
		md["namespace"] = ns
	}
	o := map[string]any{"apiVersion": apiVersion, "kind": kind, "metadata": md}
	for k, v := range extra {
		o[k] = v
	}
	return &unstructured.Unstructured{Object: o}
}

// controller is the HelloWorld tutorial's CompositeController calling url.
func controller(url string) *unstructured.Unstructured {
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "metacontroller.k8s.io/v1alpha1", "kind": "CompositeController",
		"metadata": map[string]any{"name": "hello", "uid": "ctrl-uid"},
		"spec": map[string]any{
			"generateSelector": true,
			"parentResource":   map[string]any{"apiVersion": "example.com/v1", "resource": "helloworlds"},
			"childResources": []any{map[string]any{"apiVersion": "v1", "resource": "configmaps",
				"updateStrategy": map[string]any{"method": "InPlace"}}},
			"hooks": map[string]any{"sync": map[string]any{"webhook": map[string]any{"url": url}}},
		},
	}}
}

func configMap(name, greeting string) map[string]any {
	return map[string]any{"apiVersion": "v1", "kind": "ConfigMap", "metadata": map[string]any{"name": name},
		"data": map[string]any{"greeting": greeting}}
}

// hookServer answers with one ConfigMap "<parent>-cm" holding greeting,
// and keeps the last request and its CloudEvent type.
func hookServer(t *testing.T, greeting string) (url string, last func() (map[string]any, string)) {
	t.Helper()
	var req map[string]any
	var ceType string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		req = nil
		_ = json.Unmarshal(body, &req)
		ceType = r.Header.Get("ce-type")
		name := req["parent"].(map[string]any)["metadata"].(map[string]any)["name"].(string)
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]any{"status": map[string]any{"ok": true}, "children": []any{configMap(name+"-cm", greeting)}})
	}))
	t.Cleanup(srv.Close)
	return srv.URL, func() (map[string]any, string) { return req, ceType }
}

func TestRender(t *testing.T) {
	ctx := context.Background()
	url, last := hookServer(t, "hello")
	v2, _ := hookServer(t, "hi")
	parent := obj("example.com/v1", "HelloWorld", "ns", "p", map[string]any{"spec": map[string]any{"who": "you"}})
	parent.SetUID("parent-uid")
	owned := func(o map[string]any) *unstructured.Unstructured {
		u := &unstructured.Unstructured{Object: o}
		u.SetNamespace("ns")
		return u
	}
	cases := []struct {
		reason   string
		children []*unstructured.Unstructured
		hookURL  string
		want     []ChildChange
	}{
		{reason: "no children: the hook's ConfigMap is created",
			want: []ChildChange{{Action: Create, APIVersion: "v1", Kind: "ConfigMap", Namespace: "ns", Name: "p-cm"}}},
		{reason: "a stray child the answer leaves out is deleted",
			children: []*unstructured.Unstructured{owned(configMap("old", "x"))},
			want: []ChildChange{
				{Action: Delete, APIVersion: "v1", Kind: "ConfigMap", Namespace: "ns", Name: "old"},
				{Action: Create, APIVersion: "v1", Kind: "ConfigMap", Namespace: "ns", Name: "p-cm"},
			}},
		{reason: "another hook URL (a new version): the child's data is updated in place",
			children: []*unstructured.Unstructured{owned(configMap("p-cm", "hello"))}, hookURL: v2,
			want: []ChildChange{{Action: Update, APIVersion: "v1", Kind: "ConfigMap", Namespace: "ns", Name: "p-cm",
				Fields: []FieldChange{
					{Path: "data.greeting", Before: "hello", After: "hi"},
					{Path: "metadata.labels.controller-uid", After: "parent-uid"},
				}}}},
	}
	for _, c := range cases {
		t.Run(c.reason, func(t *testing.T) {
			res, err := Render(ctx, Input{
				Controller: controller(url), Parent: parent, Children: c.children, HookURL: c.hookURL,
				Resolve: Offline(append([]*unstructured.Unstructured{parent}, c.children...)...), Hooks: hooks.New(hooks.Options{}),
			})
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(c.want, res.Changes.Children); diff != "" {
				t.Errorf("children (-want +got):\n%s", diff)
			}
			if !res.Changed() || res.Desired == nil || res.Desired.Hook != bus.HookSync || len(res.Requests) != 1 {
				t.Errorf("result %+v", res)
			}
		})
	}
	// The request is the dispatcher's: the controller, the parent and
	// every declared child type, as a sync hook CloudEvent.
	req, ceType := last()
	if ceType != bus.TypeHookPrefix+"sync.v1" {
		t.Errorf("ce-type %q", ceType)
	}
	if _, ok := req["controller"].(map[string]any); !ok {
		t.Errorf("request without the controller: %v", req)
	}
	if ch, ok := req["children"].(map[string]any); !ok || ch["ConfigMap.v1"] == nil {
		t.Errorf("request children %v, want the ConfigMap.v1 group", req["children"])
	}
}

func TestRenderParentStatusUnchanged(t *testing.T) {
	url, _ := hookServer(t, "hello")
	parent := obj("example.com/v1", "HelloWorld", "ns", "p", map[string]any{"status": map[string]any{"ok": true, "observedGeneration": int64(2)}})
	parent.SetUID("parent-uid")
	parent.SetGeneration(2)
	first, err := Render(context.Background(), Input{Controller: controller(url), Parent: parent, Resolve: Offline(parent), Hooks: hooks.New(hooks.Options{})})
	if err != nil {
		t.Fatal(err)
	}
	if len(first.Changes.Parent) != 0 {
		t.Errorf("the parent's status is already the hook's: changes %+v", first.Changes.Parent)
	}
	if len(first.Changes.Children) != 1 || first.Changes.Children[0].Action != Create {
		t.Fatalf("first render %+v", first.Changes)
	}
}
