package rollout

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"

	"github.com/metabus/metabus/pkg/api/v1alpha1"
	"github.com/metabus/metabus/pkg/apply"
	"github.com/metabus/metabus/pkg/children"
	"github.com/metabus/metabus/pkg/revision"
)

var stepOwner = children.Owner{
	APIVersion: "ctl.example.com/v1", Kind: "CatSet", Namespace: "ns", Name: "web", UID: "parent-uid",
	Namespaced: true, Selector: labels.SelectorFromSet(labels.Set{"app": "web"}),
}

var stepParent = revision.Parent{Resource: "catsets", Group: "ctl.example.com", UID: "parent-uid", Namespace: "ns"}

func stepRules(method v1alpha1.ChildUpdateMethod) []children.Rule {
	return []children.Rule{
		{APIVersion: "v1", Resource: "pods", Kind: "Pod", Namespaced: true, Method: method},
		{APIVersion: "v1", Resource: "configmaps", Kind: "ConfigMap", Namespaced: true, Method: v1alpha1.ChildUpdateInPlace},
	}
}

func patchFor(image string) map[string]any {
	return map[string]any{"spec": map[string]any{"template": map[string]any{"image": image}}}
}

// desiredPods renders what a CatSet hook returns: n Pods of image, plus a ConfigMap naming it.
func desiredPods(t *testing.T, rules []children.Rule, image string, n int) []children.Desired {
	t.Helper()
	var objs []*unstructured.Unstructured
	for i := range n {
		objs = append(objs, &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "v1", "kind": "Pod",
			"metadata": map[string]any{"name": fmt.Sprintf("web-%d", i), "labels": map[string]any{"app": "web"}},
			"spec":     map[string]any{"containers": []any{map[string]any{"name": "main", "image": image}}},
		}})
	}
	objs = append(objs, &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "v1", "kind": "ConfigMap",
		"metadata": map[string]any{"name": "web-config", "labels": map[string]any{"app": "web"}},
		"data":     map[string]any{"image": image},
	}})
	d, err := children.Normalize(stepOwner, rules, objs)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// world describes the cluster before a step: pods by name ("v1", "v2", "v2!" = not Ready,
// "" = absent), and which revision image each pod is recorded on.
type world struct {
	pods   map[string]string
	onRev  map[string]string // pod → image of the revision holding it; absent = untracked
	parent string            // the parent's current image
	empty  string            // image of a stored revision that holds no pods any more
	n      int               // replicas
}

func (w world) build(t *testing.T, rules []children.Rule) (*revision.History, map[int][]*unstructured.Unstructured, map[string]string) {
	t.Helper()
	// Persist revisions: one per image that holds pods.
	byImage := map[string][]string{}
	if w.empty != "" {
		byImage[w.empty] = nil
	}
	for pod, img := range w.onRev {
		byImage[img] = append(byImage[img], pod)
	}
	var stored []v1alpha1.ControllerRevision
	names := map[string]string{} // image → revision name
	for _, img := range slices.Sorted(func(yield func(string) bool) {
		for k := range byImage {
			if !yield(k) {
				return
			}
		}
	}) {
		h, err := revision.NewHistory(stepParent, nil, patchFor(img))
		if err != nil {
			t.Fatal(err)
		}
		var refs []revision.ChildRef
		for _, p := range byImage[img] {
			refs = append(refs, revision.RefOf("v1", "Pod", p))
		}
		h.Track(refs)
		creates, _, _ := h.Changes()
		creates[0].ResourceVersion = "7"
		stored = append(stored, creates[0])
		names[img] = creates[0].Name
	}
	h, err := revision.NewHistory(stepParent, stored, patchFor(w.parent))
	if err != nil {
		t.Fatal(err)
	}
	names[w.parent] = h.Latest()

	observed := map[int][]*unstructured.Unstructured{}
	for pod, state := range w.pods {
		if state == "" {
			continue
		}
		img, notReady := strings.CutSuffix(state, "!")
		var one []children.Desired
		for _, d := range desiredPods(t, rules, img, w.n+5) {
			if d.Object.GetName() == pod {
				one = append(one, d)
			}
		}
		actions, err := children.Plan(stepOwner, rules, nil, one)
		if err != nil || len(actions) != 1 {
			t.Fatalf("create %s: %v %v", pod, actions, err)
		}
		obj := actions[0].Object.DeepCopy()
		obj.SetUID(types.UID("uid-" + pod))
		obj.SetResourceVersion("9")
		ready := "True"
		if notReady {
			ready = "False"
		}
		obj.Object["status"] = map[string]any{"conditions": []any{map[string]any{"type": "Ready", "status": ready}}}
		observed[0] = append(observed[0], obj)
	}
	return h, observed, names
}

