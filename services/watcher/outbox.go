package watcher

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/resourceversion"
	"k8s.io/client-go/util/workqueue"

	"github.com/metabus/metabus/pkg/bus"
	"github.com/metabus/metabus/pkg/discovery"
	"github.com/metabus/metabus/pkg/echo"
)

// outbox holds the work items waiting to be published, merged per unit of
// work (a parent, or one map key of a keyed kind's parent: bus.ItemKey),
// and publishes them: real changes through the paced publish queue,
// resyncs through their own lanes, fed in only while MC_WORK's backlog is
// low. Informer handlers only ever add to it; they never wait on NATS.
type outbox struct {
	log     *zap.Logger
	pub     workPublisher
	js      jetstream.JetStream
	metrics *metrics
	// echoes holds the appliers' Applied notes (set before the first
	// publish): an update event that is a controller's own latest write is
	// not published for it.
	echoes *echo.Book
	// resyncBacklog bounds MC_WORK's backlog while resyncs are fed in
	// (Config.ResyncBacklog).
	resyncBacklog int

	// queue publishes real changes (and retries of failed publishes);
	// resyncs publishes resyncs, paced by MC_WORK's backlog.
	queue   workqueue.TypedRateLimitingInterface[string]
	resyncs *resyncLanes

	mu      sync.Mutex
	pending map[string]*bus.WorkItem
	// suspects says, per pending item, whether it may be nothing but
	// echoes: it was caused only by update events (listed), which are
	// checked against the applied notes when the item is about to be
	// published, not when the event arrives: by then the note of a write
	// whose event outran it has usually come in.
	suspects map[string]*suspects
	// pace spaces the real-change publishes of a parent that keeps
	// changing (bursts coalesce; isolated changes go at once).
	pace *pacer
}

// workPublisher publishes one work item (bus.Publisher; a fake in tests).
type workPublisher interface {
	PublishWork(ctx context.Context, item bus.WorkItem) (queued bool, err error)
}

func newOutbox(log *zap.Logger, pub workPublisher, js jetstream.JetStream, resyncBacklog int) *outbox {
	return &outbox{
		log:           log,
		pub:           pub,
		js:            js,
		resyncBacklog: resyncBacklog,
		pending:       map[string]*bus.WorkItem{},
		suspects:      map[string]*suspects{},
		pace:          newPacer(),
		resyncs:       newResyncLanes(),
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(
			workqueue.NewTypedItemExponentialFailureRateLimiter[string](50*time.Millisecond, 30*time.Second),
			workqueue.TypedRateLimitingQueueConfig[string]{Name: "metabus-watcher-publish"}),
	}
}

// shutDown stops both queues (the runners return).
func (o *outbox) shutDown() {
	o.queue.ShutDown()
	o.resyncs.shutDown()
}

// workKey is the outbox key of a unit of work of a controller: its
// bus.ItemKey, "<ctrl>/<uid>" for a parent and "<ctrl>/<uid>~<mapKey>" for
// one map key of it. It is the subject token pair of its work items, so
// one pending item per unit maps to one MC_WORK message, and two keys of a
// parent (or a key and its parent's per-parent item) never merge.
func workKey(ref bus.ControllerRef, parentUID, mapKey string) string {
	return bus.ItemKey(ref.ID(), parentUID, mapKey)
}

// entry is one reason to sync a parent, or one map key of it.
type entry struct {
	// ref is the controller, with its weight.
	ref       bus.ControllerRef
	parentRes *discovery.Resource
	parent    *unstructured.Unstructured
	// mapKey is the map key of a keyed kind's unit of work ("" for the
	// parent as a whole).
	mapKey string
	// prompt marks a resync that carries a real change (a keyed parent's
	// change fanned out to its keys): it goes before resync waves (see
	// resyncLanes).
	prompt bool
	// reason is bus.ReasonEvent, ReasonResync or ReasonRelease.
	reason string
	// gvr and rv: an object of gvr changed to resourceVersion rv (rv ""
	// for none), which the parent's snapshot must reflect.
	gvr schema.GroupVersionResource
	rv  string
	// finalizer, for a release, is the finalizer to remove.
	finalizer string
	// update is the object of an update event (the parent or an object
	// mapped to it) that may turn out to be the controller's own write;
	// nil for anything else.
	update *unstructured.Unstructured
}

