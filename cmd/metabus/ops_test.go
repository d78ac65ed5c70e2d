package main

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spf13/cobra"

	"github.com/metabus/metabus/pkg/cli"
	"github.com/metabus/metabus/pkg/opscli"
)

// execute runs `metabus <args>` as the binary does (its root, pkg/cli's
// Run) and returns its output and exit code.
func execute(t *testing.T, args ...string) (string, int) {
	t.Helper()
	var out bytes.Buffer
	code := cli.Run(context.Background(), newRoot(), args, &out, &out)
	return out.String(), code
}

func TestUsageErrors(t *testing.T) {
	cases := []struct {
		reason string
		args   []string
	}{
		{reason: "an unknown flag", args: []string{"status", "--no-such-flag"}},
		{reason: "an unknown output format", args: []string{"status", "-o", "xml"}},
		{reason: "status takes no arguments", args: []string{"status", "extra"}},
		{reason: "explain needs one parent", args: []string{"explain"}},
		{reason: "a malformed parent name", args: []string{"explain", "a/b/c", "--kubeconfig", "/nonexistent"}},
		{reason: "tail prints no yaml", args: []string{"tail", "-o", "yaml"}},
		{reason: "dlq show needs entry numbers", args: []string{"dlq", "show"}},
		{reason: "dlq show takes numbers", args: []string{"dlq", "show", "x"}},
		{reason: "dlq replay needs a selection", args: []string{"dlq", "replay"}},
		{reason: "dlq purge needs a selection", args: []string{"dlq", "purge", "--nats-url", "nats://127.0.0.1:1"}},
		{reason: "render needs a parent", args: []string{"render", "-c", "x.yaml"}},
		{reason: "render --all takes no files", args: []string{"render", "--all", "--controller", "x", "-p", "p.yaml"}},
	}
	for _, c := range cases {
		t.Run(c.reason, func(t *testing.T) {
			out, code := execute(t, c.args...)
			if code != opscli.ExitUsage {
				t.Errorf("exit %d, want %d (usage); output:\n%s", code, opscli.ExitUsage, out)
			}
		})
	}
}

func TestSharedFlags(t *testing.T) {
	// Every operator subcommand of the root takes the cluster, NATS and
	// output flags.
	root := newRoot()
	var leaves []*cobra.Command
	for _, name := range []string{"status", "tail", "explain", "render"} {
		c, _, err := root.Find([]string{name})
		if err != nil {
			t.Fatalf("metabus has no %s: %v", name, err)
		}
		leaves = append(leaves, c)
	}
	for _, name := range []string{"list", "show", "replay", "purge"} {
		c, _, err := root.Find([]string{"dlq", name})
		if err != nil || c.Name() != name {
			t.Fatalf("metabus has no dlq %s: %v", name, err)
		}
		leaves = append(leaves, c)
	}
	for _, cmd := range leaves {
		for _, name := range []string{"kubeconfig", "context", "nats-url", "nats-creds", "nats-nkey", "nats-ca", "nats-cert", "nats-key", "output", "timeout"} {
			if cmd.Flags().Lookup(name) == nil {
				t.Errorf("%s has no --%s", cmd.CommandPath(), name)
			}
		}
	}
}

func writeFile(t *testing.T, dir, name, content string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestRenderCommand renders from files against a hook server, with no bus
// and no cluster: exit 4 when the desired state differs from the given
// children, 0 when it does not.
func TestRenderCommand(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]any{"children": []any{map[string]any{
			"apiVersion": "v1", "kind": "ConfigMap", "metadata": map[string]any{"name": "greeting"}, "data": map[string]any{"text": "hello"},
		}}})
	}))
	defer srv.Close()
	dir := t.TempDir()
	ctrl := writeFile(t, dir, "controller.yaml", `apiVersion: metacontroller.k8s.io/v1alpha1
kind: CompositeController
metadata:
  name: hello
spec:
  generateSelector: true
  parentResource: {apiVersion: example.com/v1, resource: helloworlds}
  childResources:
  - {apiVersion: v1, resource: configmaps, updateStrategy: {method: InPlace}}
  hooks:
    sync:
      webhook: {url: "http://127.0.0.1:1/unreachable"}
`)
	parent := writeFile(t, dir, "parent.yaml", `apiVersion: example.com/v1
kind: HelloWorld
metadata: {name: p, namespace: ns, uid: p-uid}
spec: {who: you}
`)
	kids := filepath.Join(dir, "children")
	if err := os.Mkdir(kids, 0o700); err != nil {
		t.Fatal(err)
	}
	writeFile(t, kids, "cm.yaml", `apiVersion: v1
kind: ConfigMap
metadata: {name: greeting, namespace: ns}
data: {text: hi}
`)
	out, code := execute(t, "render", "-c", ctrl, "-p", parent, "--hook-url", srv.URL)
	if code != opscli.ExitDiffers || !strings.Contains(out, "create ConfigMap ns/greeting") || !strings.Contains(out, "text: hello") {
		t.Errorf("render without children: exit %d, output:\n%s", code, out)
	}
	out, code = execute(t, "render", "-c", ctrl, "-p", parent, "--children", kids, "--hook-url", srv.URL, "-o", "json")
	var res struct {
		Changes struct {
			Children []struct{ Action, Name string }
		}
	}
	if err := json.Unmarshal([]byte(strings.TrimSuffix(out, "Error: the desired state differs from the observed one\n")), &res); err != nil {
		t.Fatalf("render -o json: %v\n%s", err, out)
	}
	if code != opscli.ExitDiffers || len(res.Changes.Children) != 1 || res.Changes.Children[0].Action != "update" {
		t.Errorf("render with a changed child: exit %d, %+v", code, res)
	}
	// The controller's own URL is unreachable: the call fails (exit 1).
	if out, code := execute(t, "render", "-c", ctrl, "-p", parent); code != opscli.ExitError || !strings.Contains(out, "sync hook") {
		t.Errorf("render with an unreachable hook: exit %d, output:\n%s", code, out)
	}
}