func TestStep(t *testing.T) {
	cases := []struct {
		reason   string
		method   v1alpha1.ChildUpdateMethod
		w        world
		noOlder  bool // leave out the older revisions' renderings
		wantErr  string
		wantMove string
		// wantActions are "Op name[:image]" in plan order; images of updates and creates.
		wantActions []string
		wantReason  string
		// wantOn maps pods to the image of the revision they are on after the step.
		wantOn map[string]string
	}{
		{
			reason: "a template change moves the first child in hook order and recreates only it",
			method: v1alpha1.ChildUpdateRollingRecreate,
			w: world{n: 3, parent: "v2", pods: map[string]string{"web-0": "v1", "web-1": "v1", "web-2": "v1"},
				onRev: map[string]string{"web-0": "v1", "web-1": "v1", "web-2": "v1"}},
			wantMove: "web-0", wantActions: []string{"Delete web-0", "Create ConfigMap web-config"},
			wantReason: ReasonRolloutProgressing,
			wantOn:     map[string]string{"web-0": "v2", "web-1": "v1", "web-2": "v1"},
		},
		{
			reason: "the moved child, deleted by its Recreate, is created at the latest revision; nothing else moves meanwhile",
			method: v1alpha1.ChildUpdateRollingRecreate,
			w: world{n: 3, parent: "v2", pods: map[string]string{"web-1": "v1", "web-2": "v1"},
				onRev: map[string]string{"web-0": "v2", "web-1": "v1", "web-2": "v1"}},
			wantActions: []string{"Create web-0:v2", "Create ConfigMap web-config"},
			wantReason:  ReasonRolloutProgressing,
			wantOn:      map[string]string{"web-0": "v2", "web-1": "v1", "web-2": "v1"},
		},
		{
			reason: "an updated child that is not Ready pauses the rollout",
			method: v1alpha1.ChildUpdateRollingRecreate,
			w: world{n: 3, parent: "v2", pods: map[string]string{"web-0": "v2!", "web-1": "v1", "web-2": "v1"},
				onRev: map[string]string{"web-0": "v2", "web-1": "v1", "web-2": "v1"}},
			wantActions: []string{"Create ConfigMap web-config"},
			wantReason:  ReasonRolloutWaiting,
			wantOn:      map[string]string{"web-0": "v2", "web-1": "v1", "web-2": "v1"},
		},
		{
			reason: "once the updated child is Ready the next one moves",
			method: v1alpha1.ChildUpdateRollingRecreate,
			w: world{n: 3, parent: "v2", pods: map[string]string{"web-0": "v2", "web-1": "v1", "web-2": "v1"},
				onRev: map[string]string{"web-0": "v2", "web-1": "v1", "web-2": "v1"}},
			wantMove: "web-1", wantActions: []string{"Delete web-1", "Create ConfigMap web-config"},
			wantReason: ReasonRolloutProgressing,
			wantOn:     map[string]string{"web-0": "v2", "web-1": "v2", "web-2": "v1"},
		},
		{
			reason: "a child deleted before its turn comes back at its own (old) revision, not the latest",
			method: v1alpha1.ChildUpdateRollingRecreate,
			w: world{n: 3, parent: "v2", pods: map[string]string{"web-0": "v2", "web-1": "v1"},
				onRev: map[string]string{"web-0": "v2", "web-1": "v1", "web-2": "v1"}},
			wantMove: "web-1", wantActions: []string{"Delete web-1", "Create web-2:v1", "Create ConfigMap web-config"},
			wantReason: ReasonRolloutProgressing,
			wantOn:     map[string]string{"web-0": "v2", "web-1": "v2", "web-2": "v1"},
		},
		{
			reason: "scaling up mid-rollout starts new children at the latest revision",
			method: v1alpha1.ChildUpdateRollingRecreate,
			w: world{n: 4, parent: "v2", pods: map[string]string{"web-0": "v2!", "web-1": "v1", "web-2": "v1"},
				onRev: map[string]string{"web-0": "v2", "web-1": "v1", "web-2": "v1"}},
			wantActions: []string{"Create web-3:v2", "Create ConfigMap web-config"},
			wantReason:  ReasonRolloutWaiting,
			wantOn:      map[string]string{"web-0": "v2", "web-1": "v1", "web-2": "v1", "web-3": "v2"},
		},
		{
			reason: "scaling down mid-rollout forgets the removed child and deletes it",
			method: v1alpha1.ChildUpdateRollingRecreate,
			w: world{n: 2, parent: "v2", pods: map[string]string{"web-0": "v2", "web-1": "v1", "web-2": "v1"},
				onRev: map[string]string{"web-0": "v2", "web-1": "v1", "web-2": "v1"}},
			wantMove: "web-1", wantActions: []string{"Delete web-1", "Delete web-2", "Create ConfigMap web-config"},
			wantReason: ReasonRolloutProgressing,
			wantOn:     map[string]string{"web-0": "v2", "web-1": "v2"},
		},
		{
			reason: "RollingInPlace updates the moved child instead of deleting it",
			method: v1alpha1.ChildUpdateRollingInPlace,
			w: world{n: 2, parent: "v2", pods: map[string]string{"web-0": "v1", "web-1": "v1"},
				onRev: map[string]string{"web-0": "v1", "web-1": "v1"}},
			wantMove: "web-0", wantActions: []string{"Create ConfigMap web-config", "Update web-0:v2"},
			wantReason: ReasonRolloutProgressing,
			wantOn:     map[string]string{"web-0": "v2", "web-1": "v1"},
		},
		{
			reason: "every child on the latest revision and Ready: done, and the empty old revision is pruned",
			method: v1alpha1.ChildUpdateRollingRecreate,
			w: world{n: 2, parent: "v2", empty: "v1", pods: map[string]string{"web-0": "v2", "web-1": "v2"},
				onRev: map[string]string{"web-0": "v2", "web-1": "v2"}},
			wantActions: []string{"Create ConfigMap web-config"},
			wantReason:  ReasonOnLatestRevision,
			wantOn:      map[string]string{"web-0": "v2", "web-1": "v2"},
		},
		{
			reason:      "the first sync of a new parent tracks every child at the one revision",
			method:      v1alpha1.ChildUpdateRollingRecreate,
			w:           world{n: 2, parent: "v1", pods: map[string]string{}},
			wantActions: []string{"Create web-0:v1", "Create web-1:v1", "Create ConfigMap web-config"},
			wantReason:  ReasonRolloutProgressing,
			wantOn:      map[string]string{"web-0": "v1", "web-1": "v1"},
		},
		{
			reason: "an older revision the hook did not render fails the step before anything is planned",
			method: v1alpha1.ChildUpdateRollingRecreate,
			w: world{n: 2, parent: "v2", pods: map[string]string{"web-0": "v1", "web-1": "v1"},
				onRev: map[string]string{"web-0": "v1", "web-1": "v1"}},
			noOlder: true,
			wantErr: "no hook result for revision",
		},
	}
	for _, tc := range cases {
		t.Run(tc.reason, func(t *testing.T) {
			rules := stepRules(tc.method)
			h, observed, names := tc.w.build(t, rules)
			older := map[string][]children.Desired{}
			if !tc.noOlder {
				for img, name := range names {
					if name != h.Latest() {
						older[name] = desiredPods(t, rules, img, tc.w.n)
					}
				}
			}
			res, err := Step(StepInput{
				Owner: stepOwner, Rules: rules, Checks: [][]v1alpha1.StatusConditionCheck{readyTrue, nil},
				History: h, Latest: desiredPods(t, rules, tc.w.parent, tc.w.n), Older: older, Observed: observed,
			})
			if tc.wantErr != "" {
				var missing *MissingRevisionsError
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) || !errors.As(err, &missing) {
					t.Fatalf("error %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil || res.ChildErrors != nil {
				t.Fatalf("Step: %v / %v", err, res.ChildErrors)
			}
			var got []string
			for _, a := range res.Actions {
				s := string(a.Op) + " " + a.Object.GetName()
				if a.Rule.Kind != "Pod" {
					s = string(a.Op) + " " + a.Rule.Kind + " " + a.Object.GetName()
				} else if a.Op != children.OpDelete {
					s += ":" + podImage(a.Object)
				}
				got = append(got, s)
			}
			if !slices.Equal(got, tc.wantActions) {
				t.Errorf("actions %q, want %q", got, tc.wantActions)
			}
			move := ""
			if res.Plan.Move != nil {
				move = res.Plan.Move.Name
			}
			if move != tc.wantMove {
				t.Errorf("moved %q, want %q", move, tc.wantMove)
			}
			if res.Plan.Condition.Reason != tc.wantReason {
				t.Errorf("condition %+v, want reason %s", res.Plan.Condition, tc.wantReason)
			}
			imageOf := map[string]string{}
			for img, name := range names {
				imageOf[name] = img
			}
			on := map[string]string{}
			for pod := range tc.wantOn {
				on[pod] = imageOf[h.RevisionOf("", "Pod", pod)]
			}
			for pod, img := range tc.wantOn {
				if on[pod] != img {
					t.Errorf("%s on revision of %s, want %s (all: %v)", pod, on[pod], img, on)
				}
			}
			// What is persisted must agree: only the latest survives once nothing is on older ones.
			creates, updates, deletes := h.Changes()
			if tc.wantReason == ReasonOnLatestRevision && (len(deletes) != 1 || len(creates)+len(updates) != 0) {
				t.Errorf("changes: %d creates, %d updates, %d deletes; want the old revision deleted", len(creates), len(updates), len(deletes))
			}
		})
	}
}

func podImage(o *unstructured.Unstructured) string {
	cs, _, _ := unstructured.NestedSlice(o.Object, "spec", "containers")
	if len(cs) == 0 {
		return ""
	}
	img, _ := cs[0].(map[string]any)["image"].(string)
	return img
}

// TestStepServerSideApply: with server-side apply, a child whose values
// are the latest revision's is on it, although its apply (or a Recreate's
// dry run) may still be planned to settle field ownership; a changed one
// still moves one at a time, its deletion confirmed by a dry run.
func TestStepServerSideApply(t *testing.T) {
	cases := []struct {
		reason      string
		w           world
		wantActions []string
		wantReason  string
	}{
		{
			reason: "every child has the latest values: done, whatever ownership is left to settle",
			w: world{n: 2, parent: "v2", pods: map[string]string{"web-0": "v2", "web-1": "v2"},
				onRev: map[string]string{"web-0": "v2", "web-1": "v2"}},
			wantActions: []string{"Delete web-0 verify settled", "Delete web-1 verify settled", "Apply ConfigMap web-config"},
			wantReason:  ReasonOnLatestRevision,
		},
		{
			reason: "a template change moves the first child; its deletion waits for the dry run",
			w: world{n: 2, parent: "v2", pods: map[string]string{"web-0": "v1", "web-1": "v1"},
				onRev: map[string]string{"web-0": "v1", "web-1": "v1"}},
			wantActions: []string{"Delete web-0 verify", "Delete web-1 verify settled", "Apply ConfigMap web-config"},
			wantReason:  ReasonRolloutProgressing,
		},
	}
	for _, tc := range cases {
		t.Run(tc.reason, func(t *testing.T) {
			rules := stepRules(v1alpha1.ChildUpdateRollingRecreate)
			h, observed, names := tc.w.build(t, rules)
			older := map[string][]children.Desired{}
			for img, name := range names {
				if name != h.Latest() {
					older[name] = desiredPods(t, rules, img, tc.w.n)
				}
			}
			res, err := Step(StepInput{
				Owner: stepOwner, Rules: rules, Checks: [][]v1alpha1.StatusConditionCheck{readyTrue, nil},
				History: h, Latest: desiredPods(t, rules, tc.w.parent, tc.w.n), Older: older, Observed: observed,
				Apply: children.Options{Strategy: apply.ServerSideApply},
			})
			if err != nil || res.ChildErrors != nil {
				t.Fatalf("Step: %v / %v", err, res.ChildErrors)
			}
			var got []string
			for _, a := range res.Actions {
				s := string(a.Op) + " " + a.Object.GetName()
				if a.Rule.Kind != "Pod" {
					s = string(a.Op) + " " + a.Rule.Kind + " " + a.Object.GetName()
				}
				if a.Verify != nil {
					s += " verify"
				}
				if a.Settled {
					s += " settled"
				}
				got = append(got, s)
			}
			if !slices.Equal(got, tc.wantActions) {
				t.Errorf("actions %q, want %q", got, tc.wantActions)
			}
			if res.Plan.Condition.Reason != tc.wantReason {
				t.Errorf("condition %+v, want reason %s", res.Plan.Condition, tc.wantReason)
			}
		})
	}
}
