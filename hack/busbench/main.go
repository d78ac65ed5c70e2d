// Command busbench measures the bus alone, without Kubernetes: how the
// consumer topology of MC_WORK and MC_DESIRED (bus.DefaultPartitions by default, -partitions; each consumed
// by the one replica holding its lease in MC_OWNERS, parents serialized in
// the owner, --workers per controller and --max-in-flight per replica;
// pkg/jsbus/owned.go) scales with replicas, workers and controllers, and what
// it costs the NATS server (issue #12).
//
// A real nats-server runs as a separate process (built from the module
// cache, JetStream on file, a fresh store for every run), so its CPU and
// RSS come from /proc/<pid>. The bench process runs R "dispatcher" replicas
// and R "applier" replicas, each on its own NATS connection running
// jsbus.Consume as the services do. A dispatcher decodes the work item,
// simulates a hook of latency -hook, publishes a desired state with
// jsbus.Publisher.PublishDesired (as services/dispatcher does) and acks; an
// applier decodes the desired state, makes the real applier's superseded
// check (a direct get of the parent's last desired state when the consumer
// has messages pending; -superseded-check=false to skip it) and acks. A
// publisher (32 goroutines, one connection) publishes one work item per
// (controller, parent) with jsbus.Publisher.PublishWork.
//
// Figures (it asserts nothing about speed):
//
//	(1) cost, hook 0: for -cost-replicas × -controllers, -items work items
//	    spread over the controllers: end-to-end items/s (publish → applier
//	    ack), publish → ack latency, nats-server CPU ms and messages per
//	    item, bench-process CPU per item, nats-server RSS after the run;
//	    and, before the first run of each R, nats-server CPU, messages and
//	    RSS over -idle with no traffic (lease and member renewals, pull
//	    requests, heartbeats): the fixed cost.
//	(2) concurrency, hook -hook (200 ms): 1 controller × -parents parents
//	    for each of -conc-replicas, then -many-controllers ×
//	    -many-parents with one replica: syncs/s over the whole run and
//	    between 10% and 90% of completions, next to the ideal
//	    min(R × workers, R × max-in-flight, parents) / hook, and the most
//	    hooks seen running at once.
//
// Run from the repository root (it builds nats-server with `go build`):
//
//	go run ./hack/busbench [-only cost,conc] [-parents 2000] ...
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/metabus/metabus/pkg/bus"
	"github.com/metabus/metabus/pkg/jsbus"
	"github.com/metabus/metabus/pkg/natsx"
	"github.com/metabus/metabus/pkg/outcome"
)

type config struct {
	items        int
	controllers  []int
	costReplicas []int
	idle         time.Duration
	hook         time.Duration
	parents      int
	concReplicas []int
	manyCtrls    int
	manyParents  int
	workers      int
	maxInFlight  int
	superseded   bool
	runTimeout   time.Duration
	memory       bool
	partitions   int
	only         map[string]bool
	serverBin    string
	keep         bool
}

