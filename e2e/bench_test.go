package e2e

// End-to-end benchmarks against the real control plane of TestMain and an
// all-in-one metabus (embedded JetStream). They print figures for
// docs/performance.md and assert nothing about speed:
//
//	KUBE_BIN_DIR=$(hack/kubeenv/build.sh | tail -1) \
//	  go test -run '^$' -bench . -benchtime 1x -timeout 20m ./e2e/
//
// Each benchmark runs its body once (it sizes its own work), so the default
// -benchtime gives the same result as 1x. Every request metabus makes to
// the API server goes through a counting RoundTripper
// (rest.Config.WrapTransport), classified as get, list, watch, discovery or
// a write verb; the benchmark's own client is not counted.

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"

	"github.com/metabus/metabus/internal/allinone"
	"github.com/metabus/metabus/sdk/hook"
)

// benchAPICounter counts the API requests of one metabus instance by class
// ("get", "list", "watch", "discovery", "create", "update", "patch",
// "delete") and by class+resource.
type benchAPICounter struct {
	mu     sync.Mutex
	counts map[string]int64
}

func newBenchAPICounter() *benchAPICounter { return &benchAPICounter{counts: map[string]int64{}} }

type benchCountingRT struct {
	next http.RoundTripper
	c    *benchAPICounter
}

func (rt benchCountingRT) RoundTrip(req *http.Request) (*http.Response, error) {
	class, resource := benchClassify(req)
	rt.c.mu.Lock()
	rt.c.counts[class]++
	rt.c.counts[class+" "+resource]++
	rt.c.mu.Unlock()
	return rt.next.RoundTrip(req)
}

// benchClassify maps a request to its class and resource (with
// subresource, e.g. "widgets/status").
func benchClassify(req *http.Request) (class, resource string) {
	segs := strings.Split(strings.Trim(req.URL.Path, "/"), "/")
	gvLen := 0
	switch {
	case len(segs) > 0 && segs[0] == "api":
		gvLen = 2
	case len(segs) > 0 && segs[0] == "apis":
		gvLen = 3
	}
	if gvLen == 0 || len(segs) <= gvLen {
		return "discovery", req.URL.Path
	}
	rest := segs[gvLen:]
	if rest[0] == "namespaces" && len(rest) >= 3 {
		rest = rest[2:]
	}
	resource = rest[0]
	if len(rest) >= 3 {
		resource += "/" + rest[2]
	}
	switch req.Method {
	case http.MethodGet:
		switch {
		case req.URL.Query().Get("watch") == "true" || req.URL.Query().Get("watch") == "1":
			return "watch", resource
		case len(rest) == 1:
			return "list", resource
		default:
			return "get", resource
		}
	case http.MethodPost:
		return "create", resource
	case http.MethodPut:
		return "update", resource
	case http.MethodPatch:
		return "patch", resource
	case http.MethodDelete:
		return "delete", resource
	}
	return strings.ToLower(req.Method), resource
}

func (c *benchAPICounter) snapshot() map[string]int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make(map[string]int64, len(c.counts))
	for k, v := range c.counts {
		out[k] = v
	}
	return out
}

// benchAPIDelta is what happened between two snapshots.
type benchAPIDelta map[string]int64

func benchDiffAPI(before, after map[string]int64) benchAPIDelta {
	d := benchAPIDelta{}
	for k, v := range after {
		if n := v - before[k]; n != 0 {
			d[k] = n
		}
	}
	return d
}

func (d benchAPIDelta) writes() int64 {
	return d["create"] + d["update"] + d["patch"] + d["delete"]
}

// String lists the per-resource counts, e.g. "get configmaps=3 update widgets/status=200".
func (d benchAPIDelta) String() string {
	var parts []string
	for k, v := range d {
		if strings.Contains(k, " ") {
			parts = append(parts, fmt.Sprintf("%s=%d", k, v))
		}
	}
	sort.Strings(parts)
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, ", ")
}

// benchEnv is one benchmark's metabus, namespace, hook and controller.
type benchEnv struct {
	inst      *instance
	api       *benchAPICounter
	ns        string
	hookCalls atomic.Int64
	hookURL   string
	// hookSubject, when set, serves the hook over NATS instead: the
	// controller names it, and a queue subscription on the benchmark's
	// metabus answers it with the same benchHook.
	hookSubject string
	track       *benchTracker
}

// benchSetup creates a namespace, starts metabus (all stages, one process)
// with a counting transport, serves the bench hook and creates a
// CompositeController over Widgets, then converges one warm-up parent so
// the controller is wired and its informers are synced. Cleanups run in
// reverse: the controller goes, metabus stops, then the namespace is
// deleted and waited for, so the next benchmark starts on an idle API
// server.
func benchSetup(b *testing.B, cfg allinone.Config) *benchEnv {
	b.Helper()
	return benchSetupOver(b, cfg, benchWebhook)
}

// The hook transports a benchmark may serve its hook over.
const (
	benchWebhook = "webhook"
	benchNATS    = "nats"
	// benchNATSOwnConn is benchNATS with the dispatcher's hook requests on
	// a connection of their own (allinone.Config.HookConnection).
	benchNATSOwnConn = "nats-ownconn"
)

