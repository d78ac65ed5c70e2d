// Command faults is metabus's fault-injection suite (issue #13): the real
// service binaries as separate processes (a watcher, two dispatchers, two
// appliers, the revisions service) against a real nats-server (built from
// the Go module, JetStream on a file store, 8MB max_payload), a fresh local
// control plane with kube-controller-manager (internal/testing/kubeenv, so garbage
// collection runs) and a hook server in this process.
//
// The workload is a CompositeController with one InPlace ConfigMap child
// per parent, a sync and a finalize hook. -parents parents are created and
// converge; then, for -fault-period, the suite churns them (spec updates,
// deletes, deletes followed at once by a recreate under the same name) while
// it injects faults:
//
//   - SIGKILL of a random service every ~-kill-interval, started again at once;
//   - -nats-restarts SIGKILLs of nats-server, restarted on the same store
//     and port;
//   - -apiserver-restarts SIGKILLs of kube-apiserver, restarted on the same
//     port (watches break and resume or relist);
//   - a hook that, for -bad-percent of the parents, answers about half of
//     the calls with a timeout (the webhook timeout is -hook-timeout), a 5xx,
//     a 429 with Retry-After, malformed JSON or a body over the 8MB limit
//     (at most 3 in a row per parent, and only during the fault period, so
//     convergence stays possible).
//
// -cluster runs the production topology instead (internal/testing/testnats's Cluster):
// three nats-server processes from the shipped deploy/nats/nats-server.conf
// and cluster.conf (the services' nkey users and permissions), R3 streams
// (--stream-replicas=3), two watchers with leader election, three appliers,
// two revisions services, every service connected through TCP proxies of
// its own. Its defaults are the full clustered run (15 minutes), and on top
// of the faults above, one at a time on the NATS side:
//
//   - -nats-restarts SIGKILLs of a node, started again on its store: in
//     turn the meta leader, the leaders of MC_WORK, MC_DESIRED and
//     KV_MC_OWNERS (found through /jsz and the JetStream API) and a random
//     node;
//   - -rolling-restarts of every node in turn, as the StatefulSet rolls
//     them (lame-duck mode, then the next once ready);
//   - -wipes: a node SIGKILLed and its store deleted (a lost disk) before
//     it starts again;
//   - -node-partitions: a node cut from the other two (its clients still
//     reach it) for -partition-for;
//
// and beside them -leader-moves forced stream or consumer leader
// stepdowns, and -service-cuts services cut from NATS but not from the API
// server for -partition-for: a dispatcher in the middle of a hook call, an
// applier in the middle of applying a desired state, the watcher leader.
//
// Then it waits (at most -converge-timeout) for convergence and checks the
// invariants over the API server and the bus: every parent converged to
// what the hook wants, exactly one child each with the right content and a
// controllerRef to the current parent UID, no orphaned children after GC, no
// parent stuck in deletion, MC_DLQ empty, no process exited that the suite
// did not kill, every service stops cleanly on SIGTERM, no child replaced,
// no desired state applied out of order (from the appliers' Applied notes:
// per parent, the work sequences of its writes in resourceVersion order
// never go down) and, clustered, every node current again after each NATS
// fault. It prints the figures (faults by kind, the time to converge after
// the last fault) and ends with "N passed, M failed"; the exit status is 1
// if an invariant failed, 2 if the suite itself could not run.
//
// Run from the repository root (make faults, FAULTS_ARGS for flags):
//
//	KUBE_BIN_DIR=$(hack/kubeenv/build.sh | tail -1) go run ./hack/faults -parents 2000 -fault-period 5m
//	KUBE_BIN_DIR=$(hack/kubeenv/build.sh | tail -1) go run ./hack/faults -cluster
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
)

