package e2e

import (
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/yaml"

	"github.com/metabus/metabus/internal/allinone"
	"github.com/metabus/metabus/internal/testing/testnats"
	"github.com/metabus/metabus/internal/testing/testpki"
	"github.com/metabus/metabus/pkg/api/v1alpha1"
	"github.com/metabus/metabus/pkg/bus"
	ctlid "github.com/metabus/metabus/pkg/identity"
	"github.com/metabus/metabus/pkg/natscreds"
	"github.com/metabus/metabus/pkg/natsx"
	"github.com/metabus/metabus/services/dispatcher"
)

// The hostile-tenant suite (issue 26): metabus runs under the hardened
// profile (hardenedProfile: the settings SECURITY.md recommends for shared
// clusters), each service under its shipped RBAC (impersonating its
// ServiceAccount; the applier without its all-resources role) and as its
// own nkey user of a nats-server loaded from the shipped nats-server.conf.
// A tenant who may create controllers and parents, nothing else (an
// impersonated user with a ClusterRole for exactly that), tries to use
// metabus to reach what it may not. Every attempt must fail safely, with
// an Event (or, on the bus, a permission violation) saying why, and leak
// nothing: the listener it aimed at, or the hook it would have been sent
// to, proves it received nothing, and no Secret outside the namespaces the
// profile allows is ever read.

// Addresses of the test's network. Hooks the tenant may run listen on
// hookHost, the one loopback address the profile's destination policy lets
// through (in a cluster: the hooks' network); victims listen on other
// loopback addresses, which it denies.
const (
	hookHost   = "127.0.0.2"
	victimHost = "127.0.0.3"
	tenantUser = "e2e-hostile-tenant"
	// hookTokenSecret is the one Secret of metabus's namespace the suite's
	// admin lists as a hook credential (--hook-credential-secrets);
	// listedNATSCopy is listed too, but labelled as NATS credentials.
	hookTokenSecret = "e2e-hostile-hook-token"
	listedNATSCopy  = "e2e-hostile-listed-nats-copy"
)

// hardenedProfile is the hardened profile's settings, as shipped: the
// service arguments deploy/overlays/hardened sets, parsed by the services'
// own flags. hookHost is listed first among the hook destinations: the
// test's hooks run there (in a cluster, an admin lists the hooks' network
// the same way).
func hardenedProfile(t *testing.T) allinone.Config {
	t.Helper()
	data, err := os.ReadFile("../deploy/overlays/hardened/kustomization.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var kustomization struct {
		Patches []struct {
			Target struct{ Name string }
			Patch  string
		}
	}
	if err := yaml.Unmarshal(data, &kustomization); err != nil {
		t.Fatalf("deploy/overlays/hardened: %v", err)
	}
	args := map[string][]string{}
	for _, p := range kustomization.Patches {
		var ops []struct {
			Op    string
			Value any
		}
		if p.Target.Name == "" || yaml.Unmarshal([]byte(p.Patch), &ops) != nil {
			continue
		}
		for _, op := range ops {
			if v, ok := op.Value.(string); ok && (op.Op == "replace" || op.Op == "add") && strings.HasPrefix(v, "--") {
				args[p.Target.Name] = append(args[p.Target.Name], v)
			}
		}
	}
	var cfg allinone.Config
	for name, register := range map[string]func(*flag.FlagSet){
		"metabus-dispatcher": cfg.Dispatcher.RegisterFlags,
		"metabus-watcher":    cfg.Watcher.RegisterFlags,
		"metabus-applier":    cfg.Applier.RegisterFlags,
	} {
		if len(args[name]) == 0 {
			t.Fatalf("deploy/overlays/hardened sets no argument of %s", name)
		}
		fs := flag.NewFlagSet(name, flag.ContinueOnError)
		register(fs)
		if err := fs.Parse(args[name]); err != nil {
			t.Fatalf("deploy/overlays/hardened: %s %v: %v", name, args[name], err)
		}
		t.Logf("hardened profile: %s %s", name, strings.Join(args[name], " "))
	}
	for _, need := range []bool{len(cfg.Dispatcher.HookDestinations) > 0, cfg.Dispatcher.RefuseInsecureCredentials,
		len(cfg.Dispatcher.RelatedResources) > 0, len(cfg.Watcher.ControllerResources) > 0, !cfg.Applier.DefaultServiceAccount.None(),
		cfg.Watcher.DefaultServiceAccount == cfg.Applier.DefaultServiceAccount} {
		if !need {
			t.Fatalf("deploy/overlays/hardened lacks a narrowing setting the suite relies on: %+v %+v", cfg.Dispatcher, cfg.Watcher)
		}
	}
	cfg.Dispatcher.HookDestinations = append([]string{hookHost}, cfg.Dispatcher.HookDestinations...)
	return cfg
}

// hostile is the suite's running metabus and what it records.
type hostile struct {
	inst *instance
	// cfg is the profile the suite runs.
	cfg allinone.Config
	// writer is the account ("<namespace>/<name>") the tenant's
	// controllers act as unless a test says otherwise.
	writer string
	tenant dynamic.Interface
	nats   *testnats.Production
	// foreignSecretReads counts metabus's API requests on Secrets outside
	// the dispatcher's own namespace.
	foreignSecretReads atomic.Int64
	// ca signs the TLS hooks' certificates.
	ca *testpki.CA
	// namePort is the port of the policy's host name entry
	// "localhost:<namePort>", which resolves to loopback.
	namePort string
}

func TestHostile(t *testing.T) {
	h := startHostile(t)
	// Memory first and alone: the process's heap is what it measures.
	t.Run("memory", h.memory)
	for _, tc := range []struct {
		name string
		run  func(t *testing.T)
	}{
		{"applier-writes", h.applierWrites},
		{"foreign-secrets", h.foreignSecrets},
		{"credentials-over-http", h.credentialsOverHTTP},
		{"refused-resources", h.refusedResources},
		{"denied-destinations", h.deniedDestinations},
		{"name-destinations", h.nameDestinations},
		{"own-namespace-secrets", h.ownNamespaceSecrets},
		{"bus", h.bus},
		{"identity-namespaces", h.identityNamespaces},
		{"identity-default", h.identityDefault},
		{"identity-invalid", h.identityInvalid},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tc.run(t)
		})
	}
}

