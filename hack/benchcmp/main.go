// Command benchcmp compares, in one run on one machine, three ways of
// running the same CompositeController workload, each against its own fresh
// local control plane (etcd + kube-apiserver from internal/testing/kubeenv, no
// kube-controller-manager, so nothing else talks to the API server):
//
//   - raw: the harness itself does only the necessary writes, 64 concurrent
//     (the physical limit of the API server on this machine);
//   - raw-contract: the same writer making the writes upstream's calling
//     contract needs (status {childCount: 0} with the ConfigMap's create,
//     then {childCount: 1}): three writes, the bound of any controller
//     that keeps the contract;
//   - contract-floor: floorctl (hack/benchcmp/floorctl, built at start),
//     the least controller that keeps that contract, as a process of
//     its own: informers on parents and children, a work queue, the
//     hook called on every change and only the contract's writes; its
//     controller CPU per parent is the bound of any controller's (B1
//     only; only when named);
//   - metabus: the all-in-one binary (bin/metabus) at its defaults;
//   - metabus-ssa: the same binary with --apply-strategy=server-side-apply
//     (upstream's option; B1-B5);
//   - metabus-echo: the same binary at its defaults, with the workload's
//     controller annotated metabus.dev/suppress-echoes=true (the opt-in
//     that hides metabus's own writes from a fixpoint hook; B1-B5);
//   - metabus-identity: the same binary at its defaults, with the
//     workload's controller acting as a ServiceAccount granted only the
//     workload's namespace (metabus.dev/service-account): what
//     impersonated writes and reviewed reads cost; B1-B5);
//   - metabus-split: the split deployment (issue 31), five processes: a
//     nats-server built at go.mod's version with docker-compose.yaml's
//     configuration (deploy/nats/nats-dev.conf), and one bin/watcher,
//     bin/dispatcher, bin/applier and bin/revisions each (-bin-dir) at
//     docker-compose.yaml's flags; its CPU and RSS rows are the sum,
//     each followed by one row per process ("of which watcher"); B1-B5;
//   - baseline: another metabus build (-baseline), e.g. the one before a
//     change, with the same flags: its effect measured in the same run;
//   - upstream: upstream Metacontroller, tuned (--workers=50
//     --client-go-qps=500 --client-go-burst=1000), when -upstream or
//     $MC_BIN names its binary.
//
// The workload: a namespaced Bench CRD; a CompositeController with one
// InPlace ConfigMap child whose sync hook (in the harness, no latency)
// returns a ConfigMap with data.gen = spec.gen and status {childCount,
// observedGen}. A parent has converged when the harness's watches have seen
// childCount 1, the current observedGen and the ConfigMap at the current
// gen. Figures:
//
//	B1  -parents parents created by 50 clients: parents/s, hook calls and API
//	    requests (by verb, no watches, not the harness's) per parent, CPU ms
//	    per parent of the controller, kube-apiserver and etcd; then the
//	    controller's idle CPU with the parents present, 5 s and -late-idle
//	    (60 s) after B1 has settled (the first still holds the burst's
//	    garbage collection)
//	B2  idle latency of 100 sequential updates: p50/p99 to the ConfigMap
//	    and to the status watch event
//	B3  100 back-to-back updates of one parent: hook calls, and whether the
//	    last call saw the final gen
//	B4  resyncPeriodSeconds=10: API requests per no-op resync over 25s
//	B5  controller RSS after B1 (and after -rss-parents more)
//	B6  noisy neighbour (issue #12), in the same controller process: 50
//	    more parents and 100 sequential updates (round-robin), each waiting
//	    at most 30s for the parent's ConfigMap at the new gen: p50/p99
//	    update → ConfigMap ("B alone"); then a second CRD (Stall) and
//	    CompositeController A whose sync hook hangs until its 10s webhook
//	    timeout, with 200 parents; once A's calls hang at full concurrency
//	    (the number in flight has not risen for 5s: 16 = metabus's
//	    dispatcher workers before per-controller isolation, 50 = upstream's
//	    --workers), B's 100 updates again: p50/p99 ("beside hanging A",
//	    an update not converged counts as >30000) and how many did not
//	    reach their ConfigMap within 30s (so B6 takes up to 50 minutes when
//	    every update stalls); then, A still hanging, a DecoratorController
//	    created for 20 existing labelled ConfigMaps (hook answering at
//	    once, resyncPeriodSeconds 2): the time until all 20 are decorated
//	    (its first full convergence) and the intervals between its hook
//	    calls per ConfigMap over the next 12s (its resyncs), p50/p99. The
//	    raw contender has no B6.
//	B7  dispatcher replicas (issue #12; issue 31 adds upstream): a
//	    CompositeController on a third CRD (Slow) whose sync hook answers
//	    after 200ms; for 1, 2 and 4 dispatchers (the all-in-one's own, plus
//	    bin/dispatcher processes joining its embedded JetStream over TCP,
//	    and with -b7-appliers as many bin/applier processes), or upstream
//	    restarted with --workers 16, 32 and 64 (the same total workers),
//	    500 new parents (-b7-parents): parents/s to convergence, hook
//	    calls per parent and per second (until quiet) against the ideal
//	    replicas × 16 workers / 200ms, the most hook calls at once, and
//	    cores busy per process (controller, extra stage processes,
//	    kube-apiserver, etcd, the harness with its hook)
//	B8  many controllers (issue #12, metabus only): B7 with the parents
//	    spread over 1,000 DecoratorControllers (-b8-controllers) of a
//	    fourth CRD (SlowD), 5 new parents each (-b8-parents) per
//	    dispatcher count, after a warm-up of one parent per controller
//	B9  per-event CPU with many controllers (issue 31; metabus and
//	    upstream): with 1, 100 and 1,000 controllers installed (all but one
//	    idle DecoratorControllers), 100 sequential changes of one parent's
//	    ConfigMap: controller CPU ms per change (idle subtracted), change →
//	    hook call p50, RSS
//	B10 one cache flush (issue 31): after B1, the next
//	    --cache-flush-interval wave (-flush-interval, both contenders):
//	    its duration, hook calls and CPU ms per parent; with B5 and a large
//	    -parents, the 100,000-parent report
//	B11 a rolling update of a 10-Pod parent (issue 31; metabus and
//	    upstream), RollingRecreate and RollingInPlace gated on Ready, the
//	    harness playing the kubelet: ms, hook calls and controller CPU per
//	    Pod moved
//
// -scenarios selects scenarios (default B1-B8; all: B1-B11), e.g.
// -scenarios B6 for the noisy neighbour alone (after a one-parent
// warm-up); B5's first figure and B10 need B1, and the raw contender runs
// only with B1. make bench-scale runs B7, B9 and B11 beside upstream.
//
// Controllers run as separate processes; CPU and RSS come from /proc (idle
// CPU to the nanosecond from the threads' schedstat, the rest from
// /proc/<pid>/stat, which ticks every 10 ms). A contender of several processes (metabus-split) reports their
// sum where the others report their one process, and each process in a
// row of its own. It prints one table and asserts nothing about speed. Run from the repository
// root, with KUBE_BIN_DIR set as by `make bench`:
//
//	go build -o bin/ ./cmd/... &&
//	KUBE_BIN_DIR=$(hack/kubeenv/build.sh | tail -1) go run ./hack/benchcmp -upstream /path/to/metacontroller
//
// B6 alone (without the table's other rows, and without raw):
//
//	go run ./hack/benchcmp -scenarios B6 -upstream /path/to/metacontroller
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/metabus/metabus/internal/testing/testnats"
	"github.com/metabus/metabus/pkg/bus"
	"github.com/metabus/metabus/pkg/identity"
)

