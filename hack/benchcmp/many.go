package main

// B8, many controllers (issue #12, metabus only): B7 with the parents
// spread over many controllers. -b8-controllers DecoratorControllers
// (1,000 by default) each decorate the SlowD parents carrying their own
// label with one ConfigMap attachment, through the same 200ms hook; for 1,
// 2 and 4 dispatchers, -b8-parents new parents per controller (5,000 in
// all by default): parents/s to convergence and hook calls/s against the
// ideal. DecoratorControllers rather than CompositeControllers because
// each CompositeController needs a parent resource of its own, and 1,000
// CRDs would measure the API server's OpenAPI aggregation, not metabus.

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/metabus/metabus/pkg/jsbus"
	"github.com/metabus/metabus/pkg/natsx"
)

var (
	slowDGVR = schema.GroupVersionResource{Group: "bench.metabus.dev", Version: "v1", Resource: "slowds"}
	dcGVR    = schema.GroupVersionResource{Group: "metacontroller.k8s.io", Version: "v1alpha1", Resource: "decoratorcontrollers"}
)

// b8Label is the label that picks a SlowD's controller.
const b8Label = "bench.metabus.dev/ctrl"

// b8Names are the parents of one run: per controller c, parents
// sd-<run>-c<NNNN>-<i>.
func b8Names(run string, controllers, per int) []string {
	var out []string
	for c := range controllers {
		for i := range per {
			out = append(out, fmt.Sprintf("sd-%s-c%04d-%d", run, c, i))
		}
	}
	return out
}

// b8Labels labels a parent for the controller its name names.
func b8Labels(name string) map[string]any {
	parts := strings.Split(name, "-")
	return map[string]any{b8Label: parts[len(parts)-2]}
}

func (r *run) b8(ctx context.Context) error {
	dispBin, hook, track, done, err := r.slowSetup(ctx, "SlowD", "slowds", slowDGVR)
	if err != nil {
		return err
	}
	defer done()
	k := r.cfg.b8Controllers
	t0 := time.Now()
	ctrls := make([]string, k)
	for c := range k {
		ctrls[c] = fmt.Sprintf("c%04d", c)
	}
	if err := parallel(ctx, ctrls, func(ctx context.Context, c string) error {
		dc := &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "metacontroller.k8s.io/v1alpha1",
			"kind":       "DecoratorController",
			"metadata":   map[string]any{"name": "slow-" + c},
			"spec": map[string]any{
				"resources": []any{map[string]any{
					"apiVersion":    "bench.metabus.dev/v1",
					"resource":      "slowds",
					"labelSelector": map[string]any{"matchLabels": map[string]any{b8Label: c}},
				}},
				"attachments": []any{map[string]any{
					"apiVersion":     "v1",
					"resource":       "configmaps",
					"updateStrategy": map[string]any{"method": "InPlace"},
				}},
				"hooks": map[string]any{"sync": map[string]any{"webhook": map[string]any{"url": hook.url}}},
			},
		}}
		_, err := r.cl.harness.Resource(dcGVR).Create(ctx, dc, metav1.CreateOptions{})
		return err
	}); err != nil {
		return err
	}
	defer func() {
		_ = r.cl.harness.Resource(dcGVR).DeleteCollection(context.Background(), metav1.DeleteOptions{}, metav1.ListOptions{})
	}()
	r.logf("%s B8: %d DecoratorControllers created in %s", r.name, k, time.Since(t0).Round(time.Millisecond))
	nc, js, err := natsx.Connect(natsx.ConnOptions{URL: r.natsURL, Name: "benchcmp-b8"})
	if err != nil {
		return err
	}
	defer nc.Close()

	// Warm-up: one parent per controller, so every controller is wired
	// and its hook answers before anything is timed.
	t0 = time.Now()
	warm := b8Names("warm", k, 1)
	if err := r.createObjects(ctx, slowDGVR, "SlowD", warm, 1, nil, b8Labels); err != nil {
		return err
	}
	if _, err := track.wait(ctx, warm, r.cfg.timeout); err != nil {
		return fmt.Errorf("warm-up: %w", err)
	}
	r.logf("%s B8: warm-up, one parent per controller, converged in %s", r.name, time.Since(t0).Round(time.Millisecond))
	// Many controllers: a replica runs up to --max-in-flight syncs at once.
	scale, stop := r.dispatcherScaler(dispBin, js, "B8")
	defer stop()
	return r.dispatcherRuns(ctx, "B8", scale, hook, track, jsbus.DefaultMaxInFlight, func(n int) []string {
		return b8Names(fmt.Sprintf("r%d", n), k, r.cfg.b8Parents)
	}, func(ctx context.Context, ps []string) error {
		return r.createObjects(ctx, slowDGVR, "SlowD", ps, 1, nil, b8Labels)
	})
}

// parallel runs f for every item from 20 goroutines and returns the first
// error.
func parallel(ctx context.Context, items []string, f func(ctx context.Context, item string) error) error {
	work := make(chan string)
	errs := make(chan error, 1)
	var wg sync.WaitGroup
	for range min(20, len(items)) {
		wg.Go(func() {
			for it := range work {
				if err := f(ctx, it); err != nil {
					select {
					case errs <- fmt.Errorf("%s: %w", it, err):
					default:
					}
				}
			}
		})
	}
	for _, it := range items {
		work <- it
	}
	close(work)
	wg.Wait()
	select {
	case err := <-errs:
		return err
	default:
		return nil
	}
}
