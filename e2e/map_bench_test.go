package e2e

// The MapController benchmark of issue #11 (see bench_test.go for how to
// run the e2e benchmarks and how metabus's API requests are counted).

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/tools/cache"

	"github.com/metabus/metabus/internal/allinone"
	"github.com/metabus/metabus/pkg/api/v1alpha1"
	"github.com/metabus/metabus/pkg/bus"
)

// mapBenchInputs is the size of BenchmarkMapController's one parent, a flag
// so that CI can run it small: go test ./e2e -bench MapController -map-inputs 200.
var mapBenchInputs = flag.Int("map-inputs", 5000, "inputs (ConfigMaps) of BenchmarkMapController's parent")

// mapBenchGVR is the benchmark's parent resource, a CRD of its own (created
// at run time, see mapBenchCRD) so that no other test's controller ever
// selects its objects.
var mapBenchGVR = schema.GroupVersionResource{Group: "test.metabus.dev", Version: "v1", Resource: "mapbenchsets"}

const (
	mapBenchInputLabel  = "bench.metabus.dev/input"  // on every input ConfigMap ("yes")
	mapBenchOutputLabel = "bench.metabus.dev/output" // on every output ConfigMap (the mode)
	mapBenchParentName  = "set"
	mapBenchKeyLabel    = "metacontroller.k8s.io/map-key" // mapctl.MapKeyLabel, spelt out: the test checks the product
)

// BenchmarkMapController (issue #11): one parent selecting N input
// ConfigMaps (-map-inputs, default 5,000), each mapped to one output
// ConfigMap (data.from = the input's name, data.value = the input's
// data.value), InPlace. Two ways of doing that same work:
//
//   - map: a MapController, opted into echo suppression
//     (bus.SuppressEchoesAnnotation: its hook is a fixpoint of its own
//     writes); its map hook is called once per input, and
//     metabus computes the parent's status (inputs.configmaps.total,
//     outputs.configmaps.total, observedGeneration).
//   - composite-all: one CompositeController whose customize hook selects
//     the N inputs as related objects and whose sync hook returns all N
//     children at once (and status {inputs, outputs} counted by the hook).
//
// Each mode measures, with the inputs and the parent created first:
//
//	(a) converge: from creating the controller until every output exists
//	    with the right content and the parent's status counts N inputs
//	    and N outputs (seen through a watch): seconds, hook calls, bytes
//	    of the hook requests, metabus's API writes by verb, CPU;
//	(b) one change: once metabus is idle, patch one input's data.value;
//	    the time until its output shows it, hook calls, writes. For map
//	    the hook must be called exactly once, for that input's key: that
//	    is the correctness property, so anything else fails the
//	    benchmark (b.Errorf); times are never asserted;
//	(c) one delete: delete one input; the time until its output is gone
//	    and the status counts N-1 of each, writes, and (map) the status
//	    syncs: the per-parent items metabus computes the status in.
//
// Costs are counted once metabus is idle again, so they include the
// trailing syncs the writes' own events cause. proc-cpu is this whole
// process (metabus, the hook server and its JSON decoding, the
// benchmark's watch) and kube-cpu the control plane's, until converged.
func BenchmarkMapController(b *testing.B) {
	n := *mapBenchInputs
	if n < 2 {
		b.Fatalf("-map-inputs %d: need at least 2", n)
	}
	mapBenchCRD(b)
	var results []*mapBenchResult
	for _, mode := range []string{"map", "composite-all"} {
		b.Run(mode, func(b *testing.B) {
			if b.N > 1 {
				b.Logf("b.N=%d: the benchmark sizes its own work and runs its body once", b.N)
			}
			r := runMapBench(b, mode, n)
			results = append(results, r)
			r.report(b)
		})
	}
	if len(results) > 0 {
		// A parent benchmark's log is not printed (only its
		// sub-benchmarks' are): the comparison goes to stdout.
		mapBenchPrintf("BenchmarkMapController: MapController vs one CompositeController, %d inputs (compare ratios: the machine's cores are shared):\n%s",
			n, mapBenchTable(results))
	}
}

// mapBenchResult is what one mode measured.
type mapBenchResult struct {
	mode   string
	inputs int

	converge                  time.Duration
	convergeCalls             int64 // map or sync hook calls
	convergeCustomize         int64
	convergeBytes, maxReqBody int64 // request bodies of the map or sync hook
	convergeAPI               benchAPIDelta
	convergeCPU, convergeKube time.Duration
	convergeStatusSyncs       string
	callsPerKey               string

	change             time.Duration
	changeCalls        int64
	changeBytes        int64
	changeAPI          benchAPIDelta
	changeStatusSyncs  string
	deleteTook         time.Duration
	deleteCalls        int64
	deleteAPI          benchAPIDelta
	deleteStatusSyncs  string
	deleteStatusWrites int64
}

