package children

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"

	"github.com/metabus/metabus/pkg/api/v1alpha1"
	"github.com/metabus/metabus/pkg/apply"
)

// summary renders actions as "Op Kind ns/name (reason)" for compact comparisons.
func summary(actions []Action) []string {
	out := make([]string, len(actions))
	for i, a := range actions {
		k := a.Key()
		out[i] = fmt.Sprintf("%s %s %s/%s (%s)", a.Op, k.Kind, k.Namespace, k.Name, a.Reason)
	}
	return out
}

func markDeleting(objs ...*unstructured.Unstructured) {
	for _, o := range objs {
		o.Object["metadata"].(map[string]any)["deletionTimestamp"] = "2024-01-02T00:00:00Z"
	}
}

func TestPlanByMethod(t *testing.T) {
	methods := []v1alpha1.ChildUpdateMethod{"", v1alpha1.ChildUpdateOnDelete, v1alpha1.ChildUpdateInPlace,
		v1alpha1.ChildUpdateRecreate, v1alpha1.ChildUpdateRollingInPlace, v1alpha1.ChildUpdateRollingRecreate}
	cases := []struct {
		reason string
		// mutate edits what the hook now returns (after v1 was created) and what is observed.
		mutate func(t *testing.T, desired []*unstructured.Unstructured, observed map[int][]*unstructured.Unstructured) []*unstructured.Unstructured
		want   map[v1alpha1.ChildUpdateMethod][]string // by method; missing = no actions
	}{
		{
			reason: "unchanged re-apply: server-side fields, defaults and others' fields are no change",
			mutate: func(t *testing.T, d []*unstructured.Unstructured, _ map[int][]*unstructured.Unstructured) []*unstructured.Unstructured {
				return d
			},
		},
		{
			reason: "changed spec: OnDelete leaves it, InPlace updates, Recreate deletes",
			mutate: func(t *testing.T, d []*unstructured.Unstructured, _ map[int][]*unstructured.Unstructured) []*unstructured.Unstructured {
				d[0] = pod(t, "web-0", "img:v2")
				return d
			},
			want: map[v1alpha1.ChildUpdateMethod][]string{
				v1alpha1.ChildUpdateInPlace:         {"Update Pod ns/web-0 (changed (InPlace))"},
				v1alpha1.ChildUpdateRollingInPlace:  {"Update Pod ns/web-0 (changed (InPlace))"},
				v1alpha1.ChildUpdateRecreate:        {"Delete Pod ns/web-0 (changed (Recreate))"},
				v1alpha1.ChildUpdateRollingRecreate: {"Delete Pod ns/web-0 (changed (Recreate))"},
			},
		},
		{
			reason: "a field the hook stops sending is removed (it was last-applied)",
			mutate: func(t *testing.T, d []*unstructured.Unstructured, _ map[int][]*unstructured.Unstructured) []*unstructured.Unstructured {
				delete(d[1].Object, "data")
				return d
			},
			want: map[v1alpha1.ChildUpdateMethod][]string{
				v1alpha1.ChildUpdateInPlace:         {"Update ConfigMap ns/cfg (changed (InPlace))"},
				v1alpha1.ChildUpdateRollingInPlace:  {"Update ConfigMap ns/cfg (changed (InPlace))"},
				v1alpha1.ChildUpdateRecreate:        {"Delete ConfigMap ns/cfg (changed (Recreate))"},
				v1alpha1.ChildUpdateRollingRecreate: {"Delete ConfigMap ns/cfg (changed (Recreate))"},
			},
		},
		{
			reason: "children with the desired values but no annotation (server-side apply wrote them): recorded in place, a Recreate child is never recreated for it",
			mutate: func(t *testing.T, d []*unstructured.Unstructured, o map[int][]*unstructured.Unstructured) []*unstructured.Unstructured {
				ann := o[1][0].GetAnnotations()
				delete(ann, apply.LastAppliedAnnotation)
				o[1][0].SetAnnotations(ann)
				return d
			},
			want: map[v1alpha1.ChildUpdateMethod][]string{
				v1alpha1.ChildUpdateInPlace:         {"Update ConfigMap ns/cfg (changed (InPlace))"},
				v1alpha1.ChildUpdateRollingInPlace:  {"Update ConfigMap ns/cfg (changed (InPlace))"},
				v1alpha1.ChildUpdateRecreate:        {"Update ConfigMap ns/cfg (record last-applied (Recreate))"},
				v1alpha1.ChildUpdateRollingRecreate: {"Update ConfigMap ns/cfg (record last-applied (Recreate))"},
			},
		},
		{
			reason: "children being deleted are never updated, deleted again or recreated",
			mutate: func(t *testing.T, d []*unstructured.Unstructured, o map[int][]*unstructured.Unstructured) []*unstructured.Unstructured {
				markDeleting(o[0][0], o[1][0])
				d[0] = pod(t, "web-0", "img:v2")
				return d[:1] // cfg no longer desired, but already going away
			},
		},
		{
			reason: "undesired children are deleted whatever the method",
			mutate: func(t *testing.T, d []*unstructured.Unstructured, _ map[int][]*unstructured.Unstructured) []*unstructured.Unstructured {
				return d[:1]
			},
			want: map[v1alpha1.ChildUpdateMethod][]string{
				"": {"Delete ConfigMap ns/cfg (not desired)"}, v1alpha1.ChildUpdateOnDelete: {"Delete ConfigMap ns/cfg (not desired)"},
				v1alpha1.ChildUpdateInPlace: {"Delete ConfigMap ns/cfg (not desired)"}, v1alpha1.ChildUpdateRecreate: {"Delete ConfigMap ns/cfg (not desired)"},
				v1alpha1.ChildUpdateRollingInPlace: {"Delete ConfigMap ns/cfg (not desired)"}, v1alpha1.ChildUpdateRollingRecreate: {"Delete ConfigMap ns/cfg (not desired)"},
			},
		},
		{
			reason: "a child someone else deleted is created again",
			mutate: func(t *testing.T, d []*unstructured.Unstructured, o map[int][]*unstructured.Unstructured) []*unstructured.Unstructured {
				delete(o, 1)
				return d
			},
			want: map[v1alpha1.ChildUpdateMethod][]string{
				"": {"Create ConfigMap ns/cfg (missing)"}, v1alpha1.ChildUpdateOnDelete: {"Create ConfigMap ns/cfg (missing)"},
				v1alpha1.ChildUpdateInPlace: {"Create ConfigMap ns/cfg (missing)"}, v1alpha1.ChildUpdateRecreate: {"Create ConfigMap ns/cfg (missing)"},
				v1alpha1.ChildUpdateRollingInPlace: {"Create ConfigMap ns/cfg (missing)"}, v1alpha1.ChildUpdateRollingRecreate: {"Create ConfigMap ns/cfg (missing)"},
			},
		},
		{
			reason: "observed objects controlled by someone else are ignored (never deleted or updated)",
			mutate: func(t *testing.T, d []*unstructured.Unstructured, o map[int][]*unstructured.Unstructured) []*unstructured.Unstructured {
				for _, obj := range o[1] {
					refs := obj.GetOwnerReferences()
					refs[0].UID = "someone-else"
					obj.SetOwnerReferences(refs)
				}
				d[0] = pod(t, "web-0", "img:v2")
				return d[:1]
			},
			want: map[v1alpha1.ChildUpdateMethod][]string{
				v1alpha1.ChildUpdateInPlace:         {"Update Pod ns/web-0 (changed (InPlace))"},
				v1alpha1.ChildUpdateRollingInPlace:  {"Update Pod ns/web-0 (changed (InPlace))"},
				v1alpha1.ChildUpdateRecreate:        {"Delete Pod ns/web-0 (changed (Recreate))"},
				v1alpha1.ChildUpdateRollingRecreate: {"Delete Pod ns/web-0 (changed (Recreate))"},
			},
		},
	}
	for _, c := range cases {
		for _, m := range methods {
			t.Run(fmt.Sprintf("%s/%q", c.reason, m), func(t *testing.T) {
				owner, rules := nsOwner(), testRules(m)
				first := []*unstructured.Unstructured{pod(t, "web-0", "img:v1"), configMap(t, "cfg", "1")}
				observed := live(t, owner, rules, normalized(t, owner, rules, first...))
				again := c.mutate(t, []*unstructured.Unstructured{pod(t, "web-0", "img:v1"), configMap(t, "cfg", "1")}, observed)
				desired := normalized(t, owner, rules, again...)

				before := toJSON(t, observed) + toJSON(t, desired)
				actions, err := Plan(owner, rules, observed, desired)
				if err != nil {
					t.Fatalf("Plan: %v", err)
				}
				if after := toJSON(t, observed) + toJSON(t, desired); after != before {
					t.Error("Plan mutated its input")
				}
				if got, want := summary(actions), c.want[m]; !slices.Equal(got, want) {
					t.Errorf("got %q\nwant %q", got, want)
				}
				for _, a := range actions {
					checkActionObject(t, a, observed)
				}
			})
		}
	}
}