func main() {
	var c config
	var ctrls, costR, concR, only string
	flag.IntVar(&c.items, "items", 10000, "work items per cost run")
	flag.StringVar(&ctrls, "controllers", "10,100,1000", "controller counts of the cost runs (items spread over them)")
	flag.StringVar(&costR, "cost-replicas", "1,8", "replicas per stage of the cost runs")
	flag.DurationVar(&c.idle, "idle", 10*time.Second, "idle measurement per cost replica count (0: none)")
	flag.DurationVar(&c.hook, "hook", 200*time.Millisecond, "simulated hook latency of the concurrency runs")
	flag.IntVar(&c.parents, "parents", 2000, "parents of the one-controller concurrency runs")
	flag.StringVar(&concR, "conc-replicas", "1,2,4,8", "replicas per stage of the one-controller concurrency runs")
	flag.IntVar(&c.manyCtrls, "many-controllers", 1000, "controllers of the many-controller concurrency run (0: none)")
	flag.IntVar(&c.manyParents, "many-parents", 5, "parents per controller of the many-controller concurrency run")
	flag.IntVar(&c.workers, "workers", 16, "per-controller concurrency of a replica (--workers)")
	flag.IntVar(&c.maxInFlight, "max-in-flight", jsbus.DefaultMaxInFlight, "concurrency of a replica in all (--max-in-flight)")
	flag.BoolVar(&c.superseded, "superseded-check", true, "applier makes the real applier's superseded lookup (direct get) when messages are pending")
	flag.DurationVar(&c.runTimeout, "run-timeout", 90*time.Second, "give up on a run after this long")
	flag.IntVar(&c.partitions, "partitions", bus.DefaultPartitions, "partition count of MC_WORK and MC_DESIRED (bus.Options.Partitions)")
	flag.BoolVar(&c.memory, "memory-queues", false, "MC_WORK and MC_DESIRED in memory (bus.Options.MemoryQueues, as the all-in-one's embedded server)")
	flag.StringVar(&only, "only", "cost,conc", "parts to run: cost, conc")
	flag.StringVar(&c.serverBin, "nats-server", "", "nats-server binary (default: go build it from the module cache)")
	flag.BoolVar(&c.keep, "keep", false, "keep the temporary directory (server logs and stores)")
	flag.Parse()
	var err error
	if c.controllers, err = ints(ctrls); err == nil {
		if c.costReplicas, err = ints(costR); err == nil {
			c.concReplicas, err = ints(concR)
		}
	}
	if err != nil {
		fatal(err)
	}
	c.only = map[string]bool{}
	for _, s := range strings.Split(only, ",") {
		c.only[strings.TrimSpace(s)] = true
	}

	if err := run(c); err != nil {
		fatal(err)
	}
}

func run(c config) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	tmp, err := os.MkdirTemp("", "busbench-")
	if err != nil {
		return err
	}
	if c.keep {
		fmt.Fprintf(os.Stderr, "busbench: temporary directory %s kept\n", tmp)
	} else {
		defer os.RemoveAll(tmp)
	}
	if c.serverBin == "" {
		c.serverBin = filepath.Join(tmp, "nats-server")
		cmd := exec.CommandContext(ctx, "go", "build", "-o", c.serverBin, "github.com/nats-io/nats-server/v2")
		cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
		if err := cmd.Run(); err != nil {
			return fmt.Errorf("build nats-server: %w", err)
		}
	}
	version, _ := exec.Command(c.serverBin, "--version").Output()
	storage := "file-stored MC_WORK/MC_DESIRED (bus.Options{}, as production)"
	if c.memory {
		storage = "MC_WORK/MC_DESIRED in memory (bus.Options{MemoryQueues: true})"
	}
	fmt.Printf("busbench: %s (separate process), %s, %d partitions,\n",
		strings.TrimSpace(string(version)), storage, c.partitions)
	fmt.Printf("  workers %d per controller, max-in-flight %d per replica, superseded check %v, %d cores, commit %s\n",
		c.workers, c.maxInFlight, c.superseded, numCPU(), commit())

	fmt.Printf("  load average at start: %s (other processes skew every figure: run on a quiet machine)\n", loadavg())
	defer func() { fmt.Printf("\nload average at end: %s\n", loadavg()) }()
	b := &bench{c: c, tmp: tmp}
	if c.only["cost"] {
		if err := b.cost(ctx); err != nil {
			return err
		}
	}
	if c.only["conc"] && ctx.Err() == nil {
		if err := b.concurrency(ctx); err != nil {
			return err
		}
	}
	return ctx.Err()
}

type bench struct {
	c   config
	tmp string
	n   int // runs so far (store directory names)
}

