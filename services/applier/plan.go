package applier

import (
	"fmt"
	"slices"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/metabus/metabus/pkg/bus"
	"github.com/metabus/metabus/pkg/children"
	"github.com/metabus/metabus/pkg/events"
	"github.com/metabus/metabus/pkg/kinds"
	"github.com/metabus/metabus/pkg/snapshot"
)

// This file is the apply plan: what applying one desired state writes,
// and in which order, decided from the desired state, the observed
// snapshot and the resolved configuration alone. It makes no API call,
// reads no clock and holds no client; applyParent executes it step by
// step (apply.go) through the writes of kube.go.

// stepKind is what one step of an apply plan does.
type stepKind int

const (
	// stepPatchParent writes the kind's merge patch of the parent
	// (labels, annotations, the finalizer added) before any child, so
	// that once a child exists, deleting the parent waits for the
	// finalize hook.
	stepPatchParent stepKind = iota + 1
	// stepRelease removes this parent's controller reference from a child
	// that stopped matching it.
	stepRelease
	// stepRecheckParent reads the parent live before the first adoption:
	// a parent being deleted (the cache may lag the deletion) or replaced
	// adopts nothing, and the adopt steps after it are skipped.
	stepRecheckParent
	// stepAdopt adds this parent's controller reference to a matching
	// orphan, which the children are then planned with.
	stepAdopt
	// stepPlanChildren ends the first phase of a parent that claims: its
	// children are planned against the claimed ones, the adopted as
	// adopted (their resourceVersions changed), and the rest of the plan
	// appended (applyPlan.afterClaims).
	stepPlanChildren
	// stepRollout ends the first phase of a parent whose children roll
	// out: rolling loads and commits its revisions and plans the
	// children (rollout.Step), and the rest of the plan is appended with
	// the status planned again with the rollout's condition
	// (applyPlan.afterRollout).
	stepRollout
	// stepChild is one child write: a create, an update, a server-side
	// apply or a delete.
	stepChild
	// stepStatus writes the status through the status subresource, after
	// the children, even if a child write failed: it reports what the
	// hook observed, as upstream does.
	stepStatus
	// stepRemoveFinalizer removes the finalizer after a finalize hook's
	// final answer, only once every other write has succeeded.
	stepRemoveFinalizer
)

// step is one step of an apply plan; its kind says which fields are set.
type step struct {
	Kind stepKind
	// Write is the parent write of stepPatchParent and stepStatus.
	Write parentWrite
	// DeferIfCreated, on stepStatus, leaves the status to the sync that
	// a child created by this apply causes (see finish).
	DeferIfCreated bool
	// Rule, RuleIndex and Object are the child a claim step releases or
	// adopts, and its rule (in planInput.Rules) and the rule's index.
	Rule      *children.Rule
	RuleIndex int
	Object    *unstructured.Unstructured
	// Action is the write of stepChild.
	Action children.Action
	// Finalizer is the finalizer stepRemoveFinalizer removes; the patch
	// is made from the parent as last written, whose resourceVersion is
	// its precondition.
	Finalizer string
}

// planInput is what one apply is planned from.
type planInput struct {
	Kind     kinds.Applying
	Desired  *bus.DesiredState
	Snapshot *snapshot.Response
	// Parent is the kind's plan of the parent's own writes
	// (kinds.Applying.ApplyParent), whose gate let the apply proceed.
	Parent kinds.ApplyParentPlan
	// ObservesChildren says the snapshot holds the parent's children
	// (observesChildren), and Rules are the kind's child rules as
	// resolved through discovery.
	ObservesChildren bool
	Rules            []children.Rule
	// Options says how a kind's children are written (the strategy);
	// required with ObservesChildren.
	Options func(kinds.ApplyChildRules) children.Options
	// Covered reports a child write that this replica knows changes
	// nothing (a server-side apply it made before, appliedMemory): it is
	// left out of the plan, so a sync that needs nothing else makes no
	// API call. nil leaves every write in.
	Covered func(children.Action) bool
}

// applyPlan is what applying one desired state writes, in order: Steps.
// A parent whose children are planned only after a read or a write
// (adopted children, loaded revisions) is planned in two phases: Steps
// then ends with stepPlanChildren or stepRollout, whose execution
// appends the rest (afterClaims, afterRollout). Everything else is
// planned, and anything wrong with it refused, before the first write.
type applyPlan struct {
	Steps []step
	// Writes says a step writes something: an apply that writes nothing,
	// which is what a no-op sync must cost, is a no-op. A rollout's
	// revision commits alone do not count (they record a decision, not a
	// change of the parent or its children), nor does the recheck.
	Writes bool

	in   planInput
	decl kinds.ApplyChildRules
	// owner, desired and observed are the children's owner, their
	// normalized desired state and the children the parent controls
	// (without those it is about to adopt), when the snapshot observes
	// children.
	owner    children.Owner
	desired  []children.Desired
	observed map[int][]*unstructured.Unstructured
	// options are how the children are written.
	options children.Options
	// roll is how the children roll out, if rolls.
	roll  kinds.ApplyRolloutSpec
	rolls bool
}

