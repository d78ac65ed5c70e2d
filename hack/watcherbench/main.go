// Command watcherbench measures how far one watcher goes (issue #12): the
// memory its informers take per watched object, and the CPU it spends per
// watch event, at 20,000 and 100,000 watched objects.
//
// It starts a fresh control plane (internal/testing/kubeenv: etcd + kube-apiserver, no
// controller manager), an embedded JetStream server (pkg/natsx) in this
// process, and the real watcher as a separate process (built with
// `go build ./cmd/watcher`), so its RSS and CPU come from /proc/<pid>. One
// CompositeController has a small namespaced CRD (Bench) as parent and
// ConfigMaps as children, so the watcher holds an informer on each. No
// dispatcher or applier runs. With -drain (the default) the bench acks
// every work item as it arrives, as dispatchers that keep up would, and
// the bench's own CPU for it counts as "bench+NATS"; without it items
// pile up in MC_WORK (two per parent), and every change refused by a full
// parent queue is published again by the watcher until there is room
// (services/watcher mustLand), which no installation whose dispatchers
// run does for long.
//
// For each size in -sizes (cumulative totals of watched objects), it
//
//  1. creates the missing objects from -writers concurrent clients: one
//     Bench per -children ConfigMaps (~1 KiB of data, a few labels and
//     annotations, a controller ownerReference to their Bench), spread
//     over -namespaces namespaces; then waits until the watcher is quiet
//     (CPU below 3% of a core for 3 s and its publish queue empty), and
//     reports the create time, the watcher's RSS and peak RSS, its live
//     heap (after a forced GC, with a heap profile summary), RSS per
//     object, its CPU per 1,000 add events, and the API server's and
//     etcd's RSS;
//  2. patches random watched objects (Benches and ConfigMaps alike) as
//     fast as the API server takes them from -writers clients for
//     -update-for, waits until the watcher is quiet again and reports API
//     writes/s, the watcher's CPU per 1,000 events (hence the events/s one
//     watcher core sustains), work items published vs events, MC_WORK's
//     messages, and the cores each process used meanwhile, which says who
//     the limit was.
//
// With -restart it finally restarts the watcher against the largest size:
// the time a fresh replica needs to list everything and its peak RSS.
//
// It prints figures and asserts nothing about speed. CPU per event is
// meaningful on a shared machine; throughput figures are not (other
// processes take cores), so it also prints how busy the whole machine was.
//
// Run from the repository root with the control plane binaries:
//
//	KUBE_BIN_DIR=... go run ./hack/watcherbench [-sizes 20000,100000]
package main

import (
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"

	"github.com/metabus/metabus/internal/testing/kubeenv"
	"github.com/metabus/metabus/pkg/bus"
	"github.com/metabus/metabus/pkg/embeddednats"
	"github.com/metabus/metabus/pkg/natsx"
)

// benchCRD is the parent type of the workload.
var benchCRD = kubeenv.FreeformCRD("bench.metabus.dev", "Bench", "benches")

var (
	benchGVR = schema.GroupVersionResource{Group: "bench.metabus.dev", Version: "v1", Resource: "benches"}
	cmGVR    = schema.GroupVersionResource{Version: "v1", Resource: "configmaps"}
	nsGVR    = schema.GroupVersionResource{Version: "v1", Resource: "namespaces"}
	ccGVR    = schema.GroupVersionResource{Group: "metacontroller.k8s.io", Version: "v1alpha1", Resource: "compositecontrollers"}
)

type config struct {
	sizes      []int
	children   int
	namespaces int
	writers    int
	clients    int
	updateFor  time.Duration
	dataBytes  int
	settleMax  time.Duration
	crdDir     string
	workDir    string
	keep       bool
	restart    bool
	drain      bool
	profileTop int
	cpuProfile bool
}

