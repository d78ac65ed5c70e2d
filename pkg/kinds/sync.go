package kinds

import (
	"fmt"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/metabus/metabus/pkg/api/v1alpha1"
	"github.com/metabus/metabus/pkg/bus"
	"github.com/metabus/metabus/pkg/hookapi"
	"github.com/metabus/metabus/pkg/snapshot"
)

// Syncing is what the dispatcher needs from a kind: which hook a parent
// gets, the hook request(s) built from a snapshot, and how the answers
// become one desired state. Every method is pure; the dispatcher does the
// I/O (snapshots, hook calls, revisions, publishing) in the order below,
// the same for every kind:
//
//  1. SyncGate on the parent as first observed (before any hook call);
//  2. the customize hook (SyncCustomizeHook) and its related objects;
//  3. the echo check, when SyncEchoable, and the merge of a repeated
//     call, when SyncInputsComplete;
//  4. SyncHook picks the hook for the parent as finally observed;
//  5. SyncCalls builds the request(s); SyncRevisions says whether the
//     parent keeps revisions, and then SyncAsOf re-targets the request at
//     each older live revision;
//  6. the calls are made (at once when there are several) and
//     SyncDesired turns the answers into one bus.DesiredState.
//
// A kind that calls its hook once per input object (MapController) returns
// one call per object from SyncCalls and combines them in SyncDesired.
type Syncing interface {
	// SyncEndpoints are the controller's endpoint configs (TLS and auth
	// per URL), for all its hooks.
	SyncEndpoints() []v1alpha1.EndpointConfig
	// SyncCustomizeHook is the controller's customize hook, nil when it
	// has none (then nothing related is observed).
	SyncCustomizeHook() *v1alpha1.Hook
	// SyncGate judges the parent as first observed: release a finalizer
	// the controller no longer needs, skip it for now, fail (the error is
	// reported on the parent and retried with backoff), or go on.
	SyncGate(snap *snapshot.Response) (Gate, error)
	// SyncEchoable reports whether a sync whose inputs changed only by
	// metabus's own writes may be skipped. That is upstream's contract
	// broken on purpose, so it is never the default: only a controller
	// that opted in (bus.SuppressEchoesAnnotation) says true, and a kind
	// whose answer depends on more than the snapshot's objects (rolling
	// updates also depend on ControllerRevisions) says false even then.
	SyncEchoable() bool
	// SyncInputsComplete reports whether a hook request is made of the
	// snapshot's objects alone (echo.Inputs covers all it depends on). Then
	// an event item whose snapshot is exactly what the item's latest hook
	// call was shown is merged into that call instead of repeating it
	// (upstream's contract holds: every change was shown). A kind whose
	// requests also depend on something else (rolling updates: on
	// ControllerRevisions) says false.
	SyncInputsComplete() bool
	// SyncHook chooses the hook for the parent of snap (as finally
	// observed), an object of the given plural resource. A zero choice (no
	// hook, not Local, no error) means there is nothing to do; an error
	// fails the sync (reported on the parent, retried).
	SyncHook(snap *snapshot.Response, resource string) (HookChoice, error)
	// SyncCalls builds the hook calls for a parent from its final
	// snapshot: one request each, with a fresh answer to decode into.
	SyncCalls(in SyncInput) ([]HookCall, error)
	// SyncRevisions says whether the parent keeps revisions (rolling
	// updates): nil means the calls of SyncCalls are all. Otherwise the
	// dispatcher loads its revisions and makes, besides the call for the
	// parent as it is (the latest revision), one call per older live
	// revision that still holds children, built by SyncAsOf.
	SyncRevisions(parent *unstructured.Unstructured) (*Revisions, error)
	// SyncAsOf is call re-targeted at the parent as of an older revision,
	// with a fresh answer (only asked of kinds whose SyncRevisions is not
	// nil). An error means call was not built by this kind.
	SyncAsOf(call HookCall, parent *unstructured.Unstructured) (HookCall, error)
	// SyncDesired turns the answers of the calls of one SyncCalls into one
	// desired state: children, parent status, labels, annotations, resync
	// request and finalize verdict. The dispatcher fills in the routing
	// fields (controller, parent, work sequence, hook, inputs...). For a
	// parent with revisions it is asked once per revision's call, and the
	// answers are combined as upstream does (rollout.Aggregate).
	SyncDesired(calls []HookCall) (bus.DesiredState, error)
}