// benchSetupOver is benchSetup with the hook served over transport.
func benchSetupOver(b *testing.B, cfg allinone.Config, transport string) *benchEnv {
	b.Helper()
	be := benchStartOver(b, cfg, transport)
	be.createController(b)
	if err := benchCreateWidgets(be.ns, []string{"warmup"}, 1); err != nil {
		b.Fatal(err)
	}
	be.waitConverged(b, []string{"warmup"}, 1, 60*time.Second)
	be.waitQuiet(b, time.Second, 30*time.Second)
	return be
}

// benchStart is benchSetup without the controller.
func benchStart(b *testing.B, cfg allinone.Config) *benchEnv {
	b.Helper()
	return benchStartOver(b, cfg, benchWebhook)
}

// benchStartOver is benchStart with the hook served over transport.
func benchStartOver(b *testing.B, cfg allinone.Config, transport string) *benchEnv {
	b.Helper()
	be := &benchEnv{api: newBenchAPICounter()}
	be.ns = benchNamespace(b)
	srv := httptest.NewServer(jsonHook(benchHook(&be.hookCalls)))
	b.Cleanup(srv.Close)
	be.hookURL = srv.URL
	if transport == benchNATSOwnConn {
		cfg.HookConnection = true
	}
	be.inst = benchMetabus(b, cfg, be.api)
	if transport == benchNATS || transport == benchNATSOwnConn {
		be.hookSubject = "hooks.bench." + be.ns
		be.serveNATS(b)
	}
	be.track = newBenchTracker(b, be.ns)
	return be
}

// serveNATS answers be.hookSubject with benchHook through the SDK
// (hook.ServeNATS, which answers calls concurrently as an HTTP server
// does), from a connection of its own to the benchmark's metabus (as a
// hook process would), in a queue group.
func (be *benchEnv) serveNATS(b *testing.B) {
	b.Helper()
	nc, err := nats.Connect(be.inst.url)
	if err != nil {
		b.Fatal(err)
	}
	f := benchHook(&be.hookCalls)
	h := hook.HandlerFunc(func(_ context.Context, call *hook.Call) ([]byte, error) {
		var req map[string]any
		if err := json.Unmarshal(call.Data, &req); err != nil {
			return nil, hook.Errorf(400, "%v", err)
		}
		_, resp := f(req)
		return json.Marshal(resp)
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- hook.ServeNATS(ctx, nc, be.hookSubject, "bench", h) }()
	b.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			b.Errorf("ServeNATS: %v", err)
		}
		nc.Close()
	})
	for nc.NumSubscriptions() == 0 {
		time.Sleep(5 * time.Millisecond)
	}
	if err := nc.Flush(); err != nil {
		b.Fatal(err)
	}
}

// createController creates the benchmark's CompositeController, served by
// be's metabus: Widgets with one InPlace ConfigMap child each.
func (be *benchEnv) createController(b *testing.B) {
	b.Helper()
	name := strings.ToLower(strings.NewReplacer("/", "-", "_", "-", "=", "-").Replace(b.Name()))
	if len(name) > 50 {
		name = name[:50]
	}
	createController(b, be.inst, compositeKind, strings.Trim(name, "-"), map[string]any{
		"parentResource": map[string]any{"apiVersion": "test.metabus.dev/v1", "resource": "widgets"},
		"childResources": []any{map[string]any{
			"apiVersion": "v1", "resource": "configmaps",
			"updateStrategy": map[string]any{"method": "InPlace"},
		}},
		"hooks": map[string]any{"sync": be.syncHook()},
	})
}

// syncHook is the controller's sync hook: the webhook, or its NATS subject.
func (be *benchEnv) syncHook() map[string]any {
	if be.hookSubject != "" {
		return map[string]any{"nats": map[string]any{"subject": be.hookSubject, "timeout": "5s"}}
	}
	return map[string]any{"webhook": map[string]any{"url": be.hookURL, "timeout": "5s"}}
}

// benchHook is the Widget hook of the benchmarks: one ConfigMap per
// spec.items entry carrying spec.version, and a status that depends only
// on the spec (so a converged parent needs exactly one child write and one
// status write, the "needed writes" a raw client makes). Annotations and
// labels of the parent are ignored.
func benchHook(calls *atomic.Int64) func(req map[string]any) (int, any) {
	return func(req map[string]any) (int, any) {
		calls.Add(1)
		parent := &unstructured.Unstructured{Object: req["parent"].(map[string]any)}
		items, _, _ := unstructured.NestedStringSlice(parent.Object, "spec", "items")
		version, _, _ := unstructured.NestedFieldNoCopy(parent.Object, "spec", "version")
		children := make([]any, 0, len(items))
		for _, it := range items {
			children = append(children, map[string]any{
				"apiVersion": "v1",
				"kind":       "ConfigMap",
				"metadata": map[string]any{
					"name":   parent.GetName() + "-" + it,
					"labels": map[string]any{"app": parent.GetName()},
				},
				"data": map[string]any{"item": it, "version": fmt.Sprint(version)},
			})
		}
		return 200, map[string]any{
			"status":   map[string]any{"version": version, "items": len(items)},
			"children": children,
		}
	}
}

