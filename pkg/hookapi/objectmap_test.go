package hookapi

import (
	"encoding/json"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/metabus/metabus/pkg/api/v1alpha1"
)

func obj(apiVersion, kind, namespace, name string) *unstructured.Unstructured {
	u := &unstructured.Unstructured{Object: map[string]any{"apiVersion": apiVersion, "kind": kind}}
	u.SetName(name)
	if namespace != "" {
		u.SetNamespace(namespace)
	}
	return u
}

func TestGroupVersionKindKey(t *testing.T) {
	cases := []struct {
		reason, apiVersion, kind, want string
	}{
		{"core types use the bare version", "v1", "Pod", "Pod.v1"},
		{"grouped types keep group/version", "apps/v1", "StatefulSet", "StatefulSet.apps/v1"},
		{"dotted groups are not confused with the separator", "networking.k8s.io/v1", "Ingress", "Ingress.networking.k8s.io/v1"},
	}
	for _, c := range cases {
		if got := GroupVersionKindKey(c.apiVersion, c.kind); got != c.want {
			t.Errorf("%s: GroupVersionKindKey(%q, %q) = %q, want %q", c.reason, c.apiVersion, c.kind, got, c.want)
		}
	}
}

func TestObjectKey(t *testing.T) {
	const v1, v2 = v1alpha1.HookVersionV1, v1alpha1.HookVersionV2
	cases := []struct {
		reason           string
		version          v1alpha1.HookVersion
		parentNamespaced bool
		objNamespaced    bool
		want             string
	}{
		{"v1: same scope (both namespaced) needs only the name", v1, true, true, "web-0"},
		{"v1: cluster parent, namespaced object needs the namespace to disambiguate", v1, false, true, "ns1/web-0"},
		{"v1: cluster parent, cluster object", v1, false, false, "web-0"},
		{"v1: namespaced parent, cluster object (related objects only) has no namespace", v1, true, false, "web-0"},
		{"v2: namespaced object always ns/name, even under a namespaced parent", v2, true, true, "ns1/web-0"},
		{"v2: namespaced object under a cluster parent", v2, false, true, "ns1/web-0"},
		{"v2: cluster object under a cluster parent", v2, false, false, "web-0"},
		{"v2: cluster object under a namespaced parent", v2, true, false, "web-0"},
		{"empty version defaults to v1", "", true, true, "web-0"},
		{"unknown version behaves as v1", "v3", false, true, "ns1/web-0"},
	}
	for _, c := range cases {
		if got := ObjectKey(c.version, c.parentNamespaced, c.objNamespaced, "ns1", "web-0"); got != c.want {
			t.Errorf("%s: got %q, want %q", c.reason, got, c.want)
		}
	}
}

