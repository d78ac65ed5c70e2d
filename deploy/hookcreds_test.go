package deploy

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/metabus/metabus/pkg/natscreds"
	"github.com/metabus/metabus/pkg/natsx"
	"github.com/metabus/metabus/services/dispatcher"
)

// TestInstallSecretsNeverHookCredentials: every Secret an install of
// metabus creates in its namespace (those its workloads mount, those the
// credential generator may write, cert-manager's certificates, Helm's
// release record) is refused by the dispatcher as a hook credential, under
// both profiles and both install paths, even when the operator lists it in
// --hook-credential-secrets and even without its label (made by hand):
// whoever may create a controller chooses the Secret its webhook sends.
func TestInstallSecretsNeverHookCredentials(t *testing.T) {
	certManager := map[string]any{"nats": map[string]any{"tls": map[string]any{"enabled": true, "certificates": "cert-manager",
		"certManager": map[string]any{"issuerRef": map[string]any{"name": "ca-issuer", "kind": "Issuer"}}}}}
	hookUsers := map[string]any{"nats": map[string]any{"hookUsers": []any{map[string]any{"name": "tenant-a"}}}}
	renders := []struct {
		name string
		objs func() ([]map[string]any, error)
		// helm adds the release's own Secret (sh.helm.release.v1.<release>.v<revision>).
		helm bool
	}{
		{name: "kustomize default", objs: func() ([]map[string]any, error) { return kustomizeBuild(kustomizeDefault) }},
		{name: "kustomize hardened", objs: func() ([]map[string]any, error) { return kustomizeBuild(kustomizeHardened) }},
		{name: "helm default", helm: true, objs: func() ([]map[string]any, error) { return helmRender(nil, defaultRelease) }},
		{name: "helm hardened", helm: true, objs: func() ([]map[string]any, error) {
			return helmRender(map[string]any{"profile": "hardened"}, defaultRelease)
		}},
		{name: "helm cert-manager TLS", helm: true, objs: func() ([]map[string]any, error) { return helmRender(certManager, defaultRelease) }},
		{name: "helm hook users", helm: true, objs: func() ([]map[string]any, error) { return helmRender(hookUsers, defaultRelease) }},
	}
	for _, r := range renders {
		t.Run(r.name, func(t *testing.T) {
			objs, err := r.objs()
			if err != nil {
				t.Fatal(err)
			}
			secrets := installSecrets(objs)
			if r.helm {
				secrets[fmt.Sprintf("sh.helm.release.v1.%s.v1", defaultRelease.name)] = nil
			}
			// The render must name at least what every install has: a
			// seed per service, the users Secret, the CA.
			for _, need := range append(natscreds.Names(natscreds.Services), natscreds.CASecret) {
				if _, ok := secrets[need]; !ok {
					t.Errorf("the render names no Secret %s: the collection below misses it", need)
				}
			}
			listed := slices.Sorted(func(yield func(string) bool) {
				for name := range secrets {
					if !yield(name) {
						return
					}
				}
			})
			for _, name := range listed {
				for _, labels := range []map[string]string{secrets[name], nil} {
					s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: defaultRelease.namespace, Name: name, Labels: labels}}
					if strings.HasPrefix(name, "sh.helm.release.v1.") {
						s.Type = "helm.sh/release.v1"
					}
					if err := dispatcher.RefuseHookCredential(defaultRelease.namespace, listed, s); err == nil {
						t.Errorf("Secret %s (labels %v), listed by the operator: the dispatcher would send it to a hook", name, labels)
					}
				}
			}
			t.Logf("%d Secrets refused: %s", len(listed), strings.Join(listed, ", "))
		})
	}
}

// installSecrets returns the Secrets of metabus's namespace a render
// refers to, by name, with the labels it gives them (nil when it does not
// make them itself): volumes' secretName, the Secrets the credentials
// Role lets the generator create and read (resourceNames), cert-manager
// Certificates' secretName with their secretTemplate labels, and any
// Secret rendered as such.
func installSecrets(objs []map[string]any) map[string]map[string]string {
	out := map[string]map[string]string{}
	add := func(name string, labels map[string]string) {
		if name == "" {
			return
		}
		if labels != nil || out[name] == nil {
			out[name] = labels
		}
	}
	for _, o := range objs {
		switch str(o, "kind") {
		case "Secret":
			add(str(o, "metadata", "name"), stringMap(mapping(o, "metadata", "labels")))
		case "Certificate":
			add(str(o, "spec", "secretName"), stringMap(mapping(o, "spec", "secretTemplate", "labels")))
		case "Role", "ClusterRole":
			for _, r := range slice(o, "rules") {
				rule, _ := r.(map[string]any)
				if slices.Contains(stringList(slice(rule, "resources")), "secrets") {
					for _, n := range stringList(slice(rule, "resourceNames")) {
						add(n, nil)
					}
				}
			}
		}
		walk(o, func(k string, v any) {
			if s, ok := v.(string); ok && k == "secretName" && str(o, "kind") != "Certificate" {
				add(s, nil)
			}
		})
	}
	// A generated Secret carries the credentials label (natscreds' plan);
	// the render above does not show the generator's labels.
	for name, labels := range out {
		if labels == nil && strings.HasPrefix(name, natsx.CredentialsSecretPrefix) {
			out[name] = map[string]string{natsx.CredentialsLabel: "true"}
		}
	}
	return out
}

// walk calls f on every key and value of a decoded YAML tree.
func walk(v any, f func(k string, v any)) {
	switch t := v.(type) {
	case map[string]any:
		for k, x := range t {
			f(k, x)
			walk(x, f)
		}
	case []any:
		for _, x := range t {
			walk(x, f)
		}
	}
}

func stringMap(m map[string]any) map[string]string {
	if m == nil {
		return nil
	}
	out := map[string]string{}
	for k, v := range m {
		out[k] = fmt.Sprint(v)
	}
	return out
}
