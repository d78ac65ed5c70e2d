package main

// B9, per-event CPU with many controllers (issue 31, item 6): one change of
// one parent's child costs the controller the same CPU whether 1, 100 or
// 1,000 controllers are installed, if it finds the controllers an event
// concerns by an index rather than a scan. The active controller is the
// workload's CompositeController (Bench → ConfigMap); the idle ones are
// DecoratorControllers with ConfigMap attachments, half of them on Benches
// with a label selector no Bench matches, half on another CRD (Idle) with
// no objects. Each step adds controllers up to the count, lets them
// settle, measures the controller's idle CPU, then makes b9Events
// sequential changes of ConfigMaps of b9Parents converged parents, round
// robin (a data key the hook does not own, so no write follows), each
// waiting for the hook call it causes: CPU ms of the controller process
// per event, with the idle CPU over the same time subtracted. Round robin,
// because changes of one parent right after its last sync are paced by
// metabus's watcher (up to 500 ms apart, to merge bursts): that would
// measure the pacer, not the lookup.

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"

	"github.com/metabus/metabus/internal/testing/kubeenv"
)

// b9Counts are the controller counts B9 steps through (the active one
// included).
var b9Counts = []int{1, 100, 1000}

const (
	// b9Events is how many child changes B9 makes per step.
	b9Events = 100
	// b9Parents is how many parents those changes go round.
	b9Parents = 20
)

func b9Rows() []row {
	var rows []row
	for _, n := range b9Counts {
		rows = append(rows,
			row{key: fmt.Sprintf("b9.cpu.%d", n), label: fmt.Sprintf("B9 controller CPU ms / child change, %d controller(s), idle subtracted", n), prec: 2},
			row{key: fmt.Sprintf("b9.raw.%d", n), label: fmt.Sprintf("B9 controller CPU ms / child change, %d controller(s), as measured", n), prec: 2},
			row{key: fmt.Sprintf("b9.idle.%d", n), label: fmt.Sprintf("B9 idle controller CPU ms/s, %d controller(s)", n), prec: 1},
			row{key: fmt.Sprintf("b9.lat.%d", n), label: fmt.Sprintf("B9 child change → hook call p50 ms, %d controller(s)", n), prec: 1},
			row{key: fmt.Sprintf("b9.rss.%d", n), label: fmt.Sprintf("B9 controller RSS MiB, %d controller(s)", n), prec: 0},
		)
	}
	return rows
}

// b9IdleController is idle DecoratorController i: even ones select
// Benches by a label no Bench carries, odd ones decorate Idles.
func b9IdleController(i int, hookURL string) *unstructured.Unstructured {
	res := map[string]any{"apiVersion": "bench.metabus.dev/v1", "resource": "idles"}
	if i%2 == 0 {
		res = map[string]any{"apiVersion": "bench.metabus.dev/v1", "resource": "benches",
			"labelSelector": map[string]any{"matchLabels": map[string]any{b8Label: fmt.Sprintf("idle-%04d", i)}}}
	}
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "metacontroller.k8s.io/v1alpha1",
		"kind":       "DecoratorController",
		"metadata":   map[string]any{"name": fmt.Sprintf("idle-%04d", i)},
		"spec": map[string]any{
			"resources": []any{res},
			"attachments": []any{map[string]any{
				"apiVersion":     "v1",
				"resource":       "configmaps",
				"updateStrategy": map[string]any{"method": "InPlace"},
			}},
			"hooks": map[string]any{"sync": map[string]any{"webhook": map[string]any{"url": hookURL}}},
		},
	}}
}

func (r *run) b9(ctx context.Context) error {
	pid := r.ctrl.PID()
	if pid == 0 {
		return nil
	}
	crdFile := filepath.Join(r.dir, "idles-crd.yaml")
	if err := os.WriteFile(crdFile, []byte(parentCRD("Idle", "idles")), 0o644); err != nil {
		return err
	}
	if err := kubeenv.ApplyManifests(ctx, r.cl.env.Config, crdFile); err != nil {
		return err
	}
	parents := names("b9", b9Parents) // each one's ConfigMap is named after it
	if err := r.createParents(ctx, parents, 1); err != nil {
		return err
	}
	if _, err := r.track.waitConverged(ctx, parents, 2*time.Minute); err != nil {
		return err
	}
	installed := 1 // the workload's CompositeController
	for _, n := range b9Counts {
		var idle []string
		for i := installed; i < n; i++ {
			idle = append(idle, fmt.Sprint(i))
		}
		t0 := time.Now()
		if err := parallel(ctx, idle, func(ctx context.Context, s string) error {
			var i int
			if _, err := fmt.Sscan(s, &i); err != nil {
				return err
			}
			_, err := r.cl.harness.Resource(dcGVR).Create(ctx, b9IdleController(i, r.hook.url), metav1.CreateOptions{})
			return err
		}); err != nil {
			return err
		}
		installed = max(installed, n)
		// Settle: new controllers start informers and their first lists.
		r.waitQuiet(ctx, 2*time.Second, time.Minute)
		if err := sleepCtx(ctx, 10*time.Second); err != nil {
			return err
		}
		r.logf("%s B9: %d controller(s) installed and settled in %s", r.name, n, time.Since(t0).Round(time.Millisecond))
		if err := r.idleCPU(ctx, fmt.Sprintf("b9.idle.%d", n), 0, 10*time.Second); err != nil {
			return err
		}
		cpu0, err := procCPU(pid)
		if err != nil {
			return err
		}
		var lat []float64
		t0 = time.Now()
		for i := range b9Events {
			parent := parents[i%len(parents)]
			calls0 := r.hook.callsOf(parent)
			patch := fmt.Appendf(nil, `{"data":{"b9":"%d-%d"}}`, n, i)
			sent := time.Now()
			if _, err := r.cl.harness.Resource(configMapGVR).Namespace(ns).Patch(ctx, parent, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
				return fmt.Errorf("change %d: %w", i, err)
			}
			for r.hook.callsOf(parent) == calls0 {
				if time.Since(sent) > 30*time.Second {
					return fmt.Errorf("%d controller(s): change %d brought no hook call in 30s", n, i)
				}
				if err := sleepCtx(ctx, 2*time.Millisecond); err != nil {
					return err
				}
			}
			lat = append(lat, ms(time.Since(sent)))
		}
		r.waitQuiet(ctx, time.Second, 30*time.Second)
		cpu1, err := procCPU(pid)
		if err != nil {
			return err
		}
		span := time.Since(t0).Seconds()
		raw := (cpu1 - cpu0) * 1000 / b9Events
		r.fig[fmt.Sprintf("b9.raw.%d", n)] = raw
		r.fig[fmt.Sprintf("b9.cpu.%d", n)] = raw - r.fig[fmt.Sprintf("b9.idle.%d", n)]*span/b9Events
		r.fig[fmt.Sprintf("b9.lat.%d", n)] = percentile(lat, 50)
		if rss, err := procRSS(pid); err == nil {
			r.fig[fmt.Sprintf("b9.rss.%d", n)] = float64(rss) / (1 << 20)
		}
		r.logf("%s B9: %d controller(s): %.2f ms CPU per child change (%.2f as measured, idle %.1f ms/s over %.1fs), change → hook call p50 %.1f ms, RSS %.0f MiB",
			r.name, n, r.fig[fmt.Sprintf("b9.cpu.%d", n)], raw, r.fig[fmt.Sprintf("b9.idle.%d", n)], span, r.fig[fmt.Sprintf("b9.lat.%d", n)], r.fig[fmt.Sprintf("b9.rss.%d", n)])
	}
	return nil
}
