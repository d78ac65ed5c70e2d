package main

// B7, dispatcher replicas (issue #12): sync throughput with a slow hook as
// dispatcher replicas are added, each a separate bin/dispatcher process
// joining the all-in-one's embedded JetStream over TCP; upstream beside it
// with the same total workers in one process (issue 31). The all-in-one's
// own dispatcher is the first replica; the partitions of MC_WORK are
// shared out between the replicas by lease (pkg/jsbus/owned.go), each
// running up to --workers (16) syncs per controller, so hook concurrency
// should grow 16 per replica. hack/busbench measures the same without
// Kubernetes.

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/tools/cache"

	"github.com/metabus/metabus/internal/testing/kubeenv"
	"github.com/metabus/metabus/pkg/bus"
	"github.com/metabus/metabus/pkg/childproc"
	"github.com/metabus/metabus/pkg/jsbus"
	"github.com/metabus/metabus/pkg/natsx"
)

const (
	// b7Hook is the sync hook's latency.
	b7Hook = 200 * time.Millisecond
	// b7Workers is metabus's default --workers: syncs per controller per
	// dispatcher replica.
	b7Workers = 16
)

// b7Replicas are the dispatcher replica counts, in the order they run.
var b7Replicas = []int{1, 2, 4}

var slowGVR = schema.GroupVersionResource{Group: "bench.metabus.dev", Version: "v1", Resource: "slows"}

// dispatcherRows are the table rows of B7 or B8. For upstream a step is
// --workers = replicas × 16 in one process (B7 only), so the same row puts
// the same total workers side by side.
func dispatcherRows(scenario, what string) []row {
	key := strings.ToLower(scenario)
	var rows []row
	for _, n := range b7Replicas {
		step := fmt.Sprintf("%d dispatcher(s) | upstream --workers=%d", n, n*b7Workers)
		if scenario != "B7" {
			step = fmt.Sprintf("%d dispatcher(s)", n)
		}
		rows = append(rows,
			row{key: fmt.Sprintf("%s.rate.%d", key, n), label: fmt.Sprintf("%s parents/s, %s hook%s, %s", scenario, b7Hook, what, step), prec: 1},
			row{key: fmt.Sprintf("%s.calls.%d", key, n), pair: fmt.Sprintf("%s.ideal.%d", key, n),
				label: fmt.Sprintf("%s hook calls/s / ideal, %s", scenario, step), prec: 1},
			row{key: fmt.Sprintf("%s.perparent.%d", key, n), label: fmt.Sprintf("%s hook calls / parent, %s", scenario, step), prec: 2},
			row{key: fmt.Sprintf("%s.peak.%d", key, n), label: fmt.Sprintf("%s most hook calls at once, %s", scenario, step), prec: 0},
			row{key: fmt.Sprintf("%s.cores.%d", key, n), label: fmt.Sprintf("%s cores busy (all processes), %s", scenario, step), prec: 2},
		)
		for _, role := range coreRoles {
			rows = append(rows, row{key: fmt.Sprintf("%s.cores.%s.%d", key, role, n),
				label: fmt.Sprintf("%s cores busy: %s, %s", scenario, role, step), prec: 2})
		}
	}
	return rows
}

// coreRoles are the processes whose cores busy B7 and B8 report apiece:
// the controller (the all-in-one, or upstream), the extra dispatcher
// processes together, the control plane, and the harness (its 200 ms hook
// and its watches).
var coreRoles = []string{"controller", "dispatchers", "kube-apiserver", "etcd", "harness"}

// b7Listen adds a TCP listener for the all-in-one's embedded server to its
// arguments, so that B7's dispatcher processes can join it.
func (r *run) b7Listen(args []string) ([]string, error) {
	addr, err := childproc.FreeAddr()
	if err != nil {
		return nil, err
	}
	r.natsURL = "nats://" + addr
	return append(slices.Clone(args), "--nats-listen", addr), nil
}

// slowHook answers like the workload's hook (one ConfigMap, status
// {childCount, observedGen}) after a delay, counting calls in flight.
type slowHook struct {
	srv      *http.Server
	url      string
	delay    time.Duration
	calls    atomic.Int64
	inflight atomic.Int64
	peak     atomic.Int64
}

func startSlowHook(delay time.Duration) (*slowHook, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	h := &slowHook{delay: delay, url: "http://" + l.Addr().String() + "/sync"}
	h.srv = &http.Server{Handler: h}
	go func() { _ = h.srv.Serve(l) }()
	return h, nil
}

func (h *slowHook) close() { _ = h.srv.Close() }

