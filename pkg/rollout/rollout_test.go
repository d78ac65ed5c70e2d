package rollout

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/metabus/metabus/pkg/api/v1alpha1"
	"github.com/metabus/metabus/pkg/children"
)

func ptr(s string) *string { return &s }

var readyTrue = []v1alpha1.StatusConditionCheck{{Type: "Ready", Status: ptr("True")}}

// pod returns an observed Pod; conds are "Type=Status" or "Type=Status/Reason".
func pod(name string, conds ...string) *unstructured.Unstructured {
	var list []any
	for _, c := range conds {
		typ, rest, _ := strings.Cut(c, "=")
		status, reason, _ := strings.Cut(rest, "/")
		cond := map[string]any{"type": typ, "status": status}
		if reason != "" {
			cond["reason"] = reason
		}
		list = append(list, cond)
	}
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "v1", "kind": "Pod",
		"metadata": map[string]any{"name": name, "namespace": "ns", "generation": int64(2)},
		"status":   map[string]any{"conditions": list},
	}}
}

// withObservedGeneration sets status.observedGeneration (metadata.generation is 2).
func withObservedGeneration(u *unstructured.Unstructured, g any) *unstructured.Unstructured {
	u.Object["status"].(map[string]any)["observedGeneration"] = g
	return u
}

func key(name string) children.ChildKey {
	return children.ChildKey{APIVersion: "v1", Kind: "Pod", Namespace: "ns", Name: name}
}

// on returns a RollingRecreate child with the Ready=True check on revision rev.
func on(rev, name string, observed *unstructured.Unstructured, matches bool) Child {
	return Child{Key: key(name), Method: v1alpha1.ChildUpdateRollingRecreate, Checks: readyTrue,
		Observed: observed, Revision: rev, Matches: matches}
}

func inPlace(c Child) Child { c.Method = v1alpha1.ChildUpdateRollingInPlace; return c }

