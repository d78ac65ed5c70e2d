package mapctl

import (
	"fmt"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"

	"github.com/metabus/metabus/pkg/apiresource"
	"github.com/metabus/metabus/pkg/kinds"
	"github.com/metabus/metabus/pkg/snapshot"
)

// watchResources is the fake discovery of the watch tests, by
// "apiVersion/resource".
var watchResources = map[string]*apiresource.Resource{
	"ctl.example.com/v1/snapshotschedules": {GVR: schema.GroupVersionResource{Group: "ctl.example.com", Version: "v1", Resource: "snapshotschedules"}, Kind: "SnapshotSchedule", Namespaced: true, HasStatus: true},
	"ctl.example.com/v1/nostatus":          {GVR: schema.GroupVersionResource{Group: "ctl.example.com", Version: "v1", Resource: "nostatus"}, Kind: "NoStatus", Namespaced: true},
	"ctl.example.com/v1/schedules":         {GVR: schema.GroupVersionResource{Group: "ctl.example.com", Version: "v1", Resource: "schedules"}, Kind: "Schedule", HasStatus: true},
	"v1/persistentvolumeclaims":            {GVR: schema.GroupVersionResource{Version: "v1", Resource: "persistentvolumeclaims"}, Kind: "PersistentVolumeClaim", Namespaced: true},
	"v1/configmaps":                        {GVR: schema.GroupVersionResource{Version: "v1", Resource: "configmaps"}, Kind: "ConfigMap", Namespaced: true},
	"v1/persistentvolumes":                 {GVR: schema.GroupVersionResource{Version: "v1", Resource: "persistentvolumes"}, Kind: "PersistentVolume"},
	"snapshot.storage.k8s.io/v1/volumesnapshots": {GVR: schema.GroupVersionResource{Group: "snapshot.storage.k8s.io", Version: "v1", Resource: "volumesnapshots"},
		Kind: "VolumeSnapshot", Namespaced: true, HasStatus: true},
	"storage.k8s.io/v1/storageclasses": {GVR: schema.GroupVersionResource{Group: "storage.k8s.io", Version: "v1", Resource: "storageclasses"}, Kind: "StorageClass"},
}

func watchResolve(apiVersion, resource string) (*apiresource.Resource, error) {
	if r, ok := watchResources[apiVersion+"/"+resource]; ok {
		return r, nil
	}
	return nil, fmt.Errorf("%s %s is not served", apiVersion, resource)
}

func rule(apiVersion, resource string) map[string]any {
	return map[string]any{"apiVersion": apiVersion, "resource": resource}
}

// watchSpec is validSpec with the given parent, inputs and outputs
// ("apiVersion resource" pairs as rule maps).
func watchSpec(parent map[string]any, inputs, outputs []any) map[string]any {
	return specWith(func(s map[string]any) {
		s["parentResource"] = parent
		s["inputResources"] = inputs
		s["outputResources"] = outputs
	})
}

// twoByTwo is a controller of SnapshotSchedules mapping PVCs and
// ConfigMaps to VolumeSnapshots and ConfigMaps.
func twoByTwo() map[string]any {
	return watchSpec(rule("ctl.example.com/v1", "snapshotschedules"),
		[]any{rule("v1", "persistentvolumeclaims"), rule("v1", "configmaps")},
		[]any{rule("snapshot.storage.k8s.io/v1", "volumesnapshots"), rule("v1", "configmaps")})
}

func TestWatchResources(t *testing.T) {
	got := newController(t, twoByTwo()).WatchResources()
	want := []kinds.WatchedResource{
		{Field: "spec.parentResource", APIVersion: "ctl.example.com/v1", Resource: "snapshotschedules"},
		{Field: "spec.inputResources[0]", APIVersion: "v1", Resource: "persistentvolumeclaims"},
		{Field: "spec.inputResources[1]", APIVersion: "v1", Resource: "configmaps"},
		{Field: "spec.outputResources[0]", APIVersion: "snapshot.storage.k8s.io/v1", Resource: "volumesnapshots"},
		{Field: "spec.outputResources[1]", APIVersion: "v1", Resource: "configmaps"},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("the parent, then the inputs, then the outputs, in spec order, each named by its field (-want +got):\n%s", diff)
	}
}

