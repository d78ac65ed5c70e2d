package e2e

import (
	"context"
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/metabus/metabus/internal/allinone"
)

// TestAdoptAndRelease: an orphan matching the parent's selector is adopted
// (not recreated), an adopted orphan the hook does not want is deleted, and
// an owned child whose labels stop matching is released.
func TestAdoptAndRelease(t *testing.T) {
	ctx := context.Background()
	inst := startMetabus(t, allinone.Config{}, nil)
	ns := newNamespace(t)
	url := hookServer(t, jsonHook(widgetHook(nil)))
	widgetController(t, inst, "widgets-adopt", url, "OnDelete")

	orphan := func(name string, labels map[string]string) *corev1.ConfigMap {
		cm, err := kube.CoreV1().ConfigMaps(ns).Create(ctx, &corev1.ConfigMap{
			ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return cm
	}
	wanted := orphan("aw-x", map[string]string{"app": "aw"})      // the hook wants it: adopt it
	unwanted := orphan("aw-junk", map[string]string{"app": "aw"}) // matches, but not wanted: adopt, then delete
	foreign := orphan("aw-other", map[string]string{"app": "zz"}) // does not match: never touched

	if _, err := dyn.Resource(widgetsGVR).Namespace(ns).Create(ctx, newWidget("aw", []string{"a", "x"}, 1), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	parent, err := dyn.Resource(widgetsGVR).Namespace(ns).Get(ctx, "aw", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "adoption of the matching orphan", func() error {
		cm, err := kube.CoreV1().ConfigMaps(ns).Get(ctx, "aw-x", metav1.GetOptions{})
		if err != nil {
			return err
		}
		if cm.UID != wanted.UID {
			return fmt.Errorf("aw-x was recreated instead of adopted")
		}
		ref := metav1.GetControllerOf(cm)
		if ref == nil || ref.UID != parent.GetUID() {
			return fmt.Errorf("aw-x controller %v", ref)
		}
		return nil
	})
	eventually(t, 30*time.Second, "the unwanted adopted orphan to be deleted", func() error {
		cm, err := kube.CoreV1().ConfigMaps(ns).Get(ctx, "aw-junk", metav1.GetOptions{})
		if err == nil && cm.UID == unwanted.UID && cm.DeletionTimestamp == nil {
			return fmt.Errorf("still there, controller %v", metav1.GetControllerOf(cm))
		}
		return nil
	})
	if cm, err := kube.CoreV1().ConfigMaps(ns).Get(ctx, "aw-other", metav1.GetOptions{}); err != nil || metav1.GetControllerOf(cm) != nil || cm.UID != foreign.UID {
		t.Errorf("a non-matching orphan was touched: %v %v", err, cm.OwnerReferences)
	}

	// Release: the owned child aw-a stops matching the selector. One
	// apply adopts aw-x, deletes aw-junk and creates aw-a, in an order of
	// its own: wait for aw-a before changing it.
	eventually(t, 30*time.Second, "aw-a created and controlled by aw", func() error {
		cm, err := kube.CoreV1().ConfigMaps(ns).Get(ctx, "aw-a", metav1.GetOptions{})
		if err != nil {
			return err
		}
		if ref := metav1.GetControllerOf(cm); ref == nil || ref.UID != parent.GetUID() {
			return fmt.Errorf("aw-a controller %v", ref)
		}
		return nil
	})
	if _, err := kube.CoreV1().ConfigMaps(ns).Patch(ctx, "aw-a", types.MergePatchType,
		[]byte(`{"metadata":{"labels":{"app":"gone"}}}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "aw-a to be released", func() error {
		cm, err := kube.CoreV1().ConfigMaps(ns).Get(ctx, "aw-a", metav1.GetOptions{})
		if err != nil {
			return err
		}
		if ref := metav1.GetControllerOf(cm); ref != nil {
			return fmt.Errorf("still controlled by %s", ref.Name)
		}
		return nil
	})
}

// TestSelectorRequired: without generateSelector a parent must carry a
// usable spec.selector; one without it fails its sync with a clear Event.
func TestSelectorRequired(t *testing.T) {
	ctx := context.Background()
	inst := startMetabus(t, allinone.Config{}, nil)
	ns := newNamespace(t)
	url := hookServer(t, jsonHook(widgetHook(nil)))
	widgetController(t, inst, "widgets-noselector", url, "OnDelete")
	w := newWidget("nosel", []string{"a"}, 1)
	delete(w.Object["spec"].(map[string]any), "selector")
	if _, err := dyn.Resource(widgetsGVR).Namespace(ns).Create(ctx, w, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "a SyncError event about the selector", func() error {
		evs, err := kube.CoreV1().Events(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return err
		}
		for _, e := range evs.Items {
			if e.InvolvedObject.Name == "nosel" && e.Reason == "SyncError" {
				t.Logf("event: %s", e.Message)
				return nil
			}
		}
		return fmt.Errorf("no event yet")
	})
	if names, _ := configMapNames(ctx, ns, "nosel"); len(names) != 0 {
		t.Errorf("children created for a parent without a selector: %v", names)
	}
}
