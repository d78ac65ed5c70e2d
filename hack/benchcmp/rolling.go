package main

// B11, a rolling update of a 10-Pod parent (issue 31, item 6), metabus
// against upstream: a StatefulSet-like parent (Roll: spec.replicas Pods
// <name>-0..N-1 from spec.template) whose CompositeController rolls its
// Pods with RollingRecreate or RollingInPlace, gated on the Ready
// condition. The control plane has no kubelet: the Pods are bound to a
// node no kubelet runs (so a delete is graceful, as on a real node), and
// the harness plays the kubelet: it marks every new Pod object Ready as
// soon as it sees it and finishes a Pod's deletion (grace period 0) as
// soon as it sees it terminating. An in-place update keeps a Pod Ready (no
// container restarts), so RollingInPlace moves at the controller's own
// pace. For each method, b11Rollouts rollouts (a new
// image each) of one converged parent: from the template change until all
// Pods run the new image and are Ready, per Pod moved; hook calls and
// controller CPU per Pod moved.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/tools/cache"

	"github.com/metabus/metabus/internal/testing/kubeenv"
)

const (
	// b11Pods is the size of the rolled parent.
	b11Pods = 10
	// b11Rollouts is how many rollouts per method.
	b11Rollouts = 3
	// b11Timeout is how long one rollout may take (metabus: ~10 s).
	b11Timeout = 2 * time.Minute
	// b11Node is the node the Pods are bound to; there is no such node.
	b11Node = "bench-node"
)

var (
	podGVR = schema.GroupVersionResource{Version: "v1", Resource: "pods"}
	saGVR  = schema.GroupVersionResource{Version: "v1", Resource: "serviceaccounts"}
	// b11Methods are the update strategies, each with its own parent CRD
	// (one CompositeController per parent resource).
	b11Methods = []struct{ method, kind, plural string }{
		{"RollingRecreate", "RollR", "rollrs"},
		{"RollingInPlace", "RollI", "rollis"},
	}
)

func b11Rows() []row {
	var rows []row
	for _, m := range b11Methods {
		k := "b11." + m.method
		rows = append(rows,
			row{key: k + ".ms", label: fmt.Sprintf("B11 %s, %d Pods: ms per Pod moved (median of %d rollouts)", m.method, b11Pods, b11Rollouts), prec: 0},
			row{key: k + ".first", label: fmt.Sprintf("B11 %s: ms until the first Pod moved", m.method), prec: 0},
			row{key: k + ".moved", label: fmt.Sprintf("B11 %s: Pods moved (of %d) in the last rollout", m.method, b11Pods), prec: 0},
			row{key: k + ".hooks", label: fmt.Sprintf("B11 %s: hook calls per Pod moved", m.method), prec: 2},
			row{key: k + ".cpu", label: fmt.Sprintf("B11 %s: controller CPU ms per Pod moved", m.method), prec: 2},
		)
	}
	return rows
}

func b11Image(v int) string { return fmt.Sprintf("registry.invalid/roll:v%d", v) }

// rollHook is the Roll controller's sync hook: spec.replicas Pods named
// <parent>-<i> with spec.template's labels and spec, and status {replicas,
// readyReplicas} of the Pods it observed.
type rollHook struct {
	srv   *http.Server
	url   string
	calls atomic.Int64
}

func startRollHook() (*rollHook, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	h := &rollHook{url: "http://" + l.Addr().String() + "/sync"}
	h.srv = &http.Server{Handler: h}
	go func() { _ = h.srv.Serve(l) }()
	return h, nil
}

