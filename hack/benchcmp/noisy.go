package main

// B6, the noisy neighbour (issue #12): the workload's controller B beside a
// controller A whose sync hook hangs until its webhook timeout.

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/metabus/metabus/internal/testing/kubeenv"
)

const (
	// b6Parents are controller B's parents (Benches) in B6.
	b6Parents = 50
	// b6Updates are the sequential updates of B measured alone, then
	// again beside the hanging A.
	b6Updates = 100
	// b6Cap bounds the wait for each update's ConfigMap; an update still
	// waiting counts as not converged, and as +Inf in the percentiles.
	b6Cap = 30 * time.Second
	// b6Hanging are controller A's parents, whose every sync hangs.
	b6Hanging = 200
	// b6HookTimeout is A's webhook timeout (upstream's default, spelled
	// out so both contenders use the same).
	b6HookTimeout = "10s"
	// b6Decorated are the existing labelled ConfigMaps a DecoratorController
	// created beside the hanging A must annotate (issue 24).
	b6Decorated = 20
	// b6Resync is that controller's resyncPeriodSeconds, and b6ResyncFor
	// how long its resyncs are watched.
	b6Resync    = 2
	b6ResyncFor = 12 * time.Second
	// b6DecoratedCap bounds the wait for its first full convergence.
	b6DecoratedCap = 3 * time.Minute
)

var stallGVR = schema.GroupVersionResource{Group: "bench.metabus.dev", Version: "v1", Resource: "stalls"}

// hangHook is controller A's sync hook: it answers no call until the caller
// gives up (its webhook timeout) or release; after release it fails every
// call at once. It counts the calls in flight and the most seen at once.
type hangHook struct {
	srv      *http.Server
	url      string
	release  chan struct{}
	once     sync.Once
	calls    atomic.Int64
	inflight atomic.Int64
	peak     atomic.Int64
	peakAt   atomic.Int64 // unix nanos of the last new peak
}

func startHangHook() (*hangHook, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	h := &hangHook{release: make(chan struct{})}
	h.url = "http://" + l.Addr().String() + "/sync"
	h.srv = &http.Server{Handler: h}
	go func() { _ = h.srv.Serve(l) }()
	return h, nil
}