func main() {
	var cfg config
	var sizes string
	flag.StringVar(&sizes, "sizes", "20000,100000", "cumulative totals of watched objects (Benches + ConfigMaps), measured in turn")
	flag.IntVar(&cfg.children, "children", 4, "ConfigMaps per Bench")
	flag.IntVar(&cfg.namespaces, "namespaces", 4, "namespaces the objects are spread over")
	flag.IntVar(&cfg.writers, "writers", 64, "concurrent writers (creates and updates)")
	flag.IntVar(&cfg.clients, "clients", 8, "separate client connections the writers share")
	flag.DurationVar(&cfg.updateFor, "update-for", 30*time.Second, "how long each update phase runs")
	flag.IntVar(&cfg.dataBytes, "data-bytes", 1024, "bytes of data in each ConfigMap")
	flag.DurationVar(&cfg.settleMax, "settle-timeout", 5*time.Minute, "how long to wait for the watcher to go quiet")
	flag.StringVar(&cfg.crdDir, "crds", "deploy/crds", "metacontroller CRDs")
	flag.StringVar(&cfg.workDir, "dir", "", "working directory (default: a new temporary one, removed at the end unless -keep)")
	flag.BoolVar(&cfg.keep, "keep", false, "keep the working directory (logs, heap profiles)")
	flag.BoolVar(&cfg.drain, "drain", true, "ack every work item as it arrives, as dispatchers that keep up would")
	flag.BoolVar(&cfg.restart, "restart", true, "finally restart the watcher and measure a fresh replica's initial list")
	flag.BoolVar(&cfg.cpuProfile, "cpu-profile", true, "profile the watcher's CPU during each update phase")
	flag.IntVar(&cfg.profileTop, "profile-top", 30, "lines of `go tool pprof -top` printed per heap profile (0: none)")
	flag.Parse()
	for s := range strings.SplitSeq(sizes, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n <= 0 || (len(cfg.sizes) > 0 && n <= cfg.sizes[len(cfg.sizes)-1]) {
			fmt.Fprintf(os.Stderr, "watcherbench: -sizes must be increasing positive integers, got %q\n", sizes)
			os.Exit(2)
		}
		cfg.sizes = append(cfg.sizes, n)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, cfg); err != nil {
		fmt.Fprintf(os.Stderr, "watcherbench: %v\n", err)
		os.Exit(1)
	}
}

func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "%s "+format+"\n", append([]any{time.Now().Format("15:04:05")}, args...)...)
}

// object is one watched object the bench created.
type object struct {
	ns, name string
	uid      types.UID
}

type bench struct {
	cfg      config
	dir      string
	bin      string
	env      *kubeenv.Env
	clients  []dynamic.Interface
	js       jetstream.JetStream
	natsURL  string
	w        *proc
	wmetrics string // http://host:port/metrics
	wpprof   string // http://host:port
	wlog     string
	restarts int

	parents  []object
	children []object
	seq      atomic.Int64 // update counter
	rows     []row
}

// snap is everything a figure needs at one instant.
type snap struct {
	at                  time.Time
	cpu                 map[string]float64
	busy, total         float64 // machine jiffies (s)
	queued, already     float64 // work items published
	deferred            float64 // changes refused by a full parent queue, to be published again
	errs, echoes        float64
	mcwork              uint64
	mcworkBytes         uint64
	metricsErr, jetsErr error
}

type phase struct {
	events int64 // API writes that succeeded (each is one watch event)
	failed int64
	wall   time.Duration // writing
	settle time.Duration // after writing, until the watcher was quiet
	// from: the phase's start; end: writing done; to: the watcher quiet.
	from, end, to snap
}

// cores is the CPU a process used while the writes ran.
func (p phase) cores(role string) float64 {
	return (p.end.cpu[role] - p.from.cpu[role]) / p.end.at.Sub(p.from.at).Seconds()
}

// busy is how many of the machine's cores were busy while the writes ran
// (anyone's processes).
func (p phase) busy() float64 {
	return (p.end.busy - p.from.busy) / p.end.at.Sub(p.from.at).Seconds()
}

func (p phase) cpuMsPer1k(role string) float64 {
	if p.events == 0 {
		return 0
	}
	return (p.to.cpu[role] - p.from.cpu[role]) * 1000 / float64(p.events) * 1000
}

type row struct {
	n, parents, children    int
	create, update          phase
	rss, hwm, heap          int64
	apiRSS, etcdRSS, selfRS int64
	profile, cpuProfile     string
}

