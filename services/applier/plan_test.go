package applier

import (
	"errors"
	"fmt"
	"maps"
	"testing"

	"github.com/google/go-cmp/cmp"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/metabus/metabus/pkg/apply"
	"github.com/metabus/metabus/pkg/bus"
	"github.com/metabus/metabus/pkg/children"
	"github.com/metabus/metabus/pkg/events"
	"github.com/metabus/metabus/pkg/kinds"
	"github.com/metabus/metabus/pkg/kindtable"
	"github.com/metabus/metabus/pkg/rollout"
	"github.com/metabus/metabus/pkg/snapshot"
)

// describe names a plan's steps, in order.
func describe(steps []step) []string {
	out := []string{}
	for _, s := range steps {
		switch s.Kind {
		case stepPatchParent:
			out = append(out, "patch parent ("+s.Write.verb+")")
		case stepRelease:
			out = append(out, fmt.Sprintf("release %s %s (rule %d)", s.Rule.Kind, key(s.Object), s.RuleIndex))
		case stepRecheckParent:
			out = append(out, "recheck parent")
		case stepAdopt:
			out = append(out, fmt.Sprintf("adopt %s %s (rule %d)", s.Rule.Kind, key(s.Object), s.RuleIndex))
		case stepPlanChildren:
			out = append(out, "plan children")
		case stepRollout:
			out = append(out, "roll out")
		case stepChild:
			out = append(out, fmt.Sprintf("%s %s %s (%s)", s.Action.Op, s.Action.Rule.Kind, key(s.Action.Object), s.Action.Reason))
		case stepStatus:
			what := fmt.Sprintf("%s %v", s.Write.verb, s.Write.status)
			if s.DeferIfCreated {
				what += " unless a child is created"
			}
			out = append(out, what)
		case stepRemoveFinalizer:
			out = append(out, "remove finalizer "+s.Finalizer)
		default:
			out = append(out, fmt.Sprintf("unknown step %d", s.Kind))
		}
	}
	return out
}

// rollingCondition is a rollout's Updated condition.
var rollingCondition = rollout.Condition{Type: "Updated", Status: "True", Reason: "OnLatestRevision"}