func (h *hangHook) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	// The server notices the caller hanging up (and cancels r.Context())
	// only once the request body is consumed.
	_, _ = io.Copy(io.Discard, r.Body)
	h.calls.Add(1)
	n := h.inflight.Add(1)
	defer h.inflight.Add(-1)
	for p := h.peak.Load(); n > p; p = h.peak.Load() {
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

// unblock ends every hanging call and makes later ones fail at once.
func (h *hangHook) unblock() { h.once.Do(func() { close(h.release) }) }

func (h *hangHook) close() {
	h.unblock()
	_ = h.srv.Close()
}

// waitHanging waits until A's calls hang at full concurrency: the number of
// calls in flight reached a peak that has not risen for 5s (half the hook
// timeout, so no call has timed out yet in between) and is in flight now.
func (h *hangHook) waitHanging(ctx context.Context, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		peak := h.peak.Load()
		if peak > 0 && time.Since(time.Unix(0, h.peakAt.Load())) >= 5*time.Second && h.inflight.Load() >= peak {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("controller A's hook not hanging at a steady concurrency within %s: %d calls in flight, peak %d, %d calls",
				timeout, h.inflight.Load(), peak, h.calls.Load())
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// b6 is the noisy neighbour. (a) B alone: 50 converged parents of the
// workload's controller, then 100 sequential updates (round-robin), each
// waiting for the parent's ConfigMap at the new gen, at most 30s: p50/p99
// from just before the update to the ConfigMap's watch event. (b) A second
// CRD and CompositeController A whose sync hook hangs until its 10s webhook
// timeout, with 200 parents; once A's calls hang at full concurrency (see
// waitHanging), B's 100 updates again, and the number that did not reach
// their ConfigMap within 30s (they count as +Inf in the percentiles).
func (r *run) b6(ctx context.Context) error {
	ps := names("nb", b6Parents)
	if err := r.createParents(ctx, ps, 1); err != nil {
		return err
	}
	if _, err := r.track.waitConverged(ctx, ps, 5*time.Minute); err != nil {
		return err
	}
	r.waitQuiet(ctx, time.Second, 30*time.Second)
	gens := map[string]int64{}
	for _, p := range ps {
		gens[p] = 1
	}
	// updates runs B's 100 sequential updates and returns their latencies
	// (+Inf: not converged within b6Cap) and how many did not converge.
	updates := func() ([]float64, int, error) {
		var lat []float64
		stuck := 0
		for i := range b6Updates {
			p := ps[i%len(ps)]
			gens[p]++
			t0 := time.Now()
			if err := r.setGen(ctx, p, gens[p]); err != nil {
				return nil, 0, err
			}
			at, ok := r.track.waitChild(ctx, p, gens[p], b6Cap)
			if ctx.Err() != nil {
				return nil, 0, ctx.Err()
			}
			if !ok {
				stuck++
				lat = append(lat, math.Inf(1))
				r.logf("%s B6: update %d (%s to gen %d): no ConfigMap within %s", r.name, i+1, p, gens[p], b6Cap)
				continue
			}
			lat = append(lat, ms(at.Sub(t0)))
		}
		return lat, stuck, nil
	}

	alone, stuckAlone, err := updates()
	if err != nil {
		return err
	}
	r.fig["b6.alone.p50"], r.fig["b6.alone.p99"] = percentile(alone, 50), percentile(alone, 99)
	r.logf("%s B6: B alone: p50 %.1f ms p99 %.1f ms, %d of %d not converged in %s", r.name,
		r.fig["b6.alone.p50"], r.fig["b6.alone.p99"], stuckAlone, b6Updates, b6Cap)

	// Controller A, hanging.
	hang, err := startHangHook()
	if err != nil {
		return err
	}
	defer hang.close()
	crdFile := filepath.Join(r.dir, "stall-crd.yaml")
	if err := os.WriteFile(crdFile, []byte(parentCRD("Stall", "stalls")), 0o644); err != nil {
		return err
	}
	if err := kubeenv.ApplyManifests(ctx, r.cl.env.Config, crdFile); err != nil {
		return err
	}
	cc := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "metacontroller.k8s.io/v1alpha1",
		"kind":       "CompositeController",
		"metadata":   map[string]any{"name": "hang"},
		"spec": map[string]any{
			"generateSelector": true,
			"parentResource":   map[string]any{"apiVersion": "bench.metabus.dev/v1", "resource": "stalls"},
			"childResources": []any{map[string]any{
				"apiVersion":     "v1",
				"resource":       "configmaps",
				"updateStrategy": map[string]any{"method": "InPlace"},
			}},
			"hooks": map[string]any{"sync": map[string]any{"webhook": map[string]any{"url": hang.url, "timeout": b6HookTimeout}}},
		},
	}}
	if _, err := r.cl.harness.Resource(ccGVR).Create(ctx, cc, metav1.CreateOptions{}); err != nil {
		return err
	}
	t0 := time.Now()
	if err := r.createObjects(ctx, stallGVR, "Stall", names("stall", b6Hanging), 1, nil); err != nil {
		return err
	}
	if err := hang.waitHanging(ctx, 3*time.Minute); err != nil {
		return err
	}
	r.fig["b6.hanging"] = float64(hang.peak.Load())
	r.logf("%s B6: controller A hanging: %d calls in flight (peak %d) %s after its parents were created",
		r.name, hang.inflight.Load(), hang.peak.Load(), time.Since(t0).Round(time.Millisecond))

	beside, stuck, err := updates()
	if err != nil {
		return err
	}
	r.fig["b6.beside.p50"], r.fig["b6.beside.p99"] = percentile(beside, 50), percentile(beside, 99)
	r.fig["b6.stuck"] = float64(stuck)
	r.logf("%s B6: B beside hanging A: p50 %.1f ms p99 %.1f ms, %d of %d not converged in %s; A: %d calls in flight, %d calls in all",
		r.name, r.fig["b6.beside.p50"], r.fig["b6.beside.p99"], stuck, b6Updates, b6Cap, hang.inflight.Load(), hang.calls.Load())

	// A's first calls time out (its webhook timeout) and are retried:
	// the new controller comes after A's backlog has been through a round.
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(12 * time.Second):
	}
	if err := r.b6NewController(ctx); err != nil {
		return err
	}

	// A stops hanging and goes away, so the controller stops promptly.
	hang.unblock()
	return r.cl.harness.Resource(ccGVR).Delete(ctx, "hang", metav1.DeleteOptions{})
}

// decoHook is the sync hook of B6's DecoratorController: it annotates the
// ConfigMap at once and records when each ConfigMap's calls came.
type decoHook struct {
	srv *http.Server
	url string
	mu  sync.Mutex
	at  map[string][]time.Time
}

func startDecoHook() (*decoHook, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	h := &decoHook{at: map[string][]time.Time{}}
	h.url = "http://" + l.Addr().String() + "/sync"
	h.srv = &http.Server{Handler: h}
	go func() { _ = h.srv.Serve(l) }()
	return h, nil
}