func run(ctx context.Context, cfg config) error {
	if os.Getenv("KUBE_BIN_DIR") == "" {
		logf("KUBE_BIN_DIR is not set; internal/testing/kubeenv looks for the control plane in its cache")
	}
	b := &bench{cfg: cfg}
	var err error
	if cfg.workDir != "" {
		b.dir = cfg.workDir
		err = os.MkdirAll(b.dir, 0o755)
	} else {
		b.dir, err = os.MkdirTemp("", "watcherbench-")
	}
	if err != nil {
		return err
	}
	defer func() {
		if cfg.keep || cfg.workDir != "" {
			logf("working directory kept: %s", b.dir)
			return
		}
		_ = os.RemoveAll(b.dir)
	}()

	logf("building the watcher")
	if out, err := exec.CommandContext(ctx, "go", "build", "-o", b.dir+"/", "./cmd/watcher").CombinedOutput(); err != nil {
		return fmt.Errorf("go build ./cmd/watcher: %v\n%s", err, out)
	}
	b.bin = filepath.Join(b.dir, "watcher")

	logf("starting the control plane")
	b.env, err = kubeenv.Start(ctx, kubeenv.Options{NoControllerManager: true, Dir: filepath.Join(b.dir, "kube"), Log: logf})
	if err != nil {
		return err
	}
	defer func() { _ = b.env.Stop() }()
	crdFile := filepath.Join(b.dir, "bench-crd.yaml")
	if err := os.WriteFile(crdFile, []byte(benchCRD), 0o644); err != nil {
		return err
	}
	if err := kubeenv.ApplyManifests(ctx, b.env.Config, cfg.crdDir, crdFile); err != nil {
		return err
	}
	if b.clients, err = newClients(b.env.Config, cfg.clients); err != nil {
		return err
	}
	for i := range cfg.namespaces {
		ns := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "v1", "kind": "Namespace",
			"metadata": map[string]any{"name": nsName(i)}}}
		if _, err := b.clients[0].Resource(nsGVR).Create(ctx, ns, metav1.CreateOptions{}); err != nil {
			return err
		}
	}

	srv, err := embeddednats.Start(embeddednats.Options{StoreDir: filepath.Join(b.dir, "nats")})
	if err != nil {
		return err
	}
	defer srv.Shutdown()
	b.natsURL = srv.ClientURL()
	nc, js, err := natsx.Connect(natsx.ConnOptions{URL: b.natsURL, Name: "watcherbench"})
	if err != nil {
		return err
	}
	defer nc.Close()
	b.js = js

	if err := b.startWatcher(ctx); err != nil {
		return err
	}
	defer func() { b.w.stop() }()
	if cfg.drain {
		dctx, cancel := context.WithCancel(ctx)
		defer cancel()
		go drainWork(dctx, js)
	}
	if err := b.createController(ctx); err != nil {
		return err
	}
	if _, err := b.settle(ctx); err != nil {
		return err
	}
	baseRSS := mustRSS(b.w.pid())
	logf("watcher idle with no objects: RSS %.1f MiB", mib(baseRSS))

	for _, n := range cfg.sizes {
		if err := b.step(ctx, n); err != nil {
			return err
		}
		b.printTables(baseRSS)
	}
	var rs *restartFigures
	if cfg.restart {
		if rs, err = b.restartWatcher(ctx); err != nil {
			return err
		}
	}
	b.printTables(baseRSS)
	if rs != nil {
		n := len(b.parents) + len(b.children)
		fmt.Printf("\nFresh watcher replica against %d objects (its initial list: the event path unthrottled by the writers): "+
			"quiet after %.1f s (%.0f objects/s, %.2f watcher cores), %.1f CPU s (%.0f ms per 1k objects listed, handled and published), "+
			"peak RSS %.0f MiB, RSS when quiet %.0f MiB\n",
			n, rs.quiet.Seconds(), float64(n)/rs.quiet.Seconds(), rs.cpu/rs.quiet.Seconds(), rs.cpu, rs.cpu*1e6/float64(n), mib(rs.hwm), mib(rs.rss))
	}
	return nil
}

// drainWork acks every work item of MC_WORK's partition consumers (the
// watcher creates them) as it arrives, looking for new consumers every
// second until ctx ends.
func drainWork(ctx context.Context, js jetstream.JetStream) {
	draining := map[string]jetstream.ConsumeContext{}
	defer func() {
		for _, cc := range draining {
			cc.Stop()
		}
	}()
	for {
		if st, err := js.Stream(ctx, bus.WorkStream); err == nil {
			names := st.ConsumerNames(ctx)
			for name := range names.Name() {
				if draining[name] != nil || !strings.HasPrefix(name, bus.WorkConsumerPrefix) {
					continue
				}
				cons, err := st.Consumer(ctx, name)
				if err != nil {
					continue
				}
				if cc, err := cons.Consume(func(m jetstream.Msg) { _ = m.Ack() }); err == nil {
					draining[name] = cc
				}
			}
		}
		if sleep(ctx, time.Second) != nil {
			return
		}
	}
}

