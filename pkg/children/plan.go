package children

import (
	"cmp"
	"errors"
	"fmt"
	"slices"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/metabus/metabus/pkg/api/v1alpha1"
	"github.com/metabus/metabus/pkg/apply"
)

// Op is the kind of write an Action asks for.
type Op string

// Operations.
const (
	OpCreate Op = "Create"
	OpUpdate Op = "Update"
	OpDelete Op = "Delete"
	// OpApply is a server-side apply of Object (apply.ServerSideApply
	// only): it updates Observed, or, without Observed, creates the child
	// (a create of the configuration, which fails on an existing object).
	OpApply Op = "Apply"
)

// Reasons recorded on actions (for events, logs and metrics labels).
const (
	ReasonMissing         = "missing"
	ReasonNotDesired      = "not desired"
	ReasonChangedRecreate = "changed (Recreate)"
	ReasonChangedInPlace  = "changed (InPlace)"
	// ReasonRecordLastApplied is the in-place update of a Recreate child
	// whose values are the desired ones but whose last-applied
	// annotation is missing or differs.
	ReasonRecordLastApplied = "record last-applied (Recreate)"
	// ReasonOwnership is a server-side apply (or a Recreate's dry run)
	// of a child whose values are already the desired ones (Settled):
	// only its field ownership can change.
	ReasonOwnership = "settled (ownership only)"
)

// Action is one write that converges a child towards its desired state.
type Action struct {
	Op   Op
	Rule *Rule // points into the rules given to Plan
	// Object is, for Create, the object to create (last-applied annotation and controller
	// reference set); for Update, the merged object to PUT (it carries the observed
	// resourceVersion, so a concurrent change fails with a conflict instead of being lost); for
	// Delete, the observed object itself (not a copy), whose UID callers use as a precondition;
	// for Apply, the applied configuration (apply.Configuration plus the controller reference).
	Object *unstructured.Unstructured
	Reason string

	// The fields below are set with apply.ServerSideApply only.

	// Observed is the child an OpApply updates (nil when it creates one):
	// its resourceVersion is the apply's precondition.
	Observed *unstructured.Unstructured
	// Verify, on the OpDelete of a Recreate child, is the configuration
	// to dry-run first: the child is deleted only if applying it would
	// change the child (apply.Changes), as upstream does.
	Verify *unstructured.Unstructured
	// Settled says the observed child already holds every value of the
	// configuration (apply.Settled): the write can only change field
	// ownership, and the writer skips it when it knows it applied this
	// configuration to this child before (apply.Applied.Covers). A
	// settled action does not make a rolling child "not updated".
	Settled bool
	// DropLastApplied asks to remove LastAppliedAnnotation (dynamic
	// apply's bookkeeping, left by an earlier strategy) before an InPlace
	// apply, as upstream does: it belongs to another field manager, so the
	// apply alone would keep it.
	DropLastApplied bool
}

// Creates reports whether the action creates a child (an OpApply without
// an observed child creates it).
func (a Action) Creates() bool {
	return a.Op == OpCreate || (a.Op == OpApply && a.Observed == nil)
}

// Options are how Plan writes children.
type Options struct {
	// Strategy is apply.DynamicApply ("") or apply.ServerSideApply.
	Strategy apply.Strategy
}

// Key returns the identity of the action's child.
func (a Action) Key() ChildKey {
	var k ChildKey
	if a.Rule != nil {
		k.APIVersion, k.Kind = a.Rule.APIVersion, a.Rule.Kind
	}
	if a.Object != nil {
		k.Name = a.Object.GetName()
		if a.Rule == nil || a.Rule.Namespaced {
			k.Namespace = a.Object.GetNamespace()
		}
	}
	return k
}