// checkActionObject checks what each op must carry.
func checkActionObject(t *testing.T, a Action, observed map[int][]*unstructured.Unstructured) {
	t.Helper()
	switch a.Op {
	case OpUpdate:
		if a.Object.GetResourceVersion() != "100" || a.Object.GetUID() == "" {
			t.Errorf("update lacks the observed resourceVersion/uid: %v", a.Object.Object["metadata"])
		}
		if a.Object.GetAnnotations()["other.example.com/touched"] != "yes" {
			t.Error("update dropped another actor's annotation")
		}
		if !IsOwnedBy(a.Object, nsOwner()) {
			t.Error("update dropped the controller reference")
		}
		if a.Object.GetKind() == "Pod" {
			if img := a.Object.Object["spec"].(map[string]any)["containers"].([]any)[0].(map[string]any)["image"]; img != "img:v2" {
				t.Errorf("update image = %v", img)
			}
		}
	case OpDelete:
		found := false
		for _, objs := range observed {
			for _, o := range objs {
				found = found || o == a.Object
			}
		}
		if !found {
			t.Error("delete does not carry the observed object (its UID is the precondition)")
		}
	}
}

func TestPlanCreate(t *testing.T) {
	owner, rules := nsOwner(), testRules(v1alpha1.ChildUpdateInPlace)
	hookRefs := decode(t, `{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"with-refs","labels":{"app":"web"},"ownerReferences":[
		{"apiVersion":"example.com/v1","kind":"Other","name":"o","uid":"other-uid"},
		{"apiVersion":"example.com/v1","kind":"Thing","name":"web","uid":"`+ownerUID+`"}]},"data":{"k":"v"}}`)
	desired := normalized(t, owner, rules, pod(t, "web-0", "img"), hookRefs)
	in := toJSON(t, desired)

	actions, err := Plan(owner, rules, nil, desired)
	if err != nil {
		t.Fatal(err)
	}
	if toJSON(t, desired) != in {
		t.Error("Plan mutated desired")
	}
	if got := summary(actions); !slices.Equal(got, []string{"Create Pod ns/web-0 (missing)", "Create ConfigMap ns/with-refs (missing)"}) {
		t.Fatalf("got %q", got)
	}
	wantRef := ControllerRef(owner)
	cases := []struct {
		reason   string
		action   Action
		wantRefs []string // UIDs in order
		hookRefs int      // references the hook sent, which the annotation records
	}{
		{"plain child gets exactly the controller reference", actions[0], []string{ownerUID}, 0},
		{"hook references are kept; the hook's own reference to the owner is replaced, not duplicated", actions[1], []string{"other-uid", ownerUID}, 2},
	}
	for _, c := range cases {
		obj := c.action.Object
		if obj == desired[0].Object || obj == desired[1].Object {
			t.Errorf("%s: create object is not a copy", c.reason)
		}
		refs := obj.GetOwnerReferences()
		var uids []string
		for _, r := range refs {
			uids = append(uids, string(r.UID))
		}
		if !slices.Equal(uids, c.wantRefs) {
			t.Errorf("%s: ownerReferences UIDs %v, want %v", c.reason, uids, c.wantRefs)
			continue
		}
		if got := refs[len(refs)-1]; toJSON(t, got) != toJSON(t, wantRef) {
			t.Errorf("%s: controller reference %s, want %s", c.reason, toJSON(t, got), toJSON(t, wantRef))
		}
		last, err := apply.GetLastApplied(obj)
		if err != nil || last == nil {
			t.Fatalf("%s: last-applied annotation: %v, %v", c.reason, last, err)
		}
		// The annotation records what the hook asked for, not metabus's own reference.
		if n := len(refsIn(last)); n != c.hookRefs {
			t.Errorf("%s: last-applied carries %d ownerReferences, want the hook's %d", c.reason, n, c.hookRefs)
		}
		if last["metadata"].(map[string]any)["namespace"] != "ns" {
			t.Errorf("%s: last-applied lacks the defaulted namespace", c.reason)
		}
	}
}

