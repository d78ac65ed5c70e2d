package mapctl

import (
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/metabus/metabus/pkg/api/v1alpha1"
)

// validSpec is issue #11's example.
func validSpec() map[string]any {
	return map[string]any{
		"parentResource": map[string]any{"apiVersion": "ctl.example.com/v1", "resource": "snapshotschedules"},
		"inputResources": []any{map[string]any{"apiVersion": "v1", "resource": "persistentvolumeclaims"}},
		"outputResources": []any{map[string]any{"apiVersion": "snapshot.storage.k8s.io/v1", "resource": "volumesnapshots",
			"updateStrategy": map[string]any{"method": "InPlace"}}},
		"resyncPeriodSeconds": int64(5),
		"hooks": map[string]any{
			"map":       map[string]any{"webhook": map[string]any{"url": "http://hooks/map", "timeout": "10s"}},
			"tombstone": map[string]any{"webhook": map[string]any{"url": "http://hooks/tombstone"}},
		},
	}
}

func controllerObject(spec any) *unstructured.Unstructured {
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "metacontroller.k8s.io/v1alpha1", "kind": "MapController",
		"metadata": map[string]any{"name": "snap", "uid": "c-1"},
		"spec":     spec,
	}}
}

func TestDecode(t *testing.T) {
	url := func(s string) *string { return &s }
	five := int32(5)
	cases := []struct {
		reason  string
		obj     *unstructured.Unstructured
		want    *v1alpha1.MapControllerSpec
		wantErr string // substring
	}{
		{
			reason: "the issue's example decodes to the typed spec",
			obj:    controllerObject(validSpec()),
			want: &v1alpha1.MapControllerSpec{
				ParentResource: v1alpha1.ResourceRule{APIVersion: "ctl.example.com/v1", Resource: "snapshotschedules"},
				InputResources: []v1alpha1.ResourceRule{{APIVersion: "v1", Resource: "persistentvolumeclaims"}},
				OutputResources: []v1alpha1.MapControllerOutputResourceRule{{
					ResourceRule:   v1alpha1.ResourceRule{APIVersion: "snapshot.storage.k8s.io/v1", Resource: "volumesnapshots"},
					UpdateStrategy: &v1alpha1.MapControllerOutputUpdateStrategy{Method: v1alpha1.OutputUpdateInPlace},
				}},
				ResyncPeriodSeconds: &five,
				Hooks: &v1alpha1.MapControllerHooks{
					Map:       &v1alpha1.Hook{Webhook: &v1alpha1.Webhook{URL: url("http://hooks/map"), Timeout: &metav1.Duration{Duration: 10 * time.Second}}},
					Tombstone: &v1alpha1.Hook{Webhook: &v1alpha1.Webhook{URL: url("http://hooks/tombstone")}},
				},
			},
		},
		{reason: "no object", obj: nil, wantErr: "no MapController object"},
		{reason: "a field of the wrong type does not decode", obj: controllerObject(map[string]any{"inputResources": "pvcs"}), wantErr: "decode MapController snap"},
		{reason: "an invalid spec is an error too: the controller cannot be served", obj: controllerObject(map[string]any{}), wantErr: "MapController snap: invalid spec"},
	}
	for _, c := range cases {
		t.Run(c.reason, func(t *testing.T) {
			got, err := Decode(c.obj)
			if c.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), c.wantErr) {
					t.Fatalf("error %v, want one containing %q", err, c.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(c.want, &got.Spec); diff != "" {
				t.Errorf("spec (-want +got):\n%s", diff)
			}
			if got.Name != "snap" || got.Kind != v1alpha1.MapControllerKind {
				t.Errorf("metadata and type: %s %s", got.Kind, got.Name)
			}
		})
	}
}

