package e2e

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/metabus/metabus/internal/allinone"
	"github.com/metabus/metabus/pkg/bus"
)

// echoHook is the benchmark's hook: one ConfigMap carrying spec.version,
// status {childCount, observedVersion}. It records the spec.version of
// every call.
type echoHook struct {
	mu    sync.Mutex
	calls []int64
}

func (h *echoHook) serve(req map[string]any) (int, any) {
	parent := &unstructured.Unstructured{Object: req["parent"].(map[string]any)}
	version, _ := nestedInt(parent, "spec", "version")
	children, _ := req["children"].(map[string]any)
	cms, _ := children["ConfigMap.v1"].(map[string]any)
	h.mu.Lock()
	h.calls = append(h.calls, version)
	h.mu.Unlock()
	return 200, map[string]any{
		"status": map[string]any{"childCount": len(cms), "observedVersion": version},
		"children": []any{map[string]any{
			"apiVersion": "v1", "kind": "ConfigMap",
			"metadata": map[string]any{"name": parent.GetName(), "labels": map[string]any{"app": parent.GetName()}},
			"data":     map[string]any{"version": fmt.Sprint(version)},
		}},
	}
}

func (h *echoHook) seen() []int64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]int64(nil), h.calls...)
}

// startEchoController runs the echo hook's controller; annotations go on
// the controller (bus.SuppressEchoesAnnotation opts it into echo
// suppression).
func startEchoController(t *testing.T, name string, annotations map[string]string) (*echoHook, string) {
	t.Helper()
	inst := startMetabus(t, allinone.Config{}, nil)
	ns := newNamespace(t)
	h := &echoHook{}
	url := hookServer(t, jsonHook(h.serve))
	createControllerWith(t, inst, compositeKind, name, map[string]any{
		"parentResource": map[string]any{"apiVersion": "test.metabus.dev/v1", "resource": "widgets"},
		"childResources": []any{map[string]any{
			"apiVersion": "v1", "resource": "configmaps",
			"updateStrategy": map[string]any{"method": "InPlace"},
		}},
		"hooks": map[string]any{"sync": map[string]any{"webhook": map[string]any{"url": url}}},
	}, annotations)
	return h, ns
}

// waitVersion waits until the widget's ConfigMap and status show version.
func waitVersion(t *testing.T, ns, name string, version int64) {
	t.Helper()
	ctx := context.Background()
	eventually(t, 60*time.Second, fmt.Sprintf("%s at version %d", name, version), func() error {
		cm, err := kube.CoreV1().ConfigMaps(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if got := cm.Data["version"]; got != fmt.Sprint(version) {
			return fmt.Errorf("ConfigMap at version %s", got)
		}
		w, err := dyn.Resource(widgetsGVR).Namespace(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		count, _ := nestedInt(w, "status", "childCount")
		observed, _ := nestedInt(w, "status", "observedVersion")
		if count != 1 || observed != version {
			return fmt.Errorf("status childCount %d observedVersion %d", count, observed)
		}
		return nil
	})
}

// TestBurstConvergesToLastUpdate: 100 back-to-back updates of one parent
// end with the hook having seen the last one and the cluster showing it,
// although metabus coalesces the burst (and, under upstream's contract,
// shows the hook its own writes too).
// (A first version of echo detection lost the last update here: a status
// write made against someone else's newer parent passed for our own.)
func TestBurstConvergesToLastUpdate(t *testing.T) {
	ctx := context.Background()
	h, ns := startEchoController(t, "widgets-burst", nil)
	if _, err := dyn.Resource(widgetsGVR).Namespace(ns).Create(ctx, newWidget("burst", nil, 1), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitVersion(t, ns, "burst", 1)
	before := len(h.seen())
	const updates = 100
	for v := int64(2); v <= updates+1; v++ {
		patch := fmt.Sprintf(`{"spec":{"version":%d}}`, v)
		if _, err := dyn.Resource(widgetsGVR).Namespace(ns).Patch(ctx, "burst", "application/merge-patch+json", []byte(patch), metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	waitVersion(t, ns, "burst", updates+1)
	time.Sleep(2 * time.Second) // let any trailing sync show up
	calls := h.seen()[before:]
	t.Logf("%d hook calls for %d back-to-back updates (versions seen: %v)", len(calls), updates, calls)
	if len(calls) == 0 || calls[len(calls)-1] != updates+1 {
		t.Errorf("the last hook call saw %v, want version %d", calls, updates+1)
	}
	// Coalescing is a promise too: without it every update costs a call.
	if len(calls) > updates/4 {
		t.Errorf("%d hook calls for %d updates: bursts are not coalesced", len(calls), updates)
	}
}

// TestOwnWritesCostNoHookCall: with the opt-in annotation
// (bus.SuppressEchoesAnnotation), a new parent needs exactly two hook calls
// (the first creates the ConfigMap, the second sees it and reports
// childCount 1); the status writes and ConfigMap updates metabus makes are
// echoes. Every change someone else makes still reaches the hook, including
// a change to the child metabus wrote. Without the annotation every own
// write is shown (TestSuppressEchoesOptIn, calling_contract_test.go).
func TestOwnWritesCostNoHookCall(t *testing.T) {
	ctx := context.Background()
	h, ns := startEchoController(t, "widgets-echo", map[string]string{bus.SuppressEchoesAnnotation: "true"})
	if _, err := dyn.Resource(widgetsGVR).Namespace(ns).Create(ctx, newWidget("echo", nil, 1), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitVersion(t, ns, "echo", 1)
	time.Sleep(2 * time.Second)
	if calls := h.seen(); len(calls) > 2 {
		// Some races (a note arriving after its event) cost one more;
		// more than that means echoes are not recognised.
		t.Logf("hook calls for a new parent: %d (want 2; 3 can happen in a race)", len(calls))
		if len(calls) > 3 {
			t.Errorf("a new parent cost %d hook calls, want 2", len(calls))
		}
	}

	// Someone else's change to the child: the hook must hear of it.
	n := len(h.seen())
	cm, err := kube.CoreV1().ConfigMaps(ns).Get(ctx, "echo", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cm.Data["version"] = "tampered"
	if _, err := kube.CoreV1().ConfigMaps(ns).Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "the hook sees the tampered child", func() error {
		if len(h.seen()) == n {
			return fmt.Errorf("no hook call since the child was changed by someone else")
		}
		return nil
	})
	waitVersion(t, ns, "echo", 1)

	// Ten sequential changes, each awaited: one hook call each (the
	// ConfigMap update and the status write are echoes).
	time.Sleep(time.Second)
	n = len(h.seen())
	for v := int64(2); v <= 11; v++ {
		patch := fmt.Sprintf(`{"spec":{"version":%d}}`, v)
		if _, err := dyn.Resource(widgetsGVR).Namespace(ns).Patch(ctx, "echo", "application/merge-patch+json", []byte(patch), metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
		waitVersion(t, ns, "echo", v)
	}
	time.Sleep(2 * time.Second)
	calls := h.seen()[n:]
	t.Logf("%d hook calls for 10 awaited updates: %v", len(calls), calls)
	if len(calls) < 10 {
		t.Errorf("%d hook calls for 10 updates: some update was never shown to the hook", len(calls))
	}
	if len(calls) > 13 {
		t.Errorf("%d hook calls for 10 updates: own writes are not recognised as echoes", len(calls))
	}
}
