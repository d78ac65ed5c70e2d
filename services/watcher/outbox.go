package watcher

import (
	"context"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/zap"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/util/workqueue"

	"github.com/metabus/metabus/pkg/apiresource"
	"github.com/metabus/metabus/pkg/bus"
	"github.com/metabus/metabus/pkg/echo"
)

// outbox holds the work items waiting to be published, merged per unit of
// work (a parent, or one map key of a keyed kind's parent: bus.ItemKey),
// and publishes them: real changes through the paced publish queue,
// resyncs through their own lanes, fed in only while their controller has
// few resyncs in MC_WORK. Informer handlers only ever add to it; they
// never wait on NATS.
type outbox struct {
	log     *zap.Logger
	pub     workPublisher
	js      jetstream.JetStream
	metrics *metrics
	// echoes holds the appliers' Applied notes (set before the first
	// publish): an update event that is a controller's own latest write is
	// not published for it.
	echoes *echo.Book
	// resyncBacklog bounds each controller's resync items in MC_WORK
	// (Config.ResyncBacklog).
	resyncBacklog int
	// resyncTotal bounds all controllers' resync items in MC_WORK
	// (Config.ResyncTotal; 0: resyncTotal), but for each controller's
	// fair share of it (resyncPacing.ready).
	resyncTotal int

	// queue publishes real changes (and retries of failed publishes);
	// resyncs publishes resyncs, paced per controller.
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

// workPublisher publishes one work item (jsbus.Publisher; a fake in tests).
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
	parentRes *apiresource.Resource
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
		bus.RaiseResourceVersion(item.MinResourceVersions, grKey(e.gvr), e.rv)
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
		bus.RaiseResourceVersion(newer.MinResourceVersions, k, v)
	}
	if failed.Reason == bus.ReasonRelease {
		newer.Reason, newer.Finalizer = failed.Reason, failed.Finalizer
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
		_ = o.publish(ctx, key, item)
		o.queue.Done(key)
	}
}

// Resync pacing defaults: a controller may have defaultResyncBacklog
// resync items in MC_WORK at once, and all controllers together
// resyncTotal (a cache flush of many controllers must not fill the
// partitions' MaxAckPending, behind which real changes would wait on the
// server). While every waiting resync is held back, the pacer looks at
// MC_WORK again after resyncPollMin, doubling up to resyncPollMax; while
// nothing waits, or something can go, it does not look at all.
const (
	defaultResyncBacklog = 32
	resyncTotal          = 1024
	resyncPollMin        = 50 * time.Millisecond
	resyncPollMax        = time.Second
)

// resyncPacing counts, per controller, the resync items the pacer has put
// in MC_WORK that may still be there (by stored subject).
type resyncPacing struct {
	perCtrl, total int
	inflight       map[string]map[string]bool
	n              int
}

// ready reports whether a controller's next resync may go. Always while
// it has fewer than perCtrl in MC_WORK and all controllers together fewer
// than total; beyond the total, a controller under its fair share of the
// total (total over the controllers with resyncs in MC_WORK, itself
// included) while all hold fewer than twice the total, and a controller
// with none there at all.
//
// Why: controllers whose hooks hang keep their items in MC_WORK for good,
// so 32 of them at the default backlog held the default total, and no
// other controller's resync (a first sync, a resyncPeriod) went out until
// they drained. Now a controller under its share still gets its items in
// (one at least), and the items in MC_WORK stay bounded, as the
// partitions' MaxAckPending needs: at most twice the total plus one per
// controller.
func (p *resyncPacing) ready(ctrl string) bool {
	mine := len(p.inflight[ctrl])
	switch {
	case mine >= p.perCtrl:
		return false
	case p.n < p.total, mine == 0:
		return true
	default:
		return p.n < 2*p.total && mine < p.fairShare(ctrl)
	}
}

// fairShare is ctrl's share of total among the controllers with resync
// items in MC_WORK and ctrl.
func (p *resyncPacing) fairShare(ctrl string) int {
	active := len(p.inflight)
	if len(p.inflight[ctrl]) == 0 {
		active++
	}
	return max(p.total/active, 1)
}

func (p *resyncPacing) sent(ctrl, subject string) {
	set := p.inflight[ctrl]
	if set == nil {
		set = map[string]bool{}
		p.inflight[ctrl] = set
	}
	if !set[subject] {
		set[subject] = true
		p.n++
	}
}

// refresh forgets the resync items of ctrls that MC_WORK no longer holds
// (a dispatcher took them: one stream info request per controller, listing
// its subjects); it reports whether any went.
func (p *resyncPacing) refresh(ctx context.Context, stream jetstream.Stream, ctrls []string) bool {
	gone := false
	for _, ctrl := range ctrls {
		set := p.inflight[ctrl]
		if len(set) == 0 {
			continue
		}
		info, err := stream.Info(ctx, jetstream.WithSubjectFilter(bus.StoredWorkFilter(ctrl)))
		if err != nil {
			continue
		}
		for subject := range set {
			if info.State.Subjects[subject] == 0 {
				delete(set, subject)
				p.n--
				gone = true
			}
		}
		if len(set) == 0 {
			delete(p.inflight, ctrl)
		}
	}
	return gone
}

