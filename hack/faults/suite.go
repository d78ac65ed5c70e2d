package main

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"

	"github.com/metabus/metabus/internal/testing/kubeenv"
	"github.com/metabus/metabus/internal/testing/testnats"
	"github.com/metabus/metabus/pkg/bus"
)

// config is one run of the suite.
type config struct {
	parents          int
	faultPeriod      time.Duration
	killInterval     time.Duration
	natsRestarts     int
	apiRestarts      int
	churnRate        float64
	badPct           int
	hookTimeout      time.Duration
	finalize         bool
	suppressEchoes   bool
	dispatchers      int
	appliers         int
	convergeTimeout  time.Duration
	initialTimeout   time.Duration
	workDir          string // "" = a new temporary directory
	binDir           string // "" = build the services and nats-server into workDir/bin
	keep             bool   // keep workDir even when everything passed
	strictStartup    bool   // an exit at startup during a NATS outage fails too
	out              io.Writer
	extraServiceArgs []string
	watcherArgs      []string

	// The clustered mode (-cluster): three NATS nodes, R3 streams.
	cluster        bool
	watchers       int
	revisions      int
	rolling        int           // rolling restarts of every node
	stepdowns      int           // forced stream or consumer leader moves
	nodePartitions int           // a node cut from the other two
	serviceCuts    int           // a service cut from NATS (not from the API server)
	wipes          int           // a node SIGKILLed, its store deleted, started again
	losses         int           // the whole cluster lost with its data
	partitionFor   time.Duration // how long a partition or cut lasts
	initialOnly    bool          // measure the first convergence, no faults
	natsProfile    time.Duration // -cluster: profile the nodes over the first convergence
}

func defaultConfig() config {
	return config{
		parents:         2000,
		faultPeriod:     5 * time.Minute,
		killInterval:    2500 * time.Millisecond,
		natsRestarts:    2,
		apiRestarts:     1,
		churnRate:       20,
		badPct:          10,
		hookTimeout:     2 * time.Second,
		finalize:        true,
		dispatchers:     2,
		appliers:        2,
		convergeTimeout: 3 * time.Minute,
		initialTimeout:  10 * time.Minute,
		out:             os.Stdout,
		watchers:        1,
		revisions:       1,
		partitionFor:    30 * time.Second,
	}
}

// clusteredConfig is the clustered mode's full run: the production
// topology (three NATS nodes, R3 streams, the shipped users and
// permissions; 2 watchers with leader election, 2 dispatchers, 3 appliers,
// 2 revisions) for 15 minutes, with on top of the single-node faults
// NATS node SIGKILLs (the meta leader and the leaders of MC_WORK,
// MC_DESIRED and the owners bucket first), a rolling restart, leader moves,
// node partitions, services cut from NATS and a node that lost its disk.
func clusteredConfig() config {
	cfg := defaultConfig()
	cfg.cluster = true
	cfg.faultPeriod = 15 * time.Minute
	cfg.natsRestarts = 12
	cfg.apiRestarts = 2
	cfg.watchers, cfg.appliers, cfg.revisions = 2, 3, 2
	cfg.rolling = 1
	cfg.stepdowns = 10
	cfg.nodePartitions = 3
	cfg.serviceCuts = 3
	cfg.wipes = 1
	cfg.convergeTimeout = 5 * time.Minute
	return cfg
}

// report is what a run found.
type report struct {
	failed, passed int
	v              violations
	logDir         string
}

// suite is one run in progress.
type suite struct {
	cfg   config
	dir   string
	logf  func(string, ...any)
	start time.Time

	env      *kubeenv.Env
	dyn      dynamic.Interface
	cs       kubernetes.Interface
	nats     *proc
	natsURL  string
	cluster  *testnats.Cluster // clustered mode; nats is nil then
	admin    *nats.Conn        // the cluster's admin user
	js       jetstream.JetStream
	applied  *appliedLog
	services []*proc
	hook     *hook
	track    *childTracker
	work     *workload

	mu        sync.Mutex
	faults    map[string]int // fault type -> count
	lastFault time.Time
	faultErrs []string
	// natsDown are the periods nats-server was down (killed until ready).
	natsDown [][2]time.Time
	// tolerated are exits at startup while nats-server was down.
	tolerated []string
	// cutWindows are the periods each service was cut from NATS.
	cutWindows map[string][][2]time.Time
	// catchUp is how long the cluster took to be current again after
	// each NATS fault, by kind.
	catchUp map[string][]time.Duration
	// skipped counts scheduled faults the fault period ended before.
	skipped map[string]int
	// rejoinFails are NATS faults after which the cluster did not become
	// current again in time.
	rejoinFails []string
	natsUsage   string
	initial     string // the first convergence's figures
	idle        string // -initial-only: the idle cost before it
}

// duringNATSOutage reports whether a service started while nats-server was
// down or it was cut from NATS (or within 1s before or 2s after) and exited
// because it could not connect.
func (s *suite) duringNATSOutage(p *proc, e exitRecord) bool {
	if !strings.Contains(e.tail, "connect to nats") {
		return false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, w := range append(append([][2]time.Time{}, s.natsDown...), s.cutWindows[p.name]...) {
		if !e.started.Before(w[0].Add(-time.Second)) && !e.started.After(w[1].Add(2*time.Second)) {
			return true
		}
	}
	return false
}

func (s *suite) fault(kind string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.faults[kind]++
	s.lastFault = time.Now()
}

// faultOver moves the last fault's time to now: a partition counts until
// its heal, a node restart until the cluster is current again.
func (s *suite) faultOver() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.lastFault = time.Now()
}

