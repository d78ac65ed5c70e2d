package watcher

import (
	"context"
	"fmt"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/metabus/metabus/pkg/apiresource"
	"github.com/metabus/metabus/pkg/informers"
	"github.com/metabus/metabus/pkg/related"
	"github.com/metabus/metabus/pkg/snapshot"
)

// Snapshot answers from the informer caches. It implements snapshot.Source
// for in-process callers; the NATS service wraps it.
func (w *Watcher) Snapshot(ctx context.Context, req snapshot.Request) (*snapshot.Response, error) {
	start := time.Now()
	resp := w.snapshot(ctx, req)
	w.metrics.snapshots.WithLabelValues(resp.Result).Inc()
	w.metrics.snapshotSeconds.Observe(time.Since(start).Seconds())
	return resp, nil
}

func (w *Watcher) snapshot(ctx context.Context, req snapshot.Request) *snapshot.Response {
	id := req.Controller.ID()
	w.mu.RLock()
	wr := w.wirings[id]
	h := w.ctrlHandles[req.Controller.Kind]
	w.mu.RUnlock()
	if wr == nil {
		if h == nil || !h.HasSynced() {
			return &snapshot.Response{Result: snapshot.Retry, Message: "controllers not synced yet"}
		}
		// A controller that exists but is not wired yet (just created, or
		// failing to wire) is worth retrying; one that is gone is not.
		u, exists := w.controllerObject(req.Controller.Kind, req.Controller.Name)
		if !exists {
			return &snapshot.Response{Result: snapshot.ControllerGone, Message: "controller " + id + " was deleted"}
		}
		if !w.targets.Matches(labels.Set(u.GetLabels())) {
			return &snapshot.Response{Result: snapshot.NotFound, Message: "controller " + id + " is not served by this installation"}
		}
		return &snapshot.Response{Result: snapshot.Retry, Message: "controller not wired yet"}
	}
	return wr.snapshot(ctx, req)
}

// waitFresh waits until every informer named in the request has delivered
// the requested resourceVersion (bounded by SnapshotWait).
func (w *Watcher) waitFresh(ctx context.Context, req snapshot.Request, handleFor func(string) *informers.Handle) (bool, string) {
	if len(req.MinResourceVersions) == 0 {
		return true, ""
	}
	fresh := true
	for key, rv := range req.MinResourceVersions {
		if h := handleFor(key); h != nil && !h.HasSeen(rv) {
			fresh = false
			break
		}
	}
	if fresh {
		return true, "" // the usual case, without a timer
	}
	wctx, cancel := context.WithTimeout(ctx, w.cfg.SnapshotWait)
	defer cancel()
	for key, rv := range req.MinResourceVersions {
		h := handleFor(key)
		if h == nil {
			continue // not a resource of this controller (any more)
		}
		if !h.WaitSeen(wctx, rv) {
			return false, fmt.Sprintf("cache of %s has not reached resourceVersion %s", key, rv)
		}
	}
	return true, ""
}

// snapshot of a parent of any kind: the parent, its owned objects per
// owned resource in spec order (as the kind's core claims them), and the
// objects its related rules select. For a keyed plan, the parent with one
// map key's input and outputs, or with its summary (keyedSnapshot).
func (wr *wiring) snapshot(ctx context.Context, req snapshot.Request) *snapshot.Response {
	w := wr.w
	w.mu.RLock()
	ctrl := wr.obj
	w.mu.RUnlock()
	for _, h := range wr.parents {
		if !h.HasSynced() {
			return &snapshot.Response{Result: snapshot.Retry, Message: "parent cache " + h.GVR().String() + " not synced"}
		}
	}
	if req.MapKey != "" && wr.keyed == nil {
		return &snapshot.Response{Result: snapshot.Invalid, Message: "controller " + req.Controller.ID() + " has no map keys"}
	}
	// A keyed plan's indexes are fed by the handlers of its owned and
	// input informers: the caches having synced is not enough.
	synced := (*informers.Handle).HasSynced
	if wr.keyed != nil {
		synced = (*informers.Handle).HandlersSynced
	}
	for _, h := range wr.owned {
		if !synced(h) {
			return &snapshot.Response{Result: snapshot.Retry, Message: "owned cache " + h.GVR().String() + " not synced"}
		}
	}
	for _, h := range wr.inputs {
		if !synced(h) {
			return &snapshot.Response{Result: snapshot.Retry, Message: "input cache " + h.GVR().String() + " not synced"}
		}
	}
	var rules []related.Resolved
	if req.Related != nil {
		var err error
		if rules, err = wr.related.register(req.Related); err != nil {
			return &snapshot.Response{Result: snapshot.Invalid, Message: "related resources: " + err.Error()}
		}
	}
	if ok, msg := w.waitFresh(ctx, req, wr.handleFor); !ok {
		return &snapshot.Response{Result: snapshot.Retry, Message: msg}
	}
	var (
		parent    *unstructured.Unstructured
		parentRes *apiresource.Resource
	)
	for i, h := range wr.parents {
		if obj, ok := h.ByUID(req.ParentUID); ok {
			parent, parentRes = obj, wr.plan.Parents[i].Res
			break
		}
	}
	if parent == nil {
		return &snapshot.Response{Result: snapshot.NotFound, Message: "parent " + req.ParentUID + " not found"}
	}
	// What the controller's identity may not read is left out here, where
	// the snapshot is assembled: it never reaches the bus.
	view := wr.readView(ctx)
	if !view.may(parentRes.GVR.Group, parentRes.GVR.Resource, parent.GetNamespace()) {
		wr.reportWithheld(view, ctrl)
		return withheldParent(view)
	}
	resp := &snapshot.Response{
		Result:          snapshot.OK,
		Controller:      ctrl,
		Parent:          parent,
		ParentResource:  parentRes.GVR.Resource,
		ParentHasStatus: parentRes.HasStatus,
	}
	if wr.keyed != nil {
		if withheld := wr.keyedSnapshot(resp, req.MapKey, parentRes, parent, view); withheld {
			wr.reportWithheld(view, ctrl)
			return &snapshot.Response{Result: snapshot.NotFound, Message: "map key " + req.MapKey + "'s input withheld: ServiceAccount " +
				wr.identity.String() + " may not read it"}
		}
	} else {
		resp.Children, resp.SelectorError = wr.plan.Rules.Observe(parentRes, parent, wr.caches)
		view.groups(resp.Children)
	}
	if len(rules) > 0 {
		groups, ok := wr.related.snapshot(rules)
		if !ok {
			return &snapshot.Response{Result: snapshot.Retry, Message: "related caches not synced yet"}
		}
		view.groups(groups)
		resp.Related = groups
	}
	if r := view.retry(); r != nil {
		return r
	}
	wr.reportWithheld(view, ctrl)
	return resp
}