// watchPlanSummary is what a plan says, in comparable form.
type watchPlanSummary struct {
	Parents     []string
	Ignore      []bool
	Owned       []string
	Adopts      bool
	Finalizer   string
	KeyedInputs []string
	// SameRules: the plan's rules and its keyed rules are one value (the
	// output resources Observe groups by are the plan's Owned).
	SameRules bool
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
	if p.Keyed != nil {
		for _, in := range p.Keyed.Inputs {
			s.KeyedInputs = append(s.KeyedInputs, in.GVR.String())
		}
		wr, ok := p.Rules.(kinds.KeyedRules)
		s.SameRules = ok && p.Keyed.Rules != nil && wr == p.Keyed.Rules
	}
	return s
}

func TestWatchPlan(t *testing.T) {
	schedules := rule("ctl.example.com/v1", "snapshotschedules")
	pvcs, cms := rule("v1", "persistentvolumeclaims"), rule("v1", "configmaps")
	snaps := rule("snapshot.storage.k8s.io/v1", "volumesnapshots")
	cases := []struct {
		reason  string
		spec    map[string]any
		want    watchPlanSummary
		wantErr string
	}{
		{
			reason: "one parent source whose status changes are metabus's own; outputs owned, never adopted; inputs keyed; no finalizer",
			spec:   twoByTwo(),
			want: watchPlanSummary{
				Parents: []string{"ctl.example.com/v1, Resource=snapshotschedules"}, Ignore: []bool{true},
				Owned:       []string{"snapshot.storage.k8s.io/v1, Resource=volumesnapshots", "/v1, Resource=configmaps"},
				KeyedInputs: []string{"/v1, Resource=persistentvolumeclaims", "/v1, Resource=configmaps"},
				SameRules:   true,
			},
		},
		{
			reason: "a cluster-scoped parent may map cluster-scoped inputs to cluster-scoped outputs",
			spec:   watchSpec(rule("ctl.example.com/v1", "schedules"), []any{rule("v1", "persistentvolumes")}, []any{rule("storage.k8s.io/v1", "storageclasses")}),
			want: watchPlanSummary{
				Parents: []string{"ctl.example.com/v1, Resource=schedules"}, Ignore: []bool{true},
				Owned:       []string{"storage.k8s.io/v1, Resource=storageclasses"},
				KeyedInputs: []string{"/v1, Resource=persistentvolumes"},
				SameRules:   true,
			},
		},
		{
			reason:  "a parent without the status subresource would re-map every key on every status write",
			spec:    watchSpec(rule("ctl.example.com/v1", "nostatus"), []any{pvcs}, []any{snaps}),
			wantErr: "parent resource ctl.example.com/v1, Resource=nostatus does not have subresource 'status' enabled (the aggregated status is written there)",
		},
		{
			reason:  "an unresolvable parent names its field",
			spec:    watchSpec(rule("ctl.example.com/v1", "nothings"), []any{pvcs}, []any{snaps}),
			wantErr: "spec.parentResource: ctl.example.com/v1 nothings is not served",
		},
		{
			reason:  "an unresolvable input names its index",
			spec:    watchSpec(schedules, []any{pvcs, rule("v1", "nothings")}, []any{snaps}),
			wantErr: "spec.inputResources[1]: v1 nothings is not served",
		},
		{
			reason:  "an unresolvable output names its index",
			spec:    watchSpec(schedules, []any{pvcs}, []any{cms, rule("v1", "nothings")}),
			wantErr: "spec.outputResources[1]: v1 nothings is not served",
		},
		{
			reason:  "a namespaced parent cannot own a cluster-scoped output",
			spec:    watchSpec(schedules, []any{pvcs}, []any{snaps, rule("storage.k8s.io/v1", "storageclasses")}),
			wantErr: "spec.outputResources[1] is cluster-scoped: a namespaced parent cannot own it",
		},
		{
			reason:  "a namespaced parent never sees a cluster-scoped input",
			spec:    watchSpec(schedules, []any{rule("v1", "persistentvolumes")}, []any{snaps}),
			wantErr: "spec.inputResources[0] is cluster-scoped: a namespaced parent only sees inputs in its own namespace",
		},
	}
	for _, c := range cases {
		t.Run(c.reason, func(t *testing.T) {
			plan, err := newController(t, c.spec).WatchPlan(watchResolve)
			if diff := cmp.Diff(c.wantErr, errText(err)); diff != "" {
				t.Fatalf("error (-want +got):\n%s", diff)
			}
			if err != nil {
				if plan != nil {
					t.Errorf("a plan with the error: %+v", plan)
				}
				return
			}
			if diff := cmp.Diff(c.want, watchSummarize(plan)); diff != "" {
				t.Errorf("plan (-want +got):\n%s", diff)
			}
		})
	}
}