func main() {
	cfg := defaultConfig()
	// -cluster changes the other flags' defaults: look for it first.
	for _, a := range os.Args[1:] {
		if a == "-cluster" || a == "--cluster" || a == "-cluster=true" || a == "--cluster=true" {
			cfg = clusteredConfig()
		}
	}
	var extra, watcherExtra string
	flag.BoolVar(&cfg.cluster, "cluster", cfg.cluster, "the production topology: 3 NATS nodes, R3 streams, the shipped NATS users (changes the defaults to the full clustered run)")
	flag.IntVar(&cfg.parents, "parents", cfg.parents, "parents of the workload")
	flag.DurationVar(&cfg.faultPeriod, "fault-period", cfg.faultPeriod, "how long the churn and the faults last")
	flag.DurationVar(&cfg.killInterval, "kill-interval", cfg.killInterval, "mean time between two SIGKILLs of a random service")
	flag.IntVar(&cfg.natsRestarts, "nats-restarts", cfg.natsRestarts, "nats-server SIGKILL+restarts during the fault period")
	flag.IntVar(&cfg.apiRestarts, "apiserver-restarts", cfg.apiRestarts, "kube-apiserver SIGKILL+restarts during the fault period")
	flag.Float64Var(&cfg.churnRate, "churn-rate", cfg.churnRate, "churn operations per second")
	flag.IntVar(&cfg.badPct, "bad-percent", cfg.badPct, "percentage of parents whose hook calls misbehave during the fault period")
	flag.DurationVar(&cfg.hookTimeout, "hook-timeout", cfg.hookTimeout, "the webhook timeout of the controller")
	flag.BoolVar(&cfg.suppressEchoes, "suppress-echoes", cfg.suppressEchoes, "opt the controller into echo suppression (metabus.dev/suppress-echoes; the appliers then broadcast Applied notes, which the order check also reads)")
	flag.BoolVar(&cfg.finalize, "finalize", cfg.finalize, "give the controller a finalize hook (parents then carry its finalizer)")
	flag.IntVar(&cfg.dispatchers, "dispatchers", cfg.dispatchers, "dispatcher replicas")
	flag.IntVar(&cfg.appliers, "appliers", cfg.appliers, "applier replicas")
	flag.DurationVar(&cfg.convergeTimeout, "converge-timeout", cfg.convergeTimeout, "how long convergence may take after the last fault")
	flag.DurationVar(&cfg.initialTimeout, "initial-timeout", cfg.initialTimeout, "how long the first convergence may take, before the faults")
	flag.StringVar(&cfg.workDir, "dir", "", "work directory for binaries, stores and logs (default: a new temporary directory, removed if everything passed)")
	flag.BoolVar(&cfg.keep, "keep", false, "keep the temporary work directory even if everything passed")
	flag.BoolVar(&cfg.strictStartup, "strict-startup", false, "count a service that exits because it started while nats-server was down as a failure (by default it is started again, as Kubernetes would, and listed)")
	flag.IntVar(&cfg.watchers, "watchers", cfg.watchers, "watcher replicas (more than one: with leader election)")
	flag.IntVar(&cfg.revisions, "revisions", cfg.revisions, "revisions service replicas")
	flag.IntVar(&cfg.rolling, "rolling-restarts", cfg.rolling, "-cluster: rolling restarts of every NATS node")
	flag.IntVar(&cfg.stepdowns, "leader-moves", cfg.stepdowns, "-cluster: forced stream or consumer leader stepdowns")
	flag.IntVar(&cfg.nodePartitions, "node-partitions", cfg.nodePartitions, "-cluster: a NATS node cut from the other two")
	flag.IntVar(&cfg.serviceCuts, "service-cuts", cfg.serviceCuts, "-cluster: a service cut from NATS, not from the API server (dispatcher mid-hook-call, applier mid-apply, watcher leader, in turn)")
	flag.IntVar(&cfg.wipes, "wipes", cfg.wipes, "-cluster: a NATS node SIGKILLed and its store deleted before it restarts")
	flag.IntVar(&cfg.losses, "cluster-losses", cfg.losses, "-cluster: the whole NATS cluster lost (every node SIGKILLed, every store wiped, started empty)")
	flag.DurationVar(&cfg.partitionFor, "partition-for", cfg.partitionFor, "-cluster: how long a partition or a cut lasts")
	flag.BoolVar(&cfg.initialOnly, "initial-only", false, "measure the first convergence of the parents (and the CPU each kind of process used meanwhile), then check and stop: no churn, no faults")
	flag.DurationVar(&cfg.natsProfile, "nats-profile", 0, "-cluster: save a CPU profile of every NATS node over this long from the first create (<dir>/nats-N.cpu.pprof)")
	flag.StringVar(&watcherExtra, "watcher-args", "", "extra flags for the watchers, space separated (e.g. --partitions=16)")
	flag.StringVar(&extra, "service-args", "", "extra flags for every service, space separated")
	flag.Parse()
	cfg.extraServiceArgs = strings.Fields(extra)
	cfg.watcherArgs = strings.Fields(watcherExtra)
	if cfg.parents < 1 || cfg.faultPeriod <= 0 || cfg.killInterval <= 0 || cfg.churnRate <= 0 || cfg.dispatchers < 1 || cfg.appliers < 1 || cfg.watchers < 1 || cfg.revisions < 1 {
		fmt.Fprintln(os.Stderr, "faults: -parents, -fault-period, -kill-interval, -churn-rate, -watchers, -dispatchers, -appliers and -revisions must be positive")
		os.Exit(2)
	}

	ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer cancel()
	rep, err := run(ctx, cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, "faults:", err)
		os.Exit(2)
	}
	if rep.failed > 0 {
		os.Exit(1)
	}
}
