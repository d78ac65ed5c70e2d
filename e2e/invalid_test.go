package e2e

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/metabus/metabus/internal/allinone"
)

// TestDuplicateChildResourceRejected (issue 13 #1): a controller that lists
// one child resource twice would delete and recreate every child on every
// sync. It is refused with a CreateError Event on the controller, and its
// hook is never called.
func TestDuplicateChildResourceRejected(t *testing.T) {
	ctx := context.Background()
	inst := startMetabus(t, allinone.Config{}, nil)
	ns := newNamespace(t)
	var calls atomic.Int64
	url := hookServer(t, jsonHook(func(map[string]any) (int, any) {
		calls.Add(1)
		return 200, map[string]any{}
	}))
	cm := map[string]any{"apiVersion": "v1", "resource": "configmaps"}
	createController(t, inst, compositeKind, "widgets-duplicate", map[string]any{
		"parentResource": map[string]any{"apiVersion": "test.metabus.dev/v1", "resource": "widgets"},
		"childResources": []any{cm, cm},
		"hooks":          map[string]any{"sync": map[string]any{"webhook": map[string]any{"url": url}}},
	})
	if _, err := dyn.Resource(widgetsGVR).Namespace(ns).Create(ctx, newWidget("dup", nil, 1), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "a CreateError event on the controller", func() error {
		evs, err := kube.CoreV1().Events(metav1.NamespaceDefault).List(ctx, metav1.ListOptions{})
		if err != nil {
			return err
		}
		for _, e := range evs.Items {
			if e.InvolvedObject.Name == "widgets-duplicate" && e.Reason == "CreateError" && e.Type == "Warning" {
				if !strings.Contains(e.Message, "spec.childResources[1]") {
					return fmt.Errorf("CreateError does not name the duplicate: %q", e.Message)
				}
				return nil
			}
		}
		return fmt.Errorf("no CreateError event yet")
	})
	time.Sleep(2 * time.Second)
	if n := calls.Load(); n != 0 {
		t.Errorf("the hook of a refused controller was called %d times", n)
	}
}