func refsIn(obj map[string]any) []any {
	refs, _ := obj["metadata"].(map[string]any)["ownerReferences"].([]any)
	return refs
}

// TestPlanEchoedServerFields: a hook that sends server-owned fields and status (for example by
// copying an object it observed) can still create the child, and re-sending them is no change.
func TestPlanEchoedServerFields(t *testing.T) {
	owner, rules := nsOwner(), testRules(v1alpha1.ChildUpdateInPlace)
	mk := func() *unstructured.Unstructured {
		p := pod(t, "web-0", "img")
		p.SetResourceVersion("1")
		p.SetUID("stale-uid")
		p.Object["metadata"].(map[string]any)["creationTimestamp"] = "2020-01-01T00:00:00Z"
		p.Object["status"] = map[string]any{"phase": "Pending"}
		return p
	}
	desired := normalized(t, owner, rules, mk())
	actions, err := Plan(owner, rules, nil, desired)
	if err != nil || len(actions) != 1 {
		t.Fatalf("got %q, %v", summary(actions), err)
	}
	meta := actions[0].Object.Object["metadata"].(map[string]any)
	for _, f := range []string{"resourceVersion", "uid", "creationTimestamp"} {
		if _, has := meta[f]; has {
			t.Errorf("create object carries server-owned %s", f)
		}
	}
	if toJSON(t, desired[0].Object.GetResourceVersion()) != `"1"` {
		t.Error("Plan mutated desired")
	}
	observed := live(t, owner, rules, desired)
	actions, err = Plan(owner, rules, observed, normalized(t, owner, rules, mk()))
	if err != nil || len(actions) != 0 {
		t.Fatalf("re-sending the same echoed fields: got %q, %v; want no actions", summary(actions), err)
	}
}