func (b *bench) cost(ctx context.Context) error {
	fmt.Printf("\n(1) cost: hook 0, %d work items per run (publish → dispatcher → PublishDesired → applier ack), fresh server per run\n", b.c.items)
	tw := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "R\tcontrollers\tparents/ctrl\titems/s\tp50 ms\tp99 ms\tsrv CPU ms/item\tsrv msgs/item\tbench CPU ms/item\tsrv RSS MiB (peak)\tpartitions/replica\terrors\t")
	var idle []string
	for _, r := range b.c.costReplicas {
		for i, nc := range b.c.controllers {
			if ctx.Err() != nil {
				return nil
			}
			per := max(1, b.c.items/nc)
			env, err := b.start(ctx, r, 0)
			if err != nil {
				return err
			}
			if i == 0 && b.c.idle > 0 {
				idle = append(idle, env.measureIdle(ctx, b.c.idle))
			}
			res := env.run(ctx, workload(nc, per), b.c.runTimeout)
			env.stop()
			fmt.Fprintf(tw, "%d\t%d\t%d\t%s\t%.1f\t%.1f\t%.3f\t%.1f\t%.3f\t%.0f (%.0f)\t%s\t%d\t\n",
				r, nc, per, res.rate(), ms(res.p50), ms(res.p99), res.srvCPU.Seconds()*1000/float64(res.n),
				float64(res.srvMsgs)/float64(res.n), res.selfCPU.Seconds()*1000/float64(res.n),
				mib(res.rss), mib(res.hwm), env.spread, res.errors)
			progress("cost R=%d controllers=%d: %s items/s", r, nc, res.rate())
		}
	}
	tw.Flush()
	fmt.Println("  partitions/replica: fewest-most partitions a dispatcher | applier replica owns (rendezvous hashing); srv msgs in+out from /varz")
	if len(idle) > 0 {
		fmt.Printf("\nidle: R replicas per stage, no traffic, over %s\n", b.c.idle)
		tw := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "R\tsrv CPU ms/s\tsrv msgs/s in+out\tMC_OWNERS writes/s\tbench CPU ms/s\tsrv RSS MiB\t")
		for _, l := range idle {
			fmt.Fprintln(tw, l)
		}
		tw.Flush()
	}
	return nil
}

func (b *bench) concurrency(ctx context.Context) error {
	h := b.c.hook
	fmt.Printf("\n(2) concurrency: hook %s, one work item per parent; ideal = min(R×workers per controller, R×max-in-flight, parents)/hook;\n", h)
	fmt.Printf("    the previous topology (every replica pulls every partition, MaxAckPending 1) capped a stage at %d running: %.0f/s\n",
		b.c.partitions, float64(b.c.partitions)/h.Seconds())
	tw := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "R\tcontrollers × parents\tsyncs/s\tsyncs/s 10-90%\tideal\tideal (this spread)\tmost running\tideal running\telapsed s\tsrv CPU ms/item\tsrv msgs/item\tpartitions/replica\terrors\t")
	type run struct{ r, ctrls, parents int }
	var runs []run
	for _, r := range b.c.concReplicas {
		runs = append(runs, run{r, 1, b.c.parents})
	}
	if b.c.manyCtrls > 0 {
		runs = append(runs, run{1, b.c.manyCtrls, b.c.manyParents})
	}
	for _, rn := range runs {
		if ctx.Err() != nil {
			return nil
		}
		env, err := b.start(ctx, rn.r, h)
		if err != nil {
			return err
		}
		items := workload(rn.ctrls, rn.parents)
		busiest := env.busiest(items)
		res := env.run(ctx, items, b.c.runTimeout)
		env.stop()
		perCtrl := min(b.c.workers, rn.parents)
		ideal := min(rn.r*perCtrl*rn.ctrls, rn.r*b.c.maxInFlight, rn.ctrls*rn.parents)
		// The busiest replica, running min(workers per controller ×
		// controllers, max-in-flight) at a time, finishes last.
		perReplica := min(perCtrl*rn.ctrls, b.c.maxInFlight)
		spreadIdeal := float64(len(items)) / (float64(busiest) * h.Seconds() / float64(perReplica))
		fmt.Fprintf(tw, "%d\t%d × %d\t%s\t%.0f\t%.0f\t%.0f\t%d\t%d\t%.1f\t%.3f\t%.1f\t%s\t%d\t\n",
			rn.r, rn.ctrls, rn.parents, res.rate(), res.midRate, float64(ideal)/h.Seconds(), min(spreadIdeal, float64(ideal)/h.Seconds()),
			res.maxRunning, ideal, res.elapsed.Seconds(), res.srvCPU.Seconds()*1000/float64(res.n),
			float64(res.srvMsgs)/float64(res.n), env.spread, res.errors)
		progress("concurrency R=%d %d × %d: %s syncs/s", rn.r, rn.ctrls, rn.parents, res.rate())
	}
	tw.Flush()
	fmt.Println("  ideal (this spread): a burst ends when the dispatcher replica owning the most of its parents (by partition) is done")
	return nil
}

