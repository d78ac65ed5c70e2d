package e2e

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"

	"github.com/metabus/metabus/internal/allinone"
)

// The parents of TestHangingHookDoesNotStallOthers, in a group of their own
// (e2e/testdata/crds/noisy-*.yaml): Stalls belong to the controller whose
// hook hangs, Quicks to the one that must not notice.
var (
	stallsGVR = schema.GroupVersionResource{Group: "noisy.metabus.dev", Version: "v1", Resource: "stalls"}
	quicksGVR = schema.GroupVersionResource{Group: "noisy.metabus.dev", Version: "v1", Resource: "quicks"}
)

func init() { testParents = append(testParents, stallsGVR, quicksGVR) }

// hangingHook answers no call: each blocks until the caller gives up (its
// webhook timeout) or the test ends. It counts the calls in flight and the
// most seen at once.
type hangingHook struct {
	release  chan struct{}
	calls    atomic.Int64
	inflight atomic.Int64
	peak     atomic.Int64
	peakAt   atomic.Int64 // unix nanos of the last new peak
}

func (h *hangingHook) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	// Read the body first: the server notices a client hanging up (and
	// cancels r.Context()) only once the request body is consumed.
	_, _ = io.Copy(io.Discard, r.Body)
	h.calls.Add(1)
	n := h.inflight.Add(1)
	defer h.inflight.Add(-1)
	for {
		p := h.peak.Load()
		if n <= p {
			break
		}
		if h.peak.CompareAndSwap(p, n) {
			h.peakAt.Store(time.Now().UnixNano())
			break
		}
	}
	select {
	case <-r.Context().Done():
	case <-h.release:
	}
	http.Error(w, "hung up", http.StatusServiceUnavailable)
}

// quickHook answers at once: one ConfigMap named after the parent carrying
// spec.version, and status.observedVersion.
func quickHook(req map[string]any) (int, any) {
	parent := &unstructured.Unstructured{Object: req["parent"].(map[string]any)}
	version, _ := nestedInt(parent, "spec", "version")
	return 200, map[string]any{
		"status": map[string]any{"observedVersion": version},
		"children": []any{map[string]any{
			"apiVersion": "v1", "kind": "ConfigMap",
			"metadata": map[string]any{"name": parent.GetName()},
			"data":     map[string]any{"version": fmt.Sprint(version)},
		}},
	}
}

