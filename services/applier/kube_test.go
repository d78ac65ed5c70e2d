package applier

import (
	"context"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/zap"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	"k8s.io/client-go/tools/record"

	"github.com/metabus/metabus/pkg/children"
	"github.com/metabus/metabus/pkg/composite"
	"github.com/metabus/metabus/pkg/events"
	"github.com/metabus/metabus/pkg/events/recorder"
)

// A create that finds the name taken is only an error when the object is not this parent's:
// two syncs of one parent in quick succession can both plan the create of a child, because the
// second one's snapshot did not show the first one's new child yet.
func TestCreateOfAChildThatAlreadyExists(t *testing.T) {
	owner := children.Owner{APIVersion: "example.com/v1", Kind: "Thing", Namespace: "ns", Name: "web", UID: "parent-uid", Namespaced: true}
	rule := &children.Rule{APIVersion: "v1", Resource: "configmaps", Kind: "ConfigMap", Namespaced: true}
	configMap := func(refs ...metav1.OwnerReference) *unstructured.Unstructured {
		o := &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "v1", "kind": "ConfigMap",
			"metadata": map[string]any{"name": "web-config", "namespace": "ns"},
			"data":     map[string]any{"k": "v"},
		}}
		o.SetOwnerReferences(refs)
		return o
	}
	ours := children.ControllerRef(owner)
	previousIncarnation := children.ControllerRef(owner)
	previousIncarnation.UID = "old-parent-uid"
	otherKind := children.ControllerRef(owner)
	otherKind.Kind = "OtherThing"
	notController := children.ControllerRef(owner)
	notController.Controller = nil
	someoneElse := metav1.OwnerReference{APIVersion: "apps/v1", Kind: "Deployment", Name: "x", UID: "other-uid", Controller: ptr(true)}
	notControlling := *someoneElse.DeepCopy()
	notControlling.Controller = nil
	const notOurs = "create ConfigMap ns/web-config: it already exists and is not controlled by this parent"

	tests := []struct {
		reason   string
		existing *unstructured.Unstructured // nil: the name is free
		wantErr  string
	}{
		{reason: "the name is free: created", existing: nil},
		{reason: "already created by this parent (not yet in the cache): not an error", existing: configMap(ours)},
		{reason: "this parent's among other, non-controller references: not an error", existing: configMap(notControlling, ours)},
		{reason: "controlled by someone else", existing: configMap(someoneElse), wantErr: notOurs},
		{reason: "controlled by a previous parent of the same name", existing: configMap(previousIncarnation), wantErr: notOurs},
		{reason: "the same UID under another kind", existing: configMap(otherKind), wantErr: notOurs},
		{reason: "referencing this parent, but not as controller", existing: configMap(notController), wantErr: notOurs},
		{reason: "an orphan", existing: configMap(), wantErr: notOurs},
	}
	for _, tt := range tests {
		t.Run(tt.reason, func(t *testing.T) {
			var objs []runtime.Object
			if tt.existing != nil {
				objs = append(objs, tt.existing.DeepCopy())
			}
			dyn := dynamicfake.NewSimpleDynamicClient(runtime.NewScheme(), objs...)
			a := &Applier{log: zap.NewNop(), dyn: dyn, metrics: newMetrics(nil)}
			acts, err := children.Plan(owner, []children.Rule{*rule}, nil, []children.Desired{{Rule: rule, Object: configMap()}})
			if err != nil || len(acts) != 1 || acts[0].Op != children.OpCreate {
				t.Fatalf("Plan = %v, %v; want one create", acts, err)
			}
			if diff := cmp.Diff(tt.wantErr, errString(a.write(context.Background(), acts[0]))); diff != "" {
				t.Errorf("write error (-want +got):\n%s", diff)
			}
			got, err := dyn.Resource(schema.GroupVersionResource{Version: "v1", Resource: "configmaps"}).Namespace("ns").Get(context.Background(), "web-config", metav1.GetOptions{})
			if err != nil {
				t.Fatalf("get the child: %v", err)
			}
			want := tt.existing
			if want == nil {
				want = acts[0].Object
			}
			if diff := cmp.Diff(want.GetOwnerReferences(), got.GetOwnerReferences()); diff != "" {
				t.Errorf("the child's owner references changed (-want +got):\n%s", diff)
			}
		})
	}
}

