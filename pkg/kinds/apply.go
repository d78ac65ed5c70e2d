package kinds

import (
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/metabus/metabus/pkg/api/v1alpha1"
	"github.com/metabus/metabus/pkg/bus"
	"github.com/metabus/metabus/pkg/children"
	"github.com/metabus/metabus/pkg/revision"
)

// Applying is what the applier needs from a kind: the rules and owner of
// its children, adoption, the writes on the parent itself (status, labels,
// annotations, finalizer), and whether it rolls out. Every method is pure:
// the applier does the I/O (discovery, snapshot, writes) around them, in
// one generic path for all kinds.
type Applying interface {
	// ApplyChildRules are the child resources the controller declares, as
	// declared (the applier resolves them through discovery).
	ApplyChildRules() ApplyChildRules
	// ApplyOwner is the owner of the children parent gets from ds: its
	// controller reference, the labels and annotations added to every
	// child and the selector each must match. An error means the parent
	// cannot own children as it is (a bad spec.selector): the applier
	// reports it with a SyncError Event and retries.
	ApplyOwner(parent *unstructured.Unstructured, ds *bus.DesiredState) (children.Owner, error)
	// ApplyClaims reports whether the parent claims its children: adopts
	// the orphans and releases the owned objects that the snapshot lists
	// (snapshot.Group's Adopt and Release). A kind that does not claim
	// acts on the snapshot's objects as they are.
	ApplyClaims() bool
	// ApplyRollout reports whether the children of parent (an object of
	// the plural resource) roll out gradually through ControllerRevisions,
	// and how.
	ApplyRollout(parent *unstructured.Unstructured, resource string) (ApplyRolloutSpec, bool)
	// ApplyParent plans the writes on the parent itself for one desired
	// state: whether to apply it at all, the patch written before the
	// first child, the status written after the children, and the
	// finalizer removed once everything else is done.
	ApplyParent(in ApplyInput) (ApplyParentPlan, error)
}

// ApplyChildRules are a controller's declared child resources.
type ApplyChildRules struct {
	// Field is where the controller spec declares them, for errors
	// ("spec.childResources").
	Field string
	// Noun names them in messages ("children", "attachments").
	Noun string
	// Rules are the declared resources, in spec order (the order of the
	// snapshot's groups).
	Rules []ApplyChildRule
	// RejectReason is the Event reason of an answer rejected as a whole
	// before any write (a child of an undeclared kind, in another
	// namespace...): "" is metabus's InvalidDesiredState. MapController
	// reports it as a SyncError, as its design asks of bad map answers.
	RejectReason string
	// OwnerUIDLabels are labels whose value is the UID of the child's
	// controlling parent (composite's generateSelector label). Adopting a
	// child left by an earlier parent of the same name rewrites them to
	// the new parent's UID, or its selector would release the child again.
	OwnerUIDLabels []string
	// DynamicApplyOnly keeps the kind's children on dynamic apply whatever
	// --apply-strategy says: its desired states are built from the
	// last-applied annotation that only dynamic apply keeps (MapController
	// keeps a detached key's outputs by re-applying them as last applied;
	// under server-side apply that would give up every field they have).
	// Server-side apply is upstream's option for upstream's kinds.
	DynamicApplyOnly bool
}

// ApplyChildRule is one declared child resource.
type ApplyChildRule struct {
	v1alpha1.ResourceRule
	// Method is the update strategy ("" means OnDelete).
	Method v1alpha1.ChildUpdateMethod
	// Checks are the status conditions a rolling update waits for on a
	// child before it moves on to the next one.
	Checks []v1alpha1.StatusConditionCheck
}

// ApplyRolloutSpec is how a parent's children roll out.
type ApplyRolloutSpec struct {
	// FieldPaths are the parent fields that roll out gradually (empty:
	// package revision's default, spec).
	FieldPaths []string
	// History describes the parent to package revision: the labels and
	// owner of its ControllerRevisions.
	History revision.Parent
}

// ApplyInput is one desired state to apply with the fresh observed parent.
type ApplyInput struct {
	Desired *bus.DesiredState
	// Parent is the parent as observed (never modified).
	Parent *unstructured.Unstructured
	// ParentResource is the parent's plural resource name.
	ParentResource string
	// ParentHasStatus says whether the parent's resource serves /status.
	ParentHasStatus bool
}

// ApplyGate says whether a desired state is applied at all.
type ApplyGate int

const (
	// ApplyProceed applies the desired state.
	ApplyProceed ApplyGate = iota
	// ApplyParentDeleting skips it: the parent is being deleted and holds
	// none of the controller's finalizers, so the garbage collector owns
	// its children now.
	ApplyParentDeleting
	// ApplyStale syncs the parent again instead: the desired state no
	// longer fits it (a decorator target that opted out after its sync
	// hook answered would be decorated again).
	ApplyStale
)

// ApplyParentPlan is what applying one desired state writes on the parent
// itself. The zero value writes nothing. Patches carry the observed
// resourceVersion, so a parent changed since yields a conflict rather
// than a lost update.
type ApplyParentPlan struct {
	Gate ApplyGate
	// Patch is a JSON merge patch of the parent written before the first
	// child write (nil: none): changed labels and annotations, the
	// finalizer to add (in place before any child exists, so deletion
	// waits for the finalize hook), and the status of a resource without
	// a status subresource.
	Patch map[string]any
	// AddsFinalizer names the finalizer Patch adds ("" none).
	AddsFinalizer string
	// Status is the new .status written through the status subresource
	// after the children (nil: unchanged).
	Status map[string]any
	// RemoveFinalizer is the finalizer removed once every other write of
	// a finalize hook's final answer is done ("" none).
	RemoveFinalizer string
}
