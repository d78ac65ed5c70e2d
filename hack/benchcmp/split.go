package main

// The metabus-split contender (issue 31): the shipped split deployment as
// separate processes, one each of bin/watcher, bin/dispatcher,
// bin/applier and bin/revisions against a real nats-server configured as
// docker-compose.yaml runs it (deploy/nats/nats-dev.conf: JetStream on a
// file store, no authentication, no TLS), so that every figure can be
// told per stage. The workload, hook, CRDs and control plane are the
// metabus contender's.

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"

	"github.com/metabus/metabus/pkg/childproc"
)

// splitStages are the split deployment's processes, in the order they
// start (the server first; the watcher creates the streams the others
// consume) and as the table lists them.
var splitStages = []string{"nats-server", "watcher", "dispatcher", "applier", "revisions"}

// natsDevConf is the configuration docker-compose.yaml's nats-server runs,
// relative to the repository root.
const natsDevConf = "deploy/nats/nats-dev.conf"

// stageProc is one process of a contender, named by its stage ("controller"
// for a contender that is one process).
type stageProc struct {
	stage string
	pid   int
}

// splitController is the split deployment: its processes, stopped in the
// reverse of the order they started.
type splitController struct {
	procs  []*proc
	stages []string
}

// PID is 0: the split deployment is no single process. What measures a
// contender's CPU or RSS reads processesOf, which lists every stage.
func (s *splitController) PID() int { return 0 }

// Stages lists the running processes by stage.
func (s *splitController) Stages() []stageProc {
	out := make([]stageProc, len(s.procs))
	for i, p := range s.procs {
		out[i] = stageProc{stage: s.stages[i], pid: p.PID()}
	}
	return out
}

// Stop stops the stages before the server, so that they drain their
// connections into a live server.
func (s *splitController) Stop() error {
	var errs []error
	for i := len(s.procs) - 1; i >= 0; i-- {
		errs = append(errs, s.procs[i].Stop())
	}
	return errors.Join(errs...)
}

// processesOf lists a contender's processes: every stage of the split
// deployment, the one process of any other ("controller"), none for the
// harness's raw writer.
func processesOf(c controller) []stageProc {
	if s, ok := c.(interface{ Stages() []stageProc }); ok {
		return s.Stages()
	}
	if pid := c.PID(); pid != 0 {
		return []stageProc{{stage: "controller", pid: pid}}
	}
	return nil
}

// natsConfig rewrites the dev server's configuration for one benchmark
// run: the client port on loopback at listen, monitoring (for /healthz) at
// monitor, the JetStream store in storeDir; every other setting (payload
// limit, memory store) stays as docker-compose.yaml runs it. It fails if
// the file no longer sets one of the three, so a changed layout is not
// silently benchmarked with nats-server's defaults.
func natsConfig(base, listen, monitor, storeDir string) (string, error) {
	for _, s := range []struct {
		setting, replacement string
	}{
		{"listen", "listen: " + listen},
		{"http_port", "http: " + monitor},
		{"store_dir", fmt.Sprintf("store_dir: %q", storeDir)},
	} {
		re := regexp.MustCompile(`(?m)^([ \t]*)` + s.setting + `[ \t]*[:=].*$`)
		if n := len(re.FindAllStringIndex(base, -1)); n != 1 {
			return "", fmt.Errorf("%s: want one %s setting, found %d", natsDevConf, s.setting, n)
		}
		base = re.ReplaceAllString(base, "${1}"+strings.ReplaceAll(s.replacement, "$", "$$"))
	}
	return base, nil
}