func TestValidate(t *testing.T) {
	rule := func(apiVersion, resource string) v1alpha1.ResourceRule {
		return v1alpha1.ResourceRule{APIVersion: apiVersion, Resource: resource}
	}
	out := func(apiVersion, resource string, method v1alpha1.OutputUpdateMethod) v1alpha1.MapControllerOutputResourceRule {
		r := v1alpha1.MapControllerOutputResourceRule{ResourceRule: rule(apiVersion, resource)}
		if method != "" {
			r.UpdateStrategy = &v1alpha1.MapControllerOutputUpdateStrategy{Method: method}
		}
		return r
	}
	hook := &v1alpha1.Hook{Webhook: &v1alpha1.Webhook{}}
	valid := func() v1alpha1.MapControllerSpec {
		return v1alpha1.MapControllerSpec{
			ParentResource:  rule("ctl.example.com/v1", "snapshotschedules"),
			InputResources:  []v1alpha1.ResourceRule{rule("v1", "persistentvolumeclaims")},
			OutputResources: []v1alpha1.MapControllerOutputResourceRule{out("snapshot.storage.k8s.io/v1", "volumesnapshots", "")},
			Hooks:           &v1alpha1.MapControllerHooks{Map: hook},
		}
	}
	cases := []struct {
		reason string
		mod    func(*v1alpha1.MapControllerSpec)
		want   []string // every problem, in order; nil means valid
	}{
		{reason: "minimal valid spec", mod: func(*v1alpha1.MapControllerSpec) {}},
		{
			reason: "several inputs and outputs, a resource both input and output, every output method, a tombstone hook",
			mod: func(s *v1alpha1.MapControllerSpec) {
				s.InputResources = append(s.InputResources, rule("v1", "configmaps"))
				s.OutputResources = append(s.OutputResources, out("v1", "configmaps", v1alpha1.OutputUpdateRecreate),
					out("v1", "secrets", v1alpha1.OutputUpdateOnDelete), out("apps/v1", "deployments", v1alpha1.OutputUpdateInPlace))
				s.Hooks.Tombstone = hook
			},
		},
		{
			reason: "an empty spec reports everything at once",
			mod:    func(s *v1alpha1.MapControllerSpec) { *s = v1alpha1.MapControllerSpec{} },
			want: []string{
				"spec.parentResource.apiVersion is required", "spec.parentResource.resource is required",
				"spec.inputResources needs at least one resource", "spec.outputResources needs at least one resource",
				"spec.hooks.map is required",
			},
		},
		{
			reason: "rules without apiVersion or resource, and an unparsable apiVersion",
			mod: func(s *v1alpha1.MapControllerSpec) {
				s.ParentResource.APIVersion = "a/b/c"
				s.InputResources = []v1alpha1.ResourceRule{rule("", "pvcs")}
				s.OutputResources = []v1alpha1.MapControllerOutputResourceRule{out("v1", "", "")}
			},
			want: []string{
				`spec.parentResource.apiVersion: unexpected GroupVersion string: a/b/c`,
				"spec.inputResources[0].apiVersion is required",
				"spec.outputResources[0].resource is required",
			},
		},
		{
			reason: "a resource listed twice in one list",
			mod: func(s *v1alpha1.MapControllerSpec) {
				s.InputResources = append(s.InputResources, rule("v1", "persistentvolumeclaims"))
				s.OutputResources = append(s.OutputResources, out("snapshot.storage.k8s.io/v1", "volumesnapshots", v1alpha1.OutputUpdateInPlace))
			},
			want: []string{"spec.inputResources[1] repeats spec.inputResources[0]", "spec.outputResources[1] repeats spec.outputResources[0]"},
		},
		{
			reason: "outputs do not roll out",
			mod: func(s *v1alpha1.MapControllerSpec) {
				s.OutputResources[0].UpdateStrategy = &v1alpha1.MapControllerOutputUpdateStrategy{Method: "RollingInPlace"}
			},
			want: []string{`spec.outputResources[0].updateStrategy.method "RollingInPlace" is not OnDelete, Recreate or InPlace (outputs do not roll out)`},
		},
		{reason: "no hooks at all", mod: func(s *v1alpha1.MapControllerSpec) { s.Hooks = nil }, want: []string{"spec.hooks.map is required"}},
		{
			reason: "hooks without a webhook cannot be called",
			mod: func(s *v1alpha1.MapControllerSpec) {
				s.Hooks = &v1alpha1.MapControllerHooks{Map: &v1alpha1.Hook{}, Tombstone: &v1alpha1.Hook{}}
			},
			want: []string{"spec.hooks.map.webhook is required (or spec.hooks.map.nats)",
				"spec.hooks.tombstone.webhook is required when the tombstone hook is set (or spec.hooks.tombstone.nats)"},
		},
		{
			reason: "hooks served over NATS need no webhook",
			mod: func(s *v1alpha1.MapControllerSpec) {
				n := &v1alpha1.NATSHook{Subject: "hooks.m.map"}
				s.Hooks = &v1alpha1.MapControllerHooks{Map: &v1alpha1.Hook{NATS: n}, Tombstone: &v1alpha1.Hook{NATS: n}}
			},
		},
	}
	for _, c := range cases {
		t.Run(c.reason, func(t *testing.T) {
			spec := valid()
			c.mod(&spec)
			var got []string
			if err := Validate(&spec); err != nil {
				msg, ok := strings.CutPrefix(err.Error(), "invalid spec: ")
				if !ok {
					t.Fatalf("error %q lacks the prefix", err)
				}
				got = strings.Split(msg, "\n")
			}
			if diff := cmp.Diff(c.want, got); diff != "" {
				t.Errorf("problems (-want +got):\n%s", diff)
			}
		})
	}
}

