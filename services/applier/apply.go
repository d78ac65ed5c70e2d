package applier

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"go.uber.org/zap"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/metabus/metabus/pkg/bus"
	"github.com/metabus/metabus/pkg/children"
	"github.com/metabus/metabus/pkg/events"
	"github.com/metabus/metabus/pkg/jsbus"
	"github.com/metabus/metabus/pkg/kinds"
	"github.com/metabus/metabus/pkg/kindtable"
	"github.com/metabus/metabus/pkg/rollout"
	"github.com/metabus/metabus/pkg/snapshot"
)

// apply handles one desired state; the error says how it ended (see
// settle).
func (a *Applier) apply(ctx context.Context, ds *bus.DesiredState) error {
	if ds.Hook == bus.HookRelease {
		return a.release(ctx, ds)
	}
	if _, ok := kindtable.Lookup(ds.Controller.Kind); !ok {
		a.log.Error("dropping desired state for an unsupported controller kind", zap.String("kind", ds.Controller.Kind))
		return done(resultUnsupported)
	}
	snap, err := a.observe(ctx, ds)
	if err != nil {
		return err
	}
	return a.applyParent(ctx, ds, snap)
}

// observe fetches fresh observed state, at least as fresh as what the hook
// saw (and as this replica's own last write of the parent). A keyed desired
// state is applied against its map key's snapshot: only that key's outputs,
// so it plans, and deletes, nothing of the parent's other keys.
func (a *Applier) observe(ctx context.Context, ds *bus.DesiredState) (*snapshot.Response, error) {
	snap, err := snapshot.Fetch(ctx, a.snaps, snapshot.Request{
		Controller: ds.Controller, ParentUID: ds.Parent.UID, MinResourceVersions: a.freshness(ds), MapKey: ds.MapKey,
	}, a.cfg.SnapshotWait)
	if err != nil {
		reason := ""
		if errors.Is(err, jsbus.ErrTooLarge) {
			reason = events.ReasonApplyError // cannot heal by itself: say so on the parent
		}
		return nil, retryAfter(reason, fmt.Errorf("observed state unavailable: %w", err))
	}
	switch snap.Result {
	case snapshot.OK:
		return snap, nil
	case snapshot.NotFound:
		return nil, done(resultNotFound)
	case snapshot.Retry:
		return nil, retryAfter("", fmt.Errorf("observed state not fresh yet: %s", snap.Message))
	default:
		return nil, done(resultInvalid)
	}
}