func (s *suite) faultErr(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	s.logf("fault injection error: %s", msg)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.faultErrs = append(s.faultErrs, msg)
}

// run runs the whole suite and prints its figures and verdicts to cfg.out.
func run(ctx context.Context, cfg config) (*report, error) {
	// client-go's reflectors warn on every watch the API server restart
	// breaks; the suite reports what matters itself.
	klog.SetLogger(logr.Discard())
	s := &suite{cfg: cfg, start: time.Now(), faults: map[string]int{}, cutWindows: map[string][][2]time.Time{},
		catchUp: map[string][]time.Duration{}, skipped: map[string]int{}}
	var err error
	if cfg.workDir == "" {
		if s.dir, err = os.MkdirTemp("", "faults-"); err != nil {
			return nil, err
		}
	} else {
		s.dir = cfg.workDir
		if err := os.MkdirAll(s.dir, 0o755); err != nil {
			return nil, err
		}
	}
	logFile, err := os.Create(filepath.Join(s.dir, "faults.log"))
	if err != nil {
		return nil, err
	}
	defer logFile.Close()
	var logMu sync.Mutex
	s.logf = func(format string, args ...any) {
		line := fmt.Sprintf("[%6.1fs] ", time.Since(s.start).Seconds()) + fmt.Sprintf(format, args...) + "\n"
		logMu.Lock()
		defer logMu.Unlock()
		_, _ = io.WriteString(logFile, line)
		if !strings.HasPrefix(format, "kubeenv") && !strings.HasPrefix(format, "churn:") {
			_, _ = io.WriteString(cfg.out, line)
		}
	}
	s.logf("fault suite: %d parents, %s of faults (a SIGKILL every ~%s, %d NATS and %d kube-apiserver restarts, %d%% of parents with a misbehaving hook); work dir %s",
		cfg.parents, cfg.faultPeriod, cfg.killInterval, cfg.natsRestarts, cfg.apiRestarts, cfg.badPct, s.dir)
	if cfg.cluster {
		s.logf("clustered: 3 NATS nodes, R3 streams; %d rolling restarts, %d leader moves, %d node partitions, %d services cut from NATS, %d wiped stores, partitions of %s",
			cfg.rolling, cfg.stepdowns, cfg.nodePartitions, cfg.serviceCuts, cfg.wipes, cfg.partitionFor)
	}
	rep, err := s.do(ctx)
	s.teardown()
	if rep != nil {
		rep.logDir = s.dir
		if rep.failed == 0 && err == nil && !cfg.keep && cfg.workDir == "" {
			_ = os.RemoveAll(s.dir)
			rep.logDir = ""
		}
	}
	return rep, err
}

