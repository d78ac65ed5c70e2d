package applier

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"go.uber.org/zap"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"

	"github.com/metabus/metabus/pkg/api/v1alpha1"
	"github.com/metabus/metabus/pkg/bus"
	"github.com/metabus/metabus/pkg/children"
	"github.com/metabus/metabus/pkg/composite"
	"github.com/metabus/metabus/pkg/events"
	"github.com/metabus/metabus/pkg/rollout"
	"github.com/metabus/metabus/pkg/snapshot"
)

func (a *Applier) apply(ctx context.Context, ds *bus.DesiredState) result {
	if ds.Hook == bus.HookRelease {
		return a.release(ctx, ds)
	}
	switch ds.Controller.Kind {
	case v1alpha1.CompositeControllerKind, v1alpha1.DecoratorControllerKind:
	default:
		a.log.Error("dropping desired state for an unsupported controller kind", zap.String("kind", ds.Controller.Kind))
		return result{result: "unsupported"}
	}
	snap, res, ok := a.observe(ctx, ds)
	if !ok {
		return res
	}
	if ds.Controller.Kind == v1alpha1.DecoratorControllerKind {
		return a.applyDecorator(ctx, ds, snap)
	}
	return a.applyComposite(ctx, ds, snap)
}

// observe fetches fresh observed state, at least as fresh as what the hook
// saw. ok is false when there is nothing to apply now (res says why).
func (a *Applier) observe(ctx context.Context, ds *bus.DesiredState) (snap *snapshot.Response, res result, ok bool) {
	snap, err := snapshot.Fetch(ctx, a.snaps, snapshot.Request{
		Controller: ds.Controller, ParentUID: ds.Parent.UID, MinResourceVersions: a.freshness(ds),
	}, a.cfg.SnapshotWait)
	if err != nil {
		if ctx.Err() != nil {
			return nil, result{result: "cancelled", infra: true}, false
		}
		reason := ""
		if errors.Is(err, bus.ErrTooLarge) {
			reason = events.ReasonApplyError // cannot heal by itself: say so on the parent
		}
		return nil, a.retry(ctx, ds, reason, fmt.Errorf("observed state unavailable: %w", err)), false
	}
	switch snap.Result {
	case snapshot.OK:
		return snap, result{}, true
	case snapshot.NotFound:
		return nil, result{result: "notfound"}, false
	case snapshot.Retry:
		return nil, a.retry(ctx, ds, "", fmt.Errorf("observed state not fresh yet: %s", snap.Message)), false
	default:
		return nil, result{result: "invalid"}, false
	}
}

