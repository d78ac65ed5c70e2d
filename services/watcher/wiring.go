package watcher

import (
	"context"
	"reflect"
	"slices"
	"sync"
	"time"

	"go.uber.org/zap"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/tools/cache"

	"github.com/metabus/metabus/pkg/apiresource"
	"github.com/metabus/metabus/pkg/bus"
	ctlid "github.com/metabus/metabus/pkg/identity"
	"github.com/metabus/metabus/pkg/informers"
	"github.com/metabus/metabus/pkg/kinds"
)

// wiring is one controller object, of any kind, connected to the shared
// informers: one per parent source and one per owned source of its plan,
// and the informers its parents' related rules name.
type wiring struct {
	w   *Watcher
	ref bus.ControllerRef
	// obj is the controller object as last seen (guarded by w.mu): a
	// metadata or status change refreshes it without rewiring.
	obj *unstructured.Unstructured
	// specJSON is the spec the wiring was built from.
	specJSON      string
	resyncSeconds *int32
	plan          *kinds.WatchPlan
	// identity is the ServiceAccount the controller acts as (none: the
	// watcher's own authority); withheldSeen holds the readaccess.Scopes
	// whose withheld objects were reported on the controller.
	identity     ctlid.Identity
	withheldSeen sync.Map

	parents []*informers.Handle // per plan.Parents
	owned   []*informers.Handle // per plan.Owned
	caches  []kinds.WatchCache  // owned, as the kind's core reads them
	related *relatedIndex
	cancel  context.CancelFunc

	// A keyed plan's inputs (per plan.Keyed.Inputs) and map-key indexes
	// (keyed.go); nil for a per-parent plan.
	inputs []*informers.Handle
	keyed  *keyedState
}

// newWiring builds the wiring of a controller from its plan; start
// subscribes it.
func (w *Watcher) newWiring(ref bus.ControllerRef, obj *unstructured.Unstructured, specJSON string, resyncSeconds *int32, plan *kinds.WatchPlan) *wiring {
	wr := &wiring{w: w, ref: ref, obj: obj, specJSON: specJSON, resyncSeconds: resyncSeconds, plan: plan}
	if plan.Keyed != nil {
		wr.keyed = newKeyedState(len(plan.Owned))
	}
	return wr
}

// sameSpec reports whether the wiring was built from this spec of this
// object, acting as the same identity (called with the watcher's lock
// held).
func (wr *wiring) sameSpec(spec string, obj *unstructured.Unstructured) bool {
	return wr.specJSON == spec && wr.obj.GetUID() == obj.GetUID() && sameIdentity(wr.obj, obj)
}

// start subscribes to the informers of the plan's resources (a keyed
// plan's inputs too). On error the caller stops the wiring, which releases
// what was acquired.
func (wr *wiring) start(ctx context.Context) error {
	ctx, wr.cancel = context.WithCancel(ctx)
	wr.related = newRelatedIndex(ctx, wr.w, wr.enqueueRelated)
	if wr.keyed != nil {
		// Before any handler: the parents' replay fans out to the keys
		// of the inputs, which it reads from these.
		for _, res := range wr.plan.Keyed.Inputs {
			wr.inputs = append(wr.inputs, wr.w.registry.Acquire(res.GVR))
		}
	}
	for i := range wr.plan.Parents {
		src := &wr.plan.Parents[i]
		h := wr.w.registry.Acquire(src.Res.GVR)
		wr.parents = append(wr.parents, h)
		if err := h.AddHandler(cache.ResourceEventHandlerDetailedFuncs{
			AddFunc: func(obj any, initial bool) {
				if initial {
					// Parents that exist when the wiring starts (watcher
					// start, controller change): a resync, which the
					// dispatcher never skips as an echo. As a plain event,
					// a parent whose last answer was lost while the watcher
					// was down stayed lost until the next cache flush.
					wr.resyncOne(src, obj)
					return
				}
				wr.onParent(src, nil, obj)
			},
			UpdateFunc: func(old, obj any) { wr.onParent(src, old, obj) },
			DeleteFunc: func(obj any) {
				if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
					obj = d.Obj
				}
				if p, ok := obj.(*unstructured.Unstructured); ok {
					wr.related.drop(string(p.GetUID()))
					if wr.keyed != nil {
						wr.keyed.dropSelector(p.GetUID())
					}
				}
			},
		}); err != nil {
			return err
		}
	}
	for i, res := range wr.plan.Owned {
		h := wr.w.registry.Acquire(res.GVR)
		wr.owned = append(wr.owned, h)
		wr.caches = append(wr.caches, h)
		gvr := res.GVR
		var handler cache.ResourceEventHandler = cache.ResourceEventHandlerFuncs{
			AddFunc:    func(obj any) { wr.onOwned(gvr, nil, obj) },
			UpdateFunc: func(old, obj any) { wr.onOwned(gvr, old, obj) },
			DeleteFunc: func(obj any) { wr.onOwned(gvr, nil, obj) },
		}
		interest := ownedInterest(wr.plan)
		if wr.keyed != nil {
			// A keyed plan indexes every output it is given (keyed.go):
			// it keeps getting every event.
			handler, interest = wr.keyedOwnedHandler(i), nil
		}
		if err := h.AddRoutedHandler(handler, interest); err != nil {
			return err
		}
	}
	if wr.keyed != nil {
		if err := wr.startKeyed(); err != nil {
			return err
		}
	}
	resyncEvery(ctx, wr.resyncSeconds, wr.resync)
	return nil
}

