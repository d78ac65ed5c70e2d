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
	"github.com/metabus/metabus/internal/testing/testbin"
	"github.com/metabus/metabus/internal/testing/testnats"
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
	nats := testnats.StartProduction(t, "../deploy/nats/nats-server.conf")
	label := "separate-processes"
	logs := startServices(t, func(string) string { return nats.URL }, nats.Seeds, []serviceSpec{
		{"watcher", []string{"--target-label-selector=metabus.dev/e2e=" + label, "--discovery-interval=5s"}},
		{"dispatcher", nil},
		{"applier", []string{"--discovery-interval=5s"}},
		{"revisions", nil},
	})

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
	checkNoPermissionDenied(t, logs)
}

// serviceSpec is a service binary to run and its own flags.
type serviceSpec struct {
	name string // binary (cmd/<name>) and NATS user
	args []string
}

// serviceBins are the four service binaries and the all-in-one
// cmd/metabus, built once for every test that runs them as processes.
var serviceBins = testbin.Once{What: "the service binaries", Build: func(dir string) error {
	build := exec.Command("go", "build", "-o", dir+"/", "../cmd/metabus", "../cmd/watcher", "../cmd/dispatcher", "../cmd/applier", "../cmd/revisions")
	build.Stderr = os.Stderr
	return build.Run()
}}

// serviceBinaries is the directory holding serviceBins.
func serviceBinaries(t *testing.T) string {
	t.Helper()
	return serviceBins.Dir(t)
}

// startServices runs each service as its own process (the real binaries,
// as deployed) under its production RBAC and NATS user (seeds, by service
// name), connected to natsURL(name). Each is stopped with SIGTERM when the
// test ends (an error if it does not stop, or if it exited before); its log
// is shown if the test failed. It returns the log paths by instance name.
func startServices(t *testing.T, natsURL func(name string) string, seeds map[string]string, svcs []serviceSpec) map[string]string {
	t.Helper()
	bin := serviceBinaries(t)
	logDir := t.TempDir()
	logs := map[string]string{}
	common := []string{"--metrics-address=0", "--health-probe-bind-address=0", "--zap-log-level=info"}
	for i, svc := range svcs {
		name := svc.name
		if _, dup := logs[name]; dup {
			name = fmt.Sprintf("%s-%d", svc.name, i)
		}
		logf, err := os.Create(filepath.Join(logDir, name+".log"))
		if err != nil {
			t.Fatal(err)
		}
		logs[name] = logf.Name()
		args := append([]string{"--kubeconfig=" + serviceKubeconfig(t, svc.name), "--nats-nkey=" + seeds[svc.name], "--nats-url=" + natsURL(name)}, common...)
		cmd := exec.Command(filepath.Join(bin, svc.name), append(args, svc.args...)...)
		cmd.Stdout, cmd.Stderr = logf, logf
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		if err := cmd.Start(); err != nil {
			t.Fatalf("start %s: %v", name, err)
		}
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		t.Cleanup(func() {
			select {
			case err := <-done:
				t.Errorf("%s exited before the test ended: %v", name, err)
			default:
				_ = cmd.Process.Signal(syscall.SIGTERM)
				select {
				case <-done:
				case <-time.After(20 * time.Second):
					_ = cmd.Process.Kill()
					t.Errorf("%s did not stop on SIGTERM", name)
				}
			}
			_ = logf.Close()
			if t.Failed() {
				data, _ := os.ReadFile(logf.Name())
				t.Logf("--- %s log:\n%s", name, tail(string(data), 40))
			}
		})
	}
	return logs
}

// checkNoPermissionDenied fails the test for every NATS permission
// violation a service logged (natsx logs each: a refused publish or
// subscription is otherwise silent for the client).
func checkNoPermissionDenied(t *testing.T, logs map[string]string) {
	t.Helper()
	for name, path := range logs {
		data, err := os.ReadFile(path)
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