func TestPlanApply(t *testing.T) {
	group := func(objs ...*unstructured.Unstructured) []snapshot.Group {
		return []snapshot.Group{{APIVersion: "v1", Resource: "configmaps", Kind: "ConfigMap", Namespaced: true, Objects: objs}}
	}
	claiming := func(objs, adopt, release []*unstructured.Unstructured) []snapshot.Group {
		g := group(objs...)
		g[0].Adopt, g[0].Release = adopt, release
		return g
	}
	cms := func(objs ...*unstructured.Unstructured) []*unstructured.Unstructured { return objs }
	drifted := func(o *unstructured.Unstructured) { o.Object["data"] = map[string]any{"k": "old"} }
	secret := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "v1", "kind": "Secret", "metadata": map[string]any{"name": "s"}}}
	status := func(ready float64) map[string]any { return map[string]any{"ready": ready} }
	tests := []struct {
		reason     string
		controller *unstructured.Unstructured
		parent     *unstructured.Unstructured
		groups     []snapshot.Group
		// summary makes the snapshot a keyed kind's per-parent one.
		summary   bool
		hasStatus bool
		strategy  apply.Strategy
		// covered is what this replica knows its earlier applies cover.
		covered func(children.Action) bool
		ds      bus.DesiredState
		want    []string
		// wantWrites says the whole plan writes something (else: noop).
		wantWrites bool
		// wantErr is the Event reason of a refused plan, wantRejected
		// that it counts as a rejected hook answer.
		wantErr      string
		wantRejected bool
		// then runs the second phase on the plan; wantThen are all its
		// steps afterwards.
		then     func(t *testing.T, p *applyPlan) error
		wantThen []string
	}{
		{
			reason:     "nothing to do: no step at all, not even a read",
			controller: compositeController(false), parent: thing(), groups: group(configMap("a", true)),
			ds:   bus.DesiredState{Hook: "sync", Children: cms(desiredCM("a")), Status: status(1)},
			want: []string{},
		},
		{
			reason:     "a new parent with a finalize hook: the finalizer first, then the children, then the status",
			controller: compositeController(true), parent: thing(), groups: group(),
			ds:         bus.DesiredState{Hook: "sync", Children: cms(desiredCM("a"), desiredCM("b")), Status: status(0)},
			want:       []string{"patch parent (add_finalizer)", "Create ConfigMap ns/a (missing)", "Create ConfigMap ns/b (missing)", "update_status map[observedGeneration:2 ready:0]"},
			wantWrites: true,
		},
		{
			reason:     "a new parent without a finalize hook: no parent patch",
			controller: compositeController(false), parent: thing(), groups: group(),
			ds:         bus.DesiredState{Hook: "sync", Children: cms(desiredCM("a")), Status: status(1)},
			want:       []string{"Create ConfigMap ns/a (missing)"},
			wantWrites: true,
		},
		{
			reason:     "echo suppression (Inputs sent): the status is written only if no child gets created",
			controller: compositeController(false), parent: thing(), groups: group(),
			ds:         bus.DesiredState{Hook: "sync", Children: cms(desiredCM("a")), Status: status(0), Inputs: map[string]string{"uid-web": "1"}},
			want:       []string{"Create ConfigMap ns/a (missing)", "update_status map[observedGeneration:2 ready:0] unless a child is created"},
			wantWrites: true,
		},
		{
			reason:     "an InPlace child that drifted is updated; children are deleted before they are created",
			controller: methodController("InPlace"), parent: thing(), groups: group(configMap("a", true, drifted), configMap("gone", true)),
			ds:         bus.DesiredState{Hook: "sync", Children: cms(desiredCM("a"), desiredCM("new")), Status: status(1)},
			want:       []string{"Delete ConfigMap ns/gone (not desired)", "Create ConfigMap ns/new (missing)", "Update ConfigMap ns/a (changed (InPlace))"},
			wantWrites: true,
		},
		{
			reason:     "an OnDelete child that drifted is left as it is",
			controller: compositeController(false), parent: thing(), groups: group(configMap("a", true, drifted)),
			ds:   bus.DesiredState{Hook: "sync", Children: cms(desiredCM("a")), Status: status(1)},
			want: []string{},
		},
		{
			reason:     "a finalize answer that is done: its writes, the status, then the finalizer removed last",
			controller: compositeController(true), parent: thing(deletingNow, holding(ccFinalizer)), groups: group(configMap("a", true)),
			ds:         bus.DesiredState{Hook: "finalize", Finalized: true, Status: status(0)},
			want:       []string{"Delete ConfigMap ns/a (not desired)", "update_status map[observedGeneration:2 ready:0]", "remove finalizer " + ccFinalizer},
			wantWrites: true,
		},
		{
			reason:     "a finalize answer not done yet keeps the finalizer; its status is never deferred",
			controller: compositeController(true), parent: thing(deletingNow, holding(ccFinalizer)), groups: group(),
			ds:         bus.DesiredState{Hook: "finalize", Children: cms(desiredCM("a")), Status: status(0), Inputs: map[string]string{"uid-web": "1"}},
			want:       []string{"Create ConfigMap ns/a (missing)", "update_status map[observedGeneration:2 ready:0]"},
			wantWrites: true,
		},
		{
			reason:     "claims: every release, then the live recheck and the adoptions; the children are planned once adopted",
			controller: compositeController(false), parent: thing(),
			groups: claiming(cms(configMap("a", true), configMap("orphan", false)), cms(configMap("orphan", false)), cms(configMap("stray", true))),
			ds:     bus.DesiredState{Hook: "sync", Children: cms(desiredCM("a"), desiredCM("orphan"), desiredCM("b")), Status: status(1)},
			want:   []string{"release ConfigMap ns/stray (rule 0)", "recheck parent", "adopt ConfigMap ns/orphan (rule 0)", "plan children"},
			then: func(t *testing.T, p *applyPlan) error {
				if diff := cmp.Diff([]string{"ns/a"}, keys(p.observed[0])); diff != "" {
					t.Errorf("children planned with, before the adoption (-want +got):\n%s", diff)
				}
				observed := maps.Clone(p.observed)
				observed[0] = append(observed[0], configMap("orphan", true))
				return p.afterClaims(observed)
			},
			wantThen: []string{"release ConfigMap ns/stray (rule 0)", "recheck parent", "adopt ConfigMap ns/orphan (rule 0)", "plan children",
				"Create ConfigMap ns/b (missing)"},
			wantWrites: true,
		},
		{
			reason:     "claims that adopt nothing need no recheck of the parent",
			controller: compositeController(false), parent: thing(),
			groups: claiming(cms(configMap("a", true)), nil, cms(configMap("stray", true))),
			ds:     bus.DesiredState{Hook: "sync", Children: cms(desiredCM("a")), Status: status(1)},
			want:   []string{"release ConfigMap ns/stray (rule 0)", "plan children"},
			then: func(t *testing.T, p *applyPlan) error {
				return p.afterClaims(p.observed)
			},
			wantThen:   []string{"release ConfigMap ns/stray (rule 0)", "plan children"},
			wantWrites: true,
		},
		{
			reason:     "an adoption the recheck skips (the parent is being deleted) leaves the orphan unplanned as ours",
			controller: compositeController(false), parent: thing(),
			groups: claiming(cms(configMap("orphan", false)), cms(configMap("orphan", false)), nil),
			ds:     bus.DesiredState{Hook: "sync", Children: cms(desiredCM("orphan")), Status: status(1)},
			want:   []string{"recheck parent", "adopt ConfigMap ns/orphan (rule 0)", "plan children"},
			then: func(t *testing.T, p *applyPlan) error {
				return p.afterClaims(p.observed) // the adoption skipped
			},
			// Not adopted, so not ours: planned as a create, which the
			// API server refuses (AlreadyExists) rather than taking it
			// over.
			wantThen:   []string{"recheck parent", "adopt ConfigMap ns/orphan (rule 0)", "plan children", "Create ConfigMap ns/orphan (missing)"},
			wantWrites: true,
		},
		{
			reason:     "a decorator never claims its attachments: planned at once, as observed",
			controller: decoratorController(false), parent: thing(),
			groups: claiming(cms(configMap("orphan", false)), cms(configMap("orphan", false)), nil),
			ds:     bus.DesiredState{Hook: "sync"},
			want:   []string{},
		},
		{
			reason:     "a decorator: labels and the finalizer in one patch, before the attachment",
			controller: decoratorController(true), parent: thing(), groups: group(), hasStatus: true,
			ds: bus.DesiredState{Hook: "sync", Labels: map[string]*string{"team": ptr("b")}, Children: cms(desiredCM("a")),
				Status: map[string]any{"ready": float64(1), "observedGeneration": float64(2)}, StatusSet: true},
			want:       []string{"patch parent (patch_target)", "Create ConfigMap ns/a (missing)"},
			wantWrites: true,
		},
		{
			reason:     "server-side apply: a new child is created by an apply",
			controller: methodController("InPlace"), parent: thing(), groups: group(), strategy: apply.ServerSideApply,
			ds:         bus.DesiredState{Hook: "sync", Children: cms(desiredCM("a")), Status: status(1)},
			want:       []string{"Apply ConfigMap ns/a (missing)"},
			wantWrites: true,
		},
		{
			reason:     "server-side apply: a settled child is applied for its ownership until this replica knows it applied it",
			controller: methodController("InPlace"), parent: thing(), groups: group(configMap("a", true)), strategy: apply.ServerSideApply,
			ds:         bus.DesiredState{Hook: "sync", Children: cms(desiredCM("a")), Status: status(1)},
			want:       []string{"Apply ConfigMap ns/a (settled (ownership only))"},
			wantWrites: true,
		},
		{
			reason:     "server-side apply: a write this replica knows to change nothing is left out: a no-op",
			controller: methodController("InPlace"), parent: thing(), groups: group(configMap("a", true)), strategy: apply.ServerSideApply,
			covered: func(act children.Action) bool { return act.Op == children.OpApply && act.Settled },
			ds:      bus.DesiredState{Hook: "sync", Children: cms(desiredCM("a")), Status: status(1)},
			want:    []string{},
		},
		{
			reason:     "rolling children: the first phase ends with the rollout; the status is planned again with its condition and never deferred",
			controller: methodController("RollingRecreate"), parent: thing(), groups: group(configMap("a", true)), hasStatus: true,
			ds: bus.DesiredState{Hook: "sync", Children: cms(desiredCM("a")), Status: map[string]any{"ready": int64(1), "observedGeneration": int64(2)},
				Inputs: map[string]string{"uid-web": "1"}},
			want: []string{"roll out"},
			then: func(t *testing.T, p *applyPlan) error {
				withUpdatedCondition(p.in.Desired, rollingCondition)
				move := children.Action{Op: children.OpDelete, Rule: &p.in.Rules[0], Object: configMap("a", true), Reason: children.ReasonChangedRecreate}
				return p.afterRollout(thing(), []children.Action{move})
			},
			wantThen: []string{"roll out", "Delete ConfigMap ns/a (changed (Recreate))",
				"update_status map[conditions:[map[reason:OnLatestRevision status:True type:Updated]] observedGeneration:2 ready:1]"},
			wantWrites: true,
		},
		{
			reason:     "rolling children: the claims come first, the rollout after them",
			controller: methodController("RollingInPlace"), parent: thing(), hasStatus: true,
			groups: claiming(cms(configMap("orphan", false)), cms(configMap("orphan", false)), nil),
			ds: bus.DesiredState{Hook: "sync", Children: cms(desiredCM("orphan")),
				Status: map[string]any{"ready": int64(1), "observedGeneration": int64(2)}},
			want: []string{"recheck parent", "adopt ConfigMap ns/orphan (rule 0)", "roll out"},
			then: func(t *testing.T, p *applyPlan) error {
				return p.afterRollout(thing(), nil)
			},
			wantThen:   []string{"recheck parent", "adopt ConfigMap ns/orphan (rule 0)", "roll out"},
			wantWrites: true,
		},
		{
			reason:     "a per-parent snapshot (keyed kind): the parent alone, its status",
			controller: compositeController(false), parent: thing(), summary: true,
			ds:         bus.DesiredState{Hook: "sync", Status: status(3)},
			want:       []string{"update_status map[observedGeneration:2 ready:3]"},
			wantWrites: true,
		},
		{
			reason:     "a per-parent snapshot naming children: refused before any write",
			controller: compositeController(true), parent: thing(), summary: true,
			ds:      bus.DesiredState{Hook: "sync", Children: cms(desiredCM("a")), Status: status(3)},
			wantErr: events.ReasonApplyError,
		},
		{
			reason:     "an answer naming an undeclared kind is rejected as a whole, the finalizer patch included",
			controller: compositeController(true), parent: thing(), groups: group(configMap("a", true)),
			ds:      bus.DesiredState{Hook: "sync", Children: cms(desiredCM("b"), secret), Status: status(5)},
			wantErr: events.ReasonInvalidDesired, wantRejected: true,
		},
		{
			reason:     "a parent that cannot own children (no selector) is a SyncError",
			controller: compositeController(false), parent: thing(func(p *unstructured.Unstructured) { delete(p.Object, "spec") }), groups: group(),
			ds:      bus.DesiredState{Hook: "sync", Status: status(2)},
			wantErr: events.ReasonSyncError,
		},
	}
	for _, tt := range tests {
		t.Run(tt.reason, func(t *testing.T) {
			ctrl, err := kindtable.Decode(tt.controller)
			if err != nil {
				t.Fatal(err)
			}
			ds, snap := thingApply(tt.ds, tt.controller, tt.parent, tt.hasStatus, tt.groups)
			if tt.summary {
				snap.Summary = map[string]any{}
			}
			in := planInput{Kind: ctrl, Desired: &ds, Snapshot: snap, ObservesChildren: observesChildren(snap),
				Options: (&Applier{cfg: Config{Strategy: tt.strategy}}).planOptions, Covered: tt.covered}
			if in.Parent, err = ctrl.ApplyParent(kinds.ApplyInput{Desired: &ds, Parent: tt.parent, ParentResource: "things", ParentHasStatus: tt.hasStatus}); err != nil {
				t.Fatal(err)
			}
			if in.Parent.Gate != kinds.ApplyProceed {
				t.Fatalf("gate %v: the case never reaches the plan", in.Parent.Gate)
			}
			if in.ObservesChildren {
				for i, r := range ctrl.ApplyChildRules().Rules {
					in.Rules = append(in.Rules, children.Rule{APIVersion: r.APIVersion, Resource: r.Resource,
						Kind: tt.groups[i].Kind, Namespaced: tt.groups[i].Namespaced, Method: r.Method})
				}
			}
			before := tt.parent.DeepCopy()

			p, err := planApply(in)
			var refused *planError
			switch {
			case tt.wantErr != "" && err == nil:
				t.Fatalf("planned %v, want it refused with %s", describe(p.Steps), tt.wantErr)
			case tt.wantErr != "":
				if !asPlanError(err, &refused) {
					t.Fatalf("error %v is no planError", err)
				}
				if diff := cmp.Diff([2]any{tt.wantErr, tt.wantRejected}, [2]any{refused.reason, refused.rejected}); diff != "" {
					t.Errorf("refusal (reason, rejected) (-want +got):\n%s", diff)
				}
				return
			case err != nil:
				t.Fatalf("plan: %v", err)
			}
			if diff := cmp.Diff(tt.want, describe(p.Steps)); diff != "" {
				t.Errorf("steps (-want +got):\n%s", diff)
			}
			if tt.then != nil {
				if err := tt.then(t, p); err != nil {
					t.Fatalf("second phase: %v", err)
				}
				if diff := cmp.Diff(tt.wantThen, describe(p.Steps)); diff != "" {
					t.Errorf("steps after the second phase (-want +got):\n%s", diff)
				}
			}
			if p.Writes != tt.wantWrites {
				t.Errorf("Writes = %v, want %v", p.Writes, tt.wantWrites)
			}
			if diff := cmp.Diff(before, tt.parent); diff != "" {
				t.Errorf("the snapshot's parent was modified (-before +after):\n%s", diff)
			}
		})
	}
}

