package e2e

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/metabus/metabus/pkg/allinone"
)

// TestHookVersionV2: a v2 hook sees children keyed namespace/name and its
// responses are decoded strictly (an unknown field is a SyncError), while
// the same response to a v2 hook in loose mode is accepted.
func TestHookVersionV2(t *testing.T) {
	ctx := context.Background()
	inst := startMetabus(t, allinone.Config{}, nil)
	ns := newNamespace(t)
	var mu sync.Mutex
	keys := map[string]bool{}
	url := hookServer(t, jsonHook(func(req map[string]any) (int, any) {
		if cms, ok := req["children"].(map[string]any)["ConfigMap.v1"].(map[string]any); ok {
			mu.Lock()
			for k := range cms {
				keys[k] = true
			}
			mu.Unlock()
		}
		_, resp := widgetHook(nil)(req)
		resp.(map[string]any)["unexpectedField"] = true
		return 200, resp
	}))
	for _, mode := range []string{"strict", "loose"} {
		createController(t, inst, map[string]any{
			"metadata": map[string]any{"name": "widgets-v2-" + mode},
			"spec": map[string]any{
				"parentResource": map[string]any{"apiVersion": "test.metabus.dev/v1", "resource": "widgets",
					"labelSelector": map[string]any{"matchLabels": map[string]any{"mode": mode}}},
				"childResources": []any{map[string]any{"apiVersion": "v1", "resource": "configmaps"}},
				"hooks": map[string]any{"sync": map[string]any{"version": "v2",
					"webhook": map[string]any{"url": url, "responseUnMarshallMode": mode}}},
			},
		})
		w := newWidget("v2-"+mode, []string{"a"}, 1)
		w.SetLabels(map[string]string{"mode": mode})
		if _, err := dyn.Resource(widgetsGVR).Namespace(ns).Create(ctx, w, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, 30*time.Second, "the loose v2 controller's child, keyed ns/name", func() error {
		if _, err := kube.CoreV1().ConfigMaps(ns).Get(ctx, "v2-loose-a", metav1.GetOptions{}); err != nil {
			return err
		}
		mu.Lock()
		defer mu.Unlock()
		if !keys[ns+"/v2-loose-a"] {
			return fmt.Errorf("v2 children keys %v, want %s/v2-loose-a", keys, ns)
		}
		return nil
	})
	eventually(t, 30*time.Second, "a SyncError for the strict v2 controller", func() error {
		evs, err := kube.CoreV1().Events(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return err
		}
		for _, e := range evs.Items {
			if e.InvolvedObject.Name == "v2-strict" && e.Reason == "SyncError" && strings.Contains(e.Message, "unexpectedField") {
				return nil
			}
		}
		return fmt.Errorf("no strict-decoding SyncError yet")
	})
	if _, err := kube.CoreV1().ConfigMaps(ns).Get(ctx, "v2-strict-a", metav1.GetOptions{}); err == nil {
		t.Errorf("the strict controller applied a response it should have rejected")
	}
}

// TestTargetLabelSelector: an installation serves only controllers whose
// labels match --target-label-selector.
func TestTargetLabelSelector(t *testing.T) {
	ctx := context.Background()
	inst := startMetabus(t, allinone.Config{}, nil)
	ns := newNamespace(t)
	var served, ignored atomic.Int64
	servedURL := hookServer(t, jsonHook(func(req map[string]any) (int, any) { served.Add(1); return widgetHook(nil)(req) }))
	ignoredURL := hookServer(t, jsonHook(func(req map[string]any) (int, any) { ignored.Add(1); return widgetHook(nil)(req) }))
	spec := func(url, sel string) map[string]any {
		return map[string]any{
			"parentResource": map[string]any{"apiVersion": "test.metabus.dev/v1", "resource": "widgets",
				"labelSelector": map[string]any{"matchLabels": map[string]any{"target": sel}}},
			"childResources": []any{map[string]any{"apiVersion": "v1", "resource": "configmaps"}},
			"hooks":          map[string]any{"sync": map[string]any{"webhook": map[string]any{"url": url}}},
		}
	}
	createController(t, inst, map[string]any{"metadata": map[string]any{"name": "widgets-targeted"}, "spec": spec(servedURL, "a")})
	// Not labelled for this installation: createController adds the label,
	// so create this one directly without it.
	other := map[string]any{"apiVersion": "metacontroller.k8s.io/v1alpha1", "kind": "CompositeController",
		"metadata": map[string]any{"name": "widgets-untargeted", "labels": map[string]any{"metabus.dev/e2e": "someone-else"}},
		"spec":     spec(ignoredURL, "b")}
	createRaw(t, other)
	for _, sel := range []string{"a", "b"} {
		w := newWidget("t-"+sel, []string{"x"}, 1)
		w.SetLabels(map[string]string{"target": sel, "app": "t-" + sel})
		if _, err := dyn.Resource(widgetsGVR).Namespace(ns).Create(ctx, w, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, 30*time.Second, "the targeted controller's child", func() error {
		_, err := kube.CoreV1().ConfigMaps(ns).Get(ctx, "t-a-x", metav1.GetOptions{})
		return err
	})
	time.Sleep(time.Second)
	if ignored.Load() != 0 {
		t.Errorf("the untargeted controller's hook was called %d times", ignored.Load())
	}
	if _, err := kube.CoreV1().ConfigMaps(ns).Get(ctx, "t-b-x", metav1.GetOptions{}); err == nil {
		t.Errorf("the untargeted controller's parent got a child")
	}
}

// TestParentWithoutStatusSubresource: a CompositeController whose parent
// CRD lacks the status subresource gets a Warning Event and no syncs.
func TestParentWithoutStatusSubresource(t *testing.T) {
	ctx := context.Background()
	inst := startMetabus(t, allinone.Config{}, nil)
	ns := newNamespace(t)
	var calls atomic.Int64
	url := hookServer(t, jsonHook(func(req map[string]any) (int, any) { calls.Add(1); return 200, map[string]any{} }))
	createController(t, inst, map[string]any{
		"metadata": map[string]any{"name": "gadgets-nostatus"},
		"spec": map[string]any{
			"parentResource": map[string]any{"apiVersion": "test.metabus.dev/v1", "resource": "gadgets"},
			"hooks":          map[string]any{"sync": map[string]any{"webhook": map[string]any{"url": url}}},
		},
	})
	g := map[string]any{"apiVersion": "test.metabus.dev/v1", "kind": "Gadget", "metadata": map[string]any{"name": "g", "namespace": ns}}
	createRaw(t, g)
	eventually(t, 30*time.Second, "a Warning Event on the CompositeController", func() error {
		evs, err := kube.CoreV1().Events("default").List(ctx, metav1.ListOptions{})
		if err != nil {
			return err
		}
		for _, e := range evs.Items {
			if e.InvolvedObject.Name == "gadgets-nostatus" && e.Type == "Warning" && strings.Contains(e.Message, "status") {
				t.Logf("event: %s: %s", e.Reason, e.Message)
				return nil
			}
		}
		return fmt.Errorf("no event yet")
	})
	time.Sleep(time.Second)
	if n := calls.Load(); n != 0 {
		t.Errorf("the hook of a controller with a status-less parent was called %d times", n)
	}
}