func TestCheckScopes(t *testing.T) {
	cases := []struct {
		reason string
		scopes Scopes
		want   string // "" means fine
	}{
		{reason: "namespaced everything", scopes: Scopes{Parent: true, Inputs: []bool{true}, Outputs: []bool{true, true}}},
		{reason: "a cluster-scoped parent may read and own both scopes", scopes: Scopes{Inputs: []bool{false, true}, Outputs: []bool{false, true}}},
		{
			reason: "a namespaced parent can neither see cluster-scoped inputs nor own cluster-scoped outputs",
			scopes: Scopes{Parent: true, Inputs: []bool{true, false}, Outputs: []bool{false}},
			want: "spec.inputResources[1] is cluster-scoped: a namespaced parent only sees inputs in its own namespace\n" +
				"spec.outputResources[0] is cluster-scoped: a namespaced parent cannot own it",
		},
	}
	for _, c := range cases {
		t.Run(c.reason, func(t *testing.T) {
			got := ""
			if err := CheckScopes(c.scopes); err != nil {
				got = err.Error()
			}
			if diff := cmp.Diff(c.want, got); diff != "" {
				t.Errorf("error (-want +got):\n%s", diff)
			}
		})
	}
}

func TestOutputMethod(t *testing.T) {
	cases := []struct {
		reason string
		rule   v1alpha1.MapControllerOutputResourceRule
		want   v1alpha1.ChildUpdateMethod
	}{
		{reason: "no strategy is OnDelete, as for children", want: v1alpha1.ChildUpdateOnDelete},
		{reason: "an empty method is OnDelete", rule: v1alpha1.MapControllerOutputResourceRule{UpdateStrategy: &v1alpha1.MapControllerOutputUpdateStrategy{}}, want: v1alpha1.ChildUpdateOnDelete},
		{reason: "InPlace", rule: v1alpha1.MapControllerOutputResourceRule{UpdateStrategy: &v1alpha1.MapControllerOutputUpdateStrategy{Method: v1alpha1.OutputUpdateInPlace}}, want: v1alpha1.ChildUpdateInPlace},
		{reason: "Recreate", rule: v1alpha1.MapControllerOutputResourceRule{UpdateStrategy: &v1alpha1.MapControllerOutputUpdateStrategy{Method: v1alpha1.OutputUpdateRecreate}}, want: v1alpha1.ChildUpdateRecreate},
	}
	for _, c := range cases {
		t.Run(c.reason, func(t *testing.T) {
			if diff := cmp.Diff(c.want, OutputMethod(c.rule)); diff != "" {
				t.Errorf("method (-want +got):\n%s", diff)
			}
		})
	}
}

func TestFinalizer(t *testing.T) {
	cases := []struct {
		reason, name, want string
	}{
		{reason: "no finalize hook, so no finalizer on parents", name: "snap", want: ""},
		{reason: "whatever the name", name: "gone.example", want: ""},
	}
	for _, c := range cases {
		t.Run(c.reason, func(t *testing.T) {
			if diff := cmp.Diff(c.want, Finalizer(c.name)); diff != "" {
				t.Errorf("finalizer (-want +got):\n%s", diff)
			}
		})
	}
}