// benchNamespace creates a namespace whose cleanup waits until it is gone.
func benchNamespace(b *testing.B) string {
	b.Helper()
	ctx := context.Background()
	ns, err := kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "bench-"}}, metav1.CreateOptions{})
	if err != nil {
		b.Fatalf("create namespace: %v", err)
	}
	b.Cleanup(func() {
		_ = kube.CoreV1().Namespaces().Delete(ctx, ns.Name, metav1.DeleteOptions{})
		deadline := time.Now().Add(90 * time.Second)
		for time.Now().Before(deadline) {
			if _, err := kube.CoreV1().Namespaces().Get(ctx, ns.Name, metav1.GetOptions{}); apierrors.IsNotFound(err) {
				return
			}
			time.Sleep(250 * time.Millisecond)
		}
		b.Logf("namespace %s still terminating after 90s", ns.Name)
	})
	return ns.Name
}

func benchMetabus(b *testing.B, cfg allinone.Config, api *benchAPICounter) *instance {
	b.Helper()
	return startMetabusAs(b, cfg, nil, func(next http.RoundTripper) http.RoundTripper { return benchCountingRT{next: next, c: api} }, superUser)
}

// metricBy returns a counter's values by one label.
func (inst *instance) benchMetricBy(b *testing.B, name, label string) map[string]float64 {
	b.Helper()
	mfs, err := inst.reg.Gather()
	if err != nil {
		b.Fatalf("gather metrics: %v", err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if lp.GetName() == label {
					out[lp.GetValue()] += m.GetCounter().GetValue()
				}
			}
		}
	}
	return out
}

// benchHist is a histogram's cumulative state: sum, count and buckets.
type benchHist struct {
	sum, count float64
	bounds     []float64
	cum        []float64 // cumulative counts per bound
}

// histograms returns every metabus histogram series, keyed
// "name{label=value,...}" with the "metabus_" prefix dropped.
func (inst *instance) benchHistograms(b *testing.B) map[string]benchHist {
	b.Helper()
	mfs, err := inst.reg.Gather()
	if err != nil {
		b.Fatalf("gather metrics: %v", err)
	}
	out := map[string]benchHist{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			h := m.GetHistogram()
			if h == nil {
				continue
			}
			var labels []string
			for _, lp := range m.GetLabel() {
				labels = append(labels, lp.GetName()+"="+lp.GetValue())
			}
			key := strings.TrimPrefix(mf.GetName(), "metabus_")
			if len(labels) > 0 {
				key += "{" + strings.Join(labels, ",") + "}"
			}
			hs := benchHist{sum: h.GetSampleSum(), count: float64(h.GetSampleCount())}
			for _, bk := range h.GetBucket() {
				hs.bounds = append(hs.bounds, bk.GetUpperBound())
				hs.cum = append(hs.cum, float64(bk.GetCumulativeCount()))
			}
			out[key] = hs
		}
	}
	return out
}

// benchStages summarises the histograms' growth between two snapshots: count,
// mean and the bucket bound holding the median and the 90th percentile, in
// milliseconds, e.g. "dispatcher_hook_duration_seconds{hook=sync} n=1426
// mean=2.1 p50≤4.5 p90≤13.5".
func benchStages(before, after map[string]benchHist) string {
	var lines []string
	for key, a := range after {
		bf := before[key]
		n := a.count - bf.count
		if n <= 0 {
			continue
		}
		q := func(p float64) string {
			for i, bound := range a.bounds {
				c := a.cum[i]
				if i < len(bf.cum) {
					c -= bf.cum[i]
				}
				if c >= p*n {
					return fmt.Sprintf("≤%.3g", bound*1000)
				}
			}
			return ">max"
		}
		lines = append(lines, fmt.Sprintf("%s n=%.0f mean=%.3gms p50%s p90%s", strings.TrimSuffix(key, "_seconds"),
			n, (a.sum-bf.sum)/n*1000, q(0.5), q(0.9)))
	}
	sort.Strings(lines)
	return "\n\t" + strings.Join(lines, "\n\t")
}

// benchTracker follows the namespace's Widgets and ConfigMaps through a watch
// (no polling load on the API server, and event timestamps for latency).
type benchTracker struct {
	mu        sync.Mutex
	status    map[string]int64                // widget → status.version
	children  map[string]string               // configmap → data.version
	firstSeen map[string]map[string]time.Time // configmap → data.version → first seen
	specSeen  map[string]map[int64]time.Time  // widget → spec.version → first seen
	changed   chan struct{}
}

