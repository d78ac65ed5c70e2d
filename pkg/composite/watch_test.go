package composite

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
	"example.com/v1/things":    {GVR: schema.GroupVersionResource{Group: "example.com", Version: "v1", Resource: "things"}, Kind: "Thing", Namespaced: true, HasStatus: true},
	"example.com/v1/nostatus":  {GVR: schema.GroupVersionResource{Group: "example.com", Version: "v1", Resource: "nostatus"}, Kind: "NoStatus", Namespaced: true},
	"example.com/v1/clusters":  {GVR: schema.GroupVersionResource{Group: "example.com", Version: "v1", Resource: "clusters"}, Kind: "Cluster", HasStatus: true},
	"v1/configmaps":            {GVR: schema.GroupVersionResource{Version: "v1", Resource: "configmaps"}, Kind: "ConfigMap", Namespaced: true},
	"v1/namespaces":            {GVR: schema.GroupVersionResource{Version: "v1", Resource: "namespaces"}, Kind: "Namespace"},
	"autoscaling/v1/hpas":      {GVR: schema.GroupVersionResource{Group: "autoscaling", Version: "v1", Resource: "hpas"}, Kind: "HorizontalPodAutoscaler", Namespaced: true},
	"autoscaling/v2/hpas":      {GVR: schema.GroupVersionResource{Group: "autoscaling", Version: "v2", Resource: "hpas"}, Kind: "HorizontalPodAutoscaler", Namespaced: true},
	"apps/v1/deployments":      {GVR: schema.GroupVersionResource{Group: "apps", Version: "v1", Resource: "deployments"}, Kind: "Deployment", Namespaced: true},
	"example.com/v1/otherkind": {GVR: schema.GroupVersionResource{Group: "example.com", Version: "v1", Resource: "otherkind"}, Kind: "Other", Namespaced: true},
}

func watchResolve(apiVersion, resource string) (*apiresource.Resource, error) {
	if r, ok := watchResources[apiVersion+"/"+resource]; ok {
		return r, nil
	}
	return nil, fmt.Errorf("%s %s is not served", apiVersion, resource)
}

func watchController(spec v1alpha1.CompositeControllerSpec) *Controller {
	cc := &v1alpha1.CompositeController{Spec: spec}
	cc.Name = "ctl"
	return &Controller{CC: cc}
}

func watchSpec(parent string, children ...string) v1alpha1.CompositeControllerSpec {
	rule := func(s string) v1alpha1.ResourceRule {
		var r v1alpha1.ResourceRule
		if i := strings.LastIndex(s, "/"); i >= 0 {
			r.APIVersion, r.Resource = s[:i], s[i+1:]
		}
		return r
	}
	spec := v1alpha1.CompositeControllerSpec{ParentResource: v1alpha1.CompositeControllerParentResourceRule{ResourceRule: rule(parent)}}
	for _, c := range children {
		spec.ChildResources = append(spec.ChildResources, v1alpha1.CompositeControllerChildResourceRule{ResourceRule: rule(c)})
	}
	return spec
}

func TestWatchResources(t *testing.T) {
	got := watchController(watchSpec("example.com/v1/things", "v1/configmaps", "apps/v1/deployments")).WatchResources()
	want := []kinds.WatchedResource{
		{Field: "spec.parentResource", APIVersion: "example.com/v1", Resource: "things"},
		{Field: "spec.childResources[0]", APIVersion: "v1", Resource: "configmaps"},
		{Field: "spec.childResources[1]", APIVersion: "apps/v1", Resource: "deployments"},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("the parent first, then the children in spec order, each named by its field (-want +got):\n%s", diff)
	}
}

// watchPlanSummary is what a plan says, in comparable form.
type watchPlanSummary struct {
	Parents   []string
	Ignore    []bool
	Owned     []string
	Adopts    bool
	Finalizer string
}

func watchSummarize(p *kinds.WatchPlan) watchPlanSummary {
	s := watchPlanSummary{Adopts: p.Adopts, Finalizer: p.Finalizer}
	for _, pr := range p.Parents {
		s.Parents = append(s.Parents, pr.Res.GVR.String())
		s.Ignore = append(s.Ignore, pr.IgnoreStatusChanges)
	}
	for _, o := range p.Owned {
		s.Owned = append(s.Owned, o.GVR.String())
	}
	return s
}