func (h *decoHook) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var req hookRequest
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	h.mu.Lock()
	h.at[req.Object.Metadata.Name] = append(h.at[req.Object.Metadata.Name], time.Now())
	h.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(map[string]any{"annotations": map[string]any{b6DecoratedAnnotation: "yes"}})
}

const (
	b6DecoratedLabel      = "bench.metabus.dev/b6-decorate"
	b6DecoratedAnnotation = "bench.metabus.dev/decorated"
)

// b6NewController (issue 24) runs beside the hanging A, once A's first
// calls have timed out and been retried: 20 existing
// ConfigMaps labelled for a DecoratorController that is then created, with
// a hook that annotates them at once and resyncPeriodSeconds 2. Figures:
// the time from its creation until all 20 carry the annotation (its first
// full convergence: the initial sync of a new controller, which metabus
// paces as resyncs), and the intervals between successive hook calls per
// ConfigMap over the next 12s (its resyncs).
func (r *run) b6NewController(ctx context.Context) error {
	cms := names("deco", b6Decorated)
	for _, name := range cms {
		cm := &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "v1", "kind": "ConfigMap",
			"metadata": map[string]any{"name": name, "labels": map[string]any{b6DecoratedLabel: "yes"}},
		}}
		if _, err := r.cl.harness.Resource(configMapGVR).Namespace(ns).Create(ctx, cm, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("create ConfigMap %s: %w", name, err)
		}
	}
	hook, err := startDecoHook()
	if err != nil {
		return err
	}
	defer func() { _ = hook.srv.Close() }()
	dc := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "metacontroller.k8s.io/v1alpha1",
		"kind":       "DecoratorController",
		"metadata":   map[string]any{"name": "b6-decorate"},
		"spec": map[string]any{
			"resources": []any{map[string]any{
				"apiVersion":    "v1",
				"resource":      "configmaps",
				"labelSelector": map[string]any{"matchLabels": map[string]any{b6DecoratedLabel: "yes"}},
			}},
			"resyncPeriodSeconds": b6Resync,
			"hooks":               map[string]any{"sync": map[string]any{"webhook": map[string]any{"url": hook.url}}},
		},
	}}
	t0 := time.Now()
	if _, err := r.cl.harness.Resource(dcGVR).Create(ctx, dc, metav1.CreateOptions{}); err != nil {
		return err
	}
	defer func() {
		_ = r.cl.harness.Resource(dcGVR).Delete(context.Background(), "b6-decorate", metav1.DeleteOptions{})
	}()
	decorated := 0
	for time.Since(t0) < b6DecoratedCap {
		list, err := r.cl.harness.Resource(configMapGVR).Namespace(ns).List(ctx, metav1.ListOptions{LabelSelector: b6DecoratedLabel + "=yes"})
		if err != nil {
			return err
		}
		decorated = 0
		for _, cm := range list.Items {
			if cm.GetAnnotations()[b6DecoratedAnnotation] == "yes" {
				decorated++
			}
		}
		if decorated == b6Decorated {
			break
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
	r.fig["b6.new"] = math.Inf(1)
	if decorated == b6Decorated {
		r.fig["b6.new"] = ms(time.Since(t0))
	}
	r.logf("%s B6: new DecoratorController beside hanging A: %d of %d ConfigMaps decorated after %s", r.name,
		decorated, b6Decorated, time.Since(t0).Round(time.Millisecond))

	// Its resyncs, every b6Resync seconds, while A still hangs.
	from := time.Now()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(b6ResyncFor):
	}
	hook.mu.Lock()
	var gaps []float64
	resynced := 0
	for _, name := range cms {
		var prev time.Time
		n := 0
		for _, at := range hook.at[name] {
			if at.Before(from) {
				prev = at
				continue
			}
			if !prev.IsZero() {
				gaps = append(gaps, ms(at.Sub(prev)))
			}
			prev = at
			n++
		}
		if n > 0 {
			resynced++
		}
	}
	hook.mu.Unlock()
	// A ConfigMap never synced again counts as one gap of the whole span.
	for range b6Decorated - resynced {
		gaps = append(gaps, ms(b6ResyncFor))
	}
	r.fig["b6.resync.p50"], r.fig["b6.resync.p99"] = percentile(gaps, 50), percentile(gaps, 99)
	r.logf("%s B6: its resyncPeriodSeconds=%d beside hanging A: %d of %d ConfigMaps synced again in %s, interval p50 %.0f ms p99 %.0f ms",
		r.name, b6Resync, resynced, b6Decorated, b6ResyncFor, r.fig["b6.resync.p50"], r.fig["b6.resync.p99"])
	for _, name := range cms {
		_ = r.cl.harness.Resource(configMapGVR).Namespace(ns).Delete(ctx, name, metav1.DeleteOptions{})
	}
	return nil
}
