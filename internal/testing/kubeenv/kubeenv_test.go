package kubeenv

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
)

const widgetCRD = `apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: widgets.example.com
spec:
  group: example.com
  scope: Namespaced
  names: {plural: widgets, singular: widget, kind: Widget, listKind: WidgetList}
  versions:
  - name: v1
    served: true
    storage: true
    subresources: {status: {}}
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec: {type: object, x-kubernetes-preserve-unknown-fields: true}
          status: {type: object, x-kubernetes-preserve-unknown-fields: true}
`

// A Widget listed before its CRD: Apply must order them itself.
const widgetObject = `apiVersion: example.com/v1
kind: Widget
metadata:
  name: from-apply
spec:
  size: 1
---
`

var (
	nsGVR     = schema.GroupVersionResource{Version: "v1", Resource: "namespaces"}
	podGVR    = schema.GroupVersionResource{Version: "v1", Resource: "pods"}
	cmGVR     = schema.GroupVersionResource{Version: "v1", Resource: "configmaps"}
	widgetGVR = schema.GroupVersionResource{Group: "example.com", Version: "v1", Resource: "widgets"}
)

// requireBinaries returns the binary dir, building it if needed. The
// control-plane tests are skipped only with -short: a missing or broken
// build must fail them, not hide them.
func requireBinaries(t *testing.T) string {
	t.Helper()
	if testing.Short() {
		t.Skip("starts real kube-apiserver/etcd processes; skipped with -short")
	}
	begin := time.Now()
	dir, err := BinDir()
	if err != nil {
		t.Fatalf("BinDir: %v", err)
	}
	t.Logf("binaries in %s (BinDir took %s)", dir, since(begin))
	return dir
}

// logRecorder forwards to t.Logf and keeps the lines for assertions.
type logRecorder struct {
	t     *testing.T
	mu    sync.Mutex
	lines []string
}

func (r *logRecorder) logf(format string, args ...any) {
	line := fmt.Sprintf(format, args...)
	r.mu.Lock()
	r.lines = append(r.lines, line)
	r.mu.Unlock()
	r.t.Log(line)
}

func (r *logRecorder) contains(s string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, l := range r.lines {
		if strings.Contains(l, s) {
			return true
		}
	}
	return false
}

