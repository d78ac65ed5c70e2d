package main

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"

	"github.com/metabus/metabus/pkg/kubeenv"
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
	dispatchers      int
	appliers         int
	convergeTimeout  time.Duration
	initialTimeout   time.Duration
	workDir          string // "" = a new temporary directory
	keep             bool   // keep workDir even when everything passed
	strictStartup    bool   // an exit at startup during a NATS outage fails too
	out              io.Writer
	extraServiceArgs []string
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
	}
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
}

// duringNATSOutage reports whether a service started while nats-server was
// down (or within 1s before its kill or 2s after its coming back) and exited because it could not
// connect.
func (s *suite) duringNATSOutage(e exitRecord) bool {
	if !strings.Contains(e.tail, "connect to nats") {
		return false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, w := range s.natsDown {
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
	s := &suite{cfg: cfg, start: time.Now(), faults: map[string]int{}}
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
	bin := filepath.Join(s.dir, "bin")
	t := time.Now()
	if err := buildBinaries(ctx, root, bin); err != nil {
		return nil, err
	}
	s.logf("built the services and nats-server in %s", since(t))

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

	// nats-server on a fixed port, then the services.
	port, err := freePort()
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
	if err := s.startServices(ctx, bin); err != nil {
		return nil, err
	}

	if s.hook, err = startHook(s.cfg.badPct, s.cfg.hookTimeout+time.Second); err != nil {
		return nil, err
	}
	if _, err := s.dyn.Resource(ccGVR).Create(ctx, compositeController(s.hook.url, s.cfg.hookTimeout, s.cfg.finalize), metav1.CreateOptions{}); err != nil {
		return nil, err
	}
	if s.track, err = startChildTracker(s.cs); err != nil {
		return nil, err
	}

	// The parents, and their first convergence (no faults yet).
	s.work = newWorkload(s.dyn, s.cfg.parents, s.logf)
	t = time.Now()
	if err := s.work.createAll(ctx); err != nil {
		return nil, fmt.Errorf("create parents: %w", err)
	}
	s.logf("created %d parents in %s", s.cfg.parents, since(t))
	if d, ok := s.waitConverged(ctx, t, s.cfg.initialTimeout, func(v violations) {
		s.logf("  not yet: %s", summary(v))
	}); ok {
		s.logf("all %d parents converged %s after the first create", s.cfg.parents, d.Round(100*time.Millisecond))
	} else {
		s.logf("WARNING: the parents did not all converge within %s before the faults; going on", s.cfg.initialTimeout)
	}

	// The fault period: churn, SIGKILLs, NATS and API server restarts, a
	// misbehaving hook.
	s.logf("fault period: %s", s.cfg.faultPeriod)
	s.faultPeriod(ctx)

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
	dlq, err := dlqEntries(ctx, s.natsURL)
	if err != nil {
		v.add(invDLQ, "cannot read MC_DLQ: %v", err)
	}
	for _, e := range dlq {
		v.add(invDLQ, "%s", e)
	}
	for _, line := range s.track.replaced() {
		v.add(invReplaced, "%s", line)
	}
	// Stop everything and judge the exits.
	for _, p := range s.services {
		if why := p.stop(20 * time.Second); why != "" {
			v.add(invShutdown, "%s %s", p.name, why)
		}
	}
	if why := s.nats.stop(20 * time.Second); why != "" {
		v.add(invShutdown, "nats-server %s", why)
	}
	for _, p := range append(append([]*proc{}, s.services...), s.nats) {
		for _, e := range p.unexpectedExits() {
			if !s.cfg.strictStartup && p != s.nats && s.duringNATSOutage(e) {
				s.tolerated = append(s.tolerated, e.desc)
				continue
			}
			v.add(invExits, "%s", e.desc)
		}
	}

	s.printFigures(st, converged, convergedAfter, last)
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

// startServices starts the watcher (which creates the streams), waits for
// the streams, then the other services.
func (s *suite) startServices(ctx context.Context, bin string) error {
	common := []string{
		"--kubeconfig=" + s.env.Kubeconfig, "--nats-url=" + s.natsURL,
		"--metrics-address=0", "--health-probe-bind-address=0", "--zap-log-level=info",
	}
	add := func(name, binary string, args ...string) *proc {
		p := newProc(name, filepath.Join(bin, binary), append(append(append([]string{}, common...), s.cfg.extraServiceArgs...), args...), s.dir, s.logf)
		s.services = append(s.services, p)
		return p
	}
	w := add("watcher", "watcher")
	if err := w.start(); err != nil {
		return err
	}
	if err := waitStreams(ctx, s.natsURL, 2*time.Minute); err != nil {
		return fmt.Errorf("%w (watcher log: %s)", err, w.logPath)
	}
	for i := 1; i <= s.cfg.dispatchers; i++ {
		add(fmt.Sprintf("dispatcher-%d", i), "dispatcher")
	}
	for i := 1; i <= s.cfg.appliers; i++ {
		add(fmt.Sprintf("applier-%d", i), "applier")
	}
	add("revisions", "revisions")
	for _, p := range s.services[1:] {
		if err := p.start(); err != nil {
			return err
		}
	}
	s.logf("started nats-server (%s) and %d services", s.natsURL, len(s.services))
	return nil
}

// waitStreams waits until the watcher created MC_WORK and MC_DESIRED.
func waitStreams(ctx context.Context, url string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		err := func() error {
			nc, js, err := jsConnect(url)
			if err != nil {
				return err
			}
			defer nc.Close()
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
	wg.Go(func() { s.restarts(fctx) })
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

// restarts restarts nats-server (SIGKILL, same store, same port) and
// kube-apiserver (SIGKILL, same port) at evenly spread moments of the fault
// period, never both at once.
func (s *suite) restarts(ctx context.Context) {
	type event struct {
		at   time.Duration
		kind string
	}
	var events []event
	n := s.cfg.natsRestarts + s.cfg.apiRestarts
	slot := s.cfg.faultPeriod / time.Duration(n+1)
	// Alternate: nats, apiserver, nats, ...
	ni, ai := 0, 0
	for i := 1; i <= n; i++ {
		if ni < s.cfg.natsRestarts && (ni <= ai || ai >= s.cfg.apiRestarts) {
			events = append(events, event{slot * time.Duration(i), "nats"})
			ni++
		} else {
			events = append(events, event{slot * time.Duration(i), "apiserver"})
			ai++
		}
	}
	begin := time.Now()
	for _, e := range events {
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Until(begin.Add(e.at))):
		}
		t := time.Now()
		switch e.kind {
		case "nats":
			if err := s.nats.kill(); err != nil {
				s.faultErr("SIGKILL nats-server: %v", err)
				continue
			}
			downSince := time.Now()
			func() {
				s.mu.Lock()
				defer s.mu.Unlock()
				s.natsDown = append(s.natsDown, [2]time.Time{downSince, downSince.Add(24 * time.Hour)})
			}()
			time.Sleep(time.Second)
			if err := s.nats.start(); err != nil {
				s.faultErr("start nats-server: %v", err)
				continue
			}
			err := waitNATS(ctx, s.natsURL, 2*time.Minute)
			func() {
				s.mu.Lock()
				defer s.mu.Unlock()
				s.natsDown[len(s.natsDown)-1][1] = time.Now()
			}()
			if err != nil {
				s.faultErr("nats-server after restart: %v", err)
				continue
			}
			s.fault("nats-server SIGKILL+restart")
			s.logf("nats-server SIGKILLed and back in %s", since(t))
		case "apiserver":
			if err := s.env.RestartAPIServer(ctx, true); err != nil {
				s.faultErr("kube-apiserver restart: %v", err)
				continue
			}
			s.fault("kube-apiserver SIGKILL+restart")
			s.logf("kube-apiserver SIGKILLed and back in %s", since(t))
		}
	}
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

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
