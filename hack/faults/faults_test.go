package main

import (
	"bytes"
	"context"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/metabus/metabus/internal/testing/testbin"
)

// TestFaultsShort is the fault suite on a short budget, as part of `make
// test`: 100 parents, 75s of churn with a SIGKILL of a random service every
// ~2.5s, two nats-server and one kube-apiserver SIGKILL+restart, and a
// misbehaving hook for 10% of the parents. It fails if any invariant is
// violated. The full run is `make faults` (2,000 parents, 5 minutes).
func TestFaultsShort(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the services, nats-server and a control plane")
	}
	cfg := defaultConfig()
	cfg.parents = 100
	cfg.faultPeriod = 75 * time.Second
	cfg.initialTimeout = 5 * time.Minute
	runShort(t, cfg)
}

// runShort runs the suite as a test: its output in the test log, a failed
// invariant a failed test.
func runShort(t *testing.T, cfg config) {
	t.Helper()
	cfg.out = &lineWriter{t: t}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	cfg.binDir = sharedBinaries.Dir(t)
	start := time.Now()
	rep, err := run(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("fault suite took %s", time.Since(start).Round(time.Second))
	if rep.failed > 0 {
		t.Errorf("%d invariant(s) violated (see above; logs kept in %s)", rep.failed, rep.logDir)
	}
}

// TestFaultsClusteredShort is the clustered mode on a short budget, as
// part of `make test`: the production NATS topology (3 nodes, R3 streams,
// the shipped users), 100 parents, 100s of churn with a SIGKILL of a random
// service every ~2.5s, and on the NATS side, one at a time: SIGKILLs of the
// meta leader's node and of MC_WORK's leader's node, a node partitioned from
// the others, a node that lost its store; beside them 2 forced leader moves
// and the three service cuts (a dispatcher mid-hook-call, an applier
// mid-apply, the watcher leader), each partition lasting 15s. It fails if
// any invariant is violated. The full run is `make faults-cluster`.
func TestFaultsClusteredShort(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the services, three nats-servers and a control plane")
	}
	cfg := clusteredConfig()
	cfg.parents = 100
	cfg.faultPeriod = 100 * time.Second
	cfg.natsRestarts, cfg.apiRestarts, cfg.rolling, cfg.wipes, cfg.nodePartitions = 2, 0, 0, 1, 1
	cfg.stepdowns, cfg.serviceCuts = 2, 3
	cfg.appliers, cfg.revisions = 2, 1
	cfg.partitionFor = 15 * time.Second
	cfg.convergeTimeout = 3 * time.Minute
	cfg.initialTimeout = 5 * time.Minute
	runShort(t, cfg)
}

// sharedBinaries are the services and nats-server, built once for both
// tests (the same binaries).
var sharedBinaries = testbin.Once{What: "the services and nats-server", Build: func(dir string) error {
	root, err := repoRoot()
	if err != nil {
		return err
	}
	return buildBinaries(context.Background(), root, dir)
}}

func TestMain(m *testing.M) {
	code := m.Run()
	sharedBinaries.Remove()
	os.Exit(code)
}

// lineWriter sends whole lines to t.Log.
type lineWriter struct {
	t   *testing.T
	mu  sync.Mutex
	buf bytes.Buffer
}

func (w *lineWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf.Write(p)
	for {
		line, err := w.buf.ReadString('\n')
		if err != nil {
			w.buf.WriteString(line)
			return len(p), nil
		}
		w.t.Log(strings.TrimRight(line, "\n"))
	}
}
