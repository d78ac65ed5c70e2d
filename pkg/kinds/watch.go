package kinds

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/metabus/metabus/pkg/apiresource"
	"github.com/metabus/metabus/pkg/snapshot"
)

// Watching is what the watcher needs from a kind: its parent sources,
// owned (and possibly adopted) sources, how parents are selected, and how
// a snapshot of one parent is assembled.
//
// The watcher checks WatchResources against the admin's policy before it
// resolves anything, then builds a WatchPlan with its discovery resolver;
// everything after that (events, resyncs, snapshots) goes through the plan.
type Watching interface {
	// WatchResources lists every resource the spec names for the watcher
	// (parents, owned objects), each with the field that names it, in spec
	// order, as written (before discovery).
	WatchResources() []WatchedResource
	// WatchPlan resolves the spec's resources through resolve and says
	// what to watch and how. An error means the controller cannot be
	// wired as it is (it is reported on the controller object).
	WatchPlan(resolve WatchResolver) (*WatchPlan, error)
}

// WatchResolver resolves an apiVersion and a plural resource name through
// API discovery (the watcher's; the core stays free of I/O).
type WatchResolver func(apiVersion, resource string) (*apiresource.Resource, error)

// WatchedResource is one resource a spec names, and the field naming it
// (spec.parentResource, spec.childResources[1]...).
type WatchedResource struct {
	Field      string
	APIVersion string
	Resource   string
}

// WatchPlan is what the watcher watches for one controller: built once per
// controller spec, then shared by every event of its informers. It is
// immutable.
type WatchPlan struct {
	// Parents are the distinct parent resources (a composite's parent
	// resource; a decorator's target resources), in spec order.
	Parents []WatchParent
	// Owned are the owned resources (children, attachments) in spec order:
	// the snapshot has one group per entry, in this order.
	Owned []*apiresource.Resource
	// Adopts says whether orphans of the owned resources may be adopted
	// by a parent (Rules.WantsOrphan decides which parent).
	Adopts bool
	// Finalizer is the finalizer the controller puts on parents ("" while
	// it has no finalize hook). A parent carrying it stays selected, so
	// its finalize hook runs after it opts out.
	Finalizer string
	// Attachment, if set, is the annotation and value without which an
	// owned object is none of the controller's business (Rules.OwnerRef
	// returns nil for it): a DecoratorController's mark. The watcher
	// routes owned objects' events by it.
	Attachment *Attachment
	// Rules are the kind's decisions.
	Rules WatchRules
	// Keyed is set for a kind whose unit of work is (parent, map key),
	// not the parent (MapController): it has input sources besides its
	// parents and owned objects, and its work items, snapshots and desired
	// states are per key (design §10). nil for per-parent kinds.
	Keyed *KeyedPlan
}

// Attachment is an annotation and the value that mark an owned object.
type Attachment struct {
	Annotation string
	Value      string
}

// KeyedPlan is the part of a plan only keyed kinds have.
//
// How the watcher drives it: an event on an input becomes a work item for
// (parent, the input's key) of every parent whose InputSelector selected
// it before or selects it now, plus that parent's per-parent item when the
// selection changed (the status counts inputs). An event on an owned
// object becomes a work item for (its owner, its OutputKey), plus the
// owner's per-parent item unless it is an update that changes nothing a
// summary counts (owner, key, deletionTimestamp, status.conditions). A parent event or resync becomes the per-parent
// item and one item per key of the parent: the keys of the inputs it
// selects and the keys its outputs are tagged with (so a spec change
// re-maps every key and a resync asks the tombstone hook again for every
// detached key). A keyed snapshot is the parent, the key's input (nil when
// detached) and the key's outputs; the per-parent snapshot is the parent
// and Summarize's result, without children.
type KeyedPlan struct {
	// Inputs are the input resources, in spec order.
	Inputs []*apiresource.Resource
	// Rules are the kind's decisions about inputs and keys.
	Rules KeyedRules
}

