package related

import (
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/metabus/metabus/pkg/api/v1alpha1"
	"github.com/metabus/metabus/pkg/hookapi"
)

func obj(ns, name string, lbls map[string]string) *unstructured.Unstructured {
	u := &unstructured.Unstructured{}
	u.SetNamespace(ns)
	u.SetName(name)
	u.SetLabels(lbls)
	return u
}

func TestMatches(t *testing.T) {
	nsLabels := func(ns string) (map[string]string, bool) {
		switch ns {
		case "prod":
			return map[string]string{"env": "prod"}, true
		case "dev":
			return map[string]string{"env": "dev"}, true
		}
		return nil, false
	}
	base := hookapi.RelatedResourceRule{APIVersion: "v1", Resource: "configmaps"}
	with := func(f func(*hookapi.RelatedResourceRule)) hookapi.RelatedResourceRule {
		r := base
		f(&r)
		return r
	}
	cases := []struct {
		reason   string
		rule     hookapi.RelatedResourceRule
		version  v1alpha1.HookVersion
		parentNS string
		obj      *unstructured.Unstructured
		want     bool
	}{
		{reason: "an empty rule selects everything in scope", rule: base, version: "v2", obj: obj("x", "a", nil), want: true},
		{reason: "v1 with a namespaced parent only sees the parent's namespace", rule: base, version: "v1", parentNS: "p", obj: obj("x", "a", nil), want: false},
		{reason: "v1 with a namespaced parent sees its own namespace", rule: base, version: "v1", parentNS: "p", obj: obj("p", "a", nil), want: true},
		{reason: "v2 may look into other namespaces", rule: base, version: "v2", parentNS: "p", obj: obj("x", "a", nil), want: true},
		{reason: "names select by name", rule: with(func(r *hookapi.RelatedResourceRule) { r.Names = []string{"a"} }), version: "v2", obj: obj("x", "a", nil), want: true},
		{reason: "a name not listed is not selected", rule: with(func(r *hookapi.RelatedResourceRule) { r.Names = []string{"a"} }), version: "v2", obj: obj("x", "b", nil), want: false},
		{reason: "namespace confines the rule", rule: with(func(r *hookapi.RelatedResourceRule) { r.Namespace = "y" }), version: "v2", obj: obj("x", "a", nil), want: false},
		{reason: "labelSelector must match", rule: with(func(r *hookapi.RelatedResourceRule) {
			r.LabelSelector = &metav1.LabelSelector{MatchLabels: map[string]string{"k": "v"}}
		}), version: "v2", obj: obj("x", "a", map[string]string{"k": "v"}), want: true},
		{reason: "labelSelector mismatch", rule: with(func(r *hookapi.RelatedResourceRule) {
			r.LabelSelector = &metav1.LabelSelector{MatchLabels: map[string]string{"k": "v"}}
		}), version: "v2", obj: obj("x", "a", map[string]string{"k": "w"}), want: false},
		{reason: "namespaceSelector matches the namespace's labels", rule: with(func(r *hookapi.RelatedResourceRule) {
			r.NamespaceSelector = &metav1.LabelSelector{MatchLabels: map[string]string{"env": "prod"}}
		}), version: "v2", obj: obj("prod", "a", nil), want: true},
		{reason: "namespaceSelector rejects other namespaces", rule: with(func(r *hookapi.RelatedResourceRule) {
			r.NamespaceSelector = &metav1.LabelSelector{MatchLabels: map[string]string{"env": "prod"}}
		}), version: "v2", obj: obj("dev", "a", nil), want: false},
		{reason: "namespaceSelector with an unknown namespace selects nothing", rule: with(func(r *hookapi.RelatedResourceRule) {
			r.NamespaceSelector = &metav1.LabelSelector{MatchLabels: map[string]string{"env": "prod"}}
		}), version: "v2", obj: obj("gone", "a", nil), want: false},
		{reason: "a nil object never matches", rule: base, version: "v2", obj: nil, want: false},
	}
	for _, tc := range cases {
		r, err := Compile(tc.rule, tc.version, tc.parentNS)
		if err != nil {
			t.Errorf("%s: compile: %v", tc.reason, err)
			continue
		}
		if got := r.Matches(tc.obj, nsLabels); got != tc.want {
			t.Errorf("%s: Matches = %v, want %v", tc.reason, got, tc.want)
		}
	}
}

func TestCompileRejects(t *testing.T) {
	cases := []struct {
		reason string
		rule   hookapi.RelatedResourceRule
	}{
		{"names cannot be combined with a selector", hookapi.RelatedResourceRule{APIVersion: "v1", Resource: "configmaps", Names: []string{"a"},
			LabelSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"k": "v"}}}},
		{"namespaceSelector is not allowed for a v1 namespaced parent", hookapi.RelatedResourceRule{APIVersion: "v1", Resource: "configmaps",
			NamespaceSelector: &metav1.LabelSelector{}}},
		{"resource is required", hookapi.RelatedResourceRule{APIVersion: "v1"}},
	}
	for _, tc := range cases {
		if _, err := Compile(tc.rule, "v1", "p"); err == nil {
			t.Errorf("%s: compiled", tc.reason)
		}
	}
}
