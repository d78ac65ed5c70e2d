package applier

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"

	"go.uber.org/zap"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"

	"github.com/metabus/metabus/pkg/bus"
	"github.com/metabus/metabus/pkg/children"
	"github.com/metabus/metabus/pkg/events"
	"github.com/metabus/metabus/pkg/kinds"
)

// This file holds every Kubernetes write of the applier: the children
// (create, update, delete), their adoption and release, and the parent's
// own writes (patch, status, finalizer removal).

// setControllerRef adopts (add) or releases (remove) a child with a merge
// patch carrying the cached resourceVersion, so a child that changed since
// (e.g. adopted by someone else) yields a conflict rather than two owners.
func (a *Applier) setControllerRef(ctx context.Context, rule *children.Rule, obj *unstructured.Unstructured, owner children.Owner, uidLabels []string, adopt bool) (*unstructured.Unstructured, error) {
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
			// controller. A label naming the old parent's UID (the
			// kind's OwnerUIDLabels: generateSelector's) follows it, or
			// the new parent's selector would release the child again
			// (an OnDelete child is never rewritten by an apply).
			previous = true
			var relabel map[string]any
			for _, l := range uidLabels {
				if obj.GetLabels()[l] == string(r.UID) {
					if relabel == nil {
						relabel = map[string]any{}
					}
					relabel[l] = owner.UID
				}
			}
			if relabel != nil {
				meta["labels"] = relabel
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
	c, err := a.client(ctx, rule, obj.GetNamespace())
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

// parentClient returns the dynamic client of the parent's resource that
// the apply of ctx writes with (writersOf).
func (a *Applier) parentClient(ctx context.Context, ref bus.ObjectRef) (dynamic.ResourceInterface, error) {
	return parentResource(a.writersOf(ctx).dyn, ref)
}

// parentResource returns dyn's client of the parent's resource.
func parentResource(dyn dynamic.Interface, ref bus.ObjectRef) (dynamic.ResourceInterface, error) {
	gv, err := schema.ParseGroupVersion(ref.APIVersion)
	if err != nil {
		return nil, fmt.Errorf("parent apiVersion %q: %w", ref.APIVersion, err)
	}
	r := dyn.Resource(gv.WithResource(ref.Resource))
	if ref.Namespace != "" {
		return r.Namespace(ref.Namespace), nil
	}
	return r, nil
}

// adoptable rechecks the parent without the cache before adopting, as
// the cache may lag its deletion: a parent being deleted, or replaced by
// another of the same name, adopts nothing. The read is the applier's own,
// not the controller identity's.
func (a *Applier) adoptable(ctx context.Context, ds *bus.DesiredState) (bool, error) {
	pc, err := parentResource(a.dyn, ds.Parent)
	if err != nil {
		return false, err
	}
	live, err := pc.Get(ctx, ds.Parent.Name, metav1.GetOptions{})
	if err != nil {
		return false, fmt.Errorf("recheck parent before adopting: %w", err)
	}
	return live.GetDeletionTimestamp() == nil && string(live.GetUID()) == ds.Parent.UID, nil
}

// resolveRules resolves a controller's declared child resources through
// discovery.
func (a *Applier) resolveRules(ctx context.Context, decl kinds.ApplyChildRules) ([]children.Rule, error) {
	rules := make([]children.Rule, 0, len(decl.Rules))
	for i, r := range decl.Rules {
		res, err := a.disc.Resolve(ctx, r.APIVersion, r.Resource)
		if err != nil {
			return nil, fmt.Errorf("%s[%d]: %w", decl.Field, i, err)
		}
		rules = append(rules, children.Rule{APIVersion: r.APIVersion, Resource: r.Resource, Kind: res.Kind, Namespaced: res.Namespaced, Method: r.Method})
	}
	if err := children.CheckDistinct(decl.Field, rules); err != nil {
		return nil, err
	}
	return rules, nil
}

// client returns the dynamic client of a child's resource that the apply
// of ctx writes with (writersOf).
func (a *Applier) client(ctx context.Context, rule *children.Rule, ns string) (dynamic.ResourceInterface, error) {
	gv, err := schema.ParseGroupVersion(rule.APIVersion)
	if err != nil {
		return nil, fmt.Errorf("child apiVersion %q: %w", rule.APIVersion, err)
	}
	r := a.writersOf(ctx).dyn.Resource(gv.WithResource(rule.Resource))
	if rule.Namespaced {
		return r.Namespace(ns), nil
	}
	return r, nil
}

// create creates a child: through the raw client when there is one (the
// created object is not decoded: nothing reads it), else the dynamic one.
func (a *Applier) create(ctx context.Context, c dynamic.ResourceInterface, rule *children.Rule, obj *unstructured.Unstructured) (written, error) {
	raw := a.writersOf(ctx).raw
	if raw == nil {
		out, err := c.Create(ctx, obj, metav1.CreateOptions{})
		if err != nil {
			return written{}, err
		}
		return written{UID: string(out.GetUID()), ResourceVersion: out.GetResourceVersion()}, nil
	}
	gvr, err := ruleGVR(rule)
	if err != nil {
		return written{}, err
	}
	ns := ""
	if rule.Namespaced {
		ns = obj.GetNamespace()
	}
	return raw.create(ctx, gvr, ns, obj)
}

// update updates a child and returns it as written (only its
// resourceVersion is read back with the raw client).
func (a *Applier) update(ctx context.Context, c dynamic.ResourceInterface, rule *children.Rule, obj *unstructured.Unstructured) (*unstructured.Unstructured, error) {
	raw := a.writersOf(ctx).raw
	if raw == nil {
		return c.Update(ctx, obj, metav1.UpdateOptions{})
	}
	gvr, err := ruleGVR(rule)
	if err != nil {
		return nil, err
	}
	rv, err := raw.update(ctx, gvr, obj, "")
	if err != nil {
		return nil, err
	}
	return withResourceVersion(obj, rv), nil
}

func ruleGVR(rule *children.Rule) (schema.GroupVersionResource, error) {
	gv, err := schema.ParseGroupVersion(rule.APIVersion)
	if err != nil {
		return schema.GroupVersionResource{}, fmt.Errorf("child apiVersion %q: %w", rule.APIVersion, err)
	}
	return gv.WithResource(rule.Resource), nil
}

// parentGVR is the parent's resource; its apiVersion was parsed when its
// client was made.
func parentGVR(ref bus.ObjectRef) schema.GroupVersionResource {
	gv, _ := schema.ParseGroupVersion(ref.APIVersion)
	return gv.WithResource(ref.Resource)
}

// write performs one child action with optimistic concurrency.
func (a *Applier) write(ctx context.Context, act children.Action) error {
	obj := act.Object
	c, err := a.client(ctx, act.Rule, obj.GetNamespace())
	if err != nil {
		return err
	}
	what := fmt.Sprintf("%s %s", act.Rule.Kind, key(obj))
	a.log.Debug("child write", zap.String("op", string(act.Op)), zap.String("child", what), zap.String("reason", act.Reason))
	switch act.Op {
	case children.OpCreate:
		a.metrics.writes.WithLabelValues("create", act.Rule.Resource).Inc()
		out, err := a.create(ctx, c, act.Rule, obj)
		if err != nil {
			return a.createFailed(ctx, c, obj, what, err)
		}
		noteCreated(ctx, ruleKey(act.Rule), out)
		noteChange(ctx, changeCreated, obj, out.UID, out.ResourceVersion)
	case children.OpUpdate:
		a.metrics.writes.WithLabelValues("update", act.Rule.Resource).Inc()
		finish := startWrite(ctx, ruleKey(act.Rule), obj)
		out, err := a.update(ctx, c, act.Rule, obj)
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
		if out != nil {
			noteChange(ctx, changeUpdated, obj, string(out.GetUID()), out.GetResourceVersion())
		}
	case children.OpApply:
		return a.applyChild(ctx, c, act, what)
	case children.OpDelete:
		if act.Verify != nil {
			needed, err := a.recreateNeeded(ctx, c, act, what)
			if err != nil || !needed {
				return err
			}
		}
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
		if err == nil {
			noteChange(ctx, changeDeleted, obj, "", "")
		}
	default:
		return fmt.Errorf("unknown child action %q", act.Op)
	}
	return nil
}

// alreadyExists settles a create of obj that failed because its name is
// taken (holderOf). A child this parent controls is ours, created by a
// previous sync whose result the snapshot did not show yet (two syncs in
// quick succession): nothing is wrong, and the sync its creation triggers
// sees it. Anything else (someone else's object, an orphan) is never
// written: a createConflictError, which names who holds it.
func (a *Applier) alreadyExists(ctx context.Context, c dynamic.ResourceInterface, obj *unstructured.Unstructured, what string) error {
	existing, err := c.Get(ctx, obj.GetName(), metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("create %s: it already exists, and reading it failed: %w", what, err)
	}
	ours, holder := holderOf(existing, metav1.GetControllerOfNoCopy(obj)) // Plan set it to the parent
	if !ours {
		return &createConflictError{what: what, holder: holder}
	}
	a.log.Debug("child already created by this parent", zap.String("child", what))
	return nil
}

func key(o *unstructured.Unstructured) string {
	if o.GetNamespace() == "" {
		return o.GetName()
	}
	return o.GetNamespace() + "/" + o.GetName()
}

// The verbs of the parent's writes, the verb label of
// metabus_applier_api_writes_total.
const (
	verbPatchParent     = "patch_target"
	verbAddFinalizer    = "add_finalizer"
	verbRemoveFinalizer = "remove_finalizer"
	verbUpdateStatus    = "update_status"
)

// parentWrite is one write of the parent itself: a merge patch (which
// carries the observed resourceVersion) or a new status through the
// status subresource.
type parentWrite struct {
	verb string
	// what names the write in errors ("add finalizer f on", ...).
	what   string
	patch  map[string]any
	status map[string]any
}

// finalizerRemoval removes finalizer f from parent, with parent's
// resourceVersion as precondition: if the parent changed since, the patch
// fails with a conflict instead of overwriting someone else's finalizer
// list.
func finalizerRemoval(parent *unstructured.Unstructured, f string) parentWrite {
	fins := slices.DeleteFunc(slices.Clone(parent.GetFinalizers()), func(x string) bool { return x == f })
	if fins == nil {
		fins = []string{}
	}
	return parentWrite{verb: verbRemoveFinalizer, what: "remove finalizer " + f + " on", patch: map[string]any{"metadata": map[string]any{
		"finalizers": fins, "resourceVersion": parent.GetResourceVersion(),
	}}}
}

// removeFinalizer removes finalizer f from parent (finalizerRemoval).
func (a *Applier) removeFinalizer(ctx context.Context, ds *bus.DesiredState, parent *unstructured.Unstructured, f string) (*unstructured.Unstructured, error) {
	return a.writeParent(ctx, ds, parent, finalizerRemoval(parent, f))
}

// writeParent is the one path of the parent's own writes. Each write is
// announced to the write log (echo suppression) and remembered as this
// replica's last write of the parent (read your writes). A status write
// to a parent gone meanwhile is no error: nothing is left to report on.
// Conflicts are returned as they are, for the caller to requeue.
func (a *Applier) writeParent(ctx context.Context, ds *bus.DesiredState, parent *unstructured.Unstructured, w parentWrite) (*unstructured.Unstructured, error) {
	c, err := a.parentClient(ctx, ds.Parent)
	if err != nil {
		return nil, err
	}
	raw := a.writersOf(ctx).raw
	var data []byte
	if w.status == nil {
		if data, err = json.Marshal(w.patch); err != nil {
			return nil, fmt.Errorf("encode patch of %s: %w", key(parent), err)
		}
	}
	a.metrics.writes.WithLabelValues(w.verb, ds.Parent.Resource).Inc()
	finish := startWrite(ctx, parentFreshKey(ds), parent)
	var out *unstructured.Unstructured
	switch {
	case w.status != nil && raw != nil:
		updated := withStatus(parent, w.status)
		var rv string
		if rv, err = raw.update(ctx, parentGVR(ds.Parent), updated, "status"); err == nil {
			out = withResourceVersion(updated, rv)
		}
	case w.status != nil:
		out, err = c.UpdateStatus(ctx, withStatus(parent, w.status), metav1.UpdateOptions{})
	default:
		out, err = c.Patch(ctx, parent.GetName(), types.MergePatchType, data, metav1.PatchOptions{})
	}
	finish(out)
	if err != nil {
		switch {
		case w.status != nil && apierrors.IsNotFound(err):
			return parent, nil
		case w.status != nil && apierrors.IsConflict(err):
			return nil, err
		case w.status != nil:
			return nil, fmt.Errorf("update status of %s: %w", key(parent), err)
		}
		return nil, fmt.Errorf("%s %s: %w", w.what, key(parent), err)
	}
	noteStatusWritten(ctx)
	a.wrote(ds, out)
	return out, nil
}
