package decorator

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"

	"github.com/metabus/metabus/pkg/api/v1alpha1"
)

func str(s string) *string { return &s }

// object builds a target; ns "" makes it cluster-scoped.
func object(apiVersion, kind, ns, name string, lbls, anns map[string]string) *unstructured.Unstructured {
	u := &unstructured.Unstructured{Object: map[string]any{}}
	u.SetAPIVersion(apiVersion)
	u.SetKind(kind)
	u.SetNamespace(ns)
	u.SetName(name)
	u.SetUID(types.UID("uid-" + name))
	u.SetResourceVersion("7")
	if lbls != nil {
		u.SetLabels(lbls)
	}
	if anns != nil {
		u.SetAnnotations(anns)
	}
	return u
}

func rule(apiVersion, resource, kind string, ls *metav1.LabelSelector, as *v1alpha1.AnnotationSelector) ResolvedRule {
	return ResolvedRule{
		DecoratorControllerResourceRule: v1alpha1.DecoratorControllerResourceRule{
			ResourceRule:       v1alpha1.ResourceRule{APIVersion: apiVersion, Resource: resource},
			LabelSelector:      ls,
			AnnotationSelector: as,
		},
		Kind: kind,
	}
}

func TestFinalizer(t *testing.T) {
	cases := []struct {
		reason, name, want string
	}{
		{reason: "upstream Metacontroller's finalizer name, so targets decorated by upstream keep working", name: "service-per-pod", want: "metacontroller.io/decoratorcontroller-service-per-pod"},
		{reason: "the name is appended verbatim", name: "a.b", want: "metacontroller.io/decoratorcontroller-a.b"},
	}
	for _, c := range cases {
		if got := Finalizer(c.name); got != c.want {
			t.Errorf("%s: Finalizer(%q) = %q, want %q", c.reason, c.name, got, c.want)
		}
	}
}