func runMapBench(b *testing.B, mode string, n int) *mapBenchResult {
	b.Helper()
	ctx := context.Background()
	r := &mapBenchResult{mode: mode, inputs: n}
	be := &benchEnv{api: newBenchAPICounter()}
	be.ns = benchNamespace(b)
	hook := newMapBenchHook(&be.hookCalls)
	srv := httptest.NewServer(hook)
	b.Cleanup(srv.Close)
	be.hookURL = srv.URL
	be.inst = benchMetabus(b, allinone.Config{}, be.api)
	tr := newMapBenchTracker(b, be.ns)

	// The inputs and the parent exist before the controller.
	names := make([]string, n)
	for i := range names {
		names[i] = fmt.Sprintf("in-%05d", i)
	}
	start := time.Now()
	if err := benchForEach(names, 32, func(name string) error {
		_, err := kube.CoreV1().ConfigMaps(be.ns).Create(ctx, &corev1.ConfigMap{
			ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{mapBenchInputLabel: "yes"}},
			Data:       map[string]string{"value": "1"},
		}, metav1.CreateOptions{})
		return err
	}); err != nil {
		b.Fatalf("create inputs: %v", err)
	}
	mapBenchPrintf("%s: created %d input ConfigMaps in %s", mode, n, time.Since(start).Round(time.Millisecond))
	inputSelector := map[string]any{"matchLabels": map[string]any{mapBenchInputLabel: "yes"}}
	spec := map[string]any{"selector": inputSelector}
	if mode == "composite-all" {
		// A CompositeController's spec.selector selects (and adopts) its
		// children: the inputs are named by the customize hook instead.
		spec = map[string]any{
			"selector":      map[string]any{"matchLabels": map[string]any{mapBenchOutputLabel: mode}},
			"inputSelector": inputSelector,
		}
	}
	parent := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": mapBenchGVR.GroupVersion().String(), "kind": "MapBenchSet",
		"metadata": map[string]any{"name": mapBenchParentName},
		"spec":     spec,
	}}
	if _, err := dyn.Resource(mapBenchGVR).Namespace(be.ns).Create(ctx, parent, metav1.CreateOptions{}); err != nil {
		b.Fatalf("create parent: %v", err)
	}
	time.Sleep(time.Second) // let the creates' echoes settle

	want := make(map[string]string, n) // output name → "from/value"
	for _, name := range names {
		want["out-"+name] = name + "/1"
	}
	statusOK := func(total int64) func(p *unstructured.Unstructured) string {
		return func(p *unstructured.Unstructured) string {
			return mapBenchStatusPending(mode, p, total)
		}
	}
	timeout := 3*time.Minute + time.Duration(n)*60*time.Millisecond

	// (a) converge.
	before := be.snap(b)
	hook0 := hook.stats()
	self0, kube0 := benchCPU()
	start = time.Now()
	mapBenchController(b, be, mode)
	tr.wait(b, mode+" (a) converge", timeout, want, statusOK(int64(n)))
	r.converge = time.Since(start)
	self1, kube1 := benchCPU()
	r.convergeCPU, r.convergeKube = self1-self0, kube1-kube0
	be.waitQuiet(b, 2*time.Second, 3*time.Minute)
	after := be.snap(b)
	hook1 := hook.stats()
	r.convergeAPI = benchDiffAPI(before.api, after.api)
	r.convergeCalls = hook1.calls(mode) - hook0.calls(mode)
	r.convergeCustomize = hook1.byPath["/customize"] - hook0.byPath["/customize"]
	r.convergeBytes = hook1.bytes(mode) - hook0.bytes(mode)
	r.maxReqBody = hook1.maxBytes[mapBenchHookPath(mode)]
	r.convergeStatusSyncs = mapBenchStatusSyncs(mode, before, after, r.convergeCalls)
	r.callsPerKey = mapBenchCallsPerKey(hook0.byKey, hook1.byKey)
	mapBenchPrintf("%s (a) converge: %s; hook calls %d (+%d customize), per map key: %s; API requests: %s; %s; stages:%s",
		mode, r.converge.Round(time.Millisecond), r.convergeCalls, r.convergeCustomize, r.callsPerKey, r.convergeAPI,
		benchResults(before, after), benchStages(before.hists, after.hists))
	if mode == "map" {
		// Every key called once at least; more shows as calls/input.
		if missing := n - len(hook1.byKey); missing > 0 {
			b.Errorf("map: %d of %d inputs never reached the map hook", missing, n)
		}
		if err := tr.checkKeyLabels(); err != nil {
			b.Errorf("map: %v", err)
		}
	}

	// (b) one input changes.
	changed := names[n/2]
	before, hook0 = be.snap(b), hook.stats()
	start = time.Now()
	if _, err := kube.CoreV1().ConfigMaps(be.ns).Patch(ctx, changed, types.MergePatchType,
		[]byte(`{"data":{"value":"2"}}`), metav1.PatchOptions{}); err != nil {
		b.Fatalf("patch input %s: %v", changed, err)
	}
	want["out-"+changed] = changed + "/2"
	tr.wait(b, mode+" (b) one change", timeout, want, statusOK(int64(n)))
	r.change = tr.seenAt("out-"+changed, changed+"/2").Sub(start)
	be.waitQuiet(b, 2*time.Second, 2*time.Minute)
	after, hook1 = be.snap(b), hook.stats()
	r.changeAPI = benchDiffAPI(before.api, after.api)
	r.changeCalls = hook1.calls(mode) - hook0.calls(mode)
	r.changeBytes = hook1.bytes(mode) - hook0.bytes(mode)
	r.changeStatusSyncs = mapBenchStatusSyncs(mode, before, after, r.changeCalls)
	mapBenchPrintf("%s (b) one input changed: output updated in %s; hook calls %d; API requests: %s; %s",
		mode, r.change.Round(time.Millisecond), r.changeCalls, r.changeAPI, benchResults(before, after))
	if mode == "map" {
		var called []string
		for key, c := range hook1.byKey {
			if d := c - hook0.byKey[key]; d != 0 {
				called = append(called, fmt.Sprintf("%s (input %s) ×%d", key, hook1.keyInput[key], d))
			}
		}
		sort.Strings(called)
		if r.changeCalls != 1 || len(called) != 1 || !strings.Contains(called[0], "(input "+changed+") ×1") {
			b.Errorf("map: one input (%s) changed: %d map hook calls, want exactly 1, for its key; keys called: %v",
				changed, r.changeCalls, called)
		}
	}

	// (c) one input is deleted: its output goes and the status counts it.
	deleted := names[1]
	before, hook0 = be.snap(b), hook.stats()
	start = time.Now()
	if err := kube.CoreV1().ConfigMaps(be.ns).Delete(ctx, deleted, metav1.DeleteOptions{}); err != nil {
		b.Fatalf("delete input %s: %v", deleted, err)
	}
	delete(want, "out-"+deleted)
	tr.wait(b, mode+" (c) one delete", timeout, want, statusOK(int64(n-1)))
	r.deleteTook = time.Since(start)
	be.waitQuiet(b, 2*time.Second, 2*time.Minute)
	after, hook1 = be.snap(b), hook.stats()
	r.deleteAPI = benchDiffAPI(before.api, after.api)
	r.deleteCalls = hook1.total() - hook0.total()
	r.deleteStatusSyncs = mapBenchStatusSyncs(mode, before, after, hook1.calls(mode)-hook0.calls(mode))
	r.deleteStatusWrites = mapBenchStatusWrites(r.deleteAPI)
	mapBenchPrintf("%s (c) one input deleted: status and outputs at %d in %s; hook calls %d; status syncs %s; API requests: %s; %s",
		mode, n-1, r.deleteTook.Round(time.Millisecond), r.deleteCalls, r.deleteStatusSyncs, r.deleteAPI, benchResults(before, after))
	return r
}