// add records e in the pending item of its unit of work and queues it: a
// resync in the resync lanes, anything else in the publish queue after its
// pacing delay.
func (o *outbox) add(e entry) {
	uid := string(e.parent.GetUID())
	key := workKey(e.ref, uid, e.mapKey)
	now := time.Now()
	o.mu.Lock()
	sus := o.suspects[key]
	if sus == nil {
		sus = &suspects{}
		o.suspects[key] = sus
	}
	sus.record(e)
	item := o.pending[key]
	if item == nil {
		item = newItem(e, now)
		o.pending[key] = item
	} else {
		mergeEntry(item, e)
	}
	if e.finalizer != "" {
		item.Reason, item.Finalizer = bus.ReasonRelease, e.finalizer
	}
	if e.rv != "" {
		mergeRV(item.MinResourceVersions, grKey(e.gvr), e.rv)
	}
	resync := item.Reason == bus.ReasonResync
	o.mu.Unlock()
	if resync {
		o.resyncs.add(key, bus.ParentKey(e.ref.ID(), uid), e.prompt)
		return
	}
	if d := o.pace.event(key, now); d > 0 {
		o.queue.AddAfter(key, d)
	} else {
		o.queue.Add(key)
	}
}

// newItem is the first pending item of a unit of work.
func newItem(e entry, now time.Time) *bus.WorkItem {
	return &bus.WorkItem{
		Controller: e.ref,
		Parent: bus.ObjectRef{
			APIVersion: e.parentRes.APIVersion(),
			Kind:       e.parentRes.Kind,
			Resource:   e.parentRes.GVR.Resource,
			Namespace:  e.parent.GetNamespace(),
			Name:       e.parent.GetName(),
			UID:        string(e.parent.GetUID()),
		},
		MapKey:              e.mapKey,
		Reason:              e.reason,
		MinResourceVersions: map[string]string{},
		EnqueuedAt:          now,
	}
}

// mergeEntry folds the reason of e into a pending item: a real change
// outranks a resync, and a pending release stays a release (its finalizer
// must go whatever else happened; the sync it runs sees the rest).
func mergeEntry(item *bus.WorkItem, e entry) {
	if e.reason == bus.ReasonEvent && item.Reason != bus.ReasonRelease {
		item.Reason = e.reason
	}
}

// mergeFailed folds an item whose publish failed back into what has been
// added for its parent since (newer): the newer item keeps its reason but
// a failed release stays a release, and the freshness requirements of
// both hold.
func mergeFailed(newer, failed *bus.WorkItem) {
	for k, v := range failed.MinResourceVersions {
		mergeRV(newer.MinResourceVersions, k, v)
	}
	if failed.Reason == bus.ReasonRelease {
		newer.Reason, newer.Finalizer = failed.Reason, failed.Finalizer
	}
}

// mergeRV keeps the highest resourceVersion per key.
func mergeRV(m map[string]string, k, rv string) {
	cur, ok := m[k]
	if !ok {
		m[k] = rv
		return
	}
	if c, err := resourceversion.CompareResourceVersion(rv, cur); err == nil && c > 0 {
		m[k] = rv
	}
}

// suspects are the update events behind a pending item (object UID and
// new resourceVersion), unless something else caused it too (news).
type suspects struct {
	news    bool
	updates [][2]string
}

// maxSuspects bounds the updates remembered per pending item; past it the
// item is simply published.
const maxSuspects = 16

// record notes the event behind e: an update may be an echo, anything
// else is news.
func (s *suspects) record(e entry) {
	if e.update == nil || e.reason != bus.ReasonEvent || len(s.updates) >= maxSuspects {
		s.news = true
		return
	}
	s.updates = append(s.updates, [2]string{string(e.update.GetUID()), e.update.GetResourceVersion()})
}

