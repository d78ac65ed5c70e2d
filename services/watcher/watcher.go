// Package watcher is the metabus stage that turns Kubernetes informer events
// into deduplicated work items on MC_WORK and serves observed-state
// snapshots from its informer caches.
//
// One shared informer per resource serves every controller. Controller
// objects (of every kind in the kind table) are watched too, and a
// controller is re-wired when its spec changes: the new wiring subscribes
// before the old one releases, so shared informers are never stopped and
// relisted.
//
// Every controller kind of the kind table (pkg/kindtable) goes through one
// generic path: its core (pkg/kinds.Watching) says what to watch, which
// parents it selects, which objects it owns or adopts, and how a parent's
// snapshot is assembled; the watcher does the I/O. A keyed kind's plan
// (kinds.KeyedPlan) also names input resources, and its work items and
// snapshots are per (parent, map key), with one per-parent item for what
// needs the whole parent (keyed.go).
//
// Only the leader (with --leader-elect) publishes work items; every replica
// serves snapshots. Informer handlers never block on NATS: they feed a local
// rate-limited queue that publisher goroutines drain.
package watcher

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"

	"github.com/metabus/metabus/pkg/apiresource"
	"github.com/metabus/metabus/pkg/bus"
	"github.com/metabus/metabus/pkg/discovery"
	"github.com/metabus/metabus/pkg/echo"
	"github.com/metabus/metabus/pkg/events/recorder"
	ctlid "github.com/metabus/metabus/pkg/identity"
	"github.com/metabus/metabus/pkg/informers"
	"github.com/metabus/metabus/pkg/jsbus"
	"github.com/metabus/metabus/pkg/kindtable"
	"github.com/metabus/metabus/pkg/kubeapi"
	"github.com/metabus/metabus/pkg/leader"
	"github.com/metabus/metabus/pkg/natsx"
	"github.com/metabus/metabus/pkg/obs"
	"github.com/metabus/metabus/pkg/readaccess"
	"github.com/metabus/metabus/pkg/related"
)

// Config is the watcher's configuration (flags).
type Config struct {
	// DiscoveryInterval is how often API discovery is refreshed.
	DiscoveryInterval time.Duration
	// CacheFlushInterval is how often every parent is resynced: the repair
	// path for anything the bus lost.
	CacheFlushInterval time.Duration
	// TargetLabelSelector restricts the controllers this installation serves.
	TargetLabelSelector string
	// PublishWorkers publish work items to NATS concurrently.
	PublishWorkers int
	// ResyncBacklog bounds how many resync items of one controller may
	// sit in MC_WORK at once (0: 32; <0: unpaced). Real changes bypass
	// it: a resync wave (cache flush, resyncPeriod, a new leader, a new
	// controller's first sync) is fed in as the dispatchers drain it, so a
	// real change waits behind at most about one resync item in its
	// partition instead of behind the whole wave (upstream #78), and one
	// controller's backlog (a hook that hangs) never holds another's
	// resyncs back. A keyed parent's change fanned out to its map keys is
	// paced the same way, ahead of its controller's resync waves
	// (resyncLanes).
	ResyncBacklog int
	// SnapshotWait bounds how long a snapshot request waits for the cache to
	// reach the requested resourceVersions before answering "retry".
	SnapshotWait time.Duration
	// ServeSnapshots registers the NATS snapshot service.
	ServeSnapshots bool
	// Leader election (active/passive publishing).
	LeaderElect             bool
	LeaderElectionNamespace string
	LeaderElectionID        string
	// Events spam filter.
	EventsQPS   float32
	EventsBurst int
	// Bus configures streams (replicas, ack waits).
	Bus bus.Options
	// EnsureStreams creates/updates the streams and consumers at start.
	EnsureStreams bool
	// KeepConsumersEvery is how often the streams and partition consumers
	// are checked and recreated if lost, which also finishes a cut-over
	// (jsbus.KeepConsumers; zero: every 5 s). The all-in-one's embedded
	// server, whose memory streams and layout are made anew at every start
	// and lost only with the process, checks less often.
	KeepConsumersEvery time.Duration
	// ControllerResources says which resources controllers may make the
	// watcher watch and send to their hooks: parents, children, decorator
	// targets and attachments, and customize hooks' related rules
	// (related.ParsePolicyOf entries); nil means
	// related.DefaultControllerPolicy, everything. A controller naming another resource is not
	// wired (a CreateError Event on it says why); a related rule naming one
	// starts no informer, whatever the dispatcher allowed.
	ControllerResources []string
	// Weights bounds the weights controllers ask for with
	// bus.WeightAnnotation: the weight each message carries, and so the
	// share of a saturated dispatcher or applier replica a controller
	// gets, is what this policy grants (zero value: the annotation's, as
	// before).
	Weights bus.WeightPolicy
	// ResyncTotal bounds the resync items of all controllers in MC_WORK
	// at once (0: 1,024); a controller under its fair share of it (this
	// over the controllers with resyncs there or waiting) may always add
	// one, so controllers whose resyncs do not drain cannot hold it.
	ResyncTotal int
	// DefaultServiceAccount is the identity of a controller that names
	// none (--default-service-account, shared with the applier): its
	// hooks are sent only what the account may list and watch. None: the
	// watcher's own authority, as upstream, with no review at all.
	DefaultServiceAccount ctlid.Identity
	// ReadRecheck is how often each cached review of a controller
	// identity's read access is asked again (0: one minute).
	ReadRecheck time.Duration
}