func nsName(i int) string { return fmt.Sprintf("wb-%d", i) }

func mib(b int64) float64 { return float64(b) / (1 << 20) }

// newClients returns n dynamic clients, each on its own connection, with
// no client-side rate limit.
func newClients(base *rest.Config, n int) ([]dynamic.Interface, error) {
	var out []dynamic.Interface
	for range max(n, 1) {
		c := rest.CopyConfig(base)
		c.QPS, c.Burst = 1e6, 1e6
		c.Timeout = 60 * time.Second
		// A Dial of its own makes client-go build a transport (and a
		// connection) for this client instead of sharing the cached one.
		d := &net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}
		c.Dial = d.DialContext
		hc, err := rest.HTTPClientFor(c)
		if err != nil {
			return nil, err
		}
		dc, err := dynamic.NewForConfigAndClient(c, hc)
		if err != nil {
			return nil, err
		}
		out = append(out, dc)
	}
	return out, nil
}

func (b *bench) startWatcher(ctx context.Context) error {
	maddr, err := freeAddr()
	if err != nil {
		return err
	}
	haddr, err := freeAddr()
	if err != nil {
		return err
	}
	paddr, err := freeAddr()
	if err != nil {
		return err
	}
	b.wlog = filepath.Join(b.dir, fmt.Sprintf("watcher-%d.log", b.restarts))
	b.restarts++
	args := []string{
		"--kubeconfig", b.env.Kubeconfig,
		"--nats-url", b.natsURL,
		"--metrics-address", maddr,
		"--health-probe-bind-address", haddr,
		"--pprof-address", paddr,
	}
	b.w, err = startProc(b.bin, args, b.wlog)
	if err != nil {
		return err
	}
	b.wmetrics, b.wpprof = "http://"+maddr+"/metrics", "http://"+paddr
	deadline := time.Now().Add(2 * time.Minute)
	for {
		if b.w.exited() {
			return fmt.Errorf("watcher exited: %v (log %s)", b.w.err, b.wlog)
		}
		if _, err := scrape(ctx, "http://"+haddr+"/readyz"); err == nil {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("watcher not ready after 2 minutes (log %s)", b.wlog)
		}
		if err := sleep(ctx, 200*time.Millisecond); err != nil {
			return err
		}
	}
	logf("watcher running (pid %d, log %s)", b.w.pid(), b.wlog)
	return nil
}

func sleep(ctx context.Context, d time.Duration) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(d):
		return nil
	}
}

// createController creates the CompositeController (Benches with
// ConfigMap children; the hook is never called, nothing dispatches) and
// waits until the watcher has wired it.
func (b *bench) createController(ctx context.Context) error {
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
			"hooks": map[string]any{"sync": map[string]any{"webhook": map[string]any{"url": "http://127.0.0.1:9/sync"}}},
		},
	}}
	if _, err := b.clients[0].Resource(ccGVR).Create(ctx, cc, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}
	return b.waitWired(ctx)
}

func (b *bench) waitWired(ctx context.Context) error {
	deadline := time.Now().Add(2 * time.Minute)
	for {
		m, err := scrape(ctx, b.wmetrics)
		if err == nil && m.sum("metabus_watcher_controllers") >= 1 {
			return nil
		}
		if b.w.exited() {
			return fmt.Errorf("watcher exited: %v (log %s)", b.w.err, b.wlog)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the watcher did not wire the controller in 2 minutes (log %s)", b.wlog)
		}
		if err := sleep(ctx, 200*time.Millisecond); err != nil {
			return err
		}
	}
}

// settle waits until the watcher is quiet: under 3% of a core for three
// consecutive seconds with its publish queue empty. It returns how long
// the watcher was busy (the quiet seconds not counted).
func (b *bench) settle(ctx context.Context) (time.Duration, error) {
	start := time.Now()
	last := mustCPU(b.w.pid())
	quiet := 0
	for {
		if err := sleep(ctx, time.Second); err != nil {
			return 0, err
		}
		if b.w.exited() {
			return 0, fmt.Errorf("watcher exited: %v (log %s)", b.w.err, b.wlog)
		}
		cur := mustCPU(b.w.pid())
		depth := -1.0
		if m, err := scrape(ctx, b.wmetrics); err == nil {
			depth = m.sum("metabus_watcher_publish_queue_depth")
		}
		if cur-last < 0.03 && depth == 0 {
			quiet++
		} else {
			quiet = 0
		}
		last = cur
		if quiet >= 3 {
			return time.Since(start) - 3*time.Second, nil
		}
		if time.Since(start) > b.cfg.settleMax {
			return time.Since(start), fmt.Errorf("watcher still busy after %s (publish queue %v)", b.cfg.settleMax, depth)
		}
	}
}

