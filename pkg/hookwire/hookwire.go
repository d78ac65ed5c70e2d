// Package hookwire is the wire contract between metabus and a hook, for
// every transport: the CloudEvents attributes and extensions a hook request
// carries, how a hook answers, and how a hook served over NATS says it
// failed or is throttled. The dispatcher (package hooks) and the SDK for
// hook authors both read it from here, so the two ends cannot drift. It
// imports nothing.
//
// A hook request is a CloudEvent whose data is the hook's JSON request
// (the body a Metacontroller webhook has always received):
//
//   - type EventTypePrefix + "<hook>.v1", hook one of sync, finalize,
//     customize, map, tombstone;
//   - source the controller object's path, subject the parent's path, id
//     unique per call, time when it was sent;
//   - the extensions metabus adds (ExtParentUID on every call; ExtWorkSeq
//     and ExtPartitionKey on sync, finalize and map calls).
//
// Over HTTP it is a POST in binary content mode (attributes as ce-*
// headers, the JSON body untouched, so a legacy hook reads a plain JSON
// body) or, when the webhook asks for it, in structured content mode
// (Content-Type ContentTypeStructured, the whole event as JSON). Over NATS
// it is a request message following the CloudEvents NATS protocol binding:
// binary mode puts the attributes in NATS headers named "ce-<attribute>"
// with the data as payload and HeaderContentType set to ContentTypeJSON;
// structured mode sets HeaderContentType to ContentTypeStructured and
// carries the whole event as payload.
//
// The answer, over either transport, is the hook's JSON response as a plain
// body, or a CloudEvent (binary or structured) whose data is that response.
// A CloudEvent answer should say what it answers: type ResponseType of the
// request's type, subject the request's subject, and extension
// ExtRequestID the request's id (metabus reads only its data).
//
// Over NATS, where there is no status code, a hook that fails answers with
// the NATS services convention: header HeaderServiceErrorCode (a decimal
// code with HTTP's meaning: 4xx the request was refused, 5xx the hook
// failed) and HeaderServiceError (a short message). Code 429 is
// back-pressure, as HTTP 429 is: HeaderRetryAfter carries the delay in
// seconds (an integer or decimal), and the dispatcher retries no earlier.
// Every other code is a hook error, retried with backoff and reported as an
// Event, exactly as a webhook's non-200 status is.
package hookwire

// EventTypePrefix starts the CloudEvents type of a hook request:
// EventTypePrefix + "<hook>.v1".
const EventTypePrefix = "io.k8s.metacontroller.hook."

// Hook kinds: the <hook> of a request's type.
const (
	HookSync      = "sync"
	HookFinalize  = "finalize"
	HookCustomize = "customize"
	HookMap       = "map"
	HookTombstone = "tombstone"
)

// EventType is the CloudEvents type of a request to a hook of kind hook.
func EventType(hook string) string { return EventTypePrefix + hook + ".v1" }

// ResponseTypeSuffix ends the CloudEvents type of a hook's answer:
// ResponseType(EventType(HookSync)) is
// "io.k8s.metacontroller.hook.sync.v1.response".
const ResponseTypeSuffix = ".response"

// ResponseType is the CloudEvents type of the answer to a request of type
// requestType.
func ResponseType(requestType string) string { return requestType + ResponseTypeSuffix }

// Content types.
const (
	// ContentTypeJSON is the data content type of every hook request and
	// the content type of a binary-mode message.
	ContentTypeJSON = "application/json"
	// ContentTypeStructured marks a structured-mode CloudEvent in JSON.
	ContentTypeStructured = "application/cloudevents+json"
)

// Header names over NATS (NATS headers are case-sensitive; these are the
// spellings metabus writes and the SDK reads; readers also accept any
// case of the "ce-" prefix).
const (
	// HeaderPrefix starts every CloudEvents attribute header:
	// "ce-specversion", "ce-id", "ce-type", "ce-source", "ce-subject",
	// "ce-time" and one per extension.
	HeaderPrefix = "ce-"
	// HeaderContentType is the NATS header carrying the content type.
	HeaderContentType = "content-type"
	// HeaderServiceErrorCode and HeaderServiceError are a failed answer's
	// code and message (the NATS services convention).
	HeaderServiceErrorCode = "Nats-Service-Error-Code"
	HeaderServiceError     = "Nats-Service-Error"
	// HeaderRetryAfter is a throttled answer's delay in seconds, as HTTP's
	// Retry-After header.
	HeaderRetryAfter = "Retry-After"
)

// CodeThrottled is the error code of back-pressure (HTTP's 429).
const CodeThrottled = 429

// Extensions metabus adds to a hook request, as CloudEvents extension
// attributes (lower-case names, at most 20 characters).
const (
	// ExtParentUID is the parent's UID.
	ExtParentUID = "parentuid"
	// ExtWorkSeq is the work item's stream sequence, zero-padded to 20
	// digits so that it orders lexically.
	ExtWorkSeq = "workseq"
	// ExtPartitionKey is the CloudEvents partitioning extension: the work
	// item's key (controller, parent UID and map key), whose calls metabus
	// makes one at a time and in order.
	ExtPartitionKey = "partitionkey"
	// ExtRequestID is set by a hook on a CloudEvent answer: the id of the
	// request it answers.
	ExtRequestID = "requestid"
)