func (h *slowHook) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	n := h.inflight.Add(1)
	defer h.inflight.Add(-1)
	for p := h.peak.Load(); n > p && !h.peak.CompareAndSwap(p, n); p = h.peak.Load() {
	}
	h.calls.Add(1)
	var req hookRequest
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	select {
	case <-time.After(h.delay):
	case <-r.Context().Done():
		return
	}
	name, gen, observed, childrenField := req.Parent.Metadata.Name, req.Parent.Spec.Gen, req.Children, "children"
	if req.Object.Metadata.Name != "" { // a DecoratorController's request (B8)
		name, gen, observed, childrenField = req.Object.Metadata.Name, req.Object.Spec.Gen, req.Attachments, "attachments"
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(map[string]any{
		"status": map[string]any{"childCount": len(observed["ConfigMap.v1"]), "observedGen": gen},
		childrenField: []any{map[string]any{
			"apiVersion": "v1", "kind": "ConfigMap",
			"metadata": map[string]any{"name": name},
			"data":     map[string]any{"gen": strconv.FormatInt(gen, 10)},
		}},
	})
}

// waitQuiet waits until the hook has had no call for d, or max passed.
func (h *slowHook) waitQuiet(ctx context.Context, d, max time.Duration) {
	deadline := time.Now().Add(max)
	last, since := h.calls.Load(), time.Now()
	for time.Now().Before(deadline) && ctx.Err() == nil {
		time.Sleep(50 * time.Millisecond)
		if n := h.calls.Load(); n != last || h.inflight.Load() > 0 {
			last, since = n, time.Now()
			continue
		}
		if time.Since(since) >= d {
			return
		}
	}
}

// slowTracker counts Slows whose status says converged: childCount 1 (the
// hook saw its ConfigMap) at observedGen 1.
type slowTracker struct {
	stop chan struct{}
	mu   sync.Mutex
	done map[string]time.Time
	more chan struct{} // closed and replaced whenever a parent converges
}

func startSlowTracker(ctx context.Context, r *run, gvr schema.GroupVersionResource) (*slowTracker, error) {
	t := &slowTracker{stop: make(chan struct{}), done: map[string]time.Time{}, more: make(chan struct{})}
	f := dynamicinformer.NewFilteredDynamicSharedInformerFactory(r.cl.harness, 0, ns, nil)
	inf := f.ForResource(gvr).Informer()
	on := func(o any) {
		u, ok := o.(*unstructured.Unstructured)
		if !ok {
			return
		}
		st, _, _ := unstructured.NestedMap(u.Object, "status")
		if toInt(st["childCount"]) != 1 || toInt(st["observedGen"]) != 1 {
			return
		}
		t.mu.Lock()
		defer t.mu.Unlock()
		if _, seen := t.done[u.GetName()]; !seen {
			t.done[u.GetName()] = time.Now()
			close(t.more)
			t.more = make(chan struct{})
		}
	}
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{AddFunc: on, UpdateFunc: func(_, o any) { on(o) }}); err != nil {
		return nil, err
	}
	f.Start(t.stop)
	sctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if !cache.WaitForCacheSync(sctx.Done(), inf.HasSynced) {
		close(t.stop)
		return nil, fmt.Errorf("informer on %s did not sync", gvr.Resource)
	}
	return t, nil
}

// wait waits until every name has converged and returns when the last did.
func (t *slowTracker) wait(ctx context.Context, names []string, timeout time.Duration) (time.Time, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for {
		t.mu.Lock()
		var last time.Time
		n := 0
		for _, p := range names {
			if at, ok := t.done[p]; ok {
				n++
				if at.After(last) {
					last = at
				}
			}
		}
		ch := t.more
		t.mu.Unlock()
		if n == len(names) {
			return last, nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return last, fmt.Errorf("%d of %d parents converged within %s", n, len(names), timeout)
		}
	}
}

