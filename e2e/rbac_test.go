package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/metabus/metabus/internal/allinone"
)

// The shipped manifests' names (deploy/rbac).
const (
	applierRole         = "metabus-applier"
	applierAllResources = "metabus-applier-all-resources"
)

// installProductionRBAC installs what deploy/kustomization.yaml ships for
// the services' identities: the metabus namespace and every file of
// deploy/rbac, the applier's all-resources role included. It returns once
// kube-controller-manager has aggregated that role into the applier's, or
// the first test's writes would be refused.
func installProductionRBAC(ctx context.Context) error {
	if err := env.Apply(ctx, "../deploy/namespace.yaml", "../deploy/rbac"); err != nil {
		return err
	}
	return waitApplierRole(ctx, 60*time.Second, true)
}

// waitApplierRole waits until the applier's aggregated ClusterRole does
// (all) or does not (!all) hold the all-resources rule.
func waitApplierRole(ctx context.Context, timeout time.Duration, all bool) error {
	deadline := time.Now().Add(timeout)
	for {
		agg, err := kube.RbacV1().ClusterRoles().Get(ctx, applierRole, metav1.GetOptions{})
		if err == nil && slices.ContainsFunc(agg.Rules, func(r rbacv1.PolicyRule) bool { return slices.Contains(r.Resources, "*") }) == all {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("ClusterRole %s: all-resources rule present != %v after %s (%v)", applierRole, all, timeout, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// serviceAccount is the user a service runs as in the shipped manifests.
func serviceAccount(service string) string {
	return "system:serviceaccount:metabus:metabus-" + service
}

// asServiceAccounts is rc impersonating each service's ServiceAccount.
func asServiceAccounts(rc *rest.Config) map[string]*rest.Config {
	out := map[string]*rest.Config{}
	for _, s := range []string{allinone.ServiceWatcher, allinone.ServiceDispatcher, allinone.ServiceApplier, allinone.ServiceRevisions} {
		c := rest.CopyConfig(rc)
		c.Impersonate = rest.ImpersonationConfig{UserName: serviceAccount(s)}
		out[s] = c
	}
	return out
}

// serviceKubeconfig writes the test cluster's kubeconfig impersonating
// service's ServiceAccount (the kubeconfig's "as"), for the tests that run
// the service binaries.
func serviceKubeconfig(t *testing.T, service string) string {
	t.Helper()
	cfg, err := clientcmd.LoadFromFile(env.Kubeconfig)
	if err != nil {
		t.Fatalf("read the test kubeconfig: %v", err)
	}
	for _, a := range cfg.AuthInfos {
		a.Impersonate = serviceAccount(service)
	}
	path := filepath.Join(t.TempDir(), service+".kubeconfig")
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		t.Fatalf("write %s: %v", path, err)
	}
	return path
}

// grantDispatcherSecrets does in ns what an admin does for each
// --secret-namespaces entry (and Helm's dispatcher.secretNamespaces does):
// a copy of the Role and RoleBinding metabus-dispatcher-secrets that
// deploy/rbac/dispatcher.yaml ships for the metabus namespace.
func grantDispatcherSecrets(t *testing.T, ns string) {
	t.Helper()
	data, err := os.ReadFile("../deploy/rbac/dispatcher.yaml")
	if err != nil {
		t.Fatal(err)
	}
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
	copied := 0
	for {
		var raw json.RawMessage
		if err := dec.Decode(&raw); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatalf("deploy/rbac/dispatcher.yaml: %v", err)
		}
		u := &unstructured.Unstructured{}
		if err := u.UnmarshalJSON(raw); err != nil {
			t.Fatalf("deploy/rbac/dispatcher.yaml: %v", err)
		}
		if u.GetName() != "metabus-dispatcher-secrets" || (u.GetKind() != "Role" && u.GetKind() != "RoleBinding") {
			continue
		}
		u.SetNamespace(ns)
		gvr := rbacv1.SchemeGroupVersion.WithResource(strings.ToLower(u.GetKind()) + "s")
		if _, err := dyn.Resource(gvr).Namespace(ns).Create(context.Background(), u, metav1.CreateOptions{}); err != nil {
			t.Fatalf("copy %s metabus-dispatcher-secrets to %s: %v", u.GetKind(), ns, err)
		}
		copied++
	}
	if copied != 2 {
		t.Fatalf("deploy/rbac/dispatcher.yaml: found %d of the Role and RoleBinding metabus-dispatcher-secrets", copied)
	}
}

// narrowDispatcherSecrets does what the hardened profile does to the
// dispatcher's Secret reads (deploy/overlays/hardened leaves out
// rbac/dispatcher-secrets-all-namespaces.yaml): only the Roles of the
// namespaces it is given remain, until the test ends.
func narrowDispatcherSecrets(t *testing.T) {
	t.Helper()
	ctx := context.Background()
	const name = "metabus-dispatcher-secrets-all-namespaces"
	if err := kube.RbacV1().ClusterRoleBindings().Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := env.Apply(ctx, "../deploy/rbac/dispatcher-secrets-all-namespaces.yaml"); err != nil {
			t.Errorf("restore %s: %v", name, err)
		}
	})
}

