package rollout

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/metabus/metabus/pkg/api/v1alpha1"
	"github.com/metabus/metabus/pkg/children"
	"github.com/metabus/metabus/pkg/revision"
)

// cluster is a toy CatSet parent with RollingRecreate Pods, driven by package revision and
// Decide the way the services are meant to: one sync() is one hook call plus its writes.
type cluster struct {
	t         *testing.T
	replicas  int
	image     string // the parent's spec.template.image
	healthy   bool   // whether pods of new images become Ready
	pods      map[string]*fakePod
	revisions []v1alpha1.ControllerRevision
}

type fakePod struct {
	image string
	ready bool
}

var fieldPaths = []string{"spec.template"}

func (c *cluster) sync() Plan {
	t := c.t
	parent := map[string]any{"spec": map[string]any{"replicas": int64(c.replicas), "template": map[string]any{"image": c.image}}}
	patch, err := revision.ParentPatch(parent, fieldPaths)
	if err != nil {
		t.Fatal(err)
	}
	h, err := revision.NewHistory(revision.Parent{Resource: "catsets", Group: "ctl.example.com", UID: "uid-1", Namespace: "ns"}, c.revisions, patch)
	if err != nil {
		t.Fatal(err)
	}
	// The hook as of the latest revision decides which children exist, in which order.
	names := hook(parent)
	var refs []revision.ChildRef
	for _, n := range names {
		refs = append(refs, revision.RefOf("v1", "Pod", n))
	}
	h.Track(refs)
	// The hook as of each revision renders that revision's children.
	imageOf := map[string]string{}
	for _, r := range h.Revisions() {
		asOf, err := revision.ApplyPatch(parent, r.Patch, fieldPaths)
		if err != nil {
			t.Fatal(err)
		}
		imageOf[r.Name] = asOf["spec"].(map[string]any)["template"].(map[string]any)["image"].(string)
	}
	latest := h.Latest()
	in := Input{Latest: latest}
	for _, n := range names {
		p := c.pods[n]
		in.Children = append(in.Children, Child{
			Key: children.ChildKey{APIVersion: "v1", Kind: "Pod", Namespace: "ns", Name: n}, Method: v1alpha1.ChildUpdateRollingRecreate,
			Checks: readyTrue, Observed: p.object(n), Revision: h.RevisionOf("", "Pod", n), Matches: p != nil && p.image == imageOf[latest],
		})
	}
	plan := Decide(in)
	if plan.Move != nil {
		if err := h.Move(revision.RefOf(plan.Move.APIVersion, plan.Move.Kind, plan.Move.Name), latest); err != nil {
			t.Fatal(err)
		}
	}
	h.Prune()
	// Persist the history before touching any child.
	create, update, del := h.Changes()
	byName := map[string]v1alpha1.ControllerRevision{}
	for _, set := range [][]v1alpha1.ControllerRevision{c.revisions, create, update} {
		for _, r := range set {
			byName[r.Name] = r
		}
	}
	for _, r := range del {
		delete(byName, r.Name)
	}
	c.revisions = slices.Collect(maps.Values(byName))
	// Converge the children: RollingRecreate deletes a child that differs from its revision's
	// desired state; the next sync creates it again.
	for _, n := range names {
		want := imageOf[h.RevisionOf("", "Pod", n)]
		switch p := c.pods[n]; {
		case p == nil:
			c.pods[n] = &fakePod{image: want}
		case p.image != want:
			delete(c.pods, n)
		}
	}
	for n := range c.pods {
		if !slices.Contains(names, n) {
			delete(c.pods, n)
		}
	}
	// The kubelet: pods of the first image always start; later images only when healthy.
	for _, p := range c.pods {
		p.ready = p.ready || p.image == "v1" || c.healthy
	}
	return plan
}

func hook(parent map[string]any) []string {
	n := parent["spec"].(map[string]any)["replicas"].(int64)
	var names []string
	for i := range n {
		names = append(names, fmt.Sprintf("web-%d", i))
	}
	return names
}

func (p *fakePod) object(name string) *unstructured.Unstructured {
	if p == nil {
		return nil
	}
	status := metav1.ConditionFalse
	if p.ready {
		status = metav1.ConditionTrue
	}
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "v1", "kind": "Pod", "metadata": map[string]any{"name": name},
		"status": map[string]any{"conditions": []any{map[string]any{"type": "Ready", "status": string(status)}}},
	}}
}

