package applier

import (
	"context"
	"errors"
	"fmt"

	"go.uber.org/zap"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/metabus/metabus/pkg/api/v1alpha1"
	"github.com/metabus/metabus/pkg/bus"
	"github.com/metabus/metabus/pkg/children"
	"github.com/metabus/metabus/pkg/events"
	"github.com/metabus/metabus/pkg/revision"
	"github.com/metabus/metabus/pkg/revstore"
	"github.com/metabus/metabus/pkg/rollout"
)

// rolling plans the child writes of a parent with RollingRecreate or
// RollingInPlace children. It runs inside the parent's critical section (one
// MC_DESIRED message of a parent at a time, cluster-wide), which is what keeps
// two appliers from advancing the same rollout:
//
//  1. load the parent's ControllerRevisions with a consistent read through the
//     revisions service (adopting orphans that match the parent's selector);
//  2. rollout.Step renders each child from its own revision and decides which
//     one child, if any, moves to the latest revision;
//  3. the revision writes that record the move are committed BEFORE any child
//     is touched, so a crash at any point either leaves the move unrecorded
//     (it is decided again) or recorded (the child is updated at the next try),
//     and never updates a child twice or skips one;
//  4. the rollout's Updated condition joins the desired status (ds.Status).
//
// An error ends the apply (see settle) before any child action.
func (a *Applier) rolling(ctx context.Context, ds *bus.DesiredState, p *applyPlan, parent *unstructured.Unstructured,
	observed map[int][]*unstructured.Unstructured,
) ([]children.Action, error) {
	roll, owner, rules, decl := p.roll, p.owner, p.in.Rules, p.decl
	patch, err := revision.ParentPatch(parent.Object, roll.FieldPaths)
	if err != nil {
		return nil, retryAfter(events.ReasonSyncError, fmt.Errorf("revisionHistory.fieldPaths: %w", err))
	}
	selector := ""
	if owner.Selector != nil {
		selector = owner.Selector.String()
	}
	loaded, err := a.revs.Revisions(ctx, revstore.Request{
		Op: revstore.OpLoad, Controller: ds.Controller, Parent: storeParent(ds, parent, selector),
		Adopt: parent.GetDeletionTimestamp() == nil,
	})
	if err == nil && loaded.Result != revstore.OK {
		err = fmt.Errorf("%s: %s", loaded.Result, loaded.Message)
	}
	if err != nil {
		return nil, retryAfter("", fmt.Errorf("load ControllerRevisions: %w", err))
	}
	h, err := revision.NewHistory(roll.History, loaded.Revisions, patch)
	if err != nil {
		return nil, retryAfter(events.ReasonApplyError, err)
	}
	if ds.LatestRevision != h.Latest() {
		// The parent's rolling fields changed since the hook ran (or the
		// controller just turned rolling): its children would be recorded
		// on the wrong revision. The change has queued a newer sync.
		return nil, a.requeueStale(ds, fmt.Sprintf("desired state renders revision %q, the parent is at %q", ds.LatestRevision, h.Latest()))
	}
	older := make(map[string][]children.Desired, len(ds.Revisions))
	for _, rc := range ds.Revisions {
		d, err := children.Normalize(owner, rules, rc.Children)
		if err != nil {
			a.metrics.rejected.Inc()
			return nil, retryAfter(events.ReasonInvalidDesired,
				fmt.Errorf("%s hook response for revision %s rejected, nothing applied: %w", ds.Hook, rc.Name, err))
		}
		older[rc.Name] = d
	}
	checks := make([][]v1alpha1.StatusConditionCheck, len(decl.Rules))
	for i, r := range decl.Rules {
		checks[i] = r.Checks
	}
	step, err := rollout.Step(rollout.StepInput{
		Owner: owner, Rules: rules, Checks: checks, History: h,
		Latest: p.desired, Older: older, Observed: observed, Apply: p.options,
	})
	var missing *rollout.MissingRevisionsError
	switch {
	case errors.As(err, &missing):
		return nil, a.requeueStale(ds, err.Error())
	case err != nil:
		return nil, retryAfter(events.ReasonApplyError, fmt.Errorf("plan rolling update: %w", err))
	case step.ChildErrors != nil:
		return nil, retryAfter(events.ReasonApplyError, fmt.Errorf("plan %s: %w", decl.Noun, step.ChildErrors))
	}

	creates, updates, deletes := h.Changes()
	if len(creates)+len(updates)+len(deletes) > 0 {
		a.metrics.writes.WithLabelValues("commit_revisions", "controllerrevisions").Inc()
		committed, err := a.revs.Revisions(ctx, revstore.Request{
			Op: revstore.OpCommit, Controller: ds.Controller, Parent: storeParent(ds, parent, selector),
			Creates: creates, Updates: updates, Deletes: deletes,
		})
		switch {
		case err != nil:
			return nil, retryAfter("", fmt.Errorf("commit ControllerRevisions: %w", err))
		case committed.Result == revstore.Conflict:
			return nil, requeue(ds)
		case committed.Result != revstore.OK:
			return nil, retryAfter(events.ReasonApplyError,
				fmt.Errorf("commit ControllerRevisions: %s: %s", committed.Result, committed.Message))
		}
	}
	if step.Plan.Move != nil {
		a.log.Info("rolling update: child moved to the latest revision", zap.String("controller", ds.Controller.Name),
			zap.String("parent", key(parent)), zap.Stringer("child", step.Plan.Move), zap.String("revision", h.Latest()))
	}
	// The rollout's Updated condition joins the hook's status, which the
	// plan's second phase plans again with it.
	withUpdatedCondition(ds, step.Plan.Condition)
	return step.Actions, nil
}

// withUpdatedCondition sets the rollout's Updated condition in the status the
// applier writes.
func withUpdatedCondition(ds *bus.DesiredState, cond rollout.Condition) {
	ds.Status = rollout.WithCondition(ds.Status, cond)
}

func storeParent(ds *bus.DesiredState, parent *unstructured.Unstructured, selector string) revstore.Parent {
	return revstore.Parent{
		APIVersion: parent.GetAPIVersion(), Kind: parent.GetKind(), Resource: ds.Parent.Resource,
		Namespace: parent.GetNamespace(), Name: parent.GetName(), UID: string(parent.GetUID()), Selector: selector,
	}
}

// requeueStale syncs again now when the desired state was computed from a
// view that has moved on; after a few immediate tries it backs off, so a
// view that never settles cannot spin.
func (a *Applier) requeueStale(ds *bus.DesiredState, why string) error {
	a.log.Debug("desired state is stale; syncing again", zap.String("parent", ds.Parent.Namespace+"/"+ds.Parent.Name), zap.String("why", why))
	if ds.Attempt < 3 {
		return &requeueError{attempt: ds.Attempt + 1}
	}
	return retryAfter("", errors.New(why))
}
