package rollout

import (
	"fmt"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/metabus/metabus/pkg/api/v1alpha1"
	"github.com/metabus/metabus/pkg/children"
	"github.com/metabus/metabus/pkg/revision"
)

// StepInput is everything one apply of a parent with rolling children needs.
type StepInput struct {
	Owner children.Owner
	Rules []children.Rule
	// Checks are the statusChecks.conditions of each rule, by rule index.
	Checks [][]v1alpha1.StatusConditionCheck
	// History is the parent's revision history, freshly loaded; Step edits it (Track, Move,
	// Prune), and the caller persists History.Changes() before running any action.
	History *revision.History
	// Latest is the normalized desired state of the latest revision, in hook order: it decides
	// which children exist.
	Latest []children.Desired
	// Older holds the normalized desired children of each older revision, by revision name, as
	// the hook rendered the parent as of that revision.
	Older map[string][]children.Desired
	// Observed are the claimed children by rule index, as for children.Plan.
	Observed map[int][]*unstructured.Unstructured
	// Apply is how children are written (children.PlanWith).
	Apply children.Options
}

// StepResult is the outcome of Step.
type StepResult struct {
	// Actions converge the children once the history is persisted.
	Actions []children.Action
	// Plan is the rollout decision: the child moved (already recorded in the History), the
	// parent's Updated condition, and whether the rollout is done.
	Plan Plan
	// ChildErrors joins the failures confined to single children (see children.Plan); the
	// actions for all other children are still returned.
	ChildErrors error
}

// MissingRevisionsError says that revisions holding children have no rendered desired state:
// the history changed since the hook was called, so the hook must be called again.
type MissingRevisionsError struct{ Names []string }

func (e *MissingRevisionsError) Error() string {
	return "no hook result for revision(s) " + strings.Join(e.Names, ", ") + " (the revision history changed since the hook ran)"
}