func TestWatchPlan(t *testing.T) {
	withHooks := func(spec v1alpha1.CompositeControllerSpec, finalize bool, ignore bool, sel *metav1.LabelSelector) v1alpha1.CompositeControllerSpec {
		if finalize {
			spec.Hooks = &v1alpha1.CompositeControllerHooks{Finalize: &v1alpha1.Hook{}}
		}
		if ignore {
			spec.ParentResource.IgnoreStatusChanges = boolPtr(true)
		}
		spec.ParentResource.LabelSelector = sel
		return spec
	}
	cases := []struct {
		reason  string
		spec    v1alpha1.CompositeControllerSpec
		want    watchPlanSummary
		wantErr string
	}{
		{
			reason: "one parent source, children in spec order, orphans adopted",
			spec:   watchSpec("example.com/v1/things", "v1/configmaps", "apps/v1/deployments"),
			want: watchPlanSummary{Parents: []string{"example.com/v1, Resource=things"}, Ignore: []bool{false},
				Owned: []string{"/v1, Resource=configmaps", "apps/v1, Resource=deployments"}, Adopts: true},
		},
		{
			reason: "a finalize hook puts the finalizer in the plan; ignoreStatusChanges goes with the parent",
			spec:   withHooks(watchSpec("example.com/v1/things"), true, true, nil),
			want: watchPlanSummary{Parents: []string{"example.com/v1, Resource=things"}, Ignore: []bool{true},
				Adopts: true, Finalizer: "metacontroller.io/compositecontroller-ctl"},
		},
		{
			reason:  "the parent resource must be named",
			spec:    watchSpec("/things"),
			wantErr: "spec.parentResource needs apiVersion and resource",
		},
		{
			reason:  "an unresolvable parent is reported as the parent resource",
			spec:    watchSpec("example.com/v1/nothings"),
			wantErr: "parent resource: example.com/v1 nothings is not served",
		},
		{
			reason:  "a parent without the status subresource would hot-loop",
			spec:    watchSpec("example.com/v1/nostatus"),
			wantErr: "parent resource example.com/v1, Resource=nostatus does not have subresource 'status' enabled",
		},
		{
			reason:  "a label selector that does not parse",
			spec:    withHooks(watchSpec("example.com/v1/things"), false, false, &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "a", Operator: "Bogus"}}}),
			wantErr: "spec.parentResource.labelSelector: \"Bogus\" is not a valid label selector operator",
		},
		{
			reason:  "an unresolvable child names its index",
			spec:    watchSpec("example.com/v1/things", "v1/configmaps", "v1/nothings"),
			wantErr: "spec.childResources[1]: v1 nothings is not served",
		},
		{
			reason:  "a namespaced parent cannot own cluster-scoped children",
			spec:    watchSpec("example.com/v1/things", "v1/namespaces"),
			wantErr: "spec.childResources[0]: a namespaced parent cannot own cluster-scoped namespaces",
		},
		{
			reason: "a cluster-scoped parent may own cluster-scoped children",
			spec:   watchSpec("example.com/v1/clusters", "v1/namespaces"),
			want: watchPlanSummary{Parents: []string{"example.com/v1, Resource=clusters"}, Ignore: []bool{false},
				Owned: []string{"/v1, Resource=namespaces"}, Adopts: true},
		},
		{
			reason:  "one resource declared in two versions is rejected",
			spec:    watchSpec("example.com/v1/things", "autoscaling/v1/hpas", "autoscaling/v2/hpas"),
			wantErr: "spec.childResources[1] declares HorizontalPodAutoscaler.autoscaling/v2, which spec.childResources[0] declares as autoscaling/v1: list each resource once, in one version",
		},
	}
	for _, tc := range cases {
		t.Run(tc.reason, func(t *testing.T) {
			plan, err := watchController(tc.spec).WatchPlan(watchResolve)
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
			if diff := cmp.Diff(tc.want, watchSummarize(plan)); diff != "" {
				t.Errorf("plan (-want +got):\n%s", diff)
			}
		})
	}
}

