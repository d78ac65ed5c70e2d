package e2e

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/metabus/metabus/internal/allinone"
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
		createController(t, inst, compositeKind, "widgets-v2-"+mode, map[string]any{
			"parentResource": map[string]any{"apiVersion": "test.metabus.dev/v1", "resource": "widgets",
				"labelSelector": map[string]any{"matchLabels": map[string]any{"mode": mode}}},
			"childResources": []any{map[string]any{"apiVersion": "v1", "resource": "configmaps"}},
			"hooks": map[string]any{"sync": map[string]any{"version": "v2",
				"webhook": map[string]any{"url": url, "responseUnMarshallMode": mode}}},
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
	createController(t, inst, compositeKind, "widgets-targeted", spec(servedURL, "a"))
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
	createController(t, inst, compositeKind, "gadgets-nostatus", map[string]any{
		"parentResource": map[string]any{"apiVersion": "test.metabus.dev/v1", "resource": "gadgets"},
		"hooks":          map[string]any{"sync": map[string]any{"webhook": map[string]any{"url": url}}},
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

// TestHook429RetryAfter: a hook answering 429 with Retry-After is called
// again after that delay, without a SyncError Event.
func TestHook429RetryAfter(t *testing.T) {
	ctx := context.Background()
	inst := startMetabus(t, allinone.Config{}, nil)
	ns := newNamespace(t)
	var calls atomic.Int64
	var first, second atomic.Int64
	url := hookServer(t, http429Then(func(req map[string]any) (int, any) { return widgetHook(nil)(req) }, &calls, &first, &second))
	widgetController(t, inst, "widgets-429", url, "OnDelete")
	if _, err := dyn.Resource(widgetsGVR).Namespace(ns).Create(ctx, newWidget("busy", []string{"a"}, 1), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "the child after the throttled call", func() error {
		_, err := kube.CoreV1().ConfigMaps(ns).Get(ctx, "busy-a", metav1.GetOptions{})
		return err
	})
	gap := time.Duration(second.Load() - first.Load())
	t.Logf("429 with Retry-After: 2 → called again after %s", gap.Round(time.Millisecond))
	if gap < 1500*time.Millisecond {
		t.Errorf("called again after %s, before Retry-After (2s)", gap)
	}
	noSyncError(ctx, t, ns, "a 429")
}

// noSyncError fails t for each SyncError Event in ns, which what (a
// throttled answer) must not have produced.
func noSyncError(ctx context.Context, t *testing.T, ns, what string) {
	t.Helper()
	evs, err := kube.CoreV1().Events(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range evs.Items {
		if e.Reason == "SyncError" {
			t.Errorf("%s produced a SyncError event: %s", what, e.Message)
		}
	}
}

// http429Then answers the first call with 429 (Retry-After: 2), then
// delegates; it records when the first two calls arrived.
func http429Then(f func(map[string]any) (int, any), calls, first, second *atomic.Int64) http.Handler {
	inner := jsonHook(f)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// Only the test's own parent counts (ce-subject is its path).
		if !strings.HasSuffix(r.Header.Get("ce-subject"), "/busy") {
			inner.ServeHTTP(w, r)
			return
		}
		n := calls.Add(1)
		now := time.Now().UnixNano()
		switch n {
		case 1:
			first.Store(now)
			w.Header().Set("Retry-After", "2")
			w.WriteHeader(http.StatusTooManyRequests)
			return
		case 2:
			second.Store(now)
		}
		inner.ServeHTTP(w, r)
	})
}

// TestIgnoreStatusChanges: with ignoreStatusChanges, a status-only change
// of the parent does not call the hook; a spec change does.
func TestIgnoreStatusChanges(t *testing.T) {
	ctx := context.Background()
	inst := startMetabus(t, allinone.Config{}, nil)
	ns := newNamespace(t)
	var calls atomic.Int64
	url := hookServer(t, jsonHook(func(req map[string]any) (int, any) { calls.Add(1); return widgetHook(nil)(req) }))
	createController(t, inst, compositeKind, "widgets-ignore-status", map[string]any{
		"parentResource": map[string]any{"apiVersion": "test.metabus.dev/v1", "resource": "widgets", "ignoreStatusChanges": true},
		"childResources": []any{map[string]any{"apiVersion": "v1", "resource": "configmaps"}},
		"hooks":          map[string]any{"sync": map[string]any{"webhook": map[string]any{"url": url}}},
	})
	if _, err := dyn.Resource(widgetsGVR).Namespace(ns).Create(ctx, newWidget("is", []string{"a"}, 1), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "the first sync's status", func() error {
		w, err := dyn.Resource(widgetsGVR).Namespace(ns).Get(ctx, "is", metav1.GetOptions{})
		if err != nil {
			return err
		}
		if _, ok := nestedInt(w, "status", "observedGeneration"); !ok {
			return fmt.Errorf("no status yet")
		}
		return nil
	})
	time.Sleep(500 * time.Millisecond)
	before := calls.Load()
	if _, err := dyn.Resource(widgetsGVR).Namespace(ns).Patch(ctx, "is", types.MergePatchType,
		[]byte(`{"status":{"external":"touched"}}`), metav1.PatchOptions{}, "status"); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second)
	if n := calls.Load() - before; n != 0 {
		t.Errorf("a status-only change called the hook %d times", n)
	}
	if _, err := dyn.Resource(widgetsGVR).Namespace(ns).Patch(ctx, "is", types.MergePatchType,
		[]byte(`{"spec":{"version":2}}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 20*time.Second, "a sync for the spec change", func() error {
		if calls.Load() == before {
			return fmt.Errorf("not called")
		}
		return nil
	})
}