// TestPlanHookOwnerRefsStable: a child created with hook-provided references is unchanged on
// the next sync (the added controller reference must not look like drift).
func TestPlanHookOwnerRefsStable(t *testing.T) {
	owner, rules := nsOwner(), testRules(v1alpha1.ChildUpdateInPlace)
	mk := func() *unstructured.Unstructured {
		return decode(t, `{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"c","labels":{"app":"web"},"ownerReferences":[
			{"apiVersion":"example.com/v1","kind":"Other","name":"o","uid":"other-uid"},
			{"apiVersion":"example.com/v1","kind":"Thing","name":"web","uid":"`+ownerUID+`"}]}}`)
	}
	observed := live(t, owner, rules, normalized(t, owner, rules, mk()))
	actions, err := Plan(owner, rules, observed, normalized(t, owner, rules, mk()))
	if err != nil || len(actions) != 0 {
		t.Fatalf("got %q, %v; want no actions", summary(actions), err)
	}
}

func TestPlanDeterministicOrder(t *testing.T) {
	owner, rules := nsOwner(), testRules(v1alpha1.ChildUpdateInPlace)
	var old []*unstructured.Unstructured
	for _, n := range []string{"p-b", "p-a", "p-c", "p-gone-2", "p-gone-1"} {
		old = append(old, pod(t, n, "v1"))
	}
	old = append(old, configMap(t, "c-b", "1"), configMap(t, "c-a", "1"), configMap(t, "c-gone", "1"))
	observed := live(t, owner, rules, normalized(t, owner, rules, old...))

	next := []*unstructured.Unstructured{
		configMap(t, "c-new", "1"), pod(t, "p-c", "v2"), configMap(t, "c-b", "2"), pod(t, "p-new-2", "v1"),
		pod(t, "p-a", "v2"), configMap(t, "c-a", "2"), pod(t, "p-b", "v1"), pod(t, "p-new-1", "v1"),
	}
	want := []string{
		"Delete Pod ns/p-gone-1 (not desired)", "Delete Pod ns/p-gone-2 (not desired)", "Delete ConfigMap ns/c-gone (not desired)",
		"Create Pod ns/p-new-1 (missing)", "Create Pod ns/p-new-2 (missing)", "Create ConfigMap ns/c-new (missing)",
		"Update Pod ns/p-a (changed (InPlace))", "Update Pod ns/p-c (changed (InPlace))",
		"Update ConfigMap ns/c-a (changed (InPlace))", "Update ConfigMap ns/c-b (changed (InPlace))",
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for round := range 5 {
		// Shuffle both the hook's order and the cache's order: the plan must not depend on them.
		rng.Shuffle(len(next), func(i, j int) { next[i], next[j] = next[j], next[i] })
		for _, objs := range observed {
			rng.Shuffle(len(objs), func(i, j int) { objs[i], objs[j] = objs[j], objs[i] })
		}
		actions, err := Plan(owner, rules, observed, normalized(t, owner, rules, next...))
		if err != nil {
			t.Fatal(err)
		}
		if got := summary(actions); !slices.Equal(got, want) {
			t.Fatalf("round %d:\n got %q\nwant %q", round, got, want)
		}
	}
}

func TestPlanClusterScopedOwner(t *testing.T) {
	owner, rules := clusterOwner(), testRules(v1alpha1.ChildUpdateRecreate)
	mk := func(ns, v string) *unstructured.Unstructured {
		c := configMap(t, "cfg", v)
		c.SetNamespace(ns)
		return c
	}
	role := func() *unstructured.Unstructured {
		return decode(t, `{"apiVersion":"rbac.authorization.k8s.io/v1","kind":"ClusterRole","metadata":{"name":"r"},"rules":[]}`)
	}
	observed := live(t, owner, rules, normalized(t, owner, rules, mk("x", "1"), mk("y", "1"), role()))
	actions, err := Plan(owner, rules, observed, normalized(t, owner, rules, mk("y", "2"), role(), mk("z", "1")))
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"Delete ConfigMap x/cfg (not desired)", "Delete ConfigMap y/cfg (changed (Recreate))", "Create ConfigMap z/cfg (missing)"}
	if got := summary(actions); !slices.Equal(got, want) {
		t.Errorf("got %q\nwant %q", got, want)
	}
}

