package applier

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
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

	"github.com/metabus/metabus/pkg/apply"
	"github.com/metabus/metabus/pkg/children"
	"github.com/metabus/metabus/pkg/composite"
	"github.com/metabus/metabus/pkg/events"
	"github.com/metabus/metabus/pkg/events/recorder"
)

// A create that finds the name taken is only an error when the object is not this parent's:
// two syncs of one parent in quick succession can both plan the create of a child, because the
// second one's snapshot did not show the first one's new child yet. Anything else is a
// conflict naming who holds the name, and the object is left exactly as it was, under both
// apply strategies: create means create, never a write onto an existing object.
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
	theirs := func(refs ...metav1.OwnerReference) *unstructured.Unstructured {
		o := configMap(refs...)
		o.Object["data"] = map[string]any{"mapRoles": "admins"}
		o.SetLabels(map[string]string{"team": "platform"})
		return o
	}
	deleting := theirs()
	deleting.SetDeletionTimestamp(ptr(metav1.Unix(1700000000, 0)))
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

	tests := []struct {
		reason   string
		existing *unstructured.Unstructured // nil: the name is free
		// wantHolder is who the conflict names; "" expects no error.
		wantHolder string
	}{
		{reason: "the name is free: created", existing: nil},
		{reason: "already created by this parent (not yet in the cache): not an error", existing: configMap(ours)},
		{reason: "this parent's among other, non-controller references: not an error", existing: configMap(notControlling, ours)},
		{reason: "controlled by someone else", existing: theirs(someoneElse),
			wantHolder: "controlled by apps/v1 Deployment x, UID other-uid"},
		{reason: "controlled by a previous parent of the same name", existing: theirs(previousIncarnation),
			wantHolder: "controlled by example.com/v1 Thing web, UID old-parent-uid"},
		{reason: "the same UID under another kind", existing: theirs(otherKind),
			wantHolder: "controlled by example.com/v1 OtherThing web, UID parent-uid"},
		{reason: "referencing this parent, but not as controller", existing: theirs(notController),
			wantHolder: "no controller; owner references example.com/v1 Thing web"},
		{reason: "an orphan (kube-system/aws-auth, say): never taken over", existing: theirs(),
			wantHolder: "no owner: created outside this parent, and not an orphan its selector adopts"},
		{reason: "an orphan being deleted: created once it is gone", existing: deleting,
			wantHolder: "no owner: created outside this parent, and not an orphan its selector adopts; being deleted"},
	}
	for _, strategy := range []apply.Strategy{apply.DynamicApply, apply.ServerSideApply} {
		for _, tt := range tests {
			t.Run(string(strategy)+"/"+tt.reason, func(t *testing.T) {
				var objs []runtime.Object
				if tt.existing != nil {
					objs = append(objs, tt.existing.DeepCopy())
				}
				dyn := dynamicfake.NewSimpleDynamicClient(runtime.NewScheme(), objs...)
				a := &Applier{log: zap.NewNop(), dyn: dyn, metrics: newMetrics(nil), cfg: Config{Strategy: strategy, FieldManager: "mc-test"}}
				acts, err := children.PlanWith(children.Options{Strategy: strategy}, owner, []children.Rule{*rule}, nil, []children.Desired{{Rule: rule, Object: configMap()}})
				if err != nil || len(acts) != 1 || !acts[0].Creates() {
					t.Fatalf("Plan = %v, %v; want one create", acts, err)
				}
				want := ""
				if tt.wantHolder != "" {
					want = (&createConflictError{what: "ConfigMap ns/web-config", holder: tt.wantHolder}).Error()
				}
				err = a.write(context.Background(), acts[0])
				if diff := cmp.Diff(want, errString(err)); diff != "" {
					t.Errorf("write error (-want +got):\n%s", diff)
				}
				if want != "" && failureReason([]error{err}) != events.ReasonCreateConflict {
					t.Errorf("the conflict's Event reason is %s, want %s", failureReason([]error{err}), events.ReasonCreateConflict)
				}
				for _, act := range dyn.Actions() {
					if v := act.GetVerb(); v != "create" && v != "get" {
						t.Errorf("a %s of %s: a create writes nothing but its create", v, act.GetResource().Resource)
					}
				}
				got, err := dyn.Resource(schema.GroupVersionResource{Version: "v1", Resource: "configmaps"}).Namespace("ns").Get(context.Background(), "web-config", metav1.GetOptions{})
				if err != nil {
					t.Fatalf("get the child: %v", err)
				}
				if tt.existing != nil {
					if diff := cmp.Diff(tt.existing.Object, got.Object); diff != "" {
						t.Errorf("the existing object changed (-want +got):\n%s", diff)
					}
				} else if diff := cmp.Diff(acts[0].Object.GetOwnerReferences(), got.GetOwnerReferences()); diff != "" {
					t.Errorf("the created child's owner references (-want +got):\n%s", diff)
				}
			})
		}
	}
}

