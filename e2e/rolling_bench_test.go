package e2e

// The cost of a rolling update, end to end (see bench_test.go for how to
// run the e2e benchmarks and how metabus's API requests are counted).

import (
	"context"
	"fmt"
	"net/http/httptest"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/metabus/metabus/internal/allinone"
)

// benchRollPods is the size of the benchmark's RollSet.
const benchRollPods = 20

// BenchmarkRollout: one RollSet of 20 Pods (RollingRecreate, gated on the
// Ready condition) whose "kubelet" marks every new Pod Ready as soon as it
// appears, so the rollout runs as fast as metabus moves Pods.
//
//   - recreate: converge at image v1, then change the template and time the
//     rollout until the parent reports Updated True/OnLatestRevision for
//     its generation with all Pods Ready at the new image (seen through a
//     watch). Costs are per Pod moved and counted once metabus is idle
//     again, so they include the trailing syncs of the last move. ns/op is
//     one whole rollout.
//   - resync-after-rollout: the same, with resyncPeriodSeconds: 1 on the
//     controller; after the rollout, 50 periodic resyncs of the rolled-out
//     parent (nothing to change) are counted per sync.
//
// The "kubelet" (pods/status updates) and the benchmark's own reads use the
// benchmark's client and are not counted.
func BenchmarkRollout(b *testing.B) {
	b.Run("recreate", benchRollout)
	b.Run("resync-after-rollout", benchRolloutResync)
}

// rollBench is a benchEnv serving the RollSet controller (be.track is not
// used), with the namespace's Pod history and a "kubelet".
type rollBench struct {
	*benchEnv
	name    string
	h       *podHistory
	changed chan struct{}
}

// startRollBench starts metabus with a counting transport, a RollSet
// controller (resyncPeriodSeconds if > 0) whose hook counts its calls, and
// a kubelet that marks every new Pod Ready at once; then it creates the
// RollSet at image v1 and waits until it has rolled out.
func startRollBench(b *testing.B, resyncPeriodSeconds int64) *rollBench {
	b.Helper()
	rb := &rollBench{benchEnv: &benchEnv{api: newBenchAPICounter()}, name: "roll", changed: make(chan struct{}, 1)}
	rb.ns = benchNamespace(b)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := env.WaitForDefaultServiceAccount(ctx, rb.ns); err != nil {
		b.Fatalf("wait for default service account: %v", err)
	}
	srv := httptest.NewServer(jsonHook(func(req map[string]any) (int, any) {
		rb.hookCalls.Add(1)
		return rollsetHook(req)
	}))
	b.Cleanup(srv.Close)
	rb.hookURL = srv.URL
	rb.inst = benchMetabus(b, allinone.Config{}, rb.api)
	rb.h = recordPods(b, rb.ns)
	rb.h.subscribe(func(podEvent) {
		select {
		case rb.changed <- struct{}{}:
		default:
		}
	})
	autoReady(b, rb.h, rb.ns, 0, nil)
	spec := rollsetControllerSpec(rb.hookURL, "RollingRecreate")
	if resyncPeriodSeconds > 0 {
		spec["resyncPeriodSeconds"] = resyncPeriodSeconds
	}
	createController(b, rb.inst, compositeKind, rb.inst.selector, spec)
	createRollSet(b, rb.ns, rb.name, benchRollPods, 1)
	rb.waitRolledOut(b, 1, 2*time.Minute)
	return rb
}

// rolledOut says whether every Pod is at image version v and Ready, as the
// Pod history shows it.
func (rb *rollBench) rolledOut(v int) error {
	var pods map[string]podState
	replay(rb.h.events(), func(_ int, _ podEvent, p map[string]podState, _ string) { pods = p })
	for _, name := range podNames(rb.name, benchRollPods) {
		s, ok := pods[name]
		switch {
		case !ok:
			return fmt.Errorf("%s missing", name)
		case s.Image != rollImage(v) || !s.Ready:
			return fmt.Errorf("%s at %s, ready %v", name, s.Image, s.Ready)
		}
	}
	return nil
}