// narrowApplier does what an admin narrowing the applier does (kustomize:
// drop rbac/applier-all-resources.yaml; Helm: applier.rbac.allResources=false)
// until the test ends.
func narrowApplier(t *testing.T) {
	t.Helper()
	ctx := context.Background()
	if err := kube.RbacV1().ClusterRoles().Delete(ctx, applierAllResources, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := env.Apply(ctx, "../deploy/rbac/applier-all-resources.yaml"); err != nil {
			t.Errorf("restore %s: %v", applierAllResources, err)
			return
		}
		if err := waitApplierRole(ctx, 60*time.Second, true); err != nil {
			t.Error(err)
		}
	})
	if err := waitApplierRole(ctx, 60*time.Second, false); err != nil {
		t.Fatal(err)
	}
}

// TestApplierNarrowedRBAC (issue #14): the applier runs under its production
// ClusterRole (deploy/rbac/applier.yaml, aggregated by the control plane's
// clusterrole-aggregation controller) without the all-resources role, which
// the test deletes as an admin would, plus a role for the parent kind only. A child kind it may not write is an
// ApplyForbidden Warning Event on the parent that names the verb, resource
// and namespace and the RBAC to grant; the sync is not retried hot; once an
// admin labels a role granting the kind, the next change of the parent
// converges.
func TestApplierNarrowedRBAC(t *testing.T) {
	ctx := context.Background()
	sa := serviceAccount(allinone.ServiceApplier)
	narrowApplier(t)
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
			agg, err := kube.RbacV1().ClusterRoles().Get(ctx, applierRole, metav1.GetOptions{})
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

	inst := startMetabus(t, allinone.Config{}, nil)
	ns := newNamespace(t)
	var calls atomic.Int64
	url := hookServer(t, jsonHook(widgetHook(&calls)))
	createController(t, inst, compositeKind, "narrowed-"+ns, map[string]any{
		"parentResource": map[string]any{"apiVersion": "test.metabus.dev/v1", "resource": "widgets"},
		"childResources": []any{map[string]any{"apiVersion": "v1", "resource": "configmaps"}},
		"hooks":          map[string]any{"sync": map[string]any{"webhook": map[string]any{"url": url}}},
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

// narrowClusterRole replaces the rules of a shipped ClusterRole until the
// test ends or it calls the returned restore, as an admin narrowing it
// would, and waits until the API server's authorizer applies the new rules
// to the role's ServiceAccount (probe: a verb on a resource the narrowed
// rules no longer grant).
func narrowClusterRole(t *testing.T, name, service string, rules []rbacv1.PolicyRule, probe authorizationv1.ResourceAttributes) (restore func()) {
	t.Helper()
	ctx := context.Background()
	role, err := kube.RbacV1().ClusterRoles().Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	shipped := role.Rules
	role.Rules = rules
	if _, err := kube.RbacV1().ClusterRoles().Update(ctx, role, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	allowed := func() (bool, error) {
		r, err := kube.AuthorizationV1().SubjectAccessReviews().Create(ctx, &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
			User: serviceAccount(service), ResourceAttributes: &probe,
		}}, metav1.CreateOptions{})
		if err != nil {
			return false, err
		}
		return r.Status.Allowed, nil
	}
	var once sync.Once
	restore = func() {
		once.Do(func() {
			cur, err := kube.RbacV1().ClusterRoles().Get(ctx, name, metav1.GetOptions{})
			if err == nil {
				cur.Rules = shipped
				_, err = kube.RbacV1().ClusterRoles().Update(ctx, cur, metav1.UpdateOptions{})
			}
			if err != nil {
				t.Errorf("restore ClusterRole %s: %v", name, err)
				return
			}
			eventually(t, 30*time.Second, "the shipped rules of "+name+" back in force", func() error {
				if ok, err := allowed(); err != nil || !ok {
					return fmt.Errorf("%s may not %s %s yet (%v)", service, probe.Verb, probe.Resource, err)
				}
				return nil
			})
		})
	}
	t.Cleanup(restore)
	eventually(t, 30*time.Second, "the narrowed rules of "+name+" in force", func() error {
		if ok, err := allowed(); err != nil || ok {
			return fmt.Errorf("%s may still %s %s (%v)", service, probe.Verb, probe.Resource, err)
		}
		return nil
	})
	return restore
}

// TestWatcherNarrowedRBAC (issue 26): the watcher runs under its
// production ClusterRole, not with more rights. With the wildcard read
// replaced by the resources one controller uses (what deploy/rbac/
// watcher.yaml tells admins they may do), that controller converges and one
// naming a resource outside the list is never synced: had the watcher more
// rights than its ClusterRole, it would be. Once the shipped role is back,
// the second converges too.
func TestWatcherNarrowedRBAC(t *testing.T) {
	ctx := context.Background()
	read := []string{"get", "list", "watch"}
	restore := narrowClusterRole(t, "metabus-watcher", allinone.ServiceWatcher, []rbacv1.PolicyRule{
		{APIGroups: []string{"metacontroller.k8s.io"}, Resources: []string{"compositecontrollers", "decoratorcontrollers", "mapcontrollers", "controllerrevisions"}, Verbs: read},
		{APIGroups: []string{"test.metabus.dev"}, Resources: []string{"widgets"}, Verbs: read},
		{APIGroups: []string{""}, Resources: []string{"services"}, Verbs: read},
		{APIGroups: []string{"", "events.k8s.io"}, Resources: []string{"events"}, Verbs: []string{"create", "patch"}},
	}, authorizationv1.ResourceAttributes{Verb: "list", Resource: "configmaps"})

	inst := startMetabus(t, allinone.Config{}, nil)
	ns := newNamespace(t)
	var granted, refused atomic.Int64
	statusHook := func(calls *atomic.Int64) string {
		return hookServer(t, jsonHook(func(map[string]any) (int, any) {
			calls.Add(1)
			return 200, map[string]any{"status": map[string]any{"synced": true}, "children": []any{}}
		}))
	}
	byMode := func(mode string) map[string]any {
		return map[string]any{"apiVersion": "test.metabus.dev/v1", "resource": "widgets",
			"labelSelector": map[string]any{"matchLabels": map[string]any{"mode": mode}}}
	}
	createController(t, inst, compositeKind, "watcher-granted-"+ns, map[string]any{
		"parentResource": byMode("granted"),
		"childResources": []any{map[string]any{"apiVersion": "v1", "resource": "services"}},
		"hooks":          map[string]any{"sync": map[string]any{"webhook": map[string]any{"url": statusHook(&granted)}}},
	})
	createController(t, inst, compositeKind, "watcher-refused-"+ns, map[string]any{
		"parentResource": byMode("refused"),
		"childResources": []any{map[string]any{"apiVersion": "v1", "resource": "configmaps"}},
		"hooks":          map[string]any{"sync": map[string]any{"webhook": map[string]any{"url": hookServer(t, jsonHook(widgetHook(&refused)))}}},
	})
	for name, mode := range map[string]string{"g": "granted", "w": "refused"} {
		w := newWidget(name, []string{"a"}, 1)
		w.SetLabels(map[string]string{"mode": mode})
		if _, err := dyn.Resource(widgetsGVR).Namespace(ns).Create(ctx, w, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, 30*time.Second, "the controller whose resources the watcher may read to sync", func() error {
		g, err := dyn.Resource(widgetsGVR).Namespace(ns).Get(ctx, "g", metav1.GetOptions{})
		if err != nil {
			return err
		}
		if synced, _, _ := unstructured.NestedBool(g.Object, "status", "synced"); !synced {
			return fmt.Errorf("status %v", g.Object["status"])
		}
		return nil
	})
	// The other has had as long, and longer: no configmaps informer can
	// sync, so its parents are never sent to its hook.
	time.Sleep(5 * time.Second)
	if n := refused.Load(); n != 0 {
		t.Fatalf("the controller naming configmaps, which the narrowed watcher may not list, was synced %d times: the watcher runs with more rights than its ClusterRole", n)
	}
	restore()
	eventually(t, 60*time.Second, "the other controller's child once the shipped ClusterRole is back", func() error {
		_, err := kube.CoreV1().ConfigMaps(ns).Get(ctx, "w-a", metav1.GetOptions{})
		return err
	})
}

// TestRevisionsNarrowedRBAC (issue 26): the revisions service runs under
// its production ClusterRole, not with more rights. Without its rule on
// controllerrevisions a rolling controller's parent never reaches its hook
// (its revision history cannot be loaded) and no Pod is created: had the
// service more rights than its ClusterRole, the rollout would proceed. With
// the shipped role back, it does.
func TestRevisionsNarrowedRBAC(t *testing.T) {
	ctx := context.Background()
	restore := narrowClusterRole(t, "metabus-revisions", allinone.ServiceRevisions, []rbacv1.PolicyRule{
		{APIGroups: []string{"", "events.k8s.io"}, Resources: []string{"events"}, Verbs: []string{"create", "patch"}},
	}, authorizationv1.ResourceAttributes{Verb: "list", Group: "metacontroller.k8s.io", Resource: "controllerrevisions"})

	inst := startMetabus(t, allinone.Config{}, nil)
	ns := newNamespace(t)
	var calls atomic.Int64
	url := hookServer(t, jsonHook(func(req map[string]any) (int, any) {
		calls.Add(1)
		return rollsetHook(req)
	}))
	rollsetController(t, inst, "revisions-narrowed-"+ns, url, "RollingRecreate")
	createRollSet(t, ns, "r", 1, 1)
	time.Sleep(8 * time.Second)
	if n := calls.Load(); n != 0 {
		t.Fatalf("the rolling controller's hook was called %d times though the revisions service may not read ControllerRevisions: it runs with more rights than its ClusterRole", n)
	}
	if pods, err := kube.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{}); err != nil || len(pods.Items) != 0 {
		t.Fatalf("Pods %v (%v), want none", pods, err)
	}
	restore()
	eventually(t, 60*time.Second, "the rolling controller's Pod once the shipped ClusterRole is back", func() error {
		_, err := kube.CoreV1().Pods(ns).Get(ctx, "r-0", metav1.GetOptions{})
		return err
	})
}