type config struct {
	parents    int
	rssParents int
	rounds     int
	scenarios  map[string]bool
	contenders []string
	metabusBin string
	// baselineBin is another metabus build run beside metabus, with the
	// same flags (-baseline): a change's effect measured in one run.
	baselineBin string
	metabusArgs []string
	upstreamBin string
	crdDir      string
	logDir      string
	timeout     time.Duration
	// b7Parents are B7's new parents per dispatcher count; b8Controllers
	// and b8Parents B8's controllers and new parents per controller.
	b7Parents, b8Controllers, b8Parents int
	// b7Appliers starts as many applier replicas as dispatchers in B7/B8.
	b7Appliers bool
	// flushInterval is both contenders' --cache-flush-interval in B10.
	flushInterval time.Duration
	// binDir holds the split contender's stage binaries (-bin-dir, by
	// default -metabus's directory); natsServerBin is the nats-server
	// setup builds for it.
	binDir, natsServerBin string
	// splitPprof serves /debug/pprof from each of metabus-split's
	// processes on a loopback port (logged), for profiling a run.
	splitPprof bool
	// splitPartitions, if set, is the split watcher's --partitions: the
	// partition count of MC_WORK and MC_DESIRED, so of each stage
	// replica's consumers and leases (0: a new install's default, bus.DefaultPartitions).
	splitPartitions int
	// floorctlBin is the contract-floor contender's binary, built by
	// setup.
	floorctlBin string
	// lateIdle is how long after B1 has settled the late idle figure
	// starts (0: not measured).
	lateIdle time.Duration
}

