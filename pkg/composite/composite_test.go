package composite

import (
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/metabus/metabus/pkg/api/v1alpha1"
)

func boolPtr(b bool) *bool { return &b }

// parent builds a namespaced parent object; spec may be nil.
func parent(ns, name, uid string, lbls map[string]string, spec map[string]any) *unstructured.Unstructured {
	obj := map[string]any{
		"apiVersion": "example.com/v1",
		"kind":       "Thing",
		"metadata": map[string]any{
			"name": name,
			"uid":  uid,
		},
	}
	if ns != "" {
		obj["metadata"].(map[string]any)["namespace"] = ns
	}
	if spec != nil {
		obj["spec"] = spec
	}
	u := &unstructured.Unstructured{Object: obj}
	if lbls != nil {
		u.SetLabels(lbls)
	}
	return u
}

func TestFinalizer(t *testing.T) {
	cases := []struct {
		reason string
		name   string
		want   string
	}{
		{reason: "upstream Metacontroller's finalizer name, so existing parents keep working", name: "hello-controller", want: "metacontroller.io/compositecontroller-hello-controller"},
		{reason: "the controller name is appended verbatim", name: "a.b-c", want: "metacontroller.io/compositecontroller-a.b-c"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := Finalizer(tc.name); got != tc.want {
				t.Errorf("%s: Finalizer(%q) = %q, want %q", tc.reason, tc.name, got, tc.want)
			}
		})
	}
}

