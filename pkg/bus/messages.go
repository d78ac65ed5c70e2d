package bus

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/resourceversion"

	"github.com/metabus/metabus/pkg/hookapi"
	"github.com/metabus/metabus/pkg/hookwire"
)

// CloudEvent types. Every message on the bus is a CloudEvent
// in binary mode: ce-* NATS headers and a plain JSON body.
const (
	TypeSyncRequested   = "io.k8s.metacontroller.sync.requested.v1"
	TypeDesired         = "io.k8s.metacontroller.desired.v1"
	TypeApplied         = "io.k8s.metacontroller.applied.v1"
	TypeRevisionUpdated = "io.k8s.metacontroller.revision.updated.v1"
	// TypeHookPrefix + "<hook>.v1" is the type of hook requests (the hook
	// wire contract's, package hookwire).
	TypeHookPrefix = hookwire.EventTypePrefix
)

// CloudEvent extension names (lowercase alphanumeric, as the spec requires).
const (
	// The three a hook request carries too are the hook wire contract's.
	ExtPartitionKey = hookwire.ExtPartitionKey
	ExtWorkSeq      = hookwire.ExtWorkSeq
	ExtParentUID    = hookwire.ExtParentUID
	ExtParentRV     = "parentrv"
	ExtTraceParent  = "traceparent"
	ExtReason       = "reason"
	// ExtWeight carries the controller's share (WeightAnnotation) when it
	// is not 1, so consumers can schedule before decoding the body.
	ExtWeight = "weight"
)

// Reasons a work item was enqueued. Resyncs are distinguished from real
// changes so they can be measured and, later, prioritised below them.
const (
	ReasonEvent       = "event"
	ReasonResync      = "resync"
	ReasonRetry       = "retry"
	ReasonResyncAfter = "resyncAfter"
	ReasonConflict    = "conflict"
	// ReasonRelease asks for a controller's finalizer to be removed from a
	// parent because the controller was deleted or no longer has a
	// finalize hook: nobody would ever finalize it otherwise (upstream
	// leaves such finalizers behind, #1062).
	ReasonRelease = "release"
)

// Hook kinds: DesiredState.Hook names the hook whose answer it carries.
const (
	// HookSync is a sync hook's answer.
	HookSync = hookwire.HookSync
	// HookFinalize is a finalize hook's answer.
	HookFinalize = hookwire.HookFinalize
	// HookRelease is a finalizer release: no hook ran.
	HookRelease = "release"
	// HookCustomize names the customize hook's calls (CloudEvent type,
	// metrics); its answer is never a desired state.
	HookCustomize = hookwire.HookCustomize
	// HookMap is a MapController map hook's answer for one map key.
	HookMap = hookwire.HookMap
	// HookTombstone is the outcome for one detached map key: the
	// tombstone hook's answer, or, without one, metabus's own decision to
	// delete the key's outputs.
	HookTombstone = hookwire.HookTombstone
	// HookStatus is a state computed by metabus without a hook (a
	// MapController parent's aggregated status).
	HookStatus = "status"
)

// ParentKey identifies one parent of one controller across the stages
// ("<controller ID>/<parent UID>"): per-parent state (failure counts,
// pending items, echo notes, read-your-writes) is kept under it.
func ParentKey(ctrlID, parentUID string) string { return ctrlID + "/" + parentUID }

// ItemKey identifies the unit of work of an item across the stages: the
// parent's ParentKey for a per-parent item (mapKey ""), and
// "<controller ID>/<parentUID>~<mapKey>" (ParentToken) for one map key of
// a MapController parent. State kept per unit of work (failure counts,
// echo notes, read-your-writes, the outbox) must be keyed by it so that a
// parent's keys, and its per-parent item, never share an entry.
func ItemKey(ctrlID, parentUID, mapKey string) string {
	if mapKey == "" {
		return ctrlID + "/" + parentUID
	}
	return ctrlID + "/" + parentUID + MapKeySep + mapKey
}