// ownedInterest is the events of owned objects that onOwned can act on:
// those of objects controlled (before or after the event) by one of the
// plan's parent kinds, and marked as the controller's when the plan has a
// mark; and, for a kind that adopts, those of objects with no controller.
// onOwned does nothing with the others (ownerOf and offerOrphan find no
// parent), so the registry need not call it for them.
func ownedInterest(plan *kinds.WatchPlan) *informers.Interest {
	in := &informers.Interest{Orphans: plan.Adopts}
	for _, p := range plan.Parents {
		in.OwnerKinds = append(in.OwnerKinds, schema.GroupKind{Group: p.Res.GVR.Group, Kind: p.Res.Kind})
	}
	if a := plan.Attachment; a != nil {
		in.Attachment = &informers.Attachment{Annotation: a.Annotation, Value: a.Value}
	}
	return in
}

// stop releases the informer subscriptions.
func (wr *wiring) stop() {
	if wr.cancel != nil {
		wr.cancel()
	}
	if wr.related != nil {
		wr.related.release()
	}
	for _, h := range wr.parents {
		h.Release()
	}
	for _, h := range wr.owned {
		h.Release()
	}
	for _, h := range wr.inputs {
		h.Release()
	}
}

// resyncEvery calls resync every resyncPeriodSeconds (if set) until ctx
// ends.
func resyncEvery(ctx context.Context, seconds *int32, resync func(reason string)) {
	if seconds == nil || *seconds <= 0 {
		return
	}
	period := time.Duration(*seconds) * time.Second
	go func() {
		t := time.NewTicker(period)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				resync(bus.ReasonResync)
			}
		}
	}()
}

// selects reports whether the controller handles parent: its kind's
// selectors select it, or they no longer do but it still carries the
// controller's finalizer, so the finalize hook runs (opt-out); and the
// controller's identity is not known to be denied reading it.
func (wr *wiring) selects(parent *unstructured.Unstructured) bool {
	return (wr.plan.Rules.Selects(parent) || hasFinalizer(parent, wr.plan.Finalizer)) && !wr.parentWithheld(parent)
}

// hasFinalizer reports whether obj carries finalizer f ("" never).
func hasFinalizer(obj *unstructured.Unstructured, f string) bool {
	return f != "" && slices.Contains(obj.GetFinalizers(), f)
}

// resync enqueues every cached parent the controller handles (and, for a
// keyed plan, every map key of each).
func (wr *wiring) resync(reason string) {
	for i, h := range wr.parents {
		res := wr.plan.Parents[i].Res
		for _, p := range h.List() {
			if wr.selects(p) {
				wr.w.enqueue(wr.ref, res, p, reason, res.GVR, "")
				wr.fanOut(res, p, "", false)
			}
		}
	}
}

// allParents is a release mask naming every parent source.
func (wr *wiring) allParents() []bool {
	all := make([]bool, len(wr.plan.Parents))
	for i := range all {
		all[i] = true
	}
	return all
}

