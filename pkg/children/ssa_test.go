package children

import (
	"fmt"
	"slices"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/metabus/metabus/pkg/api/v1alpha1"
	"github.com/metabus/metabus/pkg/apply"
)

var ssaOptions = Options{Strategy: apply.ServerSideApply}

// ssaSummary is summary with the server-side apply flags.
func ssaSummary(actions []Action) []string {
	out := summary(actions)
	for i, a := range actions {
		if a.Verify != nil {
			out[i] += " verify"
		}
		if a.Settled {
			out[i] += " settled"
		}
		if a.DropLastApplied {
			out[i] += " drop-last-applied"
		}
		if a.Op == OpApply && a.Observed == nil {
			out[i] += " creates"
		}
	}
	return out
}

// appliedLive is live for children a server-side apply created: no
// last-applied annotation.
func appliedLive(t *testing.T, owner Owner, rules []Rule, desired []Desired) map[int][]*unstructured.Unstructured {
	t.Helper()
	observed := live(t, owner, rules, desired)
	for _, objs := range observed {
		for _, o := range objs {
			ann := o.GetAnnotations()
			delete(ann, apply.LastAppliedAnnotation)
			o.SetAnnotations(ann)
		}
	}
	return observed
}

func TestPlanServerSideApply(t *testing.T) {
	methods := []v1alpha1.ChildUpdateMethod{"", v1alpha1.ChildUpdateInPlace, v1alpha1.ChildUpdateRecreate,
		v1alpha1.ChildUpdateRollingInPlace, v1alpha1.ChildUpdateRollingRecreate}
	cases := []struct {
		reason string
		// dynamic: the children were written by dynamic apply (they carry its annotation).
		dynamic bool
		mutate  func(t *testing.T, desired []*unstructured.Unstructured, observed map[int][]*unstructured.Unstructured) []*unstructured.Unstructured
		want    map[v1alpha1.ChildUpdateMethod][]string
	}{
		{
			reason: "unchanged values: a settled apply (ownership only) for InPlace, a settled dry run for Recreate, nothing for OnDelete",
			mutate: func(t *testing.T, d []*unstructured.Unstructured, _ map[int][]*unstructured.Unstructured) []*unstructured.Unstructured {
				return d
			},
			want: map[v1alpha1.ChildUpdateMethod][]string{
				v1alpha1.ChildUpdateInPlace: {"Apply Pod ns/web-0 (settled (ownership only)) settled",
					"Apply ConfigMap ns/cfg (settled (ownership only)) settled"},
				v1alpha1.ChildUpdateRollingInPlace: {"Apply Pod ns/web-0 (settled (ownership only)) settled",
					"Apply ConfigMap ns/cfg (settled (ownership only)) settled"},
				v1alpha1.ChildUpdateRecreate: {"Delete Pod ns/web-0 (settled (ownership only)) verify settled",
					"Delete ConfigMap ns/cfg (settled (ownership only)) verify settled"},
				v1alpha1.ChildUpdateRollingRecreate: {"Delete Pod ns/web-0 (settled (ownership only)) verify settled",
					"Delete ConfigMap ns/cfg (settled (ownership only)) verify settled"},
			},
		},
		{
			reason: "a changed value: InPlace applies, Recreate deletes once its dry run confirms",
			mutate: func(t *testing.T, d []*unstructured.Unstructured, _ map[int][]*unstructured.Unstructured) []*unstructured.Unstructured {
				d[0] = pod(t, "web-0", "img:v2")
				return d[:1]
			},
			want: map[v1alpha1.ChildUpdateMethod][]string{
				"":                                  {"Delete ConfigMap ns/cfg (not desired)"},
				v1alpha1.ChildUpdateInPlace:         {"Delete ConfigMap ns/cfg (not desired)", "Apply Pod ns/web-0 (changed (InPlace))"},
				v1alpha1.ChildUpdateRollingInPlace:  {"Delete ConfigMap ns/cfg (not desired)", "Apply Pod ns/web-0 (changed (InPlace))"},
				v1alpha1.ChildUpdateRecreate:        {"Delete Pod ns/web-0 (changed (Recreate)) verify", "Delete ConfigMap ns/cfg (not desired)"},
				v1alpha1.ChildUpdateRollingRecreate: {"Delete Pod ns/web-0 (changed (Recreate)) verify", "Delete ConfigMap ns/cfg (not desired)"},
			},
		},
		{
			reason:  "children dynamic apply wrote: InPlace drops its annotation with the apply (as upstream), Recreate never recreates for it",
			dynamic: true,
			mutate: func(t *testing.T, d []*unstructured.Unstructured, _ map[int][]*unstructured.Unstructured) []*unstructured.Unstructured {
				return d[1:]
			},
			want: map[v1alpha1.ChildUpdateMethod][]string{
				"":                                  {"Delete Pod ns/web-0 (not desired)"},
				v1alpha1.ChildUpdateInPlace:         {"Delete Pod ns/web-0 (not desired)", "Apply ConfigMap ns/cfg (changed (InPlace)) drop-last-applied"},
				v1alpha1.ChildUpdateRollingInPlace:  {"Delete Pod ns/web-0 (not desired)", "Apply ConfigMap ns/cfg (changed (InPlace)) drop-last-applied"},
				v1alpha1.ChildUpdateRecreate:        {"Delete Pod ns/web-0 (not desired)", "Delete ConfigMap ns/cfg (settled (ownership only)) verify settled"},
				v1alpha1.ChildUpdateRollingRecreate: {"Delete Pod ns/web-0 (not desired)", "Delete ConfigMap ns/cfg (settled (ownership only)) verify settled"},
			},
		},
		{
			reason: "a missing child is created by an apply; one being deleted is left alone",
			mutate: func(t *testing.T, d []*unstructured.Unstructured, o map[int][]*unstructured.Unstructured) []*unstructured.Unstructured {
				delete(o, 1)
				markDeleting(o[0]...)
				d[0] = pod(t, "web-0", "img:v2")
				return d
			},
			want: map[v1alpha1.ChildUpdateMethod][]string{
				"":                                  {"Apply ConfigMap ns/cfg (missing) creates"},
				v1alpha1.ChildUpdateInPlace:         {"Apply ConfigMap ns/cfg (missing) creates"},
				v1alpha1.ChildUpdateRollingInPlace:  {"Apply ConfigMap ns/cfg (missing) creates"},
				v1alpha1.ChildUpdateRecreate:        {"Apply ConfigMap ns/cfg (missing) creates"},
				v1alpha1.ChildUpdateRollingRecreate: {"Apply ConfigMap ns/cfg (missing) creates"},
			},
		},
	}
	for _, c := range cases {
		for _, m := range methods {
			t.Run(fmt.Sprintf("%s/%q", c.reason, m), func(t *testing.T) {
				owner, rules := nsOwner(), testRules(m)
				first := normalized(t, owner, rules, pod(t, "web-0", "img:v1"), configMap(t, "cfg", "1"))
				observed := appliedLive(t, owner, rules, first)
				if c.dynamic {
					observed = live(t, owner, rules, first)
				}
				again := c.mutate(t, []*unstructured.Unstructured{pod(t, "web-0", "img:v1"), configMap(t, "cfg", "1")}, observed)
				desired := normalized(t, owner, rules, again...)
				before := toJSON(t, observed) + toJSON(t, desired)
				actions, err := PlanWith(ssaOptions, owner, rules, observed, desired)
				if err != nil {
					t.Fatalf("PlanWith: %v", err)
				}
				if after := toJSON(t, observed) + toJSON(t, desired); after != before {
					t.Error("PlanWith mutated its input")
				}
				if got, want := ssaSummary(actions), c.want[m]; !slices.Equal(got, want) {
					t.Errorf("got %q\nwant %q", got, want)
				}
				for _, a := range actions {
					checkApplyAction(t, a)
				}
			})
		}
	}
}

