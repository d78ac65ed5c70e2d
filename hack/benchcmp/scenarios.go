package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"

	"github.com/metabus/metabus/internal/testing/kubeenv"
	"github.com/metabus/metabus/pkg/bus"
	"github.com/metabus/metabus/pkg/identity"
)

// ns is where the workload lives.
const ns = "default"

// figures are one contender's results of one round, by row key (see rows);
// a missing key prints "—".
type figures map[string]float64

// ssaArgs are what makes the metabus-ssa contender: the same binary and
// flags as metabus, with upstream's server-side apply strategy. It runs
// B1-B5 (what applying costs); B6-B8 are about the dispatchers, which the
// strategy does not touch.
var ssaArgs = []string{"--apply-strategy=server-side-apply"}

// benchIdentity is the ServiceAccount the metabus-identity contender's
// controller acts as (identity.ServiceAccountAnnotation): a tenant's account
// granted, by a RoleBinding in the workload's namespace only, exactly what
// the workload reads and writes. The applier impersonates it for every
// write and the watcher may review what it can read: what a controller
// with an identity costs over one without.
const benchIdentity = ns + "/bench-controller"

// identityManifest grants benchIdentity the workload's reads and writes in
// its namespace and nothing else.
const identityManifest = `apiVersion: v1
kind: ServiceAccount
metadata: {name: bench-controller, namespace: ` + ns + `}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: bench-controller, namespace: ` + ns + `}
rules:
- apiGroups: [""]
  resources: [configmaps]
  verbs: [get, list, watch, create, update, patch, delete]
- apiGroups: [bench.metabus.dev]
  resources: [benches]
  verbs: [get, list, watch, update, patch]
- apiGroups: [bench.metabus.dev]
  resources: [benches/status]
  verbs: [get, update, patch]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: bench-controller, namespace: ` + ns + `}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: bench-controller}
subjects:
- {kind: ServiceAccount, name: bench-controller, namespace: ` + ns + `}
`

// run is one contender in one round, on its own fresh control plane.
type run struct {
	cfg  *config
	name string // raw, raw-contract, contract-floor, metabus, metabus-ssa, metabus-echo, metabus-identity, metabus-split, baseline, upstream
	dir  string // its log directory
	logf func(string, ...any)

	cl    *cluster
	hook  *hookServer
	track *tracker
	ctrl  controller
	raw   *rawController
	fig   figures
	// natsURL is the all-in-one's embedded server for B7's dispatchers,
	// or the split deployment's nats-server.
	natsURL string
}

// runContender runs the whole workload for one contender.
func runContender(ctx context.Context, cfg *config, name string, round int, logf func(string, ...any)) (figures, error) {
	r := &run{cfg: cfg, name: name, fig: figures{}, logf: logf}
	r.dir = filepath.Join(cfg.logDir, fmt.Sprintf("%s-round%d", name, round))
	if err := os.MkdirAll(r.dir, 0o755); err != nil {
		return nil, err
	}
	err := r.do(ctx)
	return r.fig, errors.Join(err, r.teardown())
}