// waitRolledOut waits until every Pod is Ready at image version v and the
// parent reports Updated True/OnLatestRevision for its generation with
// every replica Ready. The parent is only read once the Pods are.
func (rb *rollBench) waitRolledOut(b *testing.B, v int, timeout time.Duration) {
	b.Helper()
	deadline := time.After(timeout)
	parentDone := wantRolledOut(rb.ns, rb.name, benchRollPods)
	for {
		err := rb.rolledOut(v)
		if err == nil {
			if err = parentDone(); err == nil {
				return
			}
		}
		select {
		case <-rb.changed:
		case <-time.After(25 * time.Millisecond):
		case <-deadline:
			b.Fatalf("not rolled out to %s after %s: %v", rollImage(v), timeout, err)
		}
	}
}

// revisionRequests returns metabus_revisions_requests_total by "op result".
func (rb *rollBench) revisionRequests(b *testing.B) map[string]float64 {
	b.Helper()
	mfs, err := rb.inst.reg.Gather()
	if err != nil {
		b.Fatalf("gather metrics: %v", err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() != "metabus_revisions_requests_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			var op, result string
			for _, lp := range m.GetLabel() {
				switch lp.GetName() {
				case "op":
					op = lp.GetValue()
				case "result":
					result = lp.GetValue()
				}
			}
			out[op+" "+result] += m.GetCounter().GetValue()
		}
	}
	return out
}

// rollCosts is what a rolling parent's syncs cost between two points.
type rollCosts struct {
	api                             benchAPIDelta
	hookCalls, syncs, applies       float64
	noops                           float64
	revLoads, revCommits            float64
	revisions                       map[string]float64 // by "op result"
	crLists, crWrites, podWrites    int64
	statusWrites, gets, otherWrites int64
}

func rollCostsBetween(before, after benchCounters, revBefore, revAfter map[string]float64) rollCosts {
	c := rollCosts{
		api:       benchDiffAPI(before.api, after.api),
		hookCalls: float64(after.hookCalls - before.hookCalls),
		syncs:     after.syncs - before.syncs,
		applies:   after.applies - before.applies,
		noops:     after.noops - before.noops,
		revisions: map[string]float64{},
	}
	for k, v := range revAfter {
		if n := v - revBefore[k]; n != 0 {
			c.revisions[k] = n
			switch {
			case strings.HasPrefix(k, "load "):
				c.revLoads += n
			case strings.HasPrefix(k, "commit "):
				c.revCommits += n
			}
		}
	}
	c.crLists = c.api["list controllerrevisions"]
	c.gets = c.api["get"]
	for _, verb := range []string{"create", "update", "patch", "delete"} {
		c.crWrites += c.api[verb+" controllerrevisions"]
		c.podWrites += c.api[verb+" pods"]
		c.statusWrites += c.api[verb+" rollsets/status"]
	}
	c.otherWrites = c.api.writes() - c.crWrites - c.podWrites - c.statusWrites
	return c
}

// add adds d's counts to c's.
func (c *rollCosts) add(d rollCosts) {
	for k, v := range d.api {
		c.api[k] += v
	}
	for k, v := range d.revisions {
		c.revisions[k] += v
	}
	c.hookCalls += d.hookCalls
	c.syncs += d.syncs
	c.applies += d.applies
	c.noops += d.noops
	c.revLoads += d.revLoads
	c.revCommits += d.revCommits
	c.crLists += d.crLists
	c.crWrites += d.crWrites
	c.podWrites += d.podWrites
	c.statusWrites += d.statusWrites
	c.otherWrites += d.otherWrites
	c.gets += d.gets
}

// report prints the costs per unit (a Pod moved, a sync).
func (c rollCosts) report(b *testing.B, n float64, unit string) {
	b.ReportMetric(c.hookCalls/n, "hook-calls/"+unit)
	b.ReportMetric(float64(c.crLists)/n, "cr-lists/"+unit)
	b.ReportMetric(float64(c.crWrites)/n, "cr-writes/"+unit)
	b.ReportMetric(float64(c.podWrites)/n, "pod-writes/"+unit)
	b.ReportMetric(float64(c.statusWrites)/n, "status-writes/"+unit)
	b.ReportMetric(float64(c.otherWrites)/n, "other-writes/"+unit)
	b.ReportMetric(float64(c.gets)/n, "gets/"+unit)
	b.ReportMetric(c.revLoads/n, "rev-loads/"+unit)
	b.ReportMetric(c.revCommits/n, "rev-commits/"+unit)
}