// workload is one work item per (controller, parent), controllers
// interleaved. UIDs look random, as Kubernetes UIDs do: the partition
// transform (FNV-1a mod 64) spreads counter-like keys badly.
func workload(ctrls, parents int) []bus.WorkItem {
	items := make([]bus.WorkItem, 0, ctrls*parents)
	for p := 0; p < parents; p++ {
		for c := 0; c < ctrls; c++ {
			name := fmt.Sprintf("bench-%04d", c)
			items = append(items, bus.WorkItem{
				Controller: bus.ControllerRef{Kind: "CompositeController", Name: name,
					UID: uuid.NewSHA1(uuid.NameSpaceOID, []byte(name)).String()},
				Parent: bus.ObjectRef{
					APIVersion: "test.metabus.dev/v1", Kind: "Widget", Resource: "widgets",
					Namespace: "bench", Name: fmt.Sprintf("widget-%04d-%06d", c, p),
					UID:             uuid.NewSHA1(uuid.NameSpaceOID, []byte(fmt.Sprintf("%d/%d", c, p))).String(),
					ResourceVersion: "123456", Generation: 3,
				},
				Reason: bus.ReasonEvent,
			})
		}
	}
	return items
}

// env is one fresh server with R replicas per stage.
type env struct {
	c      config
	srv    *server
	nc     *nats.Conn
	js     jetstream.JetStream
	hook   time.Duration
	cancel context.CancelFunc
	done   []chan error
	conns  []*nats.Conn
	spread string // partitions per replica: work min-max | desired min-max
	// workOwner is the member owning each MC_WORK partition.
	workOwner []string
	errors    atomic.Int64
	lastErr   atomic.Value
	errMu     sync.Mutex
	errKinds  map[string]int

	// per run
	index      map[string]int // parent UID → item
	start      []atomic.Int64 // unix ns: work item published
	end        []atomic.Int64 // unix ns: desired state acked (first time)
	applied    atomic.Int64
	dups       atomic.Int64
	running    atomic.Int64
	maxRunning atomic.Int64
	progress   chan struct{}
}

