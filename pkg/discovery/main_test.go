package discovery

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/metabus/metabus/internal/testing/kubeenv"
)

// env is the control plane shared by the package's tests; nil with -short.
var env *kubeenv.Env

// crd returns a CustomResourceDefinition manifest in group example.com.
func crd(plural, kind, scope string, status bool) string {
	sub := ""
	if status {
		sub = "    subresources: {status: {}}\n"
	}
	return fmt.Sprintf(`apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: %[1]s.example.com
spec:
  group: example.com
  scope: %[3]s
  names: {plural: %[1]s, singular: %[4]s, kind: %[2]s, listKind: %[2]sList}
  versions:
  - name: v1
    served: true
    storage: true
%[5]s    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec: {type: object, x-kubernetes-preserve-unknown-fields: true}
          status: {type: object, x-kubernetes-preserve-unknown-fields: true}
`, plural, kind, scope, plural[:len(plural)-1], sub)
}

// writeManifest writes a manifest to a new file in dir.
func writeManifest(dir, name, content string) (string, error) {
	p := filepath.Join(dir, name)
	return p, os.WriteFile(p, []byte(content), 0o600)
}

func TestMain(m *testing.M) {
	flag.Parse()
	if testing.Short() {
		os.Exit(m.Run())
	}
	os.Exit(run(m))
}

func run(m *testing.M) int {
	dir, err := os.MkdirTemp("", "discovery-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer func() { _ = os.RemoveAll(dir) }()
	// Namespaced with a status subresource, and cluster-scoped without.
	withStatus, err := writeManifest(dir, "gadgets.yaml", crd("gadgets", "Gadget", "Namespaced", true))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	noStatus, err := writeManifest(dir, "gizmos.yaml", crd("gizmos", "Gizmo", "Cluster", false))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	e, err := kubeenv.Start(ctx, kubeenv.Options{NoControllerManager: true, CRDs: []string{withStatus, noStatus}})
	cancel()
	if err != nil {
		fmt.Fprintf(os.Stderr, "discovery tests: start control plane: %v\n", err)
		return 1
	}
	env = e
	code := m.Run()
	if err := env.Stop(); err != nil {
		fmt.Fprintf(os.Stderr, "discovery tests: %v\n", err)
		if code == 0 {
			code = 1
		}
	}
	return code
}

func requireEnv(t *testing.T) {
	t.Helper()
	if env == nil {
		t.Skip("needs a real kube-apiserver; skipped with -short")
	}
}