func (c rollCosts) String() string {
	var revs []string
	for k, v := range c.revisions {
		revs = append(revs, fmt.Sprintf("%s=%.0f", k, v))
	}
	sort.Strings(revs)
	return fmt.Sprintf("%.0f syncs, %.0f applies (%.0f no-op), %.0f hook calls; revisions requests: %s; API requests: %s",
		c.syncs, c.applies, c.noops, c.hookCalls, strings.Join(revs, " "), c.api)
}

func benchRollout(b *testing.B) {
	b.StopTimer()
	rb := startRollBench(b, 0)
	rb.waitQuiet(b, time.Second, 60*time.Second)
	before, revBefore := rb.snap(b), rb.revisionRequests(b)
	var elapsed time.Duration
	for i := 0; i < b.N; i++ {
		v := i + 2
		rb.h.mark(fmt.Sprintf("template v%d", v), rollImage(v))
		iterBefore, iterRevs := rb.snap(b), rb.revisionRequests(b)
		b.StartTimer()
		start := time.Now()
		setRollImage(b, rb.ns, rb.name, v)
		rb.waitRolledOut(b, v, 5*time.Minute)
		took := time.Since(start)
		b.StopTimer()
		elapsed += took
		rb.waitQuiet(b, time.Second, 60*time.Second)
		iterAfter := rb.snap(b)
		b.Logf("rollout of %d Pods to %s in %s; %s; results: %s; stages:%s", benchRollPods, rollImage(v), took.Round(time.Millisecond),
			rollCostsBetween(iterBefore, iterAfter, iterRevs, rb.revisionRequests(b)), benchResults(iterBefore, iterAfter),
			benchStages(iterBefore.hists, iterAfter.hists))
	}
	after, revAfter := rb.snap(b), rb.revisionRequests(b)
	moved := float64(b.N * benchRollPods)
	c := rollCostsBetween(before, after, revBefore, revAfter)
	b.ReportMetric(float64(elapsed)/float64(time.Millisecond)/moved, "ms/pod")
	b.ReportMetric(c.syncs/moved, "syncs/pod")
	c.report(b, moved, "pod")
}

func benchRolloutResync(b *testing.B) {
	const syncs = 50
	b.StopTimer()
	rb := startRollBench(b, 1)
	setRollImage(b, rb.ns, rb.name, 2)
	rb.waitRolledOut(b, 2, 5*time.Minute)
	// A periodic resync every second: metabus is never quiet for long.
	// Windows start and end between two resyncs, once the sync counter has
	// just moved and the sync has had time to be applied.
	between := func() (benchCounters, map[string]float64) {
		base := rb.inst.counter(b, "metabus_dispatcher_syncs_total", nil)
		deadline := time.Now().Add(10 * time.Second)
		for rb.inst.counter(b, "metabus_dispatcher_syncs_total", nil) == base {
			if time.Now().After(deadline) {
				b.Fatal("no resync in 10s")
			}
			time.Sleep(10 * time.Millisecond)
		}
		time.Sleep(400 * time.Millisecond)
		return rb.snap(b), rb.revisionRequests(b)
	}
	// Let the rollout's trailing syncs pass.
	time.Sleep(2 * time.Second)
	total := rollCosts{api: benchAPIDelta{}, revisions: map[string]float64{}}
	for i := 0; i < b.N; i++ {
		before, revBefore := between()
		b.StartTimer() // so that the default -benchtime stops at one window
		for rb.inst.counter(b, "metabus_dispatcher_syncs_total", nil)-before.syncs < syncs-1 {
			time.Sleep(100 * time.Millisecond)
		}
		after, revAfter := between()
		b.StopTimer()
		c := rollCostsBetween(before, after, revBefore, revAfter)
		b.Logf("%.0f resyncs of the rolled-out parent: %s; results: %s; stages:%s", c.syncs, c, benchResults(before, after),
			benchStages(before.hists, after.hists))
		total.add(c)
	}
	if total.syncs == 0 {
		b.Fatal("no resyncs counted")
	}
	b.ReportMetric(total.syncs/float64(b.N), "syncs")
	b.ReportMetric(total.noops/total.syncs, "noop-applies/sync")
	total.report(b, total.syncs, "sync")
	b.ReportMetric(0, "ns/op")
}
