package e2e

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/metabus/metabus/internal/allinone"
	"github.com/metabus/metabus/pkg/bus"
)

// TestHangingHooksDoNotStarve (issue 35, starve others by hanging hooks):
// a controller whose hook hangs until its timeout, on more parents than an
// MC_WORK partition's MaxAckPending, does not stop another controller of
// the same replica and the same partition from converging, under the
// hardened profile's --max-held-per-controller. Without the bound, the
// hanging controller's items filled the partition's window of
// unacknowledged messages, and the server delivered the other
// controller's changes only once enough of them had timed out.
func TestHangingHooksDoNotStarve(t *testing.T) {
	const (
		hangParents = bus.WorkMaxAckPending + 276
		hookTimeout = 5 * time.Second
		changes     = 5
		// What a change of the other controller may take: a few hook
		// timeouts on a loaded machine. Unbounded, its item waited for
		// the hanging ones beyond the window to time out, 16 per
		// timeout (--workers).
		changeBound = 20 * time.Second
	)
	hardened := hardenedProfile(t)
	held := hardened.Dispatcher.Headroom
	if held <= 0 || held >= bus.WorkMaxAckPending {
		t.Fatalf("deploy/overlays/hardened does not bound the work items a controller holds in a partition (--max-held-per-controller=%d)", held)
	}
	var cfg allinone.Config
	cfg.Dispatcher.Headroom = held
	cfg.Dispatcher.ResyncAfterBacklog = hardened.Dispatcher.ResyncAfterBacklog
	cfg.Watcher.Weights = hardened.Watcher.Weights
	// One partition: every controller's items share one consumer's
	// MaxAckPending.
	cfg.Watcher.Bus.Partitions = 1
	inst := startMetabus(t, cfg, nil)
	ns := newNamespace(t)

	// The other controller, converged before the hanging one starts.
	createQuickController(t, inst, "beside-hang")
	const quickParents = 5
	quicks := createQuicks(t, ns, "quick", quickParents)
	eventually(t, 60*time.Second, "the other controller's parents to converge", func() error { return quicksAt(ns, quicks, 1) })

	// The hanging controller: its hook answers nothing until the
	// dispatcher gives up on it.
	var hangCalls atomic.Int64
	quit := make(chan struct{})
	urlHang := hookServer(t, http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) {
		hangCalls.Add(1)
		select {
		case <-r.Context().Done():
		case <-quit:
		}
	}))
	t.Cleanup(func() { close(quit) }) // before the server's Close waits for its handlers
	createControllerWith(t, inst, compositeKind, "hang", map[string]any{
		"generateSelector": true,
		"parentResource":   map[string]any{"apiVersion": "noisy.metabus.dev/v1", "resource": "stalls"},
		"hooks":            map[string]any{"sync": map[string]any{"webhook": map[string]any{"url": urlHang, "timeout": hookTimeout.String()}}},
	}, map[string]string{bus.WeightAnnotation: "100"})
	// Its parents are created once it is watching them, so each is a
	// change (not a resync, which the watcher paces).
	createStallsParallel(t, ns, "hang", 0, 1)
	eventually(t, 60*time.Second, "the hanging controller's first call", func() error {
		if hangCalls.Load() == 0 {
			return fmt.Errorf("no call yet")
		}
		return nil
	})
	created := time.Now()
	createStallsParallel(t, ns, "hang", 1, hangParents)
	t.Logf("%d parents of the hanging controller created in %s", hangParents, time.Since(created).Round(time.Millisecond))

	// The other controller's changes while the hanging one's backlog is
	// there: every parent's hook call, but a few, still to time out.
	var lat []time.Duration
	for i := range changes {
		lat = append(lat, changeQuick(t, ns, quicks, i, changeBound, func() string {
			return fmt.Sprintf("beside %d hanging parents (%d hanging hook calls so far; latencies before %s; %.0f items put off)",
				hangParents, hangCalls.Load(), fmtDurations(lat), inst.counter(t, "metabus_dispatcher_put_off_total", nil))
		}))
	}
	calls := hangCalls.Load()
	if calls >= int64(hangParents) {
		t.Errorf("the hanging controller's hook was called %d times: its backlog of %d was gone before the other controller's changes were measured", calls, hangParents)
	}
	sorted := slices.Clone(lat)
	slices.Sort(sorted)
	t.Logf("beside %d parents whose hook hangs %s (%d calls so far, %.0f items put off, --max-held-per-controller=%d): %d changes of another controller in the same partition, median %s, max %s",
		hangParents, hookTimeout, calls, inst.counter(t, "metabus_dispatcher_put_off_total", nil), held, changes,
		sorted[len(sorted)/2].Round(time.Millisecond), sorted[len(sorted)-1].Round(time.Millisecond))
}

// createStallsParallel creates the Stall parents <prefix>-NNNN numbered
// from to to (exclusive) in ns, a few at a time.
func createStallsParallel(t *testing.T, ns, prefix string, from, to int) {
	t.Helper()
	next := make(chan int)
	var wg sync.WaitGroup
	var failed atomic.Value
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				s := &unstructured.Unstructured{Object: map[string]any{
					"apiVersion": "noisy.metabus.dev/v1", "kind": "Stall",
					"metadata": map[string]any{"name": fmt.Sprintf("%s-%04d", prefix, i)},
					"spec":     map[string]any{"n": int64(i)},
				}}
				if _, err := dyn.Resource(stallsGVR).Namespace(ns).Create(context.Background(), s, metav1.CreateOptions{}); err != nil {
					failed.CompareAndSwap(nil, fmt.Errorf("create %s parent %d: %w", prefix, i, err))
				}
			}
		}()
	}
	for i := from; i < to; i++ {
		next <- i
	}
	close(next)
	wg.Wait()
	if err, _ := failed.Load().(error); err != nil {
		t.Fatal(err)
	}
}
