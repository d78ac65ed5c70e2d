// Package informers shares one dynamic informer per resource across every
// controller in a process, with the indexes metabus needs (controller owner
// UID, object UID, namespace) and a freshness mark per resource.
//
// Sharing matters for memory: a cluster with many controllers watching Pods
// keeps one Pod cache, not one per controller. Subscriptions are reference
// counted so that re-wiring a controller (subscribe new, then release old)
// never stops and relists an informer that another controller still uses.
//
// Each event reaches only the subscribers it can concern (see Interest), so
// its cost does not grow with the number of controllers sharing the
// informer.
package informers

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/resourceversion"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"

	"github.com/metabus/metabus/pkg/kubeapi"
)

// Index names.
const (
	// IndexOwnerUID indexes objects by the UID of their controller
	// ownerReference: the children of a parent in one lookup.
	IndexOwnerUID = "ownerUID"
	// IndexUID indexes objects by their own UID (work items name parents by
	// UID).
	IndexUID = "uid"
	// IndexOrphan holds objects with no controller ownerReference under the
	// key of their namespace (candidates for adoption).
	IndexOrphan = "orphan"
	// IndexControllerName indexes objects by their controller's
	// group/Kind/namespace/name (ControllerNameKey): the children of
	// earlier incarnations of a parent, whose UID no longer exists.
	IndexControllerName = "controllerName"
)

// ControllerNameKey is the IndexControllerName key of a controller: group,
// kind, the namespace of the controlled object (owners are
// namespace-local) and name.
func ControllerNameKey(group, kind, namespace, name string) string {
	return group + "/" + kind + "/" + namespace + "/" + name
}

func indexers() cache.Indexers {
	return cache.Indexers{
		cache.NamespaceIndex: cache.MetaNamespaceIndexFunc,
		IndexOwnerUID: func(obj any) ([]string, error) {
			m, err := meta.Accessor(obj)
			if err != nil {
				return nil, nil
			}
			if ref := metav1.GetControllerOfNoCopy(m); ref != nil {
				return []string{string(ref.UID)}, nil
			}
			return nil, nil
		},
		IndexUID: func(obj any) ([]string, error) {
			m, err := meta.Accessor(obj)
			if err != nil {
				return nil, nil
			}
			return []string{string(m.GetUID())}, nil
		},
		IndexControllerName: func(obj any) ([]string, error) {
			m, err := meta.Accessor(obj)
			if err != nil {
				return nil, nil
			}
			ref := metav1.GetControllerOfNoCopy(m)
			if ref == nil {
				return nil, nil
			}
			gv, err := schema.ParseGroupVersion(ref.APIVersion)
			if err != nil {
				return nil, nil
			}
			return []string{ControllerNameKey(gv.Group, ref.Kind, m.GetNamespace(), ref.Name)}, nil
		},
		IndexOrphan: func(obj any) ([]string, error) {
			m, err := meta.Accessor(obj)
			if err != nil {
				return nil, nil
			}
			if metav1.GetControllerOfNoCopy(m) == nil {
				return []string{m.GetNamespace()}, nil
			}
			return nil, nil
		},
	}
}

// stripManagedFields drops metadata.managedFields from cached objects: hooks
// never need them (kubectl hides them too) and they are often half of an
// object's size.
func stripManagedFields(obj any) (any, error) {
	if u, ok := obj.(*unstructured.Unstructured); ok {
		unstructured.RemoveNestedField(u.Object, "metadata", "managedFields")
	}
	return obj, nil
}

// Registry owns the shared informers.
type Registry struct {
	client dynamic.Interface
	// rest, if set, serves the informers' watches with one-pass decoding
	// (watchJSON); lists still go through client.
	rest   rest.Interface
	resync time.Duration

	mu      sync.Mutex
	entries map[schema.GroupVersionResource]*entry
}

type entry struct {
	informer cache.SharedIndexInformer
	// reg is the registration of the one handler: it has synced once the
	// initial list went through fanOut.
	reg  cache.ResourceEventHandlerRegistration
	stop chan struct{}
	refs int

	// subs are the subscribers' handlers and their routing index (copy
	// on write; subsMu orders the writers). The informer has one handler
	// of ours, which calls in turn those an event concerns: a client-go handler per subscriber costs two
	// goroutines and an unbounded buffer each, and every event is copied
	// to every one of them, so 1,000 controllers on one resource held 1.2
	// GB and fell minutes behind. Subscriber handlers must not block (the
	// watcher's only enqueue).
	subsMu sync.Mutex
	subs   atomic.Pointer[subscribers]

	mu   sync.Mutex
	seen string // highest resourceVersion delivered to handlers
	cond *sync.Cond
}