// TestHangingHookDoesNotStallOthers (issue #12): controller A's sync hook
// hangs until its webhook timeout for more parents than the dispatcher has
// workers; controller B, whose hook answers at once, must keep converging
// as if A were not there. Before per-controller isolation, A's calls held
// every worker and B's updates waited behind them for seconds.
func TestHangingHookDoesNotStallOthers(t *testing.T) {
	const (
		workers      = 16              // the dispatcher's default, set explicitly
		stallParents = 40              // more than workers: A alone saturates them
		stallTimeout = "5s"            // A's webhook timeout
		quickParents = 10              // B's parents
		changes      = 20              // sequential spec changes to B's parents
		changeBound  = 3 * time.Second // each change's child must follow within it
	)
	ctx := context.Background()
	var cfg allinone.Config
	cfg.Dispatcher.Workers = workers
	inst := startMetabus(t, cfg, nil)
	ns := newNamespace(t)

	// Controller A: every sync hangs until the webhook timeout.
	hang := &hangingHook{release: make(chan struct{})}
	urlA := hookServer(t, hang)
	// Registered after the hook server, so it runs before the server's
	// Close, which waits for the handlers.
	t.Cleanup(func() { close(hang.release) })
	createController(t, inst, compositeKind, "noisy-stall", map[string]any{
		"generateSelector": true,
		"parentResource":   map[string]any{"apiVersion": "noisy.metabus.dev/v1", "resource": "stalls"},
		"childResources": []any{map[string]any{
			"apiVersion": "v1", "resource": "configmaps",
			"updateStrategy": map[string]any{"method": "InPlace"},
		}},
		"hooks": map[string]any{"sync": map[string]any{"webhook": map[string]any{"url": urlA, "timeout": stallTimeout}}},
	})
	for i := range stallParents {
		s := &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "noisy.metabus.dev/v1", "kind": "Stall",
			"metadata": map[string]any{"name": fmt.Sprintf("stall-%02d", i)},
			"spec":     map[string]any{"n": int64(i)},
		}}
		if _, err := dyn.Resource(stallsGVR).Namespace(ns).Create(ctx, s, metav1.CreateOptions{}); err != nil {
			t.Fatalf("create stall %d: %v", i, err)
		}
	}
	// Wait until A's calls hang at full concurrency: every worker, or, once
	// the dispatcher limits a controller's share, as many as it lets A
	// have (the peak stops rising).
	eventually(t, 60*time.Second, fmt.Sprintf("controller A's hook to hang at full concurrency (%d calls, or a plateau)", workers), func() error {
		peak := hang.peak.Load()
		if peak >= workers {
			return nil
		}
		if peak > 0 && time.Since(time.Unix(0, hang.peakAt.Load())) > 3*time.Second && hang.inflight.Load() == peak {
			return nil
		}
		return fmt.Errorf("%d calls hanging (peak %d)", hang.inflight.Load(), peak)
	})
	t.Logf("controller A: %d hook calls hanging (peak %d, %d calls so far)", hang.inflight.Load(), hang.peak.Load(), hang.calls.Load())

	// Controller B: a fast hook.
	var callsB atomic.Int64
	urlB := hookServer(t, jsonHook(func(req map[string]any) (int, any) {
		callsB.Add(1)
		return quickHook(req)
	}))
	createController(t, inst, compositeKind, "noisy-quick", map[string]any{
		"generateSelector": true,
		"parentResource":   map[string]any{"apiVersion": "noisy.metabus.dev/v1", "resource": "quicks"},
		"childResources": []any{map[string]any{
			"apiVersion": "v1", "resource": "configmaps",
			"updateStrategy": map[string]any{"method": "InPlace"},
		}},
		"hooks": map[string]any{"sync": map[string]any{"webhook": map[string]any{"url": urlB, "timeout": "5s"}}},
	})
	quicks := make([]string, quickParents)
	for i := range quicks {
		quicks[i] = fmt.Sprintf("quick-%02d", i)
		q := &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "noisy.metabus.dev/v1", "kind": "Quick",
			"metadata": map[string]any{"name": quicks[i]},
			"spec":     map[string]any{"version": int64(1)},
		}}
		if _, err := dyn.Resource(quicksGVR).Namespace(ns).Create(ctx, q, metav1.CreateOptions{}); err != nil {
			t.Fatalf("create quick %d: %v", i, err)
		}
	}
	// childAt reports whether the parent's ConfigMap carries version.
	childAt := func(name string, version int64) bool {
		cm, err := kube.CoreV1().ConfigMaps(ns).Get(ctx, name, metav1.GetOptions{})
		return err == nil && cm.Data["version"] == fmt.Sprint(version)
	}
	// B's first syncs include its informers starting (up to the 5s
	// discovery interval), so they get a generous bound of their own.
	t0 := time.Now()
	pending := slices.Clone(quicks)
	for len(pending) > 0 && time.Since(t0) < 30*time.Second {
		pending = slices.DeleteFunc(pending, func(n string) bool { return childAt(n, 1) })
		time.Sleep(20 * time.Millisecond)
	}
	if len(pending) > 0 {
		t.Fatalf("controller B is stalled by controller A's hanging hook: %d of %d new B parents got their child within 30s (%d B hook calls; A: %d calls hanging)",
			quickParents-len(pending), quickParents, callsB.Load(), hang.inflight.Load())
	}
	t.Logf("controller B: %d parents converged in %s (%d hook calls) while A hangs", quickParents, time.Since(t0).Round(time.Millisecond), callsB.Load())

	// Sequential changes, each awaited.
	var lat []time.Duration
	for i := range changes {
		name := quicks[i%quickParents]
		version := int64(2 + i/quickParents)
		start := time.Now()
		patch := fmt.Sprintf(`{"spec":{"version":%d}}`, version)
		if _, err := dyn.Resource(quicksGVR).Namespace(ns).Patch(ctx, name, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
			t.Fatalf("patch %s: %v", name, err)
		}
		for !childAt(name, version) {
			if time.Since(start) > changeBound {
				t.Fatalf("controller B is stalled by controller A's hanging hook: change %d of %d (%s to version %d) did not reach its child within %s; %d of %d changes converged before it (latencies %s); A: %d calls hanging, %d calls so far",
					i+1, changes, name, version, changeBound, i, changes, fmtDurations(lat), hang.inflight.Load(), hang.calls.Load())
			}
			time.Sleep(10 * time.Millisecond)
		}
		lat = append(lat, time.Since(start))
	}
	sorted := slices.Clone(lat)
	slices.Sort(sorted)
	t.Logf("controller B: %d changes converged beside the hanging controller A: median %s, max %s (A: %d calls hanging, %d calls so far)",
		changes, sorted[len(sorted)/2].Round(time.Millisecond), sorted[len(sorted)-1].Round(time.Millisecond), hang.inflight.Load(), hang.calls.Load())
}

func fmtDurations(ds []time.Duration) string {
	if len(ds) == 0 {
		return "none"
	}
	parts := make([]string, len(ds))
	for i, d := range ds {
		parts[i] = d.Round(time.Millisecond).String()
	}
	return "[" + strings.Join(parts, " ") + "]"
}