// startHostile starts the suite's metabus; edit, if any, changes its
// configuration (another apply strategy) after the hardened profile's.
func startHostile(t *testing.T, edit ...func(*allinone.Config)) *hostile {
	t.Helper()
	h := &hostile{ca: testpki.NewCA(t, "hostile hooks")}

	// The hardened profile's RBAC: the dispatcher reads Secrets in its own
	// namespace only, the applier is without its all-resources role and
	// granted the test's own parent and child kinds only.
	narrowDispatcherSecrets(t)
	narrowApplier(t)
	writes := []rbacv1.PolicyRule{
		{APIGroups: []string{"test.metabus.dev"}, Resources: []string{"widgets"}, Verbs: []string{"get", "update"}},
		{APIGroups: []string{"test.metabus.dev"}, Resources: []string{"widgets/status"}, Verbs: []string{"update"}},
		{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"get", "create", "update", "patch", "delete"}},
	}
	grantApplier(t, "e2e-hostile-applier", writes...)
	// The profile's default account may write and read nothing: the
	// tenant's controllers name an account an admin granted the same
	// writes, as cluster-wide as the applier's above, and the reads of the
	// kinds the suite's controllers declare (hostile_read_test.go and
	// identity_test.go narrow one).
	h.writer = grantClusterAccount(t, newNamespace(t), "e2e-hostile-writer", slices.Concat(writes, suiteReads)...)

	// The tenant: controllers and parents, nothing else.
	h.tenant = tenantClient(t, []rbacv1.PolicyRule{
		{APIGroups: []string{v1alpha1.GroupVersion.Group}, Resources: []string{"compositecontrollers", "decoratorcontrollers"}, Verbs: []string{"get", "list", "create", "update", "patch", "delete"}},
		{APIGroups: []string{"test.metabus.dev"}, Resources: []string{"widgets"}, Verbs: []string{"get", "list", "create", "update", "patch", "delete"}},
	})

	h.nats = testnats.StartProduction(t, "../deploy/nats/nats-server.conf")
	cfg := hardenedProfile(t)
	// An admin who allows hooks by host name: localhost on one port, and
	// on the API server's port (both resolve to loopback here; in a
	// cluster, a tenant's Service under an allowed domain aimed at the API
	// server or a metadata address).
	port, err := testnats.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	h.namePort = fmt.Sprint(port)
	_, apiPort, err := net.SplitHostPort(strings.TrimPrefix(env.Config.Host, "https://"))
	if err != nil {
		t.Fatalf("the API server's address %s: %v", env.Config.Host, err)
	}
	cfg.Dispatcher.HookDestinations = append([]string{"localhost:" + h.namePort, "localhost:" + apiPort}, cfg.Dispatcher.HookDestinations...)
	cfg.Dispatcher.HookCredentialSecrets = []string{hookTokenSecret, listedNATSCopy}
	cfg.NATS.URL = h.nats.URL
	h.cfg = cfg
	// Snapshots and revisions over NATS too, as between deployed services:
	// their replies are on the bus for the bus test to try to read.
	cfg.SnapshotsOverNATS = true
	for _, e := range edit {
		e(&cfg)
	}
	wrap := func(rt http.RoundTripper) http.RoundTripper {
		return roundTripFunc(func(r *http.Request) (*http.Response, error) {
			if strings.Contains(r.URL.Path, "/secrets") && !strings.Contains(r.URL.Path, "/namespaces/"+dispatcher.DefaultNamespace+"/") {
				h.foreignSecretReads.Add(1)
			}
			return rt.RoundTrip(r)
		})
	}
	h.inst = startMetabusDeps(t, cfg, nil, wrap, serviceAccounts, func(d *allinone.Deps) {
		d.ServiceNATS = map[string]natsx.ConnOptions{}
		for _, svc := range testnats.Services {
			d.ServiceNATS[svc] = natsx.ConnOptions{URL: h.nats.URL, NKeySeed: h.nats.Seeds[svc]}
		}
	})
	t.Cleanup(func() {
		if n := h.foreignSecretReads.Load(); n != 0 {
			t.Errorf("metabus made %d API requests on Secrets outside the namespace %s, the only one the profile allows", n, dispatcher.DefaultNamespace)
		}
	})
	return h
}

// grantApplier labels a ClusterRole for the applier's aggregation until the
// test ends, and waits for the aggregation.
func grantApplier(t *testing.T, name string, rules ...rbacv1.PolicyRule) {
	t.Helper()
	ctx := context.Background()
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
			found := false
			for _, a := range agg.Rules {
				found = found || fmt.Sprint(a.Resources) == fmt.Sprint(r.Resources)
			}
			if !found {
				return fmt.Errorf("no rule for %v yet", r.Resources)
			}
		}
		return nil
	})
}

// tenantClient is a dynamic client of the tenant user, bound to rules.
func tenantClient(t *testing.T, rules []rbacv1.PolicyRule) dynamic.Interface {
	t.Helper()
	ctx := context.Background()
	role := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: tenantUser}, Rules: rules}
	binding := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: tenantUser},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: tenantUser},
		Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: "User", Name: tenantUser}},
	}
	if _, err := kube.RbacV1().ClusterRoles().Create(ctx, role, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = kube.RbacV1().ClusterRoles().Delete(context.Background(), tenantUser, metav1.DeleteOptions{})
	})
	if _, err := kube.RbacV1().ClusterRoleBindings().Create(ctx, binding, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = kube.RbacV1().ClusterRoleBindings().Delete(context.Background(), tenantUser, metav1.DeleteOptions{})
	})
	rc := rest.CopyConfig(env.Config)
	rc.Impersonate = rest.ImpersonationConfig{UserName: tenantUser}
	return dynamic.NewForConfigOrDie(rc)
}

// controller creates a controller as the tenant, served by the suite's
// metabus.
func (h *hostile) controller(t *testing.T, kind, name string, spec map[string]any) {
	t.Helper()
	h.controllerAs(t, kind, name, h.writer, spec)
}

// controllerAs is controller naming account as its identity ("": none).
func (h *hostile) controllerAs(t *testing.T, kind, name, account string, spec map[string]any) {
	t.Helper()
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": v1alpha1.GroupVersion.String(), "kind": kind,
		"metadata": map[string]any{"name": name}, "spec": spec,
	}}
	u.SetLabels(h.inst.label())
	if account != "" {
		u.SetAnnotations(map[string]string{ctlid.ServiceAccountAnnotation: account})
	}
	gvr := controllerGVRs[kind]
	if _, err := h.tenant.Resource(gvr).Create(context.Background(), u, metav1.CreateOptions{}); err != nil {
		t.Fatalf("the tenant creates %s %s: %v", kind, name, err)
	}
	t.Cleanup(func() { _ = dyn.Resource(gvr).Delete(context.Background(), name, metav1.DeleteOptions{}) })
}

// widget creates a parent as the tenant.
func (h *hostile) widget(t *testing.T, ns, name string, labels map[string]string) {
	t.Helper()
	w := newWidget(name, nil, 1)
	w.SetLabels(labels)
	if _, err := h.tenant.Resource(widgetsGVR).Namespace(ns).Create(context.Background(), w, metav1.CreateOptions{}); err != nil {
		t.Fatalf("the tenant creates widget %s/%s: %v", ns, name, err)
	}
}

// selecting is a widgets parentResource selecting the label mode=value.
func selecting(value string) map[string]any {
	return map[string]any{"apiVersion": "test.metabus.dev/v1", "resource": "widgets",
		"labelSelector": map[string]any{"matchLabels": map[string]any{"mode": value}}}
}

