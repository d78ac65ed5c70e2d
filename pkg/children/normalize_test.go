package children

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
)

func TestNormalize(t *testing.T) {
	withUID := nsOwner()
	withUID.Selector = labels.SelectorFromSet(labels.Set{"controller-uid": ownerUID})
	withUID.ExtraLabels = map[string]string{"controller-uid": ownerUID}

	decorator := nsOwner()
	decorator.Selector = nil
	decorator.ExtraAnnotations = map[string]string{"metacontroller.k8s.io/decorator-controller": "dc"}

	type obj = *unstructured.Unstructured
	cases := []struct {
		reason  string
		owner   Owner
		desired func(t *testing.T) []obj
		// wantProblems are substrings, one per expected problem, each prefixed by its index
		// as "[i]"; empty means success, checked by check.
		wantProblems []string
		check        func(t *testing.T, got []Desired)
	}{
		{
			reason:  "namespace defaults to the owner's, in the hook's order",
			owner:   nsOwner(),
			desired: func(t *testing.T) []obj { return []obj{pod(t, "b", "img"), configMap(t, "a", "x")} },
			check: func(t *testing.T, got []Desired) {
				if len(got) != 2 || got[0].Object.GetName() != "b" || got[1].Object.GetName() != "a" {
					t.Fatalf("order/contents: %v", got)
				}
				for _, d := range got {
					if d.Object.GetNamespace() != "ns" {
						t.Errorf("%s: namespace %q, want ns", d.Object.GetName(), d.Object.GetNamespace())
					}
				}
				if got[0].Rule.Kind != "Pod" || got[1].Rule.Kind != "ConfigMap" {
					t.Errorf("rules: %v, %v", got[0].Rule, got[1].Rule)
				}
			},
		},
		{
			reason: "an explicit namespace equal to the owner's is fine",
			owner:  nsOwner(),
			desired: func(t *testing.T) []obj {
				p := pod(t, "a", "img")
				p.SetNamespace("ns")
				return []obj{p}
			},
		},
		{
			reason: "same name in two kinds is two children",
			owner:  nsOwner(),
			desired: func(t *testing.T) []obj {
				return []obj{pod(t, "a", "img"), configMap(t, "a", "x")}
			},
		},
		{
			reason: "generateSelector: the injected controller-uid label makes unlabelled children match",
			owner:  withUID,
			desired: func(t *testing.T) []obj {
				return []obj{decode(t, `{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"a"}}`)}
			},
			check: func(t *testing.T, got []Desired) {
				if l := got[0].Object.GetLabels(); l["controller-uid"] != ownerUID || len(l) != 1 {
					t.Errorf("labels = %v", l)
				}
			},
		},
		{
			reason: "ExtraLabels override a value the hook set",
			owner:  withUID,
			desired: func(t *testing.T) []obj {
				return []obj{decode(t, `{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"a","labels":{"controller-uid":"forged","keep":"me"}}}`)}
			},
			check: func(t *testing.T, got []Desired) {
				if l := got[0].Object.GetLabels(); l["controller-uid"] != ownerUID || l["keep"] != "me" {
					t.Errorf("labels = %v", l)
				}
			},
		},
		{
			reason: "decorators: no selector check, ExtraAnnotations injected next to the hook's",
			owner:  decorator,
			desired: func(t *testing.T) []obj {
				return []obj{decode(t, `{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"a","annotations":{"mine":"1"}}}`)}
			},
			check: func(t *testing.T, got []Desired) {
				a := got[0].Object.GetAnnotations()
				if a["metacontroller.k8s.io/decorator-controller"] != "dc" || a["mine"] != "1" {
					t.Errorf("annotations = %v", a)
				}
			},
		},
		{
			reason: "cluster-scoped owner: namespaced children in several namespaces, and cluster-scoped ones",
			owner:  clusterOwner(),
			desired: func(t *testing.T) []obj {
				a, b := configMap(t, "cfg", "1"), configMap(t, "cfg", "1")
				a.SetNamespace("x")
				b.SetNamespace("y")
				return []obj{a, b, decode(t, `{"apiVersion":"rbac.authorization.k8s.io/v1","kind":"ClusterRole","metadata":{"name":"r","namespace":"ignored"}}`)}
			},
			check: func(t *testing.T, got []Desired) {
				if got[0].Object.GetNamespace() != "x" || got[1].Object.GetNamespace() != "y" {
					t.Errorf("namespaces changed: %q %q", got[0].Object.GetNamespace(), got[1].Object.GetNamespace())
				}
				if _, has := got[2].Object.Object["metadata"].(map[string]any)["namespace"]; has {
					t.Errorf("cluster-scoped child kept metadata.namespace: %v", got[2].Object.Object)
				}
			},
		},
		{
			reason:  "empty desired set is valid (delete everything)",
			owner:   nsOwner(),
			desired: func(t *testing.T) []obj { return nil },
		},
		{
			reason: "undeclared kind, declared ones are listed",
			owner:  nsOwner(),
			desired: func(t *testing.T) []obj {
				return []obj{decode(t, `{"apiVersion":"v1","kind":"Secret","metadata":{"name":"s","labels":{"app":"web"}}}`)}
			},
			wantProblems: []string{"[0] Secret.v1 \"s\": Secret.v1 is not a declared child resource (declared: Pod.v1, ConfigMap.v1, ClusterRole.rbac.authorization.k8s.io/v1)"},
		},
		{
			reason: "declared kind in another version is rejected (exact apiVersion match)",
			owner:  nsOwner(),
			desired: func(t *testing.T) []obj {
				return []obj{decode(t, `{"apiVersion":"rbac.authorization.k8s.io/v1beta1","kind":"ClusterRole","metadata":{"name":"r"}}`)}
			},
			wantProblems: []string{"[0] ", "is not a declared child resource"},
		},
		{
			reason: "missing kind",
			owner:  nsOwner(),
			desired: func(t *testing.T) []obj {
				return []obj{decode(t, `{"apiVersion":"v1","metadata":{"name":"a","labels":{"app":"web"}}}`)}
			},
			wantProblems: []string{"[0] ", "apiVersion and kind are required"},
		},
		{
			reason:       "missing name",
			owner:        nsOwner(),
			desired:      func(t *testing.T) []obj { return []obj{pod(t, "", "img")} },
			wantProblems: []string{"[0] ", "metadata.name is required"},
		},
		{
			reason: "name of the wrong type",
			owner:  nsOwner(),
			desired: func(t *testing.T) []obj {
				return []obj{decode(t, `{"apiVersion":"v1","kind":"Pod","metadata":{"name":7,"labels":{"app":"web"}}}`)}
			},
			wantProblems: []string{"[0] ", "metadata.name must be a string"},
		},
		{
			reason: "cluster-scoped child under a namespaced owner",
			owner:  nsOwner(),
			desired: func(t *testing.T) []obj {
				return []obj{decode(t, `{"apiVersion":"rbac.authorization.k8s.io/v1","kind":"ClusterRole","metadata":{"name":"r","labels":{"app":"web"}}}`)}
			},
			wantProblems: []string{`[0] ClusterRole.rbac.authorization.k8s.io/v1 "r": is cluster-scoped, which cannot be owned by a namespaced owner`},
		},
		{
			reason: "child in another namespace than the namespaced owner",
			owner:  nsOwner(),
			desired: func(t *testing.T) []obj {
				p := pod(t, "a", "img")
				p.SetNamespace("other")
				return []obj{p}
			},
			wantProblems: []string{`[0] Pod.v1 "other/a": is in namespace "other", but children of a namespaced owner must be in its namespace "ns"`},
		},
		{
			reason:       "namespaced child without namespace under a cluster-scoped owner",
			owner:        clusterOwner(),
			desired:      func(t *testing.T) []obj { return []obj{configMap(t, "cfg", "1")} },
			wantProblems: []string{"[0] ", "needs metadata.namespace"},
		},
		{
			reason: "listed twice (explicit and defaulted namespace are the same child)",
			owner:  nsOwner(),
			desired: func(t *testing.T) []obj {
				a, b := pod(t, "a", "img"), pod(t, "a", "img2")
				b.SetNamespace("ns")
				return []obj{a, configMap(t, "c", "x"), b}
			},
			wantProblems: []string{"[2] ", "is listed twice (first at index 0)"},
		},
		{
			reason: "labels do not match the owner's selector",
			owner:  nsOwner(),
			desired: func(t *testing.T) []obj {
				return []obj{decode(t, `{"apiVersion":"v1","kind":"Pod","metadata":{"name":"a","labels":{"app":"api"}}}`)}
			},
			wantProblems: []string{"[0] ", `do not match the owner's selector "app=web"`},
		},
		{
			reason:       "null entry",
			owner:        nsOwner(),
			desired:      func(t *testing.T) []obj { return []obj{pod(t, "a", "img"), nil, {Object: nil}} },
			wantProblems: []string{"[1]: is null", "[2]: is null"},
		},
		{
			reason: "labels of the wrong type",
			owner:  nsOwner(),
			desired: func(t *testing.T) []obj {
				return []obj{decode(t, `{"apiVersion":"v1","kind":"Pod","metadata":{"name":"a","labels":{"app":1}}}`)}
			},
			wantProblems: []string{"[0] ", `metadata.labels["app"] must be a string`},
		},
		{
			reason:       "metadata of the wrong type",
			owner:        nsOwner(),
			desired:      func(t *testing.T) []obj { return []obj{decode(t, `{"apiVersion":"v1","kind":"Pod","metadata":[]}`)} },
			wantProblems: []string{"[0] ", "metadata must be an object"},
		},
		{
			reason: "Go values that are not JSON are a problem, not a panic",
			owner:  nsOwner(),
			desired: func(t *testing.T) []obj {
				p := pod(t, "a", "img")
				p.Object["spec"] = struct{ X int }{1}
				return []obj{p}
			},
			wantProblems: []string{"[0] ", "spec: value of Go type struct { X int } is not JSON"},
		},
		{
			reason: "every problem is listed and valid children are rejected with them",
			owner:  nsOwner(),
			desired: func(t *testing.T) []obj {
				other := pod(t, "b", "img")
				other.SetNamespace("other")
				return []obj{pod(t, "ok", "img"), other, pod(t, "", "img"), decode(t, `{"apiVersion":"v1","kind":"Secret","metadata":{"name":"s","labels":{"app":"web"}}}`)}
			},
			wantProblems: []string{"[1] ", `namespace "other"`, "[2] ", "metadata.name is required", "[3] ", "not a declared child resource"},
		},
	}
	for _, c := range cases {
		t.Run(c.reason, func(t *testing.T) {
			rules := testRules("")
			in := c.desired(t)
			before := toJSON(t, in)
			got, err := Normalize(c.owner, rules, in)
			if after := toJSON(t, in); after != before {
				t.Errorf("input mutated:\nbefore %s\nafter  %s", before, after)
			}
			if len(c.wantProblems) == 0 {
				if err != nil {
					t.Fatalf("unexpected error: %v", err)
				}
				if len(got) != len(in) {
					t.Fatalf("got %d desired, want %d", len(got), len(in))
				}
				for i, d := range got {
					if d.Rule == nil || d.Object == nil || d.Object == in[i] {
						t.Errorf("entry %d: rule %v, object %p (input %p): want a rule and a copy", i, d.Rule, d.Object, in[i])
					}
					if d.Rule != nil && !pointsInto(d.Rule, rules) {
						t.Errorf("entry %d: Rule does not point into rules", i)
					}
				}
				if c.check != nil {
					c.check(t, got)
				}
				return
			}
			var ve *ValidationError
			if !errors.As(err, &ve) {
				t.Fatalf("got %v, want a *ValidationError", err)
			}
			if got != nil {
				t.Errorf("rejected set still returned %d children", len(got))
			}
			msg := err.Error()
			pos := 0
			for _, w := range c.wantProblems { // in order
				i := strings.Index(msg[pos:], w)
				if i < 0 {
					t.Fatalf("error %q lacks %q (after offset %d)", msg, w, pos)
				}
				pos += i + len(w)
			}
			if ve.Total != len(in) {
				t.Errorf("Total = %d, want %d", ve.Total, len(in))
			}
		})
	}
}