func (h *rollHook) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h.calls.Add(1)
	var req struct {
		Parent struct {
			Metadata struct {
				Name string `json:"name"`
			} `json:"metadata"`
			Spec struct {
				Replicas int `json:"replicas"`
				Template struct {
					Metadata map[string]any `json:"metadata"`
					Spec     map[string]any `json:"spec"`
				} `json:"template"`
			} `json:"spec"`
		} `json:"parent"`
		Children map[string]map[string]struct {
			Status struct {
				Conditions []struct{ Type, Status string } `json:"conditions"`
			} `json:"status"`
		} `json:"children"`
	}
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	p := req.Parent
	children := []any{}
	for i := range p.Spec.Replicas {
		children = append(children, map[string]any{
			"apiVersion": "v1", "kind": "Pod",
			"metadata": map[string]any{"name": fmt.Sprintf("%s-%d", p.Metadata.Name, i), "labels": p.Spec.Template.Metadata["labels"]},
			"spec":     p.Spec.Template.Spec,
		})
	}
	observed, ready := 0, 0
	for _, pod := range req.Children["Pod.v1"] {
		observed++
		for _, c := range pod.Status.Conditions {
			if c.Type == "Ready" && c.Status == "True" {
				ready++
			}
		}
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(map[string]any{
		"status":   map[string]any{"replicas": observed, "readyReplicas": ready},
		"children": children,
	})
}

// podWatch is the harness's kubelet and its view of the namespace's Pods.
type podWatch struct {
	stop    chan struct{}
	store   cache.Store
	changed chan struct{}
	mu      sync.Mutex
	marked  map[types.UID]bool
}

func (r *run) startPodWatch(ctx context.Context) (*podWatch, error) {
	w := &podWatch{stop: make(chan struct{}), changed: make(chan struct{}, 1), marked: map[types.UID]bool{}}
	f := dynamicinformer.NewFilteredDynamicSharedInformerFactory(r.cl.harness, 0, ns, nil)
	inf := f.ForResource(podGVR).Informer()
	on := func(o any) {
		select {
		case w.changed <- struct{}{}:
		default:
		}
		u, ok := o.(*unstructured.Unstructured)
		if ok && u.GetDeletionTimestamp() != nil {
			go func() {
				if err := r.finishPodDeletion(ctx, u.GetName(), u.GetUID()); err != nil && ctx.Err() == nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
					r.logf("%s B11 kubelet: delete %s: %v", r.name, u.GetName(), err)
				}
			}()
			return
		}
		if !ok || podReady(u) {
			return
		}
		w.mu.Lock()
		defer w.mu.Unlock()
		if w.marked[u.GetUID()] {
			return
		}
		w.marked[u.GetUID()] = true
		go func() {
			if err := r.markPodReady(ctx, u.GetName(), u.GetUID()); err != nil && ctx.Err() == nil && !apierrors.IsNotFound(err) {
				r.logf("%s B11 kubelet: mark %s Ready: %v", r.name, u.GetName(), err)
			}
		}()
	}
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{AddFunc: on, UpdateFunc: func(_, o any) { on(o) }}); err != nil {
		return nil, err
	}
	w.store = inf.GetStore()
	f.Start(w.stop)
	sctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if !cache.WaitForCacheSync(sctx.Done(), inf.HasSynced) {
		close(w.stop)
		return nil, fmt.Errorf("pod informer did not sync")
	}
	return w, nil
}

func podReady(u *unstructured.Unstructured) bool {
	conds, _, _ := unstructured.NestedSlice(u.Object, "status", "conditions")
	for _, c := range conds {
		if c, ok := c.(map[string]any); ok && c["type"] == "Ready" && c["status"] == "True" {
			return true
		}
	}
	return false
}

// markPodReady sets the Ready condition of Pod name (if still uid).
func (r *run) markPodReady(ctx context.Context, name string, uid types.UID) error {
	pods := r.cl.harness.Resource(podGVR).Namespace(ns)
	for range 20 {
		u, err := pods.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if u.GetUID() != uid || u.GetDeletionTimestamp() != nil {
			return nil
		}
		now := time.Now().UTC().Format(time.RFC3339)
		if err := unstructured.SetNestedSlice(u.Object, []any{map[string]any{"type": "Ready", "status": "True", "lastTransitionTime": now}}, "status", "conditions"); err != nil {
			return err
		}
		if _, err = pods.UpdateStatus(ctx, u, metav1.UpdateOptions{}); !apierrors.IsConflict(err) {
			return err
		}
	}
	return fmt.Errorf("mark %s Ready: conflicts", name)
}