func (b *bench) snapshot(ctx context.Context) snap {
	s := snap{at: time.Now(), cpu: map[string]float64{}}
	s.cpu["watcher"] = mustCPU(b.w.pid())
	pids := b.env.PIDs()
	s.cpu["apiserver"] = mustCPU(pids["kube-apiserver"])
	s.cpu["etcd"] = mustCPU(pids["etcd"])
	s.cpu["bench+nats"] = mustCPU(os.Getpid())
	s.busy, s.total = machineBusy()
	m, err := scrape(ctx, b.wmetrics)
	s.metricsErr = err
	if err == nil {
		s.queued = m.sum("metabus_watcher_work_items_total", `result="queued"`)
		s.already = m.sum("metabus_watcher_work_items_total", `result="already_queued"`)
		s.deferred = m.sum("metabus_watcher_work_items_total", `result="deferred"`)
		s.errs = m.sum("metabus_watcher_work_items_total", `result="error"`)
		s.echoes = m.sum("metabus_watcher_echoes_dropped_total")
	}
	ictx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	st, err := b.js.Stream(ictx, bus.WorkStream)
	if err == nil {
		var info *jetstream.StreamInfo
		if info, err = st.Info(ictx); err == nil {
			s.mcwork, s.mcworkBytes = info.State.Msgs, info.State.Bytes
		}
	}
	s.jetsErr = err
	return s
}

// step grows the watched objects to n and measures.
func (b *bench) step(ctx context.Context, n int) error {
	have := len(b.parents) + len(b.children)
	add := n - have
	newParents := add / (1 + b.cfg.children)
	newChildren := add - newParents
	r := row{n: n}
	logf("N=%d: creating %d Benches and %d ConfigMaps", n, newParents, newChildren)

	from := b.snapshot(ctx)
	start := time.Now()
	firstParent := len(b.parents)
	b.parents = append(b.parents, make([]object, newParents)...)
	okP, failP := b.parallel(ctx, newParents, func(c dynamic.Interface, i int) error {
		idx := firstParent + i
		o := object{ns: nsName(idx % b.cfg.namespaces), name: fmt.Sprintf("b-%06d", idx)}
		got, err := c.Resource(benchGVR).Namespace(o.ns).Create(ctx, b.newParent(o, idx), metav1.CreateOptions{})
		if err != nil {
			return err
		}
		o.uid = got.GetUID()
		b.parents[idx] = o
		return nil
	})
	if failP > 0 {
		return fmt.Errorf("%d Bench creates failed", failP)
	}
	firstChild := len(b.children)
	b.children = append(b.children, make([]object, newChildren)...)
	okC, failC := b.parallel(ctx, newChildren, func(c dynamic.Interface, i int) error {
		p := b.parents[firstParent+i%newParents]
		o := object{ns: p.ns, name: fmt.Sprintf("%s-c%d", p.name, i/newParents)}
		if _, err := c.Resource(cmGVR).Namespace(o.ns).Create(ctx, b.newChild(o, p, firstChild+i), metav1.CreateOptions{}); err != nil {
			return err
		}
		b.children[firstChild+i] = o
		return nil
	})
	if failC > 0 {
		return fmt.Errorf("%d ConfigMap creates failed", failC)
	}
	r.create.wall = time.Since(start)
	r.create.end = b.snapshot(ctx)
	r.create.events = okP + okC
	logf("N=%d: created %d objects in %.1f s (%.0f/s); waiting for the watcher to go quiet", n, r.create.events,
		r.create.wall.Seconds(), float64(r.create.events)/r.create.wall.Seconds())
	var err error
	if r.create.settle, err = b.settle(ctx); err != nil {
		return err
	}
	r.create.from, r.create.to = from, b.snapshot(ctx)
	r.parents, r.children = len(b.parents), len(b.children)

	pids := b.env.PIDs()
	r.rss, r.hwm = mustRSS(b.w.pid()), mustHWM(b.w.pid())
	r.apiRSS, r.etcdRSS, r.selfRS = mustRSS(pids["kube-apiserver"]), mustRSS(pids["etcd"]), mustRSS(os.Getpid())
	// The heap profile forces a GC first: the live heap is read after it.
	prof := filepath.Join(b.dir, fmt.Sprintf("heap-%d.pb.gz", n))
	if err := fetchTo(ctx, b.wpprof+"/debug/pprof/heap?gc=1", prof); err != nil {
		logf("heap profile: %v", err)
	} else if b.cfg.profileTop > 0 {
		r.profile = pprofTop(ctx, b.bin, prof, b.cfg.profileTop)
	}
	if m, err := scrape(ctx, b.wmetrics); err == nil {
		r.heap = int64(m.sum("go_memstats_heap_alloc_bytes"))
	}
	logf("N=%d: watcher RSS %.0f MiB (peak %.0f), live heap %.0f MiB", n, mib(r.rss), mib(r.hwm), mib(r.heap))

	logf("N=%d: updating random objects from %d writers for %s", n, b.cfg.writers, b.cfg.updateFor)
	r.update.from = b.snapshot(ctx)
	// A CPU profile of the watcher over the middle of the update phase.
	var cpuProf chan error
	cpuProfPath := filepath.Join(b.dir, fmt.Sprintf("cpu-%d.pb.gz", n))
	if secs := int(b.cfg.updateFor.Seconds()) - 4; b.cfg.cpuProfile && secs >= 2 {
		cpuProf = make(chan error, 1)
		go func() {
			_ = sleep(ctx, 2*time.Second)
			cpuProf <- fetchTo(ctx, fmt.Sprintf("%s/debug/pprof/profile?seconds=%d", b.wpprof, secs), cpuProfPath)
		}()
	}
	start = time.Now()
	r.update.events, r.update.failed = b.updates(ctx, b.cfg.updateFor)
	r.update.wall = time.Since(start)
	r.update.end = b.snapshot(ctx)
	if r.update.settle, err = b.settle(ctx); err != nil {
		return err
	}
	r.update.to = b.snapshot(ctx)
	logf("N=%d: %d updates (%d failed) in %.1f s; watcher quiet %.1f s later", n, r.update.events, r.update.failed,
		r.update.wall.Seconds(), r.update.settle.Seconds())
	if cpuProf != nil {
		if err := <-cpuProf; err != nil {
			logf("CPU profile: %v", err)
		} else if b.cfg.profileTop > 0 {
			r.cpuProfile = pprofTop(ctx, b.bin, cpuProfPath, b.cfg.profileTop, "-sample_index=cpu") + "\n\n" +
				pprofTop(ctx, b.bin, cpuProfPath, b.cfg.profileTop+12, "-sample_index=cpu", "-cum")
		}
	}
	b.rows = append(b.rows, r)
	return nil
}