// report prints one mode's figures and reports the key ones.
func (r *mapBenchResult) report(b *testing.B) {
	b.ReportMetric(r.converge.Seconds(), "converge-s")
	b.ReportMetric(float64(r.convergeCalls), "hook-calls")
	if r.mode == "map" {
		b.ReportMetric(float64(r.convergeCalls), "map-calls")
	}
	b.ReportMetric(float64(r.convergeAPI.writes()), "writes")
	b.ReportMetric(r.convergeCPU.Seconds(), "proc-cpu-s")
	b.ReportMetric(r.convergeKube.Seconds(), "kube-cpu-s")
	if r.convergeCalls > 0 {
		b.ReportMetric(float64(r.convergeBytes)/float64(r.convergeCalls), "hook-req-bytes")
	}
	b.ReportMetric(float64(r.maxReqBody), "hook-req-max-bytes")
	b.ReportMetric(float64(r.changeCalls), "one-change-calls")
	b.ReportMetric(float64(r.change)/float64(time.Millisecond), "one-change-ms")
	b.ReportMetric(float64(r.changeAPI.writes()), "one-change-writes")
	b.ReportMetric(float64(r.deleteTook)/float64(time.Millisecond), "one-delete-ms")
	b.ReportMetric(float64(r.deleteAPI.writes()), "one-delete-writes")
	b.ReportMetric(0, "ns/op")
	// The testing package keeps 10 lines of a benchmark's log: the
	// summary fits, the details went to stdout.
	b.Logf("%d inputs:\n"+
		"\t(a) converge %.1fs: %s hook calls (per map key: %s), request %s mean / %s max; writes %s; status syncs %s; CPU proc %.1fs kube %.1fs\n"+
		"\t(b) one change: output in %.0fms; %d hook calls (%s); writes %s; status syncs %s\n"+
		"\t(c) one delete: status at N-1 in %.0fms; %d hook calls; writes %s, %d on the status; status syncs %s",
		r.inputs, r.converge.Seconds(), mapBenchCalls(r), r.callsPerKey, mapBenchBytes(mapBenchMean(r.convergeBytes, r.convergeCalls)),
		mapBenchBytes(r.maxReqBody), mapBenchWrites(r.convergeAPI), r.convergeStatusSyncs, r.convergeCPU.Seconds(), r.convergeKube.Seconds(),
		float64(r.change)/float64(time.Millisecond), r.changeCalls, mapBenchBytes(r.changeBytes), mapBenchWrites(r.changeAPI), r.changeStatusSyncs,
		float64(r.deleteTook)/float64(time.Millisecond), r.deleteCalls, mapBenchWrites(r.deleteAPI), r.deleteStatusWrites, r.deleteStatusSyncs)
}

