package kinds

import (
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/metabus/metabus/pkg/apply"
	"github.com/metabus/metabus/pkg/bus"
	"github.com/metabus/metabus/pkg/children"
	"github.com/metabus/metabus/pkg/snapshot"
)

// WritesNothing reports whether applying ds, a sync hook's answer for a
// parent's own item, against snap, the observed state the hook was shown,
// would write nothing at all: no child created, updated or deleted, none
// adopted or released, no parent patch (labels, annotations, finalizer),
// no status, no finalizer removed, nothing rolled out. It runs the
// applier's own pure plan (ApplyParent, children.Normalize,
// children.PlanWith) on that snapshot, so a dispatcher holding it can
// settle such an answer without publishing it, and the applier without
// fetching the snapshot again to find out the same.
//
// strategy is the appliers' --apply-strategy. Under server-side apply an
// answer is always sent (upstream sends an apply of every child on every
// sync), so only dynamic apply, or a kind that always uses it, qualifies.
// Whenever the answer is not plainly a no-op the result is false and the
// applier decides as always: an answer the applier would reject (its error
// reported on the parent), a release, a finalize answer, a keyed item,
// revisions or a rolling parent, a snapshot whose groups do not match the
// declared child resources, or a selector error.
func WritesNothing(k Applying, ds *bus.DesiredState, snap *snapshot.Response, strategy apply.Strategy) bool {
	if ds == nil || snap == nil || snap.Parent == nil || snap.Summary != nil || snap.SelectorError != "" {
		return false
	}
	if ds.Hook != bus.HookSync || ds.MapKey != "" || len(ds.Revisions) > 0 || ds.LatestRevision != "" {
		return false
	}
	decl := k.ApplyChildRules()
	if strategy != apply.DynamicApply && !decl.DynamicApplyOnly {
		return false
	}
	plan, err := k.ApplyParent(ApplyInput{Desired: ds, Parent: snap.Parent, ParentResource: snap.ParentResource, ParentHasStatus: snap.ParentHasStatus})
	if err != nil || plan.Gate != ApplyProceed || plan.Patch != nil || plan.Status != nil || plan.RemoveFinalizer != "" {
		return false
	}
	if _, rolls := k.ApplyRollout(snap.Parent, ds.Parent.Resource); rolls {
		return false
	}
	// The snapshot's groups are the declared child resources in spec
	// order, each with the kind and scope discovery gave the watcher: the
	// rules the applier resolves.
	if len(snap.Children) != len(decl.Rules) {
		return false
	}
	rules := make([]children.Rule, len(decl.Rules))
	observed := make(map[int][]*unstructured.Unstructured, len(snap.Children))
	for i, r := range decl.Rules {
		g := snap.Children[i]
		if g.APIVersion != r.APIVersion || g.Resource != r.Resource || g.Kind == "" {
			return false
		}
		if k.ApplyClaims() && len(g.Adopt)+len(g.Release) > 0 {
			return false
		}
		rules[i] = children.Rule{APIVersion: r.APIVersion, Resource: r.Resource, Kind: g.Kind, Namespaced: g.Namespaced, Method: r.Method}
		observed[i] = g.Objects
	}
	if children.CheckDistinct(decl.Field, rules) != nil {
		return false
	}
	owner, err := k.ApplyOwner(snap.Parent, ds)
	if err != nil {
		return false
	}
	desired, err := children.Normalize(owner, rules, ds.Children)
	if err != nil {
		return false
	}
	actions, err := children.PlanWith(children.Options{Strategy: apply.DynamicApply}, owner, rules, observed, desired)
	return err == nil && len(actions) == 0
}