func (b *bench) start(ctx context.Context, replicas int, hook time.Duration) (*env, error) {
	b.n++
	srv, err := startServer(ctx, b.c.serverBin, filepath.Join(b.tmp, fmt.Sprintf("run%02d", b.n)))
	if err != nil {
		return nil, err
	}
	e := &env{c: b.c, srv: srv, hook: hook, progress: make(chan struct{}, 1)}
	ok := false
	defer func() {
		if !ok {
			e.stop()
		}
	}()
	e.nc, e.js, err = natsx.Connect(natsx.ConnOptions{URL: srv.url, Name: "busbench-admin"})
	if err != nil {
		return nil, err
	}
	ectx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := jsbus.Ensure(ectx, e.js, bus.Options{MemoryQueues: b.c.memory, Partitions: b.c.partitions}); err != nil {
		return nil, fmt.Errorf("ensure: %w", err)
	}
	rctx, rcancel := context.WithCancel(context.Background())
	e.cancel = rcancel
	members := map[string][]string{}
	for _, stage := range []string{bus.WorkStage, bus.DesiredStage} {
		for i := 0; i < replicas; i++ {
			nc, js, err := natsx.Connect(natsx.ConnOptions{URL: srv.url, Name: fmt.Sprintf("busbench-%s-%d", stage, i)})
			if err != nil {
				return nil, err
			}
			e.conns = append(e.conns, nc)
			member := jsbus.NewMemberID()
			members[stage] = append(members[stage], member)
			cc := jsbus.ConsumeConfig{
				Stream: bus.WorkStream, Prefix: bus.WorkConsumerPrefix, Stage: bus.WorkStage,
				PerController: b.c.workers, Total: b.c.maxInFlight, Member: member,
				OnError: e.onError,
			}
			h := e.dispatcher(js)
			if stage == bus.DesiredStage {
				cc.Stream, cc.Prefix, cc.Stage, cc.Ordered = bus.DesiredStream, bus.DesiredConsumerPrefix, bus.DesiredStage, true
				h = e.applier(js)
			}
			done := make(chan error, 1)
			e.done = append(e.done, done)
			go func() { done <- jsbus.Consume(rctx, js, cc, h) }()
		}
	}
	t0 := time.Now()
	spread, err := e.waitBalanced(ctx, members)
	if err != nil {
		return nil, err
	}
	progress("%d replicas per stage own the partitions as assigned (%s) %s after starting", replicas, spread, time.Since(t0).Round(10*time.Millisecond))
	e.spread = spread
	e.workOwner = jsbus.Assign(members[bus.WorkStage], b.c.partitions)
	ok = true
	return e, nil
}

func (e *env) onError(err error) {
	e.errors.Add(1)
	e.lastErr.Store(err.Error())
	// By kind: digits (partitions, sequences, ids) folded.
	kind := strings.Map(func(r rune) rune {
		if r >= '0' && r <= '9' {
			return 'N'
		}
		return r
	}, err.Error())
	e.errMu.Lock()
	if e.errKinds == nil {
		e.errKinds = map[string]int{}
	}
	e.errKinds[kind]++
	e.errMu.Unlock()
}

// errorKinds returns the errors seen so far by kind, most frequent first,
// and forgets them.
func (e *env) errorKinds() []string {
	e.errMu.Lock()
	defer e.errMu.Unlock()
	var out []string
	for k, n := range e.errKinds {
		out = append(out, fmt.Sprintf("%6d × %s", n, k))
	}
	sort.Sort(sort.Reverse(sort.StringSlice(out)))
	e.errKinds = nil
	return out
}