// Gate is a kind's verdict on a parent before any hook is called. The zero
// Gate goes on with the sync.
type Gate struct {
	// Release names a finalizer to remove from the parent instead of
	// syncing it: the controller put it there for a finalize hook it no
	// longer has, and nobody would ever finalize the parent otherwise.
	Release string
	// Skip settles the sync with nothing to do now (the garbage collector
	// is still deleting the parent's dependents; its finalizer removal
	// brings the parent back).
	Skip bool
}

// HookChoice is the hook a parent gets. Hook nil means nothing to call.
type HookChoice struct {
	Hook *v1alpha1.Hook
	// Local means the kind answers by itself, without a hook (Hook is
	// nil): the calls SyncCalls returns carry no Request and their
	// Response is already filled in, and SyncDesired turns them into the
	// desired state as usual. Nothing is sent; the desired state is not a
	// hook's answer (a MapController parent's aggregated status, or the
	// deletion of a detached key's outputs without a tombstone hook).
	Local bool
	// Kind is the hook kind: the CloudEvent type's <hook> part, the hook
	// metrics label and the desired state's Hook (bus.HookSync,
	// HookFinalize, HookMap, HookTombstone, HookStatus).
	Kind string
	// Finalizing is sent in the request: the parent is being finalized.
	Finalizing bool
}

// SyncInput is what a kind builds its hook requests from.
type SyncInput struct {
	// Snapshot is the parent's final observed state (with its related
	// objects); its Controller is sent to the hook as is.
	Snapshot *snapshot.Response
	// Hook is the chosen hook (never nil here).
	Hook HookChoice
}

// HookCall is one hook request of a sync and the answer it decodes into.
type HookCall struct {
	// Request is the JSON body.
	Request any
	// Response is a pointer the kind allocated for the answer; the
	// dispatcher decodes into it, and SyncDesired reads it.
	Response any
}

// Revisions says that a parent keeps revisions: which of its fields a
// revision records, and their current values.
type Revisions struct {
	// FieldPaths are the parent fields that roll out gradually (package
	// revision's parent patch paths).
	FieldPaths []string
	// Patch is the parent's current patch (revision.ParentPatch).
	Patch map[string]any
}

// HookVersion is the request encoding of a hook (v1 unless it says v2).
func HookVersion(h *v1alpha1.Hook) v1alpha1.HookVersion {
	if h != nil && h.Version != nil && *h.Version != "" {
		return *h.Version
	}
	return v1alpha1.HookVersionV1
}

// ObjectMaps encodes a snapshot's owned objects (children, attachments)
// and related objects for a request to hook, whose parent is namespaced or
// not.
func ObjectMaps(hook *v1alpha1.Hook, parentNamespaced bool, snap *snapshot.Response) (owned, related hookapi.ObjectMap, err error) {
	version := HookVersion(hook)
	if owned, err = objectMap(version, parentNamespaced, snap.Children); err != nil {
		return nil, nil, err
	}
	if related, err = objectMap(version, parentNamespaced, snap.Related); err != nil {
		return nil, nil, err
	}
	return owned, related, nil
}

// objectMap encodes snapshot groups the way the hook version keys them;
// every group appears, even when empty.
func objectMap(version v1alpha1.HookVersion, parentNamespaced bool, groups []snapshot.Group) (hookapi.ObjectMap, error) {
	b := hookapi.NewObjectMap(version, parentNamespaced)
	for _, g := range groups {
		b.Ensure(g.APIVersion, g.Kind)
		for _, o := range g.Objects {
			if err := b.Add(o, g.Namespaced); err != nil {
				return nil, fmt.Errorf("build hook request: %w", err)
			}
		}
	}
	return b.Map(), nil
}

// OneCall checks that calls is exactly one call, for kinds that call their
// hook once per parent.
func OneCall(calls []HookCall) (HookCall, error) {
	if len(calls) != 1 {
		return HookCall{}, fmt.Errorf("%d hook answers for a parent, want 1", len(calls))
	}
	return calls[0], nil
}

// SuppressesEchoes reports whether a controller object opted into echo
// suppression (bus.SuppressEchoesAnnotation); a nil object has not. Every
// kind's SyncEchoable starts from it.
func SuppressesEchoes(obj *unstructured.Unstructured) bool {
	return obj != nil && bus.SuppressesEchoes(obj.GetAnnotations())
}