// listener is a server that counts what it receives, per controller (the
// request's controller name; "" for requests that are not hook calls).
type listener struct {
	URL  string
	mu   sync.Mutex
	hits map[string]int
	all  atomic.Int64
}

func (l *listener) record(ctrl string) {
	l.all.Add(1)
	l.mu.Lock()
	defer l.mu.Unlock()
	l.hits[ctrl]++
}

func (l *listener) count(ctrl string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.hits[ctrl]
}

// serveOn serves h on host (a free port) until the test ends. A TLS
// listener gets a certificate of the suite's CA for host.
func (h *hostile) serveOn(t *testing.T, host string, useTLS bool, handle func(l *listener, w http.ResponseWriter, r *http.Request)) *listener {
	t.Helper()
	return h.serveAt(t, host, "0", useTLS, handle)
}

// serveAt is serveOn on a given port.
func (h *hostile) serveAt(t *testing.T, host, port string, useTLS bool, handle func(l *listener, w http.ResponseWriter, r *http.Request)) *listener {
	t.Helper()
	ln, err := net.Listen("tcp", net.JoinHostPort(host, port))
	if err != nil {
		t.Fatal(err)
	}
	l := &listener{hits: map[string]int{}}
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { handle(l, w, r) }))
	srv.Listener.Close()
	srv.Listener = ln
	if useTLS {
		certPEM, keyPEM := h.ca.Issue(t, host, net.ParseIP(host))
		cert, err := tls.X509KeyPair(certPEM, keyPEM)
		if err != nil {
			t.Fatal(err)
		}
		srv.TLS = &tls.Config{Certificates: []tls.Certificate{cert}}
		srv.StartTLS()
	} else {
		srv.Start()
	}
	t.Cleanup(srv.Close)
	l.URL = srv.URL
	return l
}

// hook serves a JSON hook on hookHost that records each call under the
// calling controller's name and answers with answer.
func (h *hostile) hook(t *testing.T, answer func(req map[string]any) (int, any)) *listener {
	t.Helper()
	return h.serveOn(t, hookHost, false, func(l *listener, w http.ResponseWriter, r *http.Request) {
		jsonHook(func(req map[string]any) (int, any) {
			name, _, _ := unstructured.NestedString(req, "controller", "metadata", "name")
			l.record(name)
			return answer(req)
		}).ServeHTTP(w, r)
	})
}