func TestParentSelector(t *testing.T) {
	cases := []struct {
		reason  string
		spec    v1alpha1.CompositeControllerSpec
		parent  *unstructured.Unstructured
		wantErr string // substring; "" means success
		// matches and rejects are label sets the selector must (not) match.
		matches []labels.Set
		rejects []labels.Set
	}{
		{
			reason:  "generateSelector selects children by controller-uid=<parent uid>",
			spec:    v1alpha1.CompositeControllerSpec{GenerateSelector: boolPtr(true)},
			parent:  parent("ns", "p", "uid-1", nil, nil),
			matches: []labels.Set{{"controller-uid": "uid-1"}, {"controller-uid": "uid-1", "other": "x"}},
			rejects: []labels.Set{{"controller-uid": "uid-2"}, {}, {"app": "x"}},
		},
		{
			reason:  "generateSelector ignores a spec.selector the parent may also have",
			spec:    v1alpha1.CompositeControllerSpec{GenerateSelector: boolPtr(true)},
			parent:  parent("ns", "p", "uid-1", nil, map[string]any{"selector": map[string]any{"matchLabels": map[string]any{"app": "x"}}}),
			matches: []labels.Set{{"controller-uid": "uid-1"}},
			rejects: []labels.Set{{"app": "x"}},
		},
		{
			reason:  "matchLabels of spec.selector",
			spec:    v1alpha1.CompositeControllerSpec{},
			parent:  parent("ns", "p", "uid-1", nil, map[string]any{"selector": map[string]any{"matchLabels": map[string]any{"app": "x"}}}),
			matches: []labels.Set{{"app": "x"}, {"app": "x", "tier": "web"}},
			rejects: []labels.Set{{"app": "y"}, {}, {"controller-uid": "uid-1"}},
		},
		{
			reason: "generateSelector: false behaves like unset",
			spec:   v1alpha1.CompositeControllerSpec{GenerateSelector: boolPtr(false)},
			parent: parent("ns", "p", "uid-1", nil, map[string]any{"selector": map[string]any{
				"matchLabels": map[string]any{"app": "x"},
			}}),
			matches: []labels.Set{{"app": "x"}},
			rejects: []labels.Set{{"controller-uid": "uid-1"}},
		},
		{
			reason: "matchExpressions and matchLabels are ANDed",
			spec:   v1alpha1.CompositeControllerSpec{},
			parent: parent("ns", "p", "uid-1", nil, map[string]any{"selector": map[string]any{
				"matchLabels": map[string]any{"app": "x"},
				"matchExpressions": []any{
					map[string]any{"key": "tier", "operator": "In", "values": []any{"web", "db"}},
				},
			}}),
			matches: []labels.Set{{"app": "x", "tier": "web"}, {"app": "x", "tier": "db"}},
			rejects: []labels.Set{{"app": "x"}, {"app": "x", "tier": "cache"}, {"tier": "web"}},
		},
		{
			reason: "matchExpressions alone are a valid, non-empty selector",
			spec:   v1alpha1.CompositeControllerSpec{},
			parent: parent("ns", "p", "uid-1", nil, map[string]any{"selector": map[string]any{
				"matchExpressions": []any{map[string]any{"key": "app", "operator": "Exists"}},
			}}),
			matches: []labels.Set{{"app": "anything"}},
			rejects: []labels.Set{{"other": "x"}},
		},
		{
			reason:  "no spec.selector and no generateSelector is an error naming the parent",
			spec:    v1alpha1.CompositeControllerSpec{},
			parent:  parent("ns", "p", "uid-1", nil, map[string]any{"replicas": int64(1)}),
			wantErr: "parent ns/p has no spec.selector",
		},
		{
			reason:  "no spec at all",
			spec:    v1alpha1.CompositeControllerSpec{},
			parent:  parent("", "cluster-p", "uid-1", nil, nil),
			wantErr: "parent cluster-p has no spec.selector",
		},
		{
			reason:  "a null spec.selector counts as missing",
			spec:    v1alpha1.CompositeControllerSpec{},
			parent:  parent("ns", "p", "uid-1", nil, map[string]any{"selector": nil}),
			wantErr: "has no spec.selector",
		},
		{
			reason:  "spec that is not an object cannot hold a selector",
			spec:    v1alpha1.CompositeControllerSpec{},
			parent:  &unstructured.Unstructured{Object: map[string]any{"metadata": map[string]any{"name": "p", "namespace": "ns"}, "spec": "oops"}},
			wantErr: "has no spec.selector",
		},
		{
			reason:  "an empty selector would claim every object in the namespace",
			spec:    v1alpha1.CompositeControllerSpec{},
			parent:  parent("ns", "p", "uid-1", nil, map[string]any{"selector": map[string]any{}}),
			wantErr: "spec.selector of ns/p is empty",
		},
		{
			reason:  "empty matchLabels and matchExpressions are still empty",
			spec:    v1alpha1.CompositeControllerSpec{},
			parent:  parent("ns", "p", "uid-1", nil, map[string]any{"selector": map[string]any{"matchLabels": map[string]any{}, "matchExpressions": []any{}}}),
			wantErr: "is empty",
		},
		{
			reason:  "a selector that is not a label selector is rejected",
			spec:    v1alpha1.CompositeControllerSpec{},
			parent:  parent("ns", "p", "uid-1", nil, map[string]any{"selector": "app=x"}),
			wantErr: "spec.selector of ns/p is not a label selector",
		},
		{
			reason:  "matchLabels values must be strings",
			spec:    v1alpha1.CompositeControllerSpec{},
			parent:  parent("ns", "p", "uid-1", nil, map[string]any{"selector": map[string]any{"matchLabels": map[string]any{"app": int64(3)}}}),
			wantErr: "is not a label selector",
		},
		{
			reason: "an unknown operator does not parse",
			spec:   v1alpha1.CompositeControllerSpec{},
			parent: parent("ns", "p", "uid-1", nil, map[string]any{"selector": map[string]any{
				"matchExpressions": []any{map[string]any{"key": "app", "operator": "Bogus", "values": []any{"x"}}},
			}}),
			wantErr: "spec.selector of ns/p:",
		},
		{
			reason:  "an invalid label value does not parse",
			spec:    v1alpha1.CompositeControllerSpec{},
			parent:  parent("ns", "p", "uid-1", nil, map[string]any{"selector": map[string]any{"matchLabels": map[string]any{"app": "not a valid value!"}}}),
			wantErr: "spec.selector of ns/p:",
		},
	}
	for _, tc := range cases {
		t.Run(tc.reason, func(t *testing.T) {
			sel, err := ParentSelector(tc.spec, tc.parent)
			if tc.wantErr != "" {
				if err == nil {
					t.Fatalf("%s: want error containing %q, got selector %v", tc.reason, tc.wantErr, sel)
				}
				if !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("%s: error %q does not contain %q", tc.reason, err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("%s: unexpected error: %v", tc.reason, err)
			}
			if sel.Empty() {
				t.Fatalf("%s: selector %q is empty", tc.reason, sel)
			}
			for _, s := range tc.matches {
				if !sel.Matches(s) {
					t.Errorf("%s: selector %q does not match %v", tc.reason, sel, s)
				}
			}
			for _, s := range tc.rejects {
				if sel.Matches(s) {
					t.Errorf("%s: selector %q matches %v", tc.reason, sel, s)
				}
			}
		})
	}
}

func TestExtraLabels(t *testing.T) {
	cases := []struct {
		reason string
		spec   v1alpha1.CompositeControllerSpec
		want   map[string]string
	}{
		{reason: "generateSelector labels children with the parent's UID", spec: v1alpha1.CompositeControllerSpec{GenerateSelector: boolPtr(true)}, want: map[string]string{"controller-uid": "uid-7"}},
		{reason: "without generateSelector nothing is added", spec: v1alpha1.CompositeControllerSpec{}, want: nil},
		{reason: "generateSelector: false adds nothing either", spec: v1alpha1.CompositeControllerSpec{GenerateSelector: boolPtr(false)}, want: nil},
	}
	for _, tc := range cases {
		t.Run(tc.reason, func(t *testing.T) {
			p := parent("ns", "p", "uid-7", nil, nil)
			got := ExtraLabels(tc.spec, p)
			if len(got) != len(tc.want) {
				t.Fatalf("%s: ExtraLabels = %v, want %v", tc.reason, got, tc.want)
			}
			for k, v := range tc.want {
				if got[k] != v {
					t.Errorf("%s: ExtraLabels[%q] = %q, want %q", tc.reason, k, got[k], v)
				}
			}
			if tc.want != nil {
				// The added labels must be what ParentSelector selects on, or
				// generated children would never be claimed.
				sel, err := ParentSelector(tc.spec, p)
				if err != nil {
					t.Fatal(err)
				}
				if !sel.Matches(labels.Set(got)) {
					t.Errorf("%s: ParentSelector %q does not match ExtraLabels %v", tc.reason, sel, got)
				}
			}
		})
	}
}

func TestGeneratesSelector(t *testing.T) {
	cases := []struct {
		reason string
		v      *bool
		want   bool
	}{
		{reason: "unset", v: nil, want: false},
		{reason: "false", v: boolPtr(false), want: false},
		{reason: "true", v: boolPtr(true), want: true},
	}
	for _, tc := range cases {
		t.Run(tc.reason, func(t *testing.T) {
			if got := GeneratesSelector(v1alpha1.CompositeControllerSpec{GenerateSelector: tc.v}); got != tc.want {
				t.Errorf("%s: GeneratesSelector = %v, want %v", tc.reason, got, tc.want)
			}
		})
	}
}

func specWithParentSelector(ls *metav1.LabelSelector) v1alpha1.CompositeControllerSpec {
	var s v1alpha1.CompositeControllerSpec
	s.ParentResource.APIVersion = "example.com/v1"
	s.ParentResource.Resource = "things"
	s.ParentResource.LabelSelector = ls
	return s
}

func TestDeselected(t *testing.T) {
	cases := []struct {
		reason string
		ls     *metav1.LabelSelector
		labels map[string]string
		want   bool
	}{
		{reason: "no parent label selector: every parent is selected", ls: nil, labels: nil, want: false},
		{reason: "matching labels are selected", ls: &metav1.LabelSelector{MatchLabels: map[string]string{"managed": "yes"}}, labels: map[string]string{"managed": "yes", "x": "y"}, want: false},
		{reason: "a parent that lost its label is deselected", ls: &metav1.LabelSelector{MatchLabels: map[string]string{"managed": "yes"}}, labels: map[string]string{"x": "y"}, want: true},
		{reason: "a parent without labels is deselected", ls: &metav1.LabelSelector{MatchLabels: map[string]string{"managed": "yes"}}, labels: nil, want: true},
		{reason: "a changed label value deselects", ls: &metav1.LabelSelector{MatchLabels: map[string]string{"managed": "yes"}}, labels: map[string]string{"managed": "no"}, want: true},
		{
			reason: "matchExpressions are honoured",
			ls:     &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "paused", Operator: metav1.LabelSelectorOpDoesNotExist}}},
			labels: map[string]string{"paused": "true"},
			want:   true,
		},
		{
			reason: "matchExpressions are honoured (match)",
			ls:     &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "paused", Operator: metav1.LabelSelectorOpDoesNotExist}}},
			labels: map[string]string{"app": "x"},
			want:   false,
		},
		{reason: "an empty selector selects everything", ls: &metav1.LabelSelector{}, labels: nil, want: false},
		{
			reason: "an invalid selector never deselects (it cannot be evaluated, finalizing on it would be destructive)",
			ls:     &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "a", Operator: "Bogus"}}},
			labels: nil,
			want:   false,
		},
	}
	for _, tc := range cases {
		t.Run(tc.reason, func(t *testing.T) {
			got := Deselected(specWithParentSelector(tc.ls), parent("ns", "p", "u", tc.labels, nil))
			if got != tc.want {
				t.Errorf("%s: Deselected = %v, want %v", tc.reason, got, tc.want)
			}
		})
	}
}

