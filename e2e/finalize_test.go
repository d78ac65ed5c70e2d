package e2e

import (
	"context"
	"fmt"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/metabus/metabus/internal/allinone"
)

func widgetLabels(name string, extra map[string]string) *unstructured.Unstructured {
	w := newWidget(name, []string{"a", "b", "c"}, 1)
	l := map[string]string{"app": name}
	for k, v := range extra {
		l[k] = v
	}
	w.SetLabels(l)
	return w
}

func hasFinalizer(obj *unstructured.Unstructured, f string) bool {
	for _, x := range obj.GetFinalizers() {
		if x == f {
			return true
		}
	}
	return false
}

// TestStaleFinalizerReleasedOnDelete (issue #13, defect 4): a parent that
// still carries the finalizer of a controller whose finalize hook is gone
// (the watcher's one release request was lost) is released by the next
// sync of that parent, so deleting it never hangs in Terminating. Before,
// only that one request could release it.
func TestStaleFinalizerReleasedOnDelete(t *testing.T) {
	ctx := context.Background()
	inst := startMetabus(t, allinone.Config{}, nil)
	ns := newNamespace(t)
	url := hookServer(t, jsonHook(widgetHook(nil)))
	createController(t, inst, compositeKind, "widgets-stale", map[string]any{
		"parentResource": map[string]any{"apiVersion": "test.metabus.dev/v1", "resource": "widgets"},
		"childResources": []any{map[string]any{"apiVersion": "v1", "resource": "configmaps", "updateStrategy": map[string]any{"method": "InPlace"}}},
		"hooks":          map[string]any{"sync": map[string]any{"webhook": map[string]any{"url": url}}},
	})
	const fin = "metacontroller.io/compositecontroller-widgets-stale"
	w := widgetLabels("stale", nil)
	w.SetFinalizers([]string{fin}) // left by a finalize hook since removed
	if _, err := dyn.Resource(widgetsGVR).Namespace(ns).Create(ctx, w, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "stale finalizer released by a sync", func() error {
		got, err := dyn.Resource(widgetsGVR).Namespace(ns).Get(ctx, "stale", metav1.GetOptions{})
		if err != nil {
			return err
		}
		if hasFinalizer(got, fin) {
			return fmt.Errorf("finalizers %v", got.GetFinalizers())
		}
		return nil
	})
	if err := dyn.Resource(widgetsGVR).Namespace(ns).Delete(ctx, "stale", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "parent deleted", func() error {
		if _, err := dyn.Resource(widgetsGVR).Namespace(ns).Get(ctx, "stale", metav1.GetOptions{}); err == nil {
			return fmt.Errorf("still there")
		}
		return nil
	})
}