// TestControlPlane starts two clusters in parallel and runs the owner /
// garbage-collection scenario in both:
//   - "a": CRD installed through Options.CRDs (before the controller
//     manager), state dir created by Start and removed by Stop;
//   - "b": CRD (plus a Widget listed before it) installed with Apply on the
//     running cluster followed by RestartControllerManager, state dir owned
//     by the test and kept by Stop.
//
// The first port handed out is taken, so one of the apiservers must retry.
func TestControlPlane(t *testing.T) {
	binDir := requireBinaries(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()

	crdDir := t.TempDir()
	if err := os.WriteFile(filepath.Join(crdDir, "widgets.yaml"), []byte(widgetCRD), 0o644); err != nil {
		t.Fatal(err)
	}
	applyFile := filepath.Join(t.TempDir(), "widgets-and-one.yaml")
	if err := os.WriteFile(applyFile, []byte(widgetObject+widgetCRD), 0o644); err != nil {
		t.Fatal(err)
	}

	// Exercise the port-collision retry: the first Start to pick a port gets
	// one that is in use.
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	busyPort := busy.Addr().(*net.TCPAddr).Port
	var handedBusy atomic.Bool
	pickPort = func() (int, error) {
		if handedBusy.CompareAndSwap(false, true) {
			return busyPort, nil
		}
		return freePort()
	}
	defer func() { pickPort = freePort }()

	logs := &logRecorder{t: t}
	keptDir := t.TempDir()
	opts := map[string]Options{
		"a": {BinDir: binDir, CRDs: []string{crdDir}, Log: logs.logf},
		"b": {BinDir: binDir, Dir: keptDir, Log: logs.logf},
	}
	envs := map[string]*Env{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	begin := time.Now()
	for name, o := range opts {
		wg.Go(func() {
			t0 := time.Now()
			env, err := Start(ctx, o)
			if err != nil {
				t.Errorf("Start %s: %v", name, err)
				return
			}
			t.Logf("cluster %s: startup took %s (dir %s, %s)", name, since(t0), env.Dir, env.Config.Host)
			mu.Lock()
			envs[name] = env
			mu.Unlock()
		})
	}
	wg.Wait()
	t.Logf("both clusters up %s after the parallel start", since(begin))
	defer func() {
		for _, env := range envs {
			_ = env.Stop() // no-op after the explicit Stop below
		}
	}()
	if t.Failed() {
		t.FailNow()
	}
	if !handedBusy.Load() || !logs.contains(fmt.Sprintf("port %d was taken, retrying", busyPort)) {
		t.Errorf("expected a retry after being handed busy port %d", busyPort)
	}
	for name, env := range envs {
		if strings.HasSuffix(env.Config.Host, fmt.Sprintf(":%d", busyPort)) {
			t.Errorf("cluster %s runs on the busy port %d", name, busyPort)
		}
		if st, err := os.Stat(env.Kubeconfig); err != nil {
			t.Errorf("cluster %s: kubeconfig: %v", name, err)
		} else if st.Mode().Perm() != 0o600 {
			t.Errorf("cluster %s: kubeconfig %s has mode %v, want 0600", name, env.Kubeconfig, st.Mode().Perm())
		}
	}

	// Cluster b: CRD installed after the controller manager started.
	b := envs["b"]
	tApply := time.Now()
	if err := b.Apply(ctx, applyFile); err != nil {
		t.Fatalf("Apply: %v", err)
	}
	t.Logf("cluster b: Apply of CRD + Widget took %s", since(tApply))
	if _, err := dynClient(t, b).Resource(widgetGVR).Namespace("default").Get(ctx, "from-apply", metav1.GetOptions{}); err != nil {
		t.Fatalf("Widget applied together with its CRD: %v", err)
	}
	// Applying the same file again must update, not fail.
	if err := b.Apply(ctx, applyFile); err != nil {
		t.Fatalf("second Apply: %v", err)
	}
	tRestart := time.Now()
	if err := b.RestartControllerManager(ctx); err != nil {
		t.Fatalf("RestartControllerManager: %v", err)
	}
	t.Logf("cluster b: RestartControllerManager took %s", since(tRestart))

	pids := map[string]map[string]int{}
	for name, env := range envs {
		pids[name] = env.pids()
		if len(pids[name]) != 3 {
			t.Fatalf("cluster %s: want 3 processes, have %v", name, pids[name])
		}
	}

	t.Run("scenario", func(t *testing.T) {
		for name, env := range envs {
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				gcScenario(ctx, t, env, "gc-"+name)
			})
		}
	})

	// Each cluster has its own storage: neither sees the other's namespace.
	for name, env := range envs {
		for other := range envs {
			_, err := dynClient(t, env).Resource(nsGVR).Get(ctx, "gc-"+other, metav1.GetOptions{})
			switch {
			case other == name && err != nil:
				t.Errorf("cluster %s: own namespace gc-%s: %v", name, other, err)
			case other != name && !apierrors.IsNotFound(err):
				t.Errorf("cluster %s: namespace gc-%s of the other cluster: want NotFound, got %v", name, other, err)
			}
		}
	}

	for name, env := range envs {
		tStop := time.Now()
		if err := env.Stop(); err != nil {
			t.Errorf("Stop %s: %v", name, err)
		}
		t.Logf("cluster %s: Stop took %s", name, since(tStop))
		if err := env.Stop(); err != nil {
			t.Errorf("second Stop %s: %v", name, err)
		}
		for comp, pid := range pids[name] {
			if running(pid) {
				t.Errorf("cluster %s: %s (pid %d) still running after Stop", name, comp, pid)
			}
		}
		if left := processesMentioning(env.Dir); len(left) > 0 {
			t.Errorf("cluster %s: processes still using %s: %v", name, env.Dir, left)
		}
	}
	if _, err := os.Stat(envs["a"].Dir); !os.IsNotExist(err) {
		t.Errorf("state dir %s created by Start still exists after Stop (err %v)", envs["a"].Dir, err)
	}
	if _, err := os.Stat(filepath.Join(keptDir, "apiserver.log")); err != nil {
		t.Errorf("state dir passed in Options.Dir must be kept: %v", err)
	}
}

