package applier

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"

	"go.uber.org/zap"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/metabus/metabus/pkg/bus"
	"github.com/metabus/metabus/pkg/events"
	"github.com/metabus/metabus/pkg/jsbus"
	"github.com/metabus/metabus/pkg/kinds"
	"github.com/metabus/metabus/pkg/kindtable"
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
// kind's Applying rules. The kind's parent plan says first whether to
// apply at all (a parent it skips costs no discovery); then, with the
// child rules resolved, planApply decides every write and its order
// (plan.go), and the loop below executes the plan, one step at a time,
// through the writes of kube.go:
//
//   - a failed parent patch, release or adoption ends the apply
//     (parentWriteFailed);
//   - a child write that fails or conflicts does not stop the others,
//     nor the status write; then the failures retry the apply, a
//     conflict requeues it, and only an apply without either removes the
//     finalizer;
//   - a parent that claims or rolls out is planned in two phases: the
//     plan's first phase ends with the step that adopts, or loads and
//     commits the revisions, and the rest is planned from what it
//     returned, and appended.
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
	id, w, err := a.resolveIdentity(snap.Controller.GetAnnotations())
	if err != nil {
		return a.identityRefused(ds, err)
	}
	if !id.None() {
		ctx = actAs(ctx, id, w)
	}
	noteIdentity(ctx, id)
	in := planInput{Kind: ctrl, Desired: ds, Snapshot: snap, ObservesChildren: observesChildren(snap), Options: a.planOptions, Covered: a.covered}
	in.Parent, err = ctrl.ApplyParent(kinds.ApplyInput{Desired: ds, Parent: snap.Parent, ParentResource: snap.ParentResource, ParentHasStatus: snap.ParentHasStatus})
	if err != nil {
		return retryAfter(events.ReasonApplyError, err)
	}
	switch in.Parent.Gate {
	case kinds.ApplyParentDeleting:
		return done(resultParentDeleting)
	case kinds.ApplyStale:
		return requeue(ds)
	}
	if in.ObservesChildren {
		if in.Rules, err = a.resolveRules(ctx, ctrl.ApplyChildRules()); err != nil {
			return retryAfter(events.ReasonApplyError, err)
		}
	}
	p, err := planApply(in)
	if err != nil {
		return a.planFailed(err)
	}

	var (
		parent   = snap.Parent // as last written
		observed = maps.Clone(p.observed)
		adopt    = true
		errs     []error
		conflict bool
		created  bool
	)
	// The steps of a second phase are appended as the first one ends.
	for i := 0; i < len(p.Steps); i++ {
		s := p.Steps[i]
		switch s.Kind {
		case stepPatchParent:
			if parent, err = a.writeParent(ctx, ds, parent, s.Write); err != nil {
				return parentWriteFailed(ds, err)
			}
		case stepRelease:
			if _, err := a.setControllerRef(ctx, s.Rule, s.Object, p.owner, p.decl.OwnerUIDLabels, false); err != nil && !apierrors.IsNotFound(err) {
				return parentWriteFailed(ds, err)
			}
		case stepRecheckParent:
			if adopt, err = a.adoptable(ctx, ds); err != nil {
				return parentWriteFailed(ds, err)
			}
		case stepAdopt:
			if !adopt {
				continue
			}
			adopted, err := a.setControllerRef(ctx, s.Rule, s.Object, p.owner, p.decl.OwnerUIDLabels, true)
			switch {
			case apierrors.IsNotFound(err):
			case err != nil:
				return parentWriteFailed(ds, err)
			default:
				observed[s.RuleIndex] = append(observed[s.RuleIndex], adopted)
			}
		case stepPlanChildren:
			if err := p.afterClaims(observed); err != nil {
				return a.planFailed(err)
			}
		case stepRollout:
			actions, err := a.rolling(ctx, ds, p, parent, observed)
			if err != nil {
				return err
			}
			if err := p.afterRollout(parent, actions); err != nil {
				return a.planFailed(err)
			}
		case stepChild:
			switch err := a.write(ctx, s.Action); {
			case apierrors.IsConflict(err):
				conflict = true
			case err != nil:
				errs = append(errs, err)
			default:
				created = created || s.Action.Creates()
			}
		case stepStatus:
			if s.DeferIfCreated && created {
				a.metrics.statusDeferred.Inc()
				continue
			}
			switch out, err := a.writeParent(ctx, ds, parent, s.Write); {
			case apierrors.IsConflict(err):
				conflict = true
			case err != nil:
				errs = append(errs, err)
			default:
				parent = out
			}
		case stepRemoveFinalizer:
			if err := unfinished(ds, errs, conflict); err != nil {
				return err
			}
			if _, err := a.removeFinalizer(ctx, ds, parent, s.Finalizer); err != nil {
				return parentWriteFailed(ds, err)
			}
			return done(resultFinalized)
		}
	}
	if err := unfinished(ds, errs, conflict); err != nil {
		return err
	}
	if !p.Writes {
		return done(resultNoop)
	}
	return nil
}

// planFailed is how a plan refused ends an apply: retried with the
// plan's Event reason (a rejected hook answer is counted).
func (a *Applier) planFailed(err error) error {
	var refused *planError
	if !errors.As(err, &refused) {
		return retryAfter(events.ReasonApplyError, err)
	}
	if refused.rejected {
		a.metrics.rejected.Inc()
	}
	return retryAfter(refused.reason, refused.err)
}

// unfinished is how an apply ends whose child or status writes failed
// (retried with an ApplyError, or a CreateConflict: failureReason) or
// conflicted (synced again now): nil if none did.
func unfinished(ds *bus.DesiredState, errs []error, conflict bool) error {
	if len(errs) > 0 {
		return retryAfter(failureReason(errs), errors.Join(errs...))
	}
	if conflict {
		return requeue(ds)
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

// release removes a finalizer of a controller that is gone (or lost its
// finalize hook). This is the one path that reads the parent live: it has
// no snapshot to work from (the controller is not wired any more) and runs
// once per parent per controller deletion.
//
// The controller is gone, so no controller object names an identity: the
// release is the applier's own (it removes only the finalizer the
// controller's kind put there).
func (a *Applier) release(ctx context.Context, ds *bus.DesiredState) error {
	c, err := parentResource(a.dyn, ds.Parent)
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
		_, err = a.removeFinalizer(ctx, ds, parent, ds.Finalizer)
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