func TestChooseHook(t *testing.T) {
	syncHook := &v1alpha1.Hook{}
	finalizeHook := &v1alpha1.Hook{}
	both := &v1alpha1.CompositeControllerHooks{Sync: syncHook, Finalize: finalizeHook}
	syncOnly := &v1alpha1.CompositeControllerHooks{Sync: syncHook}
	sel := &metav1.LabelSelector{MatchLabels: map[string]string{"managed": "yes"}}

	deleting := func(lbls map[string]string) *unstructured.Unstructured {
		p := parent("ns", "p", "u", lbls, nil)
		now := metav1.Now()
		p.SetDeletionTimestamp(&now)
		return p
	}

	cases := []struct {
		reason         string
		hooks          *v1alpha1.CompositeControllerHooks
		parentSelector *metav1.LabelSelector
		parent         *unstructured.Unstructured
		wantHook       *v1alpha1.Hook
		wantKind       string
		wantFinalizing bool
	}{
		{reason: "a live parent gets the sync hook", hooks: both, parent: parent("ns", "p", "u", nil, nil), wantHook: syncHook, wantKind: "sync"},
		{reason: "a parent being deleted gets the finalize hook", hooks: both, parent: deleting(nil), wantHook: finalizeHook, wantKind: "finalize", wantFinalizing: true},
		{reason: "a parent being deleted without a finalize hook: nothing to call, but finalizing", hooks: syncOnly, parent: deleting(nil), wantHook: nil, wantKind: "", wantFinalizing: true},
		{reason: "a deselected parent is finalized", hooks: both, parentSelector: sel, parent: parent("ns", "p", "u", map[string]string{"managed": "no"}, nil), wantHook: finalizeHook, wantKind: "finalize", wantFinalizing: true},
		{reason: "a deselected parent without a finalize hook", hooks: syncOnly, parentSelector: sel, parent: parent("ns", "p", "u", nil, nil), wantHook: nil, wantKind: "", wantFinalizing: true},
		{reason: "a selected parent is synced", hooks: both, parentSelector: sel, parent: parent("ns", "p", "u", map[string]string{"managed": "yes"}, nil), wantHook: syncHook, wantKind: "sync"},
		{reason: "a selected parent being deleted is finalized", hooks: both, parentSelector: sel, parent: deleting(map[string]string{"managed": "yes"}), wantHook: finalizeHook, wantKind: "finalize", wantFinalizing: true},
		{reason: "no hooks at all: sync with a nil hook", hooks: nil, parent: parent("ns", "p", "u", nil, nil), wantHook: nil, wantKind: "sync"},
		{reason: "no hooks at all while deleting", hooks: nil, parent: deleting(nil), wantHook: nil, wantKind: "", wantFinalizing: true},
	}
	for _, tc := range cases {
		t.Run(tc.reason, func(t *testing.T) {
			cc := &v1alpha1.CompositeController{Spec: specWithParentSelector(tc.parentSelector)}
			cc.Spec.Hooks = tc.hooks
			hook, kind, finalizing := ChooseHook(cc, tc.parent)
			if hook != tc.wantHook {
				t.Errorf("%s: hook = %p, want %p (sync %p, finalize %p)", tc.reason, hook, tc.wantHook, syncHook, finalizeHook)
			}
			if kind != tc.wantKind {
				t.Errorf("%s: kind = %q, want %q", tc.reason, kind, tc.wantKind)
			}
			if finalizing != tc.wantFinalizing {
				t.Errorf("%s: finalizing = %v, want %v", tc.reason, finalizing, tc.wantFinalizing)
			}
		})
	}
}