func newBenchTracker(b *testing.B, ns string) *benchTracker {
	b.Helper()
	tr := &benchTracker{
		status:    map[string]int64{},
		children:  map[string]string{},
		firstSeen: map[string]map[string]time.Time{},
		specSeen:  map[string]map[int64]time.Time{},
		changed:   make(chan struct{}, 1),
	}
	f := dynamicinformer.NewFilteredDynamicSharedInformerFactory(dyn, 0, ns, nil)
	onWidget := func(obj any) {
		now := time.Now()
		u, ok := obj.(*unstructured.Unstructured)
		if !ok {
			return
		}
		v, found := nestedInt(u, "status", "version")
		sv, _ := nestedInt(u, "spec", "version")
		tr.mu.Lock()
		if found {
			tr.status[u.GetName()] = v
		}
		seen := tr.specSeen[u.GetName()]
		if seen == nil {
			seen = map[int64]time.Time{}
			tr.specSeen[u.GetName()] = seen
		}
		if _, ok := seen[sv]; !ok {
			seen[sv] = now
		}
		tr.mu.Unlock()
		tr.notify()
	}
	onChild := func(obj any) {
		now := time.Now()
		u, ok := obj.(*unstructured.Unstructured)
		if !ok {
			return
		}
		v := nestedString(u, "data", "version")
		tr.mu.Lock()
		tr.children[u.GetName()] = v
		seen := tr.firstSeen[u.GetName()]
		if seen == nil {
			seen = map[string]time.Time{}
			tr.firstSeen[u.GetName()] = seen
		}
		if _, ok := seen[v]; !ok {
			seen[v] = now
		}
		tr.mu.Unlock()
		tr.notify()
	}
	for _, h := range []struct {
		inf cache.SharedIndexInformer
		f   func(any)
	}{
		{f.ForResource(widgetsGVR).Informer(), onWidget},
		{f.ForResource(configMapsGVR).Informer(), onChild},
	} {
		fn := h.f
		if _, err := h.inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
			AddFunc:    fn,
			UpdateFunc: func(_, obj any) { fn(obj) },
		}); err != nil {
			b.Fatal(err)
		}
	}
	stop := make(chan struct{})
	b.Cleanup(func() { close(stop); f.Shutdown() })
	f.Start(stop)
	f.WaitForCacheSync(stop)
	return tr
}

func (tr *benchTracker) notify() {
	select {
	case tr.changed <- struct{}{}:
	default:
	}
}

// pending counts the parents among names not converged at version: status
// written with that version and the child <name>-a at that version.
func (tr *benchTracker) pending(names []string, version int64) int {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	want := fmt.Sprint(version)
	n := 0
	for _, name := range names {
		if v, ok := tr.status[name]; !ok || v != version || tr.children[name+"-a"] != want {
			n++
		}
	}
	return n
}

func (be *benchEnv) waitConverged(b *testing.B, names []string, version int64, timeout time.Duration) {
	b.Helper()
	deadline := time.After(timeout)
	for {
		n := be.track.pending(names, version)
		if n == 0 {
			return
		}
		select {
		case <-be.track.changed:
		case <-time.After(100 * time.Millisecond):
		case <-deadline:
			b.Fatalf("%d of %d parents not converged after %s", n, len(names), timeout)
		}
	}
}

// waitQuiet waits until metabus has been idle (no hook call, sync, apply
// or API request other than watches) for quiet.
func (be *benchEnv) waitQuiet(b *testing.B, quiet, timeout time.Duration) {
	b.Helper()
	fingerprint := func() string {
		api := be.api.snapshot()
		return fmt.Sprint(be.hookCalls.Load(),
			be.inst.counter(b, "metabus_dispatcher_syncs_total", nil),
			be.inst.counter(b, "metabus_applier_applies_total", nil),
			api["get"], api["list"], api["create"], api["update"], api["patch"], api["delete"])
	}
	deadline := time.Now().Add(timeout)
	last, since := fingerprint(), time.Now()
	for time.Since(since) < quiet {
		if time.Now().After(deadline) {
			b.Logf("metabus not quiet after %s", timeout)
			return
		}
		time.Sleep(50 * time.Millisecond)
		if fp := fingerprint(); fp != last {
			last, since = fp, time.Now()
		}
	}
}

// benchCounters is a snapshot of everything a benchmark reports on.
type benchCounters struct {
	api       map[string]int64
	hookCalls int64
	syncs     float64
	applies   float64
	noops     float64
	writes    float64 // metabus_applier_api_writes_total
	resyncs   float64 // work items published for a resync
	byResult  map[string]float64
	hists     map[string]benchHist
}

// benchResults lists the applier's and dispatcher's results between two
// snapshots, e.g. "apply ok=100 apply conflict=12 sync ok=312".
func benchResults(before, after benchCounters) string {
	var parts []string
	for k, v := range after.byResult {
		if n := v - before.byResult[k]; n != 0 {
			parts = append(parts, fmt.Sprintf("%s=%.0f", k, n))
		}
	}
	sort.Strings(parts)
	return strings.Join(parts, " ")
}

func (be *benchEnv) snap(b *testing.B) benchCounters {
	b.Helper()
	c := benchCounters{
		api:       be.api.snapshot(),
		hookCalls: be.hookCalls.Load(),
		syncs:     be.inst.counter(b, "metabus_dispatcher_syncs_total", nil),
		applies:   be.inst.counter(b, "metabus_applier_applies_total", nil),
		noops:     be.inst.counter(b, "metabus_applier_applies_total", map[string]string{"result": "noop"}),
		writes:    be.inst.counter(b, "metabus_applier_api_writes_total", nil),
		resyncs:   be.inst.counter(b, "metabus_watcher_work_items_total", map[string]string{"reason": "resync"}),
		byResult:  map[string]float64{},
		hists:     be.inst.benchHistograms(b),
	}
	for k, v := range be.inst.benchMetricBy(b, "metabus_applier_applies_total", "result") {
		c.byResult["apply "+k] = v
	}
	for k, v := range be.inst.benchMetricBy(b, "metabus_dispatcher_syncs_total", "result") {
		c.byResult["sync "+k] = v
	}
	for k, v := range be.inst.benchMetricBy(b, "metabus_watcher_work_items_total", "reason") {
		c.byResult["enqueue "+k] = v
	}
	return c
}

