package decorator

import (
	"fmt"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"

	"github.com/metabus/metabus/pkg/api/v1alpha1"
	"github.com/metabus/metabus/pkg/apiresource"
	"github.com/metabus/metabus/pkg/kinds"
)

// watchResources is the fake discovery of the watch tests.
var watchResources = map[string]*apiresource.Resource{
	"apps/v1/deployments":      {GVR: schema.GroupVersionResource{Group: "apps", Version: "v1", Resource: "deployments"}, Kind: "Deployment", Namespaced: true, HasStatus: true},
	"apps/v1beta1/deployments": {GVR: schema.GroupVersionResource{Group: "apps", Version: "v1beta1", Resource: "deployments"}, Kind: "Deployment", Namespaced: true, HasStatus: true},
	"v1/namespaces":            {GVR: schema.GroupVersionResource{Version: "v1", Resource: "namespaces"}, Kind: "Namespace", HasStatus: true},
	"v1/configmaps":            {GVR: schema.GroupVersionResource{Version: "v1", Resource: "configmaps"}, Kind: "ConfigMap", Namespaced: true},
	"v1/secrets":               {GVR: schema.GroupVersionResource{Version: "v1", Resource: "secrets"}, Kind: "Secret", Namespaced: true},
	"autoscaling/v1/hpas":      {GVR: schema.GroupVersionResource{Group: "autoscaling", Version: "v1", Resource: "hpas"}, Kind: "HorizontalPodAutoscaler", Namespaced: true},
	"autoscaling/v2/hpas":      {GVR: schema.GroupVersionResource{Group: "autoscaling", Version: "v2", Resource: "hpas"}, Kind: "HorizontalPodAutoscaler", Namespaced: true},
}

func watchResolve(apiVersion, resource string) (*apiresource.Resource, error) {
	if r, ok := watchResources[apiVersion+"/"+resource]; ok {
		return r, nil
	}
	return nil, fmt.Errorf("%s %s is not served", apiVersion, resource)
}

func watchRule(s string) v1alpha1.ResourceRule {
	i := strings.LastIndex(s, "/")
	if i < 0 {
		return v1alpha1.ResourceRule{}
	}
	return v1alpha1.ResourceRule{APIVersion: s[:i], Resource: s[i+1:]}
}

// watchTarget is a target rule; ignore sets ignoreStatusChanges, labels a
// matchLabels selector.
func watchTarget(s string, ignore bool, lbls map[string]string) v1alpha1.DecoratorControllerResourceRule {
	r := v1alpha1.DecoratorControllerResourceRule{ResourceRule: watchRule(s)}
	if ignore {
		r.IgnoreStatusChanges = &ignore
	}
	if lbls != nil {
		r.LabelSelector = &metav1.LabelSelector{MatchLabels: lbls}
	}
	return r
}

func watchController(finalize bool, targets []v1alpha1.DecoratorControllerResourceRule, attachments ...string) *Controller {
	dc := &v1alpha1.DecoratorController{Spec: v1alpha1.DecoratorControllerSpec{Resources: targets}}
	dc.Name = "dec"
	for _, a := range attachments {
		dc.Spec.Attachments = append(dc.Spec.Attachments, v1alpha1.DecoratorControllerAttachmentRule{ResourceRule: watchRule(a)})
	}
	if finalize {
		dc.Spec.Hooks = &v1alpha1.DecoratorControllerHooks{Finalize: &v1alpha1.Hook{}}
	}
	return &Controller{DC: dc}
}