// New returns a registry. resync is the informer resync period (0: none;
// the watcher runs its own cache-flush resync through the bus).
func New(client dynamic.Interface, resync time.Duration) *Registry {
	return &Registry{client: client, resync: resync, entries: map[schema.GroupVersionResource]*entry{}}
}

// NewForConfig returns a registry on cfg whose watches decode each event in
// one pass (see watchJSON). One REST client serves lists and watches, so
// they share its rate limiter and connection.
func NewForConfig(cfg *rest.Config, resync time.Duration) (*Registry, error) {
	rc, err := kubeapi.NewREST(cfg)
	if err != nil {
		return nil, fmt.Errorf("informers: %w", err)
	}
	r := New(dynamic.New(rc), resync)
	r.rest = rc
	return r, nil
}

// informerFor builds the informer of gvr in every namespace, as client-go's
// dynamicinformer would (which metabus does not import: it pulls in
// client-go's informers for every built-in type). Lists go through the
// dynamic client; watches too, unless the registry has a REST client for
// one-pass watches.
//
// in is the informer's interner: its transform interns cached objects, and
// one-pass watches decode map keys through it.
func (r *Registry) informerFor(gvr schema.GroupVersionResource, in *interner) cache.SharedIndexInformer {
	res := r.client.Resource(gvr)
	watchFunc := func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
		return res.Watch(ctx, o)
	}
	if r.rest != nil {
		watchFunc = func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			return watchJSON(ctx, r.rest, gvr, o, in.key)
		}
	}
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			return res.List(ctx, o)
		},
		WatchFuncWithContext: watchFunc,
	}
	return cache.NewSharedIndexInformerWithOptions(cache.ToListWatcherWithWatchListSemantics(lw, r.client), &unstructured.Unstructured{},
		cache.SharedIndexInformerOptions{ResyncPeriod: r.resync, Indexers: indexers(), ObjectDescription: gvr.String()})
}

// Handle is one subscription to a resource's informer.
type Handle struct {
	r     *Registry
	gvr   schema.GroupVersionResource
	e     *entry
	mu    sync.Mutex
	subs  []*subscriber
	freed bool
}

// Acquire subscribes to gvr, starting its informer if this is the first
// subscriber.
func (r *Registry) Acquire(gvr schema.GroupVersionResource) *Handle {
	r.mu.Lock()
	defer r.mu.Unlock()
	e, ok := r.entries[gvr]
	if !ok {
		in := newInterner()
		inf := r.informerFor(gvr, in)
		_ = inf.SetTransform(in.transform)
		e = &entry{informer: inf, stop: make(chan struct{})}
		e.cond = sync.NewCond(&e.mu)
		// The one handler: it feeds the subscribers, then the freshness
		// mark. Handlers run after the indexer is updated, and a
		// subscriber has had the event before "seen" covers it, so a
		// reader that waited for "seen" finds the object in lookups and
		// its subscribers' work already enqueued.
		e.reg, _ = inf.AddEventHandler(cache.ResourceEventHandlerDetailedFuncs{
			AddFunc: func(obj any, initial bool) {
				e.fanOut(nil, obj, func(h cache.ResourceEventHandler) { h.OnAdd(obj, initial) })
				e.observe(obj)
			},
			UpdateFunc: func(old, obj any) {
				e.fanOut(old, obj, func(h cache.ResourceEventHandler) { h.OnUpdate(old, obj) })
				e.observe(obj)
			},
			DeleteFunc: func(obj any) {
				e.fanOut(nil, obj, func(h cache.ResourceEventHandler) { h.OnDelete(obj) })
				e.observe(obj)
			},
		})
		r.entries[gvr] = e
		go inf.Run(e.stop)
	}
	e.refs++
	return &Handle{r: r, gvr: gvr, e: e}
}

// subscriber is one handler of a Handle. mu serializes its calls, as
// client-go does per handler, and holds live events back until the
// replay of what was cached when it subscribed is done.
type subscriber struct {
	mu sync.Mutex
	h  cache.ResourceEventHandler
	// in is the events it can act on (nil: every event).
	in *Interest
	// calls counts the events it was given, replay included.
	calls atomic.Uint64
	// replayed is set once the replay is done.
	replayed atomic.Bool
}

// subscribers is an entry's subscriber list and its routing index, replaced
// together.
type subscribers struct {
	list   []*subscriber
	routes *routes
}

// fanOut calls the subscribers an event concerns (old is the object before
// an update, nil otherwise).
func (e *entry) fanOut(old, obj any, call func(cache.ResourceEventHandler)) {
	subs := e.subs.Load()
	if subs == nil || len(subs.list) == 0 {
		return
	}
	for _, i := range subs.routes.receivers(metaOf(old), metaOf(obj)) {
		s := subs.list[i]
		s.mu.Lock()
		s.calls.Add(1)
		call(s.h)
		s.mu.Unlock()
	}
}