// Plan compares the observed children (grouped by index into rules) with the normalized desired
// set and returns the actions that converge them:
//   - desired and not observed: Create, with the last-applied annotation (apply.PrepareCreate)
//     and then a controller reference to the owner (ControllerRef). References the hook set
//     are kept, except one to the owner's own UID, which is replaced rather than duplicated
//     (a second reference to the same owner would at best be dropped by the API server). The
//     reference is added after the annotation is computed, as upstream does, so it is not part
//     of the last-applied configuration and later merges never remove it. Server-owned
//     metadata (uid, resourceVersion, ...) echoed by the hook is dropped from the object;
//   - observed and not desired: Delete, unless the child is already being deleted;
//   - both, by the rule's update method: OnDelete (or ""): nothing. InPlace: apply.UpdateChild,
//     and Update if it changed anything. Recreate: apply.UpdateChild, and Delete if it changed
//     a value; the next sync, which the deletion triggers, creates it again. A Recreate child
//     whose values are the desired ones but whose annotation is missing or differs (written by
//     server-side apply, or by someone else and adopted) is updated in place to record it.
//     RollingRecreate and RollingInPlace act as Recreate and InPlace here: the gradual
//     rollout (package rollout's Step) decides which revision renders each child's desired
//     state, so at most one child is handed to Plan with a changed desired state per sync.
//     A child with a deletionTimestamp is never updated (nor recreated until it is gone).
//
// Observed objects whose controller reference is not the owner (see IsOwnedBy) are ignored:
// callers are expected to pass claimed children only, and ignoring the rest makes a caller
// mistake cost a failed create (AlreadyExists) rather than a deleted object.
//
// The order is deterministic: deletes, then creates, then updates; within each, by rule order,
// namespace and name. Deletes go first so that a Recreate or a rename frees names and quota
// before new objects need them.
//
// Invalid input (an owner without UID, bad rules, desired children that do not belong to the
// rules or collide, observed groups for unknown rules) fails the whole plan with a nil action
// list. A failure confined to one child (for example an apply error on a malformed observed
// object) is joined into the returned error while the actions for all other children are still
// returned, so that callers can make progress as upstream does and report the rest.
func Plan(owner Owner, rules []Rule, observed map[int][]*unstructured.Unstructured, desired []Desired) ([]Action, error) {
	return PlanWith(Options{}, owner, rules, observed, desired)
}

// PlanWith is Plan with a write strategy. With apply.ServerSideApply the
// decisions are the same, the writes differ:
//   - desired and not observed: OpApply of the configuration
//     (apply.Configuration, then the controller reference) without
//     Observed, which the writer sends as a create of that configuration,
//     never as an apply onto an object of that name that exists;
//   - InPlace (and RollingInPlace): OpApply with Observed, unless the
//     child is Settled and carries no LastAppliedAnnotation, when it is
//     still planned but Settled (the writer knows whether it owns the
//     configuration's fields already);
//   - Recreate (and RollingRecreate): OpDelete with Verify, the
//     configuration the writer dry-runs first; Settled when the values
//     already match;
//   - OnDelete: nothing, as always; deletes of undesired children as
//     always.
func PlanWith(opts Options, owner Owner, rules []Rule, observed map[int][]*unstructured.Unstructured, desired []Desired) ([]Action, error) {
	ssa := false
	switch opts.Strategy {
	case "", apply.DynamicApply:
	case apply.ServerSideApply:
		ssa = true
	default:
		return nil, fmt.Errorf("children: unknown apply strategy %q", opts.Strategy)
	}
	if owner.UID == "" {
		return nil, fmt.Errorf("children: owner %s %q has no UID to reference", owner.Kind, owner.Name)
	}
	if err := checkOwner(owner); err != nil {
		return nil, err
	}
	if err := checkRules(rules); err != nil {
		return nil, err
	}
	for i := range observed {
		if i < 0 || i >= len(rules) {
			return nil, fmt.Errorf("children: observed children for rule %d, but only %d rules are declared", i, len(rules))
		}
	}
	want, err := indexDesired(rules, desired)
	if err != nil {
		return nil, err
	}

	p := planner{owner: owner, ownerGroup: apiGroup(owner.APIVersion), rules: rules, ssa: ssa}
	seen := make(map[childKey]bool, len(want.list))
	for ruleIdx := range rules {
		rule := &rules[ruleIdx]
		for _, obs := range observed[ruleIdx] {
			if obs == nil || obs.Object == nil || !isOwnedRaw(obs.Object, owner, p.ownerGroup) {
				continue
			}
			key := keyOf(ruleIdx, rule, obs)
			if seen[key] {
				p.fail(key, errors.New("observed twice; ignoring the second copy"))
				continue
			}
			seen[key] = true
			pos, isDesired := want.byKey[key]
			switch {
			case isDeleting(obs.Object):
				// Being deleted: neither deleted again nor updated; once it is gone, the next
				// sync creates it again if it is still desired.
			case !isDesired:
				p.add(key, Action{Op: OpDelete, Rule: rule, Object: obs, Reason: ReasonNotDesired})
			default:
				p.update(key, rule, obs, want.list[pos].object)
			}
		}
	}
	for _, d := range want.list {
		if !seen[d.key] {
			p.create(d)
		}
	}
	slices.SortStableFunc(p.actions, func(a, b plannedAction) int {
		return cmp.Or(
			cmp.Compare(phase(a.Action), phase(b.Action)),
			cmp.Compare(a.key.rule, b.key.rule),
			cmp.Compare(a.key.namespace, b.key.namespace),
			cmp.Compare(a.key.name, b.key.name),
		)
	})
	out := make([]Action, len(p.actions))
	for i, a := range p.actions {
		out[i] = a.Action
	}
	return out, errors.Join(p.errs...)
}