// parallel runs fn for 0..n-1 from the writers; each call is retried a few
// times (the API server sheds load with 429s and timeouts when saturated).
func (b *bench) parallel(ctx context.Context, n int, fn func(c dynamic.Interface, i int) error) (ok, failed int64) {
	var next atomic.Int64
	var wg sync.WaitGroup
	var okN, failN atomic.Int64
	var firstErr sync.Once
	done := make(chan struct{})
	go func() {
		t := time.NewTicker(10 * time.Second)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				logf("  %d/%d created", okN.Load(), n)
			}
		}
	}()
	for w := range b.cfg.writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := b.clients[w%len(b.clients)]
			for {
				i := int(next.Add(1) - 1)
				if i >= n || ctx.Err() != nil {
					return
				}
				var err error
				for attempt := range 5 {
					if err = fn(c, i); err == nil || apierrors.IsAlreadyExists(err) && attempt > 0 {
						err = nil
						break
					}
					_ = sleep(ctx, time.Duration(attempt+1)*200*time.Millisecond)
				}
				if err != nil {
					failN.Add(1)
					firstErr.Do(func() { logf("  write failed: %v", err) })
				} else {
					okN.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	close(done)
	return okN.Load(), failN.Load()
}

// updates patches random watched objects from the writers for d.
func (b *bench) updates(ctx context.Context, d time.Duration) (ok, failed int64) {
	// The deadline is checked between requests, never imposed on one: a
	// request cut short would count as a failure that the API server did
	// not cause.
	deadline := time.Now().Add(d)
	var okN, failN atomic.Int64
	var wg sync.WaitGroup
	var firstErr sync.Once
	np, nc := len(b.parents), len(b.children)
	for w := range b.cfg.writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := b.clients[w%len(b.clients)]
			for ctx.Err() == nil && time.Now().Before(deadline) {
				seq := b.seq.Add(1)
				i := rand.IntN(np + nc)
				var err error
				if i < np {
					o := b.parents[i]
					patch := fmt.Sprintf(`{"spec":{"revision":%d}}`, seq)
					_, err = c.Resource(benchGVR).Namespace(o.ns).Patch(ctx, o.name, types.MergePatchType, []byte(patch), metav1.PatchOptions{})
				} else {
					o := b.children[i-np]
					patch := fmt.Sprintf(`{"data":{"revision":"%d"}}`, seq)
					_, err = c.Resource(cmGVR).Namespace(o.ns).Patch(ctx, o.name, types.MergePatchType, []byte(patch), metav1.PatchOptions{})
				}
				switch {
				case err == nil:
					okN.Add(1)
				case ctx.Err() != nil:
				default:
					failN.Add(1)
					firstErr.Do(func() { logf("  update failed: %v", err) })
				}
			}
		}()
	}
	wg.Wait()
	return okN.Load(), failN.Load()
}