// releaseFinalizers asks for the controller's finalizer to be removed
// from every parent of the sources mask names that carries it (through
// the dispatcher's release → applier path).
func (wr *wiring) releaseFinalizers(mask []bool, why string) {
	f := wr.plan.Finalizer
	if f == "" {
		return
	}
	for i, h := range wr.parents {
		if i >= len(mask) || !mask[i] {
			continue
		}
		res := wr.plan.Parents[i].Res
		n := 0
		for _, p := range h.List() {
			if hasFinalizer(p, f) {
				wr.w.enqueueRelease(wr.ref, res, p, f)
				n++
			}
		}
		if n > 0 {
			wr.w.log.Info("releasing finalizers", zap.String("controller", wr.ref.ID()), zap.String("why", why),
				zap.String("resource", res.GVR.String()), zap.String("finalizer", f), zap.Int("parents", n))
		}
	}
}

// resyncOne enqueues a resync of one parent the controller handles (and,
// for a keyed plan, of every map key of it).
func (wr *wiring) resyncOne(src *kinds.WatchParent, obj any) {
	if parent, ok := obj.(*unstructured.Unstructured); ok && wr.selects(parent) {
		wr.w.enqueue(wr.ref, src.Res, parent, bus.ReasonResync, src.Res.GVR, parent.GetResourceVersion())
		wr.fanOut(src.Res, parent, parent.GetResourceVersion(), false)
	}
}

// onParent handles a parent's creation or update. For a keyed plan, one
// beyond the status also fans out to every map key of the parent (its
// status is the controller's own aggregation: fanning out on each status
// write would resync every key for nothing), ahead of resync waves.
func (wr *wiring) onParent(src *kinds.WatchParent, oldObj, obj any) {
	parent, ok := obj.(*unstructured.Unstructured)
	if !ok || !wr.selects(parent) {
		return
	}
	rv := parent.GetResourceVersion()
	if old, ok := oldObj.(*unstructured.Unstructured); ok {
		if old.GetResourceVersion() == rv {
			return // informer resync: the bus has its own
		}
		beyondStatus := parentChangedBeyondStatus(old, parent)
		if !src.IgnoreStatusChanges || beyondStatus {
			wr.w.enqueueUpdate(wr.ref, src.Res, parent, src.Res.GVR, parent)
		}
		if beyondStatus {
			wr.fanOut(src.Res, parent, rv, true)
		}
		return
	}
	wr.w.enqueue(wr.ref, src.Res, parent, bus.ReasonEvent, src.Res.GVR, rv)
	wr.fanOut(src.Res, parent, rv, true)
}

// parentChangedBeyondStatus reports a change that ignoreStatusChanges must
// not ignore.
func parentChangedBeyondStatus(old, cur *unstructured.Unstructured) bool {
	return old.GetGeneration() != cur.GetGeneration() ||
		!reflect.DeepEqual(old.GetLabels(), cur.GetLabels()) ||
		!reflect.DeepEqual(old.GetAnnotations(), cur.GetAnnotations()) ||
		!reflect.DeepEqual(old.GetDeletionTimestamp(), cur.GetDeletionTimestamp()) ||
		!reflect.DeepEqual(old.GetFinalizers(), cur.GetFinalizers())
}

// onOwned maps an event of an owned-source object to the parents it
// concerns: its owner (and its former owner when that changed) or, for
// an orphan of a kind that adopts, every parent that would adopt it.
func (wr *wiring) onOwned(gvr schema.GroupVersionResource, oldObj, obj any) {
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = d.Obj
	}
	cur, ok := obj.(*unstructured.Unstructured)
	if !ok {
		return
	}
	rv := cur.GetResourceVersion()
	rules := wr.plan.Rules
	ref := rules.OwnerRef(cur)
	// update is the object when this is an update that leaves its owner
	// as it was: possibly the controller's own write (an echo).
	var update *unstructured.Unstructured
	if old, ok := oldObj.(*unstructured.Unstructured); ok {
		if old.GetResourceVersion() == rv {
			return
		}
		oref := rules.OwnerRef(old)
		if sameOwner(oref, ref, wr.plan.Adopts) {
			update = cur
		} else {
			// Released, re-owned or unmarked: the old owner must hear
			// about it too (the same parent is merged into one item).
			wr.enqueueOwner(gvr, oref, rv, nil)
		}
	}
	if ref != nil {
		wr.enqueueOwner(gvr, ref, rv, update)
		return
	}
	wr.offerOrphan(gvr, cur, rv)
}