// mapBenchPrintf prints details to stdout, where they are not trimmed.
func mapBenchPrintf(format string, args ...any) {
	fmt.Printf(strings.TrimRight(format, "\n")+"\n", args...)
}

func mapBenchMean(total, n int64) int64 {
	if n == 0 {
		return 0
	}
	return total / n
}

func mapBenchCalls(r *mapBenchResult) string {
	if r.convergeCustomize > 0 {
		return fmt.Sprintf("%d (+%d customize)", r.convergeCalls, r.convergeCustomize)
	}
	return fmt.Sprint(r.convergeCalls)
}

// mapBenchCallsPerKey is the distribution of map calls per key between two
// snapshots, e.g. "1×4990 2×10" (4,990 keys called once, 10 twice); "-"
// without map calls.
func mapBenchCallsPerKey(before, after map[string]int64) string {
	dist := map[int64]int{}
	for key, c := range after {
		if d := c - before[key]; d > 0 {
			dist[d]++
		}
	}
	if len(dist) == 0 {
		return "-"
	}
	counts := make([]int64, 0, len(dist))
	for c := range dist {
		counts = append(counts, c)
	}
	sort.Slice(counts, func(i, j int) bool { return counts[i] < counts[j] })
	parts := make([]string, len(counts))
	for i, c := range counts {
		parts[i] = fmt.Sprintf("%d×%d", c, dist[c])
	}
	return strings.Join(parts, " ")
}

// mapBenchTable lines the results up, one column per mode.
func mapBenchTable(rs []*mapBenchResult) string {
	rows := []struct {
		name string
		f    func(r *mapBenchResult) string
	}{
		{"(a) converge", func(r *mapBenchResult) string { return fmt.Sprintf("%.1fs", r.converge.Seconds()) }},
		{"    hook calls", mapBenchCalls},
		{"    map calls per key", func(r *mapBenchResult) string { return r.callsPerKey }},
		{"    hook request bytes, total", func(r *mapBenchResult) string { return mapBenchBytes(r.convergeBytes) }},
		{"    hook request bytes, largest", func(r *mapBenchResult) string { return mapBenchBytes(r.maxReqBody) }},
		{"    API writes", func(r *mapBenchResult) string { return mapBenchWrites(r.convergeAPI) }},
		{"    API reads (get/list)", func(r *mapBenchResult) string {
			return fmt.Sprintf("%d/%d", r.convergeAPI["get"], r.convergeAPI["list"])
		}},
		{"    status syncs", func(r *mapBenchResult) string { return r.convergeStatusSyncs }},
		{"    CPU proc / kube", func(r *mapBenchResult) string {
			return fmt.Sprintf("%.1fs / %.1fs", r.convergeCPU.Seconds(), r.convergeKube.Seconds())
		}},
		{"(b) one change, output updated", func(r *mapBenchResult) string {
			return fmt.Sprintf("%.0fms", float64(r.change)/float64(time.Millisecond))
		}},
		{"    hook calls", func(r *mapBenchResult) string { return fmt.Sprint(r.changeCalls) }},
		{"    hook request bytes", func(r *mapBenchResult) string { return mapBenchBytes(r.changeBytes) }},
		{"    API writes", func(r *mapBenchResult) string { return mapBenchWrites(r.changeAPI) }},
		{"    status syncs", func(r *mapBenchResult) string { return r.changeStatusSyncs }},
		{"(c) one delete, status at N-1", func(r *mapBenchResult) string {
			return fmt.Sprintf("%.0fms", float64(r.deleteTook)/float64(time.Millisecond))
		}},
		{"    hook calls", func(r *mapBenchResult) string { return fmt.Sprint(r.deleteCalls) }},
		{"    API writes (status)", func(r *mapBenchResult) string {
			return fmt.Sprintf("%s (%d)", mapBenchWrites(r.deleteAPI), r.deleteStatusWrites)
		}},
		{"    status syncs", func(r *mapBenchResult) string { return r.deleteStatusSyncs }},
	}
	var sb strings.Builder
	fmt.Fprintf(&sb, "\t%-32s", "")
	for _, r := range rs {
		fmt.Fprintf(&sb, " | %-30s", r.mode)
	}
	sb.WriteString("\n")
	for _, row := range rows {
		fmt.Fprintf(&sb, "\t%-32s", row.name)
		for _, r := range rs {
			fmt.Fprintf(&sb, " | %-30s", row.f(r))
		}
		sb.WriteString("\n")
	}
	return strings.TrimRight(sb.String(), "\n")
}