func TestDecide(t *testing.T) {
	ready := func(name string) *unstructured.Unstructured { return pod(name, "Ready=True") }
	cases := []struct {
		reason      string
		children    []Child
		wantMove    string // child name, "" for none
		wantStatus  string
		wantReason  string
		wantMessage []string // substrings
	}{
		{
			reason:     "no children: nothing to roll out",
			wantStatus: "True", wantReason: ReasonOnLatestRevision, wantMessage: []string{"latest ControllerRevision: v2"},
		},
		{
			reason: "all children on the latest revision and healthy: done",
			children: []Child{
				on("v2", "web-0", ready("web-0"), true), on("v2", "web-1", ready("web-1"), true),
			},
			wantStatus: "True", wantReason: ReasonOnLatestRevision, wantMessage: []string{"latest ControllerRevision: v2"},
		},
		{
			reason: "a new template: the first child in hook order moves",
			children: []Child{
				on("v1", "web-0", ready("web-0"), false), on("v1", "web-1", ready("web-1"), false),
			},
			wantMove: "web-0", wantStatus: "False", wantReason: ReasonRolloutProgressing,
			wantMessage: []string{"moving Pod.v1 ns/web-0 to revision v2", "0/2"},
		},
		{
			reason: "hook order, not name order, decides who is next",
			children: []Child{
				on("v1", "web-2", ready("web-2"), false), on("v1", "web-0", ready("web-0"), false),
			},
			wantMove: "web-2", wantStatus: "False", wantReason: ReasonRolloutProgressing,
		},
		{
			reason: "children already on the latest are skipped when picking the next one",
			children: []Child{
				on("v2", "web-0", ready("web-0"), true), on("v1", "web-1", ready("web-1"), false), on("v1", "web-2", ready("web-2"), false),
			},
			wantMove: "web-1", wantStatus: "False", wantReason: ReasonRolloutProgressing, wantMessage: []string{"1/3"},
		},
		{
			reason: "an updated child that is not Ready pauses the rollout",
			children: []Child{
				on("v2", "web-0", pod("web-0", "Ready=False"), true), on("v1", "web-1", ready("web-1"), false),
			},
			wantStatus: "False", wantReason: ReasonRolloutWaiting,
			wantMessage: []string{"Pod.v1 ns/web-0 fails status check", "condition Ready has status False, want True"},
		},
		{
			reason: "a missing condition fails the check",
			children: []Child{
				on("v2", "web-0", pod("web-0"), true), on("v1", "web-1", ready("web-1"), false),
			},
			wantStatus: "False", wantReason: ReasonRolloutWaiting, wantMessage: []string{"condition Ready not found"},
		},
		{
			reason: "a check without status only needs the condition to exist",
			children: []Child{
				{Key: key("web-0"), Method: v1alpha1.ChildUpdateRollingRecreate, Checks: []v1alpha1.StatusConditionCheck{{Type: "Ready"}},
					Observed: pod("web-0", "Ready=False"), Revision: "v2", Matches: true},
				on("v1", "web-1", ready("web-1"), false),
			},
			wantMove: "web-1", wantStatus: "False", wantReason: ReasonRolloutProgressing,
		},
		{
			reason: "a check with a reason compares it",
			children: []Child{
				{Key: key("web-0"), Method: v1alpha1.ChildUpdateRollingRecreate,
					Checks:   []v1alpha1.StatusConditionCheck{{Type: "Ready", Status: ptr("True"), Reason: ptr("AllGood")}},
					Observed: pod("web-0", "Ready=True/Warming"), Revision: "v2", Matches: true},
				on("v1", "web-1", ready("web-1"), false),
			},
			wantStatus: "False", wantReason: ReasonRolloutWaiting, wantMessage: []string{"condition Ready has reason Warming, want AllGood"},
		},
		{
			reason: "every check must pass",
			children: []Child{
				{Key: key("web-0"), Method: v1alpha1.ChildUpdateRollingRecreate,
					Checks:   []v1alpha1.StatusConditionCheck{{Type: "Ready", Status: ptr("True")}, {Type: "Synced", Status: ptr("True")}},
					Observed: pod("web-0", "Ready=True", "Synced=False"), Revision: "v2", Matches: true},
				on("v1", "web-1", ready("web-1"), false),
			},
			wantStatus: "False", wantReason: ReasonRolloutWaiting, wantMessage: []string{"condition Synced"},
		},
		{
			reason: "a child on the latest that does not match yet is updating: do not move another",
			children: []Child{
				on("v2", "web-0", ready("web-0"), false), on("v1", "web-1", ready("web-1"), false),
			},
			wantStatus: "False", wantReason: ReasonRolloutProgressing, wantMessage: []string{"waiting for Pod.v1 ns/web-0 to be updated"},
		},
		{
			reason: "RollingRecreate: a moved child that is gone is being recreated; do not move another",
			children: []Child{
				on("v2", "web-0", nil, false), on("v1", "web-1", ready("web-1"), false),
			},
			wantStatus: "False", wantReason: ReasonRolloutProgressing, wantMessage: []string{"waiting for Pod.v1 ns/web-0 to be created"},
		},
		{
			reason: "RollingInPlace: an observedGeneration behind the generation is still updating",
			children: []Child{
				inPlace(on("v2", "web-0", withObservedGeneration(ready("web-0"), int64(1)), true)), inPlace(on("v1", "web-1", ready("web-1"), false)),
			},
			wantStatus: "False", wantReason: ReasonRolloutProgressing,
			wantMessage: []string{"observe its update", "status.observedGeneration 1 < metadata.generation 2"},
		},
		{
			reason: "RollingInPlace: an observedGeneration that caught up (as a float) lets the rollout go on",
			children: []Child{
				inPlace(on("v2", "web-0", withObservedGeneration(ready("web-0"), float64(2)), true)), inPlace(on("v1", "web-1", ready("web-1"), false)),
			},
			wantMove: "web-1", wantStatus: "False", wantReason: ReasonRolloutProgressing,
		},
		{
			reason: "RollingInPlace: without observedGeneration only the checks count",
			children: []Child{
				inPlace(on("v2", "web-0", ready("web-0"), true)), inPlace(on("v1", "web-1", ready("web-1"), false)),
			},
			wantMove: "web-1", wantStatus: "False", wantReason: ReasonRolloutProgressing,
		},
		{
			reason: "RollingRecreate ignores observedGeneration (a recreated child starts afresh)",
			children: []Child{
				on("v2", "web-0", withObservedGeneration(ready("web-0"), int64(1)), true), on("v1", "web-1", ready("web-1"), false),
			},
			wantMove: "web-1", wantStatus: "False", wantReason: ReasonRolloutProgressing,
		},
		{
			reason: "an old child deleted mid-rollout is no obstacle and is not moved; the next existing one is",
			children: []Child{
				on("v2", "web-0", ready("web-0"), true), on("v1", "web-1", nil, false), on("v1", "web-2", ready("web-2"), false),
			},
			wantMove: "web-2", wantStatus: "False", wantReason: ReasonRolloutProgressing,
		},
		{
			reason: "only deleted old children left: wait for their recreation at their revision",
			children: []Child{
				on("v2", "web-0", ready("web-0"), true), on("v1", "web-1", nil, false),
			},
			wantStatus: "False", wantReason: ReasonRolloutProgressing, wantMessage: []string{"1 deleted children to be recreated"},
		},
		{
			reason: "an unhealthy child is reported even when another one earlier in order is updating",
			children: []Child{
				on("v2", "web-0", nil, false), on("v2", "web-1", pod("web-1", "Ready=False"), true), on("v1", "web-2", ready("web-2"), false),
			},
			wantStatus: "False", wantReason: ReasonRolloutWaiting, wantMessage: []string{"ns/web-1 fails status check"},
		},
		{
			reason: "the first unhealthy child in hook order is named",
			children: []Child{
				on("v2", "web-1", pod("web-1", "Ready=False"), true), on("v2", "web-0", pod("web-0", "Ready=False"), true),
			},
			wantStatus: "False", wantReason: ReasonRolloutWaiting, wantMessage: []string{"ns/web-1 fails"},
		},
		{
			reason: "children of non-rolling methods neither move nor block nor count",
			children: []Child{
				{Key: key("cfg"), Method: v1alpha1.ChildUpdateInPlace, Revision: "v1"},
				{Key: key("other"), Method: "", Revision: "v2", Observed: pod("other"), Matches: false},
				on("v2", "web-0", ready("web-0"), true),
			},
			wantStatus: "True", wantReason: ReasonOnLatestRevision, wantMessage: []string{"latest ControllerRevision: v2"},
		},
		{
			reason: "status checks are per child: a kind without checks is healthy once it matches",
			children: []Child{
				{Key: children.ChildKey{APIVersion: "v1", Kind: "ConfigMap", Namespace: "ns", Name: "cfg"},
					Method: v1alpha1.ChildUpdateRollingInPlace, Revision: "v2", Matches: true,
					Observed: &unstructured.Unstructured{Object: map[string]any{"kind": "ConfigMap"}}},
				on("v1", "web-0", ready("web-0"), false),
			},
			wantMove: "web-0", wantStatus: "False", wantReason: ReasonRolloutProgressing,
		},
	}
	for _, tc := range cases {
		t.Run(tc.reason, func(t *testing.T) {
			plan := Decide(Input{Latest: "v2", Children: tc.children})
			gotMove := ""
			if plan.Move != nil {
				gotMove = plan.Move.Name
			}
			if gotMove != tc.wantMove {
				t.Errorf("Move = %q, want %q", gotMove, tc.wantMove)
			}
			c := plan.Condition
			if c.Type != ConditionUpdated || c.Status != tc.wantStatus || c.Reason != tc.wantReason {
				t.Errorf("Condition = %s/%s/%s, want Updated/%s/%s (%s)", c.Type, c.Status, c.Reason, tc.wantStatus, tc.wantReason, c.Message)
			}
			for _, s := range tc.wantMessage {
				if !strings.Contains(c.Message, s) {
					t.Errorf("Message %q lacks %q", c.Message, s)
				}
			}
			if plan.Done != (tc.wantStatus == "True") {
				t.Errorf("Done = %v with condition %s", plan.Done, c.Status)
			}
		})
	}
}