// victim is a listener the tenant must not reach: it counts every request.
func (h *hostile) victim(t *testing.T, host string) *listener {
	t.Helper()
	return h.serveOn(t, host, false, func(l *listener, w http.ResponseWriter, r *http.Request) {
		l.record("")
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{}`))
	})
}

func emptyAnswer(map[string]any) (int, any) { return 200, map[string]any{"children": []any{}} }

// refusedSync waits for a SyncError on the parent and on the controller,
// each containing every one of want.
func refusedSync(t *testing.T, ns, parent, ctrl string, want ...string) {
	t.Helper()
	ctx := context.Background()
	eventually(t, 45*time.Second, "a SyncError on the parent "+ns+"/"+parent, func() error {
		return warningEvent(ctx, ns, parent, "SyncError", want...)
	})
	eventually(t, 45*time.Second, "a SyncError on the controller "+ctrl, func() error {
		return warningEvent(ctx, metav1.NamespaceDefault, ctrl, "SyncError", want...)
	})
}

// applierWrites: the tenant's hook answers with what the profile's applier
// may not write. A ClusterRoleBinding making the tenant cluster-admin, as
// the attachment of a DecoratorController on a namespace (every namespace
// carries kubernetes.io/metadata.name, so the tenant needs no right on
// it): ApplyForbidden, nothing written. A Pod in another namespace than its
// parent's: InvalidDesiredState, nothing written.
func (h *hostile) applierWrites(t *testing.T) {
	ctx := context.Background()
	ns, other := newNamespace(t), newNamespace(t)
	crbName := "hostile-admin-" + ns
	crbHook := h.hook(t, func(map[string]any) (int, any) {
		return 200, map[string]any{"attachments": []any{map[string]any{
			"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
			"metadata": map[string]any{"name": crbName},
			"roleRef":  map[string]any{"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
			"subjects": []any{map[string]any{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": tenantUser}},
		}}}
	})
	h.controller(t, decoratorKind, "hostile-crb-"+ns, map[string]any{
		"resources": []any{map[string]any{"apiVersion": "v1", "resource": "namespaces",
			"labelSelector": map[string]any{"matchLabels": map[string]any{"kubernetes.io/metadata.name": ns}}}},
		"attachments": []any{map[string]any{"apiVersion": "rbac.authorization.k8s.io/v1", "resource": "clusterrolebindings"}},
		"hooks":       map[string]any{"sync": map[string]any{"webhook": map[string]any{"url": crbHook.URL}}},
	})

	podHook := h.hook(t, func(map[string]any) (int, any) {
		return 200, map[string]any{"children": []any{map[string]any{
			"apiVersion": "v1", "kind": "Pod",
			"metadata": map[string]any{"name": "hostile", "namespace": other},
			"spec":     map[string]any{"containers": []any{map[string]any{"name": "c", "image": "registry.invalid/x"}}},
		}}}
	})
	h.controller(t, compositeKind, "hostile-pod-"+ns, map[string]any{
		"parentResource": selecting("pod"),
		"childResources": []any{map[string]any{"apiVersion": "v1", "resource": "pods"}},
		"hooks":          map[string]any{"sync": map[string]any{"webhook": map[string]any{"url": podHook.URL}}},
	})
	h.widget(t, ns, "w", map[string]string{"mode": "pod"})

	// Events of a cluster-scoped object go to the default namespace.
	eventually(t, 45*time.Second, "ApplyForbidden on the namespace", func() error {
		return warningEvent(ctx, metav1.NamespaceDefault, ns, "ApplyForbidden", "may not create clusterrolebindings")
	})
	eventually(t, 45*time.Second, "InvalidDesiredState on the parent", func() error {
		return warningEvent(ctx, ns, "w", "InvalidDesiredState", "nothing applied", fmt.Sprintf("is in namespace %q", other))
	})
	if _, err := kube.RbacV1().ClusterRoleBindings().Get(ctx, crbName, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("ClusterRoleBinding %s: %v, want NotFound", crbName, err)
	}
	if pods, err := kube.CoreV1().Pods(other).List(ctx, metav1.ListOptions{}); err != nil || len(pods.Items) != 0 {
		t.Errorf("Pods in %s: %d (%v), want none", other, len(pods.Items), err)
	}
	if crbHook.all.Load() == 0 || podHook.all.Load() == 0 {
		t.Errorf("the hooks were called %d and %d times; the attempts need them called", crbHook.all.Load(), podHook.all.Load())
	}
}

// foreignSecrets: a Secret (and a ConfigMap) of another team's namespace,
// named by every option that reads one. Each call is refused before
// anything is read or sent: a SyncError naming the namespace and the
// setting, the hook never called, no API request on that namespace's
// Secrets (checked for the whole suite).
func (h *hostile) foreignSecrets(t *testing.T) {
	ctx := context.Background()
	ns, victimNS := newNamespace(t), newNamespace(t)
	for _, s := range []*corev1.Secret{
		{ObjectMeta: metav1.ObjectMeta{Name: "team-token"}, Data: map[string][]byte{"token": []byte("other-team-token"), "username": []byte("u"), "password": []byte("p"),
			"tls.crt": []byte("c"), "tls.key": []byte("k"), "ca.crt": []byte("ca")}},
	} {
		if _, err := kube.CoreV1().Secrets(victimNS).Create(ctx, s, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := kube.CoreV1().ConfigMaps(victimNS).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "team-ca"}, Data: map[string]string{"ca.crt": "ca"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	hook := h.hook(t, emptyAnswer)
	ref := map[string]any{"name": "team-token", "namespace": victimNS}
	host := strings.TrimPrefix(hook.URL, "http://")
	cases := []struct {
		mode    string
		webhook map[string]any
		spec    map[string]any // extra spec fields
		field   string
	}{
		{mode: "authorization", webhook: map[string]any{"authorization": map[string]any{"secretRef": ref}}, field: "authorization.secretRef"},
		{mode: "basicauth", webhook: map[string]any{"basicAuth": map[string]any{"secretRef": ref}}, field: "basicAuth.secretRef"},
		{mode: "clienttls", webhook: map[string]any{"clientTLS": map[string]any{"secretRef": ref}}, field: "clientTLS.secretRef"},
		{mode: "cabundle", webhook: map[string]any{"caBundle": map[string]any{"secretRef": ref}}, field: "caBundle.secretRef"},
		{mode: "cabundle-configmap", webhook: map[string]any{"caBundle": map[string]any{"configMapRef": map[string]any{"name": "team-ca", "namespace": victimNS}}},
			field: "caBundle.configMapRef"},
		{mode: "endpointconfigs", webhook: map[string]any{},
			spec:  map[string]any{"endpointConfigs": []any{map[string]any{"host": host, "authorization": map[string]any{"secretRef": ref}}}},
			field: "authorization.secretRef"},
	}
	for _, c := range cases {
		c.webhook["url"] = hook.URL
		spec := map[string]any{
			"parentResource": selecting("secret-" + c.mode),
			"hooks":          map[string]any{"sync": map[string]any{"webhook": c.webhook}},
		}
		for k, v := range c.spec {
			spec[k] = v
		}
		h.controller(t, compositeKind, "hostile-"+c.mode+"-"+ns, spec)
		h.widget(t, ns, c.mode, map[string]string{"mode": "secret-" + c.mode})
	}
	// Related rules: the customize hook names the other team's Secret.
	customize := h.hook(t, func(map[string]any) (int, any) {
		return 200, map[string]any{"relatedResources": []any{map[string]any{
			"apiVersion": "v1", "resource": "secrets", "namespace": victimNS, "names": []any{"team-token"}}}}
	})
	relatedCtrl := "hostile-related-" + ns
	h.controller(t, compositeKind, relatedCtrl, map[string]any{
		"parentResource": selecting("secret-related"),
		"hooks": map[string]any{
			"sync":      map[string]any{"webhook": map[string]any{"url": hook.URL}},
			"customize": map[string]any{"webhook": map[string]any{"url": customize.URL}, "version": "v2"},
		},
	})
	h.widget(t, ns, "related", map[string]string{"mode": "secret-related"})

	for _, c := range cases {
		kind := "Secret"
		if c.mode == "cabundle-configmap" {
			kind = "ConfigMap"
		}
		refusedSync(t, ns, c.mode, "hostile-"+c.mode+"-"+ns, "hook not called", c.field,
			fmt.Sprintf("namespace %q is outside the namespaces this dispatcher may read", victimNS), kind, "--secret-namespaces")
	}
	refusedSync(t, ns, "related", relatedCtrl, "relatedResources[0] (v1 secrets) refused", "sync hook not called", "--related-resources")
	for _, c := range cases {
		if n := hook.count("hostile-" + c.mode + "-" + ns); n != 0 {
			t.Errorf("%s: the hook received %d requests", c.mode, n)
		}
	}
	if n := hook.count(relatedCtrl); n != 0 {
		t.Errorf("related: the sync hook received %d requests", n)
	}
}

// credentialsOverHTTP: credentials of the dispatcher's own namespace (the
// only one the profile allows) aimed at plain http, directly (even with
// allowInsecureCredentials, which the profile does not honour), through a
// service reference without protocol https, as a user:password in the URL,
// and by an https hook redirecting to plain http. Every attempt is refused
// with a SyncError; the plain-http listener receives nothing. And metabus's
// own NATS credentials named as a hook credential, over https: refused, the
// hook receives nothing.
func (h *hostile) credentialsOverHTTP(t *testing.T) {
	ctx := context.Background()
	ns := newNamespace(t)
	secret := hookTokenSecret
	if _, err := kube.CoreV1().Secrets(dispatcher.DefaultNamespace).Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: secret}, Data: map[string][]byte{"token": []byte("s3cr3t-" + ns)},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = kube.CoreV1().Secrets(dispatcher.DefaultNamespace).Delete(context.Background(), secret, metav1.DeleteOptions{})
	})
	token := map[string]any{"secretRef": map[string]any{"name": secret, "namespace": dispatcher.DefaultNamespace}}
	plain := h.hook(t, emptyAnswer)
	origin := h.serveOn(t, hookHost, true, func(l *listener, w http.ResponseWriter, r *http.Request) {
		l.record(r.Header.Get("Authorization"))
		http.Redirect(w, r, plain.URL+"/stolen", http.StatusTemporaryRedirect)
	})
	withUser := strings.Replace(plain.URL, "http://", "http://tenant:pass@", 1)
	ca := string(h.ca.PEM)
	cases := []struct {
		mode    string
		webhook map[string]any
		want    []string
	}{
		{mode: "direct", webhook: map[string]any{"url": plain.URL, "authorization": token, "allowInsecureCredentials": true},
			want: []string{"hook not called", "authorization would be sent in clear over plain http", "ignores allowInsecureCredentials", "--refuse-insecure-credentials"}},
		{mode: "service", webhook: map[string]any{"service": map[string]any{"name": "hook", "namespace": ns, "port": 80, "protocol": "http"},
			"authorization": token, "allowInsecureCredentials": true},
			want: []string{"hook not called", "authorization would be sent in clear over plain http"}},
		{mode: "userinfo", webhook: map[string]any{"url": withUser},
			want: []string{"hook not called", "the user:password in the url would be sent in clear over plain http"}},
		{mode: "redirect", webhook: map[string]any{"url": origin.URL, "authorization": token, "caBundle": map[string]any{"inline": ca}},
			want: []string{"sync hook failed", "refused to follow the hook's redirect to " + plain.URL + "/stolen", "credentials, which would follow it in clear"}},
	}
	for _, c := range cases {
		h.controller(t, compositeKind, "hostile-http-"+c.mode+"-"+ns, map[string]any{
			"parentResource": selecting("http-" + c.mode),
			"hooks":          map[string]any{"sync": map[string]any{"webhook": c.webhook}},
		})
		h.widget(t, ns, c.mode, map[string]string{"mode": "http-" + c.mode})
	}
	for _, c := range cases {
		refusedSync(t, ns, c.mode, "hostile-http-"+c.mode+"-"+ns, c.want...)
	}
	if n := plain.all.Load(); n != 0 {
		t.Errorf("the plain-http listener received %d requests", n)
	}

	// metabus's own NATS credentials, over https: never a hook credential.
	tlsHook := h.serveOn(t, hookHost, true, func(l *listener, w http.ResponseWriter, r *http.Request) {
		l.record(r.Header.Get("Authorization"))
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{}`))
	})
	natsSecret := natsx.CredentialsSecretPrefix + "dispatcher"
	h.controller(t, compositeKind, "hostile-nats-creds-"+ns, map[string]any{
		"parentResource": selecting("nats-creds"),
		"hooks": map[string]any{"sync": map[string]any{"webhook": map[string]any{"url": tlsHook.URL, "caBundle": map[string]any{"inline": ca},
			"authorization": map[string]any{"secretRef": map[string]any{"name": natsSecret, "namespace": dispatcher.DefaultNamespace, "key": "nkey.seed"}}}}},
	})
	h.widget(t, ns, "nats-creds", map[string]string{"mode": "nats-creds"})
	eventually(t, 45*time.Second, "a SyncError on the parent naming metabus's own NATS credentials", func() error {
		return warningEvent(ctx, ns, "nats-creds", "SyncError", natsSecret, "holds metabus's own NATS credentials")
	})
	if n := tlsHook.all.Load(); n != 0 {
		t.Errorf("the hook named with metabus's NATS credentials received %d requests", n)
	}
	if n := origin.count("Bearer s3cr3t-" + ns); n == 0 {
		t.Error("the https hook never received the call: the redirect was not tried")
	}
}

