package e2e

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/metabus/metabus/internal/allinone"
)

// TestResyncAfterSeconds: a hook answering resyncAfterSeconds: 0.1 is
// called again well under a second later, with nothing changing.
func TestResyncAfterSeconds(t *testing.T) {
	ctx := context.Background()
	inst := startMetabus(t, allinone.Config{}, nil)
	ns := newNamespace(t)
	var mu sync.Mutex
	var calls []time.Time
	url := hookServer(t, jsonHook(func(req map[string]any) (int, any) {
		mu.Lock()
		calls = append(calls, time.Now())
		mu.Unlock()
		return 200, map[string]any{"resyncAfterSeconds": 0.1}
	}))
	createController(t, inst, compositeKind, "widgets-resync-after", map[string]any{
		"parentResource": map[string]any{"apiVersion": "test.metabus.dev/v1", "resource": "widgets"},
		"hooks":          map[string]any{"sync": map[string]any{"webhook": map[string]any{"url": url}}},
	})
	if _, err := dyn.Resource(widgetsGVR).Namespace(ns).Create(ctx, newWidget("ra", nil, 1), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "five resyncs", func() error {
		mu.Lock()
		defer mu.Unlock()
		if len(calls) < 5 {
			return fmt.Errorf("%d calls", len(calls))
		}
		return nil
	})
	mu.Lock()
	defer mu.Unlock()
	// Skip the first gaps (the status write's own sync); the later ones
	// are pure resyncs.
	last := calls[len(calls)-1].Sub(calls[len(calls)-2])
	t.Logf("gap between the last two resyncs: %s", last.Round(time.Millisecond))
	if last >= time.Second {
		t.Errorf("resyncAfterSeconds 0.1 resynced after %s, want under a second", last)
	}
}

// TestRealChangeNotDelayedByResyncWave: during a resync wave of many
// parents, a real change is served after a small fraction of the wave,
// not behind all of it (upstream #78). The measure is how many other
// parents' syncs ran between the change and its own sync.
func TestRealChangeNotDelayedByResyncWave(t *testing.T) {
	cfg := allinone.Config{}
	// A cache flush every few seconds is the resync wave.
	cfg.Watcher.CacheFlushInterval = 6 * time.Second
	// One worker per partition: the whole wave progresses in parallel, so
	// without pacing a real change waits for its partition's share of the
	// wave while every other partition drains too.
	cfg.Dispatcher.Workers = 64
	runResyncWave(t, cfg, true)
}

// runResyncWave drives the scenario; with check it asserts the bound.
// Several parents change at once and the mean is taken: where one
// parent's resync item happens to sit in the wave is random.
func runResyncWave(t *testing.T, cfg allinone.Config, check bool) {
	ctx := context.Background()
	inst := startMetabus(t, cfg, nil)
	ns := newNamespace(t)
	const parents = 300
	const targets = 10
	var (
		seq        atomic.Int64 // hook calls
		changedAt  atomic.Int64 // seq when the real changes were made
		changeTime atomic.Int64
		mu         sync.Mutex
		servedAt   = map[string]int64{}
		latency    = map[string]time.Duration{}
	)
	url := hookServer(t, jsonHook(func(req map[string]any) (int, any) {
		n := seq.Add(1)
		p := req["parent"].(map[string]any)
		name := p["metadata"].(map[string]any)["name"].(string)
		if v, _ := p["spec"].(map[string]any)["version"].(float64); v == 2 {
			mu.Lock()
			if _, ok := servedAt[name]; !ok {
				servedAt[name] = n
				latency[name] = time.Duration(time.Now().UnixNano() - changeTime.Load())
			}
			mu.Unlock()
		}
		time.Sleep(50 * time.Millisecond) // a hook with some work to do
		return 200, map[string]any{}
	}))
	createController(t, inst, compositeKind, "widgets-wave", map[string]any{
		"parentResource": map[string]any{"apiVersion": "test.metabus.dev/v1", "resource": "widgets"},
		"hooks":          map[string]any{"sync": map[string]any{"webhook": map[string]any{"url": url}}},
	})
	name := func(i int) string {
		if i < targets {
			return fmt.Sprintf("target%d", i)
		}
		return fmt.Sprintf("w%03d", i)
	}
	sem := make(chan struct{}, 16)
	var wg sync.WaitGroup
	for i := 0; i < parents; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			if _, err := dyn.Resource(widgetsGVR).Namespace(ns).Create(ctx, newWidget(name(i), nil, 1), metav1.CreateOptions{}); err != nil {
				t.Error(err)
			}
		}(i)
	}
	wg.Wait()
	// Let the creation syncs (and their status echoes) drain.
	eventually(t, 60*time.Second, "the initial syncs to drain", func() error {
		a := seq.Load()
		time.Sleep(700 * time.Millisecond)
		if b := seq.Load(); b != a {
			return fmt.Errorf("still syncing (%d calls)", b)
		}
		return nil
	})
	// Wait for the next cache-flush wave to start.
	start := seq.Load()
	eventually(t, 15*time.Second, "the wave to start", func() error {
		if seq.Load()-start < 20 {
			return fmt.Errorf("wave not started")
		}
		return nil
	})
	changeTime.Store(time.Now().UnixNano())
	changedAt.Store(seq.Load())
	for i := 0; i < targets; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			if _, err := dyn.Resource(widgetsGVR).Namespace(ns).Patch(ctx, name(i), types.MergePatchType,
				[]byte(`{"spec":{"version":2}}`), metav1.PatchOptions{}); err != nil {
				t.Error(err)
			}
		}(i)
	}
	wg.Wait()
	eventually(t, 60*time.Second, "the real changes to be synced", func() error {
		mu.Lock()
		defer mu.Unlock()
		if len(servedAt) < targets {
			return fmt.Errorf("%d of %d served", len(servedAt), targets)
		}
		return nil
	})
	mu.Lock()
	var ahead int64
	var worst time.Duration
	for n, at := range servedAt {
		ahead += at - changedAt.Load()
		worst = max(worst, latency[n])
	}
	mu.Unlock()
	mean := float64(ahead) / targets
	t.Logf("resync wave of %d parents: real changes were synced after %.0f other syncs on average (worst latency %s)",
		parents, mean, worst.Round(time.Millisecond))
	if check && mean > parents/4 {
		t.Errorf("real changes waited behind %.0f of %d resync syncs on average; they must not wait for the wave", mean, parents)
	}
}
