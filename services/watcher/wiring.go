package watcher

import (
	"context"
	"encoding/json"
	"fmt"
	"reflect"
	"strings"
	"time"

	"go.uber.org/zap"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/resourceversion"
	"k8s.io/client-go/tools/cache"

	"github.com/metabus/metabus/pkg/api/v1alpha1"
	"github.com/metabus/metabus/pkg/bus"
	"github.com/metabus/metabus/pkg/children"
	"github.com/metabus/metabus/pkg/composite"
	"github.com/metabus/metabus/pkg/discovery"
	"github.com/metabus/metabus/pkg/events"
	"github.com/metabus/metabus/pkg/informers"
)

// wiring is one CompositeController connected to the shared informers.
type wiring struct {
	w   *Watcher
	ref bus.ControllerRef
	wiredObject
	spec      v1alpha1.CompositeControllerSpec
	parentRes *discovery.Resource
	childRes  []*discovery.Resource
	parentSel labels.Selector // parentResource.labelSelector
	finalizer string

	parent   *informers.Handle
	children []*informers.Handle
	related  *relatedIndex
	ctx      context.Context
	cancel   context.CancelFunc
}

func (w *Watcher) enqueueController(kind string, obj any) {
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = d.Obj
	}
	if m, err := meta.Accessor(obj); err == nil {
		w.ctrlQueue.Add(kind + "/" + m.GetName())
	}
}

func (w *Watcher) runControllers(ctx context.Context) {
	for {
		id, shutdown := w.ctrlQueue.Get()
		if shutdown {
			return
		}
		err := w.syncController(ctx, id)
		if err != nil {
			w.log.Warn("wire controller; will retry", zap.String("controller", id), zap.Error(err))
			w.ctrlQueue.AddRateLimited(id)
		} else {
			w.ctrlQueue.Forget(id)
		}
		w.ctrlQueue.Done(id)
	}
}

// syncController (re)wires or unwires one controller object, queued as
// "<kind>/<name>".
func (w *Watcher) syncController(ctx context.Context, key string) error {
	kind, name, ok := strings.Cut(key, "/")
	if !ok {
		return nil
	}
	id := bus.ControllerID(kind, name)
	switch kind {
	case v1alpha1.CompositeControllerKind:
		return w.syncCompositeController(ctx, id, name)
	case v1alpha1.DecoratorControllerKind:
		return w.syncDecoratorController(ctx, id, name)
	}
	return nil
}

// controllerObject returns a controller object from the cache.
func (w *Watcher) controllerObject(kind, name string) (*unstructured.Unstructured, bool) {
	w.mu.RLock()
	h := w.ctrlHandles[kind]
	w.mu.RUnlock()
	if h == nil {
		return nil, false
	}
	obj, exists, err := h.Informer().GetStore().GetByKey(name)
	if err != nil || !exists {
		return nil, false
	}
	u, ok := obj.(*unstructured.Unstructured)
	return u, ok
}