func main() {
	var (
		cfg         config
		only        string
		scenarios   string
		metabusArgs string
	)
	flag.IntVar(&cfg.parents, "parents", 2000, "B1: parents created by 50 concurrent clients")
	flag.IntVar(&cfg.rssParents, "rss-parents", 0, "B5: this many more parents before reading RSS again (0: skip)")
	flag.IntVar(&cfg.rounds, "rounds", 1, "rounds; contenders are interleaved and the table shows median [min–max]")
	flag.StringVar(&only, "only", "raw,raw-contract,metabus,metabus-ssa,metabus-echo,baseline,upstream", "contenders to run (contract-floor, metabus-identity and metabus-split only when named; baseline only with -baseline, upstream only with -upstream or $MC_BIN)")
	flag.StringVar(&scenarios, "scenarios", "default", "scenarios to run, e.g. \"B6\" or \"B1,B2\" (default: B1-B8; all: B1-B11)")
	flag.IntVar(&cfg.b7Parents, "b7-parents", 500, "B7: new parents per dispatcher count")
	flag.IntVar(&cfg.b8Controllers, "b8-controllers", 1000, "B8: DecoratorControllers")
	flag.IntVar(&cfg.b8Parents, "b8-parents", 5, "B8: new parents per controller and dispatcher count")
	flag.BoolVar(&cfg.b7Appliers, "b7-appliers", false, "B7, B8: start an applier process beside each dispatcher process (the stages scaled together)")
	flag.DurationVar(&cfg.flushInterval, "flush-interval", 10*time.Minute, "B10: the contenders' --cache-flush-interval; longer than B1 takes")
	flag.StringVar(&cfg.metabusBin, "metabus", "bin/metabus", "the all-in-one metabus binary (go build -o bin/ ./cmd/...)")
	flag.StringVar(&cfg.baselineBin, "baseline", "", "another all-in-one metabus build to run as contender \"baseline\" (B1-B6), e.g. the build before a change")
	flag.StringVar(&metabusArgs, "metabus-args", "", "extra flags for the all-in-one metabus, e.g. \"--client-go-qps=1000\" (not for metabus-split's stages)")
	flag.StringVar(&cfg.binDir, "bin-dir", "", "metabus-split: the directory of bin/watcher, bin/dispatcher, bin/applier, bin/revisions (default: -metabus's directory)")
	flag.IntVar(&cfg.splitPartitions, "split-partitions", 0, "metabus-split: the watcher's --partitions (0: its default, "+strconv.Itoa(bus.DefaultPartitions)+" on a new install)")
	flag.BoolVar(&cfg.splitPprof, "split-pprof", false, "metabus-split: serve /debug/pprof from each process on a loopback port named in the log")
	flag.DurationVar(&cfg.lateIdle, "late-idle", time.Minute, "B1: measure idle CPU again (20s) this long after B1 has settled, with its parents present (0: skip)")
	flag.StringVar(&cfg.upstreamBin, "upstream", os.Getenv("MC_BIN"), "upstream metacontroller binary (default $MC_BIN)")
	flag.StringVar(&cfg.crdDir, "crds", "deploy/crds", "metacontroller CRDs to install")
	flag.StringVar(&cfg.logDir, "logs", "", "directory for the contenders' logs (default: a new temporary directory)")
	flag.DurationVar(&cfg.timeout, "timeout", 15*time.Minute, "how long B1 may take to converge")
	flag.Parse()
	cfg.metabusArgs = splitArgs(metabusArgs)

	if err := setup(&cfg, only, scenarios, flag.CommandLine.Lookup("only").Value.String() != flag.CommandLine.Lookup("only").DefValue); err != nil {
		fmt.Fprintln(os.Stderr, "benchcmp:", err)
		os.Exit(2)
	}
	ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer cancel()
	if err := benchmark(ctx, &cfg); err != nil {
		fmt.Fprintln(os.Stderr, "benchcmp:", err)
		os.Exit(1)
	}
}