func TestSelector(t *testing.T) {
	stsAnn := &v1alpha1.AnnotationSelector{MatchExpressions: []metav1.LabelSelectorRequirement{
		{Key: "service-per-pod-label", Operator: metav1.LabelSelectorOpExists},
		{Key: "service-per-pod-ports", Operator: metav1.LabelSelectorOpExists},
	}}
	cases := []struct {
		reason string
		rules  []ResolvedRule
		obj    *unstructured.Unstructured
		want   bool
	}{
		{
			reason: "no selectors: every object of the kind is a target",
			rules:  []ResolvedRule{rule("v1", "pods", "Pod", nil, nil)},
			obj:    object("v1", "Pod", "ns", "p", nil, nil),
			want:   true,
		},
		{
			reason: "another kind is never a target, even with no selectors",
			rules:  []ResolvedRule{rule("v1", "pods", "Pod", nil, nil)},
			obj:    object("v1", "ConfigMap", "ns", "p", nil, nil),
			want:   false,
		},
		{
			reason: "the same kind in another group is another resource",
			rules:  []ResolvedRule{rule("v1", "pods", "Pod", nil, nil)},
			obj:    object("example.com/v1", "Pod", "ns", "p", nil, nil),
			want:   false,
		},
		{
			reason: "the version is ignored: the rule says apps/v1beta1, the object is read as apps/v1",
			rules:  []ResolvedRule{rule("apps/v1beta1", "statefulsets", "StatefulSet", nil, stsAnn)},
			obj:    object("apps/v1", "StatefulSet", "ns", "s", nil, map[string]string{"service-per-pod-label": "x", "service-per-pod-ports": "80:8080"}),
			want:   true,
		},
		{
			reason: "annotation Exists expressions: one of two annotations missing",
			rules:  []ResolvedRule{rule("apps/v1", "statefulsets", "StatefulSet", nil, stsAnn)},
			obj:    object("apps/v1", "StatefulSet", "ns", "s", nil, map[string]string{"service-per-pod-label": "x"}),
			want:   false,
		},
		{
			reason: "annotation values need not be valid label values (colons, commas)",
			rules: []ResolvedRule{rule("v1", "pods", "Pod", nil, &v1alpha1.AnnotationSelector{
				MatchAnnotations: map[string]string{"ports": "80:8080,443:8443"},
			})},
			obj:  object("v1", "Pod", "ns", "p", nil, map[string]string{"ports": "80:8080,443:8443"}),
			want: true,
		},
		{
			reason: "matchAnnotations: a different value does not match",
			rules: []ResolvedRule{rule("v1", "pods", "Pod", nil, &v1alpha1.AnnotationSelector{
				MatchAnnotations: map[string]string{"a": "1"},
			})},
			obj:  object("v1", "Pod", "ns", "p", nil, map[string]string{"a": "2"}),
			want: false,
		},
		{
			reason: "both selectors must match: labels match, annotations do not",
			rules: []ResolvedRule{rule("v1", "pods", "Pod",
				&metav1.LabelSelector{MatchLabels: map[string]string{"app": "x"}},
				&v1alpha1.AnnotationSelector{MatchAnnotations: map[string]string{"a": "1"}})},
			obj:  object("v1", "Pod", "ns", "p", map[string]string{"app": "x"}, nil),
			want: false,
		},
		{
			reason: "both selectors must match: annotations match, labels do not",
			rules: []ResolvedRule{rule("v1", "pods", "Pod",
				&metav1.LabelSelector{MatchLabels: map[string]string{"app": "x"}},
				&v1alpha1.AnnotationSelector{MatchAnnotations: map[string]string{"a": "1"}})},
			obj:  object("v1", "Pod", "ns", "p", map[string]string{"app": "y"}, map[string]string{"a": "1"}),
			want: false,
		},
		{
			reason: "both selectors match",
			rules: []ResolvedRule{rule("v1", "pods", "Pod",
				&metav1.LabelSelector{MatchLabels: map[string]string{"app": "x"}},
				&v1alpha1.AnnotationSelector{MatchAnnotations: map[string]string{"a": "1"}})},
			obj:  object("v1", "Pod", "ns", "p", map[string]string{"app": "x"}, map[string]string{"a": "1"}),
			want: true,
		},
		{
			reason: "empty selectors ({}) match everything, as absent ones do",
			rules:  []ResolvedRule{rule("v1", "pods", "Pod", &metav1.LabelSelector{}, &v1alpha1.AnnotationSelector{})},
			obj:    object("v1", "Pod", "ns", "p", nil, nil),
			want:   true,
		},
		{
			reason: "annotation NotIn holds when the key is absent, as for labels",
			rules: []ResolvedRule{rule("v1", "pods", "Pod", nil, &v1alpha1.AnnotationSelector{MatchExpressions: []metav1.LabelSelectorRequirement{
				{Key: "mode", Operator: metav1.LabelSelectorOpNotIn, Values: []string{"off"}},
			}})},
			obj:  object("v1", "Pod", "ns", "p", nil, nil),
			want: true,
		},
		{
			reason: "annotation NotIn fails on a listed value",
			rules: []ResolvedRule{rule("v1", "pods", "Pod", nil, &v1alpha1.AnnotationSelector{MatchExpressions: []metav1.LabelSelectorRequirement{
				{Key: "mode", Operator: metav1.LabelSelectorOpNotIn, Values: []string{"off"}},
			}})},
			obj:  object("v1", "Pod", "ns", "p", nil, map[string]string{"mode": "off"}),
			want: false,
		},
		{
			reason: "annotation In needs the key with a listed value",
			rules: []ResolvedRule{rule("v1", "pods", "Pod", nil, &v1alpha1.AnnotationSelector{MatchExpressions: []metav1.LabelSelectorRequirement{
				{Key: "mode", Operator: metav1.LabelSelectorOpIn, Values: []string{"on", "auto"}},
			}})},
			obj:  object("v1", "Pod", "ns", "p", nil, map[string]string{"mode": "auto"}),
			want: true,
		},
		{
			reason: "annotation DoesNotExist",
			rules: []ResolvedRule{rule("v1", "pods", "Pod", nil, &v1alpha1.AnnotationSelector{MatchExpressions: []metav1.LabelSelectorRequirement{
				{Key: "skip", Operator: metav1.LabelSelectorOpDoesNotExist},
			}})},
			obj:  object("v1", "Pod", "ns", "p", nil, map[string]string{"skip": ""}),
			want: false,
		},
		{
			reason: "several kinds per controller: a cluster-scoped ClusterRole rule next to a Pod rule",
			rules: []ResolvedRule{
				rule("v1", "pods", "Pod", &metav1.LabelSelector{MatchLabels: map[string]string{"x": "1"}}, nil),
				rule("rbac.authorization.k8s.io/v1", "clusterroles", "ClusterRole", &metav1.LabelSelector{MatchLabels: map[string]string{"y": "1"}}, nil),
			},
			obj:  object("rbac.authorization.k8s.io/v1", "ClusterRole", "", "cr", map[string]string{"y": "1"}, nil),
			want: true,
		},
		{
			reason: "two rules for one group and kind: matching either is enough",
			rules: []ResolvedRule{
				rule("apps/v1", "deployments", "Deployment", &metav1.LabelSelector{MatchLabels: map[string]string{"a": "1"}}, nil),
				rule("apps/v1beta2", "deployments", "Deployment", &metav1.LabelSelector{MatchLabels: map[string]string{"b": "1"}}, nil),
			},
			obj:  object("apps/v1", "Deployment", "ns", "d", map[string]string{"b": "1"}, nil),
			want: true,
		},
	}
	for _, c := range cases {
		s, err := NewSelector(c.rules)
		if err != nil {
			t.Errorf("%s: NewSelector: %v", c.reason, err)
			continue
		}
		if got := s.Matches(c.obj); got != c.want {
			t.Errorf("%s: Matches = %v, want %v", c.reason, got, c.want)
		}
	}
}