// controllerChanged does the kind-independent part of a controller object
// change: a deleted controller is unwired and releases its finalizers, an
// untargeted one is unwired and keeps them (another installation may serve
// it), and an unchanged spec keeps the wiring with the refreshed object.
// It returns the object and its spec when a new wiring must be built.
func (w *Watcher) controllerChanged(id, kind, name string) (*unstructured.Unstructured, []byte, error) {
	obj, exists := w.controllerObject(kind, name)
	if !exists {
		w.unwire(id, "controller deleted", true)
		return nil, nil, nil
	}
	if !w.targets.Matches(labels.Set(obj.GetLabels())) {
		w.unwire(id, "controller no longer targeted", false)
		return nil, nil, nil
	}
	spec, err := json.Marshal(obj.Object["spec"])
	if err != nil {
		return nil, nil, fmt.Errorf("encode spec: %w", err)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if old := w.wirings[id]; old != nil && old.sameSpec(string(spec), obj.GetUID()) {
		// Metadata or status changed only: keep the wiring, refresh the
		// object the hooks are sent.
		old.setObject(obj)
		return nil, nil, nil
	}
	return obj, spec, nil
}

// invalidController reports a controller that cannot be wired.
func (w *Watcher) invalidController(id string, obj *unstructured.Unstructured, err error) {
	w.rec.Warning(obj, events.ReasonCreateError, err.Error())
	w.unwire(id, "cannot wire: "+err.Error(), false)
}

// refusedController reports a controller naming resources the admin's
// policy (--controller-resources) refuses, and unwires it. The caller does
// not retry: the policy only changes with a restart, and a change of the
// controller enqueues it again.
func (w *Watcher) refusedController(id string, obj *unstructured.Unstructured, err error) {
	w.invalidController(id, obj, fmt.Errorf("controller not started, nothing watched or sent to its hooks: %w", err))
}

// install starts wr and puts it in place of the controller's previous
// wiring, which it returns (stopped) so the caller can release what the
// change took away. The new wiring subscribes before the old one releases,
// so informers both use stay up (no relist).
func (w *Watcher) install(ctx context.Context, id string, wr controllerWiring, obj *unstructured.Unstructured, release func(old controllerWiring)) error {
	if err := wr.start(ctx); err != nil {
		wr.stop()
		return err
	}
	w.mu.Lock()
	old := w.wirings[id]
	w.wirings[id] = wr
	w.mu.Unlock()
	if old != nil {
		release(old)
		old.stop()
	}
	w.metrics.controllers.Set(float64(w.countWirings()))
	w.rec.Normal(obj, events.ReasonStarted, "controller started")
	return nil
}

// syncCompositeController (re)wires or unwires one CompositeController.
func (w *Watcher) syncCompositeController(ctx context.Context, id, name string) error {
	cc, specJSON, err := w.controllerChanged(id, v1alpha1.CompositeControllerKind, name)
	if err != nil || cc == nil {
		return err
	}
	var spec v1alpha1.CompositeControllerSpec
	if err := json.Unmarshal(specJSON, &spec); err != nil {
		w.invalidController(id, cc, fmt.Errorf("invalid spec: %w", err))
		return nil // nothing to retry until the spec changes
	}
	if err := refuse(w.resources, compositeResources(spec)); err != nil {
		w.refusedController(id, cc, err)
		return nil
	}
	wr, err := w.newWiring(ctx, cc, spec, string(specJSON))
	if err != nil {
		w.invalidController(id, cc, err)
		return err
	}
	if err := w.install(ctx, id, wr, cc, func(prev controllerWiring) {
		if old, ok := prev.(*wiring); ok && old.finalizer != "" && wr.finalizer == "" {
			// The finalize hook was removed: nobody will finalize.
			old.releaseFinalizers()
		}
	}); err != nil {
		return err
	}
	w.log.Info("controller wired", zap.String("controller", name),
		zap.String("parent", wr.parentRes.GVR.String()), zap.Int("childResources", len(wr.childRes)))
	return nil
}

func (w *Watcher) countWirings() int {
	w.mu.RLock()
	defer w.mu.RUnlock()
	return len(w.wirings)
}

func (w *Watcher) unwire(id, why string, release bool) {
	w.mu.Lock()
	old := w.wirings[id]
	delete(w.wirings, id)
	w.mu.Unlock()
	if old != nil {
		if release {
			old.releaseFinalizers()
		}
		old.stop()
		w.log.Info("controller unwired", zap.String("controller", id), zap.String("why", why))
	}
	w.metrics.controllers.Set(float64(w.countWirings()))
}

func (w *Watcher) newWiring(ctx context.Context, cc *unstructured.Unstructured, spec v1alpha1.CompositeControllerSpec, specJSON string) (*wiring, error) {
	pr := spec.ParentResource
	if pr.APIVersion == "" || pr.Resource == "" {
		return nil, fmt.Errorf("spec.parentResource needs apiVersion and resource")
	}
	parentRes, err := w.disc.Resolve(ctx, pr.APIVersion, pr.Resource)
	if err != nil {
		return nil, fmt.Errorf("parent resource: %w", err)
	}
	if !parentRes.HasStatus {
		// As upstream: without the status subresource every status write
		// bumps metadata.generation and the controller hot-loops.
		return nil, fmt.Errorf("parent resource %s does not have subresource 'status' enabled", parentRes.GVR)
	}
	wr := &wiring{
		w:           w,
		ref:         bus.ControllerRef{Kind: v1alpha1.CompositeControllerKind, Name: cc.GetName(), UID: string(cc.GetUID())},
		wiredObject: wiredObject{obj: cc, specJSON: specJSON},
		spec:        spec,
		parentRes:   parentRes,
		parentSel:   labels.Everything(),
	}
	if spec.Hooks != nil && spec.Hooks.Finalize != nil {
		wr.finalizer = composite.Finalizer(cc.GetName())
	}
	if pr.LabelSelector != nil {
		sel, err := metav1.LabelSelectorAsSelector(pr.LabelSelector)
		if err != nil {
			return nil, fmt.Errorf("spec.parentResource.labelSelector: %w", err)
		}
		wr.parentSel = sel
	}
	for i, c := range spec.ChildResources {
		res, err := w.disc.Resolve(ctx, c.APIVersion, c.Resource)
		if err != nil {
			return nil, fmt.Errorf("spec.childResources[%d]: %w", i, err)
		}
		if parentRes.Namespaced && !res.Namespaced {
			return nil, fmt.Errorf("spec.childResources[%d]: a namespaced parent cannot own cluster-scoped %s", i, res.GVR.Resource)
		}
		wr.childRes = append(wr.childRes, res)
	}
	declared := make([]string, len(spec.ChildResources))
	for i, c := range spec.ChildResources {
		declared[i] = c.APIVersion
	}
	if err := distinctResources("spec.childResources", declared, wr.childRes); err != nil {
		return nil, err
	}
	return wr, nil
}

// distinctResources rejects a list that declares one resource twice (also
// in two versions): its objects would be planned under two rules at once
// and deleted and recreated on every sync.
func distinctResources(field string, apiVersions []string, res []*discovery.Resource) error {
	rules := make([]children.Rule, len(res))
	for i, r := range res {
		rules[i] = children.Rule{APIVersion: apiVersions[i], Resource: r.GVR.Resource, Kind: r.Kind}
	}
	return children.CheckDistinct(field, rules)
}

func (wr *wiring) start(ctx context.Context) error {
	ctx, wr.cancel = context.WithCancel(ctx)
	wr.ctx = ctx
	wr.related = newRelatedIndex(ctx, wr.w, wr.enqueueRelated)
	wr.parent = wr.w.registry.Acquire(wr.parentRes.GVR)
	if err := wr.parent.AddHandler(cache.ResourceEventHandlerDetailedFuncs{
		AddFunc: func(obj any, initial bool) {
			if initial {
				// Parents that exist when the wiring starts (watcher
				// start, controller change): a resync, which the
				// dispatcher never skips as an echo. As a plain event,
				// a parent whose last answer was lost while the watcher
				// was down stayed lost until the next cache flush.
				wr.resyncOne(obj)
				return
			}
			wr.onParent(nil, obj)
		},
		UpdateFunc: func(old, obj any) { wr.onParent(old, obj) },
		DeleteFunc: func(obj any) {
			if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = d.Obj
			}
			if p, ok := obj.(*unstructured.Unstructured); ok {
				wr.dropRelated(string(p.GetUID()))
			}
		},
	}); err != nil {
		return err
	}
	for _, res := range wr.childRes {
		h := wr.w.registry.Acquire(res.GVR)
		wr.children = append(wr.children, h)
		gvr := res.GVR
		if err := h.AddHandler(cache.ResourceEventHandlerFuncs{
			AddFunc:    func(obj any) { wr.onChild(gvr, nil, obj) },
			UpdateFunc: func(old, obj any) { wr.onChild(gvr, old, obj) },
			DeleteFunc: func(obj any) { wr.onChild(gvr, nil, obj) },
		}); err != nil {
			return err
		}
	}
	resyncEvery(ctx, wr.spec.ResyncPeriodSeconds, wr.resync)
	return nil
}