func TestDecode(t *testing.T) {
	cases := []struct {
		reason  string
		obj     *unstructured.Unstructured
		wantErr string
		check   func(t *testing.T, cc *v1alpha1.CompositeController)
	}{
		{
			reason:  "nil object",
			obj:     nil,
			wantErr: "no CompositeController object",
		},
		{
			reason: "a full upstream manifest decodes",
			obj: &unstructured.Unstructured{Object: map[string]any{
				"apiVersion": "metacontroller.k8s.io/v1alpha1",
				"kind":       "CompositeController",
				"metadata":   map[string]any{"name": "hello", "uid": "cc-uid", "generation": int64(3)},
				"spec": map[string]any{
					"generateSelector": true,
					"parentResource": map[string]any{
						"apiVersion":    "example.com/v1",
						"resource":      "helloworlds",
						"labelSelector": map[string]any{"matchLabels": map[string]any{"managed": "yes"}},
					},
					"childResources": []any{
						map[string]any{"apiVersion": "v1", "resource": "pods"},
					},
					"hooks": map[string]any{
						"sync":     map[string]any{"webhook": map[string]any{"url": "http://hook/sync"}},
						"finalize": map[string]any{"webhook": map[string]any{"url": "http://hook/finalize"}},
					},
					"resyncPeriodSeconds": int64(10),
				},
			}},
			check: func(t *testing.T, cc *v1alpha1.CompositeController) {
				if cc.Name != "hello" || cc.UID != "cc-uid" || cc.Generation != 3 {
					t.Errorf("metadata = %+v", cc.ObjectMeta)
				}
				if cc.Kind != "CompositeController" || cc.APIVersion != "metacontroller.k8s.io/v1alpha1" {
					t.Errorf("type meta = %+v", cc.TypeMeta)
				}
				if !GeneratesSelector(cc.Spec) {
					t.Error("generateSelector lost")
				}
				pr := cc.Spec.ParentResource
				if pr.APIVersion != "example.com/v1" || pr.Resource != "helloworlds" {
					t.Errorf("parentResource = %+v", pr)
				}
				if pr.LabelSelector == nil || pr.LabelSelector.MatchLabels["managed"] != "yes" {
					t.Errorf("parentResource.labelSelector = %+v", pr.LabelSelector)
				}
				if len(cc.Spec.ChildResources) != 1 || cc.Spec.ChildResources[0].Resource != "pods" || cc.Spec.ChildResources[0].APIVersion != "v1" {
					t.Errorf("childResources = %+v", cc.Spec.ChildResources)
				}
				hs := cc.Spec.Hooks
				if hs == nil || hs.Sync == nil || hs.Sync.Webhook == nil || hs.Sync.Webhook.URL == nil || *hs.Sync.Webhook.URL != "http://hook/sync" {
					t.Fatalf("sync hook = %+v", hs)
				}
				if hs.Finalize == nil || hs.Finalize.Webhook == nil || hs.Finalize.Webhook.URL == nil || *hs.Finalize.Webhook.URL != "http://hook/finalize" {
					t.Errorf("finalize hook = %+v", hs.Finalize)
				}
				if cc.Spec.ResyncPeriodSeconds == nil || *cc.Spec.ResyncPeriodSeconds != 10 {
					t.Errorf("resyncPeriodSeconds = %v", cc.Spec.ResyncPeriodSeconds)
				}
			},
		},
		{
			reason: "a minimal object decodes to zero values",
			obj:    &unstructured.Unstructured{Object: map[string]any{"metadata": map[string]any{"name": "min"}}},
			check: func(t *testing.T, cc *v1alpha1.CompositeController) {
				if cc.Name != "min" || cc.Spec.Hooks != nil || GeneratesSelector(cc.Spec) || len(cc.Spec.ChildResources) != 0 {
					t.Errorf("decoded %+v", cc)
				}
			},
		},
		{
			reason:  "a wrongly typed field is an error naming the controller",
			obj:     &unstructured.Unstructured{Object: map[string]any{"metadata": map[string]any{"name": "bad"}, "spec": map[string]any{"generateSelector": "yes"}}},
			wantErr: "decode CompositeController bad",
		},
		{
			reason:  "a spec that is not an object is an error",
			obj:     &unstructured.Unstructured{Object: map[string]any{"metadata": map[string]any{"name": "bad2"}, "spec": []any{"x"}}},
			wantErr: "decode CompositeController bad2",
		},
		{
			reason:  "a value JSON cannot encode is an error",
			obj:     &unstructured.Unstructured{Object: map[string]any{"metadata": map[string]any{"name": "bad3"}, "spec": map[string]any{"x": make(chan int)}}},
			wantErr: "encode controller",
		},
	}
	for _, tc := range cases {
		t.Run(tc.reason, func(t *testing.T) {
			cc, err := Decode(tc.obj)
			if tc.wantErr != "" {
				if err == nil {
					t.Fatalf("%s: want error containing %q, got %+v", tc.reason, tc.wantErr, cc)
				}
				if !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("%s: error %q does not contain %q", tc.reason, err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("%s: %v", tc.reason, err)
			}
			tc.check(t, cc)
		})
	}
}

func withFinalizers(deleting bool, fs ...string) *unstructured.Unstructured {
	p := parent("ns", "p", "u", nil, nil)
	p.SetFinalizers(fs)
	if deleting {
		now := metav1.Now()
		p.SetDeletionTimestamp(&now)
	}
	return p
}

func TestHasFinalizer(t *testing.T) {
	mine := Finalizer("c")
	cases := []struct {
		reason string
		obj    *unstructured.Unstructured
		f      string
		want   bool
	}{
		{reason: "present", obj: withFinalizers(false, "a", mine), f: mine, want: true},
		{reason: "absent", obj: withFinalizers(false, "a"), f: mine, want: false},
		{reason: "no finalizers", obj: withFinalizers(false), f: mine, want: false},
		{reason: "another controller's finalizer does not count", obj: withFinalizers(false, Finalizer("other")), f: mine, want: false},
		{reason: "exact match only", obj: withFinalizers(false, mine+"-x"), f: mine, want: false},
		{reason: "the empty finalizer (no finalize hook) is never present", obj: withFinalizers(false, ""), f: "", want: false},
	}
	for _, tc := range cases {
		t.Run(tc.reason, func(t *testing.T) {
			if got := HasFinalizer(tc.obj, tc.f); got != tc.want {
				t.Errorf("%s: HasFinalizer(%v, %q) = %v, want %v", tc.reason, tc.obj.GetFinalizers(), tc.f, got, tc.want)
			}
		})
	}
}

func TestControllerFinalizer(t *testing.T) {
	cases := []struct {
		reason string
		hooks  *v1alpha1.CompositeControllerHooks
		want   string
	}{
		{reason: "a finalize hook: the upstream finalizer name", hooks: &v1alpha1.CompositeControllerHooks{Sync: &v1alpha1.Hook{}, Finalize: &v1alpha1.Hook{}}, want: "metacontroller.io/compositecontroller-ctrl"},
		{reason: "no finalize hook: no finalizer", hooks: &v1alpha1.CompositeControllerHooks{Sync: &v1alpha1.Hook{}}, want: ""},
		{reason: "no hooks at all", hooks: nil, want: ""},
	}
	for _, tc := range cases {
		t.Run(tc.reason, func(t *testing.T) {
			cc := &v1alpha1.CompositeController{}
			cc.Name = "ctrl"
			cc.Spec.Hooks = tc.hooks
			if got := ControllerFinalizer(cc); got != tc.want {
				t.Errorf("%s: ControllerFinalizer = %q, want %q", tc.reason, got, tc.want)
			}
		})
	}
}

func TestWaitingForGC(t *testing.T) {
	cases := []struct {
		reason string
		obj    *unstructured.Unstructured
		want   bool
	}{
		{reason: "deleting with foregroundDeletion", obj: withFinalizers(true, metav1.FinalizerDeleteDependents), want: true},
		{reason: "deleting with orphan", obj: withFinalizers(true, "x", metav1.FinalizerOrphanDependents), want: true},
		{reason: "deleting with only the controller's finalizer", obj: withFinalizers(true, Finalizer("c")), want: false},
		{reason: "deleting without finalizers", obj: withFinalizers(true), want: false},
		{reason: "not deleting: GC finalizers do not matter", obj: withFinalizers(false, metav1.FinalizerDeleteDependents), want: false},
	}
	for _, tc := range cases {
		t.Run(tc.reason, func(t *testing.T) {
			if got := WaitingForGC(tc.obj); got != tc.want {
				t.Errorf("%s: WaitingForGC = %v, want %v", tc.reason, got, tc.want)
			}
		})
	}
}