func TestAggregate(t *testing.T) {
	st := func(v string) map[string]any { return map[string]any{"v": v} }
	cases := []struct {
		reason        string
		results       []RevisionResult
		wantStatus    map[string]any
		wantResync    float64
		wantFinalized bool
	}{
		{reason: "nothing: no status, no resync, not finalized"},
		{reason: "the status comes from the latest revision only, wherever it is listed",
			results: []RevisionResult{
				{Revision: "v1", Status: st("old")}, {Revision: "v2", Latest: true, Status: st("new")},
			},
			wantStatus: st("new")},
		{reason: "the smallest positive resync wins; zero and negative mean none",
			results: []RevisionResult{
				{Revision: "v2", Latest: true, ResyncAfterSeconds: 0}, {Revision: "v1", ResyncAfterSeconds: 30},
				{Revision: "v0", ResyncAfterSeconds: -5}, {Revision: "v3", ResyncAfterSeconds: 2.5},
			},
			wantResync: 2.5},
		{reason: "finalized when every revision agrees",
			results: []RevisionResult{
				{Revision: "v2", Latest: true, Finalized: true}, {Revision: "v1", Finalized: true},
			},
			wantFinalized: true},
		{reason: "an older revision that is not finalized holds the parent back",
			results: []RevisionResult{
				{Revision: "v2", Latest: true, Finalized: true}, {Revision: "v1", Finalized: false},
			}},
		{reason: "without a latest result there is no status",
			results:       []RevisionResult{{Revision: "v1", Status: st("old"), Finalized: true}},
			wantFinalized: true},
	}
	for _, tc := range cases {
		t.Run(tc.reason, func(t *testing.T) {
			status, resync, finalized := Aggregate(tc.results)
			if (status == nil) != (tc.wantStatus == nil) || (status != nil && status["v"] != tc.wantStatus["v"]) {
				t.Errorf("status = %v, want %v", status, tc.wantStatus)
			}
			if resync != tc.wantResync || finalized != tc.wantFinalized {
				t.Errorf("resync, finalized = %v, %v; want %v, %v", resync, finalized, tc.wantResync, tc.wantFinalized)
			}
		})
	}
}

