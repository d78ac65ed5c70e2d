package watcher

import (
	"context"
	"encoding/json"
	"fmt"

	"go.uber.org/zap"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/tools/cache"

	"github.com/metabus/metabus/pkg/api/v1alpha1"
	"github.com/metabus/metabus/pkg/bus"
	"github.com/metabus/metabus/pkg/composite"
	"github.com/metabus/metabus/pkg/decorator"
	"github.com/metabus/metabus/pkg/discovery"
	"github.com/metabus/metabus/pkg/informers"
	"github.com/metabus/metabus/pkg/snapshot"
)

// decoratorWiring is one DecoratorController connected to the shared
// informers: one per target resource and one per attachment rule.
//
// A DecoratorController may target several kinds, built-in or custom,
// namespaced or cluster-scoped. Work items are keyed by the target's UID,
// which never collides across kinds; the item's parent reference carries
// the target's apiVersion, kind and resource.
type decoratorWiring struct {
	w   *Watcher
	ref bus.ControllerRef
	wiredObject
	spec      v1alpha1.DecoratorControllerSpec
	finalizer string
	selector  *decorator.Selector

	targets     []*decoratorTarget    // one per distinct target resource
	attachRes   []*discovery.Resource // per attachment rule, in spec order
	attachments []*informers.Handle   // per attachment rule
	related     *relatedIndex         // customize-hook related objects
	cancel      context.CancelFunc
}

// decoratorTarget is one target resource of a decorator.
type decoratorTarget struct {
	res *discovery.Resource
	// ignoreStatusChanges is set when every rule naming this resource asks
	// for it.
	ignoreStatusChanges bool
	h                   *informers.Handle
}

// syncDecoratorController (re)wires or unwires one DecoratorController.
func (w *Watcher) syncDecoratorController(ctx context.Context, id, name string) error {
	dc, specJSON, err := w.controllerChanged(id, v1alpha1.DecoratorControllerKind, name)
	if err != nil || dc == nil {
		return err
	}
	var spec v1alpha1.DecoratorControllerSpec
	if err := json.Unmarshal(specJSON, &spec); err != nil {
		w.invalidController(id, dc, fmt.Errorf("invalid spec: %w", err))
		return nil
	}
	if err := refuse(w.resources, decoratorResources(spec)); err != nil {
		w.refusedController(id, dc, err)
		return nil
	}
	wr, err := w.newDecoratorWiring(ctx, dc, spec, string(specJSON))
	if err != nil {
		w.invalidController(id, dc, err)
		return err
	}
	if err := w.install(ctx, id, wr, dc, func(prev controllerWiring) {
		old, ok := prev.(*decoratorWiring)
		switch {
		case !ok:
		case old.finalizer != "" && wr.finalizer == "":
			// The finalize hook was removed: nobody will finalize.
			old.releaseFinalizers()
		default:
			// Kinds the controller stopped targeting are nobody's to
			// finalize either.
			old.releaseDropped(wr.selector)
		}
	}); err != nil {
		return err
	}
	kinds := make([]string, 0, len(wr.targets))
	for _, t := range wr.targets {
		kinds = append(kinds, t.res.GVR.String())
	}
	w.log.Info("decorator wired", zap.String("controller", name), zap.Strings("targets", kinds),
		zap.Int("attachmentResources", len(wr.attachRes)))
	return nil
}