func TestSelectorErrors(t *testing.T) {
	cases := []struct {
		reason string
		rule   ResolvedRule
		want   string
	}{
		{
			reason: "a rule without a kind cannot be keyed",
			rule:   rule("v1", "pods", "", nil, nil),
			want:   "kind unknown",
		},
		{
			reason: "an invalid label selector operator fails the controller rather than selecting everything",
			rule: rule("v1", "pods", "Pod", &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{
				{Key: "a", Operator: "Maybe"},
			}}, nil),
			want: "labelSelector",
		},
		{
			reason: "an unknown annotation operator",
			rule: rule("v1", "pods", "Pod", nil, &v1alpha1.AnnotationSelector{MatchExpressions: []metav1.LabelSelectorRequirement{
				{Key: "a", Operator: "Maybe"},
			}}),
			want: "unknown operator",
		},
		{
			reason: "In without values could never match",
			rule: rule("v1", "pods", "Pod", nil, &v1alpha1.AnnotationSelector{MatchExpressions: []metav1.LabelSelectorRequirement{
				{Key: "a", Operator: metav1.LabelSelectorOpIn},
			}}),
			want: "needs values",
		},
		{
			reason: "Exists with values is a mistake worth reporting",
			rule: rule("v1", "pods", "Pod", nil, &v1alpha1.AnnotationSelector{MatchExpressions: []metav1.LabelSelectorRequirement{
				{Key: "a", Operator: metav1.LabelSelectorOpExists, Values: []string{"x"}},
			}}),
			want: "takes no values",
		},
		{
			reason: "an annotation key that no object can carry",
			rule:   rule("v1", "pods", "Pod", nil, &v1alpha1.AnnotationSelector{MatchAnnotations: map[string]string{"not a key": "x"}}),
			want:   "matchAnnotations key",
		},
	}
	for _, c := range cases {
		_, err := NewSelector([]ResolvedRule{c.rule})
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: error %v, want one containing %q", c.reason, err, c.want)
		}
	}
}

func TestSelected(t *testing.T) {
	spec := v1alpha1.DecoratorControllerSpec{Resources: []v1alpha1.DecoratorControllerResourceRule{
		{ResourceRule: v1alpha1.ResourceRule{APIVersion: "apps/v1", Resource: "statefulsets"},
			AnnotationSelector: &v1alpha1.AnnotationSelector{MatchAnnotations: map[string]string{"on": "yes"}}},
		{ResourceRule: v1alpha1.ResourceRule{APIVersion: "v1", Resource: "pods"},
			LabelSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"on": "yes"}}},
	}}
	cases := []struct {
		reason   string
		obj      *unstructured.Unstructured
		resource string
		want     bool
	}{
		{reason: "resolved from the target's own group and the work item's resource, without discovery", obj: object("apps/v1", "StatefulSet", "ns", "s", nil, map[string]string{"on": "yes"}), resource: "statefulsets", want: true},
		{reason: "opted out: the annotation was removed", obj: object("apps/v1", "StatefulSet", "ns", "s", nil, nil), resource: "statefulsets", want: false},
		{reason: "each kind has its own selector: a Pod needs the label, not the annotation", obj: object("v1", "Pod", "ns", "p", nil, map[string]string{"on": "yes"}), resource: "pods", want: false},
		{reason: "a resource the controller does not name is never selected", obj: object("apps/v1", "Deployment", "ns", "d", nil, map[string]string{"on": "yes"}), resource: "deployments", want: false},
	}
	for _, c := range cases {
		got, err := Selected(spec, c.obj, c.resource)
		if err != nil || got != c.want {
			t.Errorf("%s: Selected = %v, %v; want %v", c.reason, got, err, c.want)
		}
	}
}