// setup validates the flags and creates the log directory.
func setup(cfg *config, only, scenarios string, onlyGiven bool) error {
	cs, err := parseContenders(only)
	if err != nil {
		return err
	}
	if cfg.scenarios, err = parseScenarios(scenarios); err != nil {
		return err
	}
	for _, c := range cs {
		switch c {
		case "raw", "raw-contract":
			// raw only has B1 (and B5's RSS, which is 0 for it).
			if !cfg.scenarios["B1"] {
				if onlyGiven {
					return fmt.Errorf("%s selected but it only runs B1, which -scenarios leaves out", c)
				}
				continue
			}
		case "contract-floor":
			// floorctl is B1's bound: it has no resync, no second
			// controller, nothing B2-B11 ask of a controller.
			if !cfg.scenarios["B1"] {
				return fmt.Errorf("%s selected but it only runs B1, which -scenarios leaves out", c)
			}
		case "metabus", "metabus-ssa", "metabus-echo", "metabus-identity":
			if err := checkExecutable(cfg.metabusBin); err != nil {
				return fmt.Errorf("%s: %w (build it with: go build -o bin/ ./cmd/...)", c, err)
			}
		case "metabus-split":
			if cfg.binDir == "" {
				cfg.binDir = filepath.Dir(cfg.metabusBin)
			}
			for _, bin := range stageBinaries(cfg.binDir) {
				if err := checkExecutable(bin); err != nil {
					return fmt.Errorf("%s: %w (build them with: go build -o bin/ ./cmd/...)", c, err)
				}
			}
			if _, err := os.Stat(natsDevConf); err != nil {
				return fmt.Errorf("%s: %w (run from the repository root)", c, err)
			}
			if cfg.splitPartitions != 0 {
				if err := bus.ValidPartitions(cfg.splitPartitions); err != nil {
					return fmt.Errorf("-split-partitions: %w", err)
				}
			}
		case "baseline":
			if cfg.baselineBin == "" {
				if onlyGiven {
					return fmt.Errorf("baseline selected but no binary: pass -baseline /path/to/metabus")
				}
				continue
			}
			if err := checkExecutable(cfg.baselineBin); err != nil {
				return fmt.Errorf("baseline: %w", err)
			}
		case "upstream":
			if cfg.upstreamBin == "" {
				if onlyGiven {
					return fmt.Errorf("upstream selected but no binary: pass -upstream /path/to/metacontroller or set MC_BIN")
				}
				continue
			}
			if err := checkExecutable(cfg.upstreamBin); err != nil {
				return fmt.Errorf("upstream: %w", err)
			}
		}
		cfg.contenders = append(cfg.contenders, c)
	}
	if cfg.scenarios["B10"] && (!cfg.scenarios["B1"] || cfg.flushInterval <= 0) {
		return fmt.Errorf("B10 measures a cache flush of B1's parents: select B1 too and set -flush-interval longer than B1 takes")
	}
	if cfg.parents < 1 || cfg.rounds < 1 || cfg.rssParents < 0 {
		return fmt.Errorf("-parents and -rounds must be positive, -rss-parents not negative")
	}
	if _, err := os.Stat(cfg.crdDir); err != nil {
		return fmt.Errorf("CRDs: %w (run from the repository root or pass -crds)", err)
	}
	if cfg.logDir == "" {
		if cfg.logDir, err = os.MkdirTemp("", "benchcmp-"); err != nil {
			return err
		}
	} else if err := os.MkdirAll(cfg.logDir, 0o755); err != nil {
		return err
	}
	if slices.Contains(cfg.contenders, "contract-floor") {
		if cfg.floorctlBin, err = buildFloorctl(context.Background(), cfg.logDir); err != nil {
			return fmt.Errorf("contract-floor: %w (run from the repository root)", err)
		}
	}
	if slices.Contains(cfg.contenders, "metabus-split") {
		if cfg.natsServerBin, err = testnats.BuildServer(context.Background(), cfg.logDir); err != nil {
			return fmt.Errorf("metabus-split: %w", err)
		}
	}
	return nil
}

func checkExecutable(path string) error {
	st, err := os.Stat(path)
	if err != nil {
		return err
	}
	if st.IsDir() || st.Mode()&0o111 == 0 {
		return fmt.Errorf("%s is not an executable file", path)
	}
	return nil
}