// waitBalanced waits until every partition of both stages is leased to
// the member rendezvous hashing assigns it to, and returns the spread.
func (e *env) waitBalanced(ctx context.Context, members map[string][]string) (string, error) {
	kv, err := e.js.KeyValue(ctx, bus.OwnersBucket)
	if err != nil {
		return "", err
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		var spread []string
		balanced := true
		for _, stage := range []string{bus.WorkStage, bus.DesiredStage} {
			want := jsbus.Assign(members[stage], e.c.partitions)
			count := map[string]int{}
			for p := 0; p < e.c.partitions; p++ {
				ent, err := kv.Get(ctx, bus.LeaseKey(stage, e.c.partitions, p))
				if err != nil || string(ent.Value()) != want[p] {
					balanced = false
				}
				count[want[p]]++
			}
			lo, hi := e.c.partitions, 0
			for _, m := range members[stage] {
				lo, hi = min(lo, count[m]), max(hi, count[m])
			}
			spread = append(spread, fmt.Sprintf("%d-%d", lo, hi))
		}
		if balanced {
			return strings.Join(spread, " | "), nil
		}
		if time.Now().After(deadline) {
			return "", errors.New("partitions not leased as assigned after 60s")
		}
		select {
		case <-ctx.Done():
			return "", ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func (e *env) dispatcher(js jetstream.JetStream) jsbus.Handler {
	pub := jsbus.Publisher{JS: js}
	return func(ctx context.Context, m jetstream.Msg) outcome.Outcome {
		n := e.running.Add(1)
		defer e.running.Add(-1)
		for cur := e.maxRunning.Load(); n > cur && !e.maxRunning.CompareAndSwap(cur, n); cur = e.maxRunning.Load() {
		}
		var item bus.WorkItem
		if err := jsbus.Decode(m, bus.TypeSyncRequested, &item); err != nil {
			e.onError(err)
			return outcome.Terminal("malformed work item")
		}
		seq, _, err := jsbus.Meta(m)
		if err != nil {
			return outcome.Retry(time.Second, 0)
		}
		if e.hook > 0 {
			t := time.NewTimer(e.hook)
			select {
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
				return outcome.Outcome{}
			}
		}
		ds := bus.DesiredState{
			Controller: item.Controller, Parent: item.Parent, WorkSeq: seq, Hook: "sync",
			Children:   []*unstructured.Unstructured{},
			Status:     map[string]any{"observedGeneration": item.Parent.Generation},
			ProducedAt: time.Now(),
		}
		if err := pub.PublishDesired(ctx, ds); err != nil {
			e.onError(err)
			return outcome.Retry(time.Second, 0)
		}
		return outcome.Done()
	}
}

func (e *env) applier(js jetstream.JetStream) jsbus.Handler {
	var stream jetstream.Stream
	var once sync.Once
	return func(ctx context.Context, m jetstream.Msg) outcome.Outcome {
		var ds bus.DesiredState
		if err := jsbus.Decode(m, bus.TypeDesired, &ds); err != nil {
			e.onError(err)
			return outcome.Terminal("malformed desired state")
		}
		md, err := m.Metadata()
		if err != nil {
			return outcome.Retry(time.Second, 0)
		}
		if e.c.superseded && !jsbus.NewerQueued(ctx) && md.NumPending > 0 {
			once.Do(func() { stream, _ = js.Stream(ctx, bus.DesiredStream) })
			if stream != nil {
				_, _ = stream.GetLastMsgForSubject(ctx, bus.StoredDesiredSubject(ds.Controller.ID(), ds.Parent.UID))
			}
		}
		if err := jsbus.LeaseValid(ctx); err != nil {
			return outcome.Outcome{} // the ack would be dropped: the new owner applies it
		}
		i, ok := e.index[ds.Parent.UID]
		if !ok {
			return outcome.Done()
		}
		if !e.end[i].CompareAndSwap(0, time.Now().UnixNano()) {
			e.dups.Add(1)
			return outcome.Done()
		}
		e.applied.Add(1)
		select {
		case e.progress <- struct{}{}:
		default:
		}
		return outcome.Done()
	}
}

type result struct {
	n, done          int
	elapsed          time.Duration
	p50, p99         time.Duration
	midRate          float64
	srvCPU, selfCPU  time.Duration
	srvMsgs          uint64
	rss, hwm         uint64
	errors, dups     int64
	maxRunning       int64
	timedOut         bool
	lastErr          string
	publishFailures  int64
	publishedAlready int64
}

func (r result) rate() string {
	s := fmt.Sprintf("%.0f", float64(r.done)/r.elapsed.Seconds())
	if r.timedOut {
		s += fmt.Sprintf(" (timed out, %d/%d)", r.done, r.n)
	}
	return s
}

// run publishes items and waits until the appliers have acked all of them.
func (e *env) run(ctx context.Context, items []bus.WorkItem, timeout time.Duration) result {
	n := len(items)
	e.index = make(map[string]int, n)
	for i, it := range items {
		e.index[it.Parent.UID] = i
	}
	e.start = make([]atomic.Int64, n)
	e.end = make([]atomic.Int64, n)
	e.applied.Store(0)
	e.maxRunning.Store(0)
	err0 := e.errors.Load()
	srv0, _, _ := procStat(e.srv.pid)
	self0, _, _ := procStat(os.Getpid())
	v0, _ := e.srv.varz()
	t0 := time.Now()

	var pubFail, already atomic.Int64
	var next atomic.Int64
	var wg sync.WaitGroup
	pub := jsbus.Publisher{JS: e.js}
	for w := 0; w < 32; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1)) - 1
				if i >= n || ctx.Err() != nil {
					return
				}
				now := time.Now()
				e.start[i].Store(now.UnixNano())
				items[i].EnqueuedAt = now
				pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
				queued, err := pub.PublishWork(pctx, items[i])
				cancel()
				switch {
				case err != nil:
					pubFail.Add(1)
					e.onError(err)
				case !queued:
					already.Add(1)
				}
			}
		}()
	}
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	timedOut := false
wait:
	for e.applied.Load() < int64(n) {
		select {
		case <-e.progress:
		case <-time.After(50 * time.Millisecond):
		case <-deadline.C:
			timedOut = true
			break wait
		case <-ctx.Done():
			timedOut = true
			break wait
		}
	}
	elapsed := time.Since(t0)
	wg.Wait()
	srv1, rss, hwm := procStat(e.srv.pid)
	self1, _, _ := procStat(os.Getpid())
	v1, _ := e.srv.varz()

	res := result{
		n: n, done: int(e.applied.Load()), elapsed: elapsed, timedOut: timedOut,
		srvCPU: srv1 - srv0, selfCPU: self1 - self0,
		srvMsgs: (v1.InMsgs + v1.OutMsgs) - (v0.InMsgs + v0.OutMsgs),
		rss:     rss, hwm: hwm, errors: e.errors.Load() - err0, dups: e.dups.Load(),
		maxRunning: e.maxRunning.Load(), publishFailures: pubFail.Load(), publishedAlready: already.Load(),
	}
	if s, ok := e.lastErr.Load().(string); ok {
		res.lastErr = s
	}
	var lat []time.Duration
	var ends []int64
	for i := range items {
		s, f := e.start[i].Load(), e.end[i].Load()
		if s > 0 && f > 0 {
			lat = append(lat, time.Duration(f-s))
			ends = append(ends, f)
		}
	}
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	sort.Slice(ends, func(i, j int) bool { return ends[i] < ends[j] })
	if len(lat) > 0 {
		res.p50, res.p99 = lat[len(lat)/2], lat[min(len(lat)-1, len(lat)*99/100)]
	}
	if len(ends) >= 10 {
		lo, hi := ends[len(ends)/10], ends[len(ends)*9/10]
		if hi > lo {
			res.midRate = float64(len(ends)*9/10-len(ends)/10) / time.Duration(hi-lo).Seconds()
		}
	}
	if res.errors > 0 || res.dups > 0 || res.publishFailures > 0 || res.publishedAlready > 0 || timedOut {
		fmt.Fprintf(os.Stderr, "busbench: run of %d items: %d errors (last: %s), %d duplicate deliveries, %d publish failures, %d already queued, timed out %v\n",
			n, res.errors, res.lastErr, res.dups, res.publishFailures, res.publishedAlready, timedOut)
		for _, k := range e.errorKinds() {
			fmt.Fprintf(os.Stderr, "busbench:   %s\n", k)
		}
	}
	return res
}