func TestChooseHook(t *testing.T) {
	sync := &v1alpha1.Hook{Webhook: &v1alpha1.Webhook{URL: str("http://sync")}}
	fin := &v1alpha1.Hook{Webhook: &v1alpha1.Webhook{URL: str("http://finalize")}}
	dc := func(hooks *v1alpha1.DecoratorControllerHooks) *v1alpha1.DecoratorController {
		d := &v1alpha1.DecoratorController{Spec: v1alpha1.DecoratorControllerSpec{Hooks: hooks}}
		d.Name = "dc"
		return d
	}
	withFin := func(o *unstructured.Unstructured) *unstructured.Unstructured {
		o.SetFinalizers([]string{"other", Finalizer("dc")})
		return o
	}
	deleting := func(o *unstructured.Unstructured) *unstructured.Unstructured {
		now := metav1.Now()
		o.SetDeletionTimestamp(&now)
		return o
	}
	target := func() *unstructured.Unstructured { return object("v1", "Pod", "ns", "p", nil, nil) }
	cases := []struct {
		reason         string
		dc             *v1alpha1.DecoratorController
		target         *unstructured.Unstructured
		selected       bool
		wantHook       *v1alpha1.Hook
		wantKind       string
		wantFinalizing bool
	}{
		{reason: "a selected, live target gets sync", dc: dc(&v1alpha1.DecoratorControllerHooks{Sync: sync, Finalize: fin}), target: withFin(target()), selected: true, wantHook: sync, wantKind: HookSync},
		{reason: "a deleting target holding our finalizer gets finalize", dc: dc(&v1alpha1.DecoratorControllerHooks{Sync: sync, Finalize: fin}), target: deleting(withFin(target())), selected: true, wantHook: fin, wantKind: HookFinalize, wantFinalizing: true},
		{reason: "opt-out: a live target that stopped matching the selectors, still holding our finalizer, gets finalize", dc: dc(&v1alpha1.DecoratorControllerHooks{Sync: sync, Finalize: fin}), target: withFin(target()), selected: false, wantHook: fin, wantKind: HookFinalize, wantFinalizing: true},
		{reason: "opt-out without our finalizer: nothing was promised, nothing to call", dc: dc(&v1alpha1.DecoratorControllerHooks{Sync: sync, Finalize: fin}), target: target(), selected: false, wantFinalizing: true},
		{reason: "deleting without a finalize hook: the garbage collector takes the attachments", dc: dc(&v1alpha1.DecoratorControllerHooks{Sync: sync}), target: deleting(target()), selected: true, wantFinalizing: true},
		{reason: "no hooks at all: sync is chosen, and its absence is the caller's error to report", dc: dc(nil), target: target(), selected: true, wantKind: HookSync},
	}
	for _, c := range cases {
		hook, kind, finalizing := ChooseHook(c.dc, c.target, c.selected)
		if hook != c.wantHook || kind != c.wantKind || finalizing != c.wantFinalizing {
			t.Errorf("%s: got (%v, %q, %v), want (%v, %q, %v)", c.reason, hook, kind, finalizing, c.wantHook, c.wantKind, c.wantFinalizing)
		}
	}
}