// slowSetup prepares B7 or B8: the dispatcher binary, the 200 ms hook, the
// parent CRD (kind, plural) and a tracker of its converged parents. done
// stops the hook and the tracker.
func (r *run) slowSetup(ctx context.Context, kind, plural string, gvr schema.GroupVersionResource) (dispBin string, hook *slowHook, track *slowTracker, done func(), err error) {
	if r.name != "upstream" {
		if r.natsURL == "" {
			return "", nil, nil, nil, fmt.Errorf("the all-in-one listens for NATS clients only in process")
		}
		dispBin = filepath.Join(filepath.Dir(r.cfg.metabusBin), "dispatcher")
		if err := checkExecutable(dispBin); err != nil {
			return "", nil, nil, nil, fmt.Errorf("%w (build it with: go build -o bin/ ./cmd/...)", err)
		}
	}
	crdFile := filepath.Join(r.dir, plural+"-crd.yaml")
	if err := os.WriteFile(crdFile, []byte(parentCRD(kind, plural)), 0o644); err != nil {
		return "", nil, nil, nil, err
	}
	if err := kubeenv.ApplyManifests(ctx, r.cl.env.Config, crdFile); err != nil {
		return "", nil, nil, nil, err
	}
	if hook, err = startSlowHook(b7Hook); err != nil {
		return "", nil, nil, nil, err
	}
	if track, err = startSlowTracker(ctx, r, gvr); err != nil {
		hook.close()
		return "", nil, nil, nil, err
	}
	return dispBin, hook, track, func() { close(track.stop); hook.close() }, nil
}

// b7 measures convergence of -b7-parents Slows for each replica count.
func (r *run) b7(ctx context.Context) error {
	dispBin, hook, track, done, err := r.slowSetup(ctx, "Slow", "slows", slowGVR)
	if err != nil {
		return err
	}
	defer done()
	cc := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "metacontroller.k8s.io/v1alpha1",
		"kind":       "CompositeController",
		"metadata":   map[string]any{"name": "slow"},
		"spec": map[string]any{
			"generateSelector": true,
			"parentResource":   map[string]any{"apiVersion": "bench.metabus.dev/v1", "resource": "slows"},
			"childResources": []any{map[string]any{
				"apiVersion":     "v1",
				"resource":       "configmaps",
				"updateStrategy": map[string]any{"method": "InPlace"},
			}},
			"hooks": map[string]any{"sync": map[string]any{"webhook": map[string]any{"url": hook.url}}},
		},
	}}
	if _, err := r.cl.harness.Resource(ccGVR).Create(ctx, cc, metav1.CreateOptions{}); err != nil {
		return err
	}
	defer func() {
		_ = r.cl.harness.Resource(ccGVR).Delete(context.Background(), "slow", metav1.DeleteOptions{})
	}()
	// Warm-up: the controller's informers are up and its hook answers.
	if err := r.createObjects(ctx, slowGVR, "Slow", []string{"slow-warmup"}, 1, nil); err != nil {
		return err
	}
	if _, err := track.wait(ctx, []string{"slow-warmup"}, 2*time.Minute); err != nil {
		return fmt.Errorf("warm-up: %w", err)
	}

	scale := r.upstreamScaler("B7")
	if r.name != "upstream" {
		nc, js, err := natsx.Connect(natsx.ConnOptions{URL: r.natsURL, Name: "benchcmp-b7"})
		if err != nil {
			return err
		}
		defer nc.Close()
		var stop func()
		scale, stop = r.dispatcherScaler(dispBin, js, "B7")
		defer stop()
	}
	return r.dispatcherRuns(ctx, "B7", scale, hook, track, b7Workers, func(n int) []string {
		return names(fmt.Sprintf("slow-r%d", n), r.cfg.b7Parents)
	}, func(ctx context.Context, ps []string) error {
		return r.createObjects(ctx, slowGVR, "Slow", ps, 1, nil)
	})
}

// scaler brings a contender to n replicas' worth of workers (metabus: n
// dispatchers; upstream: one process with --workers n × 16) and returns
// the processes to measure by role (see coreRoles).
type scaler func(ctx context.Context, n int) (map[string][]int, error)

