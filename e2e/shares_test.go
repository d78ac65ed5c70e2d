package e2e

import (
	"context"
	"fmt"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"

	"github.com/metabus/metabus/internal/allinone"
	"github.com/metabus/metabus/pkg/bus"
)

// TestResyncFloodPaced (issue 35, starve others by resyncs): a controller
// whose hook asks resyncAfterSeconds: 0.1 for each of its many parents,
// under the hardened profile's --resync-after-backlog, keeps few items in
// MC_WORK (unpaced, it kept about one per parent there, filling the
// partitions' MaxAckPending that every controller shares), and another
// controller's changes are handled while the flood goes on. Measured on
// the code before the gate (--resync-after-backlog=0): up to 218 of the
// flood's items in MC_WORK, the other controller's changes 119 ms median;
// with it, at most 1 and 28-61 ms (the flood going on at 30-45 syncs a
// second, the gate's pace).
func TestResyncFloodPaced(t *testing.T) {
	const (
		floodParents = 300
		changes      = 10
		changeBound  = 5 * time.Second
	)
	ctx := context.Background()
	hardened := hardenedProfile(t)
	backlog := hardened.Dispatcher.ResyncAfterBacklog
	if backlog <= 0 {
		t.Fatalf("deploy/overlays/hardened does not pace hook-asked resyncs (--resync-after-backlog=%d)", backlog)
	}
	var cfg allinone.Config
	cfg.Dispatcher.ResyncAfterBacklog = backlog
	cfg.Watcher.Weights = hardened.Watcher.Weights
	inst := startMetabus(t, cfg, nil)
	ns := newNamespace(t)

	var floodCalls atomic.Int64
	urlFlood := hookServer(t, jsonHook(func(map[string]any) (int, any) {
		floodCalls.Add(1)
		return 200, map[string]any{"status": map[string]any{}, "children": []any{}, "resyncAfterSeconds": 0.1}
	}))
	// The flooding controller asks for the largest weight too: the
	// hardened profile grants it none.
	createControllerWith(t, inst, compositeKind, "flood", map[string]any{
		"generateSelector": true,
		"parentResource":   map[string]any{"apiVersion": "noisy.metabus.dev/v1", "resource": "stalls"},
		"hooks":            map[string]any{"sync": map[string]any{"webhook": map[string]any{"url": urlFlood, "timeout": "5s"}}},
	}, map[string]string{bus.WeightAnnotation: "100"})
	createStalls(t, ns, "flood", floodParents)
	eventually(t, 60*time.Second, "the flood to reach every parent twice", func() error {
		if n := floodCalls.Load(); n < 2*floodParents {
			return fmt.Errorf("%d flood hook calls", n)
		}
		return nil
	})

	// The flooding controller's items in MC_WORK, sampled while it runs.
	nc, err := nats.Connect(inst.url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	work, err := js.Stream(ctx, bus.WorkStream)
	if err != nil {
		t.Fatal(err)
	}
	floodID := bus.ControllerID(compositeKind, "flood")
	var samples []int
	sample := func() {
		info, err := work.Info(ctx, jetstream.WithSubjectFilter(bus.StoredWorkFilter(floodID)))
		if err != nil {
			t.Fatal(err)
		}
		samples = append(samples, len(info.State.Subjects))
	}

	// Another controller, with a quick hook, beside the flood.
	createQuickController(t, inst, "beside-flood")
	// Changes go to quickParents parents in turn, so that the watcher's
	// pacing of one parent's bursts is not what is measured.
	const quickParents = 5
	quicks := createQuicks(t, ns, "quick", quickParents)
	eventually(t, 30*time.Second, "the other controller's first syncs beside the flood", func() error {
		sample()
		return quicksAt(ns, quicks, 1)
	})
	before, measured := floodCalls.Load(), time.Now()
	var lat []time.Duration
	for i := range changes {
		lat = append(lat, changeQuick(t, ns, quicks, i, changeBound, func() string {
			return fmt.Sprintf("beside the flood (latencies so far %s)", fmtDurations(lat))
		}))
		sample()
	}
	// The paced flood goes in about once a second (the gate's count):
	// look at it over a few seconds at least.
	if rest := 3*time.Second - time.Since(measured); rest > 0 {
		time.Sleep(rest)
	}
	during := floodCalls.Load() - before
	if during == 0 {
		t.Fatalf("the flood stopped while the other controller's changes were measured (%s): nothing was shown", time.Since(measured).Round(time.Millisecond))
	}
	peak := slices.Max(samples)
	// The gate lets a controller's requests in while it has fewer than
	// the backlog in MC_WORK, counted once a second per replica; the
	// watcher's own items of the controller come on top. Unpaced, the
	// flood kept most of its parents there.
	if limit := 2 * backlog; peak > limit {
		t.Errorf("the flooding controller had up to %d items in MC_WORK (samples %v), want at most %d (--resync-after-backlog=%d)", peak, samples, limit, backlog)
	}
	sorted := slices.Clone(lat)
	slices.Sort(sorted)
	t.Logf("beside a flood of %d parents at resyncAfterSeconds 0.1 (%d flood calls in the %s measured, its items in MC_WORK up to %d, samples %v): %d changes of another controller, median %s, max %s",
		floodParents, during, time.Since(measured).Round(time.Millisecond), peak, samples, changes, sorted[len(sorted)/2].Round(time.Millisecond), sorted[len(sorted)-1].Round(time.Millisecond))
}

// TestWeightBoundedByOperator (issue 35, starve others by weight): on a
// saturated replica, a controller annotated metabus.dev/weight: 100 does
// not starve another under the hardened profile's --max-controller-weight:
// the other controller's burst of changes is handled while the heavy
// controller's backlog is still being worked off. Granted its weight (the
// default profile), the heavy controller took 100 turns for each of the
// other's, and the burst waited for all of its backlog (measured: 10.2 s,
// after 392 heavy syncs; with the hardened bound, 1.2 s, during 36).
func TestWeightBoundedByOperator(t *testing.T) {
	const (
		slots        = 4 // the dispatcher's --max-in-flight and --workers: saturated by the heavy controller alone
		heavyParents = 200
		hookTime     = 100 * time.Millisecond
		lightParents = 20
	)
	ctx := context.Background()
	hardened := hardenedProfile(t)
	if hardened.Watcher.Weights.Max != 1 && hardened.Watcher.Weights.Allowed == nil {
		t.Fatalf("deploy/overlays/hardened grants controllers their weight annotation (%+v)", hardened.Watcher.Weights)
	}
	var cfg allinone.Config
	cfg.Watcher.Weights = hardened.Watcher.Weights
	cfg.Dispatcher.Workers, cfg.Dispatcher.MaxInFlight = slots, slots
	inst := startMetabus(t, cfg, nil)
	ns := newNamespace(t)

	// The light controller and its parents, converged before the heavy one
	// starts.
	createQuickController(t, inst, "light")
	lights := createQuicks(t, ns, "light", lightParents)
	eventually(t, 60*time.Second, "the light controller's parents to converge", func() error { return quicksAt(ns, lights, 1) })

	// The heavy controller: weight 100, a slow hook, many parents.
	createStalls(t, ns, "heavy", heavyParents)
	var heavyCalls atomic.Int64
	urlHeavy := hookServer(t, jsonHook(func(map[string]any) (int, any) {
		time.Sleep(hookTime)
		heavyCalls.Add(1)
		return 200, map[string]any{"status": map[string]any{}, "children": []any{}}
	}))
	createControllerWith(t, inst, compositeKind, "heavy", map[string]any{
		"generateSelector": true,
		"parentResource":   map[string]any{"apiVersion": "noisy.metabus.dev/v1", "resource": "stalls"},
		"hooks":            map[string]any{"sync": map[string]any{"webhook": map[string]any{"url": urlHeavy, "timeout": "5s"}}},
	}, map[string]string{bus.WeightAnnotation: "100"})
	eventually(t, 60*time.Second, "the heavy controller to saturate the replica", func() error {
		if n := heavyCalls.Load(); n < 2*slots {
			return fmt.Errorf("%d heavy hook calls", n)
		}
		return nil
	})

	// A burst: every light parent changes at once.
	start, atStart := time.Now(), heavyCalls.Load()
	for _, n := range lights {
		if _, err := dyn.Resource(quicksGVR).Namespace(ns).Patch(ctx, n, types.MergePatchType, []byte(`{"spec":{"version":2}}`), metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	pending := slices.Clone(lights)
	for len(pending) > 0 && time.Since(start) < 2*time.Minute {
		pending = slices.DeleteFunc(pending, func(n string) bool { return quicksAt(ns, []string{n}, 2) == nil })
		time.Sleep(20 * time.Millisecond)
	}
	took, heavyMeanwhile := time.Since(start), heavyCalls.Load()-atStart
	if len(pending) > 0 {
		t.Fatalf("%d of %d light parents' changes not handled in %s", len(pending), lightParents, took)
	}
	if heavyCalls.Load() >= heavyParents {
		// The heavy backlog was worked off first: what the weight buys.
		t.Errorf("the light controller's burst of %d changes was handled only once the heavy controller (weight 100) had synced all %d parents (%d heavy syncs meanwhile, %s)",
			lightParents, heavyParents, heavyMeanwhile, took.Round(time.Millisecond))
	}
	t.Logf("a burst of %d changes of a weight-1 controller beside a weight-100 one saturating %d slots: handled in %s, during %d of the heavy controller's syncs (%d of %d done)",
		lightParents, slots, took.Round(time.Millisecond), heavyMeanwhile, heavyCalls.Load(), heavyParents)
}

// createStalls creates n Stall parents named <prefix>-NNNN in ns.
func createStalls(t *testing.T, ns, prefix string, n int) {
	t.Helper()
	createStallsParallel(t, ns, prefix, 0, n)
}

// createQuicks creates n Quick parents at version 1 named <prefix>-NN in
// ns, and returns their names.
func createQuicks(t *testing.T, ns, prefix string, n int) []string {
	t.Helper()
	names := make([]string, n)
	for i := range names {
		names[i] = fmt.Sprintf("%s-%02d", prefix, i)
		q := &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "noisy.metabus.dev/v1", "kind": "Quick",
			"metadata": map[string]any{"name": names[i]},
			"spec":     map[string]any{"version": int64(1)},
		}}
		if _, err := dyn.Resource(quicksGVR).Namespace(ns).Create(context.Background(), q, metav1.CreateOptions{}); err != nil {
			t.Fatalf("create %s: %v", names[i], err)
		}
	}
	return names
}

// createQuickController creates a controller of Quicks whose hook
// (quickHook) answers at once with a ConfigMap carrying the version.
func createQuickController(t *testing.T, inst *instance, name string) {
	t.Helper()
	createController(t, inst, compositeKind, name, map[string]any{
		"generateSelector": true,
		"parentResource":   map[string]any{"apiVersion": "noisy.metabus.dev/v1", "resource": "quicks"},
		"childResources": []any{map[string]any{
			"apiVersion": "v1", "resource": "configmaps",
			"updateStrategy": map[string]any{"method": "InPlace"},
		}},
		"hooks": map[string]any{"sync": map[string]any{"webhook": map[string]any{"url": hookServer(t, jsonHook(quickHook)), "timeout": "5s"}}},
	})
}

// changeQuick makes change i of a round over quicks (the parent
// quicks[i mod len], at version 2 + i div len), waits until its child
// shows it, and returns how long that took; not within bound, it fails
// the test, saying where with beside.
func changeQuick(t *testing.T, ns string, quicks []string, i int, bound time.Duration, beside func() string) time.Duration {
	t.Helper()
	name, version := quicks[i%len(quicks)], int64(2+i/len(quicks))
	start := time.Now()
	patch := fmt.Sprintf(`{"spec":{"version":%d}}`, version)
	if _, err := dyn.Resource(quicksGVR).Namespace(ns).Patch(context.Background(), name, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	for quicksAt(ns, []string{name}, version) != nil {
		if time.Since(start) > bound {
			t.Fatalf("change %d of the other controller's parent did not reach its child within %s %s", i+1, bound, beside())
		}
		time.Sleep(10 * time.Millisecond)
	}
	return time.Since(start)
}

// quicksAt says which of the Quicks named has no child at version yet
// (nil: all have).
func quicksAt(ns string, names []string, version int64) error {
	for _, n := range names {
		cm, err := kube.CoreV1().ConfigMaps(ns).Get(context.Background(), n, metav1.GetOptions{})
		if err != nil || cm.Data["version"] != fmt.Sprint(version) {
			return fmt.Errorf("%s has no child at version %d yet", n, version)
		}
	}
	return nil
}
