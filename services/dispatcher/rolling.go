package dispatcher

import (
	"context"
	"fmt"
	"sync"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/metabus/metabus/pkg/api/v1alpha1"
	"github.com/metabus/metabus/pkg/bus"
	"github.com/metabus/metabus/pkg/events"
	"github.com/metabus/metabus/pkg/hookapi"
	"github.com/metabus/metabus/pkg/revision"
	"github.com/metabus/metabus/pkg/revstore"
	"github.com/metabus/metabus/pkg/rollout"
)

// history loads the revision history of a parent with rolling children,
// before any hook call: the hook is called once per live revision.
// ok=false means the outcome is final (the failure is reported).
func (d *Dispatcher) history(ctx context.Context, call syncCall, cc *v1alpha1.CompositeController, parent *unstructured.Unstructured) (*revision.History, outcome, bool) {
	if parent.GetNamespace() == "" {
		// ControllerRevisions are namespaced, so a cluster-scoped parent has
		// nowhere to keep its rollout (upstream fails here too, obscurely).
		return nil, d.failed(ctx, call.item, events.ReasonSyncError,
			fmt.Errorf("CompositeController %s: RollingRecreate and RollingInPlace need a namespaced parent resource (ControllerRevisions are namespaced); use Recreate or InPlace", cc.Name)), false
	}
	patch, err := revision.ParentPatch(parent.Object, rollout.FieldPaths(cc))
	if err != nil {
		return nil, d.failed(ctx, call.item, events.ReasonSyncError, fmt.Errorf("revisionHistory.fieldPaths: %w", err)), false
	}
	res, err := d.revs.Revisions(ctx, revstore.Request{
		// A stale view only costs a resync: the applier loads consistently
		// and rejects a desired state missing a revision's rendering.
		Op: revstore.OpLoad, Controller: call.item.Controller, AllowStale: true,
		Parent: revstore.Parent{
			APIVersion: parent.GetAPIVersion(), Kind: parent.GetKind(), Resource: call.parent.Resource,
			Namespace: parent.GetNamespace(), Name: parent.GetName(), UID: string(parent.GetUID()),
		},
	})
	if err == nil && res.Result != revstore.OK {
		err = fmt.Errorf("%s: %s", res.Result, res.Message)
	}
	if err != nil {
		return nil, d.failedQuietly(ctx, call.item, fmt.Errorf("load ControllerRevisions: %w", err)), false
	}
	h, err := revision.NewHistory(rollout.HistoryParent(cc, parent, call.parent.Resource), res.Revisions, patch)
	if err != nil {
		return nil, d.failed(ctx, call.item, events.ReasonSyncError, err), false
	}
	return h, outcome{}, true
}

// syncRevisions calls the hook for a parent with rolling children: once for
// the parent as it is (the latest revision) and once for every older
// revision that still holds children, with the parent as of that revision,
// all at once (as upstream), so a rollout costs one hook latency per sync,
// not one per revision. The answers are aggregated as upstream does.
// ok=false means the outcome is final (the failure is reported).
func (d *Dispatcher) syncRevisions(ctx context.Context, call syncCall, cc *v1alpha1.CompositeController, parent *unstructured.Unstructured, h *revision.History) (bus.DesiredState, outcome, bool) {
	req, isComposite := call.request.(hookapi.CompositeSyncRequest)
	if !isComposite {
		return bus.DesiredState{}, outcome{result: "invalid"}, false
	}
	paths := rollout.FieldPaths(cc)
	revs := h.Revisions() // the latest first
	calls := make([]syncCall, len(revs))
	for i, r := range revs {
		calls[i] = call
		if r.Latest {
			continue
		}
		asOf, err := revision.ApplyPatch(parent.Object, r.Patch, paths)
		if err != nil {
			return bus.DesiredState{}, d.failed(ctx, call.item, events.ReasonSyncError, fmt.Errorf("render %s as of revision %s: %w", parent.GetName(), r.Name, err)), false
		}
		old := req
		old.Parent = &unstructured.Unstructured{Object: asOf}
		calls[i].request, calls[i].revision = old, r.Name
	}
	resps := make([]hookapi.CompositeSyncResponse, len(revs))
	errs := make([]error, len(revs))
	var wg sync.WaitGroup
	for i := range calls {
		wg.Go(func() { errs[i] = d.doHook(ctx, calls[i], &resps[i]) })
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			return bus.DesiredState{}, d.hookFailed(ctx, calls[i], err), false
		}
	}

	ds := bus.DesiredState{Children: resps[0].Children, LatestRevision: h.Latest()}
	results := make([]rollout.RevisionResult, len(revs))
	for i, r := range revs {
		results[i] = rollout.RevisionResult{Revision: r.Name, Latest: r.Latest, Status: resps[i].Status,
			ResyncAfterSeconds: resps[i].ResyncAfterSeconds, Finalized: resps[i].Finalized}
		if !r.Latest {
			ds.Revisions = append(ds.Revisions, bus.RevisionChildren{Name: r.Name, Children: nonNilChildren(resps[i].Children)})
		}
	}
	ds.Status, ds.ResyncAfterSeconds, ds.Finalized = rollout.Aggregate(results)
	return ds, outcome{}, true
}

func nonNilChildren(c []*unstructured.Unstructured) []*unstructured.Unstructured {
	if c == nil {
		return []*unstructured.Unstructured{}
	}
	return c
}