func (s *suite) do(ctx context.Context) (*report, error) {
	root, err := repoRoot()
	if err != nil {
		return nil, err
	}
	bin := s.cfg.binDir
	t := time.Now()
	if bin == "" {
		bin = filepath.Join(s.dir, "bin")
		if err := buildBinaries(ctx, root, bin); err != nil {
			return nil, err
		}
		s.logf("built the services and nats-server in %s", since(t))
	}

	// Control plane, with kube-controller-manager (garbage collection) and
	// the CRDs installed before it starts, so the collector knows Churns.
	crd := filepath.Join(s.dir, "churn-crd.yaml")
	if err := os.WriteFile(crd, []byte(parentCRD), 0o644); err != nil {
		return nil, err
	}
	// Created here, so that Stop keeps the components' logs.
	if err := os.MkdirAll(filepath.Join(s.dir, "kube"), 0o700); err != nil {
		return nil, err
	}
	t = time.Now()
	s.env, err = kubeenv.Start(ctx, kubeenv.Options{Dir: filepath.Join(s.dir, "kube"), CRDs: []string{filepath.Join(root, "deploy", "crds"), crd}, Log: s.logf})
	if err != nil {
		return nil, err
	}
	s.logf("control plane up in %s", since(t))
	rc := rest.CopyConfig(s.env.Config)
	rc.QPS, rc.Burst = -1, 1000
	if s.dyn, err = dynamic.NewForConfig(rc); err != nil {
		return nil, err
	}
	if s.cs, err = kubernetes.NewForConfig(rc); err != nil {
		return nil, err
	}
	if _, err := s.cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return nil, err
	}

	// NATS (one server on a fixed port, or the cluster), the recorder of
	// the appliers' writes, then the services.
	if s.cfg.cluster {
		if err := s.startCluster(ctx, root, bin); err != nil {
			return nil, err
		}
	} else {
		port, err := testnats.FreePort()
		if err != nil {
			return nil, err
		}
		s.nats, s.natsURL, err = newNATS(filepath.Join(bin, "nats-server"), s.dir, s.dir, port, s.logf)
		if err != nil {
			return nil, err
		}
		if err := s.nats.start(); err != nil {
			return nil, err
		}
		if err := waitNATS(ctx, s.natsURL, time.Minute); err != nil {
			return nil, err
		}
	}
	if err := s.startAppliedLog(); err != nil {
		return nil, fmt.Errorf("subscribe to %s: %w", bus.AppliedSubject, err)
	}
	if err := s.startServices(ctx, bin); err != nil {
		return nil, err
	}

	if s.hook, err = startHook(s.cfg.badPct, s.cfg.hookTimeout+time.Second); err != nil {
		return nil, err
	}
	if _, err := s.dyn.Resource(ccGVR).Create(ctx, compositeController(s.hook.url, s.cfg.hookTimeout, s.cfg.finalize, s.cfg.suppressEchoes), metav1.CreateOptions{}); err != nil {
		return nil, err
	}
	if s.track, err = startChildTracker(s.cs, s.dyn); err != nil {
		return nil, err
	}

	// The parents, and their first convergence (no faults yet).
	s.work = newWorkload(s.dyn, s.cfg.parents, s.logf)
	profile := s.cluster != nil && s.cfg.natsProfile > 0
	if s.cfg.initialOnly {
		// What the installation costs doing nothing, once settled (the
		// watcher may still be creating consumers when it reports ready).
		time.Sleep(30 * time.Second)
		idle := s.cpuByGroup()
		wait := func() {}
		if profile {
			wait = s.profileNATS("idle", 20*time.Second)
		}
		created := s.countAdvisories("$JS.EVENT.ADVISORY.CONSUMER.CREATED.>")
		time.Sleep(20 * time.Second)
		s.idle = "CPU over 20s: " + cpuDelta(idle, s.cpuByGroup()) + "; consumers created: " + created()
		s.logf("idle (no parent yet): %s", s.idle)
		wait()
	}
	waitProfile := func() {}
	if profile {
		waitProfile = s.profileNATS("converge", s.cfg.natsProfile)
	}
	cpuBefore := s.cpuByGroup()
	t = time.Now()
	if err := s.work.createAll(ctx); err != nil {
		return nil, fmt.Errorf("create parents: %w", err)
	}
	s.logf("created %d parents in %s", s.cfg.parents, since(t))
	if d, ok := s.waitConverged(ctx, t, s.cfg.initialTimeout, func(v violations) {
		s.logf("  not yet: %s", summary(v))
	}); ok {
		s.initial = fmt.Sprintf("%d parents in %s; CPU meanwhile: %s", s.cfg.parents, d.Round(100*time.Millisecond), cpuDelta(cpuBefore, s.cpuByGroup()))
		s.logf("all %d parents converged %s after the first create (CPU meanwhile: %s)", s.cfg.parents, d.Round(100*time.Millisecond), cpuDelta(cpuBefore, s.cpuByGroup()))
	} else {
		s.initial = fmt.Sprintf("%d parents: NOT within %s", s.cfg.parents, s.cfg.initialTimeout)
		s.logf("WARNING: the parents did not all converge within %s before the faults; going on", s.cfg.initialTimeout)
	}

	waitProfile()

	// The fault period: churn, SIGKILLs, NATS and API server restarts, a
	// misbehaving hook.
	if !s.cfg.initialOnly {
		s.logf("fault period: %s", s.cfg.faultPeriod)
		s.faultPeriod(ctx)
	}

	// Convergence after the last fault and the last write.
	last := s.lastFault
	if op := time.Unix(0, s.work.lastOp.Load()); op.After(last) {
		last = op
	}
	s.logf("faults over (last fault %s ago, last write %s ago); waiting up to %s for convergence",
		since(s.lastFault), since(time.Unix(0, s.work.lastOp.Load())), s.cfg.convergeTimeout)
	convergedAfter, converged := s.waitConverged(ctx, last, s.cfg.convergeTimeout, func(v violations) {
		s.logf("  not yet: %s", summary(v))
	})
	if converged {
		s.logf("converged %s after the last fault (%s after the last write)",
			time.Since(s.lastFault).Round(100*time.Millisecond), convergedAfter.Round(100*time.Millisecond))
		// Stable? Look again a little later.
		time.Sleep(10 * time.Second)
	}

	// The final check.
	v := violations{}
	st, err := checkCluster(ctx, s.dyn, v, s.hook.lastCall)
	if err != nil {
		return nil, err
	}
	// Explain each parent that did not converge with its Events, then
	// poke it (an annotation: a change by someone else) to tell a lost sync
	// (any new event repairs it) from a wedged parent.
	var poked []string
	for i, line := range append(append([]string{}, v[invConverged]...), v[invFinalizers]...) {
		name, _, _ := strings.Cut(line, " ")
		if evs := s.events(ctx, name); evs != "" {
			s.logf("events of %s: %s", name, evs)
		}
		if i < 20 {
			patch := fmt.Sprintf(`{"metadata":{"annotations":{"faults.metabus.dev/poke":%q}}}`, time.Now().Format(time.RFC3339Nano))
			if _, err := s.dyn.Resource(parentGVR).Namespace(ns).Patch(ctx, name, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err == nil {
				poked = append(poked, name)
			}
		}
	}
	if len(poked) > 0 {
		time.Sleep(30 * time.Second)
		pv := violations{}
		if _, err := checkCluster(ctx, s.dyn, pv, s.hook.lastCall); err == nil {
			still := map[string]bool{}
			for _, line := range append(append([]string{}, pv[invConverged]...), pv[invFinalizers]...) {
				name, _, _ := strings.Cut(line, " ")
				still[name] = true
			}
			for _, name := range poked {
				if still[name] {
					s.logf("%s: still not converged 30s after a poke (an annotation change): wedged", name)
				} else {
					s.logf("%s: converged within 30s after a poke (an annotation change): its last sync was lost, any event repairs it", name)
				}
			}
		}
	}
	dlq, err := dlqEntries(ctx, s.connectAdmin)
	if err != nil {
		v.add(invDLQ, "cannot read MC_DLQ: %v", err)
	}
	for _, e := range dlq {
		v.add(invDLQ, "%s", e)
	}
	for _, line := range s.track.replaced() {
		v.add(invReplaced, "%s", line)
	}
	regressions, versions := s.track.genRegressions()
	for _, line := range regressions {
		v.add(invOrder, "%s", line)
	}
	notes, writes, items := s.applied.check(v)
	if s.cluster != nil {
		s.mu.Lock()
		for _, f := range s.rejoinFails {
			v.add(invRejoin, "%s", f)
		}
		s.mu.Unlock()
		if took, err := s.waitClusterHealthy(ctx, time.Minute); err != nil {
			v.add(invRejoin, "at the end, after waiting %s: %v", took.Round(time.Second), err)
		}
	}
	// Stop everything and judge the exits.
	for _, p := range s.services {
		if why := p.stop(20 * time.Second); why != "" {
			v.add(invShutdown, "%s %s", p.name, why)
		}
	}
	procs := append([]*proc{}, s.services...)
	if s.nats != nil {
		if why := s.nats.stop(20 * time.Second); why != "" {
			v.add(invShutdown, "nats-server %s", why)
		}
		procs = append(procs, s.nats)
	}
	for _, p := range procs {
		for _, e := range p.unexpectedExits() {
			if !s.cfg.strictStartup && p != s.nats && s.duringNATSOutage(p, e) {
				s.tolerated = append(s.tolerated, e.desc)
				continue
			}
			v.add(invExits, "%s", e.desc)
		}
	}
	if s.cluster != nil {
		natsCPU, _, peak := s.cluster.Usage()
		s.natsUsage = fmt.Sprintf("%s CPU in all, peak RSS per node %v MiB", natsCPU.Round(time.Second), mib(peak))
		s.admin.Close()
		s.cluster.Close()
		for _, e := range s.cluster.UnexpectedExits() {
			v.add(invExits, "%s", e)
		}
	}
	s.applied.close()

	s.printFigures(st, converged, convergedAfter, last)
	fmt.Fprintf(s.cfg.out, "  order: %d versions of children and parent statuses watched for a gen going back; %s\n", versions, s.applied.summary(notes, writes, items))
	rep := &report{v: v}
	fmt.Fprintln(s.cfg.out, "\ninvariants:")
	for _, inv := range invariants {
		vs := v[inv]
		if len(vs) == 0 {
			rep.passed++
			fmt.Fprintf(s.cfg.out, "  PASS  %s\n", inv)
			continue
		}
		rep.failed++
		fmt.Fprintf(s.cfg.out, "  FAIL  %s: %d violation(s)\n", inv, len(vs))
		for i, line := range sorted(vs) {
			if i == 20 {
				fmt.Fprintf(s.cfg.out, "        ... and %d more (all in %s)\n", len(vs)-20, filepath.Join(s.dir, "violations.txt"))
				break
			}
			fmt.Fprintf(s.cfg.out, "        %s\n", line)
		}
	}
	var all []string
	for _, inv := range invariants {
		for _, line := range sorted(v[inv]) {
			all = append(all, inv+": "+line)
		}
	}
	_ = os.WriteFile(filepath.Join(s.dir, "violations.txt"), []byte(strings.Join(all, "\n")+"\n"), 0o644)
	fmt.Fprintf(s.cfg.out, "\nlogs: %s\n%d passed, %d failed\n", s.dir, rep.passed, rep.failed)
	return rep, nil
}