func (w *Watcher) newDecoratorWiring(ctx context.Context, dc *unstructured.Unstructured, spec v1alpha1.DecoratorControllerSpec, specJSON string) (*decoratorWiring, error) {
	if len(spec.Resources) == 0 {
		return nil, fmt.Errorf("spec.resources is empty: nothing to decorate")
	}
	wr := &decoratorWiring{
		w:           w,
		ref:         bus.ControllerRef{Kind: v1alpha1.DecoratorControllerKind, Name: dc.GetName(), UID: string(dc.GetUID())},
		wiredObject: wiredObject{obj: dc, specJSON: specJSON},
		spec:        spec,
	}
	if spec.Hooks != nil && spec.Hooks.Finalize != nil {
		wr.finalizer = decorator.Finalizer(dc.GetName())
	}
	rules := make([]decorator.ResolvedRule, 0, len(spec.Resources))
	byGVR := map[schema.GroupVersionResource]*decoratorTarget{}
	for i, r := range spec.Resources {
		if r.APIVersion == "" || r.Resource == "" {
			return nil, fmt.Errorf("spec.resources[%d] needs apiVersion and resource", i)
		}
		res, err := w.disc.Resolve(ctx, r.APIVersion, r.Resource)
		if err != nil {
			return nil, fmt.Errorf("spec.resources[%d]: %w", i, err)
		}
		rules = append(rules, decorator.ResolvedRule{DecoratorControllerResourceRule: r, Kind: res.Kind})
		ignore := r.IgnoreStatusChanges != nil && *r.IgnoreStatusChanges
		if t, ok := byGVR[res.GVR]; ok {
			t.ignoreStatusChanges = t.ignoreStatusChanges && ignore
			continue
		}
		t := &decoratorTarget{res: res, ignoreStatusChanges: ignore}
		byGVR[res.GVR] = t
		wr.targets = append(wr.targets, t)
	}
	sel, err := decorator.NewSelector(rules)
	if err != nil {
		return nil, err
	}
	wr.selector = sel
	for i, a := range spec.Attachments {
		res, err := w.disc.Resolve(ctx, a.APIVersion, a.Resource)
		if err != nil {
			return nil, fmt.Errorf("spec.attachments[%d]: %w", i, err)
		}
		// A cluster-scoped attachment is only invalid under a namespaced
		// target, and a controller may target both scopes: the applier
		// rejects such a desired attachment per target.
		wr.attachRes = append(wr.attachRes, res)
	}
	declared := make([]string, len(spec.Attachments))
	for i, a := range spec.Attachments {
		declared[i] = a.APIVersion
	}
	if err := distinctResources("spec.attachments", declared, wr.attachRes); err != nil {
		return nil, err
	}
	return wr, nil
}

func (wr *decoratorWiring) start(ctx context.Context) error {
	ctx, wr.cancel = context.WithCancel(ctx)
	wr.related = newRelatedIndex(ctx, wr.w, wr.enqueueRelated)
	for _, t := range wr.targets {
		t.h = wr.w.registry.Acquire(t.res.GVR)
		tg := t
		if err := t.h.AddHandler(cache.ResourceEventHandlerDetailedFuncs{
			AddFunc: func(obj any, initial bool) {
				if initial {
					// As for composite parents: targets that exist
					// when the wiring starts get a resync, never
					// skipped as an echo.
					wr.resyncTarget(tg, obj)
					return
				}
				wr.onTarget(tg, nil, obj)
			},
			UpdateFunc: func(old, obj any) { wr.onTarget(tg, old, obj) },
			DeleteFunc: func(obj any) {
				if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
					obj = d.Obj
				}
				if target, ok := obj.(*unstructured.Unstructured); ok {
					wr.related.drop(string(target.GetUID()))
				}
			},
		}); err != nil {
			return err
		}
	}
	for _, res := range wr.attachRes {
		h := wr.w.registry.Acquire(res.GVR)
		wr.attachments = append(wr.attachments, h)
		if err := h.AddHandler(cache.ResourceEventHandlerFuncs{
			AddFunc:    func(obj any) { wr.onAttachment(h.GVR(), nil, obj) },
			UpdateFunc: func(old, obj any) { wr.onAttachment(h.GVR(), old, obj) },
			DeleteFunc: func(obj any) { wr.onAttachment(h.GVR(), nil, obj) },
		}); err != nil {
			return err
		}
	}
	resyncEvery(ctx, wr.spec.ResyncPeriodSeconds, wr.resync)
	return nil
}

func (wr *decoratorWiring) relatedIx() *relatedIndex { return wr.related }

func (wr *decoratorWiring) stop() {
	if wr.cancel != nil {
		wr.cancel()
	}
	if wr.related != nil {
		wr.related.release()
	}
	for _, t := range wr.targets {
		if t.h != nil {
			t.h.Release()
		}
	}
	for _, h := range wr.attachments {
		h.Release()
	}
}

// selects reports whether the controller handles target: it matches the
// selectors of its kind, or it no longer does but still carries our
// finalizer, so the finalize hook runs (opt-out).
func (wr *decoratorWiring) selects(target *unstructured.Unstructured) bool {
	return wr.selector.Matches(target) || composite.HasFinalizer(target, wr.finalizer)
}

// resync enqueues every cached target.
func (wr *decoratorWiring) resync(reason string) {
	for _, t := range wr.targets {
		if t.h == nil {
			continue
		}
		for _, obj := range t.h.List() {
			if wr.selects(obj) {
				wr.w.enqueue(wr.ref, t.res, obj, reason, t.res.GVR, "")
			}
		}
	}
}