func (r *run) do(ctx context.Context) error {
	t := time.Now()
	var err error
	if r.cl, err = startCluster(ctx, r.cfg.crdDir, r.dir, r.logf); err != nil {
		return fmt.Errorf("control plane: %w", err)
	}
	r.logf("%s: control plane up in %s", r.name, time.Since(t).Round(time.Millisecond))
	if r.hook, err = startHook(); err != nil {
		return err
	}
	var onAdd func(*unstructured.Unstructured)
	if isRaw(r.name) {
		r.raw = newRawController(r.cl.ctrl, ns, r.name == "raw-contract")
		onAdd = r.raw.enqueue
	}
	if r.track, err = startTracker(ctx, r.cl.harness, ns, onAdd); err != nil {
		return err
	}
	if err := r.startController(ctx); err != nil {
		return err
	}

	// Warm-up: one parent converged proves the controller is wired and its
	// informers synced, and takes the API server's 2s delay on creates just
	// after a CRD is established out of the measurement.
	if err := r.createParents(ctx, []string{"warmup"}, 1); err != nil {
		return err
	}
	if _, err := r.track.waitConverged(ctx, []string{"warmup"}, 2*time.Minute); err != nil {
		return fmt.Errorf("warm-up: %w", err)
	}
	r.waitQuiet(ctx, time.Second, 30*time.Second)
	if err := r.idleCPU(ctx, "idle.cpu", 5*time.Second, 15*time.Second); err != nil {
		return err
	}

	sc := r.cfg.scenarios
	if sc["B1"] {
		if err := r.b1(ctx); err != nil {
			return fmt.Errorf("B1: %w", err)
		}
		if sc["B5"] {
			if err := r.rss("b5.rss"); err != nil {
				return fmt.Errorf("B5: %w", err)
			}
		}
		// What the controller costs at rest with B1's parents present:
		// nothing should poll while nothing changes.
		r.waitQuiet(ctx, time.Second, 30*time.Second)
		settled := time.Now()
		if err := r.idleCPU(ctx, "b1.idle", 5*time.Second, 15*time.Second); err != nil {
			return err
		}
		// The same later: 5s after the burst the Go runtime is still
		// returning its memory and collecting its garbage, while the
		// issue asks what 2,000 parents cost present and unchanging.
		if r.cfg.lateIdle > 0 {
			if err := r.idleCPU(ctx, "b1.idlelate", max(r.cfg.lateIdle-time.Since(settled), 0), lateIdleFor); err != nil {
				return err
			}
		}
		if sc["B10"] && !isRaw(r.name) && r.name != "metabus-split" && r.name != "contract-floor" {
			if err := r.b10(ctx); err != nil {
				return fmt.Errorf("B10: %w", err)
			}
		}
	}
	if isRaw(r.name) || r.name == "contract-floor" {
		return nil // B1 only
	}
	if sc["B2"] {
		if err := r.b2(ctx); err != nil {
			return fmt.Errorf("B2: %w", err)
		}
	}
	if sc["B3"] {
		if err := r.b3(ctx); err != nil {
			return fmt.Errorf("B3: %w", err)
		}
	}
	if sc["B4"] {
		if err := r.b4(ctx); err != nil {
			return fmt.Errorf("B4: %w", err)
		}
	}
	if sc["B5"] && r.cfg.rssParents > 0 {
		if err := r.b5(ctx); err != nil {
			return fmt.Errorf("B5: %w", err)
		}
	}
	if sc["B6"] && r.name != "metabus-ssa" && r.name != "metabus-echo" && r.name != "metabus-identity" && r.name != "metabus-split" {
		if err := r.b6(ctx); err != nil {
			return fmt.Errorf("B6: %w", err)
		}
	}
	if sc["B7"] && (r.name == "metabus" || r.name == "upstream") {
		if err := r.b7(ctx); err != nil {
			return fmt.Errorf("B7: %w", err)
		}
	}
	if sc["B8"] && r.name == "metabus" {
		if err := r.b8(ctx); err != nil {
			return fmt.Errorf("B8: %w", err)
		}
	}
	if sc["B9"] && (r.name == "metabus" || r.name == "upstream") {
		if err := r.b9(ctx); err != nil {
			return fmt.Errorf("B9: %w", err)
		}
	}
	if sc["B11"] && (r.name == "metabus" || r.name == "upstream") {
		if err := r.b11(ctx); err != nil {
			return fmt.Errorf("B11: %w", err)
		}
	}
	return nil
}