// measureIdle is the server's cost with the replicas up and no traffic.
func (e *env) measureIdle(ctx context.Context, d time.Duration) string {
	// Let the start-up (claims, first pulls) settle.
	select {
	case <-ctx.Done():
	case <-time.After(2 * time.Second):
	}
	srv0, _, _ := procStat(e.srv.pid)
	self0, _, _ := procStat(os.Getpid())
	v0, _ := e.srv.varz()
	kv0 := e.ownersSeq(ctx)
	t0 := time.Now()
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
	secs := time.Since(t0).Seconds()
	srv1, rss, _ := procStat(e.srv.pid)
	self1, _, _ := procStat(os.Getpid())
	v1, _ := e.srv.varz()
	kv1 := e.ownersSeq(ctx)
	r := len(e.done) / 2
	return fmt.Sprintf("%d\t%.1f\t%.0f\t%.1f\t%.1f\t%.0f\t", r,
		(srv1-srv0).Seconds()*1000/secs,
		float64((v1.InMsgs+v1.OutMsgs)-(v0.InMsgs+v0.OutMsgs))/secs,
		float64(kv1-kv0)/secs,
		(self1-self0).Seconds()*1000/secs, mib(rss))
}

// busiest is the most work items of items that one dispatcher replica
// owns (by partition).
func (e *env) busiest(items []bus.WorkItem) int {
	n := map[string]int{}
	most := 0
	for _, it := range items {
		m := e.workOwner[bus.PartitionOf(bus.Slot(it.Controller.ID(), it.Parent.UID), len(e.workOwner))]
		n[m]++
		most = max(most, n[m])
	}
	return most
}