// Defaults fills unset fields.
func (c *Config) Defaults() {
	if c.DiscoveryInterval <= 0 {
		c.DiscoveryInterval = 30 * time.Second
	}
	if c.CacheFlushInterval <= 0 {
		c.CacheFlushInterval = 30 * time.Minute
	}
	if c.PublishWorkers <= 0 {
		c.PublishWorkers = 8
	}
	if c.SnapshotWait <= 0 {
		c.SnapshotWait = 2 * time.Second
	}
	if c.LeaderElectionID == "" {
		c.LeaderElectionID = "metabus-watcher"
	}
}

// Deps are the connections a watcher uses; the all-in-one process and tests
// share them between services.
type Deps struct {
	REST    *rest.Config
	NC      *nats.Conn
	JS      jetstream.JetStream
	Log     *zap.Logger
	Metrics prometheus.Registerer
	Health  *obs.Health
	// Echoes, if set, is a Book shared in this process (fed by its
	// composer); nil makes the watcher keep and feed its own.
	Echoes *echo.Book
}

// Watcher is a running watcher.
type Watcher struct {
	cfg Config
	// snaps is the snapshot service, served while this replica leads.
	snaps struct {
		mu   sync.Mutex
		ctx  context.Context
		stop func()
	}
	// badWeights holds, per controller ID, the invalid weight annotation
	// last logged, so that each is logged once.
	badWeights sync.Map
	log        *zap.Logger
	dyn        dynamic.Interface
	kube       *kubeapi.Client
	disc       *discovery.Map
	registry   *informers.Registry
	nc         *nats.Conn
	js         jetstream.JetStream
	rec        *recorder.Recorder
	health     *obs.Health
	metrics    *metrics
	targets    labels.Selector
	// resources is what controllers may watch (Config.ControllerResources).
	resources related.Policy

	leader atomic.Bool
	// elector campaigns for the Lease (with --leader-elect).
	elector *leader.Elector

	// Controllers: one informer and one queue of changed objects per kind
	// of the kind table (each worked by one runControllers, as upstream
	// runs one controller-runtime controller per kind, and named like it:
	// obs.ReconcilerName), and one wiring per controller object.
	ctrlQueues  map[string]workqueue.TypedRateLimitingInterface[string] // by controller kind
	ctrlHandles map[string]*informers.Handle                            // by controller kind
	mu          sync.RWMutex
	wirings     map[string]*wiring // by controller ID

	// reads caches what controller identities may read (readaccess.go).
	reads *readaccess.Cache

	// out holds and publishes the work items (and the appliers' Applied
	// notes, against which update events are checked as echoes).
	out *outbox
}