// benchCreateWidgets creates parents (one item "a", version) with bounded
// concurrency, through the benchmark's own client.
func benchCreateWidgets(ns string, names []string, concurrency int) error {
	return benchForEach(names, concurrency, func(name string) error {
		_, err := dyn.Resource(widgetsGVR).Namespace(ns).Create(context.Background(), newWidget(name, []string{"a"}, 1), metav1.CreateOptions{})
		return err
	})
}

func benchForEach(names []string, concurrency int, f func(string) error) error {
	var wg sync.WaitGroup
	var mu sync.Mutex
	var first error
	sem := make(chan struct{}, concurrency)
	for _, name := range names {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			if err := f(name); err != nil {
				mu.Lock()
				if first == nil {
					first = fmt.Errorf("%s: %w", name, err)
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return first
}

func benchParentNames(prefix string, n int) []string {
	names := make([]string, n)
	for i := range names {
		names[i] = fmt.Sprintf("%s%04d", prefix, i)
	}
	return names
}

func benchPercentile(sorted []time.Duration, p float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	return float64(sorted[int(p*float64(len(sorted)-1))]) / float64(time.Millisecond)
}

// benchCPU returns the CPU time used so far by this process (metabus, the
// hook server and the benchmark's own clients) and by the control plane's
// processes (etcd, kube-apiserver, kube-controller-manager: those whose
// command line mentions the kubeenv state directory), from /proc.
func benchCPU() (self, controlPlane time.Duration) {
	const tick = 10 * time.Millisecond // USER_HZ is 100 on Linux
	read := func(pid string) time.Duration {
		data, err := os.ReadFile("/proc/" + pid + "/stat")
		if err != nil {
			return 0
		}
		// Fields after the command (which may contain spaces) in ")".
		f := strings.Fields(string(data[strings.LastIndexByte(string(data), ')')+1:]))
		if len(f) < 13 {
			return 0
		}
		u, _ := strconv.ParseInt(f[11], 10, 64)
		s, _ := strconv.ParseInt(f[12], 10, 64)
		return time.Duration(u+s) * tick
	}
	self = read("self")
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		cmd, err := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if err != nil || !strings.Contains(string(cmd), env.Dir) {
			continue
		}
		controlPlane += read(e.Name())
	}
	return self, controlPlane
}

// BenchmarkConvergeParents: 500 Widgets, each needing one ConfigMap and a
// status (the "needed writes" are 2 per parent). A parent is converged when
// its status is written at the spec's version and its child exists, as
// seen through a watch. The per-parent costs are counted once metabus is
// idle again, so they include the trailing syncs that the writes' own
// events cause.
//
//   - raw-client: no metabus; 64 goroutines do just the needed writes
//     (create the child, update the status) for 500 existing parents. This
//     is the "raw limit", measured now on this machine under its
//     current load, so metabus's figures can be read as a ratio of it.
//   - backlog/workers=N: the 500 parents exist before the controller; time
//     runs from creating the CompositeController to the last parent
//     converged (wiring and informer lists included). N is the dispatcher's
//     and the applier's --workers.
//   - live/workers=16: the controller runs; parents are created 32 at a
//     time and time runs from the first create (the creates compete with
//     metabus for the API server).
//
// proc-cpu-ms/parent is this process's CPU (metabus, the hook server, the
// benchmark's clients and watch) and kube-cpu-ms/parent the control
// plane's, until convergence: on 2 cores they compete for the same CPU.
func BenchmarkConvergeParents(b *testing.B) {
	b.Run("raw-client", benchConvergeRaw)
	for _, workers := range []int{16, 64} {
		b.Run(fmt.Sprintf("backlog/workers=%d", workers), func(b *testing.B) { benchConverge(b, workers, true) })
	}
	b.Run("live/workers=16", func(b *testing.B) { benchConverge(b, 16, false) })
}

const benchParents = 500

func benchConvergeRaw(b *testing.B) {
	b.StopTimer()
	ctx := context.Background()
	ns := benchNamespace(b)
	rc := rest.CopyConfig(env.Config)
	rc.QPS, rc.Burst = -1, -1 // no client-side limit: measure the server
	client, err := dynamic.NewForConfig(rc)
	if err != nil {
		b.Fatal(err)
	}
	var elapsed, selfCPU, cpCPU time.Duration
	for i := 0; i < b.N; i++ {
		names := benchParentNames(fmt.Sprintf("r%d-p", i), benchParents)
		parents := make(map[string]*unstructured.Unstructured, len(names))
		var mu sync.Mutex
		if err := benchForEach(names, 32, func(name string) error {
			p, err := client.Resource(widgetsGVR).Namespace(ns).Create(ctx, newWidget(name, []string{"a"}, 1), metav1.CreateOptions{})
			mu.Lock()
			parents[name] = p
			mu.Unlock()
			return err
		}); err != nil {
			b.Fatalf("create parents: %v", err)
		}
		time.Sleep(time.Second) // let the creates' echoes (watch caches) settle
		self0, cp0 := benchCPU()
		b.StartTimer()
		start := time.Now()
		if err := benchForEach(names, 64, func(name string) error {
			p := parents[name]
			cm := &unstructured.Unstructured{Object: map[string]any{
				"apiVersion": "v1", "kind": "ConfigMap",
				"metadata": map[string]any{"name": name + "-a", "labels": map[string]any{"app": name}},
				"data":     map[string]any{"item": "a", "version": "1"},
			}}
			t := true
			cm.SetOwnerReferences([]metav1.OwnerReference{{APIVersion: p.GetAPIVersion(), Kind: p.GetKind(),
				Name: p.GetName(), UID: p.GetUID(), Controller: &t, BlockOwnerDeletion: &t}})
			if _, err := client.Resource(configMapsGVR).Namespace(ns).Create(ctx, cm, metav1.CreateOptions{}); err != nil {
				return err
			}
			p.Object["status"] = map[string]any{"version": int64(1), "items": int64(1), "observedGeneration": p.GetGeneration()}
			_, err := client.Resource(widgetsGVR).Namespace(ns).UpdateStatus(ctx, p, metav1.UpdateOptions{})
			return err
		}); err != nil {
			b.Fatalf("converge: %v", err)
		}
		took := time.Since(start)
		b.StopTimer()
		self1, cp1 := benchCPU()
		selfCPU += self1 - self0
		cpCPU += cp1 - cp0
		elapsed += took
		b.Logf("raw client, 64 writers: %d parents converged in %s (%.0f writes/s); CPU: this process %s, control plane %s",
			benchParents, took.Round(time.Millisecond), 2*benchParents/took.Seconds(),
			(self1 - self0).Round(time.Millisecond), (cp1 - cp0).Round(time.Millisecond))
	}
	n := float64(b.N * benchParents)
	b.ReportMetric(n/elapsed.Seconds(), "parents/s")
	b.ReportMetric(2, "api-writes/parent")
	b.ReportMetric(float64(selfCPU)/float64(time.Millisecond)/n, "proc-cpu-ms/parent")
	b.ReportMetric(float64(cpCPU)/float64(time.Millisecond)/n, "kube-cpu-ms/parent")
}

func benchConverge(b *testing.B, workers int, backlog bool) {
	benchConvergeOver(b, workers, backlog, benchWebhook)
}

// benchConvergeOver is benchConverge with the hook served over transport.
func benchConvergeOver(b *testing.B, workers int, backlog bool, transport string) {
	b.StopTimer()
	var cfg allinone.Config
	cfg.Dispatcher.Workers, cfg.Applier.Workers = workers, workers
	var be *benchEnv
	if backlog {
		be = benchStartOver(b, cfg, transport)
	} else {
		be = benchSetupOver(b, cfg, transport)
	}
	var elapsed, selfCPU, cpCPU time.Duration
	var total benchAPIDelta
	var before, after benchCounters
	for i := 0; i < b.N; i++ {
		names := benchParentNames(fmt.Sprintf("r%d-p", i), benchParents)
		var start time.Time
		var created time.Duration
		var self0, cp0 time.Duration
		if backlog {
			if i > 0 {
				b.Fatal("backlog mode runs one iteration (use -benchtime 1x)")
			}
			if err := benchCreateWidgets(be.ns, names, 32); err != nil {
				b.Fatalf("create parents: %v", err)
			}
			time.Sleep(time.Second)
			before = be.snap(b)
			self0, cp0 = benchCPU()
			b.StartTimer()
			start = time.Now()
			be.createController(b)
		} else {
			before = be.snap(b)
			self0, cp0 = benchCPU()
			b.StartTimer()
			start = time.Now()
			if err := benchCreateWidgets(be.ns, names, 32); err != nil {
				b.Fatalf("create parents: %v", err)
			}
			created = time.Since(start)
		}
		be.waitConverged(b, names, 1, 3*time.Minute)
		took := time.Since(start)
		b.StopTimer()
		self1, cp1 := benchCPU()
		selfCPU += self1 - self0
		cpCPU += cp1 - cp0
		elapsed += took
		be.waitQuiet(b, time.Second, 60*time.Second)
		after = be.snap(b)
		d := benchDiffAPI(before.api, after.api)
		if total == nil {
			total = benchAPIDelta{}
		}
		for k, v := range d {
			total[k] += v
		}
		how := "backlog"
		if !backlog {
			how = fmt.Sprintf("created in %s", created.Round(time.Millisecond))
		}
		b.Logf("workers=%d: %d parents (%s) converged in %s; CPU until converged: this process %s, control plane %s; hook calls %d; %s; API requests: %s; stages:%s",
			workers, benchParents, how, took.Round(time.Millisecond),
			(self1 - self0).Round(time.Millisecond), (cp1 - cp0).Round(time.Millisecond),
			after.hookCalls-before.hookCalls, benchResults(before, after), d, benchStages(before.hists, after.hists))
	}
	n := float64(b.N * benchParents)
	b.ReportMetric(n/elapsed.Seconds(), "parents/s")
	// Per-parent figures from the last iteration (they do not depend on N).
	b.ReportMetric((after.writes-before.writes)/benchParents, "api-writes/parent")
	b.ReportMetric(float64(after.hookCalls-before.hookCalls)/benchParents, "hook-calls/parent")
	b.ReportMetric(float64(total["get"])/n, "gets/parent")
	b.ReportMetric(float64(total.writes())/n, "all-writes/parent")
	b.ReportMetric(float64(selfCPU)/float64(time.Millisecond)/n, "proc-cpu-ms/parent")
	b.ReportMetric(float64(cpCPU)/float64(time.Millisecond)/n, "kube-cpu-ms/parent")
}

// BenchmarkIdleLatency: with metabus idle, patch one parent's spec.version
// and time until its ConfigMap shows the new version, seen through a watch.
// p50-ms/p99-ms are timed from just before the patch request, so the patch
// round trip is included (an upper bound); watch-p50-ms/watch-p99-ms from
// the parent's update event to the child's, as a watcher sees them. 100
// changes, each after the previous one's echoes (child and status events)
// have settled.
func BenchmarkIdleLatency(b *testing.B) { benchIdleLatency(b, benchWebhook) }

// BenchmarkHookTransport: the same hook served over HTTP and over NATS
// (through the dispatcher's bus connection, and through a connection of
// its own for hooks), in one run: idle change-to-child latency (BenchmarkIdleLatency's p50-ms and
// p99-ms) and convergence throughput (BenchmarkConvergeParents'
// live/workers=16: 500 parents created 32 at a time, parents/s). Printed,
// never asserted.
func BenchmarkHookTransport(b *testing.B) {
	for _, transport := range []string{benchWebhook, benchNATS, benchNATSOwnConn} {
		b.Run("idle/"+transport, func(b *testing.B) { benchIdleLatency(b, transport) })
	}
	for _, transport := range []string{benchWebhook, benchNATS, benchNATSOwnConn} {
		b.Run("converge/"+transport, func(b *testing.B) { benchConvergeOver(b, 16, false, transport) })
	}
}

// benchIdleLatency is BenchmarkIdleLatency with the hook served over
// transport.
func benchIdleLatency(b *testing.B, transport string) {
	const changes = 100
	b.StopTimer()
	be := benchSetupOver(b, allinone.Config{}, transport)
	ctx := context.Background()
	names := []string{"latency"}
	if err := benchCreateWidgets(be.ns, names, 1); err != nil {
		b.Fatal(err)
	}
	be.waitConverged(b, names, 1, 60*time.Second)
	be.waitQuiet(b, time.Second, 30*time.Second)
	var lat, patch, watched []time.Duration
	before := be.snap(b)
	version := int64(1)
	for i := 0; i < b.N; i++ {
		for c := 0; c < changes; c++ {
			version++
			want := fmt.Sprint(version)
			body := []byte(fmt.Sprintf(`{"spec":{"version":%d}}`, version))
			b.StartTimer()
			start := time.Now()
			if _, err := dyn.Resource(widgetsGVR).Namespace(be.ns).Patch(ctx, "latency", types.MergePatchType, body, metav1.PatchOptions{}); err != nil {
				b.Fatalf("patch: %v", err)
			}
			patched := time.Since(start)
			deadline := time.After(30 * time.Second)
			var seen time.Time
			for seen.IsZero() {
				be.track.mu.Lock()
				seen = be.track.firstSeen["latency-a"][want]
				be.track.mu.Unlock()
				if !seen.IsZero() {
					break
				}
				select {
				case <-be.track.changed:
				case <-time.After(5 * time.Millisecond):
				case <-deadline:
					b.Fatalf("child never reached version %s", want)
				}
			}
			b.StopTimer()
			lat = append(lat, seen.Sub(start))
			patch = append(patch, patched)
			be.track.mu.Lock()
			if changed, ok := be.track.specSeen["latency"][version]; ok {
				watched = append(watched, seen.Sub(changed))
			}
			be.track.mu.Unlock()
			be.waitConverged(b, names, version, 30*time.Second)
			be.waitQuiet(b, 150*time.Millisecond, 10*time.Second)
		}
	}
	after := be.snap(b)
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	sort.Slice(patch, func(i, j int) bool { return patch[i] < patch[j] })
	sort.Slice(watched, func(i, j int) bool { return watched[i] < watched[j] })
	n := float64(len(lat))
	b.ReportMetric(benchPercentile(lat, 0.50), "p50-ms")
	b.ReportMetric(benchPercentile(lat, 0.99), "p99-ms")
	b.ReportMetric(benchPercentile(watched, 0.50), "watch-p50-ms")
	b.ReportMetric(benchPercentile(watched, 0.99), "watch-p99-ms")
	b.ReportMetric(benchPercentile(patch, 0.50), "patch-p50-ms")
	b.ReportMetric(float64(after.hookCalls-before.hookCalls)/n, "hook-calls/change")
	b.ReportMetric((after.writes-before.writes)/n, "api-writes/change")
	b.ReportMetric(0, "ns/op")
	b.Logf("%d changes: latency min %.1fms p50 %.1fms p90 %.1fms p99 %.1fms max %.1fms (patch request p50 %.1fms; event to event p50 %.1fms p99 %.1fms); hook calls %d; %s; API requests: %s; stages:%s",
		len(lat), benchPercentile(lat, 0), benchPercentile(lat, 0.5), benchPercentile(lat, 0.9), benchPercentile(lat, 0.99), benchPercentile(lat, 1),
		benchPercentile(patch, 0.5), benchPercentile(watched, 0.5), benchPercentile(watched, 0.99), after.hookCalls-before.hookCalls, benchResults(before, after), benchDiffAPI(before.api, after.api),
		benchStages(before.hists, after.hists))
}

// BenchmarkNoopResync: 200 converged parents are synced again with
// nothing to change; the target is 0 API calls per no-op sync
// (upstream: 1 GET per parent). Two triggers:
//
//   - cache-flush: the watcher's own periodic resync (--cache-flush-interval,
//     15s here), the path that repairs lost messages;
//   - annotation: the benchmark patches an annotation on every parent (the
//     hook ignores it), a real parent event whose sync must write nothing.
//     The patches are the benchmark's own requests and are not counted.
//
// gets/sync and writes/sync divide metabus's API requests (watches and
// discovery excluded) by the dispatcher's syncs in the window. The cache
// flush also resyncs the warm-up parent (201 syncs).
func BenchmarkNoopResync(b *testing.B) {
	const parents = 200
	run := func(b *testing.B, cfg allinone.Config, trigger func(b *testing.B, be *benchEnv, names []string) time.Time) {
		b.StopTimer()
		be := benchSetup(b, cfg)
		names := benchParentNames("p", parents)
		if err := benchCreateWidgets(be.ns, names, 32); err != nil {
			b.Fatal(err)
		}
		be.waitConverged(b, names, 1, 2*time.Minute)
		be.waitQuiet(b, time.Second, 60*time.Second)
		var syncs, hooks, noops float64
		total := benchAPIDelta{}
		var took time.Duration
		for i := 0; i < b.N; i++ {
			before := be.snap(b)
			b.StartTimer()
			start := trigger(b, be, names)
			be.waitQuiet(b, time.Second, 60*time.Second)
			// Every sync publishes a desired state: wait for the applier
			// to have handled as many (a stalled partition shows here).
			caughtUp := time.Now()
			for {
				c := be.snap(b)
				if c.applies-before.applies >= c.syncs-before.syncs {
					break
				}
				if time.Since(caughtUp) > 90*time.Second {
					b.Logf("applier still %.0f desired states behind after 90s", (c.syncs-before.syncs)-(c.applies-before.applies))
					break
				}
				time.Sleep(50 * time.Millisecond)
			}
			if wait := time.Since(caughtUp); wait > time.Second {
				b.Logf("the applier caught up with the dispatcher %s after metabus looked idle", wait.Round(time.Millisecond))
				be.waitQuiet(b, time.Second, 60*time.Second)
			}
			b.StopTimer()
			took += time.Since(start) - time.Second
			after := be.snap(b)
			d := benchDiffAPI(before.api, after.api)
			for k, v := range d {
				total[k] += v
			}
			syncs += after.syncs - before.syncs
			hooks += float64(after.hookCalls - before.hookCalls)
			noops += after.noops - before.noops
			b.Logf("%d parents in ~%s: %d hook calls; %s; API requests: %s",
				parents, (time.Since(start) - time.Second).Round(time.Millisecond), after.hookCalls-before.hookCalls,
				benchResults(before, after), d)
		}
		if syncs == 0 {
			b.Fatal("no syncs happened: the trigger did not work")
		}
		b.ReportMetric(float64(total["get"])/syncs, "gets/sync")
		b.ReportMetric(float64(total["list"])/syncs, "lists/sync")
		b.ReportMetric(float64(total.writes())/syncs, "writes/sync")
		b.ReportMetric(syncs/float64(b.N), "syncs")
		b.ReportMetric(hooks/syncs, "hook-calls/sync")
		b.ReportMetric(noops/syncs, "noop-applies/sync")
		b.ReportMetric(float64(b.N*parents)/took.Seconds(), "parents/s")
		b.ReportMetric(0, "ns/op")
	}
	b.Run("cache-flush", func(b *testing.B) {
		var cfg allinone.Config
		cfg.Watcher.CacheFlushInterval = 15 * time.Second
		run(b, cfg, func(b *testing.B, be *benchEnv, names []string) time.Time {
			// Wait for the next flush to enqueue every parent.
			resyncs := func() float64 {
				return be.inst.counter(b, "metabus_watcher_work_items_total", map[string]string{"reason": "resync"})
			}
			base := resyncs()
			deadline := time.Now().Add(45 * time.Second)
			var start time.Time
			for {
				n := resyncs() - base
				if n > 0 && start.IsZero() {
					start = time.Now()
				}
				if n >= float64(len(names)) {
					return start
				}
				if time.Now().After(deadline) {
					b.Fatalf("the cache flush enqueued %.0f of %d parents in 45s", n, len(names))
				}
				time.Sleep(5 * time.Millisecond)
			}
		})
	})
	b.Run("annotation", func(b *testing.B) {
		var round atomic.Int64
		run(b, allinone.Config{}, func(b *testing.B, be *benchEnv, names []string) time.Time {
			start := time.Now()
			patch := []byte(fmt.Sprintf(`{"metadata":{"annotations":{"bench.metabus.dev/touch":"%d"}}}`, round.Add(1)))
			if err := benchForEach(names, 16, func(name string) error {
				_, err := dyn.Resource(widgetsGVR).Namespace(be.ns).Patch(context.Background(), name, types.MergePatchType, patch, metav1.PatchOptions{})
				return err
			}); err != nil {
				b.Fatalf("annotate parents: %v", err)
			}
			return start
		})
	})
}