// refItemKey is ItemKey(c.ID(), parentUID, mapKey) in one allocation.
func refItemKey(c ControllerRef, parentUID, mapKey string) string {
	var b strings.Builder
	b.Grow(len(c.Kind) + len(c.Name) + len(parentUID) + len(MapKeySep) + len(mapKey) + 2)
	writeControllerID(&b, c.Kind, c.Name)
	b.WriteByte('/')
	b.WriteString(parentUID)
	if mapKey != "" {
		b.WriteString(MapKeySep)
		b.WriteString(mapKey)
	}
	return b.String()
}

// Key is the item's ItemKey: its parent's ParentKey unless it has a
// MapKey.
func (w WorkItem) Key() string { return refItemKey(w.Controller, w.Parent.UID, w.MapKey) }

// Key is the desired state's ItemKey: its parent's ParentKey unless it has
// a MapKey.
func (d DesiredState) Key() string { return refItemKey(d.Controller, d.Parent.UID, d.MapKey) }

// Key is the note's ItemKey.
func (a Applied) Key() string { return refItemKey(a.Controller, a.ParentUID, a.MapKey) }

// RaiseResourceVersion sets m[key] to rv unless m already holds a higher
// resourceVersion for it (when either does not parse, m is left as is).
func RaiseResourceVersion(m map[string]string, key, rv string) {
	cur, ok := m[key]
	if !ok {
		m[key] = rv
		return
	}
	if c, err := resourceversion.CompareResourceVersion(rv, cur); err == nil && c > 0 {
		m[key] = rv
	}
}

// RaisedFloor returns floor (a MinResourceVersions map) with every
// resourceVersion of written that is higher than floor's for its resource;
// floor itself is not changed (it is returned as it is when nothing is
// written).
func RaisedFloor(floor, written map[string]string) map[string]string {
	if len(written) == 0 {
		return floor
	}
	out := make(map[string]string, len(floor)+len(written))
	for k, v := range floor {
		out[k] = v
	}
	for k, v := range written {
		RaiseResourceVersion(out, k, v)
	}
	return out
}

// FreshnessKey is the key of a resource in MinResourceVersions:
// "<group>/<resource>" (resourceVersions are comparable within a resource
// whatever its version).
func FreshnessKey(group, resource string) string { return group + "/" + resource }

// ControllerRef identifies the controller object a message belongs to.
type ControllerRef struct {
	Kind string `json:"kind"`
	Name string `json:"name"`
	UID  string `json:"uid,omitempty"`
	// Weight is the controller's share of a saturated replica
	// (WeightAnnotation); 0 means 1.
	Weight int `json:"weight,omitempty"`
}

// WeightAnnotation on a CompositeController or DecoratorController sets
// its weight: when a dispatcher or applier replica runs --max-in-flight
// messages, controllers get turns in proportion to their weights (default
// 1, at most MaxWeight). It never lifts the per-controller --workers bound.
const WeightAnnotation = "metabus.dev/weight"

// SuppressEchoesAnnotation on a controller of any kind, set to "true",
// opts it into echo suppression (a metabus extension; the default is
// upstream Metacontroller's contract, under which every change of the
// parent, a child or a related object reaches the hook, metabus's own
// writes included).
//
// With it, a change that is nothing but metabus's own write from the
// hook's previous answer (a child updated to what the hook returned, the
// status it returned) does not call the hook again, and the status of an
// answer that creates children is left to the sync those creations bring.
// That is only right for a hook whose answer is a fixpoint of its own
// writes: shown the cluster after its answer was applied, it would answer
// the same. A hook that reads back what it recorded in status, or moves a
// state machine on by observing the children it changed, must not set it:
// its next step would never come (until a resync).
const SuppressEchoesAnnotation = "metabus.dev/suppress-echoes"

// ParseSuppressEchoes reads SuppressEchoesAnnotation's value: false when
// absent, an error (and false, the contract's default) when it is not a
// boolean.
func ParseSuppressEchoes(v string) (bool, error) {
	if v == "" {
		return false, nil
	}
	on, err := strconv.ParseBool(strings.TrimSpace(v))
	if err != nil {
		return false, fmt.Errorf("annotation %s=%q: want true or false", SuppressEchoesAnnotation, v)
	}
	return on, nil
}