// wiredObject is the controller object a wiring was built from; every
// controller kind embeds it.
type wiredObject struct {
	obj      *unstructured.Unstructured
	specJSON string
}

func (o *wiredObject) object() *unstructured.Unstructured { return o.obj }

func (o *wiredObject) setObject(obj *unstructured.Unstructured) { o.obj = obj }

func (o *wiredObject) sameSpec(spec string, uid types.UID) bool {
	return o.specJSON == spec && o.obj.GetUID() == uid
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

func (wr *wiring) stop() {
	if wr.cancel != nil {
		wr.cancel()
	}
	if wr.related != nil {
		wr.releaseRelated()
	}
	if wr.parent != nil {
		wr.parent.Release()
	}
	for _, h := range wr.children {
		h.Release()
	}
}

// resync enqueues every cached parent.
func (wr *wiring) resync(reason string) {
	if wr.parent == nil {
		return
	}
	for _, p := range wr.parent.List() {
		if wr.selects(p) {
			wr.w.enqueue(wr.ref, wr.parentRes, p, reason, wr.parentRes.GVR, "")
		}
	}
}

// releaseFinalizers asks for the controller's finalizer to be removed from
// every parent that carries it.
func (wr *wiring) releaseFinalizers() {
	if wr.finalizer == "" || wr.parent == nil {
		return
	}
	n := 0
	for _, p := range wr.parent.List() {
		if composite.HasFinalizer(p, wr.finalizer) {
			wr.w.enqueueRelease(wr.ref, wr.parentRes, p, wr.finalizer)
			n++
		}
	}
	if n > 0 {
		wr.w.log.Info("releasing finalizers of a removed finalize hook", zap.String("controller", wr.ref.Name),
			zap.String("finalizer", wr.finalizer), zap.Int("parents", n))
	}
}

// selects reports whether the controller handles parent: it matches the
// parent label selector, or it no longer does but still carries our
// finalizer (so the finalize hook can run: the opt-out pattern).
func (wr *wiring) selects(parent *unstructured.Unstructured) bool {
	if wr.parentSel.Matches(labels.Set(parent.GetLabels())) {
		return true
	}
	if wr.finalizer != "" {
		for _, f := range parent.GetFinalizers() {
			if f == wr.finalizer {
				return true
			}
		}
	}
	return false
}

// resyncOne enqueues a resync of one parent the controller handles.
func (wr *wiring) resyncOne(obj any) {
	if parent, ok := obj.(*unstructured.Unstructured); ok && wr.selects(parent) {
		wr.w.enqueue(wr.ref, wr.parentRes, parent, bus.ReasonResync, wr.parentRes.GVR, parent.GetResourceVersion())
	}
}

func (wr *wiring) onParent(oldObj, obj any) {
	parent, ok := obj.(*unstructured.Unstructured)
	if !ok || !wr.selects(parent) {
		return
	}
	if old, ok := oldObj.(*unstructured.Unstructured); ok {
		if old.GetResourceVersion() == parent.GetResourceVersion() {
			return // informer resync: the bus has its own
		}
		if ign := wr.spec.ParentResource.IgnoreStatusChanges; ign != nil && *ign && !parentChangedBeyondStatus(old, parent) {
			return
		}
		wr.w.enqueueUpdate(wr.ref, wr.parentRes, parent, wr.parentRes.GVR, parent)
		return
	}
	wr.w.enqueue(wr.ref, wr.parentRes, parent, bus.ReasonEvent, wr.parentRes.GVR, parent.GetResourceVersion())
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

func (wr *wiring) onChild(gvr schema.GroupVersionResource, oldObj, obj any) {
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = d.Obj
	}
	child, ok := obj.(*unstructured.Unstructured)
	if !ok {
		return
	}
	rv := child.GetResourceVersion()
	// update is the child when this is an update that leaves its
	// controller as it was: possibly our own write (an echo).
	var update *unstructured.Unstructured
	if old, ok := oldObj.(*unstructured.Unstructured); ok {
		if old.GetResourceVersion() == rv {
			return
		}
		// The controller changed (released or adopted elsewhere): the
		// old owner must hear about it too.
		if oref, nref := metav1.GetControllerOf(old), metav1.GetControllerOf(child); oref != nil && (nref == nil || oref.UID != nref.UID) {
			wr.enqueueOwner(gvr, old, oref, rv, nil)
		} else {
			update = child
		}
	}
	if ref := metav1.GetControllerOf(child); ref != nil {
		wr.enqueueOwner(gvr, child, ref, rv, update)
		return
	}
	// An orphan: every parent in its namespace whose selector matches may
	// want to adopt it.
	var candidates []*unstructured.Unstructured
	if wr.parentRes.Namespaced {
		candidates = wr.parent.InNamespace(child.GetNamespace())
	} else {
		candidates = wr.parent.List()
	}
	for _, p := range candidates {
		sel, err := composite.ParentSelector(wr.spec, p)
		if err != nil || sel.Empty() || !sel.Matches(labels.Set(child.GetLabels())) || !wr.selects(p) {
			continue
		}
		wr.w.enqueue(wr.ref, wr.parentRes, p, bus.ReasonEvent, gvr, rv)
	}
}

// enqueueOwner enqueues the parent that ref names; update is the child if
// the event is an update that may be our own write (nil otherwise).
func (wr *wiring) enqueueOwner(gvr schema.GroupVersionResource, child *unstructured.Unstructured, ref *metav1.OwnerReference, rv string, update *unstructured.Unstructured) {
	gv, err := schema.ParseGroupVersion(ref.APIVersion)
	if err != nil || ref.Kind != wr.parentRes.Kind || gv.Group != wr.parentRes.GVR.Group {
		return
	}
	parent, ok := wr.parent.ByUID(string(ref.UID))
	if !ok || !wr.selects(parent) {
		return
	}
	if update != nil {
		wr.w.enqueueUpdate(wr.ref, wr.parentRes, parent, gvr, update)
		return
	}
	wr.w.enqueue(wr.ref, wr.parentRes, parent, bus.ReasonEvent, gvr, rv)
}

// mergeRV keeps the highest resourceVersion per key.
func mergeRV(m map[string]string, k, rv string) {
	cur, ok := m[k]
	if !ok {
		m[k] = rv
		return
	}
	if c, err := resourceversion.CompareResourceVersion(rv, cur); err == nil && c > 0 {
		m[k] = rv
	}
}

// handleFor returns the wiring's informer handle for a freshness key.
func (wr *wiring) handleFor(key string) *informers.Handle {
	if grKey(wr.parentRes.GVR) == key {
		return wr.parent
	}
	for _, h := range wr.children {
		if grKey(h.GVR()) == key {
			return h
		}
	}
	return wr.related.handleFor(key)
}

// controllerWeight reads the controller's WeightAnnotation (1 when absent
// or invalid; an invalid value is reported once per value in the log).
func (w *Watcher) controllerWeight(ref bus.ControllerRef) int {
	obj, ok := w.controllerObject(ref.Kind, ref.Name)
	if !ok {
		return 1
	}
	v := obj.GetAnnotations()[bus.WeightAnnotation]
	weight, err := bus.ParseWeight(v)
	if err != nil {
		if _, seen := w.badWeights.LoadOrStore(ref.ID()+"="+v, true); !seen {
			w.log.Warn("ignoring the controller's weight", zap.String("controller", ref.Name), zap.Error(err))
		}
	}
	return weight
}