func TestMapPatch(t *testing.T) {
	cases := []struct {
		reason  string
		current map[string]string
		desired map[string]*string
		want    map[string]any
	}{
		{reason: "nothing asked, nothing written", current: map[string]string{"a": "1"}, desired: nil, want: nil},
		{reason: "the same value is not rewritten", current: map[string]string{"a": "1"}, desired: map[string]*string{"a": str("1")}, want: nil},
		{reason: "a new key and a changed value", current: map[string]string{"a": "1"}, desired: map[string]*string{"a": str("2"), "b": str("x")}, want: map[string]any{"a": "2", "b": "x"}},
		{reason: "null deletes a present key", current: map[string]string{"a": "1", "keep": "k"}, desired: map[string]*string{"a": nil}, want: map[string]any{"a": nil}},
		{reason: "null on an absent key is a no-op, not a write", current: nil, desired: map[string]*string{"a": nil}, want: nil},
		{reason: "an empty string is a value, not a deletion", current: nil, desired: map[string]*string{"a": str("")}, want: map[string]any{"a": ""}},
	}
	for _, c := range cases {
		got := MapPatch(c.current, c.desired)
		if !reflect.DeepEqual(got, c.want) {
			t.Errorf("%s: MapPatch = %#v, want %#v", c.reason, got, c.want)
		}
		applied := ApplyMap(c.current, c.desired)
		for k, v := range c.desired {
			if got, ok := applied[k]; (v == nil) == ok || (v != nil && got != *v) {
				t.Errorf("%s: ApplyMap[%q] = %q (present %v)", c.reason, k, got, ok)
			}
		}
	}
}

func TestPlanTarget(t *testing.T) {
	base := func() *unstructured.Unstructured {
		o := object("example.com/v1", "Thing", "ns", "t", map[string]string{"a": "1"}, map[string]string{"n": "1"})
		o.SetFinalizers([]string{"someone-else"})
		o.Object["spec"] = map[string]any{"replicas": int64(3)}
		o.Object["status"] = map[string]any{"ready": int64(2), "phase": "Up"}
		return o
	}
	fin := Finalizer("dc")
	cases := []struct {
		reason    string
		target    *unstructured.Unstructured
		ch        Changes
		subres    bool
		wantPatch string // JSON, "" for none
		wantStat  string // JSON, "" for none
	}{
		{
			reason: "a no-op sync writes nothing (no API call at all)",
			target: base(),
			ch:     Changes{Labels: map[string]*string{"a": str("1")}, Annotations: map[string]*string{"gone": nil}, Status: map[string]any{"phase": "Up", "ready": float64(2)}, StatusSet: true},
			subres: true,
		},
		{
			reason: "status null (not set) leaves a different status alone",
			target: base(),
			ch:     Changes{StatusSet: false},
			subres: true,
		},
		{
			reason:    "labels and annotations in one patch with the observed resourceVersion; the spec is never part of it",
			target:    base(),
			ch:        Changes{Labels: map[string]*string{"a": nil, "b": str("2")}, Annotations: map[string]*string{"n": str("2")}},
			wantPatch: `{"metadata":{"annotations":{"n":"2"},"labels":{"a":null,"b":"2"},"resourceVersion":"7"}}`,
		},
		{
			reason:    "the finalizer is added next to others' finalizers, guarded by the resourceVersion",
			target:    base(),
			ch:        Changes{AddFinalizer: fin},
			wantPatch: `{"metadata":{"finalizers":["someone-else","metacontroller.io/decoratorcontroller-dc"],"resourceVersion":"7"}}`,
		},
		{
			reason: "a finalizer already present is not re-added",
			target: func() *unstructured.Unstructured { o := base(); o.SetFinalizers([]string{fin}); return o }(),
			ch:     Changes{AddFinalizer: fin},
		},
		{
			reason:   "with a status subresource the new status goes there, replacing the whole status",
			target:   base(),
			ch:       Changes{Status: map[string]any{"phase": "Down"}, StatusSet: true},
			subres:   true,
			wantStat: `{"phase":"Down"}`,
		},
		{
			reason:    "without a status subresource the status is replaced through the main resource by a merge diff (removed keys nulled)",
			target:    base(),
			ch:        Changes{Status: map[string]any{"phase": "Down", "extra": map[string]any{"x": "1"}}, StatusSet: true},
			wantPatch: `{"metadata":{"resourceVersion":"7"},"status":{"extra":{"x":"1"},"phase":"Down","ready":null}}`,
		},
		{
			reason:   "an empty status object replaces a non-empty one",
			target:   base(),
			ch:       Changes{Status: map[string]any{}, StatusSet: true},
			subres:   true,
			wantStat: `{}`,
		},
		{
			reason: "an empty status over no status is no change",
			target: func() *unstructured.Unstructured { o := base(); delete(o.Object, "status"); return o }(),
			ch:     Changes{Status: map[string]any{}, StatusSet: true},
			subres: true,
		},
	}
	for _, c := range cases {
		u, err := PlanTarget(c.target, c.ch, c.subres)
		if err != nil {
			t.Errorf("%s: %v", c.reason, err)
			continue
		}
		if got := toJSON(t, u.Patch); got != orNull(c.wantPatch) {
			t.Errorf("%s: patch\n got %s\nwant %s", c.reason, got, orNull(c.wantPatch))
		}
		if got := toJSON(t, u.Status); got != orNull(c.wantStat) {
			t.Errorf("%s: status\n got %s\nwant %s", c.reason, got, orNull(c.wantStat))
		}
		if u.IsZero() != (c.wantPatch == "" && c.wantStat == "") {
			t.Errorf("%s: IsZero = %v", c.reason, u.IsZero())
		}
	}
}