func asPlanError(err error, target **planError) bool { return errors.As(err, target) }

func keys(objs []*unstructured.Unstructured) []string {
	out := []string{}
	for _, o := range objs {
		out = append(out, key(o))
	}
	return out
}

// A child plan that fails after the claims (an observed group for a rule
// that does not exist) is refused with an ApplyError, as before the
// first write.
func TestPlanAfterClaimsRefused(t *testing.T) {
	ctrl, err := kindtable.Decode(compositeController(false))
	if err != nil {
		t.Fatal(err)
	}
	ds := &bus.DesiredState{Hook: "sync", Children: []*unstructured.Unstructured{desiredCM("a")},
		Parent: bus.ObjectRef{APIVersion: "example.com/v1", Kind: "Thing", Resource: "things", Namespace: "ns", Name: "web", UID: "p-uid"}}
	snap := &snapshot.Response{Result: snapshot.OK, Parent: thing(), ParentResource: "things",
		Children: []snapshot.Group{{APIVersion: "v1", Resource: "configmaps", Kind: "ConfigMap", Namespaced: true,
			Adopt: []*unstructured.Unstructured{configMap("orphan", false)}}}}
	p, err := planApply(planInput{Kind: ctrl, Desired: ds, Snapshot: snap, ObservesChildren: true, Options: (&Applier{}).planOptions,
		Rules: []children.Rule{{APIVersion: "v1", Resource: "configmaps", Kind: "ConfigMap", Namespaced: true}}})
	if err != nil {
		t.Fatal(err)
	}
	err = p.afterClaims(map[int][]*unstructured.Unstructured{7: {configMap("x", true)}})
	var refused *planError
	if !asPlanError(err, &refused) || refused.reason != events.ReasonApplyError || refused.rejected {
		t.Fatalf("afterClaims = %#v, want an ApplyError refusal", err)
	}
}