// SuppressesEchoes reports whether a controller object opted into echo
// suppression (an invalid value does not: see ParseSuppressEchoes).
func SuppressesEchoes(annotations map[string]string) bool {
	on, _ := ParseSuppressEchoes(annotations[SuppressEchoesAnnotation])
	return on
}

// MaxWeight bounds WeightAnnotation.
const MaxWeight = 100

// ParseWeight reads WeightAnnotation's value: 1 when absent, an error
// (and 1) when it is not an integer in [1, MaxWeight].
func ParseWeight(v string) (int, error) {
	if v == "" {
		return 1, nil
	}
	w, err := strconv.Atoi(strings.TrimSpace(v))
	if err != nil || w < 1 || w > MaxWeight {
		return 1, fmt.Errorf("annotation %s=%q: want an integer from 1 to %d", WeightAnnotation, v, MaxWeight)
	}
	return w, nil
}

// WeightHeader is the header that carries the weight a consumer schedules
// a message with.
const WeightHeader = "ce-" + ExtWeight

// HeaderWeight is the weight WeightHeader's value v gives: 1 if v is not a
// positive integer, at most MaxWeight.
func HeaderWeight(v string) int {
	w, err := strconv.Atoi(v)
	if err != nil || w < 1 {
		return 1
	}
	return min(w, MaxWeight)
}

// ID returns the controller's subject token.
func (c ControllerRef) ID() string { return ControllerID(c.Kind, c.Name) }

// ObjectRef identifies one Kubernetes object precisely enough to find it in
// a cache and to write it with a precondition.
type ObjectRef struct {
	APIVersion      string `json:"apiVersion"`
	Kind            string `json:"kind,omitempty"`
	Resource        string `json:"resource,omitempty"`
	Namespace       string `json:"namespace,omitempty"`
	Name            string `json:"name"`
	UID             string `json:"uid"`
	ResourceVersion string `json:"resourceVersion,omitempty"`
	Generation      int64  `json:"generation,omitempty"`
}

// WorkItem (type TypeSyncRequested, stream MC_WORK) says that a parent needs
// a sync. It is only a trigger: the dispatcher reads fresh observed state.
type WorkItem struct {
	Controller ControllerRef `json:"controller"`
	Parent     ObjectRef     `json:"parent"`
	Reason     string        `json:"reason"`
	// MapKey names one input of a MapController parent (package mapctl's
	// Key); "" is the per-parent item, the only kind other controllers
	// have. A keyed item is its own unit of work: its own subjects
	// (ParentToken), deduplication, slot and ItemKey.
	MapKey string `json:"mapKey,omitempty"`
	// Attempt counts consecutive failed syncs (retry backoff).
	Attempt int `json:"attempt,omitempty"`
	// Finalizer names the finalizer to remove (ReasonRelease only).
	Finalizer string `json:"finalizer,omitempty"`
	// AfterSeq, on a conflict requeue (ReasonConflict), is the work
	// sequence of the sync whose apply conflicted. A dispatcher that has
	// since called the hook for a later item of the parent may settle this
	// one as an echo: that later answer is applied in order (or requeues
	// itself), so calling the hook again would only repeat it.
	AfterSeq uint64 `json:"afterSeq,omitempty"`
	// MinResourceVersions maps "<group>/<resource>" to the lowest
	// resourceVersion the snapshot must reflect: the watcher saw that
	// version when it enqueued the item.
	MinResourceVersions map[string]string `json:"minResourceVersions,omitempty"`
	EnqueuedAt          time.Time         `json:"enqueuedAt"`
}