// applyParent converges one parent of any kind towards ds, driven by its
// kind's Applying rules:
//
//  1. the kind's parent plan says whether to apply at all;
//  2. the child rules, the owner and the hook's children are validated,
//     and the children planned where they can be: a response known to be
//     wrong is rejected as a whole, before any write, as a partial apply
//     could leave the cluster worse;
//  3. the parent patch (labels, annotations, and the finalizer, which must
//     be in place before any child exists so that deletion waits for the
//     finalize hook);
//  4. adoption and release of children (kinds that claim), then the
//     children planned against the claimed ones, gradually for kinds that
//     roll out;
//  5. the child writes, then the status (written even if a child write
//     failed: it reports what the hook observed, as upstream does);
//  6. after a finalize hook's final answer, and only once every other
//     write is done, the finalizer's removal.
//
// Everything is compared with the snapshot first, so a no-op sync makes no
// API call (and never a GET). Every write carries the observed
// resourceVersion or UID: a parent or child changed since yields a
// conflict and a new sync rather than a lost update.
func (a *Applier) applyParent(ctx context.Context, ds *bus.DesiredState, snap *snapshot.Response) error {
	ctrl, err := kindtable.Decode(snap.Controller)
	if err != nil {
		return done(resultInvalid)
	}
	parent := snap.Parent
	in := kinds.ApplyInput{Desired: ds, Parent: parent, ParentResource: snap.ParentResource, ParentHasStatus: snap.ParentHasStatus}
	plan, err := ctrl.ApplyParent(in)
	if err != nil {
		return retryAfter(events.ReasonApplyError, err)
	}
	switch plan.Gate {
	case kinds.ApplyParentDeleting:
		return done(resultParentDeleting)
	case kinds.ApplyStale:
		return requeue(ds)
	}

	decl := ctrl.ApplyChildRules()
	var (
		rules   []children.Rule
		owner   children.Owner
		desired []children.Desired
		claims  claims
		roll    kinds.ApplyRolloutSpec
		rolls   bool
		actions []children.Action
		// planned: the child actions are known (none at all without
		// observed children).
		planned = !observesChildren(snap)
	)
	if planned {
		// A keyed kind's per-parent snapshot holds the parent and its
		// summary, never children: its desired state is about the parent
		// alone (an aggregated status). Nothing about children can be
		// planned from it, and above all nothing deleted: every output
		// would look undesired. A desired state that names children here
		// is a kind's mistake, refused before any write.
		if len(ds.Children)+len(ds.Revisions) > 0 {
			return retryAfter(events.ReasonApplyError, fmt.Errorf("%s desired state names %s, but its snapshot observes none (a per-parent snapshot): nothing applied", ds.Hook, decl.Noun))
		}
	} else {
		if rules, err = a.resolveRules(ctx, decl); err != nil {
			return retryAfter(events.ReasonApplyError, err)
		}
		if owner, err = ctrl.ApplyOwner(parent, ds); err != nil {
			return retryAfter(events.ReasonSyncError, err)
		}
		if desired, err = children.Normalize(owner, rules, ds.Children); err != nil {
			a.metrics.rejected.Inc()
			reason := decl.RejectReason
			if reason == "" {
				reason = events.ReasonInvalidDesired
			}
			return retryAfter(reason, fmt.Errorf("%s hook response rejected, nothing applied: %w", ds.Hook, err))
		}
		claims = claimsOf(ctrl.ApplyClaims(), len(rules), snap.Children)
		roll, rolls = ctrl.ApplyRollout(parent, ds.Parent.Resource)
	}
	if !planned && !rolls && !claims.writes() {
		// Nothing to adopt: the children can be planned before the first
		// write, so a plan that fails writes nothing.
		if actions, err = children.PlanWith(a.planOptions(decl), owner, rules, claims.observed, desired); err != nil {
			return retryAfter(events.ReasonApplyError, fmt.Errorf("plan %s: %w", decl.Noun, err))
		}
		planned = true
	}

	if plan.Patch != nil {
		if parent, err = a.writeParent(ctx, ds, parent, patchWrite(plan)); err != nil {
			return parentWriteFailed(ds, err)
		}
	}
	observed := claims.observed
	if claims.writes() {
		if observed, err = a.claim(ctx, ds, owner, rules, decl.OwnerUIDLabels, claims); err != nil {
			return parentWriteFailed(ds, err)
		}
	}
	switch {
	case rolls:
		var cond rollout.Condition
		if actions, cond, err = a.rolling(ctx, ds, roll, parent, owner, rules, decl, desired, observed); err != nil {
			return err
		}
		// The rollout's Updated condition joins the hook's status: plan
		// the status again with it.
		withUpdatedCondition(ds, cond)
		in.Parent = parent
		again, err := ctrl.ApplyParent(in)
		if err != nil {
			return retryAfter(events.ReasonApplyError, err)
		}
		plan.Status = again.Status
	case !planned:
		// Adopting changed the children's resourceVersions: plan against
		// the adopted objects.
		if actions, err = children.PlanWith(a.planOptions(decl), owner, rules, observed, desired); err != nil {
			return retryAfter(events.ReasonApplyError, fmt.Errorf("plan %s: %w", decl.Noun, err))
		}
	}

	actions = a.dropCovered(actions)
	var errs []error
	conflict, created := false, false
	for _, act := range actions {
		if err := a.write(ctx, act); err != nil {
			if apierrors.IsConflict(err) {
				conflict = true
				continue
			}
			errs = append(errs, err)
		} else if act.Creates() {
			created = true
		}
	}
	if created && plan.Status != nil && ds.Hook == bus.HookSync && !rolls && len(ds.Inputs) > 0 {
		// Only for a controller that opted into echo suppression
		// (ds.Inputs is set for no other): the children created just now
		// come back as watch events that sync the parent again, and that
		// hook call sees them (a new object is never an echo), so the
		// status this call computed without them is out of date before
		// it is written. Leave the status to that sync: a new parent
		// costs one API write fewer (two instead of three for one
		// child). Under upstream's contract every answer's status is
		// written: a hook may record a decision there and read it back
		// on the next call. A rolling parent keeps its write: its
		// status carries the rollout's condition.
		plan.Status = nil
		a.metrics.statusDeferred.Inc()
	}
	if plan.Status != nil {
		out, err := a.writeParent(ctx, ds, parent, parentWrite{verb: verbUpdateStatus, status: plan.Status})
		switch {
		case apierrors.IsConflict(err):
			conflict = true
		case err != nil:
			errs = append(errs, err)
		default:
			parent = out
		}
	}
	if len(errs) > 0 {
		return retryAfter(events.ReasonApplyError, errors.Join(errs...))
	}
	if conflict {
		return requeue(ds)
	}
	if f := plan.RemoveFinalizer; f != "" {
		if _, err := a.writeParent(ctx, ds, parent, finalizerRemoval(parent, f)); err != nil {
			return parentWriteFailed(ds, err)
		}
		return done(resultFinalized)
	}
	if len(actions) == 0 && plan.Patch == nil && plan.Status == nil && !claims.writes() {
		// Nothing written at all, which is what a no-op sync must cost.
		return done(resultNoop)
	}
	return nil
}