func (a *Applier) applyComposite(ctx context.Context, ds *bus.DesiredState, snap *snapshot.Response) result {
	cc, err := composite.Decode(snap.Controller)
	if err != nil {
		return result{result: "invalid"}
	}
	parent := snap.Parent
	finalizer := composite.ControllerFinalizer(cc)
	holds := composite.HasFinalizer(parent, finalizer)
	if parent.GetDeletionTimestamp() != nil && !holds {
		// The parent is going away and we hold no finalizer on it: the
		// garbage collector owns the children now.
		return result{result: "parent_deleting"}
	}
	if ds.Hook == "sync" && finalizer != "" && !holds && parent.GetDeletionTimestamp() == nil {
		// A finalize hook needs the finalizer in place before any child
		// exists, so that deletion always waits for it.
		updated, err := a.setFinalizer(ctx, ds, parent, finalizer, true)
		if err != nil {
			return a.writeFailed(ctx, ds, err)
		}
		parent = updated
	}

	rules, err := a.rules(ctx, cc)
	if err != nil {
		return a.retry(ctx, ds, events.ReasonApplyError, err)
	}
	sel, err := composite.ParentSelector(cc.Spec, parent)
	if err != nil {
		return a.retry(ctx, ds, events.ReasonSyncError, err)
	}
	owner := children.Owner{
		APIVersion:  parent.GetAPIVersion(),
		Kind:        parent.GetKind(),
		Namespace:   parent.GetNamespace(),
		Name:        parent.GetName(),
		UID:         string(parent.GetUID()),
		Namespaced:  parent.GetNamespace() != "",
		Selector:    sel,
		ExtraLabels: composite.ExtraLabels(cc.Spec, parent),
	}
	desired, err := children.Normalize(owner, rules, ds.Children)
	if err != nil {
		// Reject the whole desired state: a partial apply of a response
		// we know to be wrong could leave the cluster worse.
		a.metrics.rejected.Inc()
		return a.retry(ctx, ds, events.ReasonInvalidDesired, fmt.Errorf("%s hook response rejected, nothing applied: %w", ds.Hook, err))
	}
	observed, err := a.claim(ctx, ds, owner, rules, snap.Children)
	if err != nil {
		return a.writeFailed(ctx, ds, err)
	}
	var actions []children.Action
	if rollout.HasRolling(cc) {
		var (
			cond rollout.Condition
			res  result
			ok   bool
		)
		if actions, cond, res, ok = a.rolling(ctx, ds, cc, parent, owner, rules, desired, observed); !ok {
			return res
		}
		withUpdatedCondition(ds, parent, cond)
	} else if actions, err = children.Plan(owner, rules, observed, desired); err != nil {
		return a.retry(ctx, ds, events.ReasonApplyError, fmt.Errorf("plan children: %w", err))
	}
	var errs []error
	conflict := false
	for _, act := range actions {
		if err := a.write(ctx, act); err != nil {
			if apierrors.IsConflict(err) {
				conflict = true
				continue
			}
			errs = append(errs, err)
		}
	}
	// Status reports what the hook observed; write it even if a child
	// write failed, as upstream does.
	if updated, err := a.writeStatus(ctx, ds, parent); err != nil {
		if apierrors.IsConflict(err) {
			conflict = true
		} else {
			errs = append(errs, err)
		}
	} else {
		parent = updated
	}
	if len(errs) > 0 {
		return a.retry(ctx, ds, events.ReasonApplyError, errors.Join(errs...))
	}
	if conflict {
		return a.requeue(ctx, ds)
	}
	if ds.Hook == "finalize" && ds.Finalized && holds {
		// Only now: every child write of the final desired state is done.
		if _, err := a.setFinalizer(ctx, ds, parent, finalizer, false); err != nil {
			return a.writeFailed(ctx, ds, err)
		}
		return result{result: "finalized"}
	}
	if len(actions) == 0 {
		return result{result: "noop"}
	}
	return result{result: "ok"}
}

// claim carries out the ControllerRef decisions of the snapshot: it adopts
// matching orphans and releases owned children that stopped matching, and
// returns the owned children per rule for planning.
func (a *Applier) claim(ctx context.Context, ds *bus.DesiredState, owner children.Owner, rules []children.Rule, groups []snapshot.Group) (map[int][]*unstructured.Unstructured, error) {
	observed := map[int][]*unstructured.Unstructured{}
	adopting := false
	for i, g := range groups {
		if i >= len(rules) {
			break
		}
		for _, o := range g.Release {
			if _, err := a.setControllerRef(ctx, &rules[i], o, owner, false); err != nil && !apierrors.IsNotFound(err) {
				return nil, err
			}
		}
		adopting = adopting || len(g.Adopt) > 0
	}
	if adopting {
		// Never adopt for a parent that is being deleted: recheck it
		// without the cache, as the cache may lag the deletion.
		c, err := a.parentClient(ds.Parent)
		if err != nil {
			return nil, err
		}
		live, err := c.Get(ctx, ds.Parent.Name, metav1.GetOptions{})
		if err != nil {
			return nil, fmt.Errorf("recheck parent before adopting: %w", err)
		}
		if live.GetDeletionTimestamp() != nil || string(live.GetUID()) != ds.Parent.UID {
			adopting = false
		}
	}
	for i, g := range groups {
		if i >= len(rules) {
			break
		}
		adopt := map[string]bool{}
		for _, o := range g.Adopt {
			adopt[string(o.GetUID())] = true
		}
		for _, o := range g.Objects {
			if !adopt[string(o.GetUID())] {
				observed[i] = append(observed[i], o)
				continue
			}
			if !adopting {
				continue
			}
			adopted, err := a.setControllerRef(ctx, &rules[i], o, owner, true)
			if err != nil {
				if apierrors.IsNotFound(err) {
					continue
				}
				return nil, err
			}
			observed[i] = append(observed[i], adopted)
		}
	}
	return observed, nil
}