func TestNormalizeConfigurationErrors(t *testing.T) {
	noNS := nsOwner()
	noNS.Namespace = ""
	strayNS := clusterOwner()
	strayNS.Namespace = "ns"
	cases := []struct {
		reason string
		owner  Owner
		rules  []Rule
		want   string
	}{
		{"namespaced owner without namespace", noNS, testRules(""), "is namespaced but has no namespace"},
		{"cluster owner with a namespace", strayNS, testRules(""), "is cluster-scoped but has namespace"},
		{"rule not resolved through discovery", nsOwner(), []Rule{{APIVersion: "v1", Resource: "pods"}}, "lacks apiVersion or kind"},
		{"unknown update method", nsOwner(), []Rule{{APIVersion: "v1", Kind: "Pod", Namespaced: true, Method: "Sometimes"}}, `unknown update method "Sometimes"`},
	}
	for _, c := range cases {
		_, err := Normalize(c.owner, c.rules, nil)
		var ve *ValidationError
		if err == nil || errors.As(err, &ve) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: got %v, want a plain error containing %q", c.reason, err, c.want)
		}
	}
}

func TestValidationErrorIsBounded(t *testing.T) {
	var in []*unstructured.Unstructured
	for i := range 25 {
		in = append(in, decode(t, fmt.Sprintf(`{"apiVersion":"v1","kind":"Secret","metadata":{"name":"s%d"}}`, i)))
	}
	_, err := Normalize(nsOwner(), testRules(""), in)
	var ve *ValidationError
	if !errors.As(err, &ve) || len(ve.Problems) != 50 { // undeclared kind + selector mismatch each
		t.Fatalf("got %v", err)
	}
	if msg := err.Error(); !strings.Contains(msg, "and 40 more") || strings.Count(msg, "[") > 12 {
		t.Errorf("message not bounded: %s", msg)
	}
}

func pointsInto(r *Rule, rules []Rule) bool {
	for i := range rules {
		if &rules[i] == r {
			return true
		}
	}
	return false
}