// filler returns n bytes of printable, object-specific text.
func filler(seed, n int) string {
	const alphabet = "abcdefghijklmnopqrstuvwxyz0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ-_"
	r := rand.New(rand.NewPCG(uint64(seed), 0x9e3779b97f4a7c15))
	buf := make([]byte, n)
	for i := range buf {
		buf[i] = alphabet[r.IntN(len(alphabet))]
	}
	return string(buf)
}

func (b *bench) newParent(o object, idx int) *unstructured.Unstructured {
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "bench.metabus.dev/v1",
		"kind":       "Bench",
		"metadata": map[string]any{
			"name": o.name, "namespace": o.ns,
			"labels": map[string]any{"app.kubernetes.io/name": "bench", "app.kubernetes.io/part-of": "watcherbench",
				"team": fmt.Sprintf("team-%d", idx%17)},
			"annotations": map[string]any{"example.com/owner": "platform-team@example.com",
				"example.com/description": "a parent of the watcher benchmark"},
		},
		"spec": map[string]any{
			"replicas": int64(3),
			"image":    "registry.example.com/apps/bench:1.24.3",
			"revision": int64(0),
			"config":   map[string]any{"logLevel": "info", "timeout": "30s", "token": filler(idx, 64)},
		},
	}}
}

func (b *bench) newChild(o, p object, idx int) *unstructured.Unstructured {
	data := map[string]any{"revision": "0"}
	const keys = 4
	for k := range keys {
		data[fmt.Sprintf("file-%d.conf", k)] = filler(idx*keys+k+1<<40, b.cfg.dataBytes/keys)
	}
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "v1",
		"kind":       "ConfigMap",
		"metadata": map[string]any{
			"name": o.name, "namespace": o.ns,
			"labels": map[string]any{"app.kubernetes.io/name": "bench", "app.kubernetes.io/part-of": "watcherbench",
				"controller-uid": string(p.uid)},
			"annotations": map[string]any{"example.com/checksum": filler(idx, 64),
				"example.com/generated-by": "watcherbench"},
			"ownerReferences": []any{map[string]any{
				"apiVersion": "bench.metabus.dev/v1", "kind": "Bench", "name": p.name, "uid": string(p.uid),
				"controller": true, "blockOwnerDeletion": true,
			}},
		},
		"data": data,
	}}
}

type restartFigures struct {
	quiet    time.Duration
	hwm, rss int64
	cpu      float64
}

// restartWatcher replaces the watcher with a fresh process and measures
// its initial list of everything.
func (b *bench) restartWatcher(ctx context.Context) (*restartFigures, error) {
	logf("restarting the watcher against %d objects", len(b.parents)+len(b.children))
	b.w.stop()
	start := time.Now()
	if err := b.startWatcher(ctx); err != nil {
		return nil, err
	}
	if err := b.waitWired(ctx); err != nil {
		return nil, err
	}
	rs := &restartFigures{}
	if _, err := b.settle(ctx); err != nil {
		return nil, err
	}
	rs.quiet = time.Since(start) - 3*time.Second
	rs.hwm, rs.rss, rs.cpu = mustHWM(b.w.pid()), mustRSS(b.w.pid()), mustCPU(b.w.pid())
	return rs, nil
}