// setControllerRef adopts (add) or releases (remove) a child with a merge
// patch carrying the cached resourceVersion, so a child that changed since
// (e.g. adopted by someone else) yields a conflict rather than two owners.
func (a *Applier) setControllerRef(ctx context.Context, rule *children.Rule, obj *unstructured.Unstructured, owner children.Owner, adopt bool) (*unstructured.Unstructured, error) {
	var refs []any
	previous := false
	meta := map[string]any{"resourceVersion": obj.GetResourceVersion()}
	for _, r := range obj.GetOwnerReferences() {
		if string(r.UID) == owner.UID {
			continue
		}
		if adopt && r.Controller != nil && *r.Controller && r.Kind == owner.Kind && r.Name == owner.Name {
			// The controller reference of an earlier incarnation of
			// this parent (the snapshot offers such children for
			// adoption only then): replaced, an object has one
			// controller. A generateSelector label naming the old
			// parent follows it, or the new parent's selector would
			// release the child again (an OnDelete child is never
			// rewritten by an apply).
			previous = true
			if obj.GetLabels()[composite.ControllerUIDLabel] == string(r.UID) {
				meta["labels"] = map[string]any{composite.ControllerUIDLabel: owner.UID}
			}
			continue
		}
		refs = append(refs, r)
	}
	if adopt {
		refs = append(refs, children.ControllerRef(owner))
	}
	if refs == nil {
		refs = []any{}
	}
	meta["ownerReferences"] = refs
	patch, err := json.Marshal(map[string]any{"metadata": meta})
	if err != nil {
		return nil, err
	}
	c, err := a.client(rule, obj.GetNamespace())
	if err != nil {
		return nil, err
	}
	verb := "adopt"
	if !adopt {
		verb = "release"
	}
	a.metrics.writes.WithLabelValues(verb, rule.Resource).Inc()
	out, err := c.Patch(ctx, obj.GetName(), types.MergePatchType, patch, metav1.PatchOptions{})
	if err != nil {
		return nil, fmt.Errorf("%s %s %s: %w", verb, rule.Kind, key(obj), err)
	}
	a.log.Debug("child "+verb+"ed", zap.String("child", key(obj)))
	if previous {
		a.log.Info("adopted a child of an earlier incarnation of its parent", zap.String("child", key(obj)),
			zap.String("parent", owner.Namespace+"/"+owner.Name))
		a.rec.Normal(bus.ObjectRef{APIVersion: owner.APIVersion, Kind: owner.Kind, Namespace: owner.Namespace, Name: owner.Name, UID: owner.UID}.Stub(), events.ReasonAdopted, fmt.Sprintf("adopted %s %s, left by an earlier %s of the same name (UID gone)", rule.Kind, key(obj), owner.Kind))
	}
	return out, nil
}

// writeFailed turns a parent write error into a requeue (conflict: the
// parent changed, sync again now) or a retry with backoff.
func (a *Applier) writeFailed(ctx context.Context, ds *bus.DesiredState, err error) result {
	if apierrors.IsConflict(err) {
		return a.requeue(ctx, ds)
	}
	if apierrors.IsNotFound(err) {
		return result{result: "notfound"}
	}
	return a.retry(ctx, ds, events.ReasonApplyError, err)
}

// parentClient returns the dynamic client of the parent's resource.
func (a *Applier) parentClient(ref bus.ObjectRef) (dynamic.ResourceInterface, error) {
	gv, err := schema.ParseGroupVersion(ref.APIVersion)
	if err != nil {
		return nil, fmt.Errorf("parent apiVersion %q: %w", ref.APIVersion, err)
	}
	r := a.dyn.Resource(gv.WithResource(ref.Resource))
	if ref.Namespace != "" {
		return r.Namespace(ref.Namespace), nil
	}
	return r, nil
}

// setFinalizer adds or removes finalizer on the parent with a merge patch
// carrying the cached resourceVersion: if the parent changed since, the
// patch fails with a conflict instead of overwriting someone else's
// finalizer list.
func (a *Applier) setFinalizer(ctx context.Context, ds *bus.DesiredState, parent *unstructured.Unstructured, finalizer string, add bool) (*unstructured.Unstructured, error) {
	var fins []string
	for _, f := range parent.GetFinalizers() {
		if f != finalizer {
			fins = append(fins, f)
		}
	}
	if add {
		fins = append(fins, finalizer)
	}
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{
		"finalizers":      nonNil(fins),
		"resourceVersion": parent.GetResourceVersion(),
	}})
	if err != nil {
		return nil, err
	}
	c, err := a.parentClient(ds.Parent)
	if err != nil {
		return nil, err
	}
	verb := "add_finalizer"
	if !add {
		verb = "remove_finalizer"
	}
	a.metrics.writes.WithLabelValues(verb, ds.Parent.Resource).Inc()
	finish := startWrite(ctx, parent)
	out, err := c.Patch(ctx, parent.GetName(), types.MergePatchType, patch, metav1.PatchOptions{})
	finish(out)
	if err != nil {
		return nil, fmt.Errorf("%s %s on %s: %w", strings.ReplaceAll(verb, "_", " "), finalizer, key(parent), err)
	}
	a.wrote(ds, out)
	return out, nil
}

