package opscli

import (
	"context"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	dynfake "k8s.io/client-go/dynamic/fake"
)

// TestLeader reads the watcher's leader-election Lease through the dynamic
// client: its holder, or "" when there is no Lease, no holder, or no
// cluster connection.
func TestLeader(t *testing.T) {
	lease := func(holder string) *unstructured.Unstructured {
		u := &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
			"metadata": map[string]any{"namespace": "metabus", "name": "metabus-watcher"},
			"spec":     map[string]any{},
		}}
		if holder != "" {
			u.Object["spec"] = map[string]any{"holderIdentity": holder}
		}
		return u
	}
	for _, tc := range []struct {
		reason string
		objs   []runtime.Object
		ns     string
		want   string
	}{
		{"the holder of the Lease", []runtime.Object{lease("watcher-0")}, "metabus", "watcher-0"},
		{"the default namespace is metabus", []runtime.Object{lease("watcher-1")}, "", "watcher-1"},
		{"a Lease nobody holds", []runtime.Object{lease("")}, "metabus", ""},
		{"no Lease: no leader election", nil, "metabus", ""},
	} {
		t.Run(tc.reason, func(t *testing.T) {
			dyn := dynfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(),
				map[schema.GroupVersionResource]string{leaseGVR: "LeaseList"}, tc.objs...)
			got, err := (&Bus{Dyn: dyn}).leader(context.Background(), tc.ns, "metabus-watcher")
			if err != nil {
				t.Fatal(err)
			}
			if got != tc.want {
				t.Errorf("leader %q, want %q", got, tc.want)
			}
		})
	}
	if got, err := (&Bus{}).leader(context.Background(), "metabus", "metabus-watcher"); err != nil || got != "" {
		t.Errorf("without a cluster connection: %q, %v; want no leader and no error", got, err)
	}
}
