// Package revstore defines the protocol of the revisions service, the one
// owner of metacontroller.k8s.io ControllerRevision objects: "load the
// revisions of parent P" (the dispatcher, before calling a hook once per live
// revision, and the applier, inside its per-parent critical section) and
// "commit these revision writes" (the applier, before it touches the child
// whose move the writes record). Over NATS it is a request/reply micro service
// on bus.RevisionsSubject; in one process the same Store is called directly.
//
// The revision bookkeeping itself (which child belongs to which revision, what
// to create, update and delete) is package revision's pure History; the store
// only reads and writes, with optimistic concurrency, so a commit computed
// from an outdated view fails with Conflict instead of undoing someone else's
// progress.
package revstore

import (
	"context"

	"github.com/metabus/metabus/pkg/api/v1alpha1"
	"github.com/metabus/metabus/pkg/bus"
)

// Operations.
const (
	// OpLoad reads the parent's ControllerRevisions with a consistent
	// (quorum) read unless AllowStale is set, adopting orphans first when
	// Adopt is set.
	OpLoad = "load"
	// OpCommit writes the creates, then the updates in order, then the
	// deletes of a revision.History's Changes. Updates and deletes carry
	// the resourceVersion they were loaded with.
	OpCommit = "commit"
)

// Result codes.
const (
	// OK: done; for OpLoad, Revisions holds the parent's revisions.
	OK = "ok"
	// Conflict: a revision changed since it was loaded (or a create found
	// one already there); nothing after the conflicting write was done.
	// Load again and recompute.
	Conflict = "conflict"
	// Invalid: the request is malformed or would write revisions that do
	// not belong to the parent; Message says why. Retrying will not help.
	Invalid = "invalid"
	// Error: the API server failed; Message says how. Retry with backoff.
	Error = "error"
)

// Parent identifies the parent whose revisions are read or written.
// Revisions live in the parent's namespace and are found by the labels
// revision.LabelAPIGroup and revision.LabelResource plus a controller
// reference to UID.
type Parent struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	// Resource is the parent's plural resource name.
	Resource  string `json:"resource"`
	Namespace string `json:"namespace,omitempty"`
	Name      string `json:"name"`
	UID       string `json:"uid"`
	// Selector is the parent's label selector (labels.Selector.String())
	// that an orphaned revision must match to be adopted.
	Selector string `json:"selector,omitempty"`
}

// Request is one call to the revisions service.
type Request struct {
	Op         string            `json:"op"`
	Controller bus.ControllerRef `json:"controller"`
	Parent     Parent            `json:"parent"`
	// Adopt (OpLoad) adopts orphaned revisions of the parent's resource that
	// match Parent.Selector, as upstream does when a parent is replaced.
	// Only the applier sets it, and only for a parent that is not being
	// deleted.
	Adopt bool `json:"adopt,omitempty"`
	// AllowStale (OpLoad) lets the API server answer from its watch cache
	// (resourceVersion "0") instead of a consistent read. Right after any
	// write a consistent LIST waits for the cache to catch up (measured
	// ~60-70 ms per load during a rollout, ~3 ms when quiet). The dispatcher
	// sets it: the applier loads consistently under the parent's critical
	// section and resyncs when the dispatcher's view was outdated.
	AllowStale bool `json:"allowStale,omitempty"`
	// Creates, Updates and Deletes (OpCommit), as revision.History.Changes
	// returns them.
	Creates []v1alpha1.ControllerRevision `json:"creates,omitempty"`
	Updates []v1alpha1.ControllerRevision `json:"updates,omitempty"`
	Deletes []v1alpha1.ControllerRevision `json:"deletes,omitempty"`
}

// Response is the service's answer.
type Response struct {
	Result  string `json:"result"`
	Message string `json:"message,omitempty"`
	// Revisions (OpLoad) are the revisions the parent controls, sorted by
	// name.
	Revisions []v1alpha1.ControllerRevision `json:"revisions,omitempty"`
	// ResourceVersion (OpCommit) is the highest resourceVersion written.
	ResourceVersion string `json:"resourceVersion,omitempty"`
}

// Store serves revision requests.
type Store interface {
	Revisions(ctx context.Context, req Request) (*Response, error)
}