// finishPodDeletion deletes a terminating Pod at once, as a kubelet does
// once its containers stopped.
func (r *run) finishPodDeletion(ctx context.Context, name string, uid types.UID) error {
	return r.cl.harness.Resource(podGVR).Namespace(ns).Delete(ctx, name, metav1.DeleteOptions{
		GracePeriodSeconds: new(int64),
		Preconditions:      &metav1.Preconditions{UID: &uid},
	})
}

// moved counts parent's Pods that exist at image, Ready and not being
// deleted.
func (w *podWatch) moved(parent, image string) int {
	n := 0
	for i := range b11Pods {
		o, ok, _ := w.store.GetByKey(fmt.Sprintf("%s/%s-%d", ns, parent, i))
		if !ok {
			continue
		}
		u := o.(*unstructured.Unstructured)
		cs, _, _ := unstructured.NestedSlice(u.Object, "spec", "containers")
		if len(cs) != 1 || u.GetDeletionTimestamp() != nil || !podReady(u) {
			continue
		}
		if c, ok := cs[0].(map[string]any); ok && c["image"] == image {
			n++
		}
	}
	return n
}

// waitRolledOut waits until all of parent's Pods moved to image and
// returns when the first and the last had; on timeout, the error says how
// many moved.
func (w *podWatch) waitRolledOut(ctx context.Context, parent, image string, timeout time.Duration) (first, last time.Time, err error) {
	deadline := time.After(timeout)
	for {
		n := w.moved(parent, image)
		if n > 0 && first.IsZero() {
			first = time.Now()
		}
		if n == b11Pods {
			return first, time.Now(), nil
		}
		select {
		case <-w.changed:
		case <-time.After(100 * time.Millisecond):
		case <-deadline:
			return first, time.Time{}, fmt.Errorf("%s: %d of %d Pods moved to %s within %s", parent, n, b11Pods, image, timeout)
		case <-ctx.Done():
			return first, time.Time{}, ctx.Err()
		}
	}
}

func (r *run) b11(ctx context.Context) error {
	// No controller-manager makes the default ServiceAccount Pods need.
	sa := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "v1", "kind": "ServiceAccount", "metadata": map[string]any{"name": "default"}}}
	if _, err := r.cl.harness.Resource(saGVR).Namespace(ns).Create(ctx, sa, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}
	hook, err := startRollHook()
	if err != nil {
		return err
	}
	defer func() { _ = hook.srv.Close() }()
	pw, err := r.startPodWatch(ctx)
	if err != nil {
		return err
	}
	defer close(pw.stop)
	var errs []error
	for _, m := range b11Methods {
		// One method stalling leaves the other's figures standing.
		if err := r.b11Method(ctx, hook, pw, m.method, m.kind, m.plural); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", m.method, err))
		}
	}
	return errors.Join(errs...)
}