// fakeCache is an owned resource's informer cache: its objects, read as
// package informers' indexes read them.
type fakeCache []*unstructured.Unstructured

var _ kinds.WatchCache = fakeCache(nil)

func (c fakeCache) OwnedBy(uid string) []*unstructured.Unstructured {
	var out []*unstructured.Unstructured
	for _, o := range c {
		if ref := metav1.GetControllerOfNoCopy(o); ref != nil && string(ref.UID) == uid {
			out = append(out, o)
		}
	}
	return out
}

func (c fakeCache) Orphans(namespace string) []*unstructured.Unstructured {
	var out []*unstructured.Unstructured
	for _, o := range c.AllOrphans() {
		if o.GetNamespace() == namespace {
			out = append(out, o)
		}
	}
	return out
}

func (c fakeCache) AllOrphans() []*unstructured.Unstructured {
	var out []*unstructured.Unstructured
	for _, o := range c {
		if metav1.GetControllerOfNoCopy(o) == nil {
			out = append(out, o)
		}
	}
	return out
}

func (c fakeCache) ControlledByName(group, kind, namespace, name string) []*unstructured.Unstructured {
	var out []*unstructured.Unstructured
	for _, o := range c {
		ref := metav1.GetControllerOfNoCopy(o)
		if ref == nil || ref.Kind != kind || ref.Name != name || o.GetNamespace() != namespace {
			continue
		}
		if gv, err := schema.ParseGroupVersion(ref.APIVersion); err == nil && gv.Group == group {
			out = append(out, o)
		}
	}
	return out
}

// twoByTwoRules are the plan's rules of twoByTwo, as the watcher gets
// them.
func twoByTwoRules(t *testing.T) (*kinds.WatchPlan, kinds.WatchRules, kinds.KeyedRules) {
	t.Helper()
	plan, err := newController(t, twoByTwo()).WatchPlan(watchResolve)
	if err != nil {
		t.Fatal(err)
	}
	return plan, plan.Rules, plan.Keyed.Rules
}

// scheduleParent is a SnapshotSchedule, the parent of twoByTwo.
func scheduleParent(namespace string, mods ...func(*unstructured.Unstructured)) *unstructured.Unstructured {
	return object("ctl.example.com/v1", "SnapshotSchedule", namespace, "p", "p-uid", mods...)
}

func TestWatchRulesParents(t *testing.T) {
	plan, rules, _ := twoByTwoRules(t)
	yes, no := true, false
	ownerRefs := func(refs ...metav1.OwnerReference) func(*unstructured.Unstructured) {
		return func(u *unstructured.Unstructured) { u.SetOwnerReferences(refs) }
	}
	ref := func(uid string, controller *bool) metav1.OwnerReference {
		return metav1.OwnerReference{APIVersion: "ctl.example.com/v1", Kind: "SnapshotSchedule", Name: "p", UID: types.UID(uid), Controller: controller}
	}
	type result struct {
		Selects     bool
		OwnerRef    *metav1.OwnerReference
		WantsOrphan bool
	}
	cases := []struct {
		reason string
		parent *unstructured.Unstructured
		owned  *unstructured.Unstructured
		want   result
	}{
		{
			reason: "every parent is selected (spec.selector chooses inputs); an output's controller is its owner",
			parent: scheduleParent("ns"),
			owned:  snap("a-1", kA, ownerRefs(ref("other", &no), ref("p-uid", &yes))),
			want:   result{Selects: true, OwnerRef: &metav1.OwnerReference{APIVersion: "ctl.example.com/v1", Kind: "SnapshotSchedule", Name: "p", UID: "p-uid", Controller: &yes}},
		},
		{
			reason: "a parent whose inputs are chosen by a selector, being deleted: still a parent; an owner that is not the controller owns nothing",
			parent: scheduleParent("ns", withLabels(map[string]string{"x": "y"}), withField(map[string]any{"matchLabels": map[string]any{"app": "db"}}, "spec", "selector"), deleting),
			owned:  snap("a-1", kA, ownerRefs(ref("p-uid", &no))),
			want:   result{Selects: true},
		},
		{
			reason: "a cluster-scoped parent; an object without owners is nobody's (and never adopted)",
			parent: object("ctl.example.com/v1", "Schedule", "", "p", "p-uid"),
			owned:  snap("a-1", kA),
			want:   result{Selects: true},
		},
	}
	for _, c := range cases {
		t.Run(c.reason, func(t *testing.T) {
			got := result{Selects: rules.Selects(c.parent), OwnerRef: rules.OwnerRef(c.owned), WantsOrphan: rules.WantsOrphan(c.parent, c.owned)}
			if diff := cmp.Diff(c.want, got); diff != "" {
				t.Errorf("decisions (-want +got):\n%s", diff)
			}
			if r := rules.ReleaseOnReplace(plan); r != nil {
				t.Errorf("ReleaseOnReplace = %v, want nil (no finalizer to release)", r)
			}
		})
	}
}