// state renders the pods as "web-0:v1 web-1:v2!" (! = not Ready).
func (c *cluster) state() string {
	var out []string
	for _, n := range slices.Sorted(maps.Keys(c.pods)) {
		s := n + ":" + c.pods[n].image
		if !c.pods[n].ready {
			s += "!"
		}
		out = append(out, s)
	}
	return strings.Join(out, " ")
}

// TestRollingRecreateSimulation walks a parent through a whole rollout, one sync per step.
func TestRollingRecreateSimulation(t *testing.T) {
	c := &cluster{t: t, replicas: 3, image: "v1", pods: map[string]*fakePod{}}
	steps := []struct {
		reason        string
		before        func()
		wantMove      string
		wantReason    string
		wantPods      string // after the sync
		wantRevisions int
	}{
		{reason: "no history: the children are created on a new latest revision",
			wantReason: ReasonRolloutProgressing, wantPods: "web-0:v1 web-1:v1 web-2:v1", wantRevisions: 1},
		{reason: "steady state",
			wantReason: ReasonOnLatestRevision, wantPods: "web-0:v1 web-1:v1 web-2:v1", wantRevisions: 1},
		{reason: "a template change creates a revision and moves the first child, which is deleted",
			before:   func() { c.image = "v2" },
			wantMove: "web-0", wantReason: ReasonRolloutProgressing, wantPods: "web-1:v1 web-2:v1", wantRevisions: 2},
		{reason: "the moved child is recreated at the latest revision; nobody else moves meanwhile",
			wantReason: ReasonRolloutProgressing, wantPods: "web-0:v2! web-1:v1 web-2:v1", wantRevisions: 2},
		{reason: "the updated child is not Ready: the rollout pauses",
			wantReason: ReasonRolloutWaiting, wantPods: "web-0:v2! web-1:v1 web-2:v1", wantRevisions: 2},
		{reason: "and stays paused",
			wantReason: ReasonRolloutWaiting, wantPods: "web-0:v2! web-1:v1 web-2:v1", wantRevisions: 2},
		{reason: "once it is Ready the next child in hook order moves",
			before:   func() { c.healthy = true; c.pods["web-0"].ready = true },
			wantMove: "web-1", wantReason: ReasonRolloutProgressing, wantPods: "web-0:v2 web-2:v1", wantRevisions: 2},
		{reason: "a not-yet-updated child deleted mid-rollout comes back at its own revision",
			before:     func() { delete(c.pods, "web-2") },
			wantReason: ReasonRolloutProgressing, wantPods: "web-0:v2 web-1:v2 web-2:v1", wantRevisions: 2},
		{reason: "scaling up during the rollout: the new child starts at the latest revision, and is waited for",
			before:     func() { c.replicas = 4 },
			wantReason: ReasonRolloutProgressing, wantPods: "web-0:v2 web-1:v2 web-2:v1 web-3:v2", wantRevisions: 2},
		{reason: "the last old child moves; its emptied revision is pruned in the same sync",
			wantMove:   "web-2",
			wantReason: ReasonRolloutProgressing, wantPods: "web-0:v2 web-1:v2 web-3:v2", wantRevisions: 1},
		{reason: "the last child is recreated at the latest revision",
			wantReason: ReasonRolloutProgressing, wantPods: "web-0:v2 web-1:v2 web-2:v2 web-3:v2", wantRevisions: 1},
		{reason: "done",
			wantReason: ReasonOnLatestRevision, wantPods: "web-0:v2 web-1:v2 web-2:v2 web-3:v2", wantRevisions: 1},
		{reason: "scaling down after the rollout deletes the child and changes no revision",
			before:     func() { c.replicas = 2 },
			wantReason: ReasonOnLatestRevision, wantPods: "web-0:v2 web-1:v2", wantRevisions: 1},
	}
	for i, s := range steps {
		if s.before != nil {
			s.before()
		}
		plan := c.sync()
		move := ""
		if plan.Move != nil {
			move = plan.Move.Name
		}
		if move != s.wantMove || plan.Condition.Reason != s.wantReason || c.state() != s.wantPods || len(c.revisions) != s.wantRevisions {
			t.Fatalf("step %d (%s):\n got move %q, %s, pods %q, %d revisions (%s)\nwant move %q, %s, pods %q, %d revisions",
				i, s.reason, move, plan.Condition.Reason, c.state(), len(c.revisions), plan.Condition.Message,
				s.wantMove, s.wantReason, s.wantPods, s.wantRevisions)
		}
	}
}
