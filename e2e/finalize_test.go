package e2e

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"

	"github.com/metabus/metabus/pkg/allinone"
	"github.com/metabus/metabus/pkg/api/v1alpha1"
)

// teardownHook syncs one ConfigMap per spec.items entry; when finalizing it
// tears them down one at a time, last name first, and reports finalized
// once none is observed. It records what each finalize call observed.
type teardownHook struct {
	mu       sync.Mutex
	observed [][]string
}

func (h *teardownHook) handle(req map[string]any) (int, any) {
	finalizing, _ := req["finalizing"].(bool)
	var names []string
	if cm, ok := req["children"].(map[string]any)["ConfigMap.v1"].(map[string]any); ok {
		for n := range cm {
			names = append(names, n)
		}
	}
	sort.Strings(names)
	if !finalizing {
		return widgetHook(nil)(req)
	}
	h.mu.Lock()
	h.observed = append(h.observed, names)
	h.mu.Unlock()
	var children []any
	for _, n := range names[:max(len(names)-1, 0)] {
		children = append(children, map[string]any{
			"apiVersion": "v1", "kind": "ConfigMap",
			"metadata": map[string]any{"name": n, "labels": req["parent"].(map[string]any)["metadata"].(map[string]any)["labels"]},
		})
	}
	return 200, map[string]any{"children": children, "finalized": len(names) == 0}
}

// teardownOrder returns the distinct observed sets, in order.
func (h *teardownHook) teardownOrder() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []string
	for _, o := range h.observed {
		s := strings.Join(o, ",")
		if len(out) == 0 || out[len(out)-1] != s {
			out = append(out, s)
		}
	}
	return out
}

func finalizeController(t *testing.T, inst *instance, name, url string, selector map[string]any) {
	t.Helper()
	parent := map[string]any{"apiVersion": "test.metabus.dev/v1", "resource": "widgets"}
	if selector != nil {
		parent["labelSelector"] = selector
	}
	createController(t, inst, compositeKind, name, map[string]any{
		"parentResource": parent,
		"childResources": []any{map[string]any{"apiVersion": "v1", "resource": "configmaps", "updateStrategy": map[string]any{"method": "InPlace"}}},
		"hooks": map[string]any{
			"sync":     map[string]any{"webhook": map[string]any{"url": url}},
			"finalize": map[string]any{"webhook": map[string]any{"url": url}},
		},
	})
}

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

// TestFinalizeOrderedTeardown: with a finalize hook the parent gets the
// finalizer; deleting it runs finalize until finalized, tearing children
// down in the hook's order, and then the parent goes away.
func TestFinalizeOrderedTeardown(t *testing.T) {
	ctx := context.Background()
	inst := startMetabus(t, allinone.Config{}, nil)
	ns := newNamespace(t)
	hook := &teardownHook{}
	finalizeController(t, inst, "widgets-finalize", hookServer(t, jsonHook(hook.handle)), nil)
	const fin = "metacontroller.io/compositecontroller-widgets-finalize"

	if _, err := dyn.Resource(widgetsGVR).Namespace(ns).Create(ctx, widgetLabels("fw", nil), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "children and the finalizer", func() error {
		w, err := dyn.Resource(widgetsGVR).Namespace(ns).Get(ctx, "fw", metav1.GetOptions{})
		if err != nil {
			return err
		}
		if !hasFinalizer(w, fin) {
			return fmt.Errorf("finalizers %v", w.GetFinalizers())
		}
		names, err := configMapNames(ctx, ns, "fw")
		if err != nil || len(names) != 3 {
			return fmt.Errorf("children %v %v", names, err)
		}
		return nil
	})
	if err := dyn.Resource(widgetsGVR).Namespace(ns).Delete(ctx, "fw", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 60*time.Second, "the parent to be finalized and deleted", func() error {
		_, err := dyn.Resource(widgetsGVR).Namespace(ns).Get(ctx, "fw", metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("parent still there (err=%v)", err)
	})
	order := hook.teardownOrder()
	t.Logf("finalize observed: %q", order)
	want := []string{"fw-a,fw-b,fw-c", "fw-a,fw-b", "fw-a", ""}
	if strings.Join(order, "|") != strings.Join(want, "|") {
		t.Errorf("teardown order %q, want %q", order, want)
	}
}

// TestFinalizeOnOptOut: a parent that stops matching the controller's
// label selector is finalized (children torn down, finalizer removed) and
// left in place.
func TestFinalizeOnOptOut(t *testing.T) {
	ctx := context.Background()
	inst := startMetabus(t, allinone.Config{}, nil)
	ns := newNamespace(t)
	hook := &teardownHook{}
	finalizeController(t, inst, "widgets-optout", hookServer(t, jsonHook(hook.handle)),
		map[string]any{"matchLabels": map[string]any{"enabled": "yes"}})
	const fin = "metacontroller.io/compositecontroller-widgets-optout"
	if _, err := dyn.Resource(widgetsGVR).Namespace(ns).Create(ctx, widgetLabels("ow", map[string]string{"enabled": "yes"}), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "children", func() error {
		names, err := configMapNames(ctx, ns, "ow")
		if err != nil || len(names) != 3 {
			return fmt.Errorf("children %v %v", names, err)
		}
		return nil
	})
	if _, err := dyn.Resource(widgetsGVR).Namespace(ns).Patch(ctx, "ow", types.MergePatchType,
		[]byte(`{"metadata":{"labels":{"enabled":null}}}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 60*time.Second, "finalize on opt-out", func() error {
		w, err := dyn.Resource(widgetsGVR).Namespace(ns).Get(ctx, "ow", metav1.GetOptions{})
		if err != nil {
			return err
		}
		if hasFinalizer(w, fin) {
			return fmt.Errorf("finalizer still present")
		}
		names, err := configMapNames(ctx, ns, "ow")
		if err != nil || len(names) != 0 {
			return fmt.Errorf("children left: %v %v", names, err)
		}
		return nil
	})
}

// TestControllerDeletionReleasesFinalizers: deleting a CompositeController
// removes its finalizer from every parent, so they can still be deleted
// (upstream leaves them stuck).
func TestControllerDeletionReleasesFinalizers(t *testing.T) {
	ctx := context.Background()
	inst := startMetabus(t, allinone.Config{}, nil)
	ns := newNamespace(t)
	hook := &teardownHook{}
	finalizeController(t, inst, "widgets-release", hookServer(t, jsonHook(hook.handle)), nil)
	const fin = "metacontroller.io/compositecontroller-widgets-release"
	for _, n := range []string{"r1", "r2"} {
		if _, err := dyn.Resource(widgetsGVR).Namespace(ns).Create(ctx, widgetLabels(n, nil), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	finalized := func(want bool) func() error {
		return func() error {
			for _, n := range []string{"r1", "r2"} {
				w, err := dyn.Resource(widgetsGVR).Namespace(ns).Get(ctx, n, metav1.GetOptions{})
				if err != nil {
					return err
				}
				if hasFinalizer(w, fin) != want {
					return fmt.Errorf("%s finalizers %v", n, w.GetFinalizers())
				}
			}
			return nil
		}
	}
	eventually(t, 30*time.Second, "finalizers on both parents", finalized(true))
	if err := dyn.Resource(v1alpha1.CompositeControllerGVR).Delete(ctx, "widgets-release", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "finalizers released", finalized(false))
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
	hook := &teardownHook{}
	url := hookServer(t, jsonHook(hook.handle))
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