func mapBenchBytes(n int64) string {
	switch {
	case n >= 10<<20:
		return fmt.Sprintf("%.0f MiB", float64(n)/(1<<20))
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	case n >= 10<<10:
		return fmt.Sprintf("%.0f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d B", n)
}

// mapBenchWrites is "total (c=…, u=…, p=…, d=…)".
func mapBenchWrites(d benchAPIDelta) string {
	return fmt.Sprintf("%d (c=%d u=%d p=%d d=%d)", d.writes(), d["create"], d["update"], d["patch"], d["delete"])
}

// mapBenchStatusWrites counts the writes on a status subresource.
func mapBenchStatusWrites(d benchAPIDelta) int64 {
	var n int64
	for k, v := range d {
		verb, res, ok := strings.Cut(k, " ")
		if ok && strings.HasSuffix(res, "/status") && (verb == "create" || verb == "update" || verb == "patch") {
			n += v
		}
	}
	return n
}

// mapBenchStatusSyncs counts the per-parent status computations of a
// MapController between two snapshots: the dispatcher's "status" hook
// (a local answer, no webhook) when its metrics say so, else the syncs
// that called no map hook (which also holds tombstone decisions and
// skipped items), marked "≤". A CompositeController's status comes from
// its sync hook: every hook call is one.
func mapBenchStatusSyncs(mode string, before, after benchCounters, hookCalls int64) string {
	if mode != "map" {
		return fmt.Sprintf("%d (in the sync hook)", hookCalls)
	}
	for key, h := range after.hists {
		if strings.HasPrefix(key, "dispatcher_hook_duration_seconds{") && strings.Contains(key, "hook=status") {
			return fmt.Sprintf("%.0f", h.count-before.hists[key].count)
		}
	}
	return fmt.Sprintf("≤%.0f (syncs without a map call)", (after.syncs-before.syncs)-float64(hookCalls))
}

// mapBenchStatusPending says why the parent's status is not yet converged
// at total inputs and outputs ("" when it is).
func mapBenchStatusPending(mode string, p *unstructured.Unstructured, total int64) string {
	if p == nil {
		return "parent not seen"
	}
	if mode == "map" {
		in, _ := nestedInt(p, "status", "inputs", "configmaps", "total")
		out, _ := nestedInt(p, "status", "outputs", "configmaps", "total")
		og, _ := nestedInt(p, "status", "observedGeneration")
		if in != total || out != total || og != p.GetGeneration() {
			return fmt.Sprintf("status inputs.configmaps.total=%d outputs.configmaps.total=%d observedGeneration=%d (generation %d), want %d",
				in, out, og, p.GetGeneration(), total)
		}
		return ""
	}
	in, _ := nestedInt(p, "status", "inputs")
	out, _ := nestedInt(p, "status", "outputs")
	if in != total || out != total {
		return fmt.Sprintf("status inputs=%d outputs=%d, want %d", in, out, total)
	}
	return ""
}

// mapBenchController creates the mode's controller, served by be's metabus.
func mapBenchController(b *testing.B, be *benchEnv, mode string) {
	b.Helper()
	parentRes := map[string]any{"apiVersion": mapBenchGVR.GroupVersion().String(), "resource": mapBenchGVR.Resource}
	configMaps := map[string]any{"apiVersion": "v1", "resource": "configmaps", "updateStrategy": map[string]any{"method": "InPlace"}}
	hook := func(path string) map[string]any {
		return map[string]any{"webhook": map[string]any{"url": be.hookURL + path, "timeout": "30s"}}
	}
	if mode == "composite-all" {
		createController(b, be.inst, compositeKind, "mapbench-composite-all", map[string]any{
			"parentResource": parentRes,
			"childResources": []any{configMaps},
			"hooks":          map[string]any{"sync": hook("/sync"), "customize": hook("/customize")},
		})
		return
	}
	// createController's table has no MapController row (it is the tests'
	// own, and the kinds contract tests do not cover this kind yet).
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": v1alpha1.GroupVersion.String(),
		"kind":       v1alpha1.MapControllerKind,
		"metadata":   map[string]any{"name": "mapbench-map"},
		"spec": map[string]any{
			"parentResource":  parentRes,
			"inputResources":  []any{map[string]any{"apiVersion": "v1", "resource": "configmaps"}},
			"outputResources": []any{configMaps},
			"hooks":           map[string]any{"map": hook("/map")},
		},
	}}
	u.SetLabels(be.inst.label())
	// The benchmark's map hook is a pure function of its input, a fixpoint
	// of its own writes: it opts into echo suppression, so one change is
	// one call (without it, the output update it causes is shown to the
	// hook once more, as upstream's contract has it).
	u.SetAnnotations(map[string]string{bus.SuppressEchoesAnnotation: "true"})
	out, err := dyn.Resource(v1alpha1.MapControllerGVR).Create(context.Background(), u, metav1.CreateOptions{})
	if err != nil {
		b.Fatalf("create MapController: %v", err)
	}
	b.Cleanup(func() {
		_ = dyn.Resource(v1alpha1.MapControllerGVR).Delete(context.Background(), out.GetName(), metav1.DeleteOptions{})
	})
}