func (r *run) startController(ctx context.Context) error {
	logPath := filepath.Join(r.dir, r.name+".log")
	switch r.name {
	case "raw", "raw-contract":
		r.raw.start()
		r.ctrl = r.raw
		return nil
	case "metabus", "metabus-ssa", "metabus-echo", "metabus-identity", "baseline":
		args := append(slices.Clone(r.cfg.metabusArgs), r.cfg.flushArgs()...)
		if r.name == "metabus-ssa" {
			args = append(slices.Clone(args), ssaArgs...)
		}
		if r.cfg.scenarios["B7"] || r.cfg.scenarios["B8"] {
			var err error
			if args, err = r.b7Listen(args); err != nil {
				return err
			}
		}
		bin := r.cfg.metabusBin
		if r.name == "baseline" {
			bin = r.cfg.baselineBin
		}
		p, err := startMetabus(ctx, bin, r.cl.env.Kubeconfig, r.dir, logPath, args)
		if err != nil {
			return err
		}
		r.ctrl = p
	case "metabus-split":
		s, err := r.startSplit(ctx)
		if err != nil {
			return err
		}
		r.ctrl = s
	case "upstream":
		p, err := startUpstream(ctx, r.cfg.upstreamBin, r.cl.env.Kubeconfig, logPath, r.cfg.flushArgs())
		if err != nil {
			return err
		}
		r.ctrl = p
	case "contract-floor":
		p, err := startFloor(ctx, r.cfg.floorctlBin, r.cl.env.Kubeconfig, logPath)
		if err != nil {
			return err
		}
		r.ctrl = p
	}
	if r.name == "metabus-split" {
		logPath = r.dir // a log per process
	}
	r.logf("%s: controller ready (%s, log %s)", r.name, describeProcs(processesOf(r.ctrl)), logPath)
	return r.createCompositeController(ctx)
}

// createCompositeController creates the workload's controller: Benches with
// one InPlace ConfigMap child each, synced by the harness's hook.
func (r *run) createCompositeController(ctx context.Context) error {
	cc := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "metacontroller.k8s.io/v1alpha1",
		"kind":       "CompositeController",
		"metadata":   map[string]any{"name": "bench"},
		"spec": map[string]any{
			"generateSelector": true,
			"parentResource":   map[string]any{"apiVersion": "bench.metabus.dev/v1", "resource": "benches"},
			"childResources": []any{map[string]any{
				"apiVersion":     "v1",
				"resource":       "configmaps",
				"updateStrategy": map[string]any{"method": "InPlace"},
			}},
			"hooks": map[string]any{"sync": map[string]any{"webhook": map[string]any{"url": r.hook.url}}},
		},
	}}
	if r.name == "metabus-echo" {
		// The harness's hook is a fixpoint of its own writes (its answer
		// is a function of spec.gen and the children it sees).
		cc.SetAnnotations(map[string]string{bus.SuppressEchoesAnnotation: "true"})
	}
	if r.name == "metabus-identity" {
		f := filepath.Join(r.dir, "identity.yaml")
		if err := os.WriteFile(f, []byte(identityManifest), 0o644); err != nil {
			return err
		}
		if err := kubeenv.ApplyManifests(ctx, r.cl.env.Config, f); err != nil {
			return fmt.Errorf("identity %s: %w", benchIdentity, err)
		}
		cc.SetAnnotations(map[string]string{identity.ServiceAccountAnnotation: benchIdentity})
	}
	_, err := r.cl.harness.Resource(ccGVR).Create(ctx, cc, metav1.CreateOptions{})
	return err
}

func (r *run) teardown() error {
	var errs []error
	if r.ctrl != nil {
		errs = append(errs, r.ctrl.Stop())
	}
	if r.track != nil {
		r.track.close()
	}
	if r.hook != nil {
		r.hook.close()
	}
	if r.cl != nil {
		errs = append(errs, r.cl.stop())
	}
	// metabus's JetStream store is big and of no use once it stopped.
	errs = append(errs, os.RemoveAll(filepath.Join(r.dir, "nats")))
	return errors.Join(errs...)
}

// creators is how many concurrent clients create parents.
const creators = 50