func (r *run) b11Method(ctx context.Context, hook *rollHook, pw *podWatch, method, kind, plural string) error {
	crdFile := filepath.Join(r.dir, plural+"-crd.yaml")
	if err := os.WriteFile(crdFile, []byte(parentCRD(kind, plural)), 0o644); err != nil {
		return err
	}
	if err := kubeenv.ApplyManifests(ctx, r.cl.env.Config, crdFile); err != nil {
		return err
	}
	gvr := schema.GroupVersionResource{Group: "bench.metabus.dev", Version: "v1", Resource: plural}
	cc := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "metacontroller.k8s.io/v1alpha1",
		"kind":       "CompositeController",
		"metadata":   map[string]any{"name": plural},
		"spec": map[string]any{
			"parentResource": map[string]any{"apiVersion": "bench.metabus.dev/v1", "resource": plural,
				"revisionHistory": map[string]any{"fieldPaths": []any{"spec.template"}}},
			"childResources": []any{map[string]any{
				"apiVersion": "v1", "resource": "pods",
				"updateStrategy": map[string]any{
					"method": method,
					"statusChecks": map[string]any{"conditions": []any{
						map[string]any{"type": "Ready", "status": "True"},
					}},
				},
			}},
			"hooks": map[string]any{"sync": map[string]any{"webhook": map[string]any{"url": hook.url, "timeout": "5s"}}},
		},
	}}
	if _, err := r.cl.harness.Resource(ccGVR).Create(ctx, cc, metav1.CreateOptions{}); err != nil {
		return err
	}
	name := plural + "-p"
	template := func(v int) map[string]any {
		return map[string]any{
			"metadata": map[string]any{"labels": map[string]any{"app": name}},
			"spec": map[string]any{"nodeName": b11Node, "automountServiceAccountToken": false, "containers": []any{
				map[string]any{"name": "app", "image": b11Image(v)},
			}},
		}
	}
	parent := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "bench.metabus.dev/v1", "kind": kind,
		"metadata": map[string]any{"name": name},
		"spec": map[string]any{
			"selector": map[string]any{"matchLabels": map[string]any{"app": name}},
			"replicas": int64(b11Pods),
			"template": template(1),
		},
	}}
	if _, err := r.cl.harness.Resource(gvr).Namespace(ns).Create(ctx, parent, metav1.CreateOptions{}); err != nil {
		return err
	}
	if _, _, err := pw.waitRolledOut(ctx, name, b11Image(1), 2*time.Minute); err != nil {
		return fmt.Errorf("first rollout: %w", err)
	}
	pid := r.ctrl.PID()
	k := "b11." + method
	var per, firsts, hooks, cpus []float64
	for v := 2; v <= b11Rollouts+1; v++ {
		quietHook(ctx, hook)
		calls0 := hook.calls.Load()
		cpu0, err := procCPU(pid)
		if err != nil {
			return err
		}
		patch, err := json.Marshal(map[string]any{"spec": map[string]any{"template": template(v)}})
		if err != nil {
			return err
		}
		t0 := time.Now()
		if _, err := r.cl.harness.Resource(gvr).Namespace(ns).Patch(ctx, name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
			return err
		}
		first, end, err := pw.waitRolledOut(ctx, name, b11Image(v), b11Timeout)
		if !first.IsZero() {
			firsts = append(firsts, ms(first.Sub(t0)))
			r.fig[k+".first"] = percentile(firsts, 50)
		}
		if err != nil {
			r.fig[k+".moved"] = float64(pw.moved(name, b11Image(v)))
			return err
		}
		quietHook(ctx, hook)
		cpu1, err := procCPU(pid)
		if err != nil {
			return err
		}
		per = append(per, ms(end.Sub(t0))/b11Pods)
		hooks = append(hooks, float64(hook.calls.Load()-calls0)/b11Pods)
		cpus = append(cpus, (cpu1-cpu0)*1000/b11Pods)
		r.logf("%s B11 %s: rollout to v%d in %s (%.0f ms per Pod), %.1f hook calls and %.2f ms controller CPU per Pod",
			r.name, method, v, end.Sub(t0).Round(time.Millisecond), per[len(per)-1], hooks[len(hooks)-1], cpus[len(cpus)-1])
	}
	r.fig[k+".moved"] = b11Pods
	r.fig[k+".ms"], r.fig[k+".hooks"], r.fig[k+".cpu"] = percentile(per, 50), percentile(hooks, 50), percentile(cpus, 50)
	return nil
}

// quietHook waits until the roll hook has had no call for 1s (at most 30s).
func quietHook(ctx context.Context, h *rollHook) {
	last, since := h.calls.Load(), time.Now()
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline) && ctx.Err() == nil; {
		time.Sleep(50 * time.Millisecond)
		if n := h.calls.Load(); n != last {
			last, since = n, time.Now()
		} else if time.Since(since) >= time.Second {
			return
		}
	}
}