// mapBenchCRD creates the parent CRD (namespaced, status subresource, any
// spec) unless it exists, and waits until it is served.
func mapBenchCRD(b *testing.B) {
	b.Helper()
	ctx := context.Background()
	crdGVR := schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}
	preserve := map[string]any{"type": "object", "x-kubernetes-preserve-unknown-fields": true}
	crd := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
		"metadata": map[string]any{"name": mapBenchGVR.Resource + "." + mapBenchGVR.Group},
		"spec": map[string]any{
			"group": mapBenchGVR.Group,
			"names": map[string]any{"kind": "MapBenchSet", "plural": mapBenchGVR.Resource, "singular": "mapbenchset"},
			"scope": "Namespaced",
			"versions": []any{map[string]any{
				"name": mapBenchGVR.Version, "served": true, "storage": true,
				"schema": map[string]any{"openAPIV3Schema": map[string]any{
					"type":       "object",
					"properties": map[string]any{"spec": preserve, "status": preserve},
				}},
				"subresources": map[string]any{"status": map[string]any{}},
			}},
		},
	}}
	if _, err := dyn.Resource(crdGVR).Create(ctx, crd, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		b.Fatalf("create the parent CRD: %v", err)
	}
	eventually(b, 60*time.Second, "the parent CRD to be served", func() error {
		_, err := dyn.Resource(mapBenchGVR).Namespace(metav1.NamespaceDefault).List(ctx, metav1.ListOptions{Limit: 1})
		return err
	})
}

// mapBenchHookPath is the path of the hook that does the mode's mapping.
func mapBenchHookPath(mode string) string {
	if mode == "map" {
		return "/map"
	}
	return "/sync"
}

// mapBenchHook serves /map (MapController), /customize and /sync
// (CompositeController) and counts calls and request bytes by path, and
// map calls by map key.
type mapBenchHook struct {
	all *atomic.Int64 // every call (benchEnv.hookCalls, which waitQuiet watches)

	mu       sync.Mutex
	byPath   map[string]int64
	bytes    map[string]int64
	maxBytes map[string]int64
	byKey    map[string]int64
	keyInput map[string]string // map key → input name
}

func newMapBenchHook(all *atomic.Int64) *mapBenchHook {
	return &mapBenchHook{all: all, byPath: map[string]int64{}, bytes: map[string]int64{},
		maxBytes: map[string]int64{}, byKey: map[string]int64{}, keyInput: map[string]string{}}
}

func (h *mapBenchHook) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	var req map[string]any
	if err := json.Unmarshal(body, &req); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	h.all.Add(1)
	size := int64(len(body))
	h.mu.Lock()
	h.byPath[r.URL.Path]++
	h.bytes[r.URL.Path] += size
	h.maxBytes[r.URL.Path] = max(h.maxBytes[r.URL.Path], size)
	if r.URL.Path == "/map" {
		key, _ := req["mapKey"].(string)
		h.byKey[key]++
		if in, ok := req["input"].(map[string]any); ok {
			h.keyInput[key] = (&unstructured.Unstructured{Object: in}).GetName()
		}
	}
	h.mu.Unlock()
	var resp any
	switch r.URL.Path {
	case "/map":
		resp = mapBenchMap(req)
	case "/customize":
		resp = mapBenchCustomize(req)
	case "/sync":
		resp = mapBenchSync(req)
	default:
		http.NotFound(w, r)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(resp)
}

