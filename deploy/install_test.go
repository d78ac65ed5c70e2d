package deploy

import (
	"context"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"

	"github.com/metabus/metabus/internal/testing/kubeenv"
	"github.com/metabus/metabus/pkg/kubeapi"
	"github.com/metabus/metabus/pkg/natscreds"
)

// TestInstall (issue #23) installs metabus on a real API server the way a
// user does, with nothing made by hand:
//   - every object of every shipped render (kustomize and Helm, both
//     profiles, Helm with default and with non-default values) passes
//     server-side dry-run;
//   - `kubectl apply -k deploy/` and two Helm releases in two other
//     namespaces are applied for real, side by side: no cluster-scoped name
//     is shared between them;
//   - the credential generator, run as its own ServiceAccount (so its Role
//     is what is tested), creates every Secret the rendered objects
//     reference (volumes, projected volumes, envFrom, secretKeyRef), which
//     were missing before it ran;
//   - a second run writes nothing: every Secret keeps its resourceVersion.
func TestInstall(t *testing.T) {
	if testing.Short() {
		t.Skip("needs a real kube-apiserver")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	dir := t.TempDir()
	serviceMonitorCRD := filepath.Join(dir, "servicemonitors.yaml")
	if err := os.WriteFile(serviceMonitorCRD, []byte(kubeenv.FreeformCRD("monitoring.coreos.com", "ServiceMonitor", "servicemonitors")), 0o600); err != nil {
		t.Fatal(err)
	}
	env, err := kubeenv.Start(ctx, kubeenv.Options{NoControllerManager: true, CRDs: []string{"crds", serviceMonitorCRD}, Log: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Stop() })
	cl := newClusterClient(t, env.Config)

	type install struct {
		name      string
		objs      []map[string]any
		namespace string // where it runs
		apply     bool   // installed for real (else dry-run only)
	}
	must := func(objs []map[string]any, err error) []map[string]any {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return objs
	}
	everything := lintValues(t)["everything"]
	installs := []install{
		{"kubectl apply -k deploy/", must(kustomizeBuild(kustomizeDefault)), "metabus", true},
		// Same names as deploy/, so dry-run only.
		{"kubectl apply -k deploy/overlays/hardened", must(kustomizeBuild(kustomizeHardened)), "metabus", false},
		{"kubectl apply -k deploy/overlays/plaintext", must(kustomizeBuild(kustomizePlaintext)), "metabus", false},
		{"helm install metabus -n mb-helm", must(helmRender(nil, release{"metabus", "mb-helm"})), "mb-helm", true},
		{"helm install metabus -n mb-hardened --set profile=hardened", must(helmRender(map[string]any{"profile": "hardened"}, release{"metabus", "mb-hardened"})), "mb-hardened", true},
		{"helm install other -n mb-two (every value changed)", must(helmRender(everything, release{"other", "mb-two"})), "mb-two", true},
	}

	// Namespaces first, as kubectl apply does (a namespaced object's
	// dry-run needs its namespace): kustomize's Namespace object, Helm's
	// --create-namespace, and the namespace dispatcher.secretNamespaces names.
	for _, o := range installs[0].objs {
		if str(o, "kind") == "Namespace" {
			if err := cl.apply(ctx, o, false); err != nil {
				t.Fatal(err)
			}
		}
	}
	for _, ns := range []string{"mb-helm", "mb-hardened", "mb-two", "tenant-a"} {
		cl.create(t, ctx, "v1", "Namespace", "", map[string]any{"metadata": map[string]any{"name": ns}})
	}

	t.Run("no shared cluster-scoped names", func(t *testing.T) {
		owner := map[string]string{}
		for _, in := range installs {
			if !in.apply {
				continue
			}
			for _, o := range in.objs {
				kind := str(o, "kind")
				if str(o, "metadata", "namespace") != "" || kind == "CustomResourceDefinition" || kind == "Namespace" {
					continue
				}
				key := kind + "/" + str(o, "metadata", "name")
				if prev, ok := owner[key]; ok {
					t.Errorf("%s is rendered by %q and %q", key, prev, in.name)
				}
				owner[key] = in.name
			}
		}
	})

	for _, in := range installs {
		t.Run("dry-run "+in.name, func(t *testing.T) {
			for _, o := range in.objs {
				if err := cl.apply(ctx, o, true); err != nil {
					t.Errorf("%s %s/%s: %v", str(o, "kind"), str(o, "metadata", "namespace"), str(o, "metadata", "name"), err)
				}
			}
		})
	}
	if t.Failed() {
		t.FailNow()
	}

	for _, in := range installs {
		if !in.apply {
			continue
		}
		t.Run(in.name, func(t *testing.T) {
			for _, o := range in.objs {
				if err := cl.apply(ctx, o, false); err != nil {
					t.Fatalf("apply %s %s: %v", str(o, "kind"), str(o, "metadata", "name"), err)
				}
			}
			refs := secretRefs(in.objs)
			// The manifests reference the services' credentials; the
			// operator users' Secrets are mounted nowhere, but written too.
			// And the TLS certificates of the server and of each service.
			referenced := natscreds.Names(natscreds.Services)
			referenced = append(referenced, natscreds.ServerTLSSecret)
			for _, svc := range natscreds.Services {
				referenced = append(referenced, natscreds.ClientTLSSecret(svc))
			}
			sort.Strings(referenced)
			if missing := cl.missingSecrets(t, ctx, refs); !slices.Equal(missing, prefixed(in.namespace, referenced)) {
				t.Fatalf("before the generator ran, missing Secrets %v; want exactly the credentials %v", missing, referenced)
			}
			want := append(natscreds.Names(natscreds.Users), natscreds.TLSNames(natscreds.Users)...)

			// The generator as the NATS pods run it: their ServiceAccount,
			// the arguments of their init container.
			sts := find(in.objs, "StatefulSet", natsStatefulSet(in.objs))
			sa := str(sts, "spec", "template", "spec", "serviceAccountName")
			store := natscreds.Store{Kube: cl.as(t, in.namespace, sa), Namespace: in.namespace}
			spec := generatorTLSSpec(t, sts, in.namespace)
			generate := func() []natscreds.Action {
				t.Helper()
				done, err := natscreds.Run(ctx, store, natscreds.Users, natscreds.GenerateSeed)
				if err != nil {
					t.Fatalf("generator as %s: %v", sa, err)
				}
				tlsDone, err := natscreds.RunTLS(ctx, store, spec)
				if err != nil {
					t.Fatalf("TLS generator as %s: %v", sa, err)
				}
				return append(done, tlsDone...)
			}
			if done := generate(); len(done) != len(want) {
				t.Errorf("generator wrote %v, want the %d credential Secrets", done, len(want))
			}
			if missing := cl.missingSecrets(t, ctx, refs); len(missing) != 0 {
				t.Errorf("referenced Secrets still missing: %v", missing)
			}

			before := cl.secretVersions(t, ctx, in.namespace)
			if done := generate(); len(done) != 0 {
				t.Errorf("second run wrote %v, want nothing", done)
			}
			if after := cl.secretVersions(t, ctx, in.namespace); !maps.Equal(before, after) {
				t.Errorf("resourceVersions changed by the second run: %v -> %v", before, after)
			}
		})
	}
}

// generatorTLSSpec is what `metabus credentials ensure` makes with the
// arguments of sts's init container in namespace (cmd/metabus's flags:
// --tls-service, --tls-peers, --tls-validity).
func generatorTLSSpec(t *testing.T, sts map[string]any, namespace string) natscreds.TLSSpec {
	t.Helper()
	flags := map[string]string{}
	c, _ := slice(sts, "spec", "template", "spec", "initContainers")[0].(map[string]any)
	for _, a := range stringList(slice(c, "args")) {
		k, v, _ := strings.Cut(a, "=")
		flags[k] = v
	}
	if flags["--tls"] == "false" || flags["--tls-service"] == "" {
		t.Fatalf("init container args %v: no TLS", stringList(slice(c, "args")))
	}
	validity := natscreds.DefaultValidity
	if v, ok := flags["--tls-validity"]; ok {
		var err error
		if validity, err = time.ParseDuration(v); err != nil {
			t.Fatal(err)
		}
	}
	return natscreds.TLSSpec{Users: natscreds.Users, ServerDNS: natscreds.ServerDNSNames(flags["--tls-service"], flags["--tls-peers"], namespace),
		Validity: validity, Now: time.Now()}
}

func natsStatefulSet(objs []map[string]any) string {
	for _, o := range objs {
		if str(o, "kind") == "StatefulSet" {
			return str(o, "metadata", "name")
		}
	}
	return ""
}

func prefixed(ns string, names []string) []string {
	var out []string
	for _, n := range names {
		out = append(out, ns+"/"+n)
	}
	return out
}

// secretRefs lists "namespace/name" of every Secret a rendered pod template
// needs to start: secret volumes, projected Secret sources, envFrom and
// secretKeyRef (optional references left out).
func secretRefs(objs []map[string]any) []string {
	set := map[string]bool{}
	for _, o := range objs {
		spec := mapping(o, "spec", "template", "spec")
		if spec == nil {
			continue
		}
		ns := str(o, "metadata", "namespace")
		add := func(m map[string]any, fields ...string) {
			if name := str(m, fields...); name != "" {
				optional, _, _ := unstructured.NestedBool(m, append(fields[:len(fields)-1:len(fields)-1], "optional")...)
				if !optional {
					set[ns+"/"+name] = true
				}
			}
		}
		for _, v := range slice(spec, "volumes") {
			vm := v.(map[string]any)
			add(vm, "secret", "secretName")
			for _, src := range slice(vm, "projected", "sources") {
				add(src.(map[string]any), "secret", "name")
			}
		}
		for _, c := range append(slice(spec, "initContainers"), slice(spec, "containers")...) {
			cm := c.(map[string]any)
			for _, e := range slice(cm, "envFrom") {
				add(e.(map[string]any), "secretRef", "name")
			}
			for _, e := range slice(cm, "env") {
				add(e.(map[string]any), "valueFrom", "secretKeyRef", "name")
			}
		}
	}
	out := make([]string, 0, len(set))
	for k := range set {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// clusterClient applies rendered objects and reads Secrets.
type clusterClient struct {
	cfg    *rest.Config
	dyn    dynamic.Interface
	mapper *restmapper.DeferredDiscoveryRESTMapper
}

func newClusterClient(t *testing.T, cfg *rest.Config) *clusterClient {
	t.Helper()
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	disc, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return &clusterClient{cfg: cfg, dyn: dyn, mapper: restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(disc))}
}

// apply server-side applies one object, or only dry-runs it.
func (c *clusterClient) apply(ctx context.Context, o map[string]any, dryRun bool) error {
	u := &unstructured.Unstructured{Object: o}
	gvk := u.GroupVersionKind()
	m, err := c.mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
	if err != nil {
		return err
	}
	var ri dynamic.ResourceInterface = c.dyn.Resource(m.Resource)
	if m.Scope.Name() == meta.RESTScopeNameNamespace {
		if u.GetNamespace() == "" {
			return fmt.Errorf("namespaced %s without a namespace", gvk.Kind)
		}
		ri = c.dyn.Resource(m.Resource).Namespace(u.GetNamespace())
	}
	opts := metav1.ApplyOptions{FieldManager: "install-test", Force: true}
	if dryRun {
		opts.DryRun = []string{metav1.DryRunAll}
	}
	_, err = ri.Apply(ctx, u.GetName(), u, opts)
	return err
}

func (c *clusterClient) create(t *testing.T, ctx context.Context, apiVersion, kind, ns string, o map[string]any) {
	t.Helper()
	o["apiVersion"], o["kind"] = apiVersion, kind
	if ns != "" {
		o["metadata"].(map[string]any)["namespace"] = ns
	}
	if err := c.apply(ctx, o, false); err != nil {
		t.Fatal(err)
	}
}

// as is a client impersonating a ServiceAccount.
func (c *clusterClient) as(t *testing.T, ns, sa string) *kubeapi.Client {
	t.Helper()
	cfg := rest.CopyConfig(c.cfg)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: "system:serviceaccount:" + ns + ":" + sa}
	k, err := kubeapi.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// missingSecrets returns the refs ("namespace/name") that do not exist.
func (c *clusterClient) missingSecrets(t *testing.T, ctx context.Context, refs []string) []string {
	t.Helper()
	var missing []string
	secrets := c.dyn.Resource(corev1.SchemeGroupVersion.WithResource("secrets"))
	for _, ref := range refs {
		ns, name := filepath.Split(ref)
		if _, err := secrets.Namespace(filepath.Clean(ns)).Get(ctx, name, metav1.GetOptions{}); err != nil {
			missing = append(missing, ref)
		}
	}
	return missing
}

// secretVersions returns every Secret's resourceVersion in ns, by name.
func (c *clusterClient) secretVersions(t *testing.T, ctx context.Context, ns string) map[string]string {
	t.Helper()
	list, err := c.dyn.Resource(corev1.SchemeGroupVersion.WithResource("secrets")).Namespace(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, s := range list.Items {
		out[s.GetName()] = s.GetResourceVersion()
	}
	return out
}