// createParents creates Benches with spec.gen = gen, from 50 concurrent
// clients, each tracked for convergence.
func (r *run) createParents(ctx context.Context, names []string, gen int64) error {
	return r.createObjects(ctx, benchGVR, "Bench", names, gen, func(name string) { r.track.setTarget(name, gen) })
}

// createObjects creates objects of kind (bench.metabus.dev/v1, resource
// gvr) with spec.gen = gen and the labels of labels(name) (if set) from 50
// concurrent clients, calling before (if set) just before each create. It
// returns the first error.
func (r *run) createObjects(ctx context.Context, gvr schema.GroupVersionResource, kind string, names []string, gen int64, before func(name string), labels ...func(name string) map[string]any) error {
	work := make(chan string)
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		first error
	)
	for range min(creators, len(names)) {
		wg.Go(func() {
			for name := range work {
				if before != nil {
					before(name)
				}
				b := &unstructured.Unstructured{Object: map[string]any{
					"apiVersion": "bench.metabus.dev/v1",
					"kind":       kind,
					"metadata":   map[string]any{"name": name},
					"spec":       map[string]any{"gen": gen},
				}}
				for _, l := range labels {
					b.Object["metadata"].(map[string]any)["labels"] = l(name)
				}
				if _, err := r.cl.harness.Resource(gvr).Namespace(ns).Create(ctx, b, metav1.CreateOptions{}); err != nil {
					mu.Lock()
					if first == nil {
						first = fmt.Errorf("create %s: %w", name, err)
					}
					mu.Unlock()
				}
			}
		})
	}
	for _, n := range names {
		work <- n
	}
	close(work)
	wg.Wait()
	return first
}

// setGen sets a parent's spec.gen with one merge patch.
func (r *run) setGen(ctx context.Context, name string, gen int64) error {
	r.track.setTarget(name, gen)
	patch := fmt.Appendf(nil, `{"spec":{"gen":%d}}`, gen)
	_, err := r.cl.harness.Resource(benchGVR).Namespace(ns).Patch(ctx, name, types.MergePatchType, patch, metav1.PatchOptions{})
	return err
}

// lateIdleFor is how long the late idle figure (-late-idle) measures.
const lateIdleFor = 20 * time.Second

// idleCPU measures the controller's CPU over d while nothing happens (one
// converged parent, no changes), after settle: what its leases, heartbeats, pull
// requests and timers cost, and what it adds to every other figure's CPU
// per parent in proportion to how long that scenario runs. A split
// deployment's figure is its processes' sum, each also apiece. The time
// is read to the nanosecond from the threads' schedstat (the 10 ms ticks
// of /proc/<pid>/stat resolve only 0.5-0.67 ms/s over such a window).
//
// key names the figure.
func (r *run) idleCPU(ctx context.Context, key string, settle, d time.Duration) error {
	procs := processesOf(r.ctrl)
	if len(procs) == 0 {
		return nil
	}
	if err := sleepCtx(ctx, settle); err != nil {
		return err
	}
	before, err := procsCPU(procs)
	if err != nil {
		return fmt.Errorf("idle CPU: %w", err)
	}
	if err := sleepCtx(ctx, d); err != nil {
		return err
	}
	after, err := procsCPU(procs)
	if err != nil {
		return fmt.Errorf("idle CPU: %w", err)
	}
	rates := map[string]float64{}
	for stage, t := range after {
		rates[stage] = t.since(before[stage]) * 1000 / d.Seconds()
	}
	maps.Copy(r.fig, stageFigures(key, rates))
	r.logf("%s idle (%s): %.1f ms CPU per second%s", r.name, key, r.fig[key], describeStages(rates, 1))
	return nil
}

// rss sets key to the controller's resident set size in MiB (a split
// deployment's: the sum, and each stage's).
func (r *run) rss(key string) error {
	sizes := map[string]float64{}
	for _, p := range processesOf(r.ctrl) {
		b, err := procRSS(p.pid)
		if err != nil {
			return fmt.Errorf("%s: %w", p.stage, err)
		}
		sizes[p.stage] = float64(b) / (1 << 20)
	}
	maps.Copy(r.fig, stageFigures(key, sizes))
	return nil
}

