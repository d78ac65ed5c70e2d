package bus

import (
	"time"
)

// Operator inspection (package inspect, the metabus CLI).
//
// What a dispatcher or applier did lately (a parent's last hook call and
// its answer, the writes an apply made, a controller's hook calls and
// errors per minute, its last error) exists nowhere but in that replica's
// memory: MC_WORK and MC_DESIRED are work queues, whose messages are gone
// once acknowledged. So every dispatcher and applier replica keeps a small,
// bounded record of its recent outcomes (package inspect) and answers
// InspectRequests on InspectSubject(stage): all replicas answer (core NATS,
// no queue group), each for what it did itself since it started. While an
// operator tails, replicas also publish each record as it is made on
// TraceSubject; a tail announces itself on TailSubject every few seconds,
// and replicas publish only for TailWindow after the last announcement, so
// an untailed bus carries nothing extra.
//
// A record never carries a hook's children, only their identities: a
// desired state's Secret children must not reach the operator's terminal.
const (
	inspectRoot = "mc.inspect"
	traceRoot   = "mc.trace"

	// TailSubject is where a tailing client announces itself (an empty
	// message, every TailWindow/3).
	TailSubject = inspectRoot + ".tail"
)

// TailWindow is how long replicas keep publishing trace records after the
// last tail announcement.
const TailWindow = 15 * time.Second

// InspectSubject is the request subject of a stage's replicas (WorkStage:
// dispatchers, DesiredStage: appliers).
func InspectSubject(stage string) string { return inspectRoot + "." + stage }

// TraceSubject is where a replica of stage publishes the record of one
// item while someone tails: mc.trace.<stage>.<ctrlID>.<parent token>.
func TraceSubject(stage, ctrlID, parentToken string) string {
	return traceRoot + "." + stage + "." + ctrlID + "." + parentToken
}

// TraceFilter is the subscription subject of every trace record of a stage
// ("*": both stages) for one controller ("" or "*": all).
func TraceFilter(stage, ctrlID string) string {
	if stage == "" {
		stage = "*"
	}
	if ctrlID == "" {
		ctrlID = "*"
	}
	return traceRoot + "." + stage + "." + ctrlID + ".*"
}

// InspectRequest asks every replica of a stage what it recorded. With
// ParentUID it asks for that parent's records (all its map keys); with
// Controller (a controller ID) only that controller's activity; with
// neither, every controller's activity and no item records.
type InspectRequest struct {
	Controller string `json:"controller,omitempty"`
	ParentUID  string `json:"parentUID,omitempty"`
}

// InspectReply is one replica's answer.
type InspectReply struct {
	Member string `json:"member"`
	Stage  string `json:"stage"`
	// Since is when the replica started recording: nothing before it is
	// known to it.
	Since       time.Time            `json:"since"`
	Controllers []ControllerActivity `json:"controllers,omitempty"`
	Records     []Record             `json:"records,omitempty"`
}

// ControllerActivity is a controller's recent activity in one replica.
type ControllerActivity struct {
	// Controller is the controller ID (ControllerID).
	Controller string `json:"controller"`
	// Minutes counts operations per wall-clock minute, oldest first, for
	// the minutes that had any (at most ActivityMinutes): hook calls in a
	// dispatcher, applies in an applier.
	Minutes []MinuteCount `json:"minutes,omitempty"`
	// LastError is the replica's last failed sync or apply of the
	// controller.
	LastError *Record `json:"lastError,omitempty"`
}

// ActivityMinutes is how many minutes of activity a replica keeps.
const ActivityMinutes = 15

// MinuteCount is one minute of a controller's activity.
type MinuteCount struct {
	Start  time.Time `json:"start"`
	Calls  int       `json:"calls"`
	Errors int       `json:"errors"`
}

// Record is the outcome of one work item (stage WorkStage: the sync, its
// hook calls and the answer) or one desired state (DesiredStage: the apply
// and its writes).
type Record struct {
	Stage      string        `json:"stage"`
	Member     string        `json:"member,omitempty"`
	Controller ControllerRef `json:"controller"`
	Parent     ObjectRef     `json:"parent"`
	MapKey     string        `json:"mapKey,omitempty"`
	// WorkSeq is the MC_WORK sequence of the work item (for an apply: of
	// the work item whose answer it applied).
	WorkSeq uint64 `json:"workSeq,omitempty"`
	// Reason is the work item's reason (dispatchers) or the hook whose
	// answer was applied (appliers).
	Reason  string    `json:"reason,omitempty"`
	Attempt int       `json:"attempt,omitempty"`
	Started time.Time `json:"started"`
	Seconds float64   `json:"seconds"`
	// Result is the sync's or apply's result label (ok, error, echo,
	// noop, conflict, ...), as the stage's metrics count it.
	Result string `json:"result"`
	Error  string `json:"error,omitempty"`
	// Hooks are the hook calls the sync made, in order.
	Hooks []HookCallRecord `json:"hooks,omitempty"`
	// Answer summarizes the desired state the sync published.
	Answer *AnswerSummary `json:"answer,omitempty"`
	// Writes are the updates and creates the apply made (object UID,
	// resourceVersion before and after; From "" is a create).
	Writes []Write `json:"writes,omitempty"`
}

// HookCallRecord is one hook call.
type HookCallRecord struct {
	Hook    string  `json:"hook"`
	Seconds float64 `json:"seconds"`
	Error   string  `json:"error,omitempty"`
}

// AnswerSummary is what a desired state asked for, without the children's
// content.
type AnswerSummary struct {
	Hook               string         `json:"hook"`
	Children           []ObjectID     `json:"children"`
	Status             map[string]any `json:"status,omitempty"`
	ResyncAfterSeconds float64        `json:"resyncAfterSeconds,omitempty"`
	Finalized          bool           `json:"finalized,omitempty"`
	// Revisions counts the older revisions' children sets (rolling
	// updates).
	Revisions int `json:"revisions,omitempty"`
}

// ObjectID names one object.
type ObjectID struct {
	APIVersion string `json:"apiVersion"`
	Kind       string `json:"kind"`
	Namespace  string `json:"namespace,omitempty"`
	Name       string `json:"name"`
}

// ReasonReplay is the reason of a work item the operator asked for (metabus
// dlq replay): a fresh sync of a parent whose earlier item was parked in
// MC_DLQ. Like a resync, it always calls the hook.
const ReasonReplay = "replay"

// RedactSecrets returns a desired state's JSON with the values of its
// Secret children's data and stringData emptied, as MC_DLQ parks it, and a
// note saying what was removed ("" if nothing). Operator tools show
// desired states only so.
func RedactSecrets(desired []byte) ([]byte, string) { return redactSecretData(desired) }
