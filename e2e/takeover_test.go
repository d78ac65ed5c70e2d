package e2e

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/metabus/metabus/internal/allinone"
	"github.com/metabus/metabus/pkg/apply"
)

// TestHostileTakeover (issue 35, items 3 and 7): a tenant's hook asks for
// children named like objects that exist and that no one gave its
// controller: an orphan ConfigMap of the platform team (aws-auth, as on
// EKS), and one another controller controls. Under each apply strategy,
// with the hardened profile (the applier may write every ConfigMap), both
// stay exactly as they were (data, labels, owner references,
// managedFields: their resourceVersion), a CreateConflict Event on the
// parent names each and who holds it, and the rest of the apply goes on
// (the tenant's own child is created). Once the platform team deletes its
// ConfigMap, the create retried with backoff makes it the parent's child.
// Under server-side apply the created child's fields belong to the field
// manager's Apply entry alone, as if an apply had created it.
func TestHostileTakeover(t *testing.T) {
	for _, s := range applyStrategies {
		t.Run(string(s), func(t *testing.T) {
			h := startHostile(t, func(cfg *allinone.Config) { cfg.Applier.Strategy = s })
			h.takeover(t, s)
		})
	}
}

func (h *hostile) takeover(t *testing.T, strategy apply.Strategy) {
	ctx := context.Background()
	ns := newNamespace(t)
	cms := kube.CoreV1().ConfigMaps(ns)

	// The platform team's objects, written by its own field manager.
	platform := func(name string, refs string) {
		t.Helper()
		body := fmt.Sprintf(`{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":%q,"namespace":%q,"labels":{"team":"platform"}%s},"data":{"mapRoles":"platform-admins"}}`,
			name, ns, refs)
		if _, err := dyn.Resource(configMapsGVR).Namespace(ns).Patch(ctx, name, types.ApplyPatchType, []byte(body),
			metav1.PatchOptions{FieldManager: "platform-team"}); err != nil {
			t.Fatalf("the platform team's %s: %v", name, err)
		}
	}
	platform("aws-auth", "")
	platform("anchor", "")
	anchor, err := cms.Get(ctx, "anchor", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	platform("controlled", fmt.Sprintf(`,"ownerReferences":[{"apiVersion":"v1","kind":"ConfigMap","name":"anchor","uid":%q,"controller":true}]`, anchor.UID))
	before := map[string]*corev1.ConfigMap{}
	for _, name := range []string{"aws-auth", "controlled"} {
		cm, err := cms.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		before[name] = cm
	}

	mode := "takeover-" + string(strategy)
	hook := h.hook(t, func(map[string]any) (int, any) {
		child := func(name string) map[string]any {
			return map[string]any{"apiVersion": "v1", "kind": "ConfigMap",
				"metadata": map[string]any{"name": name, "labels": map[string]any{"app": "w"}},
				"data":     map[string]any{"mapRoles": "tenant-is-cluster-admin"}}
		}
		return 200, map[string]any{"children": []any{child("aws-auth"), child("controlled"), child("tenant-own")}}
	})
	h.controller(t, compositeKind, "hostile-takeover-"+ns, map[string]any{
		"parentResource": selecting(mode),
		"childResources": []any{map[string]any{"apiVersion": "v1", "resource": "configmaps", "updateStrategy": map[string]any{"method": "InPlace"}}},
		"hooks":          map[string]any{"sync": map[string]any{"webhook": map[string]any{"url": hook.URL}}},
	})
	h.widget(t, ns, "w", map[string]string{"mode": mode})

	var own *corev1.ConfigMap
	eventually(t, 30*time.Second, "the tenant's own child created", func() error {
		own, err = cms.Get(ctx, "tenant-own", metav1.GetOptions{})
		if err != nil {
			return err
		}
		if ref := metav1.GetControllerOf(own); ref == nil || ref.Name != "w" {
			return fmt.Errorf("tenant-own is not controlled by w: %v", own.OwnerReferences)
		}
		return nil
	})
	// The creates that met them have been retried with backoff (1 s,
	// 2 s, 4 s...) a few times by now.
	time.Sleep(4 * time.Second)
	for name, was := range before {
		cm, err := cms.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		type kept struct {
			Data          map[string]string
			Labels        map[string]string
			Owners        []metav1.OwnerReference
			ManagedFields []metav1.ManagedFieldsEntry
			Version       string
		}
		if diff := cmp.Diff(kept{was.Data, was.Labels, was.OwnerReferences, was.ManagedFields, was.ResourceVersion},
			kept{cm.Data, cm.Labels, cm.OwnerReferences, cm.ManagedFields, cm.ResourceVersion}); diff != "" {
			t.Errorf("%s was written (-before +after):\n%s", name, diff)
		}
	}
	eventually(t, 45*time.Second, "a CreateConflict on the parent naming both objects and who holds them", func() error {
		return warningEvent(ctx, ns, "w", "CreateConflict",
			"create ConfigMap "+ns+"/aws-auth", "no owner", "never taken over",
			"create ConfigMap "+ns+"/controlled", "controlled by v1 ConfigMap anchor, UID "+string(anchor.UID))
	})
	if strategy == apply.ServerSideApply {
		if own, err = cms.Get(ctx, "tenant-own", metav1.GetOptions{}); err != nil {
			t.Fatal(err)
		}
		var managers []string
		for _, e := range own.ManagedFields {
			managers = append(managers, e.Manager+" "+string(e.Operation))
		}
		if diff := cmp.Diff([]string{apply.DefaultFieldManager + " Apply"}, managers); diff != "" {
			t.Errorf("the created child's field managers (-want +got):\n%s", diff)
		}
	}

	// The platform team gives the name up: the create's next retry makes
	// a child of that name.
	if err := cms.Delete(ctx, "aws-auth", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 90*time.Second, "aws-auth created as the parent's child once free", func() error {
		cm, err := cms.Get(ctx, "aws-auth", metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return fmt.Errorf("not created yet")
		}
		if err != nil {
			return err
		}
		if ref := metav1.GetControllerOf(cm); ref == nil || ref.Name != "w" || cm.UID == before["aws-auth"].UID {
			return fmt.Errorf("aws-auth is not a new child of w: %v", cm.OwnerReferences)
		}
		return nil
	})
}