func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}

// release removes a finalizer of a controller that is gone (or lost its
// finalize hook). This is the one path that reads the parent live: it has
// no snapshot to work from (the controller is not wired any more) and runs
// once per parent per controller deletion.
func (a *Applier) release(ctx context.Context, ds *bus.DesiredState) result {
	c, err := a.parentClient(ds.Parent)
	if err != nil {
		return result{result: "invalid"}
	}
	for attempt := 0; attempt < 5; attempt++ {
		parent, err := c.Get(ctx, ds.Parent.Name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) || (err == nil && string(parent.GetUID()) != ds.Parent.UID) {
			return result{result: "notfound"}
		}
		if err != nil {
			return a.retry(ctx, ds, "", fmt.Errorf("read parent to release finalizer: %w", err))
		}
		if !composite.HasFinalizer(parent, ds.Finalizer) {
			return result{result: "noop"}
		}
		_, err = a.setFinalizer(ctx, ds, parent, ds.Finalizer, false)
		if err == nil {
			a.log.Info("released finalizer of a removed controller", zap.String("finalizer", ds.Finalizer),
				zap.String("parent", key(parent)))
			return result{result: "released"}
		}
		if !apierrors.IsConflict(err) {
			return a.retry(ctx, ds, events.ReasonApplyError, err)
		}
	}
	return a.retry(ctx, ds, "", fmt.Errorf("release finalizer %s: parent keeps changing", ds.Finalizer))
}

// rules resolves the controller's child resources.
func (a *Applier) rules(ctx context.Context, cc *v1alpha1.CompositeController) ([]children.Rule, error) {
	rules := make([]children.Rule, 0, len(cc.Spec.ChildResources))
	for i, c := range cc.Spec.ChildResources {
		var method v1alpha1.ChildUpdateMethod
		if c.UpdateStrategy != nil {
			method = c.UpdateStrategy.Method
		}
		r, err := a.resolveRule(ctx, c.ResourceRule, method)
		if err != nil {
			return nil, fmt.Errorf("spec.childResources[%d]: %w", i, err)
		}
		rules = append(rules, r)
	}
	if err := children.CheckDistinct("spec.childResources", rules); err != nil {
		return nil, err
	}
	return rules, nil
}

// resolveRule turns a declared child or attachment resource into a rule,
// through discovery.
func (a *Applier) resolveRule(ctx context.Context, rr v1alpha1.ResourceRule, method v1alpha1.ChildUpdateMethod) (children.Rule, error) {
	res, err := a.disc.Resolve(ctx, rr.APIVersion, rr.Resource)
	if err != nil {
		return children.Rule{}, err
	}
	return children.Rule{APIVersion: rr.APIVersion, Resource: rr.Resource, Kind: res.Kind, Namespaced: res.Namespaced, Method: method}, nil
}

func (a *Applier) client(rule *children.Rule, ns string) (dynamic.ResourceInterface, error) {
	gv, err := schema.ParseGroupVersion(rule.APIVersion)
	if err != nil {
		return nil, fmt.Errorf("child apiVersion %q: %w", rule.APIVersion, err)
	}
	r := a.dyn.Resource(gv.WithResource(rule.Resource))
	if rule.Namespaced {
		return r.Namespace(ns), nil
	}
	return r, nil
}

// write performs one child action with optimistic concurrency.
func (a *Applier) write(ctx context.Context, act children.Action) error {
	obj := act.Object
	c, err := a.client(act.Rule, obj.GetNamespace())
	if err != nil {
		return err
	}
	what := fmt.Sprintf("%s %s", act.Rule.Kind, key(obj))
	a.log.Debug("child write", zap.String("op", string(act.Op)), zap.String("child", what), zap.String("reason", act.Reason))
	switch act.Op {
	case children.OpCreate:
		a.metrics.writes.WithLabelValues("create", act.Rule.Resource).Inc()
		if _, err := c.Create(ctx, obj, metav1.CreateOptions{}); err != nil {
			if apierrors.IsAlreadyExists(err) {
				return a.alreadyExists(ctx, c, obj, what)
			}
			return fmt.Errorf("create %s: %w", what, err)
		}
	case children.OpUpdate:
		a.metrics.writes.WithLabelValues("update", act.Rule.Resource).Inc()
		finish := startWrite(ctx, obj)
		out, err := c.Update(ctx, obj, metav1.UpdateOptions{})
		finish(out)
		if err != nil {
			if apierrors.IsNotFound(err) {
				return nil // deleted meanwhile; the next sync recreates it
			}
			if apierrors.IsConflict(err) {
				return err
			}
			return fmt.Errorf("update %s: %w", what, err)
		}
	case children.OpDelete:
		a.metrics.writes.WithLabelValues("delete", act.Rule.Resource).Inc()
		uid := obj.GetUID()
		policy := metav1.DeletePropagationBackground
		err := c.Delete(ctx, obj.GetName(), metav1.DeleteOptions{
			Preconditions:     &metav1.Preconditions{UID: &uid},
			PropagationPolicy: &policy,
		})
		if err != nil && !apierrors.IsNotFound(err) {
			if apierrors.IsConflict(err) {
				return err // the UID changed: a new object with that name
			}
			return fmt.Errorf("delete %s: %w", what, err)
		}
	default:
		return fmt.Errorf("unknown child action %q", act.Op)
	}
	return nil
}

