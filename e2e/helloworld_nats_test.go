package e2e

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"

	"github.com/metabus/metabus/internal/allinone"
)

// TestHelloWorldNATS runs examples/helloworld-nats as its README does: the
// example's command, built and started as a process, serves the sync hook
// on the all-in-one's embedded NATS, and the example's controller.yaml,
// unchanged (its hooks.sync.nats.subject is the command's default), is
// accepted by the CRD with strict field validation. The tutorial's parent
// gets its greeting Pod; on SIGTERM the command stops cleanly.
func TestHelloWorldNATS(t *testing.T) {
	ctx := context.Background()
	inst := startMetabus(t, allinone.Config{}, nil)
	ns := newNamespace(t)

	bin := filepath.Join(t.TempDir(), "helloworld-nats")
	if out, err := exec.Command("go", "build", "-o", bin, "../examples/helloworld-nats").CombinedOutput(); err != nil {
		t.Fatalf("go build examples/helloworld-nats: %v\n%s", err, out)
	}
	var logs lockedBuffer
	cmd := exec.Command(bin, "--nats-url", inst.url)
	cmd.Stdout, cmd.Stderr = &logs, &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		select {
		case err := <-exited:
			t.Errorf("the hook exited before the end of the test: %v\n%s", err, logs.String())
			return
		default:
		}
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case err := <-exited:
			if err != nil {
				t.Errorf("the hook's exit on SIGTERM: %v\n%s", err, logs.String())
			}
		case <-time.After(15 * time.Second):
			_ = cmd.Process.Kill()
			t.Errorf("the hook did not stop within 15s of SIGTERM\n%s", logs.String())
		}
	})

	data, err := os.ReadFile("../examples/helloworld-nats/manifests/controller.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var cc map[string]any
	if err := yaml.Unmarshal(data, &cc); err != nil {
		t.Fatal(err)
	}
	u := &unstructured.Unstructured{Object: cc}
	// Strict: a field the CRD does not know (hooks.sync.nats before it
	// existed) is an error rather than silently pruned.
	if _, err := dyn.Resource(controllerGVRs[u.GetKind()]).Create(ctx, u.DeepCopy(),
		metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}, FieldValidation: metav1.FieldValidationStrict}); err != nil {
		t.Fatalf("the example's controller.yaml against the CRD: %v", err)
	}
	createController(t, inst, u.GetKind(), u.GetName(), cc["spec"].(map[string]any))

	if _, err := dyn.Resource(helloGVR).Namespace(ns).Create(ctx, &unstructured.Unstructured{Object: manifest(t, "hello.yaml")}, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create HelloWorld: %v", err)
	}
	var pod *unstructured.Unstructured
	eventually(t, 60*time.Second, "the child Pod", func() error {
		p, err := dyn.Resource(podsGVR).Namespace(ns).Get(ctx, "your-name", metav1.GetOptions{})
		pod = p
		return err
	})
	if got, want := podCommand(pod), "echo Hello, Your Name!"; got != want {
		t.Errorf("pod command = %q, want %q", got, want)
	}
	if !strings.Contains(logs.String(), "serving the HelloWorld sync hook on hooks.helloworld.sync") {
		t.Errorf("the hook's log does not say what it serves:\n%s", logs.String())
	}
}