func watchPlan(t *testing.T, c *Controller) *kinds.WatchPlan {
	t.Helper()
	p, err := c.WatchPlan(watchResolve)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestWatchResources(t *testing.T) {
	c := watchController(false, []v1alpha1.DecoratorControllerResourceRule{watchTarget("apps/v1/deployments", false, nil), watchTarget("v1/namespaces", false, nil)}, "v1/configmaps")
	want := []kinds.WatchedResource{
		{Field: "spec.resources[0]", APIVersion: "apps/v1", Resource: "deployments"},
		{Field: "spec.resources[1]", APIVersion: "v1", Resource: "namespaces"},
		{Field: "spec.attachments[0]", APIVersion: "v1", Resource: "configmaps"},
	}
	if diff := cmp.Diff(want, c.WatchResources()); diff != "" {
		t.Errorf("targets, then attachments, in spec order (-want +got):\n%s", diff)
	}
}

func TestWatchPlan(t *testing.T) {
	type summary struct {
		Parents   []string
		Ignore    []bool
		Owned     []string
		Adopts    bool
		Finalizer string
		Mark      kinds.Attachment
	}
	mark := kinds.Attachment{Annotation: "metacontroller.k8s.io/decorator-controller", Value: "dec"}
	cases := []struct {
		reason   string
		finalize bool
		targets  []v1alpha1.DecoratorControllerResourceRule
		attach   []string
		want     summary
		wantErr  string
	}{
		{
			reason:  "targets of both scopes, attachments in spec order, no adoption",
			targets: []v1alpha1.DecoratorControllerResourceRule{watchTarget("apps/v1/deployments", true, nil), watchTarget("v1/namespaces", false, nil)},
			attach:  []string{"v1/configmaps", "v1/secrets"},
			want: summary{Parents: []string{"apps/v1, Resource=deployments", "/v1, Resource=namespaces"}, Ignore: []bool{true, false},
				Owned: []string{"/v1, Resource=configmaps", "/v1, Resource=secrets"}, Mark: mark},
		},
		{
			reason:   "one resource named by two rules is watched once, ignoring status only if both ask",
			finalize: true,
			targets: []v1alpha1.DecoratorControllerResourceRule{
				watchTarget("apps/v1/deployments", true, map[string]string{"a": "1"}), watchTarget("apps/v1/deployments", false, map[string]string{"b": "1"})},
			want: summary{Parents: []string{"apps/v1, Resource=deployments"}, Ignore: []bool{false}, Finalizer: "metacontroller.io/decoratorcontroller-dec", Mark: mark},
		},
		{
			reason:  "both rules ignoring status changes keep ignoring them",
			targets: []v1alpha1.DecoratorControllerResourceRule{watchTarget("apps/v1/deployments", true, nil), watchTarget("apps/v1/deployments", true, nil)},
			want:    summary{Parents: []string{"apps/v1, Resource=deployments"}, Ignore: []bool{true}, Mark: mark},
		},
		{
			reason:  "nothing to decorate",
			wantErr: "spec.resources is empty: nothing to decorate",
		},
		{
			reason:  "a target must name its resource",
			targets: []v1alpha1.DecoratorControllerResourceRule{watchTarget("apps/v1/deployments", false, nil), watchTarget("/x", false, nil)},
			wantErr: "spec.resources[1] needs apiVersion and resource",
		},
		{
			reason:  "an unresolvable target names its index",
			targets: []v1alpha1.DecoratorControllerResourceRule{watchTarget("apps/v1/nothings", false, nil)},
			wantErr: "spec.resources[0]: apps/v1 nothings is not served",
		},
		{
			reason: "a selector that does not parse fails the controller",
			targets: []v1alpha1.DecoratorControllerResourceRule{{ResourceRule: watchRule("apps/v1/deployments"),
				LabelSelector: &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "a", Operator: "Bogus"}}}}},
			wantErr: "spec.resources[0].labelSelector: \"Bogus\" is not a valid label selector operator",
		},
		{
			reason:  "an unresolvable attachment names its index",
			targets: []v1alpha1.DecoratorControllerResourceRule{watchTarget("apps/v1/deployments", false, nil)},
			attach:  []string{"v1/nothings"},
			wantErr: "spec.attachments[0]: v1 nothings is not served",
		},
		{
			reason:  "one attachment resource in two versions is rejected",
			targets: []v1alpha1.DecoratorControllerResourceRule{watchTarget("apps/v1/deployments", false, nil)},
			attach:  []string{"autoscaling/v1/hpas", "autoscaling/v2/hpas"},
			wantErr: "spec.attachments[1] declares HorizontalPodAutoscaler.autoscaling/v2, which spec.attachments[0] declares as autoscaling/v1: list each resource once, in one version",
		},
	}
	for _, tc := range cases {
		t.Run(tc.reason, func(t *testing.T) {
			plan, err := watchController(tc.finalize, tc.targets, tc.attach...).WatchPlan(watchResolve)
			got := ""
			if err != nil {
				got = err.Error()
			}
			if diff := cmp.Diff(tc.wantErr, got); diff != "" {
				t.Fatalf("error (-want +got):\n%s", diff)
			}
			if err != nil {
				return
			}
			s := summary{Adopts: plan.Adopts, Finalizer: plan.Finalizer}
			if plan.Attachment != nil {
				s.Mark = *plan.Attachment
			}
			for _, p := range plan.Parents {
				s.Parents = append(s.Parents, p.Res.GVR.String())
				s.Ignore = append(s.Ignore, p.IgnoreStatusChanges)
			}
			for _, o := range plan.Owned {
				s.Owned = append(s.Owned, o.GVR.String())
			}
			if diff := cmp.Diff(tc.want, s); diff != "" {
				t.Errorf("plan (-want +got):\n%s", diff)
			}
		})
	}
}