// startSplit starts the split deployment: nats-server, then the watcher
// (which creates the streams), then the dispatcher, applier and revisions
// service, each at the flags docker-compose.yaml gives it.
func (r *run) startSplit(ctx context.Context) (*splitController, error) {
	s := &splitController{}
	fail := func(err error) (*splitController, error) { return nil, errors.Join(err, s.Stop()) }
	addrs, err := freeAddrs(2)
	if err != nil {
		return nil, err
	}
	listen, monitor := addrs[0], addrs[1]
	base, err := os.ReadFile(natsDevConf)
	if err != nil {
		return nil, fmt.Errorf("nats-server configuration: %w", err)
	}
	conf, err := natsConfig(string(base), listen, monitor, filepath.Join(r.dir, "nats"))
	if err != nil {
		return nil, err
	}
	confPath := filepath.Join(r.dir, "nats-server.conf")
	if err := os.WriteFile(confPath, []byte(conf), 0o644); err != nil {
		return nil, err
	}
	serverArgs := []string{"--config", confPath}
	if r.cfg.splitPprof {
		addr, err := childproc.FreeAddr()
		if err != nil {
			return nil, err
		}
		_, port, _ := strings.Cut(addr, ":")
		serverArgs = append(serverArgs, "--profile", port)
		r.logf("%s: nats-server serves /debug/pprof at http://127.0.0.1:%s", r.name, port)
	}
	p, err := childproc.Start(ctx, "nats-server", r.cfg.natsServerBin, serverArgs, nil,
		filepath.Join(r.dir, "nats-server.log"), "http://"+monitor+"/healthz?js-enabled-only=true")
	if err != nil {
		return nil, err
	}
	s.procs, s.stages = append(s.procs, p), append(s.stages, "nats-server")
	r.logf("%s: nats-server ready (pid %d, %s)", r.name, p.PID(), confPath)
	r.natsURL = "nats://" + listen
	for _, stage := range splitStages[1:] {
		args := []string{"--zap-log-level=info"}
		if stage == "watcher" {
			args = append(args, r.cfg.flushArgs()...)
			if r.cfg.splitPartitions > 0 {
				args = append(args, fmt.Sprintf("--partitions=%d", r.cfg.splitPartitions))
			}
		}
		if r.cfg.splitPprof {
			addr, err := childproc.FreeAddr()
			if err != nil {
				return fail(err)
			}
			args = append(args, "--pprof-address", addr)
			r.logf("%s: %s serves /debug/pprof at http://%s", r.name, stage, addr)
		}
		p, err := r.startStage(ctx, filepath.Join(r.cfg.binDir, stage), stage, 1, args...)
		if err != nil {
			return fail(err)
		}
		s.procs, s.stages = append(s.procs, p), append(s.stages, stage)
	}
	return s, nil
}

// stageBinaries are the binaries the split contender runs from -bin-dir.
func stageBinaries(binDir string) []string {
	var out []string
	for _, s := range splitStages[1:] {
		out = append(out, filepath.Join(binDir, s))
	}
	return out
}

// stageFigures are one figure of a contender from its processes' values
// (stage -> value): under key the one process's value, or the sum of all
// stages', so that a split deployment's total compares to an all-in-one
// process; and for several stages each one's under key.<stage>.
func stageFigures(key string, values map[string]float64) figures {
	fig := figures{}
	if len(values) == 0 {
		return fig
	}
	sum := 0.0
	for stage, v := range values {
		sum += v
		if len(values) > 1 || stage != "controller" {
			fig[key+"."+stage] = v
		}
	}
	fig[key] = sum
	return fig
}

// perStageKeys are the figures a split deployment reports per stage too.
var perStageKeys = map[string]bool{
	"b1.cpu.controller": true, "b5.rss": true, "b5.rssbig": true,
	"b1.idle": true, "b1.idlelate": true, "idle.cpu": true,
}

// stageRows follows each row of a figure in perStageKeys with one row per
// stage (key.<stage>): where the split deployment's total goes.
func stageRows(rows []row, stages []string) []row {
	var out []row
	for _, r := range rows {
		out = append(out, r)
		if !perStageKeys[r.key] {
			continue
		}
		for _, s := range stages {
			out = append(out, row{key: r.key + "." + s, label: r.label + ", of which " + s, prec: r.prec})
		}
	}
	return out
}

// describeProcs names a contender's processes for the log.
func describeProcs(procs []stageProc) string {
	var parts []string
	for _, p := range procs {
		parts = append(parts, fmt.Sprintf("%s pid %d", p.stage, p.pid))
	}
	if len(parts) == 0 {
		return "in the harness"
	}
	return strings.Join(parts, ", ")
}

// describeStages lists per-stage values for the log, in splitStages'
// order then by name; nothing for a single process.
func describeStages(values map[string]float64, prec int) string {
	if len(values) < 2 {
		return ""
	}
	stages := slices.SortedFunc(maps.Keys(values), func(a, b string) int {
		ia, ib := slices.Index(splitStages, a), slices.Index(splitStages, b)
		if ia != ib {
			return cmp.Compare(ia, ib)
		}
		return strings.Compare(a, b)
	})
	var parts []string
	for _, s := range stages {
		parts = append(parts, fmt.Sprintf("%s %.*f", s, prec, values[s]))
	}
	return " (" + strings.Join(parts, ", ") + ")"
}