// dispatcherRuns measures, for each count in b7Replicas, how fast the
// parents made by create converge once scale brought the contender to that
// count, recording figures under the scenario's lower-case name. The ideal
// hook-call rate is replicas × perReplica / hook latency: perReplica is
// --workers for one controller, --max-in-flight for many.
func (r *run) dispatcherRuns(ctx context.Context, scenario string, scale scaler, hook *slowHook, track *slowTracker,
	perReplica int, parents func(replicas int) []string, create func(ctx context.Context, names []string) error) error {
	key := strings.ToLower(scenario)
	for _, n := range b7Replicas {
		procs, err := scale(ctx, n)
		if err != nil {
			return err
		}
		procs["kube-apiserver"] = []int{r.cl.pid("kube-apiserver")}
		procs["etcd"] = []int{r.cl.pid("etcd")}
		procs["harness"] = []int{os.Getpid()}
		hook.waitQuiet(ctx, time.Second, time.Minute)
		ps := parents(n)
		calls0 := hook.calls.Load()
		hook.peak.Store(hook.inflight.Load())
		cpu0 := map[string]float64{}
		for role, pids := range procs {
			cpu0[role] = cpuOf(pids)
		}
		t0 := time.Now()
		if err := create(ctx, ps); err != nil {
			return err
		}
		created := time.Since(t0)
		end, err := track.wait(ctx, ps, r.cfg.timeout)
		if err != nil {
			return fmt.Errorf("%d dispatcher(s): %w", n, err)
		}
		secs := end.Sub(t0).Seconds()
		// Calls until quiet: the last status write's echo is a call too.
		hook.waitQuiet(ctx, time.Second, time.Minute)
		elapsed := time.Since(t0).Seconds()
		var cores float64
		var each []string
		for _, role := range coreRoles {
			c := (cpuOf(procs[role]) - cpu0[role]) / elapsed
			cores += c
			r.fig[fmt.Sprintf("%s.cores.%s.%d", key, role, n)] = c
			each = append(each, fmt.Sprintf("%s %.2f", role, c))
		}
		calls := hook.calls.Load() - calls0
		ideal := float64(n*perReplica) / hook.delay.Seconds()
		r.fig[fmt.Sprintf("%s.rate.%d", key, n)] = float64(len(ps)) / secs
		r.fig[fmt.Sprintf("%s.calls.%d", key, n)] = float64(calls) / elapsed
		r.fig[fmt.Sprintf("%s.perparent.%d", key, n)] = float64(calls) / float64(len(ps))
		r.fig[fmt.Sprintf("%s.ideal.%d", key, n)] = ideal
		r.fig[fmt.Sprintf("%s.peak.%d", key, n)] = float64(hook.peak.Load())
		r.fig[fmt.Sprintf("%s.cores.%d", key, n)] = cores
		r.logf("%s %s: %d replica(s): %d parents created in %s, converged in %.1fs (%.1f/s), %d hook calls (%.2f/parent, %.1f/s until quiet, ideal %.0f/s), at most %d at once, %.2f cores busy (%s)",
			r.name, scenario, n, len(ps), created.Round(time.Millisecond), secs, float64(len(ps))/secs, calls, float64(calls)/float64(len(ps)),
			float64(calls)/elapsed, ideal, hook.peak.Load(), cores, strings.Join(each, ", "))
	}
	return nil
}

// dispatcherScaler is metabus's scaler: bin/dispatcher processes joining
// the all-in-one's (started as needed; stop stops them), and with
// -b7-appliers as many bin/applier processes beside them, each step
// waiting until the partitions are leased as assigned.
func (r *run) dispatcherScaler(dispBin string, js jetstream.JetStream, scenario string) (scale scaler, stop func()) {
	var extra, appliers []*proc
	scale = func(ctx context.Context, n int) (map[string][]int, error) {
		for len(extra) < n-1 {
			p, err := r.startStage(ctx, dispBin, "dispatcher", len(extra)+1, "--run-schedule-relay=false", "--run-dead-letter=false")
			if err != nil {
				return nil, err
			}
			extra = append(extra, p)
		}
		for r.cfg.b7Appliers && len(appliers) < n-1 {
			p, err := r.startStage(ctx, filepath.Join(filepath.Dir(dispBin), "applier"), "applier", len(appliers)+1)
			if err != nil {
				return nil, err
			}
			appliers = append(appliers, p)
		}
		t0 := time.Now()
		spread, err := waitWorkBalanced(ctx, js, n, time.Minute)
		if err != nil {
			return nil, err
		}
		if r.cfg.b7Appliers {
			if _, err := waitBalanced(ctx, js, bus.DesiredStage, bus.DesiredStream, n, time.Minute); err != nil {
				return nil, err
			}
		}
		r.logf("%s %s: %d dispatcher(s) own the work partitions as assigned (%s each) after %s (appliers: %d)",
			r.name, scenario, n, spread, time.Since(t0).Round(time.Millisecond), 1+len(appliers))
		procs := map[string][]int{"controller": {r.ctrl.PID()}, "dispatchers": nil}
		for _, p := range append(slices.Clone(extra), appliers...) {
			procs["dispatchers"] = append(procs["dispatchers"], p.PID())
		}
		return procs, nil
	}
	return scale, func() {
		for _, p := range append(extra, appliers...) {
			_ = p.Stop()
		}
	}
}