// DesiredState (type TypeDesired, stream MC_DESIRED) is what a hook asked
// for, plus the identities of what it observed, so that the applier can
// converge the cluster without calling the hook again.
type DesiredState struct {
	Controller ControllerRef `json:"controller"`
	Parent     ObjectRef     `json:"parent"`
	// MapKey is the map key of the work item that produced this state; ""
	// is the per-parent item. Desired states are ordered per (parent, key):
	// a keyed one and the per-parent one of the same parent, or two keys,
	// are independent.
	MapKey string `json:"mapKey,omitempty"`
	// MapInput names the input object of MapKey (package mapctl's
	// InputAnnotation value: group/kind/namespace/name/uid), which the
	// applier writes on every output of the key. "" when MapKey is.
	MapInput string `json:"mapInput,omitempty"`
	// WorkSeq is the MC_WORK stream sequence of the work item that produced
	// this state; together with the parent UID it is the message id.
	WorkSeq uint64 `json:"workSeq"`
	// Hook is the hook that produced the state: "sync", "finalize",
	// "map", "tombstone" or "status" (the Hook* constants).
	Hook string `json:"hook"`
	// Children are the desired children as the hook returned them (apply
	// semantics: only the fields the hook cares about).
	Children []*unstructured.Unstructured `json:"children"`
	// Status replaces the parent's status (with observedGeneration added);
	// nil means the hook returned none.
	Status map[string]any `json:"status,omitempty"`
	// ResyncAfterSeconds is the hook's one-time resync request (0: none).
	ResyncAfterSeconds float64 `json:"resyncAfterSeconds,omitempty"`
	// Finalized is the finalize hook's "done" answer.
	Finalized bool `json:"finalized,omitempty"`
	// Observed lists the children the hook was shown.
	Observed []ObjectRef `json:"observed,omitempty"`
	// Inputs maps the UID of every object the hook was shown (controller,
	// parent, children, related) to its resourceVersion. The applier passes
	// it on in its Applied note, which is how a later sync recognises that
	// nothing but metabus's own writes changed since (see package echo).
	// Empty unless the controller opted into echo suppression
	// (SuppressEchoesAnnotation), and when the sync's inputs are not just
	// objects (rolling updates also depend on ControllerRevisions): such
	// syncs are never skipped, and their answers' statuses are always
	// written.
	Inputs map[string]string `json:"inputs,omitempty"`
	// MinResourceVersions carries the freshness floor of the snapshot the
	// hook saw, so the applier never acts on older observed state.
	MinResourceVersions map[string]string `json:"minResourceVersions,omitempty"`
	// Attempt carries the retry count of the work item forward, so apply
	// failures back off too.
	Attempt int `json:"attempt,omitempty"`
	// Finalizer names the finalizer to remove (Hook == HookRelease).
	Finalizer string `json:"finalizer,omitempty"`
	// Labels and Annotations (DecoratorController only; its attachments
	// travel in Children) are set on the target: a value sets the key, a
	// null (nil) deletes it, keys not listed are left alone.
	Labels      map[string]*string `json:"labels,omitempty"`
	Annotations map[string]*string `json:"annotations,omitempty"`
	// StatusSet (DecoratorController only) says that Status replaces the
	// target's status, even when it is empty. False leaves the status
	// unchanged: the hook answered null or nothing, as decorated objects
	// usually have a status owned by their own controller.
	StatusSet bool `json:"statusSet,omitempty"`
	// ProducedAt is when the hook answered.
	ProducedAt time.Time `json:"producedAt"`
	// LatestRevision (rolling updates only) names the ControllerRevision
	// that Children render: the parent's current rolling fields. The
	// applier drops a desired state whose latest revision is no longer the
	// parent's, since its children would be recorded on the wrong revision.
	LatestRevision string `json:"latestRevision,omitempty"`
	// Revisions (rolling updates only) are the hook's children for every
	// older revision that still holds children, each rendered from the
	// parent as of that revision. Status, ResyncAfterSeconds and Finalized
	// are already aggregated over all revisions.
	Revisions []RevisionChildren `json:"revisions,omitempty"`
}

// RevisionChildren are the desired children of one older revision.
type RevisionChildren struct {
	Name     string                       `json:"name"`
	Children []*unstructured.Unstructured `json:"children"`
}

// RelatedRules are a parent's related-resource rules, as its customize hook
// returned them. Dispatchers send them with snapshot requests and broadcast
// them on RelatedSubject, so that every watcher replica can map a change of
// a related object to the parents that depend on it. They are derived state:
// a watcher that restarts learns them again at the next sync.
type RelatedRules struct {
	Controller ControllerRef `json:"controller"`
	ParentUID  string        `json:"parentUID"`
	// ParentNamespace scopes v1 rules ("" for a cluster-scoped parent).
	ParentNamespace string                        `json:"parentNamespace,omitempty"`
	HookVersion     string                        `json:"hookVersion,omitempty"`
	Rules           []hookapi.RelatedResourceRule `json:"rules"`
}

