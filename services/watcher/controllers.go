package watcher

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"go.uber.org/zap"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/tools/cache"

	"github.com/metabus/metabus/pkg/apiresource"
	"github.com/metabus/metabus/pkg/bus"
	"github.com/metabus/metabus/pkg/events"
	"github.com/metabus/metabus/pkg/kindtable"
	"github.com/metabus/metabus/pkg/obs"
)

// The lifecycle of controller objects, the same for every kind: a change
// is queued as "<kind>/<name>", and syncController wires, rewires or
// unwires the controller through its kind's core.

func (w *Watcher) enqueueController(kind string, obj any) {
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = d.Obj
	}
	if m, err := meta.Accessor(obj); err == nil {
		w.ctrlQueues[kind].Add(kind + "/" + m.GetName())
	}
}

// runControllers works the queue of kind's controller objects until it
// shuts down.
func (w *Watcher) runControllers(ctx context.Context, kind string) {
	queue, rec := w.ctrlQueues[kind], w.metrics.reconciles[kind]
	for {
		id, shutdown := queue.Get()
		if shutdown {
			return
		}
		begin := rec.Begin()
		err := w.reconcileController(ctx, id, rec)
		var final *terminalError
		switch {
		case errors.As(err, &final):
			// Reported on the object already; retried when it changes.
			queue.Forget(id)
			rec.End(begin, obs.ReconcileError, true)
		case err != nil:
			w.log.Warn("wire controller; will retry", zap.String("controller", id), zap.Error(err))
			queue.AddRateLimited(id)
			rec.End(begin, obs.ReconcileError, false)
		default:
			queue.Forget(id)
			rec.End(begin, obs.ReconcileSuccess, false)
		}
		queue.Done(id)
	}
}

// reconcileController is syncController, with a panic turned into an
// error that is retried with backoff (and counted, as controller-runtime
// counts its reconcilers' panics) rather than ending the process: one
// controller object that trips a bug must not stop every other one.
func (w *Watcher) reconcileController(ctx context.Context, id string, rec *obs.Reconciles) (err error) {
	defer func() {
		if p := recover(); p != nil {
			rec.Panicked()
			err = fmt.Errorf("panic wiring controller %s: %v [recovered]", id, p)
			w.log.Error("panic wiring controller", zap.String("controller", id), zap.Any("panic", p), zap.StackSkip("stack", 2))
		}
	}()
	return w.syncController(ctx, id)
}

// terminalError is a controller object that cannot be wired as it is:
// reported on the object, not retried until it changes.
type terminalError struct{ error }

func (e *terminalError) Unwrap() error { return e.error }

