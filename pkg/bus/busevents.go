package bus

import (
	"encoding/json"
	"fmt"
	"strings"
	"time"
)

// The bus's events for consumers (docs/events.md): what metabus decided
// and did, as CloudEvents other systems may subscribe to through the
// CloudEvents NATS binding. They are a wire contract of their own, apart
// from the internal subjects (mc.>): those carry Secret children in clear
// and their streams are work queues a reader would drain. The applier
// publishes them when it runs with --bus-events, on EventsSubject, and the
// stream EventsStream keeps them for a bounded time and size. Every body
// goes through the dead-letter redaction first: a Secret's data and
// stringData values are emptied, its name and keys kept.
//
// Delivery is at most once: an applier publishes each event once, without
// waiting for the stream's acknowledgement (what it costs is a core
// publish per desired state). The cluster, not this stream, is the record:
// an event lost to a server restart is not published again.

// Event types of the consumer-facing events (beside the bus's internal
// ones in messages.go): TypeDesired (a DesiredStateEvent) and TypeApplied
// (an AppliedEvent).
const (
	// EventKindDesired is the <kind> token of desired-state events.
	EventKindDesired = "desired"
	// EventKindApplied is the <kind> token of applied events.
	EventKindApplied = "applied"
)

// EventsStream (MC_EVENTS) keeps the consumer-facing events: limits
// retention, so reading them consumes nothing, and any number of
// consumers each read all of them.
const EventsStream = "MC_EVENTS"

// EventsRoot starts every consumer-facing subject:
// metabus.events.<kind>.<controller>.<namespace>.<name>.
const EventsRoot = "metabus.events"

// EventsClusterScoped is the <namespace> token of a cluster-scoped parent
// ("_" is never a namespace name).
const EventsClusterScoped = "_"

// Defaults of the events stream's limits (the applier's --bus-events-max-age
// and --bus-events-max-bytes).
const (
	DefaultEventsMaxAge   = time.Hour
	DefaultEventsMaxBytes = 256 << 20
)

// EventSubject is where an event of kind about parent of ctrl is
// published: metabus.events.<kind>.<ControllerID>.<namespace>.<name>, the
// namespace EventsClusterScoped for a cluster-scoped parent and the name's
// "." mapped to "_" (reversibly: Kubernetes names never contain "_"), so a
// consumer filters with wildcards, e.g. metabus.events.applied.cc-web.prod.>.
func EventSubject(kind string, ctrl ControllerRef, parent ObjectRef) (string, error) {
	ns := parent.Namespace
	if ns == "" {
		ns = EventsClusterScoped
	}
	name := strings.ReplaceAll(parent.Name, ".", "_")
	ctrlID := ctrl.ID()
	for _, tok := range []string{kind, ctrlID, ns, name} {
		if !validToken(tok) {
			return "", fmt.Errorf("invalid events subject token %q (parent %s/%s of %s)", tok, parent.Namespace, parent.Name, ctrlID)
		}
	}
	return EventsRoot + "." + kind + "." + ctrlID + "." + ns + "." + name, nil
}

// EventsStreamConfig is MC_EVENTS: limits retention (reads consume
// nothing), the oldest events dropped past maxAge or maxBytes (0: the
// defaults), file storage, direct gets for readers.
func EventsStreamConfig(o Options, maxAge time.Duration, maxBytes int64) StreamConfig {
	if maxAge <= 0 {
		maxAge = DefaultEventsMaxAge
	}
	if maxBytes <= 0 {
		maxBytes = DefaultEventsMaxBytes
	}
	return StreamConfig{
		Name:        EventsStream,
		Description: "metabus events for consumers (CloudEvents; Secret data removed)",
		Subjects:    []string{EventsRoot + ".>"},
		Replicas:    o.replicas(),
		MaxAge:      maxAge,
		MaxBytes:    maxBytes,
		AllowDirect: true,
	}
}

// Outcomes of an AppliedEvent.
const (
	// OutcomeApplied: the desired state was applied; Created, Updated and
	// Deleted say what changed.
	OutcomeApplied = "applied"
	// OutcomeUnchanged: the cluster already matched it; nothing was written.
	OutcomeUnchanged = "unchanged"
	// OutcomeConflict: a write met a newer version of an object; the
	// parent is synced again at once (its hook sees the newer version).
	OutcomeConflict = "conflict-requeued"
	// OutcomeFailed: the apply failed (Reason and Message say why); the
	// parent is synced again with backoff. What was written before the
	// failure is listed.
	OutcomeFailed = "failed"
	// OutcomeSkipped: the desired state was not applied, for the Reason
	// given: superseded (a newer one of the same item was waiting),
	// notfound (the parent is gone), parent_deleting, invalid (the answer
	// was refused; the Event on the parent says why) or unsupported.
	OutcomeSkipped = "skipped"
	// OutcomeFinalized: a finalize answer said done and the finalizer was
	// removed. OutcomeReleased: a finalizer of a controller that no longer
	// finalizes was removed.
	OutcomeFinalized = "finalized"
	OutcomeReleased  = "released"
)