// watchObj builds an object of the fake resources: kind "Thing" parents
// in example.com, ConfigMaps otherwise.
func watchObj(kind, ns, name, uid string, lbls map[string]string, owner *metav1.OwnerReference) *unstructured.Unstructured {
	u := &unstructured.Unstructured{Object: map[string]any{}}
	if kind == "Thing" {
		u.SetAPIVersion("example.com/v1")
	} else {
		u.SetAPIVersion("v1")
	}
	u.SetKind(kind)
	u.SetNamespace(ns)
	u.SetName(name)
	u.SetUID(types.UID(uid))
	u.SetResourceVersion("1")
	if lbls != nil {
		u.SetLabels(lbls)
	}
	if owner != nil {
		u.SetOwnerReferences([]metav1.OwnerReference{*owner})
	}
	return u
}

func watchCtrlRef(apiVersion, kind, name, uid string) *metav1.OwnerReference {
	return &metav1.OwnerReference{APIVersion: apiVersion, Kind: kind, Name: name, UID: types.UID(uid), Controller: boolPtr(true)}
}

func TestWatchRules(t *testing.T) {
	spec := watchSpec("example.com/v1/things", "v1/configmaps")
	spec.ParentResource.LabelSelector = &metav1.LabelSelector{MatchLabels: map[string]string{"tier": "a"}}
	plan, err := watchController(spec).WatchPlan(watchResolve)
	if err != nil {
		t.Fatal(err)
	}
	withSelector := func(p *unstructured.Unstructured, sel map[string]any) *unstructured.Unstructured {
		p.Object["spec"] = map[string]any{"selector": sel}
		return p
	}
	r := plan.Rules
	t.Run("Selects", func(t *testing.T) {
		for _, tc := range []struct {
			reason string
			obj    *unstructured.Unstructured
			want   bool
		}{
			{"a parent matching parentResource.labelSelector", watchObj("Thing", "ns", "p", "u", map[string]string{"tier": "a"}, nil), true},
			{"a parent that does not match (the finalizer rule is the watcher's)", watchObj("Thing", "ns", "p", "u", map[string]string{"tier": "b"}, nil), false},
		} {
			if got := r.Selects(tc.obj); got != tc.want {
				t.Errorf("%s: Selects = %v, want %v", tc.reason, got, tc.want)
			}
		}
	})
	t.Run("OwnerRef", func(t *testing.T) {
		ref := watchCtrlRef("example.com/v1", "Thing", "p", "u")
		for _, tc := range []struct {
			reason string
			obj    *unstructured.Unstructured
			want   *metav1.OwnerReference
		}{
			{"any controller reference: the watcher checks it names a parent", watchObj("ConfigMap", "ns", "c", "c1", nil, ref), ref},
			{"another kind's controller is returned too", watchObj("ConfigMap", "ns", "c", "c1", nil, watchCtrlRef("apps/v1", "Deployment", "d", "d1")),
				watchCtrlRef("apps/v1", "Deployment", "d", "d1")},
			{"an orphan has none", watchObj("ConfigMap", "ns", "c", "c1", nil, nil), nil},
		} {
			if diff := cmp.Diff(tc.want, r.OwnerRef(tc.obj)); diff != "" {
				t.Errorf("%s: OwnerRef (-want +got):\n%s", tc.reason, diff)
			}
		}
	})
	t.Run("WantsOrphan", func(t *testing.T) {
		orphan := watchObj("ConfigMap", "ns", "c", "c1", map[string]string{"app": "x"}, nil)
		for _, tc := range []struct {
			reason string
			parent *unstructured.Unstructured
			want   bool
		}{
			{"the parent's selector matches", withSelector(watchObj("Thing", "ns", "p", "u", nil, nil), map[string]any{"matchLabels": map[string]any{"app": "x"}}), true},
			{"the parent's selector does not match", withSelector(watchObj("Thing", "ns", "p", "u", nil, nil), map[string]any{"matchLabels": map[string]any{"app": "y"}}), false},
			{"an empty selector would claim everything", withSelector(watchObj("Thing", "ns", "p", "u", nil, nil), map[string]any{}), false},
			{"no selector at all", watchObj("Thing", "ns", "p", "u", nil, nil), false},
		} {
			if got := r.WantsOrphan(tc.parent, orphan); got != tc.want {
				t.Errorf("%s: WantsOrphan = %v, want %v", tc.reason, got, tc.want)
			}
		}
	})
}