// mapBenchOutput is the one output of an input.
func mapBenchOutput(mode string, input *unstructured.Unstructured) map[string]any {
	value := nestedString(input, "data", "value")
	return map[string]any{
		"apiVersion": "v1", "kind": "ConfigMap",
		"metadata": map[string]any{
			"name":   "out-" + input.GetName(),
			"labels": map[string]any{mapBenchOutputLabel: mode},
		},
		"data": map[string]any{"from": input.GetName(), "value": value},
	}
}

func mapBenchMap(req map[string]any) any {
	in, _ := req["input"].(map[string]any)
	if in == nil {
		return map[string]any{"outputs": []any{}}
	}
	return map[string]any{"outputs": []any{mapBenchOutput("map", &unstructured.Unstructured{Object: in})}}
}

func mapBenchCustomize(req map[string]any) any {
	parent := &unstructured.Unstructured{Object: req["parent"].(map[string]any)}
	sel, _, _ := unstructured.NestedFieldNoCopy(parent.Object, "spec", "inputSelector")
	return map[string]any{"relatedResources": []any{map[string]any{
		"apiVersion": "v1", "resource": "configmaps", "labelSelector": sel,
	}}}
}

func mapBenchSync(req map[string]any) any {
	rel, _ := req["related"].(map[string]any)["ConfigMap.v1"].(map[string]any)
	children := make([]any, 0, len(rel))
	for _, obj := range rel {
		if o, ok := obj.(map[string]any); ok {
			children = append(children, mapBenchOutput("composite-all", &unstructured.Unstructured{Object: o}))
		}
	}
	return map[string]any{
		"status":   map[string]any{"inputs": len(rel), "outputs": len(children)},
		"children": children,
	}
}

// mapBenchHookStats is a copy of the hook's counters.
type mapBenchHookStats struct {
	byPath, bytesByPath, maxBytes, byKey map[string]int64
	keyInput                             map[string]string
}

func (h *mapBenchHook) stats() mapBenchHookStats {
	h.mu.Lock()
	defer h.mu.Unlock()
	cp := func(m map[string]int64) map[string]int64 {
		out := make(map[string]int64, len(m))
		for k, v := range m {
			out[k] = v
		}
		return out
	}
	ki := make(map[string]string, len(h.keyInput))
	for k, v := range h.keyInput {
		ki[k] = v
	}
	return mapBenchHookStats{byPath: cp(h.byPath), bytesByPath: cp(h.bytes), maxBytes: cp(h.maxBytes), byKey: cp(h.byKey), keyInput: ki}
}

func (s mapBenchHookStats) calls(mode string) int64 { return s.byPath[mapBenchHookPath(mode)] }
func (s mapBenchHookStats) bytes(mode string) int64 { return s.bytesByPath[mapBenchHookPath(mode)] }

func (s mapBenchHookStats) total() int64 {
	var n int64
	for _, v := range s.byPath {
		n += v
	}
	return n
}

// mapBenchTracker follows the namespace's outputs and the parent through a
// watch (the benchmark's own client: not counted).
type mapBenchTracker struct {
	mu        sync.Mutex
	outputs   map[string]string    // output name → "from/value"
	keyed     map[string]bool      // output name → has a map-key label
	firstSeen map[string]time.Time // output name + "=" + "from/value" → first seen
	parent    *unstructured.Unstructured
	changed   chan struct{}
	ns        string
}

