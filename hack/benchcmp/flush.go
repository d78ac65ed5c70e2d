package main

// B10, one cache flush (issue 31, item 6): with B1's parents present, the
// cost of one --cache-flush-interval wave, upstream's informer resync and
// metabus's watcher resync of every parent alike (both flags have the same
// name and meaning: every parent is synced again). Both contenders run
// with --cache-flush-interval=-flush-interval when B10 is selected; after
// B1 (and its idle figure) B10 waits for the next wave: from its first hook
// call until 2s without a call or watch event, its duration, hook calls,
// and CPU ms per parent of the controller and the API server (from the
// last look before its first call).

import (
	"context"
	"fmt"
	"time"
)

func b10Rows(cfg *config) []row {
	return []row{
		{key: "b10.secs", label: fmt.Sprintf("B10 one cache flush, %d parents: seconds", cfg.parents), prec: 1},
		{key: "b10.calls", label: "B10 hook calls / parent in the flush", prec: 2},
		{key: "b10.cpu.controller", label: "B10 flush CPU ms / parent: controller", prec: 3},
		{key: "b10.cpu.apiserver", label: "B10 flush CPU ms / parent: kube-apiserver", prec: 3},
		{key: "b10.rss", label: "B10 controller RSS MiB after the flush", prec: 0},
	}
}

// flushArgs are the contender's extra flags for B10.
func (cfg *config) flushArgs() []string {
	if !cfg.scenarios["B10"] || cfg.flushInterval <= 0 {
		return nil
	}
	return []string{fmt.Sprintf("--cache-flush-interval=%s", cfg.flushInterval)}
}

func (r *run) b10(ctx context.Context) error {
	pid := r.ctrl.PID()
	if pid == 0 {
		return nil
	}
	n := float64(r.cfg.parents)
	pids := map[string]int{"controller": pid, "apiserver": r.cl.pid("kube-apiserver")}
	before := map[string]float64{}
	for role, p := range pids {
		c, err := procCPU(p)
		if err != nil {
			return err
		}
		before[role] = c
	}
	waitFrom := time.Now()
	calls0 := r.hook.total.Load()
	deadline := waitFrom.Add(r.cfg.flushInterval + 2*time.Minute)
	for r.hook.total.Load() == calls0 {
		if time.Now().After(deadline) {
			return fmt.Errorf("no cache flush within %s", deadline.Sub(waitFrom))
		}
		if err := sleepCtx(ctx, 10*time.Millisecond); err != nil {
			return err
		}
		// The CPU counted starts at the last look before the wave: what
		// the controller did while waiting (after B1 upstream was still
		// busy for minutes) is not the flush's.
		for role, p := range pids {
			if c, err := procCPU(p); err == nil {
				before[role] = c
			}
		}
	}
	first := time.Now()
	r.waitQuiet(ctx, 2*time.Second, 30*time.Minute)
	end := time.Now().Add(-2 * time.Second)
	calls := r.hook.total.Load() - calls0
	for role, p := range pids {
		c, err := procCPU(p)
		if err != nil {
			return err
		}
		r.fig["b10.cpu."+role] = (c - before[role]) * 1000 / n
	}
	r.fig["b10.secs"] = end.Sub(first).Seconds()
	r.fig["b10.calls"] = float64(calls) / n
	if rss, err := procRSS(pid); err == nil {
		r.fig["b10.rss"] = float64(rss) / (1 << 20)
	}
	r.logf("%s B10: a cache flush began %.1fs after B1 settled and took %.1fs: %d hook calls for %d parents, CPU ms/parent controller %.3f, kube-apiserver %.3f, RSS %.0f MiB",
		r.name, first.Sub(waitFrom).Seconds(), r.fig["b10.secs"], calls, r.cfg.parents, r.fig["b10.cpu.controller"], r.fig["b10.cpu.apiserver"], r.fig["b10.rss"])
	return nil
}
