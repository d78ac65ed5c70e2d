// Package events names the reasons of the Kubernetes Events metabus
// records, as plain constants: the kind cores put them in their plans and
// import this leaf without the recorder that writes Events through the API
// server (package events/recorder), so that they link no client-go
// transport (internal/layers TestCoresLinkNoTransport).
package events

// Reasons, as upstream Metacontroller emits them.
const (
	ReasonSyncError   = "SyncError"
	ReasonCreateError = "CreateError"
	ReasonStarted     = "Started"
	ReasonStopped     = "Stopped"
	// ReasonInvalidDesired is metabus' reason for a hook response rejected
	// as a whole (children outside the allowed kinds or namespaces...).
	ReasonInvalidDesired = "InvalidDesiredState"
	// ReasonApplyError reports a failed write of a child or the parent.
	ReasonApplyError = "ApplyError"
	// ReasonApplyForbidden reports a write the applier's RBAC does not
	// allow: an admin must grant it, retrying soon cannot help.
	ReasonApplyForbidden = "ApplyForbidden"
	// ReasonDeadLetter reports a message moved to the DLQ.
	ReasonDeadLetter = "DeadLetter"
	// ReasonAdopted reports a child taken over from an earlier incarnation
	// of its parent (same name, a UID that no longer exists).
	ReasonAdopted = "AdoptedFromEarlierParent"
	// ReasonCreateConflict reports a child the hook asked for whose name
	// an object the parent does not control already holds: it is never
	// taken over by the create, which is retried until the name is free.
	ReasonCreateConflict = "CreateConflict"
	// ReasonInvalidAnnotation reports a metabus annotation on a controller
	// whose value is ignored (the default applies instead).
	ReasonInvalidAnnotation = "InvalidAnnotation"
	// ReasonInvalidIdentity reports a controller whose ServiceAccount
	// annotation (pkg/identity) does not parse: its parents get no writes.
	ReasonInvalidIdentity = "InvalidServiceAccount"
	// ReasonReadWithheld reports, on a controller, objects its
	// ServiceAccount may not list and watch (pkg/readaccess): they are
	// never sent to its hooks.
	ReasonReadWithheld = "ReadWithheld"
)