func ptr[T any](v T) *T { return &v }

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// TestAdoptReplacesEarlierIncarnation (issue #13, defect 17): adopting a
// child whose controller is an earlier parent of the same kind and name
// (its UID gone) replaces that controller reference: an object may have
// only one controller, and keeping the stale one would make the API
// server refuse the adoption forever.
func TestAdoptReplacesEarlierIncarnation(t *testing.T) {
	owner := children.Owner{APIVersion: "example.com/v1", Kind: "Thing", Namespace: "ns", Name: "web", UID: "new-uid", Namespaced: true}
	rule := &children.Rule{APIVersion: "v1", Resource: "configmaps", Kind: "ConfigMap", Namespaced: true}
	earlier := children.ControllerRef(owner)
	earlier.UID = "old-uid"
	bystander := metav1.OwnerReference{APIVersion: "v1", Kind: "ConfigMap", Name: "anchor", UID: "anchor-uid"}
	child := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "v1", "kind": "ConfigMap",
		"metadata": map[string]any{"name": "web-config", "namespace": "ns"},
	}}
	child.SetOwnerReferences([]metav1.OwnerReference{bystander, earlier})
	dyn := dynamicfake.NewSimpleDynamicClient(runtime.NewScheme(), child.DeepCopy())
	fake := record.NewFakeRecorder(4)
	a := &Applier{log: zap.NewNop(), dyn: dyn, metrics: newMetrics(nil), rec: &recorder.Recorder{EventRecorder: fake}}
	got, err := a.setControllerRef(context.Background(), rule, child, owner, nil, true)
	if err != nil {
		t.Fatal(err)
	}
	want := []metav1.OwnerReference{bystander, children.ControllerRef(owner)}
	if diff := cmp.Diff(want, got.GetOwnerReferences()); diff != "" {
		t.Errorf("owner references after adoption (-want +got):\n%s", diff)
	}
	select {
	case ev := <-fake.Events:
		if !strings.Contains(ev, events.ReasonAdopted) {
			t.Errorf("event %q, want %s", ev, events.ReasonAdopted)
		}
	default:
		t.Error("no Event on the parent for the adoption")
	}
}

// TestAdoptRewritesGeneratedSelectorLabel: under generateSelector a child
// of an earlier incarnation carries controller-uid=<old UID>, which the new
// parent's selector cannot match; the adoption rewrites that label with
// the controller reference, or the next sync would release the child again.
func TestAdoptRewritesGeneratedSelectorLabel(t *testing.T) {
	owner := children.Owner{APIVersion: "example.com/v1", Kind: "Thing", Namespace: "ns", Name: "web", UID: "new-uid", Namespaced: true}
	rule := &children.Rule{APIVersion: "v1", Resource: "configmaps", Kind: "ConfigMap", Namespaced: true}
	for _, tc := range []struct {
		reason string
		labels map[string]string
		want   map[string]string
	}{
		{reason: "the old parent's generated label follows the controller reference",
			labels: map[string]string{"controller-uid": "old-uid", "app": "web"},
			want:   map[string]string{"controller-uid": "new-uid", "app": "web"}},
		{reason: "a controller-uid label naming anything else is the hook's own and stays",
			labels: map[string]string{"controller-uid": "someone", "app": "web"},
			want:   map[string]string{"controller-uid": "someone", "app": "web"}},
		{reason: "no label, none added (a parent with its own selector)",
			labels: map[string]string{"app": "web"},
			want:   map[string]string{"app": "web"}},
	} {
		t.Run(tc.reason, func(t *testing.T) {
			earlier := children.ControllerRef(owner)
			earlier.UID = "old-uid"
			child := &unstructured.Unstructured{Object: map[string]any{
				"apiVersion": "v1", "kind": "ConfigMap",
				"metadata": map[string]any{"name": "web-config", "namespace": "ns"},
			}}
			child.SetLabels(tc.labels)
			child.SetOwnerReferences([]metav1.OwnerReference{earlier})
			dyn := dynamicfake.NewSimpleDynamicClient(runtime.NewScheme(), child.DeepCopy())
			a := &Applier{log: zap.NewNop(), dyn: dyn, metrics: newMetrics(nil), rec: &recorder.Recorder{EventRecorder: record.NewFakeRecorder(4)}}
			got, err := a.setControllerRef(context.Background(), rule, child, owner, []string{composite.ControllerUIDLabel}, true)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, got.GetLabels()); diff != "" {
				t.Errorf("labels after adoption (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff([]metav1.OwnerReference{children.ControllerRef(owner)}, got.GetOwnerReferences()); diff != "" {
				t.Errorf("owner references after adoption (-want +got):\n%s", diff)
			}
		})
	}
}
