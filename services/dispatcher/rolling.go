package dispatcher

import (
	"context"
	"fmt"

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

// syncRevisions completes a sync of a parent with rolling children: the hook
// has answered for the parent as it is (the latest revision, resp); now it is
// called once more for every older revision that still holds children, with
// the parent as of that revision, and the answers are aggregated as upstream
// does. ok=false means the outcome is final (the failure is reported).
func (d *Dispatcher) syncRevisions(ctx context.Context, call syncCall, cc *v1alpha1.CompositeController, parent *unstructured.Unstructured, h *revision.History, resp hookapi.CompositeSyncResponse) (bus.DesiredState, outcome, bool) {
	ds := bus.DesiredState{Children: resp.Children, Status: resp.Status, ResyncAfterSeconds: resp.ResyncAfterSeconds, Finalized: resp.Finalized}
	paths := rollout.FieldPaths(cc)
	ds.LatestRevision = h.Latest()
	results := []rollout.RevisionResult{{Revision: h.Latest(), Latest: true, Status: resp.Status,
		ResyncAfterSeconds: resp.ResyncAfterSeconds, Finalized: resp.Finalized}}
	for _, r := range h.Revisions() {
		if r.Latest {
			continue
		}
		asOf, err := revision.ApplyPatch(parent.Object, r.Patch, paths)
		if err != nil {
			return ds, d.failed(ctx, call.item, events.ReasonSyncError, fmt.Errorf("render %s as of revision %s: %w", parent.GetName(), r.Name, err)), false
		}
		old := call
		old.revision = r.Name
		req, ok := call.request.(hookapi.CompositeSyncRequest)
		if !ok {
			return ds, outcome{result: "invalid"}, false
		}
		req.Parent = &unstructured.Unstructured{Object: asOf}
		old.request = req
		var oldResp hookapi.CompositeSyncResponse
		if out, ok := d.callHook(ctx, old, &oldResp); !ok {
			return ds, out, false
		}
		ds.Revisions = append(ds.Revisions, bus.RevisionChildren{Name: r.Name, Children: nonNilChildren(oldResp.Children)})
		results = append(results, rollout.RevisionResult{Revision: r.Name, Status: oldResp.Status,
			ResyncAfterSeconds: oldResp.ResyncAfterSeconds, Finalized: oldResp.Finalized})
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