// releaseFinalizers asks for the controller's finalizer to be removed from
// every target that carries it, through the same release path as
// CompositeController (dispatcher release → applier release).
func (wr *decoratorWiring) releaseFinalizers() {
	if wr.finalizer == "" {
		return
	}
	n := 0
	for _, t := range wr.targets {
		if t.h == nil {
			continue
		}
		for _, obj := range t.h.List() {
			if composite.HasFinalizer(obj, wr.finalizer) {
				wr.w.enqueueRelease(wr.ref, t.res, obj, wr.finalizer)
				n++
			}
		}
	}
	if n > 0 {
		wr.w.log.Info("releasing finalizers of a removed decorator", zap.String("controller", wr.ref.Name),
			zap.String("finalizer", wr.finalizer), zap.Int("targets", n))
	}
}

// releaseDropped releases the finalizer from the targets of every kind
// that next no longer names (a new version of the same kind still does,
// and finalizes them if they stopped matching).
func (wr *decoratorWiring) releaseDropped(next *decorator.Selector) {
	if wr.finalizer == "" {
		return
	}
	for _, t := range wr.targets {
		if t.h == nil || next.Handles(schema.GroupKind{Group: t.res.GVR.Group, Kind: t.res.Kind}) {
			continue
		}
		n := 0
		for _, obj := range t.h.List() {
			if composite.HasFinalizer(obj, wr.finalizer) {
				wr.w.enqueueRelease(wr.ref, t.res, obj, wr.finalizer)
				n++
			}
		}
		if n > 0 {
			wr.w.log.Info("releasing finalizers of a kind the decorator no longer targets", zap.String("controller", wr.ref.Name),
				zap.String("resource", t.res.GVR.String()), zap.Int("targets", n))
		}
	}
}

// resyncTarget enqueues a resync of one target the controller handles.
func (wr *decoratorWiring) resyncTarget(t *decoratorTarget, obj any) {
	if target, ok := obj.(*unstructured.Unstructured); ok && wr.selects(target) {
		wr.w.enqueue(wr.ref, t.res, target, bus.ReasonResync, t.res.GVR, target.GetResourceVersion())
	}
}

func (wr *decoratorWiring) onTarget(t *decoratorTarget, oldObj, obj any) {
	target, ok := obj.(*unstructured.Unstructured)
	if !ok || !wr.selects(target) {
		return
	}
	if old, ok := oldObj.(*unstructured.Unstructured); ok {
		if old.GetResourceVersion() == target.GetResourceVersion() {
			return // informer resync: the bus has its own
		}
		if t.ignoreStatusChanges && !parentChangedBeyondStatus(old, target) {
			return
		}
		wr.w.enqueueUpdate(wr.ref, t.res, target, t.res.GVR, target)
		return
	}
	wr.w.enqueue(wr.ref, t.res, target, bus.ReasonEvent, t.res.GVR, target.GetResourceVersion())
}

// onAttachment enqueues the target an attachment belongs to. Only objects
// with a controller reference to a target and our annotation are
// attachments: there is no adoption, so orphans are nobody's business.
func (wr *decoratorWiring) onAttachment(gvr schema.GroupVersionResource, oldObj, obj any) {
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = d.Obj
	}
	a, ok := obj.(*unstructured.Unstructured)
	if !ok {
		return
	}
	rv := a.GetResourceVersion()
	if old, ok := oldObj.(*unstructured.Unstructured); ok {
		if old.GetResourceVersion() == rv {
			return
		}
		if ref, oref := metav1.GetControllerOfNoCopy(a), metav1.GetControllerOfNoCopy(old); ref != nil && oref != nil &&
			ref.UID == oref.UID && decorator.IsAttachment(old, wr.ref.Name) && decorator.IsAttachment(a, wr.ref.Name) {
			// Same target: possibly our own write (an echo).
			wr.enqueueOwner(gvr, a, rv, a)
			return
		}
		// Released, re-owned or unmarked: the old target must hear about
		// it too (the same target is merged into one work item).
		wr.enqueueOwner(gvr, old, rv, nil)
	}
	wr.enqueueOwner(gvr, a, rv, nil)
}