func TestMergeDiff(t *testing.T) {
	cases := []struct {
		reason           string
		current, desired any
		want             string
		changed          bool
	}{
		{reason: "equal objects need no patch", current: map[string]any{"a": int64(1)}, desired: map[string]any{"a": float64(1)}, want: "null"},
		{reason: "nested objects are diffed, not replaced", current: map[string]any{"o": map[string]any{"x": "1", "y": "2"}}, desired: map[string]any{"o": map[string]any{"x": "1"}}, want: `{"o":{"y":null}}`, changed: true},
		{reason: "lists are replaced whole", current: map[string]any{"l": []any{"a", "b"}}, desired: map[string]any{"l": []any{"a"}}, want: `{"l":["a"]}`, changed: true},
		{reason: "a scalar becoming an object takes the object", current: map[string]any{"v": "s"}, desired: map[string]any{"v": map[string]any{"k": "1"}}, want: `{"v":{"k":"1"}}`, changed: true},
		{reason: "no current status: the desired one is the patch", current: nil, desired: map[string]any{"a": "1"}, want: `{"a":"1"}`, changed: true},
	}
	for _, c := range cases {
		p, changed := mergeDiff(c.current, c.desired)
		if got := toJSON(t, p); got != c.want || changed != c.changed {
			t.Errorf("%s: mergeDiff = %s, %v; want %s, %v", c.reason, got, changed, c.want, c.changed)
		}
	}
}

func TestIsAttachmentAndDecode(t *testing.T) {
	a := object("v1", "Service", "ns", "s", nil, map[string]string{ControllerAnnotation: "dc"})
	cases := []struct {
		reason string
		obj    *unstructured.Unstructured
		name   string
		want   bool
	}{
		{reason: "marked by this controller", obj: a, name: "dc", want: true},
		{reason: "marked by another decorator on the same target: not ours", obj: a, name: "other", want: false},
		{reason: "no annotation: owned by the target maybe, but not an attachment", obj: object("v1", "Service", "ns", "s", nil, nil), name: "dc", want: false},
	}
	for _, c := range cases {
		if got := IsAttachment(c.obj, c.name); got != c.want {
			t.Errorf("%s: IsAttachment = %v, want %v", c.reason, got, c.want)
		}
	}
	obj := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "metacontroller.k8s.io/v1alpha1", "kind": "DecoratorController",
		"metadata": map[string]any{"name": "dc"},
		"spec": map[string]any{
			"resources":   []any{map[string]any{"apiVersion": "v1", "resource": "pods"}},
			"attachments": []any{map[string]any{"apiVersion": "v1", "resource": "services", "updateStrategy": map[string]any{"method": "InPlace"}}},
			"hooks":       map[string]any{"finalize": map[string]any{"webhook": map[string]any{"url": "http://f"}}},
		},
	}}
	dc, err := Decode(obj)
	if err != nil {
		t.Fatal(err)
	}
	if dc.Spec.Attachments[0].UpdateStrategy.Method != v1alpha1.ChildUpdateInPlace || ControllerFinalizer(dc) != Finalizer("dc") {
		t.Errorf("decoded %+v, finalizer %q", dc.Spec, ControllerFinalizer(dc))
	}
	if _, err := Decode(nil); err == nil {
		t.Error("Decode(nil) should fail")
	}
}

func toJSON(t *testing.T, v any) string {
	t.Helper()
	if m, ok := v.(map[string]any); ok && m == nil {
		return "null"
	}
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func orNull(s string) string {
	if s == "" {
		return "null"
	}
	return s
}