// syncController (re)wires or unwires one controller object, queued as
// "<kind>/<name>". An error is retried with backoff; a controller that is
// invalid as it is, or refused by the admin's policy, is reported on its
// object and not retried until it changes (a *terminalError).
func (w *Watcher) syncController(ctx context.Context, key string) error {
	kind, name, ok := strings.Cut(key, "/")
	if !ok {
		return nil
	}
	if _, ok := kindtable.Lookup(kind); !ok {
		return nil
	}
	id := bus.ControllerID(kind, name)
	if obj, ok := w.controllerObject(kind, name); ok {
		w.checkAnnotations(obj)
	}
	obj, specJSON, err := w.controllerChanged(id, kind, name)
	if err != nil || obj == nil {
		return err
	}
	identity, err := w.identityOf(obj)
	if err != nil {
		w.invalidIdentity(id, obj, err)
		return &terminalError{err}
	}
	ctrl, err := kindtable.Decode(obj)
	if err != nil {
		err = fmt.Errorf("invalid spec: %w", err)
		w.invalidController(id, obj, err)
		return &terminalError{err}
	}
	if err := refuse(w.resources, ctrl.WatchResources()); err != nil {
		w.refusedController(id, obj, err)
		return &terminalError{err}
	}
	plan, err := ctrl.WatchPlan(func(apiVersion, resource string) (*apiresource.Resource, error) {
		return w.disc.Resolve(ctx, apiVersion, resource)
	})
	if err != nil {
		w.invalidController(id, obj, err)
		return err
	}
	w.precheckReads(ctx, identity, plan)
	wr := w.newWiring(ctrl.Ref(), obj, string(specJSON), ctrl.ResyncPeriodSeconds(), plan)
	wr.identity = identity
	if err := w.install(ctx, id, wr, obj); err != nil {
		return err
	}
	parents := make([]string, len(plan.Parents))
	for i, p := range plan.Parents {
		parents[i] = p.Res.GVR.String()
	}
	inputs := 0
	if plan.Keyed != nil {
		inputs = len(plan.Keyed.Inputs)
	}
	w.log.Info("controller wired", zap.String("kind", kind), zap.String("controller", name),
		zap.Strings("parents", parents), zap.Int("ownedResources", len(plan.Owned)), zap.Int("inputResources", inputs),
		zap.String("serviceAccount", identity.String()))
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

// controllerChanged does the part of a controller object change that needs
// no decoding: a deleted controller is unwired and releases its
// finalizers, an untargeted one is unwired and keeps them (another
// installation may serve it), and an unchanged spec keeps the wiring with
// the refreshed object. It returns the object and its spec when a new
// wiring must be built.
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
	if old := w.wirings[id]; old != nil && old.sameSpec(string(spec), obj) {
		// Metadata or status changed only: keep the wiring, refresh the
		// object the hooks are sent.
		old.obj = obj
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
// wiring, then releases the finalizers the new spec leaves nobody to
// finalize and stops the old wiring. The new wiring subscribes before the
// old one releases, so informers both use stay up (no relist).
func (w *Watcher) install(ctx context.Context, id string, wr *wiring, obj *unstructured.Unstructured) error {
	if err := wr.start(ctx); err != nil {
		wr.stop()
		return err
	}
	w.mu.Lock()
	old := w.wirings[id]
	w.wirings[id] = wr
	w.mu.Unlock()
	if old != nil {
		old.releaseFinalizers(old.plan.Rules.ReleaseOnReplace(wr.plan), "the new spec leaves nobody to finalize")
		old.stop()
	}
	w.metrics.controllers.Set(float64(w.countWirings()))
	w.rec.Normal(obj, events.ReasonStarted, "controller started")
	return nil
}

func (w *Watcher) countWirings() int {
	w.mu.RLock()
	defer w.mu.RUnlock()
	return len(w.wirings)
}

// unwire stops a controller's wiring; release asks for its finalizer to be
// removed from every parent first (the controller was deleted).
func (w *Watcher) unwire(id, why string, release bool) {
	w.mu.Lock()
	old := w.wirings[id]
	delete(w.wirings, id)
	w.mu.Unlock()
	w.badWeights.Delete(id)
	if old != nil {
		if release {
			old.releaseFinalizers(old.allParents(), "controller deleted")
		}
		old.stop()
		w.log.Info("controller unwired", zap.String("controller", id), zap.String("why", why))
	}
	w.metrics.controllers.Set(float64(w.countWirings()))
}

// controllerWeight reads the controller's WeightAnnotation (1 when absent
// or invalid), as the operator's Config.Weights grants it. An invalid value is logged once, and again only when it
// changes: badWeights keeps the last invalid value per controller, not
// every value ever seen, since the annotation is its author's to change as
// often as they like.
func (w *Watcher) controllerWeight(ref bus.ControllerRef) int {
	obj, ok := w.controllerObject(ref.Kind, ref.Name)
	if !ok {
		return 1
	}
	v := obj.GetAnnotations()[bus.WeightAnnotation]
	weight, err := bus.ParseWeight(v)
	id := ref.ID()
	if err == nil {
		if _, had := w.badWeights.Load(id); had {
			w.badWeights.Delete(id)
		}
		return w.cfg.Weights.Grant(id, weight)
	}
	if last, seen := w.badWeights.Swap(id, v); !seen || last != v {
		w.log.Warn("ignoring the controller's weight", zap.String("controller", ref.Name), zap.Error(err))
	}
	return weight
}