func TestPlanErrors(t *testing.T) {
	owner, rules := nsOwner(), testRules(v1alpha1.ChildUpdateInPlace)
	noUID := owner
	noUID.UID = ""
	good := normalized(t, owner, rules, pod(t, "a", "img"))
	strangerRule := Rule{APIVersion: "v1", Kind: "Secret", Namespaced: true}
	cases := []struct {
		reason   string
		owner    Owner
		observed map[int][]*unstructured.Unstructured
		desired  []Desired
		want     string
	}{
		{"owner without UID cannot be referenced", noUID, nil, good, "has no UID"},
		{"observed group for an undeclared rule", owner, map[int][]*unstructured.Unstructured{7: nil}, good, "observed children for rule 7"},
		{"desired entry for a rule not in rules", owner, nil, []Desired{{Rule: &strangerRule, Object: pod(t, "a", "img")}}, "matches no rule"},
		{"desired entry without object", owner, nil, []Desired{{Rule: &rules[0]}}, "has no rule or no object"},
		{"duplicate desired entries", owner, nil, append(slices.Clone(good), good...), "duplicates Pod.v1 ns/a"},
	}
	for _, c := range cases {
		actions, err := Plan(c.owner, rules, c.observed, c.desired)
		if err == nil || !strings.Contains(err.Error(), c.want) || actions != nil {
			t.Errorf("%s: got %v, %v; want no actions and an error containing %q", c.reason, actions, err, c.want)
		}
	}
}