func TestWatchRulesObserve(t *testing.T) {
	plan, rules, _ := twoByTwoRules(t)
	mine := controlledBy("p-uid")
	theirs := controlledBy("q-uid")
	snapsCache := fakeCache{
		snap("a-1", kA, mine), snap("b-1", kB, mine), snap("q-1", kA, theirs), snap("orphan", kA),
		snap("hand-made", "", mine), snap("gone", kC, mine, deleting),
	}
	cmsCache := fakeCache{cm("q-cm", kB, theirs)}
	snapsMeta := snapshot.Group{APIVersion: "snapshot.storage.k8s.io/v1", Resource: "volumesnapshots", Kind: "VolumeSnapshot", Namespaced: true}
	cmsMeta := snapshot.Group{APIVersion: "v1", Resource: "configmaps", Kind: "ConfigMap", Namespaced: true}
	cases := []struct {
		reason    string
		parent    *unstructured.Unstructured
		caches    []kinds.WatchCache
		wantMeta  []snapshot.Group
		wantNames [][]string
	}{
		{
			reason:    "every output the parent controls, per output resource in order, of every key, untagged and deleting ones too",
			parent:    scheduleParent("ns"),
			caches:    []kinds.WatchCache{snapsCache, cmsCache},
			wantMeta:  []snapshot.Group{snapsMeta, cmsMeta},
			wantNames: [][]string{{"ns/a-1", "ns/b-1", "ns/hand-made", "ns/gone"}, {}},
		},
		{
			reason:    "another parent sees its own",
			parent:    object("ctl.example.com/v1", "SnapshotSchedule", "ns", "q", "q-uid"),
			caches:    []kinds.WatchCache{snapsCache, cmsCache},
			wantMeta:  []snapshot.Group{snapsMeta, cmsMeta},
			wantNames: [][]string{{"ns/q-1"}, {"ns/q-cm"}},
		},
	}
	for _, c := range cases {
		t.Run(c.reason, func(t *testing.T) {
			groups, selErr := rules.Observe(plan.Parents[0].Res, c.parent, c.caches)
			if selErr != "" {
				t.Errorf("selector error %q: the parent's selector is about inputs, not outputs", selErr)
			}
			if diff := cmp.Diff(c.wantNames, groupNames(groups)); diff != "" {
				t.Errorf("outputs (-want +got):\n%s", diff)
			}
			var meta []snapshot.Group
			for _, g := range groups {
				if g.Objects == nil {
					t.Errorf("group %s: nil Objects, want empty", g.Resource)
				}
				g.Objects = nil
				meta = append(meta, g)
			}
			if diff := cmp.Diff(c.wantMeta, meta); diff != "" {
				t.Errorf("groups name their resources (-want +got):\n%s", diff)
			}
		})
	}
}