func benchmark(ctx context.Context, cfg *config) error {
	logFile, err := os.Create(cfg.logDir + "/benchcmp.log")
	if err != nil {
		return err
	}
	defer logFile.Close()
	var mu sync.Mutex
	start := time.Now()
	// Progress goes to stderr and benchcmp.log; the control planes' own
	// chatter only to the log.
	logf := func(format string, args ...any) {
		line := fmt.Sprintf("[%6.1fs] ", time.Since(start).Seconds()) + fmt.Sprintf(format, args...) + "\n"
		mu.Lock()
		defer mu.Unlock()
		_, _ = io.WriteString(logFile, line)
		if !strings.HasPrefix(format, "kubeenv") {
			_, _ = io.WriteString(os.Stderr, line)
		}
	}
	b1 := ""
	if cfg.scenarios["B1"] {
		b1 = fmt.Sprintf(", %d parents", cfg.parents)
	}
	logf("benchcmp: %s, scenarios %s%s, %d round(s); logs in %s", strings.Join(cfg.contenders, ", "), strings.Join(selectedScenarios(cfg), ","), b1, cfg.rounds, cfg.logDir)
	for _, c := range cfg.contenders {
		switch c {
		case "metabus":
			logf("metabus: %s %s", cfg.metabusBin, strings.Join(cfg.metabusArgs, " "))
		case "metabus-ssa":
			logf("metabus-ssa: %s %s", cfg.metabusBin, strings.Join(append(slices.Clone(cfg.metabusArgs), ssaArgs...), " "))
		case "metabus-echo":
			logf("metabus-echo: %s %s (controller annotated %s=true)", cfg.metabusBin, strings.Join(cfg.metabusArgs, " "), bus.SuppressEchoesAnnotation)
		case "metabus-identity":
			logf("metabus-identity: %s %s (controller annotated %s=%s)", cfg.metabusBin, strings.Join(cfg.metabusArgs, " "), identity.ServiceAccountAnnotation, benchIdentity)
		case "metabus-split":
			parts := "the watcher's default"
			if cfg.splitPartitions > 0 {
				parts = strconv.Itoa(cfg.splitPartitions)
			}
			logf("metabus-split: %s and %s, stages from %s (partitions: %s)", cfg.natsServerBin, natsDevConf, cfg.binDir, parts)
		case "contract-floor":
			logf("contract-floor: %s (from %s)", cfg.floorctlBin, floorctlPkg)
		case "baseline":
			logf("baseline: %s %s", cfg.baselineBin, strings.Join(cfg.metabusArgs, " "))
		case "upstream":
			logf("upstream: %s %s", cfg.upstreamBin, strings.Join(upstreamTuned, " "))
		}
	}

	results := map[string][]figures{}
	var failures []string
	for round := 1; round <= cfg.rounds; round++ {
		for _, c := range cfg.contenders {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			logf("round %d/%d: %s", round, cfg.rounds, c)
			fig, err := runContender(ctx, cfg, c, round, logf)
			if err != nil {
				logf("round %d: %s FAILED: %v", round, c, err)
				failures = append(failures, fmt.Sprintf("round %d %s: %v", round, c, err))
			}
			results[c] = append(results[c], fig)
		}
	}
	printTable(os.Stdout, cfg, results)
	fmt.Printf("logs: %s\n", cfg.logDir)
	if len(failures) > 0 {
		return fmt.Errorf("%d run(s) failed:\n  %s", len(failures), strings.Join(failures, "\n  "))
	}
	return nil
}

func selectedScenarios(cfg *config) []string {
	var out []string
	for _, n := range scenarioNames {
		if cfg.scenarios[n] {
			out = append(out, n)
		}
	}
	return out
}

// row is one line of the table.
type row struct {
	key, label string
	prec       int
	yesNo      bool
	// pair, if set, is a second key printed in the same cell ("key / pair").
	pair string
}

// tableRows are the rows of the selected scenarios.
func tableRows(cfg *config) []row {
	var out []row
	for _, r := range allRows(cfg) {
		scenario, _, _ := strings.Cut(r.key, ".")
		if scenario == "idle" || cfg.scenarios[strings.ToUpper(scenario)] { // idle: measured in every run
			out = append(out, r)
		}
	}
	return out
}