// TestPlanMatchesRulesByType: desired entries holding a copy of the rule (not a pointer into
// rules) still work, and actions point into the given rules.
func TestPlanMatchesRulesByType(t *testing.T) {
	owner, rules := nsOwner(), testRules("")
	copied := rules[1]
	actions, err := Plan(owner, rules, nil, []Desired{{Rule: &copied, Object: normalized(t, owner, rules, configMap(t, "c", "1"))[0].Object}})
	if err != nil || len(actions) != 1 || actions[0].Rule != &rules[1] {
		t.Fatalf("got %v, %v", actions, err)
	}
}

// TestPlanPartialFailure: a child that cannot be planned is reported, and the other children
// still get their actions, as upstream keeps going past individual failures.
func TestPlanPartialFailure(t *testing.T) {
	owner, rules := nsOwner(), testRules(v1alpha1.ChildUpdateInPlace)
	observed := live(t, owner, rules, normalized(t, owner, rules, pod(t, "a", "v1"), pod(t, "b", "v1")))
	observed[0][0].Object["spec"] = make(chan int) // not JSON: apply refuses it
	dup := observed[0][1].DeepCopy()
	observed[0] = append(observed[0], dup, nil, &unstructured.Unstructured{})

	actions, err := Plan(owner, rules, observed, normalized(t, owner, rules, pod(t, "a", "v2"), pod(t, "b", "v2"), pod(t, "c", "v1")))
	if err == nil || !strings.Contains(err.Error(), "computing update") || !strings.Contains(err.Error(), "observed twice") {
		t.Errorf("error %v should report the unplannable child and the duplicate", err)
	}
	got := summary(actions)
	want := []string{"Create Pod ns/c (missing)", "Update Pod ns/b (changed (InPlace))"}
	if !slices.Equal(got, want) {
		t.Errorf("got %q, want %q", got, want)
	}
}