// enqueueOwner enqueues the target an attachment belongs to; update is the
// attachment if the event is an update that may be our own write.
func (wr *decoratorWiring) enqueueOwner(gvr schema.GroupVersionResource, a *unstructured.Unstructured, rv string, update *unstructured.Unstructured) {
	ref := metav1.GetControllerOfNoCopy(a)
	if ref == nil || !decorator.IsAttachment(a, wr.ref.Name) {
		return
	}
	gv, err := schema.ParseGroupVersion(ref.APIVersion)
	if err != nil {
		return
	}
	for _, t := range wr.targets {
		if t.res.Kind != ref.Kind || t.res.GVR.Group != gv.Group {
			continue
		}
		if target, ok := t.h.ByUID(string(ref.UID)); ok && wr.selects(target) {
			if update != nil {
				wr.w.enqueueUpdate(wr.ref, t.res, target, gvr, update)
			} else {
				wr.w.enqueue(wr.ref, t.res, target, bus.ReasonEvent, gvr, rv)
			}
			return
		}
	}
}

// enqueueRelated resyncs a target whose related object changed.
func (wr *decoratorWiring) enqueueRelated(uid string, gvr schema.GroupVersionResource, rv string) {
	for _, t := range wr.targets {
		if target, ok := t.h.ByUID(uid); ok {
			if wr.selects(target) {
				wr.w.enqueue(wr.ref, t.res, target, bus.ReasonEvent, gvr, rv)
			}
			return
		}
	}
}

// handleFor returns the wiring's informer handle for a freshness key.
func (wr *decoratorWiring) handleFor(key string) *informers.Handle {
	for _, t := range wr.targets {
		if grKey(t.res.GVR) == key {
			return t.h
		}
	}
	for _, h := range wr.attachments {
		if grKey(h.GVR()) == key {
			return h
		}
	}
	return wr.related.handleFor(key)
}

// snapshot of a decorator target: the target as Parent, and its
// attachments grouped per attachment rule, in spec order, as Children.
func (wr *decoratorWiring) snapshot(ctx context.Context, req snapshot.Request) *snapshot.Response {
	w := wr.w
	w.mu.RLock()
	ctrl := wr.obj
	w.mu.RUnlock()
	for _, t := range wr.targets {
		if !t.h.HasSynced() {
			return &snapshot.Response{Result: snapshot.Retry, Message: "target cache " + t.res.GVR.String() + " not synced"}
		}
	}
	for _, h := range wr.attachments {
		if !h.HasSynced() {
			return &snapshot.Response{Result: snapshot.Retry, Message: "attachment cache " + h.GVR().String() + " not synced"}
		}
	}
	var rules []relatedRule
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
		target *unstructured.Unstructured
		tres   *discovery.Resource
	)
	for _, t := range wr.targets {
		if obj, ok := t.h.ByUID(req.ParentUID); ok {
			target, tres = obj, t.res
			break
		}
	}
	if target == nil {
		return &snapshot.Response{Result: snapshot.NotFound, Message: "target " + req.ParentUID + " not found"}
	}
	resp := &snapshot.Response{
		Result:          snapshot.OK,
		Controller:      ctrl,
		Parent:          target,
		ParentResource:  tres.GVR.Resource,
		ParentHasStatus: tres.HasStatus,
	}
	ns := target.GetNamespace()
	for i, h := range wr.attachments {
		res := wr.attachRes[i]
		g := snapshot.Group{
			APIVersion: res.APIVersion(),
			Resource:   res.GVR.Resource,
			Kind:       res.Kind,
			Namespaced: res.Namespaced,
			Objects:    []*unstructured.Unstructured{},
		}
		for _, c := range h.OwnedBy(req.ParentUID) {
			ref := metav1.GetControllerOfNoCopy(c)
			if ref == nil || ref.Kind != tres.Kind || !decorator.IsAttachment(c, wr.ref.Name) {
				continue
			}
			if gv, err := schema.ParseGroupVersion(ref.APIVersion); err != nil || gv.Group != tres.GVR.Group {
				continue
			}
			// A namespaced target only owns objects of its namespace (the
			// garbage collector ignores cross-namespace owners).
			if ns != "" && c.GetNamespace() != ns {
				continue
			}
			g.Objects = append(g.Objects, c)
		}
		resp.Children = append(resp.Children, g)
	}
	if len(rules) > 0 {
		groups, ok := wr.related.snapshot(rules)
		if !ok {
			return &snapshot.Response{Result: snapshot.Retry, Message: "related caches not synced yet"}
		}
		resp.Related = groups
	}
	return resp
}