// watchObj builds an object; owner, if set, is its controller reference.
func watchObj(apiVersion, kind, ns, name string, lbls, anns map[string]string, owner *metav1.OwnerReference) *unstructured.Unstructured {
	u := object(apiVersion, kind, ns, name, lbls, anns)
	u.SetUID(types.UID(name + "-uid"))
	if owner != nil {
		u.SetOwnerReferences([]metav1.OwnerReference{*owner})
	}
	return u
}

func watchRef(apiVersion, kind, name string) *metav1.OwnerReference {
	yes := true
	return &metav1.OwnerReference{APIVersion: apiVersion, Kind: kind, Name: name, UID: types.UID(name + "-uid"), Controller: &yes}
}

func TestWatchRules(t *testing.T) {
	plan := watchPlan(t, watchController(false, []v1alpha1.DecoratorControllerResourceRule{
		watchTarget("apps/v1/deployments", false, map[string]string{"deco": "yes"}), watchTarget("v1/namespaces", false, nil)}, "v1/configmaps"))
	r := plan.Rules
	mark := map[string]string{ControllerAnnotation: "dec"}
	t.Run("Selects", func(t *testing.T) {
		for _, tc := range []struct {
			reason string
			obj    *unstructured.Unstructured
			want   bool
		}{
			{"a Deployment matching its kind's selector", watchObj("apps/v1", "Deployment", "ns", "d", map[string]string{"deco": "yes"}, nil, nil), true},
			{"a Deployment not matching it", watchObj("apps/v1", "Deployment", "ns", "d", nil, nil, nil), false},
			{"a Namespace: its rule has no selector", watchObj("v1", "Namespace", "", "n", nil, nil, nil), true},
			{"a kind no rule names", watchObj("v1", "ConfigMap", "ns", "c", map[string]string{"deco": "yes"}, nil, nil), false},
		} {
			if got := r.Selects(tc.obj); got != tc.want {
				t.Errorf("%s: Selects = %v, want %v", tc.reason, got, tc.want)
			}
		}
	})
	t.Run("OwnerRef", func(t *testing.T) {
		ref := watchRef("apps/v1", "Deployment", "d")
		for _, tc := range []struct {
			reason string
			obj    *unstructured.Unstructured
			want   *metav1.OwnerReference
		}{
			{"a controlled object with our annotation is an attachment", watchObj("v1", "ConfigMap", "ns", "c", nil, mark, ref), ref},
			{"without the annotation it is nobody's business", watchObj("v1", "ConfigMap", "ns", "c", nil, nil, ref), nil},
			{"another decorator's annotation", watchObj("v1", "ConfigMap", "ns", "c", nil, map[string]string{ControllerAnnotation: "other"}, ref), nil},
			{"marked but with no controller", watchObj("v1", "ConfigMap", "ns", "c", nil, mark, nil), nil},
		} {
			if diff := cmp.Diff(tc.want, r.OwnerRef(tc.obj)); diff != "" {
				t.Errorf("%s: OwnerRef (-want +got):\n%s", tc.reason, diff)
			}
		}
	})
	t.Run("WantsOrphan", func(t *testing.T) {
		if r.WantsOrphan(watchObj("apps/v1", "Deployment", "ns", "d", map[string]string{"deco": "yes"}, nil, nil), watchObj("v1", "ConfigMap", "ns", "c", nil, mark, nil)) {
			t.Error("a decorator adopted an orphan; it never adopts")
		}
		if plan.Adopts {
			t.Error("the plan says a decorator adopts")
		}
	})
}

// watchCache is an owned resource's cache for Observe. A decorator reads
// only OwnedBy: it neither adopts orphans nor looks for earlier
// incarnations, so the other lookups find nothing.
type watchCache []*unstructured.Unstructured

func (c watchCache) OwnedBy(uid string) []*unstructured.Unstructured {
	var out []*unstructured.Unstructured
	for _, o := range c {
		if ref := metav1.GetControllerOfNoCopy(o); ref != nil && string(ref.UID) == uid {
			out = append(out, o)
		}
	}
	return out
}

func (c watchCache) Orphans(string) []*unstructured.Unstructured { return nil }

func (c watchCache) AllOrphans() []*unstructured.Unstructured { return nil }

func (c watchCache) ControlledByName(_, _, _, _ string) []*unstructured.Unstructured { return nil }