// refusedResources: controllers naming Secrets, which the profile's
// watcher may not watch, as parent, child, decorator target and attachment
// (a CreateError each, naming the field: not started) and in a related
// rule (a SyncError). No hook is called; no Secret is read (checked for the
// whole suite: these name every namespace's Secrets).
func (h *hostile) refusedResources(t *testing.T) {
	ctx := context.Background()
	ns := newNamespace(t)
	hook := h.hook(t, emptyAnswer)
	sync := map[string]any{"sync": map[string]any{"webhook": map[string]any{"url": hook.URL}}}
	secrets := map[string]any{"apiVersion": "v1", "resource": "secrets"}
	cases := []struct {
		name, kind, field string
		spec              map[string]any
	}{
		{name: "hostile-parent-" + ns, kind: compositeKind, field: "spec.parentResource (v1 secrets)",
			spec: map[string]any{"parentResource": secrets, "hooks": sync}},
		{name: "hostile-child-" + ns, kind: compositeKind, field: "spec.childResources[0] (v1 secrets)",
			spec: map[string]any{"parentResource": selecting("never"), "childResources": []any{secrets}, "hooks": sync}},
		{name: "hostile-target-" + ns, kind: decoratorKind, field: "spec.resources[0] (v1 secrets)",
			spec: map[string]any{"resources": []any{secrets}, "hooks": sync}},
		{name: "hostile-attachment-" + ns, kind: decoratorKind, field: "spec.attachments[0] (v1 secrets)",
			spec: map[string]any{"resources": []any{selecting("never")}, "attachments": []any{secrets}, "hooks": sync}},
	}
	for _, c := range cases {
		h.controller(t, c.kind, c.name, c.spec)
	}
	customize := h.hook(t, func(map[string]any) (int, any) {
		return 200, map[string]any{"relatedResources": []any{secrets}}
	})
	relatedCtrl := "hostile-watch-related-" + ns
	h.controller(t, compositeKind, relatedCtrl, map[string]any{
		"parentResource": selecting("watch-related"),
		"hooks": map[string]any{
			"sync":      map[string]any{"webhook": map[string]any{"url": hook.URL}},
			"customize": map[string]any{"webhook": map[string]any{"url": customize.URL}},
		},
	})
	h.widget(t, ns, "related", map[string]string{"mode": "watch-related"})
	for _, c := range cases {
		eventually(t, 45*time.Second, "a CreateError on "+c.name, func() error {
			return warningEvent(ctx, metav1.NamespaceDefault, c.name, "CreateError", "controller not started", c.field, "-core/secrets")
		})
	}
	refusedSync(t, ns, "related", relatedCtrl, "relatedResources[0] (v1 secrets) refused", "sync hook not called")
	if n := hook.all.Load(); n != 0 {
		t.Errorf("the hook received %d requests from controllers naming refused resources", n)
	}
}

// deniedDestinations: hooks aimed where the profile denies: a loopback IP
// literal, a name resolving to loopback, the API server, the cloud
// metadata address, and an allowed hook redirecting to a denied address.
// Each is refused at the dial with a SyncError naming the rule; the
// victims receive nothing.
func (h *hostile) deniedDestinations(t *testing.T) {
	ns := newNamespace(t)
	victim := h.victim(t, victimHost)
	local := h.victim(t, "127.0.0.1")
	_, localPort, _ := net.SplitHostPort(strings.TrimPrefix(local.URL, "http://"))
	redirector := h.serveOn(t, hookHost, false, func(l *listener, w http.ResponseWriter, r *http.Request) {
		l.record("")
		http.Redirect(w, r, victim.URL+"/latest/meta-data", http.StatusTemporaryRedirect)
	})
	h.refusedURLs(t, ns, "dest", []urlCase{
		{mode: "ip", url: victim.URL + "/sync", want: []string{"hook not called", "destination " + strings.TrimPrefix(victim.URL, "http://"), `denied by the hook destination rule "-loopback"`, "--hook-destinations"}},
		{mode: "name", url: "http://localhost:" + localPort + "/sync", want: []string{"hook not called", "(localhost)", "is denied by the hook destination rule", "--hook-destinations"}},
		{mode: "apiserver", url: env.Config.Host + "/api/v1/namespaces/metabus/secrets", want: []string{"hook not called", `denied by the hook destination rule "-apiserver"`}},
		{mode: "metadata", url: "http://169.254.169.254/latest/meta-data/iam/security-credentials/", want: []string{"hook not called", `denied by the hook destination rule "-link-local"`}},
		{mode: "redirect", url: redirector.URL + "/sync", want: []string{"sync hook failed", "refused to follow the hook's redirect to " + victim.URL, `"-loopback"`}},
	})
	if n := victim.all.Load() + local.all.Load(); n != 0 {
		t.Errorf("the denied listeners received %d requests", n)
	}
	if redirector.all.Load() == 0 {
		t.Error("the redirecting hook was never called: the redirect was not tried")
	}
}

// urlCase is a controller whose sync hook is at url, refused with a
// SyncError containing every one of want.
type urlCase struct {
	mode, url string
	want      []string
}

