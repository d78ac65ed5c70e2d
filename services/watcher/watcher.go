// Package watcher is the metabus stage that turns Kubernetes informer events
// into deduplicated work items on MC_WORK and serves observed-state
// snapshots from its informer caches.
//
// One shared informer per resource serves every controller. Controllers
// (CompositeController objects) are watched too, and a controller is
// re-wired when its spec changes: the new wiring subscribes before the old
// one releases, so shared informers are never stopped and relisted.
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
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"

	"github.com/metabus/metabus/pkg/api/v1alpha1"
	"github.com/metabus/metabus/pkg/bus"
	"github.com/metabus/metabus/pkg/discovery"
	"github.com/metabus/metabus/pkg/echo"
	"github.com/metabus/metabus/pkg/events"
	"github.com/metabus/metabus/pkg/informers"
	"github.com/metabus/metabus/pkg/obs"
	"github.com/metabus/metabus/pkg/related"
	"github.com/metabus/metabus/pkg/snapshot"
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
	// ResyncBacklog bounds how many work items may sit in MC_WORK while
	// resync items are being published (0: 32; <0: unpaced).
	// Real changes bypass it: a resync wave (cache flush, resyncPeriod,
	// a new leader) is fed in as the dispatchers drain it, so a real
	// change waits behind at most about one resync item in its partition
	// instead of behind the whole wave (upstream #78).
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
	// ControllerResources says which resources controllers may make the
	// watcher watch and send to their hooks: parents, children, decorator
	// targets and attachments, and customize hooks' related rules
	// (related.ParsePolicyOf entries); nil means
	// related.DefaultControllerPolicy, everything. A controller naming another resource is not
	// wired (a CreateError Event on it says why); a related rule naming one
	// starts no informer, whatever the dispatcher allowed.
	ControllerResources []string
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
	// badWeights remembers invalid weight annotations already logged.
	badWeights sync.Map
	log        *zap.Logger
	dyn        dynamic.Interface
	kube       kubernetes.Interface
	disc       *discovery.Map
	registry   *informers.Registry
	pub        bus.Publisher
	nc         *nats.Conn
	js         jetstream.JetStream
	rec        *events.Recorder
	health     *obs.Health
	metrics    *metrics
	targets    labels.Selector
	// resources is what controllers may watch (Config.ControllerResources).
	resources related.Policy

	leader atomic.Bool

	// Controllers.
	ctrlQueue   workqueue.TypedRateLimitingInterface[string]
	ctrlHandles map[string]*informers.Handle // by controller kind
	mu          sync.RWMutex
	wirings     map[string]controllerWiring // by controller ID

	// Work items waiting to be published, merged per parent; resyncs wait
	// in their own queue, paced by MC_WORK's backlog.
	queue       workqueue.TypedRateLimitingInterface[string]
	resyncQueue workqueue.TypedInterface[string]
	pmu         sync.Mutex
	pending     map[string]*bus.WorkItem
	// suspects says, per pending item, whether it may be nothing but
	// echoes: it was caused only by update events (listed), which are
	// checked against the applied notes when the item is about to be
	// published, not when the event arrives: by then the note of a write
	// whose event outran it has usually come in.
	suspects map[string]*suspects
	// pace spaces the real-change publishes of a parent that keeps
	// changing (bursts coalesce; isolated changes go at once).
	pace *pacer

	// echoes holds the appliers' Applied notes: an update event that is a
	// controller's own latest write is not enqueued for it.
	echoes *echo.Book
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
	kube, err := kubernetes.NewForConfig(deps.REST)
	if err != nil {
		return nil, fmt.Errorf("kubernetes client: %w", err)
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
	health := deps.Health
	if health == nil {
		health = &obs.Health{}
	}
	w := &Watcher{
		cfg:         cfg,
		log:         log.Named("watcher"),
		dyn:         dyn,
		kube:        kube,
		disc:        discovery.New(kube.Discovery()),
		registry:    informers.New(dyn, 0),
		pub:         bus.Publisher{JS: deps.JS},
		nc:          deps.NC,
		js:          deps.JS,
		health:      health,
		targets:     targets,
		resources:   resources,
		wirings:     map[string]controllerWiring{},
		ctrlHandles: map[string]*informers.Handle{},
		pending:     map[string]*bus.WorkItem{},
		suspects:    map[string]*suspects{},
		echoes:      deps.Echoes,
		pace:        newPacer(),
		ctrlQueue: workqueue.NewTypedRateLimitingQueueWithConfig(
			workqueue.DefaultTypedControllerRateLimiter[string](),
			workqueue.TypedRateLimitingQueueConfig[string]{Name: "metabus-watcher-controllers"}),
		resyncQueue: workqueue.NewTypedWithConfig(workqueue.TypedQueueConfig[string]{Name: "metabus-watcher-resync"}),
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(
			workqueue.NewTypedItemExponentialFailureRateLimiter[string](50*time.Millisecond, 30*time.Second),
			workqueue.TypedRateLimitingQueueConfig[string]{Name: "metabus-watcher-publish"}),
	}
	w.metrics = newMetrics(deps.Metrics, w)
	w.rec = events.New(kube, events.Options{QPS: cfg.EventsQPS, Burst: cfg.EventsBurst, Component: "metabus-watcher"})
	return w, nil
}