// cpuReading is a process's CPU time in seconds, from the 10 ms ticks of
// /proc/<pid>/stat and, if its threads' schedstat could be read, to the
// nanosecond.
type cpuReading struct {
	ticks, exact float64
	exactOK      bool
}

// since is the CPU time from b to a: the exact one when both readings have
// it and it did not fall (a thread that exited took its time with it), else
// the ticks'.
func (a cpuReading) since(b cpuReading) float64 {
	if a.exactOK && b.exactOK && a.exact >= b.exact {
		return a.exact - b.exact
	}
	return a.ticks - b.ticks
}

// procsCPU reads the CPU time of each process, by stage.
func procsCPU(procs []stageProc) (map[string]cpuReading, error) {
	out := map[string]cpuReading{}
	for _, p := range procs {
		t, err := procCPU(p.pid)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", p.stage, err)
		}
		exact, err := procCPUExact(p.pid)
		out[p.stage] = cpuReading{ticks: t, exact: exact, exactOK: err == nil}
	}
	return out, nil
}

// sleepCtx waits d, or until ctx ends (its error).
func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// waitQuiet waits until neither the hook nor the harness's watches have
// seen anything for d (checking in-process counters, not the API server),
// or until max has passed.
func (r *run) waitQuiet(ctx context.Context, d, max time.Duration) {
	deadline := time.Now().Add(max)
	last := r.hook.total.Load() + r.track.events.Load()
	since := time.Now()
	for time.Now().Before(deadline) && ctx.Err() == nil {
		time.Sleep(50 * time.Millisecond)
		n := r.hook.total.Load() + r.track.events.Load()
		if n != last {
			last, since = n, time.Now()
			continue
		}
		if time.Since(since) >= d {
			return
		}
	}
}

// pids are the processes whose CPU time the figures report: the
// contender's (by stage, see processesOf) and the control plane's.
func (r *run) pids() map[string]int {
	out := map[string]int{
		"apiserver": r.cl.pid("kube-apiserver"),
		"etcd":      r.cl.pid("etcd"),
	}
	for _, p := range processesOf(r.ctrl) {
		out[p.stage] = p.pid
	}
	return out
}

func names(prefix string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("%s-%05d", prefix, i)
	}
	return out
}

// b1 is throughput: N parents created by 50 clients, from the first create
// to the last parent's convergence. Hook calls, API requests and CPU time
// are counted from the first create until everything has settled (2s
// without a hook call or watch event), so trailing no-op syncs count too.
func (r *run) b1(ctx context.Context) error {
	ps := names("p", r.cfg.parents)
	before, err := r.cl.snapshot(ctx, r.pids())
	if err != nil {
		return err
	}
	hooks0 := r.hook.callsOf(ps...)
	t0 := time.Now()
	if err := r.createParents(ctx, ps, 1); err != nil {
		return err
	}
	created := time.Since(t0)
	end, err := r.track.waitConverged(ctx, ps, r.cfg.timeout)
	if err != nil {
		return err
	}
	secs := end.Sub(t0).Seconds()
	r.waitQuiet(ctx, 2*time.Second, time.Minute)
	after, err := r.cl.snapshot(ctx, r.pids())
	if err != nil {
		return err
	}
	n := float64(len(ps))
	r.fig["b1.rate"] = n / secs
	if !isRaw(r.name) {
		r.fig["b1.hooks"] = float64(r.hook.callsOf(ps...)-hooks0) / n
	}
	reqs := controllerRequests(before, after)
	total := int64(0)
	for v, c := range reqs.byVerb(nil) {
		r.fig["b1.req."+v] = float64(c) / n
		total += c
	}
	for _, v := range verbColumns {
		if _, ok := r.fig["b1.req."+v]; !ok {
			r.fig["b1.req."+v] = 0
		}
	}
	r.fig["b1.req.total"] = float64(total) / n
	stages := map[string]float64{}
	for _, p := range processesOf(r.ctrl) {
		stages[p.stage] = (after.cpu[p.stage] - before.cpu[p.stage]) * 1000 / n
	}
	maps.Copy(r.fig, stageFigures("b1.cpu.controller", stages))
	for _, role := range []string{"apiserver", "etcd"} {
		r.fig["b1.cpu."+role] = (after.cpu[role] - before.cpu[role]) * 1000 / n
	}
	r.logf("%s B1: %d parents created in %s, converged in %.1fs (%.1f/s); requests: %s",
		r.name, len(ps), created.Round(time.Millisecond), secs, n/secs, reqs)
	return nil
}

