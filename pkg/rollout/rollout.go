// Package rollout decides, for one sync of a parent, how a rolling update of its children
// (RollingRecreate or RollingInPlace) proceeds. It does no I/O: the caller keeps the revision
// bookkeeping with package revision and writes children with package apply.
//
// The rollout moves children to the latest revision one at a time, in the order the sync hook
// returned them, and only while every child already on the latest revision is healthy, so a bad
// template stops after breaking one child. Children not on the latest revision keep being
// rendered from their own revision. Moving a child only changes which revision renders it; the
// caller then updates it like any child of its update method (delete and recreate, or update in
// place), so the move must be recorded in the ControllerRevisions before the child is touched.
package rollout

import (
	"cmp"
	"fmt"
	"math"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/metabus/metabus/pkg/api/v1alpha1"
	"github.com/metabus/metabus/pkg/children"
)

// The parent condition a rollout maintains in status.conditions, as upstream.
const (
	ConditionUpdated = "Updated"

	ReasonOnLatestRevision   = "OnLatestRevision"   // True: every child is on the latest revision and healthy
	ReasonRolloutProgressing = "RolloutProgressing" // False: a child is being moved or updated
	ReasonRolloutWaiting     = "RolloutWaiting"     // False: an updated child fails its status checks
)

// Child is one desired child of the latest revision, with what the caller knows about it.
type Child struct {
	Key children.ChildKey
	// Method and Checks come from the child's rule (updateStrategy). They are per child because
	// one parent may roll several kinds with different checks; upstream also moves one child per
	// sync across all of them. Children whose method is not rolling are ignored.
	Method v1alpha1.ChildUpdateMethod
	Checks []v1alpha1.StatusConditionCheck
	// Observed is the child as it exists, nil when it does not.
	Observed *unstructured.Unstructured
	// Revision is the revision the child belongs to (revision.History.RevisionOf).
	Revision string
	// Matches says that Observed already has the latest revision's desired state, i.e.
	// apply.UpdateChild reports no change. It only matters for children on the latest revision.
	Matches bool
}

// Input is what Decide needs for one sync.
type Input struct {
	Latest   string  // name of the latest revision
	Children []Child // in the order the hook returned them for the latest revision
}

// Condition is the parent's Updated condition, which the caller sets in the hook's status with
// WithCondition.
type Condition struct {
	Type    string `json:"type"`
	Status  string `json:"status"` // "True" or "False"
	Reason  string `json:"reason"`
	Message string `json:"message"`
}

// Plan is the decision for one sync.
type Plan struct {
	// Move is the child to move to the latest revision now, if any: record it with
	// revision.History.Move and persist the history before touching the child, then treat it
	// as on the latest revision for the rest of the sync.
	Move      *children.ChildKey
	Condition Condition
	// Done says the rollout is complete: every rolling child is on the latest revision and
	// healthy.
	Done bool
}

// Decide applies the rolling update rules:
//
//   - A child on the latest revision is "updating" while it does not exist yet (it is being
//     recreated), does not match the latest desired state, or, for RollingInPlace, reports a
//     status.observedGeneration below its metadata.generation (its own controller has not seen
//     the update yet). An existing, matching child that fails a status check is "unhealthy".
//     Either stops the rollout: nothing is moved.
//   - Otherwise the first child in hook order that is not on the latest revision and exists is
//     moved. A missing child on an older revision (deleted mid-rollout) is no obstacle and is not
//     moved: the caller recreates it at its own revision, and its turn comes once it exists.
//   - Condition: False/RolloutWaiting naming the first unhealthy child and its failing check;
//     else False/RolloutProgressing while a child is updating, is being moved or awaits its
//     recreation; else True/OnLatestRevision with upstream's message ("latest
//     ControllerRevision: <name>"), and Done.
func Decide(in Input) Plan {
	var (
		total, onLatest   int
		updating, waiting string // the first of each, for the message
		next              *Child
		missing           int // not on the latest revision and absent
	)
	for i := range in.Children {
		c := &in.Children[i]
		if !Rolling(c.Method) {
			continue
		}
		total++
		if c.Revision != in.Latest {
			if c.Observed == nil {
				missing++
			} else if next == nil {
				next = c
			}
			continue
		}
		onLatest++
		var u, w string
		switch {
		case c.Observed == nil:
			u = fmt.Sprintf("waiting for %s to be created", c.Key)
		case !c.Matches:
			u = fmt.Sprintf("waiting for %s to be updated", c.Key)
		default:
			if msg := staleGeneration(c); msg != "" {
				u = fmt.Sprintf("waiting for %s to observe its update: %s", c.Key, msg)
			} else if msg := failedCheck(c); msg != "" {
				w = fmt.Sprintf("%s fails status check: %s", c.Key, msg)
			}
		}
		updating, waiting = cmp.Or(updating, u), cmp.Or(waiting, w)
	}
	progress := fmt.Sprintf(" (%d/%d children on revision %s)", onLatest, total, in.Latest)
	plan := Plan{Condition: Condition{Type: ConditionUpdated, Status: "False", Reason: ReasonRolloutProgressing}}
	switch {
	case waiting != "":
		plan.Condition.Reason = ReasonRolloutWaiting
		plan.Condition.Message = waiting + progress
	case updating != "":
		plan.Condition.Message = updating + progress
	case next != nil:
		key := next.Key
		plan.Move = &key
		plan.Condition.Message = fmt.Sprintf("moving %s to revision %s (%d/%d children on it before)", key, in.Latest, onLatest, total)
	case missing > 0:
		plan.Condition.Message = fmt.Sprintf("waiting for %d deleted children to be recreated at their revisions", missing) + progress
	default:
		// Upstream's message, word for word: a parent it left on the
		// latest revision reads the same to metabus.
		plan.Condition = Condition{Type: ConditionUpdated, Status: "True", Reason: ReasonOnLatestRevision,
			Message: "latest ControllerRevision: " + in.Latest}
		plan.Done = true
	}
	return plan
}