// add appends steps to the plan.
func (p *applyPlan) add(steps ...step) {
	for _, s := range steps {
		switch s.Kind {
		case stepPatchParent, stepRelease, stepAdopt, stepChild, stepStatus:
			p.Writes = true
		}
	}
	p.Steps = append(p.Steps, steps...)
}

// planError is a desired state the plan refuses: reason is the Warning
// Event on the parent; rejected says it is a hook answer rejected as a
// whole by validation.
type planError struct {
	reason   string
	rejected bool
	err      error
}

func (e *planError) Error() string { return e.err.Error() }
func (e *planError) Unwrap() error { return e.err }

// planApply plans one desired state:
//
//  1. the kind's patch of the parent, if any;
//  2. with observed children, the claims (releases, then a live recheck
//     of the parent and the adoptions), then the children: planned at
//     once when nothing is adopted and nothing rolls out, so that a
//     plan that fails writes nothing, else in a second phase;
//  3. the status, then the finalizer's removal (finish).
//
// A desired state known to be wrong (children named where the snapshot
// observes none, an owner the parent cannot be, children the rules do
// not allow, a child plan that fails) is refused as a whole.
func planApply(in planInput) (*applyPlan, error) {
	ds, snap := in.Desired, in.Snapshot
	p := &applyPlan{in: in, decl: in.Kind.ApplyChildRules()}
	if in.Parent.Patch != nil {
		p.add(step{Kind: stepPatchParent, Write: patchWrite(in.Parent)})
	}
	if !in.ObservesChildren {
		// A keyed kind's per-parent snapshot holds the parent and its
		// summary, never children: its desired state is about the parent
		// alone (an aggregated status). Nothing about children can be
		// planned from it, and above all nothing deleted: every output
		// would look undesired. A desired state that names children here
		// is a kind's mistake, refused before any write.
		if len(ds.Children)+len(ds.Revisions) > 0 {
			return nil, &planError{reason: events.ReasonApplyError,
				err: fmt.Errorf("%s desired state names %s, but its snapshot observes none (a per-parent snapshot): nothing applied", ds.Hook, p.decl.Noun)}
		}
		p.finish(in.Parent.Status, nil)
		return p, nil
	}
	var err error
	p.options = in.Options(p.decl)
	if p.owner, err = in.Kind.ApplyOwner(snap.Parent, ds); err != nil {
		return nil, &planError{reason: events.ReasonSyncError, err: err}
	}
	if p.desired, err = children.Normalize(p.owner, in.Rules, ds.Children); err != nil {
		reason := p.decl.RejectReason
		if reason == "" {
			reason = events.ReasonInvalidDesired
		}
		return nil, &planError{reason: reason, rejected: true, err: fmt.Errorf("%s hook response rejected, nothing applied: %w", ds.Hook, err)}
	}
	c := claimsOf(in.Kind.ApplyClaims(), len(in.Rules), snap.Children)
	p.observed = c.observed
	p.add(c.steps(in.Rules)...)
	p.roll, p.rolls = in.Kind.ApplyRollout(snap.Parent, ds.Parent.Resource)
	switch {
	case p.rolls:
		p.add(step{Kind: stepRollout})
	case c.writes():
		p.add(step{Kind: stepPlanChildren})
	default:
		return p, p.afterClaims(p.observed)
	}
	return p, nil
}

// afterClaims plans the children against observed, the children the
// parent controls once the claim steps ran (the adopted as adopted), and
// the rest of the plan.
func (p *applyPlan) afterClaims(observed map[int][]*unstructured.Unstructured) error {
	actions, err := children.PlanWith(p.options, p.owner, p.in.Rules, observed, p.desired)
	if err != nil {
		return &planError{reason: events.ReasonApplyError, err: fmt.Errorf("plan %s: %w", p.decl.Noun, err)}
	}
	p.finish(p.in.Parent.Status, actions)
	return nil
}

// afterRollout plans the rest of a rolling parent's apply once rolling
// has planned its child writes (actions) and the rollout's condition has
// joined the desired status: the status is planned again with it, against
// parent as written so far.
func (p *applyPlan) afterRollout(parent *unstructured.Unstructured, actions []children.Action) error {
	snap := p.in.Snapshot
	again, err := p.in.Kind.ApplyParent(kinds.ApplyInput{Desired: p.in.Desired, Parent: parent,
		ParentResource: snap.ParentResource, ParentHasStatus: snap.ParentHasStatus})
	if err != nil {
		return &planError{reason: events.ReasonApplyError, err: err}
	}
	p.finish(again.Status, actions)
	return nil
}