// watchFakeCache is an owned resource's cache for Observe.
type watchFakeCache []*unstructured.Unstructured

func (c watchFakeCache) OwnedBy(uid string) []*unstructured.Unstructured {
	var out []*unstructured.Unstructured
	for _, o := range c {
		if ref := metav1.GetControllerOfNoCopy(o); ref != nil && string(ref.UID) == uid {
			out = append(out, o)
		}
	}
	return out
}

func (c watchFakeCache) Orphans(ns string) []*unstructured.Unstructured {
	var out []*unstructured.Unstructured
	for _, o := range c {
		if metav1.GetControllerOfNoCopy(o) == nil && o.GetNamespace() == ns {
			out = append(out, o)
		}
	}
	return out
}

func (c watchFakeCache) AllOrphans() []*unstructured.Unstructured {
	var out []*unstructured.Unstructured
	for _, o := range c {
		if metav1.GetControllerOfNoCopy(o) == nil {
			out = append(out, o)
		}
	}
	return out
}

func (c watchFakeCache) ControlledByName(group, kind, ns, name string) []*unstructured.Unstructured {
	var out []*unstructured.Unstructured
	for _, o := range c {
		ref := metav1.GetControllerOfNoCopy(o)
		if ref == nil || ref.Kind != kind || ref.Name != name || o.GetNamespace() != ns {
			continue
		}
		if gv, err := schema.ParseGroupVersion(ref.APIVersion); err == nil && gv.Group == group {
			out = append(out, o)
		}
	}
	return out
}