// observesChildren reports whether snap can be planned against: every
// snapshot holds its parent's children (one group per child rule, empty
// ones included) except a keyed kind's per-parent one, which carries the
// parent's Summary instead (snapshot.Request.MapKey).
func observesChildren(snap *snapshot.Response) bool { return snap.Summary == nil }

// parentWriteFailed is how a failed parent (or adoption) write ends an
// apply: a conflict syncs again now (the parent changed), a parent gone
// ends it, anything else retries with backoff.
func parentWriteFailed(ds *bus.DesiredState, err error) error {
	if apierrors.IsConflict(err) {
		return requeue(ds)
	}
	if apierrors.IsNotFound(err) {
		return done(resultNotFound)
	}
	return retryAfter(events.ReasonApplyError, err)
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

// claim carries out the claims: it releases owned children that stopped
// matching and adopts matching orphans, and returns the children per rule
// to plan with (the adopted ones as adopted).
func (a *Applier) claim(ctx context.Context, ds *bus.DesiredState, owner children.Owner, rules []children.Rule, uidLabels []string, c claims) (map[int][]*unstructured.Unstructured, error) {
	adopting := false
	for i, objs := range c.release {
		for _, o := range objs {
			if _, err := a.setControllerRef(ctx, &rules[i], o, owner, uidLabels, false); err != nil && !apierrors.IsNotFound(err) {
				return nil, err
			}
		}
		adopting = adopting || len(c.adopt[i]) > 0
	}
	if !adopting {
		return c.observed, nil
	}
	// Never adopt for a parent that is being deleted: recheck it without
	// the cache, as the cache may lag the deletion.
	pc, err := a.parentClient(ds.Parent)
	if err != nil {
		return nil, err
	}
	live, err := pc.Get(ctx, ds.Parent.Name, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("recheck parent before adopting: %w", err)
	}
	if live.GetDeletionTimestamp() != nil || string(live.GetUID()) != ds.Parent.UID {
		return c.observed, nil
	}
	observed := make(map[int][]*unstructured.Unstructured, len(c.observed)+1)
	for i, objs := range c.observed {
		observed[i] = objs
	}
	for i, objs := range c.adopt {
		for _, o := range objs {
			adopted, err := a.setControllerRef(ctx, &rules[i], o, owner, uidLabels, true)
			if err != nil {
				if apierrors.IsNotFound(err) {
					continue
				}
				return nil, err
			}
			// observed[i] is this apply's own slice (claimsOf built it) or
			// nil, never the snapshot's.
			observed[i] = append(observed[i], adopted)
		}
	}
	return observed, nil
}

// release removes a finalizer of a controller that is gone (or lost its
// finalize hook). This is the one path that reads the parent live: it has
// no snapshot to work from (the controller is not wired any more) and runs
// once per parent per controller deletion.
func (a *Applier) release(ctx context.Context, ds *bus.DesiredState) error {
	c, err := a.parentClient(ds.Parent)
	if err != nil {
		return done(resultInvalid)
	}
	for attempt := 0; attempt < 5; attempt++ {
		parent, err := c.Get(ctx, ds.Parent.Name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) || (err == nil && string(parent.GetUID()) != ds.Parent.UID) {
			return done(resultNotFound)
		}
		if err != nil {
			return retryAfter("", fmt.Errorf("read parent to release finalizer: %w", err))
		}
		if !slices.Contains(parent.GetFinalizers(), ds.Finalizer) {
			return done(resultNoop)
		}
		_, err = a.writeParent(ctx, ds, parent, finalizerRemoval(parent, ds.Finalizer))
		if err == nil {
			a.log.Info("released finalizer of a removed controller", zap.String("finalizer", ds.Finalizer),
				zap.String("parent", key(parent)))
			return done(resultReleased)
		}
		if !apierrors.IsConflict(err) {
			return retryAfter(events.ReasonApplyError, err)
		}
	}
	return retryAfter("", fmt.Errorf("release finalizer %s: parent keeps changing", ds.Finalizer))
}