// KeyedRules are a keyed kind's pure decisions. Objects passed in are
// informer cache objects: implementations never modify them.
type KeyedRules interface {
	// InputKey is the map key of an object of the input resource res
	// (false: it has none, e.g. no UID yet).
	InputKey(res *apiresource.Resource, input *unstructured.Unstructured) (string, bool)
	// InputSelector is what inputs parent selects. An error means its
	// selector cannot be used: the parent's syncs fail with it
	// (snapshot SelectorError) and it selects nothing meanwhile.
	InputSelector(parent *unstructured.Unstructured) (InputSelector, error)
	// OutputKey is the map key an owned object is tagged with (false: it
	// has none and belongs to no key; it is only counted).
	OutputKey(owned *unstructured.Unstructured) (string, bool)
	// Summarize computes the per-parent summary (snapshot.Response's
	// Summary) from the inputs parent selects, one group per Inputs entry
	// in order, and the outputs it controls, one group per WatchPlan.Owned
	// entry in order.
	Summarize(parent *unstructured.Unstructured, inputs, outputs []snapshot.Group) map[string]any
}

// InputSelector says which inputs one parent selects.
type InputSelector interface {
	// Namespace is the only namespace selected inputs can be in ("": any,
	// and cluster-scoped inputs too), so the watcher lists candidates
	// from its namespace index.
	Namespace() string
	// Selects reports whether input is selected.
	Selects(input *unstructured.Unstructured) bool
}

// SelectsInput reports whether sel selects obj (nil: no object). It holds
// the selector to its Namespace too, so that whoever lists inputs (the
// watcher's events and snapshots, `metabus render`) agrees whatever the
// kind's Selects checks.
func SelectsInput(sel InputSelector, obj *unstructured.Unstructured) bool {
	if obj == nil {
		return false
	}
	ns := sel.Namespace()
	return (ns == "" || ns == obj.GetNamespace()) && sel.Selects(obj)
}

// WatchParent is one parent resource.
type WatchParent struct {
	Res *apiresource.Resource
	// IgnoreStatusChanges: an update that changes nothing but the status
	// (and the resourceVersion) is not an event.
	IgnoreStatusChanges bool
}

// WatchRules are a kind's pure decisions about the objects of a plan's
// resources. Objects passed in are informer cache objects: implementations
// never modify them.
type WatchRules interface {
	// Selects reports whether a parent-source object is selected by the
	// controller's selectors (the finalizer rule is the watcher's, from
	// WatchPlan.Finalizer).
	Selects(parent *unstructured.Unstructured) bool
	// OwnerRef returns the controller reference of an owned-source object
	// when it may belong to one of the controller's parents (nil when the
	// object is nobody's business of this controller, e.g. a decorator's
	// unmarked object). The watcher still checks that the reference names
	// a parent resource's group and kind and a cached, selected parent.
	OwnerRef(obj *unstructured.Unstructured) *metav1.OwnerReference
	// WantsOrphan reports whether parent would adopt orphan, an owned-
	// source object with no controller (only asked when Adopts).
	WantsOrphan(parent, orphan *unstructured.Unstructured) bool
	// Observe returns the owned groups of parent's snapshot, one per
	// WatchPlan.Owned entry in that order, read from caches (same order),
	// and the reason the parent's selector cannot be used ("" if it can,
	// or the kind has none). parentRes is the parent's resource.
	Observe(parentRes *apiresource.Resource, parent *unstructured.Unstructured, caches []WatchCache) (groups []snapshot.Group, selectorError string)
	// ReleaseOnReplace says, per parent source of this plan, whether the
	// controller's finalizer must be released from its parents when next
	// (a plan of a new spec of the same controller) replaces this one:
	// nobody will finalize them any more. nil: release nothing.
	ReleaseOnReplace(next *WatchPlan) []bool
}

// WatchCache is an owned resource's informer cache as a kind reads it to
// assemble a snapshot (an *informers.Handle satisfies it).
type WatchCache interface {
	// OwnedBy lists the objects whose controller reference names uid.
	OwnedBy(uid string) []*unstructured.Unstructured
	// Orphans lists the objects of a namespace with no controller.
	Orphans(namespace string) []*unstructured.Unstructured
	// AllOrphans lists the objects with no controller in any namespace.
	AllOrphans() []*unstructured.Unstructured
	// ControlledByName lists the objects whose controller reference names
	// a group, kind and name in a namespace, whatever its UID.
	ControlledByName(group, kind, namespace, name string) []*unstructured.Unstructured
}