// Run starts the watcher and blocks until ctx is done.
func (w *Watcher) Run(ctx context.Context) error {
	defer w.rec.Shutdown(ctx)
	if w.cfg.EnsureStreams {
		if err := bus.Ensure(ctx, w.js, w.cfg.Bus); err != nil {
			return err
		}
		// Partition consumers keep their state in memory: a restarted
		// NATS server has lost them until they are recreated.
		// It also finishes a partition-count cut-over (--partitions).
		go bus.KeepConsumers(ctx, w.js, w.cfg.Bus, 5*time.Second, func(err error) {
			if errors.Is(err, bus.ErrCutOverPending) {
				w.log.Info("partition cut-over waits for the stages to hand back the old partitions", zap.Error(err))
				return
			}
			w.log.Warn("bus", zap.Error(err))
		})
	} else if err := bus.WaitReady(ctx, w.js); err != nil {
		return err
	}
	if err := w.disc.Refresh(ctx); err != nil {
		w.log.Warn("initial discovery incomplete", zap.Error(err))
	}
	go w.disc.Run(ctx, w.cfg.DiscoveryInterval, func(err error) { w.log.Warn("discovery refresh", zap.Error(err)) })

	var wg sync.WaitGroup
	defer wg.Wait()
	defer w.queue.ShutDown()
	defer w.resyncQueue.ShutDown()
	defer w.ctrlQueue.ShutDown()

	sub, err := w.subscribeRelated()
	if err != nil {
		return fmt.Errorf("subscribe to related-rules broadcasts: %w", err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	if w.echoes == nil {
		w.echoes = echo.NewBook(0)
		esub, err := w.echoes.Subscribe(w.nc)
		if err != nil {
			return fmt.Errorf("subscribe to applied notes: %w", err)
		}
		defer func() { _ = esub.Unsubscribe() }()
	}
	if w.cfg.ServeSnapshots {
		w.snaps.ctx = ctx
		defer w.stopSnapshots()
	}

	for _, k := range controllerKinds {
		h := w.registry.Acquire(k.gvr)
		defer h.Release()
		kind := k.kind
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
	w.health.SetReady("watcher", func() error {
		for kind, h := range w.ctrlHandles {
			if !h.HasSynced() {
				return fmt.Errorf("%s cache not synced", kind)
			}
		}
		return nil
	})

	wg.Add(1)
	go func() { defer wg.Done(); w.runControllers(ctx) }()
	for i := 0; i < w.cfg.PublishWorkers; i++ {
		wg.Add(1)
		go func() { defer wg.Done(); w.runPublisher(ctx) }()
	}
	wg.Add(1)
	go func() { defer wg.Done(); w.runResyncPacer(ctx) }()
	wg.Add(1)
	go func() { defer wg.Done(); w.runCacheFlush(ctx) }()

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

// controllerKinds are the controller APIs the watcher serves.
var controllerKinds = []struct {
	kind string
	gvr  schema.GroupVersionResource
}{
	{v1alpha1.CompositeControllerKind, v1alpha1.CompositeControllerGVR},
	{v1alpha1.DecoratorControllerKind, v1alpha1.DecoratorControllerGVR},
}

// controllerWiring is one controller object connected to the shared
// informers, whatever its kind.
type controllerWiring interface {
	// snapshot answers a snapshot request for one of its parents.
	snapshot(ctx context.Context, req snapshot.Request) *snapshot.Response
	// resync enqueues every parent.
	resync(reason string)
	// releaseFinalizers asks for the controller's finalizer to be removed
	// from every parent that carries it.
	releaseFinalizers()
	// stop releases the informer subscriptions.
	stop()
	// object is the controller object as last seen.
	object() *unstructured.Unstructured
	// setObject refreshes it (called with the watcher's lock held).
	setObject(obj *unstructured.Unstructured)
	// sameSpec reports whether the wiring was built from this spec of
	// this object.
	sameSpec(spec string, uid types.UID) bool
	// start subscribes to the informers.
	start(ctx context.Context) error
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

// resyncAll enqueues every parent of every controller.
func (w *Watcher) resyncAll(reason string) {
	w.mu.RLock()
	defer w.mu.RUnlock()
	for _, wr := range w.wirings {
		wr.resync(reason)
	}
}

// grKey is the freshness key of a resource: "<group>/<resource>".
func grKey(gvr schema.GroupVersionResource) string { return gvr.Group + "/" + gvr.Resource }

// suspects are the update events behind a pending item (object UID and
// new resourceVersion), unless something else caused it too (news).
type suspects struct {
	news    bool
	updates [][2]string
}

// maxSuspects bounds the updates remembered per pending item; past it the
// item is simply published.
const maxSuspects = 16

// echoOnly reports whether every event behind a pending item was one of the
// controller's own writes (an applier's note lists it): not news to its
// hook, so the item need not be published.
func (w *Watcher) echoOnly(ctrlID string, s *suspects) bool {
	if s == nil || s.news || len(s.updates) == 0 {
		return false
	}
	for _, u := range s.updates {
		if !w.echoes.Wrote(ctrlID, u[0], u[1]) {
			return false
		}
	}
	return true
}

// enqueue records that parent needs a sync because an object of gvr changed
// to resourceVersion rv.
func (w *Watcher) enqueue(ref bus.ControllerRef, parentRes *discovery.Resource, parent *unstructured.Unstructured, reason string, gvr schema.GroupVersionResource, rv string) {
	w.enqueueItem(ref, parentRes, parent, reason, gvr, rv, "", nil)
}

// enqueueUpdate is enqueue for an update event of obj (the parent itself or
// an object mapped to it), which may turn out to be the controller's own
// write.
func (w *Watcher) enqueueUpdate(ref bus.ControllerRef, parentRes *discovery.Resource, parent *unstructured.Unstructured, gvr schema.GroupVersionResource, obj *unstructured.Unstructured) {
	w.enqueueItem(ref, parentRes, parent, bus.ReasonEvent, gvr, obj.GetResourceVersion(), "", obj)
}

func (w *Watcher) enqueueItem(ref bus.ControllerRef, parentRes *discovery.Resource, parent *unstructured.Unstructured, reason string, gvr schema.GroupVersionResource, rv, finalizer string, update *unstructured.Unstructured) {
	if !w.leader.Load() {
		return
	}
	key := ref.ID() + "/" + string(parent.GetUID())
	ref.Weight = w.controllerWeight(ref)
	w.pmu.Lock()
	sus := w.suspects[key]
	if sus == nil {
		sus = &suspects{}
		w.suspects[key] = sus
	}
	if update == nil || reason != bus.ReasonEvent || len(sus.updates) >= maxSuspects {
		sus.news = true
	} else {
		sus.updates = append(sus.updates, [2]string{string(update.GetUID()), update.GetResourceVersion()})
	}
	item, ok := w.pending[key]
	if !ok {
		item = &bus.WorkItem{
			Controller: ref,
			Parent: bus.ObjectRef{
				APIVersion: parentRes.APIVersion(),
				Kind:       parentRes.Kind,
				Resource:   parentRes.GVR.Resource,
				Namespace:  parent.GetNamespace(),
				Name:       parent.GetName(),
				UID:        string(parent.GetUID()),
			},
			Reason:              reason,
			MinResourceVersions: map[string]string{},
			EnqueuedAt:          time.Now(),
		}
		w.pending[key] = item
	} else if reason == bus.ReasonEvent && item.Reason != bus.ReasonRelease {
		// A real change outranks a resync in the same item.
		item.Reason = reason
	}
	if finalizer != "" {
		item.Reason, item.Finalizer = bus.ReasonRelease, finalizer
	}
	if rv != "" {
		mergeRV(item.MinResourceVersions, grKey(gvr), rv)
	}
	resync := item.Reason == bus.ReasonResync
	w.pmu.Unlock()
	switch {
	case resync:
		w.resyncQueue.Add(key)
	default:
		if d := w.pace.event(key, time.Now()); d > 0 {
			w.queue.AddAfter(key, d)
		} else {
			w.queue.Add(key)
		}
	}
}

// enqueueRelease queues the removal of finalizer from parent.
func (w *Watcher) enqueueRelease(ref bus.ControllerRef, parentRes *discovery.Resource, parent *unstructured.Unstructured, finalizer string) {
	w.enqueueItem(ref, parentRes, parent, bus.ReasonRelease, parentRes.GVR, "", finalizer, nil)
}

func (w *Watcher) runPublisher(ctx context.Context) {
	for {
		key, shutdown := w.queue.Get()
		if shutdown {
			return
		}
		w.pmu.Lock()
		item := w.pending[key]
		delete(w.pending, key)
		sus := w.suspects[key]
		delete(w.suspects, key)
		w.pmu.Unlock()
		if item == nil || (item.Reason == bus.ReasonEvent && w.echoOnly(item.Controller.ID(), sus)) {
			if item != nil {
				w.metrics.echoes.Inc()
			}
			w.queue.Forget(key)
			w.queue.Done(key)
			continue
		}
		w.pace.published(key, time.Now())
		w.publish(ctx, key, item)
		w.queue.Done(key)
	}
}

// runResyncPacer publishes resync items only while MC_WORK's backlog is
// below ResyncBacklog.
func (w *Watcher) runResyncPacer(ctx context.Context) {
	limit := w.cfg.ResyncBacklog
	if limit == 0 {
		limit = bus.DefaultPartitions / 2
	}
	var stream jetstream.Stream
	budget := 0
	for {
		key, shutdown := w.resyncQueue.Get()
		if shutdown {
			return
		}
		for limit > 0 && budget <= 0 && ctx.Err() == nil {
			if stream == nil {
				s, err := w.js.Stream(ctx, bus.WorkStream)
				if err != nil {
					time.Sleep(100 * time.Millisecond)
					continue
				}
				stream = s
			}
			info, err := stream.Info(ctx)
			if err != nil {
				time.Sleep(100 * time.Millisecond)
				continue
			}
			if budget = limit - int(info.State.Msgs); budget <= 0 {
				time.Sleep(20 * time.Millisecond)
			}
		}
		w.pmu.Lock()
		item := w.pending[key]
		if item != nil && item.Reason == bus.ReasonResync {
			delete(w.pending, key)
			delete(w.suspects, key)
		} else {
			// Gone, or upgraded to a real change that the main queue
			// publishes.
			item = nil
		}
		w.pmu.Unlock()
		if item != nil {
			w.publish(ctx, key, item)
			budget--
		}
		w.resyncQueue.Done(key)
	}
}

// publish sends one work item; on failure it is put back (merged with
// anything newer) and retried with backoff through the main queue.
// errReleaseRefused: a finalizer release found its parent's queue full.
var errReleaseRefused = errors.New("finalizer release refused: parent already queued")

func (w *Watcher) publish(ctx context.Context, key string, item *bus.WorkItem) {
	{
		pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		queued, err := w.pub.PublishWork(pctx, *item)
		cancel()
		if err == nil && !queued && item.Reason == bus.ReasonRelease {
			// The parent's queued items are ordinary syncs, which do not
			// release a finalizer of a kind the controller stopped
			// targeting: keep the release until the queue takes it.
			err = errReleaseRefused
		}
		switch {
		case err != nil:
			w.metrics.published.WithLabelValues(item.Reason, "error").Inc()
			if ctx.Err() == nil && err != errReleaseRefused {
				w.log.Warn("publish work item; will retry", zap.String("key", key), zap.Error(err))
			}
			// Put it back, merged with anything newer, and back off.
			w.pmu.Lock()
			if newer, ok := w.pending[key]; ok {
				for k, v := range item.MinResourceVersions {
					mergeRV(newer.MinResourceVersions, k, v)
				}
				if item.Reason == bus.ReasonRelease {
					newer.Reason, newer.Finalizer = item.Reason, item.Finalizer
				}
			} else {
				w.pending[key] = item
			}
			w.pmu.Unlock()
			w.queue.AddRateLimited(key)
		case queued:
			w.metrics.published.WithLabelValues(item.Reason, "queued").Inc()
			w.queue.Forget(key)
		default:
			w.metrics.published.WithLabelValues(item.Reason, "already_queued").Inc()
			w.queue.Forget(key)
		}
	}
}