func allRows(cfg *config) []row {
	rows := []row{
		{key: "b1.rate", label: fmt.Sprintf("B1 parents/s (%d parents)", cfg.parents), prec: 1},
		{key: "b1.hooks", label: "B1 hook calls / parent", prec: 2},
	}
	for _, v := range verbColumns {
		rows = append(rows, row{key: "b1.req." + v, label: "B1 API " + v + " / parent", prec: 2})
	}
	rows = append(rows,
		row{key: "b1.req.total", label: "B1 API requests / parent (no watches)", prec: 2},
		row{key: "b1.cpu.controller", label: "B1 CPU ms / parent: controller", prec: 2},
		row{key: "b1.cpu.apiserver", label: "B1 CPU ms / parent: kube-apiserver", prec: 2},
		row{key: "b1.cpu.etcd", label: "B1 CPU ms / parent: etcd", prec: 2},
		row{key: "b2.cm.p50", label: "B2 idle update → ConfigMap p50 ms", prec: 1},
		row{key: "b2.cm.p99", label: "B2 idle update → ConfigMap p99 ms", prec: 1},
		row{key: "b2.st.p50", label: "B2 idle update → status p50 ms", prec: 1},
		row{key: "b2.st.p99", label: "B2 idle update → status p99 ms", prec: 1},
		row{key: "b3.hooks", label: "B3 hook calls for 100 rapid updates", prec: 0},
		row{key: "b3.final", label: "B3 last hook call saw final gen", yesNo: true},
		row{key: "b3.ms", label: "B3 final state ms after the last update", prec: 0},
		row{key: "b4.per", label: "B4 API requests / parent / no-op resync", prec: 2},
		row{key: "b4.hooks", label: "B4 hook calls in 25s (resync 10s)", prec: 0},
		row{key: "b5.rss", label: "B5 controller RSS MiB after B1", prec: 0},
		row{key: "b1.idle", label: fmt.Sprintf("idle controller CPU ms/s (%d parents, after B1)", cfg.parents), prec: 1},
	)
	if cfg.lateIdle > 0 {
		rows = append(rows, row{key: "b1.idlelate", label: fmt.Sprintf("idle controller CPU ms/s (%d parents, %.0f s after B1)", cfg.parents, cfg.lateIdle.Seconds()), prec: 1})
	}
	rows = append(rows,
		row{key: "idle.cpu", label: "idle controller CPU ms/s (1 parent)", prec: 1},
	)
	if cfg.rssParents > 0 {
		rows = append(rows, row{key: "b5.rssbig", label: fmt.Sprintf("B5 controller RSS MiB, +%d parents", cfg.rssParents), prec: 0})
	}
	rows = append(rows,
		row{key: "b6.alone.p50", pair: "b6.alone.p99", label: "B6: B alone p50/p99 ms", prec: 1},
		row{key: "b6.hanging", label: "B6: A hook calls hanging at once", prec: 0},
		row{key: "b6.beside.p50", pair: "b6.beside.p99", label: "B6: B beside hanging A p50/p99 ms", prec: 1},
		row{key: "b6.stuck", label: fmt.Sprintf("B6: B updates not converged in %s", b6Cap), prec: 0},
		row{key: "b6.new", label: fmt.Sprintf("B6: new DecoratorController beside hanging A: %d ConfigMaps decorated ms", b6Decorated), prec: 0},
		row{key: "b6.resync.p50", pair: "b6.resync.p99", label: fmt.Sprintf("B6: its resync (%ds) beside hanging A: interval p50/p99 ms", b6Resync), prec: 0},
	)
	rows = append(rows, dispatcherRows("B7", "")...)
	rows = append(rows, dispatcherRows("B8", fmt.Sprintf(", %d controllers", cfg.b8Controllers))...)
	rows = append(rows, b9Rows()...)
	rows = append(rows, b10Rows(cfg)...)
	rows = append(rows, b11Rows()...)
	if slices.Contains(cfg.contenders, "metabus-split") {
		rows = stageRows(rows, splitStages)
	}
	return rows
}

func column(results map[string][]figures, contender, key string) []float64 {
	var xs []float64
	for _, f := range results[contender] {
		v, ok := f[key]
		if !ok {
			v = math.NaN()
		}
		xs = append(xs, v)
	}
	return xs
}

