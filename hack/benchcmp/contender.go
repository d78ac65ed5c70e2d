package main

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/util/retry"

	"github.com/metabus/metabus/pkg/childproc"
)

// controller is a contender under test: a separate process (metabus,
// upstream Metacontroller) or the harness's own raw writer.
type controller interface {
	// PID of the controller process; 0 when it runs inside the harness.
	PID() int
	Stop() error
}

// proc is a controller running as a child process, its output in a log file.
type proc = childproc.Proc

// startMetabus runs the all-in-one binary at its defaults, with an
// in-process-only embedded JetStream and loopback metrics/health ports.
func startMetabus(ctx context.Context, bin, kubeconfig, dir, logPath string, extra []string) (*proc, error) {
	addrs, err := freeAddrs(2)
	if err != nil {
		return nil, err
	}
	metrics, health := addrs[0], addrs[1]
	args := []string{
		"--kubeconfig", kubeconfig,
		"--nats-store-dir", filepath.Join(dir, "nats"),
		"--nats-listen", "-",
		"--metrics-address", metrics,
		"--health-probe-bind-address", health,
	}
	args = append(args, extra...)
	p, err := childproc.Start(ctx, "metabus", bin, args, nil, logPath, "http://"+health+"/readyz")
	if p != nil {
		p.MetricsURL = "http://" + metrics + "/metrics"
	}
	return p, err
}

// upstreamTuned are the flags of "upstream tuned": 50 workers and a
// client-side rate limit far above what the workload needs.
var upstreamTuned = []string{"--workers=50", "--client-go-qps=500", "--client-go-burst=1000"}

// startUpstream runs upstream Metacontroller, tuned, with the extra flags.
func startUpstream(ctx context.Context, bin, kubeconfig, logPath string, extra []string) (*proc, error) {
	return childproc.StartUpstream(ctx, bin, kubeconfig, logPath, append(slices.Clone(upstreamTuned), extra...))
}

// rawWorkers is how many concurrent writers the raw contender runs; the
// contract's writer, with three round trips per parent against two, runs
// half as many again, so that the API server, not the writer's
// concurrency, stays the bound.
const rawWorkers = 64

// rawController is the physical limit: the harness itself does only the
// writes the workload needs, on each parent's add event: create the
// ConfigMap (owned by the parent), then PUT the parent's status. With
// contract set ("raw-contract") it does the writes upstream's calling
// contract needs and no more: the first sync sees no child, so its status
// ({childCount: 0}) is written with the ConfigMap's create, and the sync
// that sees the ConfigMap writes {childCount: 1}: three writes, what
// metabus and upstream make, with no controller CPU, no cache and no hook.
type rawController struct {
	dyn      dynamic.Interface
	ns       string
	contract bool
	queue    chan *unstructured.Unstructured
	wg       sync.WaitGroup
	cancel   context.CancelFunc

	mu   sync.Mutex
	errs []error
}

func newRawController(dyn dynamic.Interface, ns string, contract bool) *rawController {
	return &rawController{dyn: dyn, ns: ns, contract: contract, queue: make(chan *unstructured.Unstructured, 1<<16)}
}

// isRaw tells the harness's own writers (no controller process) apart.
func isRaw(contender string) bool { return contender == "raw" || contender == "raw-contract" }

// enqueue is the tracker's onAdd.
func (r *rawController) enqueue(u *unstructured.Unstructured) { r.queue <- u.DeepCopy() }

func (r *rawController) start() {
	ctx, cancel := context.WithCancel(context.Background())
	r.cancel = cancel
	workers := rawWorkers
	if r.contract {
		workers = rawWorkers * 3 / 2
	}
	for range workers {
		r.wg.Go(func() {
			for {
				select {
				case <-ctx.Done():
					return
				case u := <-r.queue:
					if err := r.sync(ctx, u); err != nil && ctx.Err() == nil {
						r.mu.Lock()
						r.errs = append(r.errs, err)
						r.mu.Unlock()
					}
				}
			}
		})
	}
}

func (r *rawController) sync(ctx context.Context, parent *unstructured.Unstructured) error {
	gen, _, _ := unstructured.NestedInt64(parent.Object, "spec", "gen")
	cm := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "v1",
		"kind":       "ConfigMap",
		"metadata": map[string]any{
			"name":      parent.GetName(),
			"namespace": r.ns,
			"ownerReferences": []any{map[string]any{
				"apiVersion": parent.GetAPIVersion(),
				"kind":       parent.GetKind(),
				"name":       parent.GetName(),
				"uid":        string(parent.GetUID()),
				"controller": true,
			}},
		},
		"data": map[string]any{"gen": strconv.FormatInt(gen, 10)},
	}}
	obj := parent
	if r.contract {
		var err error
		if obj, err = r.putStatus(ctx, obj, 0, gen); err != nil {
			return err
		}
	}
	if _, err := r.dyn.Resource(configMapGVR).Namespace(r.ns).Create(ctx, cm, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create ConfigMap %s: %w", parent.GetName(), err)
	}
	_, err := r.putStatus(ctx, obj, 1, gen)
	return err
}

// putStatus writes {childCount, observedGen} into obj's status, reading the
// parent again on a conflict, and returns the parent as written.
func (r *rawController) putStatus(ctx context.Context, obj *unstructured.Unstructured, count, gen int64) (*unstructured.Unstructured, error) {
	var out *unstructured.Unstructured
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		if err := unstructured.SetNestedField(obj.Object, map[string]any{"childCount": count, "observedGen": gen}, "status"); err != nil {
			return err
		}
		var err error
		out, err = r.dyn.Resource(benchGVR).Namespace(r.ns).UpdateStatus(ctx, obj, metav1.UpdateOptions{})
		if apierrors.IsConflict(err) {
			fresh, gerr := r.dyn.Resource(benchGVR).Namespace(r.ns).Get(ctx, obj.GetName(), metav1.GetOptions{})
			if gerr != nil {
				return gerr
			}
			obj = fresh
		}
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("status of %s: %w", obj.GetName(), err)
	}
	return out, nil
}

func (r *rawController) PID() int { return 0 }

func (r *rawController) Stop() error {
	if r.cancel != nil {
		r.cancel()
	}
	r.wg.Wait()
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.errs) > 0 {
		return fmt.Errorf("raw controller: %d errors, first: %w", len(r.errs), r.errs[0])
	}
	return nil
}

// freeAddrs returns n free loopback addresses (host:port) for a child's
// listeners.
func freeAddrs(n int) ([]string, error) {
	out := make([]string, n)
	for i := range out {
		a, err := childproc.FreeAddr()
		if err != nil {
			return nil, err
		}
		out[i] = a
	}
	return out, nil
}

// splitArgs splits a -metabus-args value on white space.
func splitArgs(s string) []string { return strings.Fields(s) }