// b2 is idle latency: 50 converged parents, then 100 sequential updates
// (round-robin), each waiting for convergence; from just before sending the
// update to the watch event of the ConfigMap with the new gen and of the
// status with the new observedGen.
func (r *run) b2(ctx context.Context) error {
	ps := names("idle", 50)
	if err := r.createParents(ctx, ps, 1); err != nil {
		return err
	}
	if _, err := r.track.waitConverged(ctx, ps, 5*time.Minute); err != nil {
		return err
	}
	r.waitQuiet(ctx, time.Second, 30*time.Second)
	gens := map[string]int64{}
	var cmLat, stLat []float64
	h0 := r.hook.total.Load()
	for i := range 100 {
		p := ps[i%len(ps)]
		gens[p]++
		gen := gens[p] + 1
		t0 := time.Now()
		if err := r.setGen(ctx, p, gen); err != nil {
			return err
		}
		if _, err := r.track.waitConverged(ctx, []string{p}, time.Minute); err != nil {
			return fmt.Errorf("update %d: %w", i, err)
		}
		cmAt, stAt, _ := r.track.times(p)
		cmLat = append(cmLat, ms(cmAt.Sub(t0)))
		stLat = append(stLat, ms(stAt.Sub(t0)))
	}
	r.fig["b2.cm.p50"], r.fig["b2.cm.p99"] = percentile(cmLat, 50), percentile(cmLat, 99)
	r.fig["b2.st.p50"], r.fig["b2.st.p99"] = percentile(stLat, 50), percentile(stLat, 99)
	r.logf("%s B2: ConfigMap p50 %.1f ms p99 %.1f ms, status p50 %.1f ms p99 %.1f ms; %d hook calls for the 100 updates; slowest ConfigMaps (ms, update #): %s", r.name,
		r.fig["b2.cm.p50"], r.fig["b2.cm.p99"], r.fig["b2.st.p50"], r.fig["b2.st.p99"], r.hook.total.Load()-h0, slowest(cmLat, 5))
	return nil
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// slowest lists the n largest of xs with their indexes, for telling a
// steady tail from a few stalls (and when in the run they came).
func slowest(xs []float64, n int) string {
	idx := make([]int, len(xs))
	for i := range idx {
		idx[i] = i
	}
	slices.SortFunc(idx, func(a, b int) int { return cmp.Compare(xs[b], xs[a]) })
	var parts []string
	for _, i := range idx[:min(n, len(idx))] {
		parts = append(parts, fmt.Sprintf("%.1f@%d", xs[i], i))
	}
	return strings.Join(parts, " ")
}

// b3 is coalescing: one converged parent gets 100 back-to-back updates
// (sequential requests, no waiting for convergence); hook calls for it are
// counted until it converged at the final gen and 3s passed without a call.
func (r *run) b3(ctx context.Context) error {
	const p = "burst"
	if err := r.createParents(ctx, []string{p}, 1); err != nil {
		return err
	}
	if _, err := r.track.waitConverged(ctx, []string{p}, time.Minute); err != nil {
		return err
	}
	r.waitQuiet(ctx, time.Second, 30*time.Second)
	calls0 := r.hook.callsOf(p)
	const final = 101
	for gen := int64(2); gen <= final; gen++ {
		if err := r.setGen(ctx, p, gen); err != nil {
			return err
		}
	}
	lastWrite := time.Now()
	at, err := r.track.waitConverged(ctx, []string{p}, 2*time.Minute)
	if err != nil {
		return err
	}
	r.fig["b3.ms"] = float64(max(at.Sub(lastWrite), 0)) / float64(time.Millisecond)
	// 3s of quiet: no hook call for this parent.
	last, since := r.hook.callsOf(p), time.Now()
	for time.Since(since) < 3*time.Second && ctx.Err() == nil {
		time.Sleep(50 * time.Millisecond)
		if n := r.hook.callsOf(p); n != last {
			last, since = n, time.Now()
		}
	}
	r.fig["b3.hooks"] = float64(r.hook.callsOf(p) - calls0)
	r.fig["b3.final"] = 0
	if r.hook.last(p) == final {
		r.fig["b3.final"] = 1
	}
	r.logf("%s B3: %v hook calls for 100 updates, last call saw gen %d, converged %.0f ms after the last update",
		r.name, r.fig["b3.hooks"], r.hook.last(p), r.fig["b3.ms"])
	return nil
}

// b4 is the cost of a no-op resync: resyncPeriodSeconds=10 on the
// controller, 5s to take effect, then API requests (no watches, not the
// harness's) and hook calls over 25s.
func (r *run) b4(ctx context.Context) error {
	if err := r.patchResync(ctx, 10); err != nil {
		return err
	}
	time.Sleep(5 * time.Second)
	before, err := r.cl.snapshot(ctx, r.pids())
	if err != nil {
		return err
	}
	h0 := r.hook.total.Load()
	time.Sleep(25 * time.Second)
	after, err := r.cl.snapshot(ctx, r.pids())
	if err != nil {
		return err
	}
	calls := r.hook.total.Load() - h0
	reqs := controllerRequests(before, after)
	total := int64(0)
	for _, c := range reqs.byVerb(nil) {
		total += c
	}
	r.fig["b4.hooks"] = float64(calls)
	r.fig["b4.reqs"] = float64(total)
	r.fig["b4.per"] = math.NaN()
	if calls > 0 {
		r.fig["b4.per"] = float64(total) / float64(calls)
	}
	r.logf("%s B4: %d hook calls and %d requests in 25s; requests: %s", r.name, calls, total, reqs)
	return r.patchResync(ctx, 0)
}

// patchResync sets (or, with 0, removes) the controller's resyncPeriodSeconds.
func (r *run) patchResync(ctx context.Context, secs int) error {
	patch := []byte(`{"spec":{"resyncPeriodSeconds":null}}`)
	if secs > 0 {
		patch = fmt.Appendf(nil, `{"spec":{"resyncPeriodSeconds":%d}}`, secs)
	}
	_, err := r.cl.harness.Resource(ccGVR).Patch(ctx, "bench", types.MergePatchType, patch, metav1.PatchOptions{})
	return err
}

// b5 is RSS growth: that many more parents, converged and settled, then the
// controller's RSS again.
func (r *run) b5(ctx context.Context) error {
	ps := names("rss", r.cfg.rssParents)
	t0 := time.Now()
	if err := r.createParents(ctx, ps, 1); err != nil {
		return err
	}
	timeout := max(r.cfg.timeout, time.Duration(r.cfg.rssParents/r.cfg.parents+1)*r.cfg.timeout)
	if _, err := r.track.waitConverged(ctx, ps, timeout); err != nil {
		return err
	}
	r.waitQuiet(ctx, 2*time.Second, time.Minute)
	if err := r.rss("b5.rssbig"); err != nil {
		return err
	}
	r.logf("%s B5: %d more parents converged in %s, RSS %.0f MiB", r.name, len(ps), time.Since(t0).Round(time.Second), r.fig["b5.rssbig"])
	return nil
}
