package e2e

import (
	"context"
	"fmt"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	ctlid "github.com/metabus/metabus/pkg/identity"
)

// Controller identities (issue 35 item 1), run by TestHostile under the
// hardened profile: the applier writes for a controller as the
// ServiceAccount it names, or the profile's default account, so the API
// server's RBAC on that account, not the applier's own role (which the
// suite grants ConfigMaps cluster-wide), decides where its writes land.
//
// In this harness the services' own requests impersonate their accounts
// (asServiceAccounts), and the API server does not chain impersonation: a
// controller's writes are made by the test's admin impersonating the
// controller's account. What they may write is the account's RBAC, as in a
// cluster; the applier's grant to impersonate it is checked by the deploy
// tests (TestControllerIdentity), not here.

// identityNamespaces: a controller acting as an account allowed to write
// ConfigMaps in namespace A only (and to read Namespaces, its parents)
// decorates Namespace A, and its hook places one ConfigMap in A and one in
// B. The one in A is written; the one
// in B is refused, with an ApplyForbidden Event on the Namespace naming the
// account, the verb, the resource and B.
func (h *hostile) identityNamespaces(t *testing.T) {
	ctx := context.Background()
	own, other := newNamespace(t), newNamespace(t)
	const account = "deployer"
	grantAccount(t, own, account, rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"configmaps"},
		Verbs: []string{"get", "list", "watch", "create", "update", "patch", "delete"}})
	grantClusterRole(t, own, account, "e2e-identity-ns-"+own, namespaceReads)
	hook := h.hook(t, func(map[string]any) (int, any) {
		return 200, map[string]any{"attachments": []any{cmAttachment(own, "identity-own"), cmAttachment(other, "identity-other")}}
	})
	h.controllerAs(t, decoratorKind, "identity-ns-"+own, own+"/"+account, namespaceDecorator(own, hook.URL))

	eventually(t, 45*time.Second, "the ConfigMap in the account's namespace", func() error {
		_, err := kube.CoreV1().ConfigMaps(own).Get(ctx, "identity-own", metav1.GetOptions{})
		return err
	})
	user := fmt.Sprintf("system:serviceaccount:%s:%s", own, account)
	eventually(t, 45*time.Second, "ApplyForbidden naming the account on the Namespace", func() error {
		return warningEvent(ctx, metav1.NamespaceDefault, own, "ApplyForbidden", user+" may not create configmaps",
			fmt.Sprintf("in namespace %q", other), "acts as ServiceAccount "+own+"/"+account)
	})
	if _, err := kube.CoreV1().ConfigMaps(other).Get(ctx, "identity-other", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("ConfigMap %s/identity-other: %v, want NotFound", other, err)
	}
}

// identityDefault: a controller that names no account acts as the
// profile's default one, bound to nothing: it may not even read its
// parent, so its hook is never called and nothing is written, even in its
// parent's own namespace; a ReadWithheld Event on the controller says why.
func (h *hostile) identityDefault(t *testing.T) {
	ctx := context.Background()
	ns := newNamespace(t)
	def := h.cfg.Applier.DefaultServiceAccount
	if def.None() {
		t.Fatal("the hardened profile sets no --default-service-account")
	}
	hook := h.hook(t, func(map[string]any) (int, any) {
		return 200, map[string]any{"attachments": []any{cmAttachment(ns, "identity-default")}}
	})
	ctrl := "identity-default-" + ns
	h.controllerAs(t, decoratorKind, ctrl, "", namespaceDecorator(ns, hook.URL))
	eventually(t, 45*time.Second, "ReadWithheld naming the default account on the controller", func() error {
		return warningEvent(ctx, metav1.NamespaceDefault, ctrl, "ReadWithheld", "ServiceAccount "+def.String()+" may not list and watch namespaces (cluster-wide)")
	})
	if n := hook.count(ctrl); n != 0 {
		t.Errorf("the hook was called %d times for a parent its controller's account may not read", n)
	}
	if _, err := kube.CoreV1().ConfigMaps(ns).Get(ctx, "identity-default", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("ConfigMap %s/identity-default: %v, want NotFound", ns, err)
	}
}