// desiredIndex is the desired set resolved against the rules, in the caller's order.
type desiredIndex struct {
	list  []indexedDesired
	byKey map[childKey]int // position in list
}

type indexedDesired struct {
	key    childKey
	rule   *Rule // &rules[key.rule]
	object *unstructured.Unstructured
}

type planner struct {
	ssa        bool
	owner      Owner
	ownerGroup string
	rules      []Rule
	actions    []plannedAction
	errs       []error
}

type plannedAction struct {
	Action
	key childKey
}

func (p *planner) add(key childKey, a Action) {
	p.actions = append(p.actions, plannedAction{Action: a, key: key})
}

func (p *planner) fail(key childKey, err error) {
	r := p.rules[key.rule]
	p.errs = append(p.errs, fmt.Errorf("children: %s: %w", ChildKey{r.APIVersion, r.Kind, key.namespace, key.name}, err))
}

func (p *planner) update(key childKey, rule *Rule, observed, desired *unstructured.Unstructured) {
	var op Op
	var reason string
	switch rule.Method {
	case v1alpha1.ChildUpdateInPlace, v1alpha1.ChildUpdateRollingInPlace:
		op, reason = OpUpdate, ReasonChangedInPlace
	case v1alpha1.ChildUpdateRecreate, v1alpha1.ChildUpdateRollingRecreate:
		op, reason = OpDelete, ReasonChangedRecreate
	default: // OnDelete: existing children are left alone until someone else deletes them
		return
	}
	if p.ssa {
		p.updateSSA(key, rule, op, observed, desired)
		return
	}
	merged, changed, err := apply.UpdateChild(observed, desired)
	if err != nil {
		p.fail(key, fmt.Errorf("computing update: %w", err))
		return
	}
	if !changed {
		return
	}
	if op == OpDelete && !apply.Changes(observed.Object, merged.Object) {
		// Only the last-applied annotation differs: the child has the
		// desired values, but no annotation (server-side apply or
		// someone else wrote it) or one that lists fields it does not
		// change. Record it in place: recreating a child with the desired
		// values would change nothing but its identity.
		p.add(key, Action{Op: OpUpdate, Rule: rule, Object: merged, Reason: ReasonRecordLastApplied})
		return
	}
	obj := merged
	if op == OpDelete {
		obj = observed
	}
	p.add(key, Action{Op: op, Rule: rule, Object: obj, Reason: reason})
}

// updateSSA plans the server-side apply of an existing child: op is
// OpUpdate (InPlace) or OpDelete (Recreate).
func (p *planner) updateSSA(key childKey, rule *Rule, op Op, observed, desired *unstructured.Unstructured) {
	cfg, err := p.configuration(desired)
	if err != nil {
		p.fail(key, fmt.Errorf("computing apply configuration: %w", err))
		return
	}
	settled := apply.Settled(observed.Object, cfg.Object)
	reason := ReasonOwnership
	if op == OpDelete {
		if !settled {
			reason = ReasonChangedRecreate
		}
		p.add(key, Action{Op: OpDelete, Rule: rule, Object: observed, Verify: cfg, Settled: settled, Reason: reason})
		return
	}
	_, legacy := observed.GetAnnotations()[apply.LastAppliedAnnotation]
	if !settled || legacy {
		settled, reason = false, ReasonChangedInPlace
	}
	p.add(key, Action{Op: OpApply, Rule: rule, Object: cfg, Observed: observed, Settled: settled, DropLastApplied: legacy, Reason: reason})
}

// configuration is the applied configuration of a desired child: the
// controller reference is added as on a create.
func (p *planner) configuration(desired *unstructured.Unstructured) (*unstructured.Unstructured, error) {
	cfg, err := apply.Configuration(desired)
	if err != nil {
		return nil, err
	}
	if err := setControllerRef(cfg, p.owner); err != nil {
		return nil, err
	}
	return cfg, nil
}