// New builds a watcher; Run starts it.
func New(cfg Config, deps Deps) (*Watcher, error) {
	cfg.Defaults()
	if deps.REST == nil || deps.JS == nil || deps.NC == nil {
		return nil, errors.New("watcher: REST config and NATS connection are required")
	}
	log := deps.Log
	if log == nil {
		log = zap.NewNop()
	}
	dyn, err := dynamic.NewForConfig(deps.REST)
	if err != nil {
		return nil, fmt.Errorf("dynamic client: %w", err)
	}
	kube, err := kubeapi.NewForConfig(deps.REST)
	if err != nil {
		return nil, fmt.Errorf("kubernetes client: %w", err)
	}
	registry, err := informers.NewForConfig(deps.REST, 0)
	if err != nil {
		return nil, err
	}
	targets := labels.Everything()
	if cfg.TargetLabelSelector != "" {
		if targets, err = labels.Parse(cfg.TargetLabelSelector); err != nil {
			return nil, fmt.Errorf("--target-label-selector: %w", err)
		}
	}
	entries := cfg.ControllerResources
	if entries == nil {
		entries = related.DefaultControllerPolicy
	}
	resources, err := related.ParsePolicyOf(related.ControllerSetting, entries)
	if err != nil {
		return nil, fmt.Errorf("--controller-resources: %w", err)
	}
	if cfg.Bus.Partitions != 0 {
		// A wrong count is the command line's: refuse it at once rather
		// than retrying the stream setup for ever.
		if err := bus.ValidPartitions(cfg.Bus.Partitions); err != nil {
			return nil, fmt.Errorf("--partitions: %w", err)
		}
	}
	health := deps.Health
	if health == nil {
		health = &obs.Health{}
	}
	// Not ready until Run has the streams and synced caches.
	health.Pending(readyCheck, "starting")
	w := &Watcher{
		cfg:         cfg,
		log:         log.Named("watcher"),
		dyn:         dyn,
		kube:        kube,
		disc:        discovery.New(discovery.APIServer{API: kube}),
		registry:    registry,
		nc:          deps.NC,
		js:          deps.JS,
		health:      health,
		targets:     targets,
		resources:   resources,
		wirings:     map[string]*wiring{},
		ctrlHandles: map[string]*informers.Handle{},
	}
	w.reads = readaccess.NewCache(w.reviewRead, readaccess.Options{Recheck: cfg.ReadRecheck,
		OnChange: func(id ctlid.Identity) { go w.readsChanged(id) }})
	w.metrics = newMetrics(deps.Metrics, w) // makes w.ctrlQueues too
	if w.metrics.err != nil {
		w.log.Warn("some metrics are not exported", zap.Error(w.metrics.err))
	}
	w.out = newOutbox(w.log, jsbus.Publisher{JS: deps.JS, Queued: w.metrics.queued}, deps.JS, cfg.ResyncBacklog)
	w.out.resyncTotal = cfg.ResyncTotal
	w.out.metrics = w.metrics
	w.out.echoes = deps.Echoes
	if cfg.LeaderElect {
		if w.elector, err = w.newElector(); err != nil {
			return nil, err
		}
	}
	w.rec = recorder.New(kube, recorder.Options{QPS: cfg.EventsQPS, Burst: cfg.EventsBurst, Component: "metabus-watcher"})
	return w, nil
}

// readyCheck names the watcher's readiness check.
const readyCheck = "watcher"