func TestWatchObserve(t *testing.T) {
	thingRef := func(uid string) *metav1.OwnerReference { return watchCtrlRef("example.com/v1", "Thing", "p", uid) }
	app := map[string]string{"app": "x"}
	other := map[string]string{"app": "y"}
	parentWith := func(sel map[string]any, deleting bool) *unstructured.Unstructured {
		p := watchObj("Thing", "ns", "p", "u", nil, nil)
		if sel != nil {
			p.Object["spec"] = map[string]any{"selector": sel}
		}
		if deleting {
			now := metav1.Now()
			p.SetDeletionTimestamp(&now)
		}
		return p
	}
	matchApp := map[string]any{"matchLabels": map[string]any{"app": "x"}}
	var (
		kept      = watchObj("ConfigMap", "ns", "kept", "k", app, thingRef("u"))
		strayed   = watchObj("ConfigMap", "ns", "strayed", "s", other, thingRef("u"))
		orphan    = watchObj("ConfigMap", "ns", "orphan", "o", app, nil)
		elsewhere = watchObj("ConfigMap", "other", "elsewhere", "e", app, nil)
		foreign   = watchObj("ConfigMap", "ns", "foreign", "f", app, watchCtrlRef("apps/v1", "Thing", "p", "u"))
		earlier   = watchObj("ConfigMap", "ns", "earlier", "r", other, thingRef("old-uid"))
		otherPar  = watchObj("ConfigMap", "ns", "sibling", "b", app, watchCtrlRef("example.com/v1", "Thing", "q", "q-uid"))
	)
	names := func(objs []*unstructured.Unstructured) []string {
		out := []string{}
		for _, o := range objs {
			out = append(out, o.GetName())
		}
		return out
	}
	type group struct{ Objects, Adopt, Release []string }
	cases := []struct {
		reason   string
		generate bool
		parent   *unstructured.Unstructured
		cache    watchFakeCache
		want     []group
		wantSel  string
	}{
		{
			reason: "owned and matching is kept, owned and not matching is released, a matching orphan of the namespace is adopted; a child of another group's kind, another parent or namespace is not shown",
			parent: parentWith(matchApp, false),
			cache:  watchFakeCache{kept, strayed, orphan, elsewhere, foreign, otherPar},
			want:   []group{{Objects: []string{"kept", "orphan"}, Adopt: []string{"orphan"}, Release: []string{"strayed"}}},
		},
		{
			reason: "a child of an earlier incarnation (same kind and name, old UID) is an orphan offered to the selector",
			parent: parentWith(map[string]any{"matchLabels": map[string]any{"app": "y"}}, false),
			cache:  watchFakeCache{earlier},
			want:   []group{{Objects: []string{"earlier"}, Adopt: []string{"earlier"}}},
		},
		{
			reason:   "under generateSelector an earlier incarnation's child is adopted by name and kind alone",
			generate: true,
			parent:   parentWith(nil, false),
			cache:    watchFakeCache{earlier, orphan},
			want:     []group{{Objects: []string{"earlier"}, Adopt: []string{"earlier"}}},
		},
		{
			reason:  "an unusable selector keeps what is owned, adopts and releases nothing, and says why",
			parent:  parentWith(nil, false),
			cache:   watchFakeCache{kept, strayed, orphan},
			want:    []group{{Objects: []string{"kept", "strayed"}}},
			wantSel: "parent ns/p has no spec.selector (and the controller does not set generateSelector)",
		},
		{
			reason: "a parent being deleted keeps all it owns and adopts nothing",
			parent: parentWith(matchApp, true),
			cache:  watchFakeCache{kept, strayed, orphan, earlier},
			want:   []group{{Objects: []string{"kept", "strayed"}}},
		},
	}
	for _, tc := range cases {
		t.Run(tc.reason, func(t *testing.T) {
			spec := watchSpec("example.com/v1/things", "v1/configmaps")
			spec.GenerateSelector = boolPtr(tc.generate)
			plan, err := watchController(spec).WatchPlan(watchResolve)
			if err != nil {
				t.Fatal(err)
			}
			groups, selErr := plan.Rules.Observe(plan.Parents[0].Res, tc.parent, []kinds.WatchCache{tc.cache})
			var got []group
			for _, g := range groups {
				if g.Kind != "ConfigMap" || g.APIVersion != "v1" || g.Resource != "configmaps" || !g.Namespaced {
					t.Errorf("group names %s %s %s (namespaced %v), want the configmaps rule", g.APIVersion, g.Resource, g.Kind, g.Namespaced)
				}
				got = append(got, group{Objects: names(g.Objects), Adopt: names(g.Adopt), Release: names(g.Release)})
			}
			for i := range tc.want {
				for _, l := range []*[]string{&tc.want[i].Objects, &tc.want[i].Adopt, &tc.want[i].Release} {
					if *l == nil {
						*l = []string{}
					}
				}
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("groups (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.wantSel, selErr); diff != "" {
				t.Errorf("selector error (-want +got):\n%s", diff)
			}
		})
	}
}

func TestWatchReleaseOnReplace(t *testing.T) {
	plan := func(finalize bool) *kinds.WatchPlan {
		spec := watchSpec("example.com/v1/things", "v1/configmaps")
		if finalize {
			spec.Hooks = &v1alpha1.CompositeControllerHooks{Finalize: &v1alpha1.Hook{}}
		}
		p, err := watchController(spec).WatchPlan(watchResolve)
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	cases := []struct {
		reason    string
		old, next bool // finalize hook before and after
		want      []bool
	}{
		{"the finalize hook was removed: nobody will finalize, release every parent", true, false, []bool{true}},
		{"the finalize hook stays: keep the finalizers", true, true, nil},
		{"no finalize hook before: nothing to release", false, false, nil},
		{"a finalize hook added: nothing to release", false, true, nil},
	}
	for _, tc := range cases {
		t.Run(tc.reason, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, plan(tc.old).Rules.ReleaseOnReplace(plan(tc.next))); diff != "" {
				t.Errorf("release mask (-want +got):\n%s", diff)
			}
		})
	}
}