func (p *planner) create(d indexedDesired) {
	if p.ssa {
		cfg, err := p.configuration(d.object)
		if err != nil {
			p.fail(d.key, fmt.Errorf("preparing create: %w", err))
			return
		}
		p.add(d.key, Action{Op: OpApply, Rule: d.rule, Object: cfg, Reason: ReasonMissing})
		return
	}
	obj, err := apply.PrepareCreate(d.object)
	if err != nil {
		p.fail(d.key, fmt.Errorf("preparing create: %w", err))
		return
	}
	if err := setControllerRef(obj, p.owner); err != nil {
		p.fail(d.key, err)
		return
	}
	// A hook that copies objects from its request may echo server-owned metadata; the API
	// server refuses a create that carries a resourceVersion, so drop them from the object (the
	// annotation keeps them, and updates revert them to the observed values anyway).
	meta := obj.Object["metadata"].(map[string]any) // setControllerRef made sure it exists
	for _, f := range serverOwnedMetadata {
		delete(meta, f)
	}
	p.add(d.key, Action{Op: OpCreate, Rule: d.rule, Object: obj, Reason: ReasonMissing})
}

// serverOwnedMetadata are metadata fields that only the API server sets.
var serverOwnedMetadata = [...]string{
	"uid", "resourceVersion", "generation", "creationTimestamp", "deletionTimestamp",
	"deletionGracePeriodSeconds", "managedFields", "selfLink",
}

// setControllerRef appends the owner's controller reference to obj's ownerReferences (which obj
// owns: it is PrepareCreate's or apply.Configuration's copy), dropping any existing reference to the same UID.
func setControllerRef(obj *unstructured.Unstructured, owner Owner) error {
	meta, err := metadata(obj.Object)
	if err != nil {
		return err
	}
	var refs []any
	switch existing := meta["ownerReferences"].(type) {
	case []any:
		refs = make([]any, 0, len(existing)+1)
		for _, r := range existing {
			if m, ok := r.(map[string]any); ok && m["uid"] == owner.UID {
				continue
			}
			refs = append(refs, r)
		}
	case nil:
	default:
		return fmt.Errorf("metadata.ownerReferences must be a list, got %T", existing)
	}
	meta["ownerReferences"] = append(refs, map[string]any{
		"apiVersion":         owner.APIVersion,
		"kind":               owner.Kind,
		"name":               owner.Name,
		"uid":                owner.UID,
		"controller":         true,
		"blockOwnerDeletion": true,
	})
	return nil
}

// indexDesired checks that every desired entry belongs to rules and that keys are unique.
// Entries are matched to rules by pointer (as Normalize returns them) or else by apiVersion and
// kind, so that a caller holding a copy of the rules still works.
func indexDesired(rules []Rule, desired []Desired) (desiredIndex, error) {
	byPtr := make(map[*Rule]int, len(rules))
	byType := make(map[[2]string]int, len(rules))
	for j := len(rules) - 1; j >= 0; j-- { // backwards so the first declaration wins
		byPtr[&rules[j]] = j
		byType[[2]string{rules[j].APIVersion, rules[j].Kind}] = j
	}
	want := desiredIndex{list: make([]indexedDesired, 0, len(desired)), byKey: make(map[childKey]int, len(desired))}
	for i, d := range desired {
		if d.Rule == nil || d.Object == nil || d.Object.Object == nil {
			return desiredIndex{}, fmt.Errorf("children: desired entry %d has no rule or no object", i)
		}
		ruleIdx, ok := byPtr[d.Rule]
		if !ok {
			ruleIdx, ok = byType[[2]string{d.Rule.APIVersion, d.Rule.Kind}]
		}
		if !ok {
			return desiredIndex{}, fmt.Errorf("children: desired entry %d (%s.%s) matches no rule", i, d.Rule.Kind, d.Rule.APIVersion)
		}
		rule := &rules[ruleIdx]
		key := keyOf(ruleIdx, rule, d.Object)
		if key.name == "" {
			return desiredIndex{}, fmt.Errorf("children: desired entry %d (%s.%s) has no name", i, rule.Kind, rule.APIVersion)
		}
		if _, dup := want.byKey[key]; dup {
			return desiredIndex{}, fmt.Errorf("children: desired entry %d duplicates %s", i, ChildKey{rule.APIVersion, rule.Kind, key.namespace, key.name})
		}
		want.byKey[key] = len(want.list)
		want.list = append(want.list, indexedDesired{key: key, rule: rule, object: d.Object})
	}
	return want, nil
}

func keyOf(ruleIdx int, rule *Rule, obj *unstructured.Unstructured) childKey {
	k := childKey{rule: ruleIdx, name: obj.GetName()}
	if rule.Namespaced {
		k.namespace = obj.GetNamespace()
	}
	return k
}

func isDeleting(obj map[string]any) bool {
	meta, _ := obj["metadata"].(map[string]any)
	return meta["deletionTimestamp"] != nil
}

func phase(a Action) int {
	switch {
	case a.Op == OpDelete:
		return 0
	case a.Creates():
		return 1
	default:
		return 2
	}
}