// Step renders every child from the revision it belongs to, lets Decide move at most one rolling
// child to the latest revision, and plans the writes:
//
//  1. The latest revision's rolling children are tracked in the history (new ones start at
//     the latest revision, children no longer desired are forgotten).
//  2. A rolling child on an older revision takes its desired state from that revision's
//     rendering (the latest one when the old rendering lacks it); every other child takes the
//     latest. So a child deleted mid-rollout is recreated at its own revision.
//  3. children.PlanWith computes the writes; a child on the latest revision "matches" when it
//     exists, is not being deleted and needs no write that changes a value (Settled).
//  4. Decide picks the child to move; it is recorded in the history and planned again with
//     the latest desired state. Finally, revisions that hold no children are pruned.
//
// Invalid input fails the whole step: the caller then writes nothing.
func Step(in StepInput) (StepResult, error) {
	h := in.History
	if h == nil {
		return StepResult{}, fmt.Errorf("rollout: no revision history")
	}
	latest := h.Latest()

	var tracked []revision.ChildRef
	for _, d := range in.Latest {
		if d.Rule != nil && Rolling(d.Rule.Method) {
			tracked = append(tracked, revision.RefOf(d.Rule.APIVersion, d.Rule.Kind, d.Object.GetName()))
		}
	}
	h.Track(tracked)

	var missing []string
	olderByKey := map[string]map[children.ChildKey]children.Desired{}
	for _, r := range h.Revisions() {
		if r.Latest {
			continue
		}
		rendered, ok := in.Older[r.Name]
		if !ok {
			missing = append(missing, r.Name)
			continue
		}
		m := make(map[children.ChildKey]children.Desired, len(rendered))
		for _, d := range rendered {
			if d.Rule != nil && d.Object != nil {
				m[desiredKey(d)] = d
			}
		}
		olderByKey[r.Name] = m
	}
	if len(missing) > 0 {
		return StepResult{}, &MissingRevisionsError{Names: missing}
	}

	ruleIndex := map[*children.Rule]int{}
	for i := range in.Rules {
		ruleIndex[&in.Rules[i]] = i
	}
	observed := map[children.ChildKey]*unstructured.Unstructured{}
	for i, objs := range in.Observed {
		if i < 0 || i >= len(in.Rules) {
			return StepResult{}, fmt.Errorf("rollout: observed children for rule %d, but only %d rules are declared", i, len(in.Rules))
		}
		r := &in.Rules[i]
		for _, o := range objs {
			if o == nil || !children.IsOwnedBy(o, in.Owner) {
				continue
			}
			k := children.ChildKey{APIVersion: r.APIVersion, Kind: r.Kind, Name: o.GetName()}
			if r.Namespaced {
				k.Namespace = o.GetNamespace()
			}
			observed[k] = o
		}
	}

	// Render each child from its revision.
	chosen := make([]children.Desired, len(in.Latest))
	revOf := make([]string, len(in.Latest))
	for i, d := range in.Latest {
		chosen[i], revOf[i] = d, latest
		if d.Rule == nil || d.Object == nil || !Rolling(d.Rule.Method) {
			continue
		}
		ref := revision.RefOf(d.Rule.APIVersion, d.Rule.Kind, d.Object.GetName())
		revOf[i] = h.RevisionOf(ref.APIGroup, ref.Kind, ref.Name)
		if revOf[i] == latest {
			continue
		}
		if old, ok := olderByKey[revOf[i]][desiredKey(d)]; ok {
			chosen[i] = old
		}
	}

	actions, childErrs := children.PlanWith(in.Apply, in.Owner, in.Rules, in.Observed, chosen)
	if actions == nil && childErrs != nil {
		return StepResult{}, childErrs
	}
	acting := map[children.ChildKey]bool{}
	for _, a := range actions {
		// A settled server-side apply changes no value: the child has
		// the desired state already.
		acting[a.Key()] = acting[a.Key()] || !a.Settled
	}

	dec := Input{Latest: latest}
	for i, d := range in.Latest {
		if d.Rule == nil || !Rolling(d.Rule.Method) {
			continue
		}
		k := desiredKey(d)
		obs := observed[k]
		if obs != nil && obs.GetDeletionTimestamp() != nil {
			obs = nil // on its way out: as good as missing
		}
		var checks []v1alpha1.StatusConditionCheck
		if ri, ok := ruleIndex[d.Rule]; ok && ri < len(in.Checks) {
			checks = in.Checks[ri]
		}
		dec.Children = append(dec.Children, Child{
			Key: k, Method: d.Rule.Method, Checks: checks, Observed: obs,
			Revision: revOf[i], Matches: obs != nil && !acting[k],
		})
	}
	plan := Decide(dec)
	if plan.Move != nil {
		i := slices.IndexFunc(in.Latest, func(d children.Desired) bool { return d.Rule != nil && desiredKey(d) == *plan.Move })
		if i < 0 {
			return StepResult{}, fmt.Errorf("rollout: moved child %s is not desired", plan.Move)
		}
		if err := h.Move(revision.RefOf(plan.Move.APIVersion, plan.Move.Kind, plan.Move.Name), latest); err != nil {
			return StepResult{}, err
		}
		chosen[i] = in.Latest[i]
		if actions, childErrs = children.PlanWith(in.Apply, in.Owner, in.Rules, in.Observed, chosen); actions == nil && childErrs != nil {
			return StepResult{}, childErrs
		}
	}
	h.Prune()
	return StepResult{Actions: actions, Plan: plan, ChildErrors: childErrs}, nil
}

// desiredKey is the ChildKey of a normalized desired child (its namespace is already defaulted).
func desiredKey(d children.Desired) children.ChildKey {
	k := children.ChildKey{APIVersion: d.Rule.APIVersion, Kind: d.Rule.Kind, Name: d.Object.GetName()}
	if d.Rule.Namespaced {
		k.Namespace = d.Object.GetNamespace()
	}
	return k
}
