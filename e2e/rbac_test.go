package e2e

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"

	"github.com/metabus/metabus/pkg/allinone"
)

// TestApplierNarrowedRBAC (issue #14): the applier runs under its production
// ClusterRole (deploy/rbac/applier.yaml, aggregated by the control plane's
// clusterrole-aggregation controller) without the all-resources role, plus
// a role for the parent kind only. A child kind it may not write is an
// ApplyForbidden Warning Event on the parent that names the verb, resource
// and namespace and the RBAC to grant; the sync is not retried hot; once an
// admin labels a role granting the kind, the next change of the parent
// converges.
func TestApplierNarrowedRBAC(t *testing.T) {
	ctx := context.Background()
	const sa = "system:serviceaccount:metabus:metabus-applier"
	if _, err := kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "metabus"}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	if err := env.Apply(ctx, "../deploy/rbac/applier.yaml"); err != nil {
		t.Fatalf("apply the applier's production RBAC: %v", err)
	}
	grant := func(name string, rules ...rbacv1.PolicyRule) {
		t.Helper()
		role := &rbacv1.ClusterRole{
			ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"metabus.dev/aggregate-to-applier": "true"}},
			Rules:      rules,
		}
		if _, err := kube.RbacV1().ClusterRoles().Create(ctx, role, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = kube.RbacV1().ClusterRoles().Delete(context.Background(), name, metav1.DeleteOptions{}) })
		eventually(t, 30*time.Second, "the applier's ClusterRole to aggregate "+name, func() error {
			agg, err := kube.RbacV1().ClusterRoles().Get(ctx, "metabus-applier", metav1.GetOptions{})
			if err != nil {
				return err
			}
			for _, r := range rules {
				if !slices.ContainsFunc(agg.Rules, func(a rbacv1.PolicyRule) bool { return slices.Equal(a.Resources, r.Resources) }) {
					return fmt.Errorf("no rule for %v yet", r.Resources)
				}
			}
			return nil
		})
	}
	grant("e2e-applier-widgets",
		rbacv1.PolicyRule{APIGroups: []string{"test.metabus.dev"}, Resources: []string{"widgets"}, Verbs: []string{"get", "update"}},
		rbacv1.PolicyRule{APIGroups: []string{"test.metabus.dev"}, Resources: []string{"widgets/status"}, Verbs: []string{"update"}})

	applierREST := rest.CopyConfig(env.Config)
	applierREST.Impersonate = rest.ImpersonationConfig{UserName: sa}
	inst := startMetabusDeps(t, allinone.Config{}, nil, nil, applierREST)
	ns := newNamespace(t)
	var calls atomic.Int64
	url := hookServer(t, jsonHook(widgetHook(&calls)))
	createController(t, inst, map[string]any{
		"metadata": map[string]any{"name": "narrowed-" + ns},
		"spec": map[string]any{
			"parentResource": map[string]any{"apiVersion": "test.metabus.dev/v1", "resource": "widgets"},
			"childResources": []any{map[string]any{"apiVersion": "v1", "resource": "configmaps"}},
			"hooks":          map[string]any{"sync": map[string]any{"webhook": map[string]any{"url": url}}},
		},
	})
	if _, err := dyn.Resource(widgetsGVR).Namespace(ns).Create(ctx, newWidget("w", []string{"a"}, 1), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	forbidden := func() ([]corev1.Event, error) {
		evs, err := kube.CoreV1().Events(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return nil, err
		}
		var out []corev1.Event
		for _, e := range evs.Items {
			if e.InvolvedObject.Name == "w" && e.Reason == "ApplyForbidden" && e.Type == corev1.EventTypeWarning {
				out = append(out, e)
			}
		}
		return out, nil
	}
	var first corev1.Event
	eventually(t, 30*time.Second, "an ApplyForbidden Event on the parent", func() error {
		evs, err := forbidden()
		if err != nil || len(evs) == 0 {
			return fmt.Errorf("none yet (%v)", err)
		}
		first = evs[0]
		return nil
	})
	for _, want := range []string{
		sa + " may not create configmaps (API group core)", fmt.Sprintf("in namespace %q", ns),
		`labelled metabus.dev/aggregate-to-applier: "true"`, `rule {apiGroups: [""], resources: ["configmaps"], verbs: ["create"]}`,
		"applier.rbac.extraRules", "retrying in 1m0s",
	} {
		if !strings.Contains(first.Message, want) {
			t.Errorf("ApplyForbidden message %q lacks %q", first.Message, want)
		}
	}

	// Not retried hot: the usual backoff (1s, 2s, 4s, 8s...) would call the
	// hook 3 or 4 more times in 15s.
	before := calls.Load()
	time.Sleep(15 * time.Second)
	if extra := calls.Load() - before; extra > 1 {
		t.Errorf("the hook was called %d more times in 15s after ApplyForbidden; want the sync retried after a minute", extra)
	}
	if _, err := kube.CoreV1().ConfigMaps(ns).Get(ctx, "w-a", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Fatalf("the child exists (%v) though the applier may not create ConfigMaps", err)
	}

	// The admin grants the kind; the parent's next change converges at once.
	grant("e2e-applier-configmaps", rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"get", "create", "update", "patch", "delete"}})
	w, err := dyn.Resource(widgetsGVR).Namespace(ns).Get(ctx, "w", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	w.SetAnnotations(map[string]string{"poke": "1"})
	if _, err := dyn.Resource(widgetsGVR).Namespace(ns).Update(ctx, w, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "the child once ConfigMaps are granted", func() error {
		_, err := kube.CoreV1().ConfigMaps(ns).Get(ctx, "w-a", metav1.GetOptions{})
		return err
	})
}