// echoOnly reports whether every event behind a pending item was one of the
// controller's own writes (an applier's note lists it): not news to its
// hook, so the item need not be published.
func (o *outbox) echoOnly(ctrlID string, s *suspects) bool {
	if s == nil || s.news || len(s.updates) == 0 {
		return false
	}
	for _, u := range s.updates {
		if !o.echoes.Wrote(ctrlID, u[0], u[1]) {
			return false
		}
	}
	return true
}

// take removes and returns the pending item of key and its suspects.
func (o *outbox) take(key string) (*bus.WorkItem, *suspects) {
	o.mu.Lock()
	defer o.mu.Unlock()
	item, sus := o.pending[key], o.suspects[key]
	delete(o.pending, key)
	delete(o.suspects, key)
	return item, sus
}

// runPublisher publishes items from the publish queue until it shuts down.
func (o *outbox) runPublisher(ctx context.Context) {
	for {
		key, shutdown := o.queue.Get()
		if shutdown {
			return
		}
		item, sus := o.take(key)
		if item == nil || (item.Reason == bus.ReasonEvent && o.echoOnly(item.Controller.ID(), sus)) {
			if item != nil {
				o.metrics.echoes.Inc()
				o.pace.dropped(key)
			}
			o.queue.Forget(key)
			o.queue.Done(key)
			continue
		}
		o.pace.published(key, time.Now())
		o.publish(ctx, key, item)
		o.queue.Done(key)
	}
}

// runResyncPacer publishes resync items only while MC_WORK's backlog is
// below the resync backlog, in the order the resync lanes give them.
func (o *outbox) runResyncPacer(ctx context.Context) {
	limit := o.resyncBacklog
	if limit == 0 {
		limit = bus.DefaultPartitions / 2
	}
	var stream jetstream.Stream
	budget := 0
	for {
		key, shutdown := o.resyncs.get()
		if shutdown {
			return
		}
		for limit > 0 && budget <= 0 && ctx.Err() == nil {
			if stream == nil {
				s, err := o.js.Stream(ctx, bus.WorkStream)
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
		o.mu.Lock()
		item := o.pending[key]
		if item != nil && item.Reason == bus.ReasonResync {
			delete(o.pending, key)
			delete(o.suspects, key)
		} else {
			// Gone, or upgraded to a real change that the main queue
			// publishes.
			item = nil
		}
		o.mu.Unlock()
		if item != nil {
			o.publish(ctx, key, item)
			budget--
		}
	}
}

// errReleaseRefused: a finalizer release found its parent's queue full.
var errReleaseRefused = errors.New("finalizer release refused: parent already queued")

// publish sends one work item; on failure it is put back (merged with
// anything newer) and retried with backoff through the main queue.
func (o *outbox) publish(ctx context.Context, key string, item *bus.WorkItem) {
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	queued, err := o.pub.PublishWork(pctx, *item)
	cancel()
	if err == nil && !queued && item.Reason == bus.ReasonRelease {
		// The parent's queued items are ordinary syncs, which do not
		// release a finalizer of a kind the controller stopped
		// targeting: keep the release until the queue takes it.
		err = errReleaseRefused
	}
	switch {
	case err != nil:
		o.metrics.published.WithLabelValues(item.Reason, "error").Inc()
		if ctx.Err() == nil && err != errReleaseRefused {
			o.log.Warn("publish work item; will retry", zap.String("key", key), zap.Error(err))
		}
		o.putBack(key, item)
		o.queue.AddRateLimited(key)
	case queued:
		o.metrics.published.WithLabelValues(item.Reason, "queued").Inc()
		o.queue.Forget(key)
	default:
		o.metrics.published.WithLabelValues(item.Reason, "already_queued").Inc()
		o.queue.Forget(key)
	}
}

// putBack returns an item whose publish failed to the pending items,
// merged with anything added for its parent since.
func (o *outbox) putBack(key string, item *bus.WorkItem) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if newer, ok := o.pending[key]; ok {
		mergeFailed(newer, item)
		return
	}
	o.pending[key] = item
}