// upstreamScaler is upstream's scaler: upstream restarted with --workers =
// n × 16 (and the rest of upstreamTuned), so each step has the total
// workers of n metabus dispatchers. Its restart resyncs every existing
// parent; dispatcherRuns waits for the hook to be quiet before it measures.
func (r *run) upstreamScaler(scenario string) scaler {
	return func(ctx context.Context, n int) (map[string][]int, error) {
		if err := r.ctrl.Stop(); err != nil {
			r.logf("%s %s: stopping upstream: %v", r.name, scenario, err)
		}
		args := append(append([]string{fmt.Sprintf("--workers=%d", n*b7Workers)}, upstreamTuned[1:]...), r.cfg.flushArgs()...)
		logPath := filepath.Join(r.dir, fmt.Sprintf("upstream-workers%d.log", n*b7Workers))
		p, err := childproc.StartUpstream(ctx, r.cfg.upstreamBin, r.cl.env.Kubeconfig, logPath, args)
		if err != nil {
			return nil, err
		}
		r.ctrl = p
		r.logf("%s %s: upstream restarted with %s (pid %d)", r.name, scenario, strings.Join(args, " "), p.PID())
		return map[string][]int{"controller": {p.PID()}}, nil
	}
}

// cpuOf is the CPU seconds of the processes, summed (a process that is
// gone counts 0).
func cpuOf(pids []int) float64 {
	var t float64
	for _, p := range pids {
		if p == 0 {
			continue
		}
		if c, err := procCPU(p); err == nil {
			t += c
		}
	}
	return t
}

// startStage starts replica i of a stage's binary (bin/dispatcher without
// the relay and DLQ workers, which the all-in-one runs; bin/applier)
// against the all-in-one's server and cluster, with extra flags.
func (r *run) startStage(ctx context.Context, bin, stage string, i int, extra ...string) (*proc, error) {
	addrs, err := freeAddrs(2)
	if err != nil {
		return nil, err
	}
	metrics, health := addrs[0], addrs[1]
	args := []string{
		"--kubeconfig", r.cl.env.Kubeconfig,
		"--nats-url", r.natsURL,
		"--metrics-address", metrics,
		"--health-probe-bind-address", health,
	}
	args = append(args, extra...)
	logPath := filepath.Join(r.dir, fmt.Sprintf("%s-%d.log", stage, i))
	p, err := childproc.Start(ctx, fmt.Sprintf("%s-%d", stage, i), bin, args, nil, logPath, "http://"+health+"/readyz")
	if err != nil {
		return nil, err
	}
	p.MetricsURL = "http://" + metrics + "/metrics"
	r.logf("%s: %s-%d ready (pid %d, log %s)", r.name, stage, i, p.PID(), logPath)
	return p, nil
}

// waitWorkBalanced waits until n dispatchers are members of the work stage
// and each MC_WORK partition is leased to the member rendezvous hashing
// assigns it to; it returns the fewest-most partitions per member.
func waitWorkBalanced(ctx context.Context, js jetstream.JetStream, n int, timeout time.Duration) (string, error) {
	return waitBalanced(ctx, js, bus.WorkStage, bus.WorkStream, n, timeout)
}

// waitBalanced is waitWorkBalanced for any stage and its stream.
func waitBalanced(ctx context.Context, js jetstream.JetStream, stage, stream string, n int, timeout time.Duration) (string, error) {
	kv, err := js.KeyValue(ctx, bus.OwnersBucket)
	if err != nil {
		return "", err
	}
	prefix := "member." + stage + "."
	deadline := time.Now().Add(timeout)
	last := ""
	for {
		var members []string
		if l, err := kv.ListKeysFiltered(ctx, prefix+"*"); err == nil {
			for k := range l.Keys() {
				members = append(members, strings.TrimPrefix(k, prefix))
			}
		}
		parts, perr := jsbus.StreamPartitions(ctx, js, stream)
		if len(members) == n && perr == nil {
			want := jsbus.Assign(members, parts)
			ok := true
			count := map[string]int{}
			for p := range parts {
				count[want[p]]++
				e, err := kv.Get(ctx, bus.LeaseKey(stage, parts, p))
				if err != nil || string(e.Value()) != want[p] {
					ok = false
				}
			}
			lo, hi := parts, 0
			for _, m := range members {
				lo, hi = min(lo, count[m]), max(hi, count[m])
			}
			last = fmt.Sprintf("%d-%d", lo, hi)
			if ok {
				return last, nil
			}
		}
		if time.Now().After(deadline) {
			return "", fmt.Errorf("%s partitions not leased as assigned to %d members within %s (members seen: %d, spread %s)", stream, n, timeout, len(members), last)
		}
		select {
		case <-ctx.Done():
			return "", ctx.Err()
		case <-time.After(250 * time.Millisecond):
		}
	}
}