// finish appends the child writes (but those Covered), the status and
// the finalizer's removal.
//
// A sync answer of a controller that opted into echo suppression
// (ds.Inputs is set for no other) leaves its status to the next sync when
// one of its children is created: the new child comes back as a watch
// event that syncs the parent again, and that hook call sees it (a new
// object is never an echo), so the status computed without it is out of
// date before it is written; a new parent costs one API write fewer.
// Under upstream's contract every answer's status is written: a hook may
// record a decision there and read it back on the next call. A rolling
// parent keeps its write: its status carries the rollout's condition.
func (p *applyPlan) finish(status map[string]any, actions []children.Action) {
	for _, act := range actions {
		if p.in.Covered != nil && p.in.Covered(act) {
			continue
		}
		p.add(step{Kind: stepChild, Action: act})
	}
	ds := p.in.Desired
	if status != nil {
		p.add(step{Kind: stepStatus, Write: parentWrite{verb: verbUpdateStatus, status: status},
			DeferIfCreated: ds.Hook == bus.HookSync && !p.rolls && len(ds.Inputs) > 0})
	}
	if f := p.in.Parent.RemoveFinalizer; f != "" {
		p.add(step{Kind: stepRemoveFinalizer, Finalizer: f})
	}
}

// claims are the ControllerRef decisions of a snapshot, per child rule.
type claims struct {
	// observed are the children the parent controls (without those it is
	// about to adopt).
	observed map[int][]*unstructured.Unstructured
	// adopt and release are the snapshot's claims by rule index (kinds
	// that claim only); n counts them.
	adopt, release [][]*unstructured.Unstructured
	n              int
}

func (c *claims) writes() bool { return c.n > 0 }

// claimsOf reads the snapshot's groups (one per rule, in rule order). A
// kind that claims acts on the snapshot's adoptions and releases; the
// objects to adopt are planned only once adopted.
func claimsOf(claim bool, nrules int, groups []snapshot.Group) claims {
	c := claims{observed: make(map[int][]*unstructured.Unstructured, len(groups))}
	for i, g := range groups {
		if i >= nrules {
			break
		}
		if !claim || len(g.Adopt)+len(g.Release) == 0 {
			c.observed[i] = g.Objects
			continue
		}
		if c.adopt == nil {
			c.adopt = make([][]*unstructured.Unstructured, nrules)
			c.release = make([][]*unstructured.Unstructured, nrules)
		}
		c.adopt[i], c.release[i] = g.Adopt, g.Release
		c.n += len(g.Adopt) + len(g.Release)
		if len(g.Adopt) == 0 {
			c.observed[i] = g.Objects
			continue
		}
		for _, o := range g.Objects {
			if !slices.ContainsFunc(g.Adopt, func(x *unstructured.Unstructured) bool { return x.GetUID() == o.GetUID() }) {
				c.observed[i] = append(c.observed[i], o)
			}
		}
	}
	return c
}

// steps are the claim steps: every release first, then, if anything is
// adopted, the live recheck of the parent and the adoptions.
func (c *claims) steps(rules []children.Rule) []step {
	var out []step
	adopting := false
	for i, objs := range c.release {
		for _, o := range objs {
			out = append(out, step{Kind: stepRelease, Rule: &rules[i], RuleIndex: i, Object: o})
		}
		adopting = adopting || len(c.adopt[i]) > 0
	}
	if !adopting {
		return out
	}
	out = append(out, step{Kind: stepRecheckParent})
	for i, objs := range c.adopt {
		for _, o := range objs {
			out = append(out, step{Kind: stepAdopt, Rule: &rules[i], RuleIndex: i, Object: o})
		}
	}
	return out
}

// patchWrite is the write of a parent plan's patch.
func patchWrite(plan kinds.ApplyParentPlan) parentWrite {
	if plan.AddsFinalizer != "" && finalizersOnly(plan.Patch) {
		return parentWrite{verb: verbAddFinalizer, what: "add finalizer " + plan.AddsFinalizer + " on", patch: plan.Patch}
	}
	return parentWrite{verb: verbPatchParent, what: "patch labels/annotations/finalizers of", patch: plan.Patch}
}

// finalizersOnly reports a patch that changes nothing but the finalizers.
func finalizersOnly(patch map[string]any) bool {
	meta, _ := patch["metadata"].(map[string]any)
	if len(patch) != 1 || meta == nil {
		return false
	}
	for k := range meta {
		if k != "finalizers" && k != "resourceVersion" {
			return false
		}
	}
	return true
}