// metaOf is obj's metadata (a deleted object's last known state), or nil.
func metaOf(obj any) metav1.Object {
	if obj == nil {
		return nil
	}
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = d.Obj
	}
	m, err := meta.Accessor(obj)
	if err != nil {
		return nil
	}
	return m
}

// setSubs replaces the subscriber list with f(current) and rebuilds its
// routing index.
func (e *entry) setSubs(f func([]*subscriber) []*subscriber) {
	e.subsMu.Lock()
	defer e.subsMu.Unlock()
	var cur []*subscriber
	if p := e.subs.Load(); p != nil {
		cur = p.list
	}
	next := f(slices.Clone(cur))
	interests := make([]*Interest, len(next))
	for i, s := range next {
		interests[i] = s.in
	}
	e.subs.Store(&subscribers{list: next, routes: buildRoutes(interests)})
}

func (e *entry) observe(obj any) {
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = d.Obj
	}
	m, err := meta.Accessor(obj)
	if err != nil {
		return
	}
	rv := m.GetResourceVersion()
	e.mu.Lock()
	if e.seen == "" {
		e.seen = rv
	} else if c, err := resourceversion.CompareResourceVersion(rv, e.seen); err == nil && c > 0 {
		e.seen = rv
	}
	e.cond.Broadcast()
	e.mu.Unlock()
}

// Informer returns the shared informer.
func (h *Handle) Informer() cache.SharedIndexInformer { return h.e.informer }

// GVR returns the handle's resource.
func (h *Handle) GVR() schema.GroupVersionResource { return h.gvr }

// AddHandler adds an event handler; it receives synthetic adds (initial
// list) for every object already cached, so a new subscriber sees the
// current world without a relist. The replay runs on a goroutine of its
// own, as client-go's does, so a caller may hold a lock its handler takes;
// live events wait for it. An event that raced with the replay may repeat
// an object it delivered; handlers are idempotent.
func (h *Handle) AddHandler(handler cache.ResourceEventHandler) error {
	return h.AddRoutedHandler(handler, nil)
}

// AddRoutedHandler is AddHandler for a handler that acts only on the
// events in describes (nil: every event): the handler is called for those
// only, replay included, and the events it is not called for cost it
// nothing. The handler must do nothing with the events in leaves out.
func (h *Handle) AddRoutedHandler(handler cache.ResourceEventHandler, in *Interest) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.freed {
		return fmt.Errorf("informer handle for %s already released", h.gvr)
	}
	s := &subscriber{h: handler, in: in}
	s.mu.Lock() // released by the replay
	h.e.setSubs(func(cur []*subscriber) []*subscriber { return append(cur, s) })
	// Listed after subscribing: whatever the list misses reaches the
	// subscriber as an event.
	items := h.e.informer.GetStore().List()
	go func() {
		defer s.mu.Unlock()
		rt := buildRoutes([]*Interest{in})
		for _, obj := range items {
			if len(rt.receivers(nil, metaOf(obj))) > 0 {
				s.calls.Add(1)
				handler.OnAdd(obj, true)
			}
		}
		s.replayed.Store(true)
	}()
	h.subs = append(h.subs, s)
	return nil
}

// Calls returns how many events the handlers added through h were given,
// replay included: what routing saves shows here.
func (h *Handle) Calls() uint64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	var n uint64
	for _, s := range h.subs {
		n += s.calls.Load()
	}
	return n
}

// HasSynced reports whether the informer finished its initial list.
func (h *Handle) HasSynced() bool { return h.e.informer.HasSynced() }