func newMapBenchTracker(b *testing.B, ns string) *mapBenchTracker {
	b.Helper()
	tr := &mapBenchTracker{outputs: map[string]string{}, keyed: map[string]bool{},
		firstSeen: map[string]time.Time{}, changed: make(chan struct{}, 1), ns: ns}
	outputs := dynamicinformer.NewFilteredDynamicSharedInformerFactory(dyn, 0, ns, func(o *metav1.ListOptions) {
		o.LabelSelector = mapBenchOutputLabel
	})
	parents := dynamicinformer.NewFilteredDynamicSharedInformerFactory(dyn, 0, ns, nil)
	onOutput := func(obj any) {
		now := time.Now()
		u, ok := obj.(*unstructured.Unstructured)
		if !ok {
			return
		}
		v := nestedString(u, "data", "from") + "/" + nestedString(u, "data", "value")
		tr.mu.Lock()
		tr.outputs[u.GetName()] = v
		tr.keyed[u.GetName()] = u.GetLabels()[mapBenchKeyLabel] != ""
		if _, ok := tr.firstSeen[u.GetName()+"="+v]; !ok {
			tr.firstSeen[u.GetName()+"="+v] = now
		}
		tr.mu.Unlock()
		tr.notify()
	}
	onOutputGone := func(obj any) {
		if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
			obj = d.Obj
		}
		if u, ok := obj.(*unstructured.Unstructured); ok {
			tr.mu.Lock()
			delete(tr.outputs, u.GetName())
			delete(tr.keyed, u.GetName())
			tr.mu.Unlock()
			tr.notify()
		}
	}
	onParent := func(obj any) {
		if u, ok := obj.(*unstructured.Unstructured); ok && u.GetName() == mapBenchParentName {
			tr.mu.Lock()
			tr.parent = u
			tr.mu.Unlock()
			tr.notify()
		}
	}
	for _, h := range []struct {
		inf      cache.SharedIndexInformer
		upsert   func(any)
		onDelete func(any)
	}{
		{outputs.ForResource(configMapsGVR).Informer(), onOutput, onOutputGone},
		{parents.ForResource(mapBenchGVR).Informer(), onParent, func(any) {}},
	} {
		up := h.upsert
		if _, err := h.inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
			AddFunc:    up,
			UpdateFunc: func(_, obj any) { up(obj) },
			DeleteFunc: h.onDelete,
		}); err != nil {
			b.Fatal(err)
		}
	}
	stop := make(chan struct{})
	b.Cleanup(func() { close(stop); outputs.Shutdown(); parents.Shutdown() })
	outputs.Start(stop)
	parents.Start(stop)
	outputs.WaitForCacheSync(stop)
	parents.WaitForCacheSync(stop)
	return tr
}

func (tr *mapBenchTracker) notify() {
	select {
	case tr.changed <- struct{}{}:
	default:
	}
}

// pending says what is not converged yet: outputs missing or with other
// content than want, outputs not wanted, the parent's status ("" when
// converged).
func (tr *mapBenchTracker) pending(want map[string]string, status func(*unstructured.Unstructured) string) string {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	wrong, extra := 0, 0
	for name, v := range want {
		if tr.outputs[name] != v {
			wrong++
		}
	}
	for name := range tr.outputs {
		if _, ok := want[name]; !ok {
			extra++
		}
	}
	st := status(tr.parent)
	if wrong == 0 && extra == 0 && st == "" {
		return ""
	}
	return fmt.Sprintf("%d of %d outputs missing or stale, %d not wanted; %s", wrong, len(want), extra, st)
}

// wait blocks until pending is "", failing the benchmark after timeout.
func (tr *mapBenchTracker) wait(b *testing.B, what string, timeout time.Duration, want map[string]string, status func(*unstructured.Unstructured) string) {
	b.Helper()
	deadline := time.After(timeout)
	progress := time.NewTicker(30 * time.Second)
	defer progress.Stop()
	start := time.Now()
	for {
		p := tr.pending(want, status)
		if p == "" {
			return
		}
		select {
		case <-tr.changed:
		case <-time.After(100 * time.Millisecond):
		case <-progress.C:
			mapBenchPrintf("%s: after %s: %s", what, time.Since(start).Round(time.Second), p)
		case <-deadline:
			b.Fatalf("%s: not converged after %s: %s; warnings: %s", what, timeout, p, mapBenchWarnings(tr.ns))
		}
	}
}

func (tr *mapBenchTracker) seenAt(name, value string) time.Time {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return tr.firstSeen[name+"="+value]
}

// checkKeyLabels: every output carries the map-key label.
func (tr *mapBenchTracker) checkKeyLabels() error {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	var without []string
	for name, ok := range tr.keyed {
		if !ok {
			without = append(without, name)
		}
	}
	if len(without) > 0 {
		sort.Strings(without)
		return fmt.Errorf("%d of %d outputs have no %s label, e.g. %s", len(without), len(tr.keyed), mapBenchKeyLabel, without[0])
	}
	return nil
}

// mapBenchWarnings lists the Warning Events of the benchmark's namespace
// and of the controllers (in "default"), to say why nothing converged.
func mapBenchWarnings(ns string) string {
	var out []string
	for _, evNS := range []string{ns, metav1.NamespaceDefault} {
		evs, err := kube.CoreV1().Events(evNS).List(context.Background(), metav1.ListOptions{})
		if err != nil {
			out = append(out, err.Error())
			continue
		}
		for _, e := range evs.Items {
			if e.Type == corev1.EventTypeWarning && (evNS == ns || strings.HasPrefix(e.InvolvedObject.Name, "mapbench-")) {
				out = append(out, fmt.Sprintf("%s %s/%s ×%d: %s", e.Reason, e.InvolvedObject.Kind, e.InvolvedObject.Name, e.Count, e.Message))
			}
		}
	}
	if len(out) == 0 {
		return "none"
	}
	if len(out) > 10 {
		out = append(out[:10], fmt.Sprintf("(%d more)", len(out)-10))
	}
	return strings.Join(out, "; ")
}
