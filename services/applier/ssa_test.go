package applier

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"

	"github.com/google/go-cmp/cmp"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/metabus/metabus/pkg/apply"
	"github.com/metabus/metabus/pkg/bus"
	"github.com/metabus/metabus/pkg/children"
	"github.com/metabus/metabus/pkg/kinds"
	"github.com/metabus/metabus/pkg/snapshot"
)

// methodController is a CompositeController of things with ConfigMap
// children updated by method.
func methodController(method string) *unstructured.Unstructured {
	cc := compositeController(false)
	cc.Object["spec"].(map[string]any)["childResources"] = []any{map[string]any{
		"apiVersion": "v1", "resource": "configmaps", "updateStrategy": map[string]any{"method": method}}}
	cc.SetUID(types.UID("cc-uid-" + method)) // decoded controllers are cached by UID and resourceVersion
	return cc
}

// ssaServer answers the applier's server-side applies on configmaps the
// way the API server does, for what these tests need: an apply stores its
// configuration's data (dry run: answers without storing), and reports
// the resourceVersion: the same when the data is unchanged, else the next.
// It records each apply's body and options.
type ssaServer struct {
	objs    map[string]*unstructured.Unstructured
	applies []recordedApply
}

type recordedApply struct {
	name   string
	body   map[string]any
	opts   metav1.PatchOptions
	dryRun bool
}

func (s *ssaServer) install(dyn *dynamicfake.FakeDynamicClient) {
	// A create stores the object with a UID and a resourceVersion, or
	// finds the name taken.
	dyn.PrependReactor("create", "configmaps", func(act k8stesting.Action) (bool, runtime.Object, error) {
		obj := act.(k8stesting.CreateAction).GetObject().(*unstructured.Unstructured).DeepCopy()
		if _, taken := s.objs[obj.GetName()]; taken {
			return true, nil, apierrors.NewAlreadyExists(schema.GroupResource{Resource: "configmaps"}, obj.GetName())
		}
		obj.SetUID(types.UID("uid-" + obj.GetName()))
		obj.SetResourceVersion("1")
		s.objs[obj.GetName()] = obj
		return true, obj, nil
	})
	dyn.PrependReactor("patch", "configmaps", func(act k8stesting.Action) (bool, runtime.Object, error) {
		p := act.(k8stesting.PatchActionImpl)
		if p.GetPatchType() == types.MergePatchType {
			// Dropping the last-applied annotation: a write, the next
			// resourceVersion.
			cur := s.objs[p.GetName()].DeepCopy()
			cur.SetAnnotations(nil)
			cur.SetResourceVersion("6")
			s.objs[p.GetName()] = cur
			return true, cur, nil
		}
		if p.GetPatchType() != types.ApplyPatchType {
			return false, nil, nil
		}
		var body map[string]any
		if err := json.Unmarshal(p.GetPatch(), &body); err != nil {
			return true, nil, err
		}
		dry := len(p.PatchOptions.DryRun) > 0
		s.applies = append(s.applies, recordedApply{name: p.GetName(), body: body, opts: p.PatchOptions, dryRun: dry})
		cur := s.objs[p.GetName()]
		cfg := &unstructured.Unstructured{Object: body}
		if cur != nil && cfg.GetResourceVersion() != "" && cfg.GetResourceVersion() != cur.GetResourceVersion() {
			return true, nil, apierrors.NewConflict(schema.GroupResource{Resource: "configmaps"}, p.GetName(), fmt.Errorf("changed"))
		}
		out := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "v1", "kind": "ConfigMap",
			"metadata": map[string]any{"name": p.GetName(), "namespace": "ns", "uid": "uid-" + p.GetName(), "resourceVersion": "1"}}}
		if cur != nil {
			out = cur.DeepCopy()
		}
		if !apply.Settled(out.Object, withoutPreconditions(body)) {
			out.Object["data"] = body["data"]
			out.SetResourceVersion(fmt.Sprint(len(s.applies) + 100))
		}
		if !dry {
			s.objs[p.GetName()] = out
		}
		return true, out, nil
	})
}

func withoutPreconditions(body map[string]any) map[string]any {
	out := map[string]any{}
	for k, v := range body {
		out[k] = v
	}
	meta := map[string]any{}
	for k, v := range body["metadata"].(map[string]any) {
		if k != "uid" && k != "resourceVersion" {
			meta[k] = v
		}
	}
	out["metadata"] = meta
	return out
}