func TestKeyedRulesInputKey(t *testing.T) {
	_, _, rules := twoByTwoRules(t)
	pvcRes := watchResources["v1/persistentvolumeclaims"]
	classRes := watchResources["storage.k8s.io/v1/storageclasses"]
	cases := []struct {
		reason  string
		res     *apiresource.Resource
		input   *unstructured.Unstructured
		want    string
		wantOK  bool
		wantRef InputRef // the key is this input's
	}{
		{
			reason: "a PVC's key: core group, its kind, namespace, name and UID",
			res:    pvcRes, input: object("v1", "PersistentVolumeClaim", "ns", "a", "ua"),
			want: kA, wantOK: true, wantRef: refA,
		},
		{
			reason: "a cache object without its type is keyed by its resource's kind",
			res:    pvcRes, input: object("", "", "ns", "b", "ub"),
			want: kB, wantOK: true, wantRef: refB,
		},
		{
			reason: "the resource's group is part of the key",
			res:    classRes, input: object("storage.k8s.io/v1", "StorageClass", "", "fast", "u"),
			want: InputRef{Group: "storage.k8s.io", Kind: "StorageClass", Name: "fast", UID: "u"}.Key(), wantOK: true,
			wantRef: InputRef{Group: "storage.k8s.io", Kind: "StorageClass", Name: "fast", UID: "u"},
		},
		{
			reason: "no UID yet: no key (a recreated input must not inherit outputs)",
			res:    pvcRes, input: object("v1", "PersistentVolumeClaim", "ns", "a", ""),
		},
	}
	for _, c := range cases {
		t.Run(c.reason, func(t *testing.T) {
			key, ok := rules.InputKey(c.res, c.input)
			if diff := cmp.Diff([]any{c.want, c.wantOK}, []any{key, ok}); diff != "" {
				t.Errorf("key (-want +got):\n%s", diff)
			}
			if !c.wantOK {
				return
			}
			ref, err := InputRefOf(c.res.APIVersion(), c.res.Kind, c.input)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(c.wantRef, ref); diff != "" {
				t.Errorf("input ref (-want +got):\n%s", diff)
			}
			if key != ref.Key() {
				t.Errorf("key %s is not InputRefOf(...).Key() %s", key, ref.Key())
			}
		})
	}
}