// HandlersSynced reports whether every handler added through h has been
// given the initial state: the informer's initial list went through the
// shared handler, and each handler's replay is done. HasSynced is not
// enough for a subscriber that keeps its own index of the objects (the
// watcher's map-key indexes): the replay runs on its own goroutine, and
// client-go's HasSynced does not wait for handlers at all, so a lookup in
// such an index could still miss objects the cache holds.
func (h *Handle) HandlersSynced() bool {
	if !h.e.informer.HasSynced() || (h.e.reg != nil && !h.e.reg.HasSynced()) {
		return false
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, s := range h.subs {
		if !s.replayed.Load() {
			return false
		}
	}
	return true
}

// Release removes the handle's handlers and stops the informer when no other
// subscriber remains. Safe to call twice.
func (h *Handle) Release() {
	h.mu.Lock()
	if h.freed {
		h.mu.Unlock()
		return
	}
	h.freed = true
	mine := h.subs
	h.e.setSubs(func(cur []*subscriber) []*subscriber {
		return slices.DeleteFunc(cur, func(s *subscriber) bool { return slices.Contains(mine, s) })
	})
	h.subs = nil
	h.mu.Unlock()

	h.r.mu.Lock()
	defer h.r.mu.Unlock()
	h.e.refs--
	if h.e.refs == 0 {
		close(h.e.stop)
		delete(h.r.entries, h.gvr)
	}
}

// ByUID returns the cached object with uid.
func (h *Handle) ByUID(uid string) (*unstructured.Unstructured, bool) {
	objs, err := h.e.informer.GetIndexer().ByIndex(IndexUID, uid)
	if err != nil || len(objs) == 0 {
		return nil, false
	}
	u, ok := objs[0].(*unstructured.Unstructured)
	return u, ok
}

// OwnedBy returns the cached objects whose controller ownerReference has uid.
func (h *Handle) OwnedBy(uid string) []*unstructured.Unstructured {
	return h.byIndex(IndexOwnerUID, uid)
}

// ControlledByName returns cached objects in namespace ns whose controller
// is the object of group and kind named name, whatever its UID.
func (h *Handle) ControlledByName(group, kind, ns, name string) []*unstructured.Unstructured {
	return h.byIndex(IndexControllerName, ControllerNameKey(group, kind, ns, name))
}

// Orphans returns cached objects in namespace ns with no controller.
func (h *Handle) Orphans(ns string) []*unstructured.Unstructured {
	return h.byIndex(IndexOrphan, ns)
}

// AllOrphans returns cached objects with no controller, in every namespace.
func (h *Handle) AllOrphans() []*unstructured.Unstructured {
	var out []*unstructured.Unstructured
	for _, ns := range h.e.informer.GetIndexer().ListIndexFuncValues(IndexOrphan) {
		out = append(out, h.byIndex(IndexOrphan, ns)...)
	}
	return out
}

// InNamespace returns the cached objects of namespace ns.
func (h *Handle) InNamespace(ns string) []*unstructured.Unstructured {
	return h.byIndex(cache.NamespaceIndex, ns)
}

// List returns every cached object.
func (h *Handle) List() []*unstructured.Unstructured {
	objs := h.e.informer.GetStore().List()
	out := make([]*unstructured.Unstructured, 0, len(objs))
	for _, o := range objs {
		if u, ok := o.(*unstructured.Unstructured); ok {
			out = append(out, u)
		}
	}
	return out
}

func (h *Handle) byIndex(index, key string) []*unstructured.Unstructured {
	objs, err := h.e.informer.GetIndexer().ByIndex(index, key)
	if err != nil {
		return nil
	}
	out := make([]*unstructured.Unstructured, 0, len(objs))
	for _, o := range objs {
		if u, ok := o.(*unstructured.Unstructured); ok {
			out = append(out, u)
		}
	}
	return out
}

// Seen returns the highest resourceVersion the informer has delivered.
func (h *Handle) Seen() string {
	h.e.mu.Lock()
	defer h.e.mu.Unlock()
	return h.e.seen
}

// WaitSeen waits until the informer has delivered resourceVersion rv (or a
// later one), or ctx ends. It returns whether the cache is that fresh. An
// unparseable rv is treated as satisfied: freshness is an optimisation on
// top of the periodic resync, never a reason to block forever.
func (h *Handle) WaitSeen(ctx context.Context, rv string) bool {
	if h.HasSeen(rv) {
		return true // also "" and unparseable; the usual case, no waker
	}
	done := make(chan struct{})
	defer close(done)
	go func() {
		select {
		case <-ctx.Done():
			h.e.mu.Lock()
			h.e.cond.Broadcast()
			h.e.mu.Unlock()
		case <-done:
		}
	}()
	h.e.mu.Lock()
	defer h.e.mu.Unlock()
	for {
		if h.e.seen != "" {
			c, err := resourceversion.CompareResourceVersion(h.e.seen, rv)
			if err != nil || c >= 0 {
				return true
			}
		}
		if ctx.Err() != nil {
			return false
		}
		h.e.cond.Wait()
	}
}

// HasSeen is WaitSeen without the wait: whether the informer has
// delivered resourceVersion rv or a later one (true for "" and for an
// unparseable rv).
func (h *Handle) HasSeen(rv string) bool {
	if rv == "" {
		return true
	}
	if _, err := resourceversion.CompareResourceVersion(rv, rv); err != nil {
		return true
	}
	h.e.mu.Lock()
	defer h.e.mu.Unlock()
	if h.e.seen == "" {
		return false
	}
	c, err := resourceversion.CompareResourceVersion(h.e.seen, rv)
	return err != nil || c >= 0
}

// WaitForSync waits for the initial list of the informer.
func (h *Handle) WaitForSync(ctx context.Context) bool {
	return cache.WaitForCacheSync(ctx.Done(), h.e.informer.HasSynced)
}
