package hookapi

import (
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/metabus/metabus/pkg/api/v1alpha1"
)

func TestDecodeCustomizeResponse(t *testing.T) {
	var r CustomizeResponse
	body := `{"relatedResources":[{"apiVersion":"v1","resource":"configmaps","namespace":"global","names":["settings"]},{"apiVersion":"v1","resource":"namespaces","labelSelector":{}}]}`
	if err := Decode([]byte(body), true, &r); err != nil {
		t.Fatal(err)
	}
	if len(r.RelatedResources) != 2 || r.RelatedResources[0].Names[0] != "settings" || r.RelatedResources[1].LabelSelector == nil {
		t.Fatalf("got %+v", r)
	}
	if err := Decode([]byte(`{"relatedResources":[{"apiVersion":"v1","resource":"pods","labelselector":{}}]}`), true, &r); err == nil {
		t.Error("strict decoding accepted a misspelt field of a rule")
	}
}

func TestValidateRelatedResourceRule(t *testing.T) {
	const v1, v2 = v1alpha1.HookVersionV1, v1alpha1.HookVersionV2
	all := &metav1.LabelSelector{}
	byLabel := &metav1.LabelSelector{MatchLabels: map[string]string{"a": "b"}}
	badSel := &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "a", Operator: "Near"}}}
	cases := []struct {
		reason   string
		rule     RelatedResourceRule
		version  v1alpha1.HookVersion
		parentNS string
		wantErrs []string // substrings; empty means valid
	}{
		{reason: "label selector only", rule: RelatedResourceRule{APIVersion: "v1", Resource: "namespaces", LabelSelector: all}, version: v1},
		{reason: "namespace + names (guide example) under a cluster parent", rule: RelatedResourceRule{APIVersion: "v1", Resource: "configmaps", Namespace: "global", Names: []string{"s"}}, version: v1},
		{reason: "v1 namespaced parent may repeat its own namespace", rule: RelatedResourceRule{APIVersion: "v1", Resource: "configmaps", Namespace: "ns", Names: []string{"s"}}, version: v1, parentNS: "ns"},
		{reason: "v1 cluster parent may use a namespaceSelector", rule: RelatedResourceRule{APIVersion: "v1", Resource: "secrets", LabelSelector: all, NamespaceSelector: byLabel}, version: v1},
		{reason: "v2 namespaced parent may look in other namespaces", rule: RelatedResourceRule{APIVersion: "v1", Resource: "configmaps", Namespace: "other", Names: []string{"s"}}, version: v2, parentNS: "ns"},
		{reason: "v2 namespaced parent may use a namespaceSelector", rule: RelatedResourceRule{APIVersion: "v1", Resource: "configmaps", NamespaceSelector: byLabel}, version: v2, parentNS: "ns"},
		{reason: "no selector at all is left to the resolver", rule: RelatedResourceRule{APIVersion: "v1", Resource: "configmaps"}, version: v2},
		{reason: "apiVersion and resource are required", rule: RelatedResourceRule{}, version: v1, wantErrs: []string{"apiVersion is required", "resource is required"}},
		{reason: "names with a label selector", rule: RelatedResourceRule{APIVersion: "v1", Resource: "pods", Names: []string{"a"}, LabelSelector: all}, version: v2, wantErrs: []string{"names cannot be combined"}},
		{reason: "names with a namespace selector", rule: RelatedResourceRule{APIVersion: "v1", Resource: "pods", Names: []string{"a"}, NamespaceSelector: all}, version: v2, wantErrs: []string{"names cannot be combined"}},
		{reason: "namespace with a namespace selector", rule: RelatedResourceRule{APIVersion: "v1", Resource: "pods", Namespace: "x", NamespaceSelector: all}, version: v2, wantErrs: []string{"namespace cannot be combined with namespaceSelector"}},
		{reason: "v1 namespaced parent: namespaceSelector not allowed", rule: RelatedResourceRule{APIVersion: "v1", Resource: "pods", NamespaceSelector: all}, version: v1, parentNS: "ns", wantErrs: []string{"namespaceSelector is not allowed"}},
		{reason: "empty version is v1", rule: RelatedResourceRule{APIVersion: "v1", Resource: "pods", NamespaceSelector: all}, parentNS: "ns", wantErrs: []string{"namespaceSelector is not allowed"}},
		{reason: "v1 namespaced parent: other namespace", rule: RelatedResourceRule{APIVersion: "v1", Resource: "pods", Namespace: "other"}, version: v1, parentNS: "ns", wantErrs: []string{`namespace "other" differs`}},
		{reason: "empty name entry", rule: RelatedResourceRule{APIVersion: "v1", Resource: "pods", Names: []string{"a", ""}}, version: v1, wantErrs: []string{"names[1] is empty"}},
		{reason: "invalid label selector", rule: RelatedResourceRule{APIVersion: "v1", Resource: "pods", LabelSelector: badSel}, version: v1, wantErrs: []string{"invalid labelSelector"}},
		{reason: "invalid namespace selector", rule: RelatedResourceRule{APIVersion: "v1", Resource: "pods", NamespaceSelector: badSel}, version: v2, wantErrs: []string{"invalid namespaceSelector"}},
		{
			reason:   "every problem is reported at once",
			rule:     RelatedResourceRule{APIVersion: "v1", Resource: "pods", Names: []string{"a"}, LabelSelector: all, Namespace: "x", NamespaceSelector: all},
			version:  v1,
			parentNS: "ns",
			wantErrs: []string{"names cannot be combined", "namespace cannot be combined", "namespaceSelector is not allowed", `namespace "x" differs`},
		},
	}
	for _, c := range cases {
		err := Validate(c.rule, c.version, c.parentNS)
		if len(c.wantErrs) == 0 {
			if err != nil {
				t.Errorf("%s: unexpected error %v", c.reason, err)
			}
			continue
		}
		if err == nil {
			t.Errorf("%s: no error, want %q", c.reason, c.wantErrs)
			continue
		}
		for _, w := range c.wantErrs {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s: error %q lacks %q", c.reason, err, w)
			}
		}
	}
}