// events lists the Events of a parent (all incarnations), oldest first.
func (s *suite) events(ctx context.Context, name string) string {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	evs, err := s.cs.CoreV1().Events(ns).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + name})
	if err != nil {
		return err.Error()
	}
	sort.Slice(evs.Items, func(i, j int) bool { return evs.Items[i].LastTimestamp.Before(&evs.Items[j].LastTimestamp) })
	var out []string
	for _, e := range evs.Items {
		out = append(out, fmt.Sprintf("\n    %s..%s ×%d %s %s (uid %s): %.200s", e.FirstTimestamp.UTC().Format("15:04:05"), e.LastTimestamp.UTC().Format("15:04:05"),
			e.Count, e.Type, e.Reason, e.InvolvedObject.UID, e.Message))
	}
	return strings.Join(out, "")
}

// startServices starts the watchers (which create the streams), waits for
// the streams, then the other services.
func (s *suite) startServices(ctx context.Context, bin string) error {
	common := []string{
		"--kubeconfig=" + s.env.Kubeconfig,
		"--metrics-address=0", "--zap-log-level=info",
	}
	add := func(name, binary string, args ...string) (*proc, error) {
		port, err := testnats.FreePort()
		if err != nil {
			return nil, err
		}
		natsArgs := []string{"--nats-url=" + s.natsURL, fmt.Sprintf("--health-probe-bind-address=127.0.0.1:%d", port)}
		if s.cluster != nil {
			// Through its own proxies, as its own NATS user.
			url, err := s.cluster.ServiceURL(name)
			if err != nil {
				return nil, err
			}
			natsArgs = append(natsArgs[1:], "--nats-url="+url, "--nats-nkey="+s.cluster.Seeds[binary])
		}
		all := append(append(append(append([]string{}, common...), natsArgs...), s.cfg.extraServiceArgs...), args...)
		p := newProc(name, filepath.Join(bin, binary), all, s.dir, s.logf)
		p.readyURL = fmt.Sprintf("http://127.0.0.1:%d/readyz", port)
		s.services = append(s.services, p)
		return p, nil
	}
	watcherArgs := append([]string{}, s.cfg.watcherArgs...)
	if s.cluster != nil {
		watcherArgs = append(watcherArgs, "--stream-replicas=3")
	}
	if s.cfg.watchers > 1 {
		watcherArgs = append(watcherArgs, "--leader-election", "--leader-election-namespace="+leaseNamespace)
		if _, err := s.cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: leaseNamespace}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			return err
		}
	}
	for i := 1; i <= s.cfg.watchers; i++ {
		name := "watcher"
		if s.cfg.watchers > 1 {
			name = fmt.Sprintf("watcher-%d", i)
		}
		w, err := add(name, "watcher", watcherArgs...)
		if err != nil {
			return err
		}
		if err := w.start(); err != nil {
			return err
		}
	}
	if err := waitStreams(ctx, s.connectAdmin, 2*time.Minute); err != nil {
		return fmt.Errorf("%w (watcher log: %s)", err, s.services[0].logPath)
	}
	started := len(s.services)
	for _, kind := range []struct {
		binary string
		n      int
	}{{"dispatcher", s.cfg.dispatchers}, {"applier", s.cfg.appliers}, {"revisions", s.cfg.revisions}} {
		for i := 1; i <= kind.n; i++ {
			name := kind.binary
			if kind.binary != "revisions" || kind.n > 1 {
				name = fmt.Sprintf("%s-%d", kind.binary, i)
			}
			if _, err := add(name, kind.binary); err != nil {
				return err
			}
		}
	}
	for _, p := range s.services[started:] {
		if err := p.start(); err != nil {
			return err
		}
	}
	where := s.natsURL
	if s.cluster != nil {
		where = "3 nodes, each service through its own proxies"
	}
	s.logf("started NATS (%s) and %d services", where, len(s.services))
	t := time.Now()
	for _, p := range s.services {
		if err := p.waitReady(ctx, 3*time.Minute); err != nil {
			s.logf("WARNING: %v; going on", err)
		}
	}
	s.logf("every service ready (/readyz) %s later", since(t))
	return nil
}