func printTable(w io.Writer, cfg *config, results map[string][]figures) {
	fmt.Fprintln(w)
	head := "figure"
	if cfg.rounds > 1 {
		head = fmt.Sprintf("figure (median [min–max] of %d rounds)", cfg.rounds)
	}
	names := map[string]string{"raw": "raw client", "raw-contract": "raw client (contract's writes)", "contract-floor": "contract floor (floorctl)", "metabus": "metabus (defaults)", "metabus-ssa": "metabus (server-side apply)",
		"metabus-echo": "metabus (echo opt-in)", "metabus-identity": "metabus (controller identity)", "metabus-split": "metabus (split, 5 processes)",
		"baseline": "metabus baseline", "upstream": "upstream (tuned)"}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprint(tw, head)
	for _, c := range cfg.contenders {
		fmt.Fprint(tw, "\t", names[c])
	}
	fmt.Fprintln(tw)
	for _, r := range tableRows(cfg) {
		fmt.Fprint(tw, r.label)
		for _, c := range cfg.contenders {
			xs := column(results, c, r.key)
			cell := formatSpread(summarize(xs), r.prec)
			switch {
			case r.yesNo:
				cell = formatYesNo(xs)
			case r.pair != "":
				cell = formatPair(summarize(xs), summarize(column(results, c, r.pair)), r.prec, ms(b6Cap))
			}
			fmt.Fprint(tw, "\t", cell)
		}
		fmt.Fprintln(tw)
	}
	_ = tw.Flush()
	if cfg.scenarios["B1"] {
		fmt.Fprintln(w, summaryLine(cfg, results))
	}
}

// controllerCPU is each contender's median B1 controller CPU ms per parent.
func controllerCPU(cfg *config, results map[string][]figures) map[string]float64 {
	out := map[string]float64{}
	for _, c := range cfg.contenders {
		out[c] = summarize(column(results, c, "b1.cpu.controller")).Median
	}
	return out
}

// summaryLine puts the B1 rates side by side, as ratios.
func summaryLine(cfg *config, results map[string][]figures) string {
	rate := map[string]float64{}
	for _, c := range cfg.contenders {
		rate[c] = summarize(column(results, c, "b1.rate")).Median
	}
	var parts []string
	for _, c := range cfg.contenders {
		if math.IsNaN(rate[c]) {
			parts = append(parts, c+" failed")
			continue
		}
		p := fmt.Sprintf("%s %.1f parents/s", c, rate[c])
		if c != "raw" && !math.IsNaN(rate["raw"]) && rate["raw"] > 0 {
			p += fmt.Sprintf(" (%.2f× raw)", rate[c]/rate["raw"])
		}
		parts = append(parts, p)
	}
	s := "summary: " + strings.Join(parts, ", ")
	if m, u := rate["metabus"], rate["upstream"]; !math.IsNaN(m) && !math.IsNaN(u) && u > 0 && m > 0 {
		s += fmt.Sprintf("; metabus/upstream %.2f×", m/u)
	}
	// The contract's own bound: what the three writes alone allow against
	// upstream's rate in the same run, the most any controller keeping the
	// contract can reach here.
	if c, u := rate["raw-contract"], rate["upstream"]; !math.IsNaN(c) && !math.IsNaN(u) && u > 0 && c > 0 {
		s += fmt.Sprintf("; raw-contract/upstream %.2f× (the contract's bound)", c/u)
	}
	s += floorSummary(controllerCPU(cfg, results))
	if m, b := rate["metabus"], rate["baseline"]; !math.IsNaN(m) && !math.IsNaN(b) && b > 0 && m > 0 {
		s += fmt.Sprintf("; metabus/baseline %.2f×", m/b)
	}
	if m, a := rate["metabus"], rate["metabus-ssa"]; !math.IsNaN(m) && !math.IsNaN(a) && a > 0 && m > 0 {
		s += fmt.Sprintf("; server-side/dynamic apply %.2f×", a/m)
	}
	if m, e := rate["metabus"], rate["metabus-echo"]; !math.IsNaN(m) && !math.IsNaN(e) && e > 0 && m > 0 {
		s += fmt.Sprintf("; echo opt-in/defaults %.2f×", e/m)
	}
	if m, i := rate["metabus"], rate["metabus-identity"]; !math.IsNaN(m) && !math.IsNaN(i) && i > 0 && m > 0 {
		s += fmt.Sprintf("; controller identity/defaults %.2f×", i/m)
	}
	if m, sp := rate["metabus"], rate["metabus-split"]; !math.IsNaN(m) && !math.IsNaN(sp) && sp > 0 && m > 0 {
		s += fmt.Sprintf("; split/all-in-one %.2f×", sp/m)
	}
	return s
}