// checkApplyAction checks what an apply sends: the hook's object and the
// controller reference, nothing of dynamic apply's or the API server's.
func checkApplyAction(t *testing.T, a Action) {
	t.Helper()
	cfg := a.Object
	if a.Op == OpDelete {
		cfg = a.Verify
	}
	if cfg == nil {
		return
	}
	if !IsOwnedBy(cfg, nsOwner()) {
		t.Errorf("%s configuration lacks the controller reference", a.Op)
	}
	if _, ok := cfg.GetAnnotations()[apply.LastAppliedAnnotation]; ok {
		t.Errorf("%s configuration carries the last-applied annotation", a.Op)
	}
	if cfg.GetResourceVersion() != "" || cfg.GetUID() != "" || cfg.Object["status"] != nil {
		t.Errorf("%s configuration carries server-owned fields: %v", a.Op, cfg.Object)
	}
	if a.Op == OpApply && a.Observed != nil && a.Observed.GetResourceVersion() != "100" {
		t.Errorf("apply does not carry the observed child (its precondition)")
	}
}

func TestPlanWithUnknownStrategy(t *testing.T) {
	owner, rules := nsOwner(), testRules(v1alpha1.ChildUpdateInPlace)
	if _, err := PlanWith(Options{Strategy: "client-side"}, owner, rules, nil, nil); err == nil {
		t.Error("an unknown strategy was accepted")
	}
}