func (b *bench) printTables(baseRSS int64) {
	if len(b.rows) == 0 {
		return
	}
	fmt.Printf("\nWatcher benchmark: 1 CompositeController, Bench parents with %d ConfigMap children each (~%d B data), %d namespaces, %d writers on %d connections, idle watcher RSS %.0f MiB\n",
		b.cfg.children, b.cfg.dataBytes, b.cfg.namespaces, b.cfg.writers, b.cfg.clients, mib(baseRSS))
	tw := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "N\tcreate s\twatcher RSS MiB\tKiB/object\tCPU ms/1k events\test. events/s/core\tAPI writes/s\tlimit\t")
	for _, r := range b.rows {
		per := r.update.cpuMsPer1k("watcher")
		est := 0.0
		if per > 0 {
			est = 1e6 / per
		}
		fmt.Fprintf(tw, "%d\t%.0f\t%.0f\t%.2f\t%.0f\t%.0f\t%.0f\t%s\t\n", r.n, r.create.wall.Seconds(), mib(r.rss),
			float64(r.rss-baseRSS)/1024/float64(r.n), per, est, float64(r.update.events)/r.update.wall.Seconds(), limit(r.update))
	}
	_ = tw.Flush()

	fmt.Println("\nMemory (after the creates, watcher quiet; live heap after a forced GC; KiB/object net of the idle RSS)")
	tw = tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "N\tBenches\tConfigMaps\twatcher RSS MiB\tpeak RSS MiB\tlive heap MiB\tRSS KiB/obj\theap KiB/obj\tapiserver RSS MiB\tetcd RSS MiB\tbench+NATS RSS MiB\t")
	for _, r := range b.rows {
		fmt.Fprintf(tw, "%d\t%d\t%d\t%.0f\t%.0f\t%.0f\t%.2f\t%.2f\t%.0f\t%.0f\t%.0f\t\n", r.n, r.parents, r.children, mib(r.rss), mib(r.hwm), mib(r.heap),
			float64(r.rss-baseRSS)/1024/float64(r.n), float64(r.heap)/1024/float64(r.n), mib(r.apiRSS), mib(r.etcdRSS), mib(r.selfRS))
	}
	_ = tw.Flush()

	fmt.Println("\nPhases (events: API writes that succeeded, each one watch event; CPU/1k events: from the phase's start until the watcher was quiet; cores: CPU s / wall s while the writes ran)")
	tw = tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "N\tphase\tevents\tfailed\twrite s\twrites/s\tquiet after s\twatcher CPU ms/1k ev\twatcher cores\tapiserver cores\tetcd cores\tbench+NATS cores\tmachine busy cores\titems queued\talready queued\tdeferred\tpublish errors\tMC_WORK msgs\t")
	for _, r := range b.rows {
		for _, ph := range []struct {
			name string
			p    phase
		}{{"create", r.create}, {"update", r.update}} {
			p := ph.p
			fmt.Fprintf(tw, "%d\t%s\t%d\t%d\t%.1f\t%.0f\t%.1f\t%.0f\t%.2f\t%.2f\t%.2f\t%.2f\t%.2f\t%.0f\t%.0f\t%.0f\t%.0f\t%d\t\n",
				r.n, ph.name, p.events, p.failed, p.wall.Seconds(), float64(p.events)/p.wall.Seconds(), p.settle.Seconds(),
				p.cpuMsPer1k("watcher"), p.cores("watcher"), p.cores("apiserver"), p.cores("etcd"), p.cores("bench+nats"),
				p.busy(),
				p.to.queued-p.from.queued, p.to.already-p.from.already, p.to.deferred-p.from.deferred, p.to.errs-p.from.errs, p.to.mcwork)
		}
	}
	_ = tw.Flush()
	for i := range b.rows {
		r := &b.rows[i]
		if r.profile != "" {
			fmt.Printf("\nWatcher heap at N=%d (go tool pprof -top -sample_index=inuse_space):\n%s\n", r.n, r.profile)
			r.profile = ""
		}
		if r.cpuProfile != "" {
			fmt.Printf("\nWatcher CPU during the update phase at N=%d (go tool pprof -top):\n%s\n", r.n, r.cpuProfile)
			r.cpuProfile = ""
		}
	}
}

// limit names what bounded an update phase's throughput: the watcher if
// it used most of a core, otherwise whoever took the machine's cores.
func limit(p phase) string {
	busy := p.busy()
	switch {
	case p.cores("watcher") > 0.85:
		return "watcher"
	case busy > 1.7 && p.cores("apiserver") > p.cores("watcher"):
		return "apiserver (machine CPU-bound)"
	case busy > 1.7:
		return "machine CPU-bound"
	default:
		return "apiserver"
	}
}