func TestIsOwnedBy(t *testing.T) {
	owner := nsOwner()
	yes, no := true, false
	ref := func(apiVersion, kind, uid string, controller *bool) metav1.OwnerReference {
		return metav1.OwnerReference{APIVersion: apiVersion, Kind: kind, Name: "web", UID: types.UID(uid), Controller: controller}
	}
	cases := []struct {
		reason string
		refs   []metav1.OwnerReference
		want   bool
	}{
		{"controller reference to the owner", []metav1.OwnerReference{ControllerRef(owner)}, true},
		{"another version of the same group and kind", []metav1.OwnerReference{ref("example.com/v2", "Thing", ownerUID, &yes)}, true},
		{"after other, non-controller references", []metav1.OwnerReference{ref("v1", "Node", "n", nil), ref("example.com/v1", "Thing", ownerUID, &yes)}, true},
		{"no references", nil, false},
		{"non-controller reference", []metav1.OwnerReference{ref("example.com/v1", "Thing", ownerUID, &no)}, false},
		{"controller flag absent", []metav1.OwnerReference{ref("example.com/v1", "Thing", ownerUID, nil)}, false},
		{"other UID", []metav1.OwnerReference{ref("example.com/v1", "Thing", "x", &yes)}, false},
		{"other group", []metav1.OwnerReference{ref("other.com/v1", "Thing", ownerUID, &yes)}, false},
		{"other kind", []metav1.OwnerReference{ref("example.com/v1", "Widget", ownerUID, &yes)}, false},
		{"core group is not example.com", []metav1.OwnerReference{ref("v1", "Thing", ownerUID, &yes)}, false},
	}
	for _, c := range cases {
		obj := &unstructured.Unstructured{Object: map[string]any{}}
		obj.SetOwnerReferences(c.refs)
		if got := IsOwnedBy(obj, owner); got != c.want {
			t.Errorf("%s: IsOwnedBy = %v, want %v", c.reason, got, c.want)
		}
		if got := isOwnedRaw(obj.Object, owner, apiGroup(owner.APIVersion)); got != c.want {
			t.Errorf("%s: isOwnedRaw = %v, want %v (must agree with IsOwnedBy)", c.reason, got, c.want)
		}
	}
	if IsOwnedBy(nil, owner) {
		t.Error("nil object is owned")
	}
	noUID := owner
	noUID.UID = ""
	if IsOwnedBy(&unstructured.Unstructured{Object: map[string]any{}}, noUID) {
		t.Error("an owner without UID owns an object without references")
	}
}

func TestControllerRef(t *testing.T) {
	got := toJSON(t, ControllerRef(nsOwner()))
	want := `{"apiVersion":"example.com/v1","kind":"Thing","name":"web","uid":"` + ownerUID + `","controller":true,"blockOwnerDeletion":true}`
	if got != want {
		t.Errorf("got %s\nwant %s", got, want)
	}
}

func TestActionKey(t *testing.T) {
	rules := testRules("")
	cases := []struct {
		reason string
		a      Action
		want   ChildKey
	}{
		{"namespaced", Action{Rule: &rules[0], Object: pod(t, "p", "i")}, ChildKey{"v1", "Pod", "", "p"}},
		{"cluster-scoped drops a stray namespace", Action{Rule: &rules[2], Object: decode(t, `{"metadata":{"name":"r","namespace":"x"}}`)}, ChildKey{"rbac.authorization.k8s.io/v1", "ClusterRole", "", "r"}},
		{"zero action does not panic", Action{}, ChildKey{}},
	}
	for _, c := range cases {
		if got := c.a.Key(); got != c.want {
			t.Errorf("%s: got %+v, want %+v", c.reason, got, c.want)
		}
	}
}

// BenchmarkPlan100Children measures one sync's planning for 100 unchanged Pod children (the
// steady state of a resync): OnDelete does no merging at all, InPlace (and Recreate, which
// costs the same) runs the 3-way merge for every child.
func BenchmarkPlan100Children(b *testing.B) {
	for _, m := range []v1alpha1.ChildUpdateMethod{v1alpha1.ChildUpdateOnDelete, v1alpha1.ChildUpdateInPlace} {
		b.Run(string(m), func(b *testing.B) {
			owner, rules := nsOwner(), testRules(m)
			var objs []*unstructured.Unstructured
			for i := range 100 {
				objs = append(objs, pod(b, fmt.Sprintf("web-%03d", i), "img:v1"))
			}
			desired := normalized(b, owner, rules, objs...)
			observed := live(b, owner, rules, desired)
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				actions, err := Plan(owner, rules, observed, desired)
				if err != nil || len(actions) != 0 {
					b.Fatalf("got %d actions, %v", len(actions), err)
				}
			}
		})
	}
}
