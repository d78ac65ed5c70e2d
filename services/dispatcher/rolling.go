package dispatcher

import (
	"context"
	"fmt"
	"strings"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/metabus/metabus/pkg/bus"
	"github.com/metabus/metabus/pkg/kinds"
	"github.com/metabus/metabus/pkg/revision"
	"github.com/metabus/metabus/pkg/revstore"
	"github.com/metabus/metabus/pkg/rollout"
)

// syncRevisions calls the hook for a parent that keeps revisions (rolling
// children): once for the parent as it is (the latest revision) and once
// for every older revision that still holds children, with the parent as
// of that revision, all at once (as upstream), so a rollout costs one hook
// latency per sync, not one per revision. The answers are aggregated as
// upstream does. base are the kind's calls for the parent as it is (one).
func (d *Dispatcher) syncRevisions(ctx context.Context, c syncCall, k kinds.Syncing, base []kinds.HookCall, parent *unstructured.Unstructured, revs *kinds.Revisions) (bus.DesiredState, error) {
	latest, err := kinds.OneCall(base)
	if err != nil {
		return bus.DesiredState{}, failure(fmt.Errorf("%s %s keeps revisions: %w", c.ctrlType, c.ctrlName, err))
	}
	h, err := d.history(ctx, c, parent, revs)
	if err != nil {
		return bus.DesiredState{}, err
	}
	rs := h.Revisions() // the latest first
	calls := make([]kinds.HookCall, len(rs))
	names := make([]string, len(rs))
	for i, r := range rs {
		if r.Latest {
			calls[i] = latest
			continue
		}
		asOf, err := revision.ApplyPatch(parent.Object, r.Patch, revs.FieldPaths)
		if err != nil {
			return bus.DesiredState{}, failure(fmt.Errorf("render %s as of revision %s: %w", parent.GetName(), r.Name, err))
		}
		if calls[i], err = k.SyncAsOf(latest, &unstructured.Unstructured{Object: asOf}); err != nil {
			return bus.DesiredState{}, failure(err)
		}
		names[i] = r.Name
	}
	if err := d.doHooks(ctx, c, calls, names); err != nil {
		return bus.DesiredState{}, err
	}

	var ds bus.DesiredState
	results := make([]rollout.RevisionResult, len(rs))
	for i, r := range rs {
		one, err := k.SyncDesired(calls[i : i+1])
		if err != nil {
			return bus.DesiredState{}, failure(err)
		}
		results[i] = rollout.RevisionResult{Revision: r.Name, Latest: r.Latest, Status: one.Status,
			ResyncAfterSeconds: one.ResyncAfterSeconds, Finalized: one.Finalized}
		if i == 0 {
			ds = one
			ds.LatestRevision = h.Latest()
		}
		if !r.Latest {
			ds.Revisions = append(ds.Revisions, bus.RevisionChildren{Name: r.Name, Children: nonNilChildren(one.Children)})
		}
	}
	ds.Status, ds.ResyncAfterSeconds, ds.Finalized = rollout.Aggregate(results)
	return ds, nil
}

// history loads the revision history of a parent, before any hook call.
func (d *Dispatcher) history(ctx context.Context, c syncCall, parent *unstructured.Unstructured, revs *kinds.Revisions) (*revision.History, error) {
	res, err := d.revs.Revisions(ctx, revstore.Request{
		// A stale view only costs a resync: the applier loads consistently
		// and rejects a desired state missing a revision's rendering.
		Op: revstore.OpLoad, Controller: c.item.Controller, AllowStale: true,
		Parent: revstore.Parent{
			APIVersion: parent.GetAPIVersion(), Kind: parent.GetKind(), Resource: c.parent.Resource,
			Namespace: parent.GetNamespace(), Name: parent.GetName(), UID: string(parent.GetUID()),
		},
	})
	if err == nil && res.Result != revstore.OK {
		err = fmt.Errorf("%s: %s", res.Result, res.Message)
	}
	if err != nil {
		return nil, quietFailure(fmt.Errorf("load ControllerRevisions: %w", err))
	}
	h, err := revision.NewHistory(historyParent(parent, c.parent.Resource), res.Revisions, revs.Patch)
	if err != nil {
		return nil, failure(err)
	}
	return h, nil
}

// historyParent describes the parent to package revision. The dispatcher
// only reads a history (which revision is the latest, which hold
// children), and those depend only on the parent's resource, group and UID
// (revision names); the labels and owner of revisions the applier creates
// are none of its business.
func historyParent(parent *unstructured.Unstructured, resource string) revision.Parent {
	group, _, found := strings.Cut(parent.GetAPIVersion(), "/")
	if !found {
		group = ""
	}
	return revision.Parent{Resource: resource, Group: group, UID: string(parent.GetUID()), Namespace: parent.GetNamespace()}
}

func nonNilChildren(c []*unstructured.Unstructured) []*unstructured.Unstructured {
	if c == nil {
		return []*unstructured.Unstructured{}
	}
	return c
}