// refusedURLs makes a controller and a parent per case (mode
// <kind>-<mode>) and waits for each refusal.
func (h *hostile) refusedURLs(t *testing.T, ns, kind string, cases []urlCase) {
	t.Helper()
	for _, c := range cases {
		h.controller(t, compositeKind, "hostile-"+kind+"-"+c.mode+"-"+ns, map[string]any{
			"parentResource": selecting(kind + "-" + c.mode),
			"hooks":          map[string]any{"sync": map[string]any{"webhook": map[string]any{"url": c.url, "timeout": "3s"}}},
		})
		h.widget(t, ns, c.mode, map[string]string{"mode": kind + "-" + c.mode})
	}
	for _, c := range cases {
		refusedSync(t, ns, c.mode, "hostile-"+kind+"-"+c.mode+"-"+ns, c.want...)
	}
}

// nameDestinations: hooks at host names the policy allows, which resolve
// to what no name may reach: a listener on loopback, and the API server.
// Each is refused at the dial with a SyncError naming the name's rule, the
// set the address falls in and the trust: opt-out; the listener receives
// nothing. (The test's API server listens on 127.0.0.1, where localhost
// resolves, so both are named as the API server's address: the set an
// address is in is checked before loopback.)
func (h *hostile) nameDestinations(t *testing.T) {
	ns := newNamespace(t)
	victim := h.serveAt(t, "127.0.0.1", h.namePort, false, func(l *listener, w http.ResponseWriter, r *http.Request) {
		l.record("")
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{}`))
	})
	_, apiPort, _ := net.SplitHostPort(strings.TrimPrefix(env.Config.Host, "https://"))
	nameRule := "localhost:" + h.namePort
	h.refusedURLs(t, ns, "name", []urlCase{
		{mode: "loopback", url: "http://localhost:" + h.namePort + "/latest/meta-data/iam/security-credentials/",
			want: []string{"hook not called", `allowed by name by the hook destination rule "` + nameRule + `"`, `denied by "-apiserver"`, `"trust:` + nameRule + `"`}},
		{mode: "apiserver", url: "https://localhost:" + apiPort + "/api/v1/namespaces/metabus/secrets",
			want: []string{"hook not called", `allowed by name by the hook destination rule "localhost:` + apiPort + `"`, `denied by "-apiserver"`}},
	})
	if n := victim.all.Load(); n != 0 {
		t.Errorf("the listener behind the allowed name received %d requests", n)
	}
}

// ownNamespaceSecrets: every Secret of metabus's namespace named as a hook
// credential, over https to a hook the policy allows: the NATS seeds, the
// users Secret, the CA, every TLS certificate (made here without their
// label, as by hand), Helm's release Secret, a Secret the admin did not
// list, and one the admin listed that is labelled as NATS credentials.
// Each is refused with a SyncError naming it; the hook receives nothing.
func (h *hostile) ownNamespaceSecrets(t *testing.T) {
	ctx := context.Background()
	ns := newNamespace(t)
	nsSecrets := map[string]*corev1.Secret{}
	for _, name := range append(natscreds.Names(natscreds.Users), natscreds.TLSNames(natscreds.Users)...) {
		nsSecrets[name] = &corev1.Secret{}
	}
	nsSecrets["sh.helm.release.v1.metabus.v1"] = &corev1.Secret{Type: "helm.sh/release.v1"}
	nsSecrets["e2e-hostile-unlisted-"+ns] = &corev1.Secret{}
	nsSecrets[listedNATSCopy] = &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{natsx.CredentialsLabel: "true"}}}
	for name, s := range nsSecrets {
		s.Name = name
		s.Data = map[string][]byte{"token": []byte("stolen-" + name), "tls.key": []byte("stolen-key"), "release": []byte("stolen-release")}
		_, err := kube.CoreV1().Secrets(dispatcher.DefaultNamespace).Create(ctx, s, metav1.CreateOptions{})
		switch {
		case apierrors.IsAlreadyExists(err):
			continue // an install's own: left as it is
		case err != nil:
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_ = kube.CoreV1().Secrets(dispatcher.DefaultNamespace).Delete(context.Background(), name, metav1.DeleteOptions{})
		})
	}
	tlsHook := h.serveOn(t, hookHost, true, func(l *listener, w http.ResponseWriter, r *http.Request) {
		l.record(r.Header.Get("Authorization"))
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{}`))
	})
	ca := string(h.ca.PEM)
	i := 0
	modes := map[string]string{}
	for name := range nsSecrets {
		mode := fmt.Sprintf("own-%d", i)
		i++
		modes[mode] = name
		h.controller(t, compositeKind, "hostile-"+mode+"-"+ns, map[string]any{
			"parentResource": selecting(mode),
			"hooks": map[string]any{"sync": map[string]any{"webhook": map[string]any{"url": tlsHook.URL, "caBundle": map[string]any{"inline": ca},
				"authorization": map[string]any{"secretRef": map[string]any{"name": name, "namespace": dispatcher.DefaultNamespace, "key": "tls.key"}}}}},
		})
		h.widget(t, ns, mode, map[string]string{"mode": mode})
	}
	for mode, name := range modes {
		t.Run(name, func(t *testing.T) {
			eventually(t, 45*time.Second, "a SyncError on the parent naming "+name, func() error {
				return warningEvent(ctx, ns, mode, "SyncError", "Secret "+dispatcher.DefaultNamespace+"/"+name, "never sent to a hook")
			})
		})
	}
	if n := tlsHook.all.Load(); n != 0 {
		t.Errorf("the hook named with Secrets of metabus's namespace received %d requests", n)
	}
}