func TestWatchObserve(t *testing.T) {
	plan := watchPlan(t, watchController(false, []v1alpha1.DecoratorControllerResourceRule{
		watchTarget("apps/v1/deployments", false, nil), watchTarget("v1/namespaces", false, nil)}, "v1/configmaps", "v1/secrets"))
	mark := map[string]string{ControllerAnnotation: "dec"}
	dref, nref := watchRef("apps/v1", "Deployment", "d"), watchRef("v1", "Namespace", "n")
	configmaps := watchCache{
		watchObj("v1", "ConfigMap", "ns", "ours", nil, mark, dref),
		watchObj("v1", "ConfigMap", "ns", "unmarked", nil, nil, dref),
		watchObj("v1", "ConfigMap", "other", "elsewhere", nil, mark, dref),
		watchObj("v1", "ConfigMap", "ns", "wrong-group", nil, mark, watchRef("example.com/v1", "Deployment", "d")),
		watchObj("v1", "ConfigMap", "ns", "wrong-kind", nil, mark, watchRef("apps/v1", "StatefulSet", "d")),
		watchObj("v1", "ConfigMap", "a", "in-a", nil, mark, nref),
		watchObj("v1", "ConfigMap", "b", "in-b", nil, mark, nref),
	}
	secrets := watchCache{watchObj("v1", "Secret", "ns", "s", nil, mark, dref)}
	caches := []kinds.WatchCache{configmaps, secrets}
	names := func(objs []*unstructured.Unstructured) []string {
		out := []string{}
		for _, o := range objs {
			out = append(out, o.GetName())
		}
		return out
	}
	cases := []struct {
		reason string
		res    *apiresource.Resource
		target *unstructured.Unstructured
		want   [][]string
	}{
		{
			reason: "a namespaced target: our marked attachments of its namespace, per attachment rule",
			res:    watchResources["apps/v1/deployments"],
			target: watchObj("apps/v1", "Deployment", "ns", "d", nil, nil, nil),
			want:   [][]string{{"ours"}, {"s"}},
		},
		{
			reason: "a cluster-scoped target owns attachments in any namespace",
			res:    watchResources["v1/namespaces"],
			target: watchObj("v1", "Namespace", "", "n", nil, nil, nil),
			want:   [][]string{{"in-a", "in-b"}, {}},
		},
	}
	for _, tc := range cases {
		t.Run(tc.reason, func(t *testing.T) {
			groups, selErr := plan.Rules.Observe(tc.res, tc.target, caches)
			if selErr != "" {
				t.Errorf("selector error %q; a decorator has none", selErr)
			}
			var got [][]string
			for _, g := range groups {
				if len(g.Adopt) > 0 || len(g.Release) > 0 {
					t.Errorf("group %s adopts %d and releases %d; a decorator does neither", g.Resource, len(g.Adopt), len(g.Release))
				}
				got = append(got, names(g.Objects))
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("attachments (-want +got):\n%s", diff)
			}
		})
	}
}

func TestWatchReleaseOnReplace(t *testing.T) {
	deploy, ns := watchTarget("apps/v1/deployments", false, nil), watchTarget("v1/namespaces", false, nil)
	deployBeta := watchTarget("apps/v1beta1/deployments", false, nil)
	cases := []struct {
		reason    string
		old, next *Controller
		want      []bool
	}{
		{
			reason: "the finalize hook was removed: release every target",
			old:    watchController(true, []v1alpha1.DecoratorControllerResourceRule{deploy, ns}),
			next:   watchController(false, []v1alpha1.DecoratorControllerResourceRule{deploy, ns}),
			want:   []bool{true, true},
		},
		{
			reason: "a kind no longer targeted: release its targets only",
			old:    watchController(true, []v1alpha1.DecoratorControllerResourceRule{deploy, ns}),
			next:   watchController(true, []v1alpha1.DecoratorControllerResourceRule{deploy}),
			want:   []bool{false, true},
		},
		{
			reason: "a kind now targeted in another version is still targeted (it finalizes what stopped matching)",
			old:    watchController(true, []v1alpha1.DecoratorControllerResourceRule{deploy}),
			next:   watchController(true, []v1alpha1.DecoratorControllerResourceRule{deployBeta}),
			want:   []bool{false},
		},
		{
			reason: "no finalize hook before: no finalizer to release",
			old:    watchController(false, []v1alpha1.DecoratorControllerResourceRule{deploy, ns}),
			next:   watchController(false, []v1alpha1.DecoratorControllerResourceRule{deploy}),
		},
	}
	for _, tc := range cases {
		t.Run(tc.reason, func(t *testing.T) {
			got := watchPlan(t, tc.old).Rules.ReleaseOnReplace(watchPlan(t, tc.next))
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("release mask (-want +got):\n%s", diff)
			}
		})
	}
}
