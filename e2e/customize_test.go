package e2e

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/metabus/metabus/pkg/allinone"
)

// TestCustomizeRelated: the customize hook names a related ConfigMap; the
// sync hook sees it in `related` and derives a child from it; the child
// follows the ConfigMap's changes, and the customize hook is not called
// again while the parent's generation stays the same.
func TestCustomizeRelated(t *testing.T) {
	ctx := context.Background()
	inst := startMetabus(t, allinone.Config{}, nil)
	ns := newNamespace(t)
	var customizeCalls atomic.Int64
	customizeURL := hookServer(t, jsonHook(func(req map[string]any) (int, any) {
		customizeCalls.Add(1)
		source := req["parent"].(map[string]any)["spec"].(map[string]any)["source"]
		return 200, map[string]any{"relatedResources": []any{map[string]any{
			"apiVersion": "v1", "resource": "configmaps", "names": []any{source},
		}}}
	}))
	syncURL := hookServer(t, jsonHook(func(req map[string]any) (int, any) {
		parent := req["parent"].(map[string]any)
		name := parent["metadata"].(map[string]any)["name"].(string)
		source := parent["spec"].(map[string]any)["source"].(string)
		rel, _ := req["related"].(map[string]any)["ConfigMap.v1"].(map[string]any)
		src, ok := rel[source].(map[string]any)
		if !ok {
			return 200, map[string]any{"children": []any{}}
		}
		data, _ := src["data"].(map[string]any)
		return 200, map[string]any{"children": []any{map[string]any{
			"apiVersion": "v1", "kind": "ConfigMap",
			"metadata": map[string]any{"name": name + "-derived", "labels": map[string]any{"app": name}},
			"data":     map[string]any{"value": data["value"]},
		}}}
	}))
	createController(t, inst, compositeKind, "widgets-customize", map[string]any{
		"parentResource": map[string]any{"apiVersion": "test.metabus.dev/v1", "resource": "widgets"},
		"childResources": []any{map[string]any{"apiVersion": "v1", "resource": "configmaps", "updateStrategy": map[string]any{"method": "InPlace"}}},
		"hooks": map[string]any{
			"sync":      map[string]any{"webhook": map[string]any{"url": syncURL}},
			"customize": map[string]any{"webhook": map[string]any{"url": customizeURL}},
		},
	})
	if _, err := kube.CoreV1().ConfigMaps(ns).Create(ctx, &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: "settings"}, Data: map[string]string{"value": "one"},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	w := newWidget("cw", nil, 1)
	w.Object["spec"].(map[string]any)["source"] = "settings"
	if _, err := dyn.Resource(widgetsGVR).Namespace(ns).Create(ctx, w, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	derived := func(want string) func() error {
		return func() error {
			cm, err := kube.CoreV1().ConfigMaps(ns).Get(ctx, "cw-derived", metav1.GetOptions{})
			if err != nil {
				return err
			}
			if cm.Data["value"] != want {
				return fmt.Errorf("derived value %q, want %q", cm.Data["value"], want)
			}
			return nil
		}
	}
	eventually(t, 30*time.Second, "the child derived from the related ConfigMap", derived("one"))
	callsBefore := customizeCalls.Load()

	start := time.Now()
	if _, err := kube.CoreV1().ConfigMaps(ns).Patch(ctx, "settings", types.MergePatchType,
		[]byte(`{"data":{"value":"two"}}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "the child to follow the related ConfigMap", derived("two"))
	t.Logf("a related-object change reached the child in %s", time.Since(start).Round(time.Millisecond))
	if n := customizeCalls.Load() - callsBefore; n != 0 {
		t.Errorf("customize was called %d more times although the parent's generation did not change", n)
	}
	// A new generation re-runs customize.
	if _, err := dyn.Resource(widgetsGVR).Namespace(ns).Patch(ctx, "cw", types.MergePatchType,
		[]byte(`{"spec":{"version":2}}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "customize to run for the new generation", func() error {
		if customizeCalls.Load() == callsBefore {
			return fmt.Errorf("not called")
		}
		return nil
	})
}