// TestApplyParentServerSideApply: with --apply-strategy=server-side-apply
// children are created and updated with applies (field manager, force,
// the observed UID and resourceVersion as preconditions), a no-op sync
// makes no call once the applier knows it owns the child's fields,
// dynamic apply's annotation is dropped before an InPlace apply, and a
// Recreate child is deleted only when the dry run of its apply changes it.
func TestApplyParentServerSideApply(t *testing.T) {
	group := func(objs ...*unstructured.Unstructured) []snapshot.Group {
		return []snapshot.Group{{APIVersion: "v1", Resource: "configmaps", Kind: "ConfigMap", Namespaced: true, Objects: objs}}
	}
	changed := func(o *unstructured.Unstructured) { o.Object["data"] = map[string]any{"k": "old"} }
	legacy := func(o *unstructured.Unstructured) {
		o.SetAnnotations(map[string]string{apply.LastAppliedAnnotation: `{"data":{"k":"v"}}`})
	}
	type sync struct {
		want      string
		wantCalls []string
		// wantApplies are "name dry|apply uid@rv" of each apply patch sent.
		wantApplies []string
	}
	tests := []struct {
		reason   string
		method   string
		children []snapshot.Group
		// syncs are applied in turn with the same desired state and
		// snapshot, as the same applier would see them at a resync.
		syncs []sync
	}{
		{
			reason: "a new child is created by a create, never an apply (which would merge into an object of that name); the next sync applies nothing",
			method: "InPlace", children: group(),
			syncs: []sync{
				{want: resultOK, wantCalls: []string{"create configmaps a"}},
				{want: resultNoop},
			},
		},
		{
			reason: "an InPlace child with the desired values: one apply to own them, then nothing at all",
			method: "InPlace", children: group(configMap("a", true)),
			syncs: []sync{
				{want: resultOK, wantCalls: []string{"patch configmaps a"}, wantApplies: []string{"a apply uid-a@5"}},
				{want: resultNoop},
			},
		},
		{
			reason: "a changed InPlace child is applied with its UID and resourceVersion as preconditions",
			method: "InPlace", children: group(configMap("a", true, changed)),
			syncs: []sync{{want: resultOK, wantCalls: []string{"patch configmaps a"}, wantApplies: []string{"a apply uid-a@5"}}},
		},
		{
			reason: "an InPlace child dynamic apply wrote loses the annotation first, then the apply is made against the new version",
			method: "InPlace", children: group(configMap("a", true, legacy)),
			syncs: []sync{{want: resultOK, wantCalls: []string{"patch configmaps a", "patch configmaps a"}, wantApplies: []string{"a apply uid-a@6"}}},
		},
		{
			reason: "a changed Recreate child: the dry run confirms, then the child is deleted",
			method: "Recreate", children: group(configMap("a", true, changed)),
			syncs: []sync{{want: resultOK, wantCalls: []string{"patch configmaps a", "delete configmaps a"}, wantApplies: []string{"a dry uid-a@5"}}},
		},
		{
			reason: "a Recreate child with the desired values is never deleted: one dry run, then nothing at all",
			method: "Recreate", children: group(configMap("a", true, legacy)),
			syncs: []sync{
				{want: resultOK, wantCalls: []string{"patch configmaps a"}, wantApplies: []string{"a dry uid-a@5"}},
				{want: resultNoop},
			},
		},
		{
			reason: "an OnDelete child is never applied",
			method: "OnDelete", children: group(configMap("a", true, changed)),
			syncs: []sync{{want: resultNoop}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.reason, func(t *testing.T) {
			objs := []runtime.Object{thing()}
			srv := &ssaServer{objs: map[string]*unstructured.Unstructured{}}
			for _, g := range tt.children {
				for _, o := range g.Objects {
					objs = append(objs, o.DeepCopy())
					srv.objs[o.GetName()] = o.DeepCopy()
				}
			}
			a, dyn := testApplier(t, objs...)
			a.cfg.Strategy, a.cfg.FieldManager = apply.ServerSideApply, "mc-test"
			srv.install(dyn)
			cc := methodController(tt.method)
			for i, s := range tt.syncs {
				dyn.ClearActions()
				srv.applies = nil
				ds := bus.DesiredState{Hook: "sync", Children: []*unstructured.Unstructured{desiredCM("a")}, Status: map[string]any{"ready": float64(1)}}
				ds.Controller = bus.ControllerRef{Kind: cc.GetKind(), Name: cc.GetName(), UID: string(cc.GetUID())}
				ds.Parent = bus.ObjectRef{APIVersion: "example.com/v1", Kind: "Thing", Resource: "things", Namespace: "ns", Name: "web", UID: "p-uid", Generation: 2}
				snap := &snapshot.Response{Result: snapshot.OK, Controller: cc, Parent: thing(), ParentResource: "things", Children: tt.children}
				got := outcome(a.applyParent(context.Background(), &ds, snap))
				if diff := cmp.Diff(s.want, got); diff != "" {
					t.Errorf("sync %d: outcome (-want +got):\n%s", i, diff)
				}
				if diff := cmp.Diff(s.wantCalls, calls(dyn)); diff != "" {
					t.Errorf("sync %d: API calls (-want +got):\n%s", i, diff)
				}
				var applies []string
				for _, ap := range srv.applies {
					kind := "apply"
					if ap.dryRun {
						kind = "dry"
					}
					pre := &unstructured.Unstructured{Object: ap.body}
					applies = append(applies, fmt.Sprintf("%s %s %s@%s", ap.name, kind, pre.GetUID(), pre.GetResourceVersion()))
					if ap.opts.FieldManager != "mc-test" || ap.opts.Force == nil || !*ap.opts.Force {
						t.Errorf("apply options %+v: want field manager mc-test, force", ap.opts)
					}
					if _, ok := pre.GetAnnotations()[apply.LastAppliedAnnotation]; ok || ap.body["status"] != nil {
						t.Errorf("apply sends dynamic apply's annotation or a status: %v", ap.body)
					}
					if refs := pre.GetOwnerReferences(); len(refs) != 1 || refs[0].UID != "p-uid" || refs[0].Controller == nil || !*refs[0].Controller {
						t.Errorf("apply lacks the controller reference: %v", refs)
					}
				}
				if diff := cmp.Diff(s.wantApplies, applies); diff != "" {
					t.Errorf("sync %d: applies (-want +got):\n%s", i, diff)
				}
				for _, act := range dyn.Actions() {
					if c, ok := act.(k8stesting.CreateActionImpl); ok && c.CreateOptions.FieldManager != "mc-test" {
						t.Errorf("create options %+v: want field manager mc-test", c.CreateOptions)
					}
				}
				// The next sync observes what this one left (a created
				// child as the fake stored it).
				if created, ok := srv.objs["a"]; ok && len(tt.children[0].Objects) == 0 {
					tt.children[0].Objects = append(tt.children[0].Objects, created.DeepCopy())
				}
				for gi := range tt.children {
					for oi, o := range tt.children[gi].Objects {
						if cur, ok := srv.objs[o.GetName()]; ok {
							tt.children[gi].Objects[oi] = cur.DeepCopy()
						}
					}
				}
			}
		})
	}
}

// TestDropLastAppliedPatch: the annotation goes with a merge patch that
// carries the observed resourceVersion (a child changed since is a
// conflict, not a blind write).
func TestDropLastAppliedPatch(t *testing.T) {
	cm := configMap("a", true, func(o *unstructured.Unstructured) {
		o.SetAnnotations(map[string]string{apply.LastAppliedAnnotation: "{}", "keep": "me"})
	})
	a, dyn := testApplier(t, cm.DeepCopy())
	var patch map[string]any
	dyn.PrependReactor("patch", "configmaps", func(act k8stesting.Action) (bool, runtime.Object, error) {
		_ = json.Unmarshal(act.(k8stesting.PatchActionImpl).GetPatch(), &patch)
		return false, nil, nil
	})
	rule := methodRule()
	c, err := a.client(context.Background(), &rule, "ns")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.dropLastApplied(context.Background(), c, &rule, cm); err != nil {
		t.Fatal(err)
	}
	want := map[string]any{"metadata": map[string]any{"resourceVersion": "5", "annotations": map[string]any{apply.LastAppliedAnnotation: nil}}}
	if diff := cmp.Diff(want, patch); diff != "" {
		t.Errorf("patch (-want +got):\n%s", diff)
	}
}

// TestPlanOptions: the strategy applies to the kinds that can take it;
// a kind built on the last-applied annotation stays on dynamic apply.
func TestPlanOptions(t *testing.T) {
	a := &Applier{cfg: Config{Strategy: apply.ServerSideApply}}
	if got := a.planOptions(kinds.ApplyChildRules{}).Strategy; got != apply.ServerSideApply {
		t.Errorf("composite/decorator strategy %q", got)
	}
	if got := a.planOptions(kinds.ApplyChildRules{DynamicApplyOnly: true}).Strategy; got != apply.DynamicApply {
		t.Errorf("a DynamicApplyOnly kind gets %q", got)
	}
}

func methodRule() children.Rule {
	return children.Rule{APIVersion: "v1", Resource: "configmaps", Kind: "ConfigMap", Namespaced: true, Method: "InPlace"}
}