// Rolling reports whether method is a rolling update method.
func Rolling(method v1alpha1.ChildUpdateMethod) bool {
	return method == v1alpha1.ChildUpdateRollingRecreate || method == v1alpha1.ChildUpdateRollingInPlace
}

// staleGeneration applies the RollingInPlace gate: an in-place update bumps metadata.generation,
// and until the child's controller reports the new generation its status describes the old
// spec, so its status checks prove nothing yet. Children without observedGeneration pass.
func staleGeneration(c *Child) string {
	if c.Method != v1alpha1.ChildUpdateRollingInPlace {
		return ""
	}
	observed, ok := number(c.Observed.Object, "status", "observedGeneration")
	if !ok {
		return ""
	}
	generation, _ := number(c.Observed.Object, "metadata", "generation")
	if observed < generation {
		return fmt.Sprintf("status.observedGeneration %v < metadata.generation %v", observed, generation)
	}
	return ""
}

// failedCheck returns why the first failing status check fails, or "".
func failedCheck(c *Child) string {
	status, _ := c.Observed.Object["status"].(map[string]any)
	conditions, _ := status["conditions"].([]any)
	for _, check := range c.Checks {
		var found map[string]any
		for _, item := range conditions {
			if cond, ok := item.(map[string]any); ok && cond["type"] == check.Type {
				found = cond
				break
			}
		}
		switch {
		case found == nil:
			return fmt.Sprintf("condition %s not found", check.Type)
		case check.Status != nil && found["status"] != *check.Status:
			return fmt.Sprintf("condition %s has status %v, want %s", check.Type, found["status"], *check.Status)
		case check.Reason != nil && found["reason"] != *check.Reason:
			return fmt.Sprintf("condition %s has reason %v, want %s", check.Type, found["reason"], *check.Reason)
		}
	}
	return ""
}

// number reads an integer field as the API machinery or a JSON decoder may have stored it.
func number(obj map[string]any, fields ...string) (float64, bool) {
	var v any = obj
	for _, f := range fields {
		m, ok := v.(map[string]any)
		if !ok {
			return 0, false
		}
		if v, ok = m[f]; !ok {
			return 0, false
		}
	}
	switch n := v.(type) {
	case int64:
		return float64(n), true
	case int:
		return float64(n), true
	case int32:
		return float64(n), true
	case float64:
		return n, !math.IsNaN(n)
	case interface{ Float64() (float64, error) }: // json.Number
		f, err := n.Float64()
		return f, err == nil
	}
	return 0, false
}

// RevisionResult is the sync hook's answer for one revision of the parent.
type RevisionResult struct {
	Revision           string
	Latest             bool
	Status             map[string]any
	ResyncAfterSeconds float64
	Finalized          bool
}

// Aggregate combines the hook's answers for the parent's revisions as upstream does: the status
// comes from the latest revision only (it describes the parent as it is now); the resync delay
// is the smallest positive one, so no revision waits longer than it asked; and the parent is
// finalized only when every revision says so (and there is at least one), since any of them
// may still own children to clean up.
func Aggregate(results []RevisionResult) (status map[string]any, resyncAfter float64, finalized bool) {
	finalized = len(results) > 0
	latestSeen := false
	for _, r := range results {
		if r.Latest && !latestSeen {
			status, latestSeen = r.Status, true
		}
		if r.ResyncAfterSeconds > 0 && (resyncAfter == 0 || r.ResyncAfterSeconds < resyncAfter) {
			resyncAfter = r.ResyncAfterSeconds
		}
		finalized = finalized && r.Finalized
	}
	return status, resyncAfter, finalized
}

// WithCondition returns a copy of the hook's status with c set in status.conditions, in
// upstream's form: {type, status, reason, message} (reason and message left out when empty),
// with no lastTransitionTime, replacing in place a condition of the same type the hook returned,
// else appended. The condition is a function of the rollout alone, so a parent whose rollout
// has not changed gets the same status back and is not rewritten; a parent upstream left behind
// (its True condition names the latest ControllerRevision, as Decide's does) is not rewritten
// either when metabus takes it over.
func WithCondition(status map[string]any, c Condition) map[string]any {
	out := make(map[string]any, len(status)+1)
	for k, v := range status {
		out[k] = v
	}
	cond := map[string]any{"type": c.Type, "status": c.Status}
	if c.Reason != "" {
		cond["reason"] = c.Reason
	}
	if c.Message != "" {
		cond["message"] = c.Message
	}
	list, _ := out["conditions"].([]any)
	conds := make([]any, 0, len(list)+1)
	replaced := false
	for _, item := range list {
		if m, ok := item.(map[string]any); ok && m["type"] == c.Type && !replaced {
			conds, replaced = append(conds, cond), true
			continue
		}
		conds = append(conds, item)
	}
	if !replaced {
		conds = append(conds, cond)
	}
	out["conditions"] = conds
	return out
}
