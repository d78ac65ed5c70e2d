package decorator

import (
	"fmt"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/metabus/metabus/pkg/apiresource"
	"github.com/metabus/metabus/pkg/composite"
	"github.com/metabus/metabus/pkg/kinds"
	"github.com/metabus/metabus/pkg/snapshot"
)

// WatchResources lists the target resources and the attachment resources,
// in spec order, for the admin's policy.
func (c *Controller) WatchResources() []kinds.WatchedResource {
	spec := &c.DC.Spec
	out := make([]kinds.WatchedResource, 0, len(spec.Resources)+len(spec.Attachments))
	for i, r := range spec.Resources {
		out = append(out, kinds.WatchedResource{Field: fmt.Sprintf("spec.resources[%d]", i), APIVersion: r.APIVersion, Resource: r.Resource})
	}
	for i, a := range spec.Attachments {
		out = append(out, kinds.WatchedResource{Field: fmt.Sprintf("spec.attachments[%d]", i), APIVersion: a.APIVersion, Resource: a.Resource})
	}
	return out
}

// WatchPlan resolves the target resources (one parent source per distinct
// resource, selected by the per-kind label and annotation selectors) and
// the attachment resources in spec order. A decorator never adopts: only
// objects with a controller reference to a target and the decorator's
// annotation are attachments.
//
// A DecoratorController may target several kinds, built-in or custom,
// namespaced or cluster-scoped: work items are keyed by the target's UID,
// which never collides across kinds.
func (c *Controller) WatchPlan(resolve kinds.WatchResolver) (*kinds.WatchPlan, error) {
	spec := &c.DC.Spec
	if len(spec.Resources) == 0 {
		return nil, fmt.Errorf("spec.resources is empty: nothing to decorate")
	}
	rules := &watchRules{name: c.DC.Name, finalizer: c.Finalizer()}
	// OwnerRef ignores objects without this mark: the watcher routes
	// attachment events by it.
	plan := &kinds.WatchPlan{Finalizer: rules.finalizer, Rules: rules,
		Attachment: &kinds.Attachment{Annotation: ControllerAnnotation, Value: c.DC.Name}}
	resolved := make([]ResolvedRule, 0, len(spec.Resources))
	byGVR := map[schema.GroupVersionResource]int{}
	for i, r := range spec.Resources {
		if r.APIVersion == "" || r.Resource == "" {
			return nil, fmt.Errorf("spec.resources[%d] needs apiVersion and resource", i)
		}
		res, err := resolve(r.APIVersion, r.Resource)
		if err != nil {
			return nil, fmt.Errorf("spec.resources[%d]: %w", i, err)
		}
		resolved = append(resolved, ResolvedRule{DecoratorControllerResourceRule: r, Kind: res.Kind})
		// A resource named by several rules is watched once, ignoring
		// status changes only if every rule asks for it.
		ignore := r.IgnoreStatusChanges != nil && *r.IgnoreStatusChanges
		if j, ok := byGVR[res.GVR]; ok {
			plan.Parents[j].IgnoreStatusChanges = plan.Parents[j].IgnoreStatusChanges && ignore
			continue
		}
		byGVR[res.GVR] = len(plan.Parents)
		plan.Parents = append(plan.Parents, kinds.WatchParent{Res: res, IgnoreStatusChanges: ignore})
	}
	sel, err := NewSelector(resolved)
	if err != nil {
		return nil, err
	}
	rules.selector = sel
	for _, p := range plan.Parents {
		rules.parentKinds = append(rules.parentKinds, schema.GroupKind{Group: p.Res.GVR.Group, Kind: p.Res.Kind})
	}
	declared := make([]string, len(spec.Attachments))
	for i, a := range spec.Attachments {
		res, err := resolve(a.APIVersion, a.Resource)
		if err != nil {
			return nil, fmt.Errorf("spec.attachments[%d]: %w", i, err)
		}
		// A cluster-scoped attachment is only invalid under a namespaced
		// target, and a controller may target both scopes: the applier
		// rejects such a desired attachment per target.
		rules.owned = append(rules.owned, res)
		declared[i] = a.APIVersion
	}
	if err := composite.WatchCheckDistinct("spec.attachments", declared, rules.owned); err != nil {
		return nil, err
	}
	plan.Owned = rules.owned
	return plan, nil
}

// watchRules are a DecoratorController's watch decisions.
type watchRules struct {
	name        string // the controller's name, which marks attachments
	finalizer   string
	selector    *Selector
	parentKinds []schema.GroupKind // per parent source
	owned       []*apiresource.Resource
}

// Selects matches the selectors of the target's group and kind.
func (r *watchRules) Selects(target *unstructured.Unstructured) bool {
	return r.selector.Matches(target)
}

// OwnerRef is the controller reference of an object marked as this
// decorator's attachment; unmarked objects are nobody's business (there
// is no adoption).
func (r *watchRules) OwnerRef(obj *unstructured.Unstructured) *metav1.OwnerReference {
	ref := metav1.GetControllerOfNoCopy(obj)
	if ref == nil || !IsAttachment(obj, r.name) {
		return nil
	}
	return ref
}

// WantsOrphan: a decorator adopts nothing.
func (r *watchRules) WantsOrphan(_, _ *unstructured.Unstructured) bool { return false }

// Observe lists a target's attachments per attachment resource: objects
// it controls that carry the decorator's annotation, in its namespace.
func (r *watchRules) Observe(parentRes *apiresource.Resource, target *unstructured.Unstructured, caches []kinds.WatchCache) ([]snapshot.Group, string) {
	uid := string(target.GetUID())
	ns := target.GetNamespace()
	var groups []snapshot.Group
	for i, h := range caches {
		res := r.owned[i]
		g := snapshot.GroupOf(res)
		for _, c := range h.OwnedBy(uid) {
			if r.watchAttachmentOf(c, parentRes, ns) {
				g.Objects = append(g.Objects, c)
			}
		}
		groups = append(groups, g)
	}
	return groups, ""
}

// watchAttachmentOf reports whether c, controlled by a target, is this
// decorator's attachment of a target of parentRes in namespace ns.
func (r *watchRules) watchAttachmentOf(c *unstructured.Unstructured, parentRes *apiresource.Resource, ns string) bool {
	ref := metav1.GetControllerOfNoCopy(c)
	if ref == nil || ref.Kind != parentRes.Kind || !IsAttachment(c, r.name) {
		return false
	}
	if gv, err := schema.ParseGroupVersion(ref.APIVersion); err != nil || gv.Group != parentRes.GVR.Group {
		return false
	}
	// A namespaced target only owns objects of its namespace (the garbage
	// collector ignores cross-namespace owners).
	return ns == "" || c.GetNamespace() == ns
}

// ReleaseOnReplace releases the finalizer from every target when the new
// spec drops the finalize hook, and otherwise from the targets of every
// kind the new spec no longer names (a new version of the same kind still
// does, and finalizes them if they stopped matching).
func (r *watchRules) ReleaseOnReplace(next *kinds.WatchPlan) []bool {
	nr, ok := next.Rules.(*watchRules)
	if r.finalizer == "" || !ok {
		return nil
	}
	out := make([]bool, len(r.parentKinds))
	for i, gk := range r.parentKinds {
		out[i] = next.Finalizer == "" || !nr.selector.Handles(gk)
	}
	return out
}