func TestObjectMapBuilder(t *testing.T) {
	cases := []struct {
		reason           string
		version          v1alpha1.HookVersion
		parentNamespaced bool
		add              []*unstructured.Unstructured
		namespaced       bool
		want             string
	}{
		{
			reason: "declared types with nothing observed appear as {}",
			want:   `{"ConfigMap.v1":{},"StatefulSet.apps/v1":{}}`,
		},
		{
			reason:           "v1 under a namespaced parent keys by name",
			version:          v1alpha1.HookVersionV1,
			parentNamespaced: true,
			namespaced:       true,
			add:              []*unstructured.Unstructured{obj("v1", "ConfigMap", "ns", "b"), obj("v1", "ConfigMap", "ns", "a")},
			want:             `{"ConfigMap.v1":{"a":{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"a","namespace":"ns"}},"b":{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"b","namespace":"ns"}}},"StatefulSet.apps/v1":{}}`,
		},
		{
			reason:           "v2 under a namespaced parent keys by ns/name",
			version:          v1alpha1.HookVersionV2,
			parentNamespaced: true,
			namespaced:       true,
			add:              []*unstructured.Unstructured{obj("v1", "ConfigMap", "ns", "a")},
			want:             `{"ConfigMap.v1":{"ns/a":{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"a","namespace":"ns"}}},"StatefulSet.apps/v1":{}}`,
		},
		{
			reason:     "v1 under a cluster parent: same name in two namespaces stays distinct",
			version:    v1alpha1.HookVersionV1,
			namespaced: true,
			add:        []*unstructured.Unstructured{obj("v1", "ConfigMap", "x", "a"), obj("v1", "ConfigMap", "y", "a")},
			want:       `{"ConfigMap.v1":{"x/a":{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"a","namespace":"x"}},"y/a":{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"a","namespace":"y"}}},"StatefulSet.apps/v1":{}}`,
		},
		{
			reason:  "an undeclared type that is added still gets its own entry",
			version: v1alpha1.HookVersionV2,
			add:     []*unstructured.Unstructured{obj("v1", "Namespace", "", "kube-system")},
			want:    `{"ConfigMap.v1":{},"Namespace.v1":{"kube-system":{"apiVersion":"v1","kind":"Namespace","metadata":{"name":"kube-system"}}},"StatefulSet.apps/v1":{}}`,
		},
	}
	for _, c := range cases {
		b := NewObjectMap(c.version, c.parentNamespaced)
		b.Ensure("apps/v1", "StatefulSet")
		b.Ensure("v1", "ConfigMap")
		for _, o := range c.add {
			if err := b.Add(o, c.namespaced); err != nil {
				t.Fatalf("%s: Add: %v", c.reason, err)
			}
		}
		b.Ensure("v1", "ConfigMap") // must not wipe what was added
		got, err := json.Marshal(b.Map())
		if err != nil {
			t.Fatalf("%s: marshal: %v", c.reason, err)
		}
		if string(got) != c.want {
			t.Errorf("%s:\n got %s\nwant %s", c.reason, got, c.want)
		}
	}
}

func TestObjectMapBuilderAddErrors(t *testing.T) {
	cases := []struct {
		reason     string
		version    v1alpha1.HookVersion
		parentNS   bool
		objs       []*unstructured.Unstructured
		namespaced bool
		wantErr    string
	}{
		{"nil object", "", true, []*unstructured.Unstructured{nil}, true, "nil object"},
		{"no name", "", true, []*unstructured.Unstructured{obj("v1", "Pod", "ns", "")}, true, "lacks apiVersion, kind or name"},
		{"no kind", "", true, []*unstructured.Unstructured{obj("v1", "", "ns", "a")}, true, "lacks apiVersion, kind or name"},
		{"namespaced object without a namespace", "", false, []*unstructured.Unstructured{obj("v1", "Pod", "", "a")}, true, "has no namespace"},
		{
			"v1 keys of a namespaced parent cannot tell namespaces apart",
			v1alpha1.HookVersionV1, true,
			[]*unstructured.Unstructured{obj("v1", "Pod", "x", "a"), obj("v1", "Pod", "y", "a")}, true,
			`share the key "a"`,
		},
	}
	for _, c := range cases {
		b := NewObjectMap(c.version, c.parentNS)
		var err error
		for _, o := range c.objs {
			if err = b.Add(o, c.namespaced); err != nil {
				break
			}
		}
		if err == nil || !strings.Contains(err.Error(), c.wantErr) {
			t.Errorf("%s: got error %v, want one containing %q", c.reason, err, c.wantErr)
		}
	}
}

func TestObjectMapMarshalsNilAsEmptyObject(t *testing.T) {
	cases := []struct {
		reason string
		m      ObjectMap
		want   string
	}{
		{"nil map (no customize hook: related) is {}", nil, `{}`},
		{"empty map is {}", ObjectMap{}, `{}`},
		{"nil inner map is {}", ObjectMap{"Pod.v1": nil}, `{"Pod.v1":{}}`},
	}
	for _, c := range cases {
		got, err := json.Marshal(c.m)
		if err != nil {
			t.Fatalf("%s: %v", c.reason, err)
		}
		if string(got) != c.want {
			t.Errorf("%s: got %s, want %s", c.reason, got, c.want)
		}
	}
}