// runResyncPacer publishes resync items, in the order the resync lanes
// give them, while their controller has fewer than the resync backlog of
// them in MC_WORK (and all controllers fewer than the total, or it fewer
// than its fair share of the total): one controller's backlog, even a hook
// hanging over thousands of parents, and the backlogs of many such
// controllers never hold another controller's resyncs, first syncs or
// fan-outs back.
func (o *outbox) runResyncPacer(ctx context.Context) {
	limit := o.resyncBacklog
	if limit == 0 {
		limit = defaultResyncBacklog
	}
	total := o.resyncTotal
	if total <= 0 {
		total = resyncTotal
	}
	pace := &resyncPacing{perCtrl: limit, total: max(limit, total), inflight: map[string]map[string]bool{}}
	ready := pace.ready
	if limit < 0 {
		ready = nil // unpaced
	}
	var stream jetstream.Stream
	backoff := time.Duration(0)
	for {
		if key, ok := o.resyncs.take(ready); ok {
			if item := o.takeResync(key); item != nil && o.publish(ctx, key, item) && ready != nil {
				pace.sent(item.Controller.ID(), bus.StoredWorkSubjectKey(item.Controller.ID(), item.Parent.UID, item.MapKey))
			}
			continue
		}
		if o.resyncs.isClosed() || ctx.Err() != nil {
			return
		}
		var poll <-chan time.Time
		var t *time.Timer
		if o.resyncs.len() > 0 {
			// Everything waiting is held back: look again later.
			backoff = min(max(2*backoff, resyncPollMin), resyncPollMax)
			t = time.NewTimer(backoff)
			poll = t.C
		}
		select {
		case <-ctx.Done():
			return
		case <-o.resyncs.notify:
			if t != nil {
				t.Stop()
			}
		case <-poll:
			if stream == nil {
				s, err := o.js.Stream(ctx, bus.WorkStream)
				if err != nil {
					continue
				}
				stream = s
			}
			ctrls := o.resyncs.waiting()
			if pace.n >= pace.total {
				ctrls = ctrls[:0]
				for ctrl := range pace.inflight {
					ctrls = append(ctrls, ctrl)
				}
			}
			if pace.refresh(ctx, stream, ctrls) {
				backoff = 0
			}
		}
	}
}

// takeResync removes and returns the pending resync item of key (nil if it
// went, or was upgraded to a real change that the main queue publishes).
func (o *outbox) takeResync(key string) *bus.WorkItem {
	o.mu.Lock()
	defer o.mu.Unlock()
	item := o.pending[key]
	if item == nil || item.Reason != bus.ReasonResync {
		return nil
	}
	delete(o.pending, key)
	delete(o.suspects, key)
	return item
}

// mustLand reports whether a refused item must be published again rather
// than counted as already queued. The limit's promise, "one item in flight
// and one pending, and the pending one will see this change", does not
// hold while an item's ack is on its way: a dispatcher acks a work item
// without waiting for the server (jsbus.held.Ack), and in a cluster the
// removal behind an ack is a Raft proposal of its own, so the parent's
// next item can already have taken its snapshot while the acked one still
// counts. A real change refused then was lost until the next flush (a CI
// run: a MapController parent's status never counted an output created
// just then). So a real change, and a finalizer release (the parent's
// queued items are ordinary syncs that would not release the finalizer of
// a kind the controller stopped targeting), waits for room with backoff:
// at worst one sync more, as client-go's workqueue runs an item again when
// it was added while being processed. A resync refused is dropped: the
// queued items sync the parent at about the time it asked for, and a
// hook's resyncAfterSeconds is asked again by every answer.
func mustLand(item *bus.WorkItem) bool {
	return item.Reason == bus.ReasonEvent || item.Reason == bus.ReasonRelease
}

// publish sends one work item; on failure, or a refusal of one that must
// land, it is put back (merged with anything newer) and retried with
// backoff through the main queue. It reports whether the item is in
// MC_WORK (queued, or a resync already queued).
func (o *outbox) publish(ctx context.Context, key string, item *bus.WorkItem) bool {
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	queued, err := o.pub.PublishWork(pctx, *item)
	cancel()
	switch {
	case err != nil || !queued && mustLand(item):
		result := "deferred"
		if err != nil {
			result = "error"
			if ctx.Err() == nil {
				o.log.Warn("publish work item; will retry", zap.String("key", key), zap.Error(err))
			}
		}
		o.metrics.published.WithLabelValues(item.Reason, result).Inc()
		o.putBack(key, item)
		o.queue.AddRateLimited(key)
		return false
	case queued:
		o.metrics.published.WithLabelValues(item.Reason, "queued").Inc()
		o.queue.Forget(key)
	default:
		o.metrics.published.WithLabelValues(item.Reason, "already_queued").Inc()
		o.queue.Forget(key)
	}
	return true
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