// TestFailureReason: an apply whose only failures are creates that met
// someone else's object is a CreateConflict; any other failure makes it
// an ApplyError.
func TestFailureReason(t *testing.T) {
	taken := &createConflictError{what: "ConfigMap ns/a", holder: "no owner"}
	tests := []struct {
		reason string
		errs   []error
		want   string
	}{
		{reason: "one create conflict", errs: []error{taken}, want: events.ReasonCreateConflict},
		{reason: "a create conflict, wrapped", errs: []error{fmt.Errorf("child: %w", taken), taken}, want: events.ReasonCreateConflict},
		{reason: "a create conflict and another failure", errs: []error{taken, errors.New("update ConfigMap ns/b: boom")}, want: events.ReasonApplyError},
		{reason: "another failure alone", errs: []error{errors.New("boom")}, want: events.ReasonApplyError},
	}
	for _, tt := range tests {
		t.Run(tt.reason, func(t *testing.T) {
			if diff := cmp.Diff(tt.want, failureReason(tt.errs)); diff != "" {
				t.Errorf("failureReason (-want +got):\n%s", diff)
			}
		})
	}
}

// TestOwnershipPatch: after a create under server-side apply, the fields
// the create recorded under the field manager's Update entry move to its
// Apply entry (so later applies prune what the hook stops returning),
// with the created resourceVersion as precondition; nothing else is
// touched, and nothing is sent when there is nothing to move.
func TestOwnershipPatch(t *testing.T) {
	fields := func(f string) *metav1.FieldsV1 { return &metav1.FieldsV1{Raw: []byte(f)} }
	update := func(manager, f string) metav1.ManagedFieldsEntry {
		return metav1.ManagedFieldsEntry{Manager: manager, Operation: metav1.ManagedFieldsOperationUpdate, APIVersion: "v1", FieldsType: "FieldsV1", FieldsV1: fields(f)}
	}
	applied := func(manager, f string) metav1.ManagedFieldsEntry {
		e := update(manager, f)
		e.Operation = metav1.ManagedFieldsOperationApply
		return e
	}
	const data, note = `{"f:data":{".":{},"f:k":{}}}`, `{"f:data":{".":{},"f:note":{}}}`
	tests := []struct {
		reason  string
		managed []metav1.ManagedFieldsEntry
		// want is the managedFields the patch writes; nil: no patch.
		want []metav1.ManagedFieldsEntry
	}{
		{reason: "the create's Update entry becomes the Apply entry",
			managed: []metav1.ManagedFieldsEntry{update("mc", data)},
			want:    []metav1.ManagedFieldsEntry{applied("mc", data)}},
		{reason: "another manager's entry is kept as it is",
			managed: []metav1.ManagedFieldsEntry{update("mc", data), update("admission", note)},
			want:    []metav1.ManagedFieldsEntry{applied("mc", data), update("admission", note)}},
		{reason: "an Apply entry already there takes the Update entry's fields",
			managed: []metav1.ManagedFieldsEntry{applied("mc", note), update("mc", data)},
			want:    []metav1.ManagedFieldsEntry{applied("mc", `{"f:data":{".":{},"f:k":{},"f:note":{}}}`)}},
		{reason: "no entry of the manager (a server that records none): nothing to send",
			managed: []metav1.ManagedFieldsEntry{update("admission", note)}},
		{reason: "no managedFields at all: nothing to send"},
	}
	for _, tt := range tests {
		t.Run(tt.reason, func(t *testing.T) {
			patch, err := ownershipPatch("uid-1", "7", tt.managed, "mc")
			if err != nil {
				t.Fatal(err)
			}
			if tt.want == nil {
				if patch != nil {
					t.Errorf("patch %s, want none", patch)
				}
				return
			}
			var ops []struct {
				Op    string          `json:"op"`
				Path  string          `json:"path"`
				Value json.RawMessage `json:"value"`
			}
			if err := json.Unmarshal(patch, &ops); err != nil {
				t.Fatalf("patch %s: %v", patch, err)
			}
			var got []metav1.ManagedFieldsEntry
			rv := ""
			for _, op := range ops {
				switch op.Path {
				case "/metadata/managedFields":
					if err := json.Unmarshal(op.Value, &got); err != nil {
						t.Fatal(err)
					}
				case "/metadata/resourceVersion":
					if err := json.Unmarshal(op.Value, &rv); err != nil {
						t.Fatal(err)
					}
				default:
					t.Errorf("the patch touches %s", op.Path)
				}
			}
			if rv != "7" {
				t.Errorf("the patch's resourceVersion precondition is %q, want the created one", rv)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("managedFields (-want +got):\n%s", diff)
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