// offerOrphan enqueues, for a kind that adopts, every parent that would
// adopt cur if it is an orphan (it has no controller at all).
func (wr *wiring) offerOrphan(gvr schema.GroupVersionResource, cur *unstructured.Unstructured, rv string) {
	rules := wr.plan.Rules
	if !wr.plan.Adopts || metav1.GetControllerOfNoCopy(cur) != nil {
		return
	}
	// An orphan: every parent that would adopt it may want to.
	for i, h := range wr.parents {
		src := &wr.plan.Parents[i]
		var candidates []*unstructured.Unstructured
		if src.Res.Namespaced {
			candidates = h.InNamespace(cur.GetNamespace())
		} else {
			candidates = h.List()
		}
		for _, p := range candidates {
			if rules.WantsOrphan(p, cur) && wr.selects(p) {
				wr.w.enqueue(wr.ref, src.Res, p, bus.ReasonEvent, gvr, rv)
			}
		}
	}
}

// sameOwner reports whether an update of an owned-source object left its
// owner as it was (old and cur are the owner references the kind's core
// recognises before and after). An object that had none and now has one
// was adopted, possibly by the controller itself, for a kind that adopts;
// a kind that never adopts never writes such a change, so for it the new
// owner hears of it as news.
func sameOwner(old, cur *metav1.OwnerReference, adopts bool) bool {
	if old == nil {
		return adopts
	}
	return cur != nil && old.UID == cur.UID
}

// enqueueOwner enqueues the parent that ref names, if it is a cached parent
// the controller handles; update is the owned object if the event is an
// update that may be the controller's own write (nil otherwise).
func (wr *wiring) enqueueOwner(gvr schema.GroupVersionResource, ref *metav1.OwnerReference, rv string, update *unstructured.Unstructured) {
	res, parent := wr.ownerOf(ref)
	if parent == nil {
		return
	}
	if update != nil {
		wr.w.enqueueUpdate(wr.ref, res, parent, gvr, update)
	} else {
		wr.w.enqueue(wr.ref, res, parent, bus.ReasonEvent, gvr, rv)
	}
}

// ownerOf returns the parent that ref names and its resource, if it is a
// cached parent the controller handles (nil otherwise).
func (wr *wiring) ownerOf(ref *metav1.OwnerReference) (*apiresource.Resource, *unstructured.Unstructured) {
	if ref == nil {
		return nil, nil
	}
	gv, err := schema.ParseGroupVersion(ref.APIVersion)
	if err != nil {
		return nil, nil
	}
	for i, h := range wr.parents {
		res := wr.plan.Parents[i].Res
		if res.Kind != ref.Kind || res.GVR.Group != gv.Group {
			continue
		}
		parent, ok := h.ByUID(string(ref.UID))
		if !ok {
			continue
		}
		if !wr.selects(parent) {
			return nil, nil
		}
		return res, parent
	}
	return nil, nil
}

// enqueueRelated resyncs a parent whose related object changed.
func (wr *wiring) enqueueRelated(uid string, gvr schema.GroupVersionResource, rv string) {
	for i, h := range wr.parents {
		if p, ok := h.ByUID(uid); ok {
			if wr.selects(p) {
				wr.w.enqueue(wr.ref, wr.plan.Parents[i].Res, p, bus.ReasonEvent, gvr, rv)
			}
			return
		}
	}
}

// handleFor returns the wiring's informer handle for a freshness key.
func (wr *wiring) handleFor(key string) *informers.Handle {
	for _, h := range wr.parents {
		if grKey(h.GVR()) == key {
			return h
		}
	}
	for _, h := range wr.owned {
		if grKey(h.GVR()) == key {
			return h
		}
	}
	for _, h := range wr.inputs {
		if grKey(h.GVR()) == key {
			return h
		}
	}
	return wr.related.handleFor(key)
}