// identityInvalid: an annotation that is not <namespace>/<name> (here a
// user name, to claim another identity) starts nothing: the watcher reads
// nothing for it and the applier writes nothing, neither as the default
// nor as themselves, and the controller says so.
func (h *hostile) identityInvalid(t *testing.T) {
	ctx := context.Background()
	ns := newNamespace(t)
	hook := h.hook(t, func(map[string]any) (int, any) {
		return 200, map[string]any{"attachments": []any{cmAttachment(ns, "identity-invalid")}}
	})
	ctrl := "identity-invalid-" + ns
	h.controllerAs(t, decoratorKind, ctrl, "system:masters", namespaceDecorator(ns, hook.URL))
	eventually(t, 45*time.Second, "InvalidServiceAccount on the controller", func() error {
		return warningEvent(ctx, metav1.NamespaceDefault, ctrl, "InvalidServiceAccount", ctlid.ServiceAccountAnnotation, "nothing is written")
	})
	if n := hook.count(ctrl); n != 0 {
		t.Errorf("the hook was called %d times for a controller whose identity is invalid", n)
	}
	if _, err := kube.CoreV1().ConfigMaps(ns).Get(ctx, "identity-invalid", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("ConfigMap %s/identity-invalid: %v, want NotFound", ns, err)
	}
}

// namespaceDecorator is the spec of a DecoratorController of Namespace ns
// with ConfigMap attachments.
func namespaceDecorator(ns, hookURL string) map[string]any {
	return map[string]any{
		"resources": []any{map[string]any{"apiVersion": "v1", "resource": "namespaces",
			"labelSelector": map[string]any{"matchLabels": map[string]any{"kubernetes.io/metadata.name": ns}}}},
		"attachments": []any{map[string]any{"apiVersion": "v1", "resource": "configmaps"}},
		"hooks":       map[string]any{"sync": map[string]any{"webhook": map[string]any{"url": hookURL}}},
	}
}

func cmAttachment(ns, name string) map[string]any {
	return map[string]any{"apiVersion": "v1", "kind": "ConfigMap",
		"metadata": map[string]any{"name": name, "namespace": ns}, "data": map[string]any{"k": "v"}}
}

// grantAccount creates ServiceAccount ns/name bound, in ns only, to rules:
// what an admin grants a tenant's controller identity.
func grantAccount(t *testing.T, ns, name string, rules ...rbacv1.PolicyRule) {
	t.Helper()
	ctx := context.Background()
	createAccount(t, ns, name)
	if _, err := kube.RbacV1().Roles(ns).Create(ctx, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: name}, Rules: rules}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	binding := &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: name},
		Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Name: name, Namespace: ns}},
	}
	if _, err := kube.RbacV1().RoleBindings(ns).Create(ctx, binding, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// grantClusterAccount creates ServiceAccount ns/name bound cluster-wide to
// rules until the test ends, and returns "<ns>/<name>".
func grantClusterAccount(t *testing.T, ns, name string, rules ...rbacv1.PolicyRule) string {
	t.Helper()
	createAccount(t, ns, name)
	grantClusterRole(t, ns, name, name, rules...)
	return ns + "/" + name
}

// grantClusterRole binds ServiceAccount ns/name cluster-wide to rules, in
// a ClusterRole and ClusterRoleBinding named role, until the test ends.
func grantClusterRole(t *testing.T, ns, name, role string, rules ...rbacv1.PolicyRule) {
	t.Helper()
	ctx := context.Background()
	if _, err := kube.RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: role}, Rules: rules}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = kube.RbacV1().ClusterRoles().Delete(context.Background(), role, metav1.DeleteOptions{}) })
	binding := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: role},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role},
		Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Name: name, Namespace: ns}},
	}
	if _, err := kube.RbacV1().ClusterRoleBindings().Create(ctx, binding, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = kube.RbacV1().ClusterRoleBindings().Delete(context.Background(), role, metav1.DeleteOptions{})
	})
}

func createAccount(t *testing.T, ns, name string) {
	t.Helper()
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name}}
	if _, err := kube.CoreV1().ServiceAccounts(ns).Create(context.Background(), sa, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}