func dynClient(t *testing.T, env *Env) *dynamic.DynamicClient {
	t.Helper()
	c, err := dynamic.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// gcScenario: a Widget owns a ConfigMap and a Pod; the Pod's status is set
// through the status subresource; deleting the Widget must make the garbage
// collector delete both dependents.
func gcScenario(ctx context.Context, t *testing.T, env *Env, ns string) {
	c := dynClient(t, env)
	obj := func(m map[string]any) *unstructured.Unstructured { return &unstructured.Unstructured{Object: m} }

	if _, err := c.Resource(nsGVR).Create(ctx, obj(map[string]any{
		"apiVersion": "v1", "kind": "Namespace", "metadata": map[string]any{"name": ns},
	}), metav1.CreateOptions{}); err != nil {
		t.Fatalf("create namespace: %v", err)
	}
	tSA := time.Now()
	if err := env.WaitForDefaultServiceAccount(ctx, ns); err != nil {
		t.Fatal(err)
	}
	t.Logf("default ServiceAccount in %s after %s", ns, since(tSA))

	widget, err := c.Resource(widgetGVR).Namespace(ns).Create(ctx, obj(map[string]any{
		"apiVersion": "example.com/v1", "kind": "Widget",
		"metadata": map[string]any{"name": "w1"},
		"spec":     map[string]any{"size": int64(3)},
	}), metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create widget: %v", err)
	}
	// The CRD has a status subresource: status goes through it.
	if _, err := c.Resource(widgetGVR).Namespace(ns).Patch(ctx, "w1", types.MergePatchType,
		[]byte(`{"status":{"ready":true}}`), metav1.PatchOptions{}, "status"); err != nil {
		t.Fatalf("patch widget status: %v", err)
	}
	owner := []any{map[string]any{
		"apiVersion": "example.com/v1", "kind": "Widget", "name": "w1", "uid": string(widget.GetUID()),
		"controller": true, "blockOwnerDeletion": true,
	}}
	if _, err := c.Resource(cmGVR).Namespace(ns).Create(ctx, obj(map[string]any{
		"apiVersion": "v1", "kind": "ConfigMap",
		"metadata": map[string]any{"name": "cm1", "ownerReferences": owner},
		"data":     map[string]any{"k": "v"},
	}), metav1.CreateOptions{}); err != nil {
		t.Fatalf("create configmap: %v", err)
	}
	if _, err := c.Resource(podGVR).Namespace(ns).Create(ctx, obj(map[string]any{
		"apiVersion": "v1", "kind": "Pod",
		"metadata": map[string]any{"name": "p1", "ownerReferences": owner},
		"spec": map[string]any{"containers": []any{map[string]any{
			"name": "c", "image": "registry.invalid/never-pulled:1",
		}}},
	}), metav1.CreateOptions{}); err != nil {
		t.Fatalf("create pod: %v", err)
	}

	// No kubelet: the test plays its part and reports the Pod Ready.
	now := time.Now().UTC().Format(time.RFC3339)
	status := fmt.Sprintf(`{"status":{"phase":"Running",
		"conditions":[{"type":"Ready","status":"True","lastTransitionTime":%q}],
		"containerStatuses":[{"name":"c","ready":true,"restartCount":0,"image":"registry.invalid/never-pulled:1","imageID":"",
			"started":true,"state":{"running":{"startedAt":%q}}}]}}`, now, now)
	if _, err := c.Resource(podGVR).Namespace(ns).Patch(ctx, "p1", types.MergePatchType, []byte(status), metav1.PatchOptions{}, "status"); err != nil {
		t.Fatalf("patch pod status: %v", err)
	}
	pod, err := c.Resource(podGVR).Namespace(ns).Get(ctx, "p1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	phase, _, _ := unstructured.NestedString(pod.Object, "status", "phase")
	conds, _, _ := unstructured.NestedSlice(pod.Object, "status", "conditions")
	ready := false
	for _, cond := range conds {
		m, _ := cond.(map[string]any)
		ready = ready || (m["type"] == "Ready" && m["status"] == "True")
	}
	if phase != "Running" || !ready {
		t.Fatalf("pod status after patch: phase %q, conditions %v; want Running and Ready", phase, conds)
	}

	bg := metav1.DeletePropagationBackground
	tDel := time.Now()
	if err := c.Resource(widgetGVR).Namespace(ns).Delete(ctx, "w1", metav1.DeleteOptions{PropagationPolicy: &bg}); err != nil {
		t.Fatalf("delete widget: %v", err)
	}
	gone := func(gvr schema.GroupVersionResource, name string) bool {
		_, err := c.Resource(gvr).Namespace(ns).Get(ctx, name, metav1.GetOptions{})
		return apierrors.IsNotFound(err)
	}
	deadline := time.Now().Add(60 * time.Second)
	for !(gone(cmGVR, "cm1") && gone(podGVR, "p1")) {
		if time.Now().After(deadline) {
			t.Fatalf("garbage collector did not delete the Widget's ConfigMap and Pod within 60s (configmap gone: %v, pod gone: %v)",
				gone(cmGVR, "cm1"), gone(podGVR, "p1"))
		}
		time.Sleep(100 * time.Millisecond)
	}
	took := time.Since(tDel)
	t.Logf("garbage collector removed ConfigMap and Pod %s after the Widget was deleted", took.Round(10*time.Millisecond))
	// Without a synced garbage collector for the new type this takes 30-45s;
	// far less shows the CRD was known to it (installed before it started,
	// or restarted afterwards).
	if took > 25*time.Second {
		t.Errorf("garbage collection took %s: the controller manager did not know the Widget type at start", took)
	}
}

// TestStartFailureReportsLogTail: a component that dies at startup yields an
// error with its log tail, and a state dir created by Start is removed.
func TestStartFailureReportsLogTail(t *testing.T) {
	bin := t.TempDir()
	script := "#!/bin/sh\necho 'fake etcd: unknown flag --bogus' >&2\nexit 3\n"
	for _, n := range []string{etcdBin, apiserverBin, kcmBin} {
		if err := os.WriteFile(filepath.Join(bin, n), []byte(script), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	dir := filepath.Join(t.TempDir(), "state")
	_, err := Start(context.Background(), Options{BinDir: bin, Dir: dir, Log: t.Logf})
	if err == nil {
		t.Fatal("Start succeeded with a failing etcd")
	}
	t.Logf("error: %v", err)
	for _, want := range []string{"start etcd", "exit status 3", "fake etcd: unknown flag --bogus", "etcd.log"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error does not mention %q", want)
		}
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("state dir %s created by Start still exists (err %v)", dir, err)
	}
}

// TestAPIServerFailureStopsEtcd: when the apiserver fails, the already
// running etcd is stopped and the error carries the apiserver's log tail.
func TestAPIServerFailureStopsEtcd(t *testing.T) {
	real := requireBinaries(t)
	bin := t.TempDir()
	if err := os.Symlink(filepath.Join(real, etcdBin), filepath.Join(bin, etcdBin)); err != nil {
		t.Fatal(err)
	}
	script := "#!/bin/sh\necho 'fake apiserver: cannot start' >&2\nexit 1\n"
	if err := os.WriteFile(filepath.Join(bin, apiserverBin), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "state")
	_, err := Start(context.Background(), Options{BinDir: bin, Dir: dir, NoControllerManager: true, Log: t.Logf})
	if err == nil {
		t.Fatal("Start succeeded with a failing kube-apiserver")
	}
	t.Logf("error: %v", err)
	for _, want := range []string{"start kube-apiserver", "fake apiserver: cannot start", "apiserver.log"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error does not mention %q", want)
		}
	}
	if left := processesMentioning(dir); len(left) > 0 {
		t.Errorf("processes still using %s: %v", dir, left)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("state dir %s still exists (err %v)", dir, err)
	}
}