// alreadyExists settles a create of obj that failed because its name is
// taken. A child this parent controls is ours, created by a previous sync
// whose result the snapshot did not show yet (two syncs in quick
// succession): nothing is wrong, and the sync its creation triggers sees
// it. Anything else (someone else's object, an orphan) is never
// overwritten.
func (a *Applier) alreadyExists(ctx context.Context, c dynamic.ResourceInterface, obj *unstructured.Unstructured, what string) error {
	notOurs := fmt.Errorf("create %s: it already exists and is not controlled by this parent", what)
	ref := metav1.GetControllerOfNoCopy(obj) // Plan set it to the parent
	if ref == nil {
		return notOurs
	}
	existing, err := c.Get(ctx, obj.GetName(), metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("create %s: it already exists, and reading it failed: %w", what, err)
	}
	if !children.IsOwnedBy(existing, children.Owner{APIVersion: ref.APIVersion, Kind: ref.Kind, UID: string(ref.UID)}) {
		return notOurs
	}
	a.log.Debug("child already created by this parent", zap.String("child", what))
	return nil
}

// writeStatus replaces the parent's status with the hook's (plus
// observedGeneration) if, and only if, it differs from the cached one. The
// write carries the cached resourceVersion, so a parent that changed since
// yields a conflict (requeue) instead of a lost update.
func (a *Applier) writeStatus(ctx context.Context, ds *bus.DesiredState, parent *unstructured.Unstructured) (*unstructured.Unstructured, error) {
	status := map[string]any{}
	for k, v := range ds.Status {
		status[k] = v
	}
	status["observedGeneration"] = ds.Parent.Generation
	current, _, _ := unstructured.NestedFieldNoCopy(parent.Object, "status")
	same, err := jsonEqual(current, status)
	if err != nil {
		return nil, fmt.Errorf("compare status: %w", err)
	}
	if same {
		return parent, nil
	}
	gv, err := schema.ParseGroupVersion(parent.GetAPIVersion())
	if err != nil {
		return nil, fmt.Errorf("parent apiVersion: %w", err)
	}
	updated := parent.DeepCopy()
	updated.Object["status"] = status
	r := a.dyn.Resource(gv.WithResource(ds.Parent.Resource))
	var ri dynamic.ResourceInterface = r
	if parent.GetNamespace() != "" {
		ri = r.Namespace(parent.GetNamespace())
	}
	a.metrics.writes.WithLabelValues("update_status", ds.Parent.Resource).Inc()
	finish := startWrite(ctx, parent)
	out, err := ri.UpdateStatus(ctx, updated, metav1.UpdateOptions{})
	finish(out)
	if err != nil {
		if apierrors.IsNotFound(err) {
			return parent, nil
		}
		if apierrors.IsConflict(err) {
			return nil, err
		}
		return nil, fmt.Errorf("update status of %s: %w", key(parent), err)
	}
	a.wrote(ds, out)
	return out, nil
}

// jsonEqual compares two JSON-like values by their canonical encoding, so
// int64(1) from the API and float64(1) from a hook are equal.
func jsonEqual(a, b any) (bool, error) {
	ja, err := json.Marshal(a)
	if err != nil {
		return false, err
	}
	jb, err := json.Marshal(b)
	if err != nil {
		return false, err
	}
	return bytes.Equal(ja, jb), nil
}

func key(o *unstructured.Unstructured) string {
	if o.GetNamespace() == "" {
		return o.GetName()
	}
	return o.GetNamespace() + "/" + o.GetName()
}