// Run starts the watcher and blocks until ctx is done.
func (w *Watcher) Run(ctx context.Context) error {
	defer w.rec.Shutdown(ctx)
	if w.cfg.EnsureStreams {
		// The streams may not be creatable yet: NATS restarting, or a
		// cluster still placing the replicas of new R3 streams (a stream
		// read then times out). Wait for them rather than exit.
		w.health.Pending(readyCheck, "creating the streams and consumers")
		err := natsx.Retry(ctx, natsx.DefaultBackoff, func(ctx context.Context) error { return jsbus.Ensure(ctx, w.js, w.cfg.Bus) },
			func(err error, next time.Duration) {
				w.log.Warn("streams and consumers not ready yet; retrying", zap.Error(err), zap.Duration("retryIn", next))
				w.health.Pending(readyCheck, "creating the streams and consumers: "+err.Error())
			})
		if err != nil {
			return nil // ctx is done
		}
		// Partition consumers keep their state in memory: a restarted
		// NATS server has lost them until they are recreated.
		// It also finishes a partition-count cut-over (--partitions).
		every := w.cfg.KeepConsumersEvery
		if every <= 0 {
			every = 5 * time.Second
		}
		go jsbus.KeepConsumers(ctx, w.js, w.cfg.Bus, every, func(err error) {
			if errors.Is(err, bus.ErrCutOverPending) {
				w.log.Info("partition cut-over waits for the stages to hand back the old partitions", zap.Error(err))
				return
			}
			w.log.Warn("bus", zap.Error(err))
		}, w.busRecreated)
	} else {
		w.health.Pending(readyCheck, "waiting for the streams and consumers")
		if err := jsbus.WaitReady(ctx, w.js); err != nil {
			return err
		}
	}
	w.health.Pending(readyCheck, "waiting for the controller caches to sync")
	if err := w.disc.Refresh(ctx); err != nil {
		w.log.Warn("initial discovery incomplete", zap.Error(err))
	}
	go w.disc.Run(ctx, w.cfg.DiscoveryInterval, func(err error) { w.log.Warn("discovery refresh", zap.Error(err)) })

	var wg sync.WaitGroup
	defer wg.Wait()
	defer w.out.shutDown()
	for _, q := range w.ctrlQueues {
		defer q.ShutDown()
	}

	sub, err := w.subscribeRelated()
	if err != nil {
		return fmt.Errorf("subscribe to related-rules broadcasts: %w", err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	if w.out.echoes == nil {
		book := echo.NewBook(0)
		esub, err := book.Subscribe(w.nc)
		if err != nil {
			return fmt.Errorf("subscribe to applied notes: %w", err)
		}
		defer func() { _ = esub.Unsubscribe() }()
		w.out.echoes = book
	}
	if w.cfg.ServeSnapshots {
		w.snaps.ctx = ctx
		defer w.stopSnapshots()
	}

	for _, k := range kindtable.Kinds {
		h := w.registry.Acquire(k.GVR)
		defer h.Release()
		kind := k.Name
		if err := h.AddHandler(cache.ResourceEventHandlerFuncs{
			AddFunc:    func(obj any) { w.enqueueController(kind, obj) },
			UpdateFunc: func(_, obj any) { w.enqueueController(kind, obj) },
			DeleteFunc: func(obj any) { w.enqueueController(kind, obj) },
		}); err != nil {
			return err
		}
		w.mu.Lock()
		w.ctrlHandles[kind] = h
		w.mu.Unlock()
	}
	for _, h := range w.ctrlHandles {
		if !h.WaitForSync(ctx) {
			return ctx.Err()
		}
	}
	connected := natsx.Check(w.nc)
	w.health.SetReady(readyCheck, func() error {
		if err := connected(); err != nil {
			return err
		}
		for kind, h := range w.ctrlHandles {
			if !h.HasSynced() {
				return fmt.Errorf("%s cache not synced", kind)
			}
		}
		return nil
	})

	for kind := range w.ctrlQueues {
		wg.Add(1)
		go func() { defer wg.Done(); w.runControllers(ctx, kind) }()
	}
	for i := 0; i < w.cfg.PublishWorkers; i++ {
		wg.Add(1)
		go func() { defer wg.Done(); w.out.runPublisher(ctx) }()
	}
	wg.Add(1)
	go func() { defer wg.Done(); w.out.runResyncPacer(ctx) }()
	wg.Add(1)
	go func() { defer wg.Done(); w.runCacheFlush(ctx) }()
	wg.Add(1)
	go func() {
		defer wg.Done()
		w.reads.Run(ctx, func(s readaccess.Scope, err error) {
			w.log.Warn("read access re-check failed; the last answer holds for three re-checks", zap.String("scope", s.String()),
				zap.String("serviceAccount", s.Identity.String()), zap.Error(err))
		})
	}()

	if w.cfg.LeaderElect {
		wg.Add(1)
		go func() { defer wg.Done(); w.runLeaderElection(ctx) }()
	} else {
		w.becomeLeader()
	}
	w.log.Info("watcher started", zap.Bool("leaderElection", w.cfg.LeaderElect))
	<-ctx.Done()
	w.mu.Lock()
	for id, wr := range w.wirings {
		wr.stop()
		delete(w.wirings, id)
	}
	w.mu.Unlock()
	return nil
}

// busRecreated runs when a partitioned stream was created anew (a NATS
// cluster that lost its data, or a stream deleted by hand): the work items,
// desired states and schedules it held are gone, and nothing else would
// derive them again before the next cache flush. The leader resyncs every
// parent.
func (w *Watcher) busRecreated(stream string) {
	if !w.leader.Load() {
		return
	}
	w.log.Warn("a bus stream was created anew and what it held is lost: resyncing every parent", zap.String("stream", stream))
	w.resyncAll(bus.ReasonResync)
}

// becomeLeader starts publishing and resyncs everything, so nothing that
// changed while another replica led (or nobody did) is missed.
func (w *Watcher) becomeLeader() {
	w.leader.Store(true)
	w.startSnapshots()
	w.resyncAll(bus.ReasonResync)
}

func (w *Watcher) runCacheFlush(ctx context.Context) {
	t := time.NewTicker(w.cfg.CacheFlushInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			w.resyncAll(bus.ReasonResync)
		}
	}
}

// resyncAll enqueues every parent of every controller (and every map key
// of a keyed controller's parents).
func (w *Watcher) resyncAll(reason string) {
	w.mu.RLock()
	wirings := make([]*wiring, 0, len(w.wirings))
	for _, wr := range w.wirings {
		wirings = append(wirings, wr)
	}
	w.mu.RUnlock()
	// Not under the lock: every enqueue reads the controller's weight
	// under a read lock of its own, and a nested read lock deadlocks once
	// a writer (a controller being rewired) waits in between. A keyed
	// controller's fan-out makes the walk long enough for that to happen.
	for _, wr := range wirings {
		wr.resync(reason)
	}
}

// grKey is the freshness key of a resource: "<group>/<resource>".
func grKey(gvr schema.GroupVersionResource) string { return bus.FreshnessKey(gvr.Group, gvr.Resource) }

// enqueue records that parent needs a sync because an object of gvr changed
// to resourceVersion rv (rv "": no freshness requirement).
func (w *Watcher) enqueue(ref bus.ControllerRef, parentRes *apiresource.Resource, parent *unstructured.Unstructured, reason string, gvr schema.GroupVersionResource, rv string) {
	w.enqueueEntry(entry{ref: ref, parentRes: parentRes, parent: parent, reason: reason, gvr: gvr, rv: rv})
}

// enqueueUpdate is enqueue for an update event of obj (the parent itself or
// an object mapped to it), which may turn out to be the controller's own
// write.
func (w *Watcher) enqueueUpdate(ref bus.ControllerRef, parentRes *apiresource.Resource, parent *unstructured.Unstructured, gvr schema.GroupVersionResource, obj *unstructured.Unstructured) {
	w.enqueueEntry(entry{ref: ref, parentRes: parentRes, parent: parent, reason: bus.ReasonEvent, gvr: gvr, rv: obj.GetResourceVersion(), update: obj})
}

// enqueueRelease queues the removal of finalizer from parent.
func (w *Watcher) enqueueRelease(ref bus.ControllerRef, parentRes *apiresource.Resource, parent *unstructured.Unstructured, finalizer string) {
	w.enqueueEntry(entry{ref: ref, parentRes: parentRes, parent: parent, reason: bus.ReasonRelease, gvr: parentRes.GVR, finalizer: finalizer})
}

// enqueueEntry hands e to the outbox while this replica leads (a follower
// publishes nothing; the next leader resyncs everything).
func (w *Watcher) enqueueEntry(e entry) {
	if !w.leader.Load() {
		return
	}
	e.ref.Weight = w.controllerWeight(e.ref)
	w.out.add(e)
}