// ChildChange is one write an apply made to a child (or a decorator's
// attachment).
type ChildChange struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Namespace  string `json:"namespace,omitempty"`
	Name       string `json:"name"`
	// UID is the object's UID ("" when the write's answer did not say).
	UID string `json:"uid,omitempty"`
	// ResourceVersion is the version the write produced (creates and
	// updates).
	ResourceVersion string `json:"resourceVersion,omitempty"`
}

// AppliedEvent (type TypeApplied, subject EventSubject(EventKindApplied,
// ...)) is what an applier did with one desired state of a parent: its
// outcome and the children it created, updated and deleted. One is
// published per desired state settled (a desired state redelivered after a
// crash may have two).
type AppliedEvent struct {
	Controller ControllerRef `json:"controller"`
	Parent     ObjectRef     `json:"parent"`
	// MapKey is the MapController map key of the item ("" for the
	// per-parent item, the only one other controllers have).
	MapKey string `json:"mapKey,omitempty"`
	// WorkSeq is the work item's stream sequence: a parent's events are
	// ordered by it (also the workseq extension).
	WorkSeq uint64 `json:"workSeq"`
	// Hook is the hook whose answer was applied (DesiredState.Hook).
	Hook string `json:"hook"`
	// Outcome is one of the Outcome* constants.
	Outcome string `json:"outcome"`
	// Reason is a short machine-readable cause (OutcomeFailed: the Event
	// reason, or "error"; OutcomeSkipped: why).
	Reason string `json:"reason,omitempty"`
	// Message is the error (OutcomeFailed and OutcomeConflict).
	Message string        `json:"message,omitempty"`
	Created []ChildChange `json:"created,omitempty"`
	Updated []ChildChange `json:"updated,omitempty"`
	Deleted []ChildChange `json:"deleted,omitempty"`
	// StatusWritten says the parent's status (or a decorator's labels,
	// annotations and status) was written.
	StatusWritten bool `json:"statusWritten,omitempty"`
	// ProducedAt is when the hook answered, AppliedAt when the apply was
	// settled.
	ProducedAt time.Time `json:"producedAt"`
	AppliedAt  time.Time `json:"appliedAt"`
}

// ExtRedacted, on a consumer-facing event, says what the redaction
// removed from its body ("data and stringData values of N Secrets");
// absent when nothing was.
const ExtRedacted = "redacted"

// NewDesiredEvent is ds as a consumer-facing event (TypeDesired): the
// desired state's JSON with every Secret's data and stringData values
// emptied.
func NewDesiredEvent(ds *DesiredState) (*Event, error) {
	return newConsumerEvent(EventKindDesired, TypeDesired, ds.Controller, ds.Parent, ds.MapKey, ds.WorkSeq, ds)
}

// NewAppliedEvent is ev as a consumer-facing event (TypeApplied).
func NewAppliedEvent(ev *AppliedEvent) (*Event, error) {
	return newConsumerEvent(EventKindApplied, TypeApplied, ev.Controller, ev.Parent, ev.MapKey, ev.WorkSeq, ev)
}

// newConsumerEvent encodes body, redacts it and wraps it as a binary-mode
// CloudEvent with id <kind>:<parent UID>:<workseq>[:<map key>] (one per
// desired state and kind) and the workseq extension.
func newConsumerEvent(kind, ceType string, ctrl ControllerRef, parent ObjectRef, mapKey string, workSeq uint64, body any) (*Event, error) {
	subject, err := EventSubject(kind, ctrl, parent)
	if err != nil {
		return nil, err
	}
	data, err := json.Marshal(body)
	if err != nil {
		return nil, fmt.Errorf("encode %s event: %w", kind, err)
	}
	data, removed := redactSecretData(data)
	id := kind + ":" + DesiredMsgID(parent.UID, workSeq)
	if mapKey != "" {
		id += ":" + mapKey
	}
	ext := WithItemKey(map[string]string{ExtWorkSeq: WorkSeqString(workSeq)}, mapKey, ItemKey(ctrl.ID(), parent.UID, mapKey))
	if removed != "" {
		ext[ExtRedacted] = removed
	}
	return NewEvent(subject, ceType, id, ctrl, parent, json.RawMessage(data), ext)
}