func TestWithCondition(t *testing.T) {
	onLatest := Condition{Type: ConditionUpdated, Status: "True", Reason: ReasonOnLatestRevision, Message: "latest ControllerRevision: things.example.com-abc"}
	// What upstream v4.17.2 wrote: no lastTransitionTime, reason and message.
	upstreamForm := map[string]any{"type": "Updated", "status": "True", "reason": "OnLatestRevision", "message": "latest ControllerRevision: things.example.com-abc"}
	ready := map[string]any{"type": "Ready", "status": "True"}
	cases := []struct {
		reason string
		status map[string]any
		cond   Condition
		want   map[string]any
	}{
		{
			reason: "appended in upstream's form, the hook's fields kept",
			status: map[string]any{"replicas": 3},
			cond:   onLatest,
			want:   map[string]any{"replicas": 3, "conditions": []any{upstreamForm}},
		},
		{
			reason: "the hook's own Updated condition is replaced in place (upstream's SetCondition), its others kept in order",
			status: map[string]any{"conditions": []any{map[string]any{"type": "Updated", "status": "x", "lastTransitionTime": "t"}, ready}},
			cond:   onLatest,
			want:   map[string]any{"conditions": []any{upstreamForm, ready}},
		},
		{
			reason: "empty reason and message are left out, as upstream does",
			status: nil,
			cond:   Condition{Type: ConditionUpdated, Status: "False"},
			want:   map[string]any{"conditions": []any{map[string]any{"type": "Updated", "status": "False"}}},
		},
	}
	for _, tc := range cases {
		t.Run(tc.reason, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, WithCondition(tc.status, tc.cond)); diff != "" {
				t.Errorf("status (-want +got):\n%s", diff)
			}
		})
	}
}

// TestUpdatedConditionStable: the status of a parent on the latest revision
// is the same at every sync, and the same as upstream left it, so neither a
// steady parent nor one metabus takes over from upstream is rewritten (the
// applier writes a status only when it differs).
func TestUpdatedConditionStable(t *testing.T) {
	in := Input{Latest: "things.example.com-abc", Children: []Child{on("things.example.com-abc", "web-0", pod("web-0", "Ready=True"), true)}}
	hookStatus := func() map[string]any { return map[string]any{"replicas": int64(1)} }
	first := WithCondition(hookStatus(), Decide(in).Condition)
	second := WithCondition(hookStatus(), Decide(in).Condition)
	if diff := cmp.Diff(first, second); diff != "" {
		t.Errorf("two syncs of an unchanged rollout differ (-first +second):\n%s", diff)
	}
	upstream := map[string]any{"replicas": int64(1), "conditions": []any{map[string]any{
		"type": "Updated", "status": "True", "reason": "OnLatestRevision", "message": "latest ControllerRevision: things.example.com-abc",
	}}}
	if diff := cmp.Diff(upstream, first); diff != "" {
		t.Errorf("status differs from upstream's (-upstream +metabus):\n%s", diff)
	}
}
