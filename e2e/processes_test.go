package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/metabus/metabus/examples/helloworld"
	"github.com/metabus/metabus/pkg/testnats"
)

// TestSeparateProcesses runs each stage as its own process (the real
// binaries, as deployed) against a nats-server loaded from the shipped
// deploy/nats/nats-server.conf, each service connected as its own nkey user
// and impersonating its ServiceAccount (the shipped RBAC), and checks that
// HelloWorld converges through the NATS snapshot service and that NATS
// refused nothing any service did (issue #14).
func TestSeparateProcesses(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the service binaries")
	}
	ctx := context.Background()
	bin := t.TempDir()
	build := exec.Command("go", "build", "-o", bin+"/", "../cmd/watcher", "../cmd/dispatcher", "../cmd/applier", "../cmd/revisions")
	build.Stderr = os.Stderr
	start := time.Now()
	if err := build.Run(); err != nil {
		t.Fatalf("build service binaries: %v", err)
	}
	t.Logf("built the service binaries in %s", time.Since(start).Round(time.Millisecond))

	nats := testnats.StartProduction(t, "../deploy/nats/nats-server.conf")
	label := "separate-processes"
	common := []string{
		"--nats-url=" + nats.URL,
		"--metrics-address=0", "--health-probe-bind-address=0", "--zap-log-level=info",
	}
	logs := t.TempDir()
	for _, svc := range []struct {
		name string
		args []string
	}{
		{"watcher", []string{"--target-label-selector=metabus.dev/e2e=" + label, "--discovery-interval=5s"}},
		{"dispatcher", nil},
		{"applier", []string{"--discovery-interval=5s"}},
		{"revisions", nil},
	} {
		logf, err := os.Create(filepath.Join(logs, svc.name+".log"))
		if err != nil {
			t.Fatal(err)
		}
		// Each under its production RBAC and NATS user, as deployed.
		args := append([]string{"--kubeconfig=" + serviceKubeconfig(t, svc.name), "--nats-nkey=" + nats.Seeds[svc.name]}, common...)
		cmd := exec.Command(filepath.Join(bin, svc.name), append(args, svc.args...)...)
		cmd.Stdout, cmd.Stderr = logf, logf
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		if err := cmd.Start(); err != nil {
			t.Fatalf("start %s: %v", svc.name, err)
		}
		name := svc.name
		t.Cleanup(func() {
			_ = cmd.Process.Signal(syscall.SIGTERM)
			done := make(chan error, 1)
			go func() { done <- cmd.Wait() }()
			select {
			case <-done:
			case <-time.After(20 * time.Second):
				_ = cmd.Process.Kill()
				t.Errorf("%s did not stop on SIGTERM", name)
			}
			_ = logf.Close()
			if t.Failed() {
				data, _ := os.ReadFile(logf.Name())
				t.Logf("--- %s log:\n%s", name, tail(string(data), 40))
			}
		})
	}

	ns := newNamespace(t)
	url := hookServer(t, helloworld.Handler())
	cc := manifest(t, "controller.yaml")
	unstructured.SetNestedField(cc, url+"/sync", "spec", "hooks", "sync", "webhook", "url")
	createController(t, &instance{selector: label}, cc["kind"].(string), "hello-separate", cc["spec"].(map[string]any))
	hello := &unstructured.Unstructured{Object: manifest(t, "hello.yaml")}
	if _, err := dyn.Resource(helloGVR).Namespace(ns).Create(ctx, hello, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 60*time.Second, "the child Pod and status from separate processes", func() error {
		pod, err := dyn.Resource(podsGVR).Namespace(ns).Get(ctx, "your-name", metav1.GetOptions{})
		if err != nil {
			return err
		}
		if got := podCommand(pod); got != "echo Hello, Your Name!" {
			return fmt.Errorf("command %q", got)
		}
		p, err := dyn.Resource(helloGVR).Namespace(ns).Get(ctx, "your-name", metav1.GetOptions{})
		if err != nil {
			return err
		}
		if n, ok := nestedInt(p, "status", "pods"); !ok || n != 1 {
			return fmt.Errorf("status %v", p.Object["status"])
		}
		return nil
	})
	// natsx logs every asynchronous permission violation (a refused
	// publish or subscription is otherwise silent for the client).
	for _, name := range []string{"watcher", "dispatcher", "applier", "revisions"} {
		data, err := os.ReadFile(filepath.Join(logs, name+".log"))
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(string(data), "\n") {
			if l := strings.ToLower(line); strings.Contains(l, "permission denied") || strings.Contains(l, "permissions violation") {
				t.Errorf("%s: NATS refused an operation: %s", name, line)
			}
		}
	}
}

func tail(s string, n int) string {
	lines := 0
	for i := len(s) - 1; i >= 0; i-- {
		if s[i] == '\n' {
			lines++
			if lines > n {
				return s[i+1:]
			}
		}
	}
	return s
}