// bus: someone holding one service's NATS credentials (a tenant who broke
// into a dispatcher, say) tries to read the other services' replies
// (snapshots carry Secret children) and to publish as another service;
// a client without credentials tries to connect at all. Each is refused:
// a permission violation, and the snooping subscriptions receive nothing,
// while the same subscription by the replies' owner sees traffic flow.
func (h *hostile) bus(t *testing.T) {
	if nc, err := nats.Connect(h.nats.URL, nats.Timeout(3*time.Second)); err == nil {
		nc.Close()
		t.Error("a client without credentials connected to the bus")
	} else if !strings.Contains(strings.ToLower(err.Error()), "authorization violation") {
		t.Errorf("a client without credentials: %v, want an authorization violation", err)
	}
	type conn struct {
		nc         *nats.Conn
		violations chan string
	}
	connect := func(user string) *conn {
		c := &conn{violations: make(chan string, 64)}
		opt, err := nats.NkeyOptionFromSeed(h.nats.Seeds[user])
		if err != nil {
			t.Fatal(err)
		}
		c.nc, err = nats.Connect(h.nats.URL, opt, nats.CustomInboxPrefix(natsx.ServiceInboxPrefix(user)),
			nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
				if errors.Is(err, nats.ErrPermissionViolation) || strings.Contains(strings.ToLower(err.Error()), "permissions violation") {
					select {
					case c.violations <- err.Error():
					default:
					}
				}
			}))
		if err != nil {
			t.Fatalf("connect as %s: %v", user, err)
		}
		t.Cleanup(c.nc.Close)
		return c
	}
	expectViolation := func(c *conn, what, subject string) {
		t.Helper()
		deadline := time.After(5 * time.Second)
		for {
			select {
			case v := <-c.violations:
				if strings.Contains(v, fmt.Sprintf("%q", subject)) {
					return
				}
			case <-deadline:
				t.Errorf("%s: no permission violation for %s", what, subject)
				return
			}
		}
	}

	// The dispatcher's own inbox sees its snapshot and JetStream replies.
	owner := connect(allinone.ServiceDispatcher)
	var owned atomic.Int64
	if _, err := owner.nc.Subscribe(natsx.ServiceInboxPrefix(allinone.ServiceDispatcher)+".>", func(*nats.Msg) { owned.Add(1) }); err != nil {
		t.Fatal(err)
	}
	var stolen atomic.Int64
	for _, thief := range testnats.Services {
		c := connect(thief)
		for _, victim := range testnats.Services {
			subject := natsx.ServiceInboxPrefix(victim) + ".>"
			if victim == thief {
				continue
			}
			if _, err := c.nc.Subscribe(subject, func(*nats.Msg) { stolen.Add(1) }); err != nil {
				t.Fatal(err)
			}
			expectViolation(c, thief+" reading the "+victim+"'s replies", subject)
		}
		if _, err := c.nc.Subscribe("_INBOX.>", func(*nats.Msg) { stolen.Add(1) }); err != nil {
			t.Fatal(err)
		}
		expectViolation(c, thief+" reading the shared inbox", "_INBOX.>")
	}
	// Publishing as another service.
	for _, p := range []struct{ user, subject, what string }{
		{allinone.ServiceDispatcher, bus.AppliedSubject, "the dispatcher announcing applied writes (the applier's)"},
		{allinone.ServiceApplier, bus.RelatedSubject, "the applier announcing related rules (the dispatcher's)"},
		{allinone.ServiceWatcher, "mc.desired.cc-x.y", "the watcher publishing a desired state (the dispatcher's)"},
		{allinone.ServiceRevisions, "mc.work.cc-x.y", "the revisions service publishing a work item (the watcher's)"},
		{allinone.ServiceDispatcher, natsx.ServiceInboxPrefix(allinone.ServiceApplier) + ".x.y", "the dispatcher answering into the applier's inbox"},
	} {
		c := connect(p.user)
		if err := c.nc.Publish(p.subject, []byte(`{}`)); err != nil {
			t.Fatal(err)
		}
		_ = c.nc.Flush()
		expectViolation(c, p.what, p.subject)
	}

	// Traffic flows meanwhile: a parent synced over the bus.
	ns := newNamespace(t)
	hook := h.hook(t, func(map[string]any) (int, any) {
		return 200, map[string]any{"status": map[string]any{"synced": true}, "children": []any{}}
	})
	h.controller(t, compositeKind, "hostile-bus-"+ns, map[string]any{
		"parentResource": selecting("bus"),
		"hooks":          map[string]any{"sync": map[string]any{"webhook": map[string]any{"url": hook.URL}}},
	})
	h.widget(t, ns, "w", map[string]string{"mode": "bus"})
	eventually(t, 45*time.Second, "the parent synced", func() error {
		w, err := dyn.Resource(widgetsGVR).Namespace(ns).Get(context.Background(), "w", metav1.GetOptions{})
		if err != nil {
			return err
		}
		if ok, _, _ := unstructured.NestedBool(w.Object, "status", "synced"); !ok {
			return errors.New("not yet")
		}
		return nil
	})
	if owned.Load() == 0 {
		t.Error("the dispatcher's own inbox saw no traffic: the snooping check proves nothing")
	}
	if n := stolen.Load(); n != 0 {
		t.Errorf("other services' subscriptions received %d replies", n)
	}
	t.Logf("the dispatcher's inbox carried %d messages; the other services' subscriptions to it and to _INBOX.> received %d", owned.Load(), stolen.Load())
}