func TestKeyedRulesInputSelector(t *testing.T) {
	_, _, rules := twoByTwoRules(t)
	selector := func(sel any) func(*unstructured.Unstructured) { return withField(sel, "spec", "selector") }
	app := map[string]string{"app": "db"}
	candidates := []*unstructured.Unstructured{
		object("v1", "PersistentVolumeClaim", "ns", "db", "1", withLabels(app)),
		object("v1", "PersistentVolumeClaim", "ns", "web", "2", withLabels(map[string]string{"app": "web"})),
		object("v1", "PersistentVolumeClaim", "other", "db", "3", withLabels(app)),
		object("v1", "ConfigMap", "ns", "own-output", "4", withLabels(app), controlledBy("p-uid")),
	}
	cases := []struct {
		reason        string
		parent        *unstructured.Unstructured
		wantNamespace string
		want          []string
		wantErr       string
	}{
		{
			reason: "a namespaced parent's selector: its namespace, matching labels, not its own outputs",
			parent: scheduleParent("ns", selector(map[string]any{"matchLabels": map[string]any{"app": "db"}})), wantNamespace: "ns",
			want: []string{"ns/db"},
		},
		{
			reason: "a cluster-scoped parent without selector: every namespace",
			parent: object("ctl.example.com/v1", "Schedule", "", "p", "p-uid"),
			want:   []string{"ns/db", "ns/web", "other/db"},
		},
		{
			reason:  "a selector that is no label selector fails (rather than mapping everything)",
			parent:  scheduleParent("ns", selector("app=db")),
			wantErr: "spec.selector of ns/p is not a label selector",
		},
		{
			reason:  "a selector that does not parse fails",
			parent:  scheduleParent("ns", selector(map[string]any{"matchExpressions": []any{map[string]any{"key": "app", "operator": "Bogus"}}})),
			wantErr: `spec.selector of ns/p: "Bogus" is not a valid label selector operator`,
		},
	}
	for _, c := range cases {
		t.Run(c.reason, func(t *testing.T) {
			sel, err := rules.InputSelector(c.parent)
			if c.wantErr != "" {
				if err == nil || !strings.HasPrefix(err.Error(), c.wantErr) {
					t.Fatalf("error %v, want one starting with %q", err, c.wantErr)
				}
				if sel != nil {
					t.Errorf("selector %#v with the error, want nil (the parent selects nothing)", sel)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, o := range candidates {
				if sel.Selects(o) {
					got = append(got, objName(o))
				}
			}
			if diff := cmp.Diff(c.want, got); diff != "" {
				t.Errorf("selected (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(c.wantNamespace, sel.Namespace()); diff != "" {
				t.Errorf("namespace (-want +got):\n%s", diff)
			}
		})
	}
}

func TestKeyedRulesOutputKey(t *testing.T) {
	_, _, rules := twoByTwoRules(t)
	cases := []struct {
		reason string
		owned  *unstructured.Unstructured
		want   string
		wantOK bool
	}{
		{reason: "an output's key label", owned: snap("a-1", kA), want: kA, wantOK: true},
		{reason: "another key", owned: cm("b-cm", kB), want: kB, wantOK: true},
		{reason: "no label: no key (only counted)", owned: object("v1", "ConfigMap", "ns", "hand-made", "")},
		{reason: "a hand-edited label is no key", owned: cm("edited", "mine"), want: "mine"},
	}
	for _, c := range cases {
		t.Run(c.reason, func(t *testing.T) {
			key, ok := rules.OutputKey(c.owned)
			if diff := cmp.Diff([]any{c.want, c.wantOK}, []any{key, ok}); diff != "" {
				t.Errorf("key (-want +got):\n%s", diff)
			}
		})
	}
}

func TestKeyedRulesSummarize(t *testing.T) {
	_, _, rules := twoByTwoRules(t)
	pvcGroup := func(objs ...*unstructured.Unstructured) snapshot.Group {
		return snapshot.Group{APIVersion: "v1", Resource: "persistentvolumeclaims", Kind: "PersistentVolumeClaim", Namespaced: true, Objects: objs}
	}
	cmGroup := func(objs ...*unstructured.Unstructured) snapshot.Group {
		return snapshot.Group{APIVersion: "v1", Resource: "configmaps", Kind: "ConfigMap", Namespaced: true, Objects: objs}
	}
	ready := withField([]any{map[string]any{"type": "Ready", "status": "True"}}, "status", "conditions")
	cases := []struct {
		reason  string
		parent  *unstructured.Unstructured
		inputs  []snapshot.Group
		outputs []snapshot.Group
		want    map[string]any
	}{
		{
			reason:  "the parent's generation and the counts of its inputs and outputs",
			parent:  scheduleParent("ns", withField(int64(7), "metadata", "generation")),
			inputs:  []snapshot.Group{pvcGroup(object("v1", "PersistentVolumeClaim", "ns", "a", "ua"), object("v1", "PersistentVolumeClaim", "ns", "b", "ub")), cmGroup()},
			outputs: outputGroups([]*unstructured.Unstructured{snap("a-1", kA, ready), snap("b-1", kB)}, nil),
			want: map[string]any{
				"observedGeneration": int64(7),
				"inputs":             map[string]any{"persistentvolumeclaims": map[string]any{"total": int64(2)}, "configmaps": map[string]any{"total": int64(0)}},
				"outputs": map[string]any{
					"volumesnapshots": map[string]any{"total": int64(2), "ready": int64(1)},
					"configmaps":      map[string]any{"total": int64(0)},
				},
			},
		},
		{
			reason:  "a parent without a generation",
			parent:  scheduleParent("ns"),
			inputs:  []snapshot.Group{pvcGroup(), cmGroup()},
			outputs: outputGroups(nil, nil),
			want: map[string]any{
				"observedGeneration": int64(0),
				"inputs":             map[string]any{"persistentvolumeclaims": map[string]any{"total": int64(0)}, "configmaps": map[string]any{"total": int64(0)}},
				"outputs":            map[string]any{"volumesnapshots": map[string]any{"total": int64(0)}, "configmaps": map[string]any{"total": int64(0)}},
			},
		},
	}
	for _, c := range cases {
		t.Run(c.reason, func(t *testing.T) {
			got := rules.Summarize(c.parent, c.inputs, c.outputs)
			if diff := cmp.Diff(c.want, got); diff != "" {
				t.Errorf("summary (-want +got):\n%s", diff)
			}
			agg := Aggregate(Observed{Generation: c.parent.GetGeneration(), Inputs: c.inputs, Outputs: c.outputs})
			if diff := cmp.Diff(agg, got); diff != "" {
				t.Errorf("summary is not Aggregate (-want +got):\n%s", diff)
			}
		})
	}
}