// RelatedSubject is the core NATS subject (no stream: it is a cache hint)
// of RelatedRules broadcasts to every watcher replica.
const RelatedSubject = "mc.related.rules"

// Applied (core NATS, AppliedSubject, plain JSON) is an applier's note
// about one desired state. It has two uses:
//
//   - Done: every desired state the applier settles (applied, nothing to
//     do, or failed and rescheduled) ends with a note that says so, with
//     Fresh, the highest resourceVersion its writes produced per resource.
//     A dispatcher that published the desired state waits for it before
//     it syncs the same item again, so that the hook sees all of one
//     answer's writes in one call (see package echo, Book.Expect).
//   - Echoes, for controllers that opted into echo suppression (their
//     desired states carry Inputs): every update made, as the
//     resourceVersion written against (the write's precondition) and the
//     one it produced, sent as each write happens (Writes only), and on
//     the Done note also what the hook was shown (Inputs). Creates of a
//     keyed item's outputs are listed as writes from "". Watchers and
//     dispatchers use them to drop echoes. Writes are never listed for a
//     controller that did not opt in: a watcher would drop their events.
//
// It is a hint: a lost note costs a needless hook call or a wait of the
// dispatcher's --merge-wait, never a missed change.
type Applied struct {
	Controller ControllerRef `json:"controller"`
	ParentUID  string        `json:"parentUID"`
	// MapKey is the desired state's MapKey ("" for a per-parent one), so
	// that echo notes of a parent's keys stay apart (Key).
	MapKey  string            `json:"mapKey,omitempty"`
	WorkSeq uint64            `json:"workSeq"`
	Inputs  map[string]string `json:"inputs,omitempty"`
	Writes  []Write           `json:"writes,omitempty"`
	// Done marks the note that ends the desired state of WorkSeq: it was
	// settled (whatever the outcome) and no more writes of it follow.
	Done bool `json:"done,omitempty"`
	// Fresh (Done notes only) maps "<group>/<resource>" (FreshnessKey) to
	// the highest resourceVersion the desired state's writes produced: a
	// snapshot that reflects them shows the hook every write of the answer.
	Fresh map[string]string `json:"fresh,omitempty"`
	// Strategy (Done notes only) is the settling applier's
	// --apply-strategy. A dispatcher in a process of its own learns from
	// it whether an answer that would write nothing under that strategy
	// may be settled without a desired state (package echo, Strategies).
	Strategy string `json:"strategy,omitempty"`
}

// Write is one update an applier made: object UID, from resourceVersion
// From (its precondition) to To.
type Write struct {
	UID  string `json:"uid"`
	From string `json:"from"`
	To   string `json:"to"`
}

// AppliedSubject is the core NATS subject (no stream: a lost note only
// costs a hook call) of Applied notes, broadcast to every watcher and
// dispatcher replica.
const AppliedSubject = "mc.applied"

// AppliedOriginHeader, on an Applied note, names the echo book of the
// process whose applier made it (package echo): that book recorded the
// note directly and skips it when it comes back. Notes from other
// processes, or without the header, are decoded and recorded.
const AppliedOriginHeader = "Metabus-Origin"

// DueMessage is the body of a schedule in MC_SCHED: the work item to
// publish when it fires.
type DueMessage = WorkItem

// MarshalJSON helpers keep one encoding for every message.
func encode(v any) ([]byte, error) { return json.Marshal(v) }

// Stub returns enough of the object to reference it (e.g. to hang a
// Kubernetes Event on it) without reading it.
func (o ObjectRef) Stub() *unstructured.Unstructured {
	u := &unstructured.Unstructured{}
	u.SetAPIVersion(o.APIVersion)
	u.SetKind(o.Kind)
	u.SetNamespace(o.Namespace)
	u.SetName(o.Name)
	u.SetUID(types.UID(o.UID))
	u.SetResourceVersion(o.ResourceVersion)
	return u
}