// memory: hook answers and controller specs meant to exhaust the
// dispatcher's and the watcher's memory. Large answers (an endless one,
// and one under the byte limit of 8 MiB of empty objects) are refused with
// a SyncError; a customize hook naming a new namespace at every call and a
// controller whose weight annotation changes to ever-new invalid values
// leave the watcher's indexes as they were. The process's heap is sampled
// throughout and printed; its growth must stay bounded.
func (h *hostile) memory(t *testing.T) {
	ctx := context.Background()
	ns := newNamespace(t)
	heap := startHeapSampler()
	defer heap.stop()

	// Large answers.
	endless := h.serveOn(t, hookHost, false, func(l *listener, w http.ResponseWriter, r *http.Request) {
		l.record("")
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"children":[`))
		chunk := []byte(strings.Repeat(`{},`, 20000))
		for range 1 << 14 { // up to 1 GiB, until the client stops reading
			if _, err := w.Write(chunk); err != nil {
				return
			}
		}
	})
	// A status is decoded as it comes (children are checked one by one).
	var dense strings.Builder
	dense.WriteString(`{"status":{"x":[`)
	for dense.Len() < bus.MaxPayload-16 {
		dense.WriteString(`{},`)
	}
	dense.WriteString(`{}]}}`)
	denseHook := h.serveOn(t, hookHost, false, func(l *listener, w http.ResponseWriter, r *http.Request) {
		l.record("")
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(dense.String()))
	})
	for mode, url := range map[string]string{"endless": endless.URL, "dense": denseHook.URL} {
		h.controller(t, compositeKind, "hostile-mem-"+mode+"-"+ns, map[string]any{
			"parentResource": selecting("mem-" + mode),
			"childResources": []any{map[string]any{"apiVersion": "v1", "resource": "configmaps"}},
			"hooks":          map[string]any{"sync": map[string]any{"webhook": map[string]any{"url": url}}},
		})
		h.widget(t, ns, mode, map[string]string{"mode": "mem-" + mode})
	}
	eventually(t, 30*time.Second, "a few more calls of each", func() error {
		if endless.all.Load() < 3 || denseHook.all.Load() < 3 {
			return fmt.Errorf("%d and %d calls", endless.all.Load(), denseHook.all.Load())
		}
		return nil
	})
	base, peak, retained := heap.window()
	t.Logf("large answers: %d endless and %d dense (%d MiB of {}) answers refused; heap in use %d MiB before, peak %d MiB (+%d MiB), %d MiB after",
		endless.all.Load(), denseHook.all.Load(), dense.Len()>>20, base>>20, peak>>20, (peak-base)>>20, retained>>20)
	if peak-base > 160<<20 {
		t.Errorf("the heap grew by %d MiB while refusing large answers; decoded, one dense answer alone takes about 260 MiB", (peak-base)>>20)
	}
	// A failed call is the parent's SyncError (the controller's spec is not at fault).
	eventually(t, 45*time.Second, "a SyncError on the endless answer's parent", func() error {
		return warningEvent(ctx, ns, "endless", "SyncError", "hook response exceeds the size limit", "more than 8388608 bytes")
	})
	eventually(t, 45*time.Second, "a SyncError on the dense answer's parent", func() error {
		return warningEvent(ctx, ns, "dense", "SyncError", "hook response exceeds the size limit", "JSON objects and arrays")
	})

	// Related rules naming a new namespace at every call.
	var calls atomic.Int64
	customize := h.hook(t, func(map[string]any) (int, any) {
		n := calls.Add(1)
		return 200, map[string]any{"relatedResources": []any{map[string]any{
			"apiVersion": "v1", "resource": "configmaps", "namespace": fmt.Sprintf("churn-%d", n), "names": []any{"x"}}}}
	})
	syncHook := h.hook(t, func(req map[string]any) (int, any) {
		return 200, map[string]any{"status": map[string]any{"generation": req["parent"].(map[string]any)["metadata"].(map[string]any)["generation"]}}
	})
	h.controller(t, compositeKind, "hostile-mem-related-"+ns, map[string]any{
		"parentResource": selecting("mem-related"),
		"hooks": map[string]any{
			"sync":      map[string]any{"webhook": map[string]any{"url": syncHook.URL}},
			"customize": map[string]any{"webhook": map[string]any{"url": customize.URL}, "version": "v2"},
		},
	})
	h.widget(t, ns, "related", map[string]string{"mode": "mem-related"})
	heap.reset()
	const namespaces = 50
	for i := range namespaces {
		before := calls.Load()
		patch := fmt.Sprintf(`{"spec":{"version":%d}}`, i+2)
		if _, err := h.tenant.Resource(widgetsGVR).Namespace(ns).Patch(ctx, "related", "application/merge-patch+json", []byte(patch), metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
		// Each new generation is customized again: a new namespace named.
		eventually(t, 20*time.Second, "the customize hook called for the new generation", func() error {
			if calls.Load() == before {
				return errors.New("not yet")
			}
			return nil
		})
	}
	eventually(t, 60*time.Second, "the last generation synced", func() error {
		w, err := dyn.Resource(widgetsGVR).Namespace(ns).Get(ctx, "related", metav1.GetOptions{})
		if err != nil {
			return err
		}
		if g, _ := nestedInt(w, "status", "generation"); g != w.GetGeneration() {
			return fmt.Errorf("status.generation %d, generation %d", g, w.GetGeneration())
		}
		return nil
	})
	buckets := h.inst.gauge(t, "metabus_watcher_related_buckets")
	base, peak, retained = heap.window()
	t.Logf("related churn: %d customize calls, each naming a new namespace; the watcher's related index holds %v buckets; heap in use %d MiB before, peak %d MiB, %d MiB after",
		calls.Load(), buckets, base>>20, peak>>20, retained>>20)
	if buckets > 2 {
		t.Errorf("the related index holds %v buckets after the churn; the parent's rules name one namespace", buckets)
	}

	// A controller whose weight annotation keeps changing to new invalid
	// values, and one whose spec keeps changing to new invalid ones.
	weighted := "hostile-mem-weight-" + ns
	h.controller(t, compositeKind, weighted, map[string]any{
		"parentResource": selecting("mem-weight"),
		"hooks":          map[string]any{"sync": map[string]any{"webhook": map[string]any{"url": syncHook.URL}}},
	})
	h.widget(t, ns, "weighted", map[string]string{"mode": "mem-weight"})
	invalid := "hostile-mem-invalid-" + ns
	h.controller(t, compositeKind, invalid, map[string]any{
		"parentResource": map[string]any{"apiVersion": "test.metabus.dev/v1", "resource": "no-such-0"},
		"hooks":          map[string]any{"sync": map[string]any{"webhook": map[string]any{"url": syncHook.URL}}},
	})
	heap.reset()
	const churn = 150
	gvr := controllerGVRs[compositeKind]
	for i := range churn {
		ann := fmt.Sprintf(`{"metadata":{"annotations":{%q:"not-a-weight-%d-%s"}}}`, bus.WeightAnnotation, i, strings.Repeat("x", 512))
		if _, err := h.tenant.Resource(gvr).Patch(ctx, weighted, "application/merge-patch+json", []byte(ann), metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
		poke := fmt.Sprintf(`{"spec":{"version":%d}}`, i+2)
		if _, err := h.tenant.Resource(widgetsGVR).Namespace(ns).Patch(ctx, "weighted", "application/merge-patch+json", []byte(poke), metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
		spec := fmt.Sprintf(`{"spec":{"parentResource":{"resource":"no-such-%d"}}}`, i+1)
		if _, err := h.tenant.Resource(gvr).Patch(ctx, invalid, "application/merge-patch+json", []byte(spec), metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, 45*time.Second, "a CreateError on the invalid controller", func() error {
		return warningEvent(ctx, metav1.NamespaceDefault, invalid, "CreateError", "no-such-")
	})
	base, peak, retained = heap.window()
	t.Logf("spec churn: %d invalid weights of 0.5 KiB and %d invalid specs; heap in use %d MiB before, peak %d MiB, %d MiB after", churn, churn, base>>20, peak>>20, retained>>20)
	if retained > base+32<<20 {
		t.Errorf("the heap retains %d MiB more after controllers churned invalid specs", (retained-base)>>20)
	}
}

// heapSampler samples the process's heap every 20 ms.
type heapSampler struct {
	mu         sync.Mutex
	base, peak uint64
	done       chan struct{}
	wg         sync.WaitGroup
}

func startHeapSampler() *heapSampler {
	s := &heapSampler{done: make(chan struct{})}
	s.reset()
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-s.done:
				return
			case <-tick.C:
				var m runtime.MemStats
				runtime.ReadMemStats(&m)
				s.mu.Lock()
				s.peak = max(s.peak, m.HeapInuse)
				s.mu.Unlock()
			}
		}
	}()
	return s
}

// reset starts a new window at the heap in use after a collection.
func (s *heapSampler) reset() {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	s.mu.Lock()
	s.base, s.peak = m.HeapInuse, m.HeapInuse
	s.mu.Unlock()
}

// window returns the window's base and peak, and what the heap retains
// after a collection now.
func (s *heapSampler) window() (base, peak, retained uint64) {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.peak = max(s.peak, m.HeapInuse)
	return s.base, s.peak, m.HeapInuse
}

func (s *heapSampler) stop() {
	close(s.done)
	s.wg.Wait()
}

// gauge reads a gauge of inst's metrics (the sum over its series).
func (inst *instance) gauge(tb testing.TB, name string) float64 {
	tb.Helper()
	mfs, err := inst.reg.Gather()
	if err != nil {
		tb.Fatalf("gather metrics: %v", err)
	}
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() == name {
			for _, m := range mf.GetMetric() {
				sum += m.GetGauge().GetValue()
			}
		}
	}
	return sum
}