// startAppliedLog subscribes to the appliers' notes on every NATS node.
func (s *suite) startAppliedLog() error {
	var conns []*nats.Conn
	if s.cluster == nil {
		nc, err := nats.Connect(s.natsURL, nats.MaxReconnects(-1), nats.ReconnectWait(200*time.Millisecond))
		if err != nil {
			return err
		}
		conns = append(conns, nc)
	} else {
		for _, n := range s.cluster.Nodes {
			// Pinned to this node: no other URL, and the cluster does not
			// advertise any.
			opt, err := nats.NkeyOptionFromSeed(s.cluster.Seeds[testnats.AdminUser])
			if err != nil {
				return err
			}
			nc, err := nats.Connect(n.ClientURL(), opt, nats.MaxReconnects(-1), nats.ReconnectWait(200*time.Millisecond))
			if err != nil {
				for _, c := range conns {
					c.Close()
				}
				return err
			}
			conns = append(conns, nc)
		}
	}
	var err error
	s.applied, err = startAppliedLog(conns)
	return err
}

// waitStreams waits until the watcher created MC_WORK and MC_DESIRED.
func waitStreams(ctx context.Context, connect func() (*nats.Conn, error), timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		err := func() error {
			nc, err := connect()
			if err != nil {
				return err
			}
			defer nc.Close()
			js, err := jetstream.New(nc)
			if err != nil {
				return err
			}
			cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			defer cancel()
			for _, name := range []string{"MC_WORK", "MC_DESIRED", "MC_DLQ"} {
				if _, err := js.Stream(cctx, name); err != nil {
					return fmt.Errorf("stream %s: %w", name, err)
				}
			}
			return nil
		}()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("streams not created within %s: %v", timeout, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// faultPeriod runs the churn and the faults for cfg.faultPeriod, then stops
// the churn (letting started operations finish).
func (s *suite) faultPeriod(ctx context.Context) {
	fctx, stop := context.WithTimeout(ctx, s.cfg.faultPeriod)
	defer stop()
	opCtx, opStop := context.WithTimeout(ctx, s.cfg.faultPeriod+3*time.Minute)
	defer opStop()
	s.hook.misbehave.Store(true)
	var wg sync.WaitGroup
	wg.Go(func() { s.work.churn(fctx, opCtx, s.cfg.churnRate) })
	wg.Go(func() { s.killer(fctx) })
	// NATS node faults and API server restarts one at a time (never two
	// nodes down at once); leader moves and service cuts beside them.
	wg.Go(func() { s.schedule(fctx, ctx, s.nodeEvents()) })
	wg.Go(func() { s.schedule(fctx, ctx, s.spread("stepdown", s.cfg.stepdowns)) })
	wg.Go(func() { s.schedule(fctx, ctx, s.spread("cut", s.cfg.serviceCuts)) })
	<-fctx.Done()
	s.hook.misbehave.Store(false)
	wg.Wait()
	s.logf("churn over: %d creates, %d updates, %d deletes (%d recreated at once), %d operations given up",
		s.work.creates.Load()-int64(s.cfg.parents), s.work.updates.Load(), s.work.deletes.Load(), s.work.recreates.Load(), s.work.failed.Load())
}

// killer SIGKILLs a random service every killInterval (±50%) and starts it
// again at once.
func (s *suite) killer(ctx context.Context) {
	for {
		d := time.Duration(float64(s.cfg.killInterval) * (0.5 + rand.Float64()))
		select {
		case <-ctx.Done():
			return
		case <-time.After(d):
		}
		p := s.services[rand.IntN(len(s.services))]
		if err := p.restart(); err != nil {
			s.faultErr("SIGKILL %s: %v", p.name, err)
			continue
		}
		s.fault("SIGKILL " + kindOf(p.name))
	}
}

func kindOf(name string) string {
	if i := strings.LastIndexByte(name, '-'); i > 0 {
		return name[:i]
	}
	return name
}

// event is a scheduled fault: kind at offset at of the fault period; n
// counts the events of its kind (the n-th node kill aims at the n-th
// target).
type event struct {
	at   time.Duration
	kind string
	n    int
}

// spread places n events of a kind evenly over the fault period.
func (s *suite) spread(kind string, n int) []event {
	var out []event
	for i := range n {
		out = append(out, event{at: s.cfg.faultPeriod * time.Duration(i+1) / time.Duration(n+1), kind: kind, n: i})
	}
	return out
}

// nodeEvents are the faults that take a NATS node or the API server away,
// each kind spread evenly over the period and all of them in time order.
func (s *suite) nodeEvents() []event {
	var evs []event
	evs = append(evs, s.spread("nats", s.cfg.natsRestarts)...)
	evs = append(evs, s.spread("apiserver", s.cfg.apiRestarts)...)
	if s.cluster != nil {
		evs = append(evs, s.spread("rolling", s.cfg.rolling)...)
		evs = append(evs, s.spread("partition", s.cfg.nodePartitions)...)
		evs = append(evs, s.spread("wipe", s.cfg.wipes)...)
		evs = append(evs, s.spread("loss", s.cfg.losses)...)
	}
	sort.SliceStable(evs, func(i, j int) bool { return evs[i].at < evs[j].at })
	return evs
}

// schedule runs events in order, each at its time or right after the one
// before if that ran late; those the fault period ends before are skipped
// (and counted). Each runs to its end (a partition until healed) under
// ctx, even past the period.
func (s *suite) schedule(period, ctx context.Context, events []event) {
	begin := time.Now()
	for i, e := range events {
		select {
		case <-period.Done():
			for _, e := range events[i:] {
				s.mu.Lock()
				s.skipped[e.kind]++
				s.mu.Unlock()
			}
			return
		case <-time.After(time.Until(begin.Add(e.at))):
		}
		s.inject(ctx, e)
	}
}

// inject runs one fault.
func (s *suite) inject(ctx context.Context, e event) {
	t := time.Now()
	switch e.kind {
	case "nats":
		if s.cluster != nil {
			s.killNode(ctx, nodeKillTargets[e.n%len(nodeKillTargets)], false)
			break
		}
		s.restartNATS(ctx)
	case "wipe":
		s.killNode(ctx, "", true)
	case "rolling":
		s.rollingRestart(ctx)
	case "loss":
		s.loseCluster(ctx)
	case "partition":
		// Alternately the node leading MC_WORK and the meta leader.
		s.partitionNode(ctx, []string{bus.WorkStream, "meta", bus.DesiredStream}[e.n%3])
	case "stepdown":
		s.stepDown(ctx)
	case "cut":
		s.cutService(ctx, cutKinds[e.n%len(cutKinds)])
	case "apiserver":
		if err := s.env.RestartAPIServer(ctx, true); err != nil {
			s.faultErr("kube-apiserver restart: %v", err)
			return
		}
		s.fault("kube-apiserver SIGKILL+restart")
		s.logf("kube-apiserver SIGKILLed and back in %s", since(t))
	}
	if e.kind != "stepdown" {
		s.faultOver()
	}
}

// restartNATS SIGKILLs the single nats-server and starts it again on the
// same store and port.
func (s *suite) restartNATS(ctx context.Context) {
	t := time.Now()
	if err := s.nats.kill(); err != nil {
		s.faultErr("SIGKILL nats-server: %v", err)
		return
	}
	downSince := time.Now()
	s.mu.Lock()
	s.natsDown = append(s.natsDown, [2]time.Time{downSince, downSince.Add(24 * time.Hour)})
	s.mu.Unlock()
	time.Sleep(time.Second)
	if err := s.nats.start(); err != nil {
		s.faultErr("start nats-server: %v", err)
		return
	}
	err := waitNATS(ctx, s.natsURL, 2*time.Minute)
	s.mu.Lock()
	s.natsDown[len(s.natsDown)-1][1] = time.Now()
	s.mu.Unlock()
	if err != nil {
		s.faultErr("nats-server after restart: %v", err)
		return
	}
	s.fault("nats-server SIGKILL+restart")
	s.logf("nats-server SIGKILLed and back in %s", since(t))
}

// waitConverged polls the cluster until no parent-related invariant is
// violated, or timeout. It returns how long after from that was.
func (s *suite) waitConverged(ctx context.Context, from time.Time, timeout time.Duration, progress func(violations)) (time.Duration, bool) {
	deadline := time.Now().Add(timeout)
	lastReport := time.Now()
	for {
		v := violations{}
		_, err := checkCluster(ctx, s.dyn, v, s.hook.lastCall)
		if err == nil && v.count(invConverged, invOneChild, invContent, invOrphans, invFinalizers) == 0 {
			return time.Since(from), true
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return 0, false
		}
		if progress != nil && time.Since(lastReport) > 15*time.Second {
			if err != nil {
				s.logf("  check: %v", err)
			} else {
				progress(v)
			}
			lastReport = time.Now()
		}
		time.Sleep(2 * time.Second)
	}
}

// summary is "invariant: n, ..." for the violated invariants.
func summary(v violations) string {
	var parts []string
	for _, inv := range invariants {
		if n := len(v[inv]); n > 0 {
			ex := sorted(v[inv])[0]
			parts = append(parts, fmt.Sprintf("%d× %q (e.g. %s)", n, inv, ex))
		}
	}
	return strings.Join(parts, "; ")
}

func (s *suite) printFigures(st clusterState, converged bool, after time.Duration, last time.Time) {
	w := s.cfg.out
	fmt.Fprintln(w, "\nfigures:")
	s.mu.Lock()
	kinds := make([]string, 0, len(s.faults))
	total := 0
	for k, n := range s.faults {
		kinds = append(kinds, k)
		total += n
	}
	sort.Strings(kinds)
	fmt.Fprintf(w, "  faults injected: %d\n", total)
	for _, k := range kinds {
		fmt.Fprintf(w, "    %-32s %d\n", k, s.faults[k])
	}
	kills := 0
	for _, k := range kinds {
		if strings.HasPrefix(k, "SIGKILL ") {
			kills += s.faults[k]
		}
	}
	errs := append([]string(nil), s.faultErrs...)
	lastFault := s.lastFault
	s.mu.Unlock()
	fmt.Fprintf(w, "    %-32s %d\n", "(service SIGKILLs in all)", kills)
	modes, badParents := s.hook.misbehaviours()
	var nmis int64
	for _, n := range modes {
		nmis += n
	}
	fmt.Fprintf(w, "  hook misbehaviours: %d, on %d parents\n", nmis, badParents)
	for _, m := range []string{modeTimeout, mode5xx, mode429, modeMalformed, modeOversized, modeChunked} {
		fmt.Fprintf(w, "    %-32s %d\n", m, modes[m])
	}
	if s.cluster != nil {
		sum := func(prefix string) int {
			n := 0
			for _, k := range kinds {
				if strings.HasPrefix(k, prefix) {
					n += s.faults[k]
				}
			}
			return n
		}
		fmt.Fprintf(w, "    %-32s %d\n", "(NATS node SIGKILLs in all)", sum("NATS node SIGKILL"))
		fmt.Fprintf(w, "    %-32s %d\n", "(leader moves in all)", sum("stream leader")+sum("consumer leader"))
		fmt.Fprintf(w, "    %-32s %d\n", "(partitions in all)", sum("NATS node partitioned")+sum("service cut"))
		s.mu.Lock()
		var skipped []string
		for k, n := range s.skipped {
			skipped = append(skipped, fmt.Sprintf("%s %d", k, n))
		}
		catchKinds := make([]string, 0, len(s.catchUp))
		for k := range s.catchUp {
			catchKinds = append(catchKinds, k)
		}
		sort.Strings(catchKinds)
		catch := map[string][]time.Duration{}
		for k, ds := range s.catchUp {
			catch[k] = append([]time.Duration(nil), ds...)
		}
		s.mu.Unlock()
		if len(skipped) > 0 {
			sort.Strings(skipped)
			fmt.Fprintf(w, "  faults not injected (the fault period ended first): %s\n", strings.Join(skipped, ", "))
		}
		fmt.Fprintln(w, "  NATS cluster current again (every node's /healthz) after:")
		for _, k := range catchKinds {
			fmt.Fprintf(w, "    %-48s %s\n", k, durations(catch[k]))
		}
		fmt.Fprintf(w, "  nats-server: %s\n", s.natsUsage)
	}
	if len(errs) > 0 {
		fmt.Fprintf(w, "  fault injections that failed: %d\n", len(errs))
		for _, e := range errs {
			fmt.Fprintf(w, "    %s\n", e)
		}
	}
	if len(s.tolerated) > 0 {
		fmt.Fprintf(w, "  services that exited 1 because they started while nats-server was down (started again, as Kubernetes would; -strict-startup fails on these): %d\n", len(s.tolerated))
		for _, e := range s.tolerated {
			fmt.Fprintf(w, "    %s\n", strings.SplitN(e, ";", 2)[0])
		}
	}
	fmt.Fprintf(w, "  hook calls: %d (%d finalize)\n", s.hook.calls.Load(), s.hook.finalizes.Load())
	fmt.Fprintf(w, "  churn: %d creates after the first %d, %d updates, %d deletes (%d recreated under the same name at once), %d operations given up\n",
		s.work.creates.Load()-int64(s.cfg.parents), s.cfg.parents, s.work.updates.Load(), s.work.deletes.Load(), s.work.recreates.Load(), s.work.failed.Load())
	fmt.Fprintf(w, "  at the end: %d parents, %d children\n", st.parents, st.children)
	if converged {
		fmt.Fprintf(w, "  convergence: %s after the last fault (%s), %s after the last fault or write\n",
			last.Add(after).Sub(lastFault).Round(100*time.Millisecond), lastFault.UTC().Format("15:04:05"), after.Round(100*time.Millisecond))
	} else {
		fmt.Fprintf(w, "  convergence: NOT within %s after the last fault or write\n", s.cfg.convergeTimeout)
	}
	if s.idle != "" {
		fmt.Fprintf(w, "  idle before the parents: %s\n", s.idle)
	}
	fmt.Fprintf(w, "  first convergence: %s\n", s.initial)
	fmt.Fprintf(w, "  run time: %s\n", since(s.start))
}

func (s *suite) teardown() {
	if s.track != nil {
		s.track.close()
	}
	for _, p := range s.services {
		p.stop(20 * time.Second)
	}
	if s.nats != nil {
		s.nats.stop(20 * time.Second)
	}
	if s.cluster != nil {
		s.cluster.Close()
	}
	if s.applied != nil {
		s.applied.close()
	}
	if s.hook != nil {
		s.hook.close()
	}
	if s.env != nil {
		if err := s.env.Stop(); err != nil {
			s.logf("stop control plane: %v", err)
		}
	}
}

func since(t time.Time) time.Duration { return time.Since(t).Round(10 * time.Millisecond) }

// countAdvisories counts JetStream advisories on subject (by their last
// two tokens: stream and consumer kind) until the returned function is
// called, which describes them.
func (s *suite) countAdvisories(subject string) func() string {
	nc, err := s.connectAdmin()
	if err != nil {
		return func() string { return err.Error() }
	}
	var mu sync.Mutex
	byStream := map[string]int{}
	total := 0
	_, err = nc.Subscribe(subject, func(m *nats.Msg) {
		tokens := strings.Split(m.Subject, ".")
		stream := tokens[len(tokens)-2]
		mu.Lock()
		byStream[stream]++
		total++
		mu.Unlock()
	})
	if err != nil {
		nc.Close()
		return func() string { return err.Error() }
	}
	return func() string {
		nc.Close()
		mu.Lock()
		defer mu.Unlock()
		return fmt.Sprintf("%d %v", total, byStream)
	}
}

// cpuByGroup is the CPU time used so far by each kind of process: the
// services by kind, nats-server (every node), and the control plane's.
func (s *suite) cpuByGroup() map[string]time.Duration {
	m := map[string]time.Duration{}
	for _, p := range s.services {
		m[kindOf(p.name)] += p.cpu()
	}
	switch {
	case s.cluster != nil:
		m["nats-server"], _, _ = s.cluster.Usage()
	case s.nats != nil:
		m["nats-server"] = s.nats.cpu()
	}
	for name, pid := range s.env.PIDs() {
		used, _, _ := testnats.ProcUsage(pid)
		m[name] += used
	}
	return m
}

// cpuDelta is "group 1.2s, ..." for what each group used between two
// readings, the largest first.
func cpuDelta(before, after map[string]time.Duration) string {
	type use struct {
		name string
		d    time.Duration
	}
	var uses []use
	var total time.Duration
	for name, d := range after {
		uses = append(uses, use{name, d - before[name]})
		total += d - before[name]
	}
	sort.Slice(uses, func(i, j int) bool { return uses[i].d > uses[j].d })
	parts := []string{fmt.Sprintf("%s in all", total.Round(100*time.Millisecond))}
	for _, u := range uses {
		parts = append(parts, fmt.Sprintf("%s %s", u.name, u.d.Round(100*time.Millisecond)))
	}
	return strings.Join(parts, ", ")
}

// durations is "min / median / max" of ds.
func durations(ds []time.Duration) string {
	if len(ds) == 0 {
		return "-"
	}
	ds = append([]time.Duration(nil), ds...)
	sort.Slice(ds, func(i, j int) bool { return ds[i] < ds[j] })
	r := func(d time.Duration) time.Duration { return d.Round(100 * time.Millisecond) }
	return fmt.Sprintf("%s / %s / %s (min / median / max of %d)", r(ds[0]), r(ds[len(ds)/2]), r(ds[len(ds)-1]), len(ds))
}

// mib converts byte counts to MiB.
func mib(bs []int64) []int64 {
	out := make([]int64, len(bs))
	for i, b := range bs {
		out[i] = b >> 20
	}
	return out
}