// ownersSeq is the last sequence of the lease bucket's stream: its writes.
func (e *env) ownersSeq(ctx context.Context) uint64 {
	st, err := e.js.Stream(ctx, "KV_"+bus.OwnersBucket)
	if err != nil {
		return 0
	}
	info, err := st.Info(ctx)
	if err != nil {
		return 0
	}
	return info.State.LastSeq
}

// stop ends the replicas (they hand their partitions back), closes the
// connections and stops the server.
func (e *env) stop() {
	if e.cancel != nil {
		e.cancel()
		deadline := time.After(20 * time.Second)
	wait:
		for _, d := range e.done {
			select {
			case err := <-d:
				if err != nil {
					fmt.Fprintf(os.Stderr, "busbench: Consume: %v\n", err)
				}
			case <-deadline:
				fmt.Fprintln(os.Stderr, "busbench: replicas did not stop within 20s")
				break wait
			}
		}
	}
	for _, nc := range e.conns {
		nc.Close()
	}
	if e.nc != nil {
		e.nc.Close()
	}
	e.srv.stop()
}

func ints(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		n, err := strconv.Atoi(f)
		if err != nil || n <= 0 {
			return nil, fmt.Errorf("bad count %q in %q", f, s)
		}
		out = append(out, n)
	}
	return out, nil
}

func ms(d time.Duration) float64 { return d.Seconds() * 1000 }
func mib(b uint64) float64       { return float64(b) / (1 << 20) }

func commit() string {
	out, err := exec.Command("git", "log", "-1", "--format=%h").Output()
	if err != nil {
		return "?"
	}
	s := strings.TrimSpace(string(out))
	// Only what the figures depend on: other work in the tree is not.
	if st, err := exec.Command("git", "status", "--porcelain", "--", "pkg/bus", "pkg/jsbus", "pkg/ownership", "pkg/fairq", "pkg/natsx", "hack/busbench").Output(); err == nil && len(st) > 0 {
		s += " (+ uncommitted changes in pkg/bus, pkg/jsbus, pkg/ownership, pkg/fairq, pkg/natsx or hack/busbench)"
	}
	return s
}

// loadavg is the 1, 5 and 15 minute load averages.
func loadavg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}

func progress(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "busbench: "+format+"\n", args...)
}

func fatal(err error) {
	fmt.Fprintln(os.Stderr, "busbench:", err)
	os.Exit(1)
}
