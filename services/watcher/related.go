package watcher

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"

	"github.com/nats-io/nats.go"
	"go.uber.org/zap"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/tools/cache"

	"github.com/metabus/metabus/pkg/apiresource"
	"github.com/metabus/metabus/pkg/bus"
	"github.com/metabus/metabus/pkg/informers"
	"github.com/metabus/metabus/pkg/related"
	"github.com/metabus/metabus/pkg/snapshot"
)

// relatedIndex maps related objects to the parents that depend on them. A
// change of a related object looks up its resource and namespace bucket,
// not every parent of the controller.
//
// Its size follows what the parents' rules name now, not what they ever
// named: a customize hook is someone else's code, and one naming a new
// namespace (or resource) at every call must not grow the watcher. Empty
// buckets are deleted, and the informer of a resource (and of namespaces)
// is released once no rule needs it.
type relatedIndex struct {
	mu       sync.Mutex
	byParent map[string][]related.Resolved // parent UID → its rules
	// byBucket: resource → namespace ("" = rules spanning all namespaces)
	// → parent UID → rules.
	byBucket map[schema.GroupVersionResource]map[string]map[string][]related.Rule
	handles  map[schema.GroupVersionResource]*informers.Handle
	ns       *informers.Handle // namespaces, for namespaceSelector rules
	// nsRules counts the indexed rules that need namespace labels.
	nsRules int

	w   *Watcher
	ctx context.Context
	// enqueue resyncs the parent with that UID (if its controller still
	// handles it) because an object of gvr changed to resourceVersion rv.
	enqueue func(uid string, gvr schema.GroupVersionResource, rv string)
}

// newRelatedIndex returns the related-objects index of one controller
// wiring (of any kind).
func newRelatedIndex(ctx context.Context, w *Watcher, enqueue func(uid string, gvr schema.GroupVersionResource, rv string)) *relatedIndex {
	return &relatedIndex{
		byParent: map[string][]related.Resolved{},
		byBucket: map[schema.GroupVersionResource]map[string]map[string][]related.Rule{},
		handles:  map[schema.GroupVersionResource]*informers.Handle{},
		w:        w,
		ctx:      ctx,
		enqueue:  enqueue,
	}
}

// handleFor returns the related informer handle for a freshness key
// ("<group>/<resource>"), or nil.
func (ix *relatedIndex) handleFor(key string) *informers.Handle {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	for gvr, h := range ix.handles {
		if grKey(gvr) == key {
			return h
		}
	}
	return nil
}

// register records a parent's rules (replacing earlier ones) and
// subscribes to the resources they name.
func (ix *relatedIndex) register(rr *bus.RelatedRules) ([]related.Resolved, error) {
	if err := refuse(ix.w.resources, relatedResources(rr.Rules)); err != nil {
		return nil, fmt.Errorf("refused, nothing watched: %w", err)
	}
	rules, err := related.Resolve(rr, func(apiVersion, resource string) (*apiresource.Resource, error) {
		return ix.w.disc.Resolve(ix.ctx, apiVersion, resource)
	})
	if err != nil {
		return nil, err
	}
	ix.mu.Lock()
	defer ix.mu.Unlock()
	// The new rules go in before what the old ones leave unused is
	// released, so an informer both use keeps running (no relist).
	ix.unindexLocked(rr.ParentUID)
	defer ix.releaseUnusedLocked()
	ix.byParent[rr.ParentUID] = rules
	for _, r := range rules {
		gvr := r.Res.GVR
		if ix.byBucket[gvr] == nil {
			ix.byBucket[gvr] = map[string]map[string][]related.Rule{}
		}
		b := ix.byBucket[gvr][r.Rule.Namespace]
		if b == nil {
			b = map[string][]related.Rule{}
			ix.byBucket[gvr][r.Rule.Namespace] = b
		}
		b[rr.ParentUID] = append(b[rr.ParentUID], r.Rule)
		if r.Rule.NeedsNamespaceLabels() {
			ix.nsRules++
		}
		if ix.handles[gvr] == nil {
			h := ix.w.registry.Acquire(gvr)
			ix.handles[gvr] = h
			g := gvr
			if err := h.AddHandler(cache.ResourceEventHandlerFuncs{
				AddFunc:    func(obj any) { ix.onRelated(g, nil, obj) },
				UpdateFunc: func(old, obj any) { ix.onRelated(g, old, obj) },
				DeleteFunc: func(obj any) { ix.onRelated(g, nil, obj) },
			}); err != nil {
				return nil, err
			}
		}
		if r.Rule.NeedsNamespaceLabels() && ix.ns == nil {
			ix.ns = ix.w.registry.Acquire(schema.GroupVersionResource{Version: "v1", Resource: "namespaces"})
		}
	}
	return rules, nil
}

// drop forgets a parent's rules (it was deleted).
func (ix *relatedIndex) drop(uid string) {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	ix.unindexLocked(uid)
	ix.releaseUnusedLocked()
}

// unindexLocked removes a parent's rules from the index, deleting the
// buckets they leave empty.
func (ix *relatedIndex) unindexLocked(uid string) {
	for _, r := range ix.byParent[uid] {
		gvr := r.Res.GVR
		if b := ix.byBucket[gvr][r.Rule.Namespace]; b != nil {
			delete(b, uid)
			if len(b) == 0 {
				delete(ix.byBucket[gvr], r.Rule.Namespace)
			}
		}
		if len(ix.byBucket[gvr]) == 0 {
			delete(ix.byBucket, gvr)
		}
		if r.Rule.NeedsNamespaceLabels() {
			ix.nsRules--
		}
	}
	delete(ix.byParent, uid)
}

// releaseUnusedLocked releases the informers no indexed rule needs.
func (ix *relatedIndex) releaseUnusedLocked() {
	for gvr, h := range ix.handles {
		if len(ix.byBucket[gvr]) == 0 {
			h.Release()
			delete(ix.handles, gvr)
		}
	}
	if ix.ns != nil && ix.nsRules == 0 {
		ix.ns.Release()
		ix.ns = nil
	}
}

// size returns how many namespace buckets and informer handles (the
// namespaces' included) the index holds.
func (ix *relatedIndex) size() (buckets, handles int) {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	for _, b := range ix.byBucket {
		buckets += len(b)
	}
	handles = len(ix.handles)
	if ix.ns != nil {
		handles++
	}
	return buckets, handles
}

// relatedBuckets sums the namespace buckets of every wiring's related
// index, for the metrics.
func (w *Watcher) relatedBuckets() int {
	w.mu.RLock()
	defer w.mu.RUnlock()
	n := 0
	for _, wr := range w.wirings {
		if wr.related != nil {
			b, _ := wr.related.size()
			n += b
		}
	}
	return n
}

// release drops every subscription (the wiring stops).
func (ix *relatedIndex) release() {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	for _, h := range ix.handles {
		h.Release()
	}
	if ix.ns != nil {
		ix.ns.Release()
	}
	ix.handles = map[schema.GroupVersionResource]*informers.Handle{}
	ix.ns = nil
}

func (ix *relatedIndex) namespaceLabels(ns string) (map[string]string, bool) {
	h := ix.ns
	if h == nil {
		return nil, false
	}
	obj, exists, err := h.Informer().GetStore().GetByKey(ns)
	if err != nil || !exists {
		return nil, false
	}
	u, ok := obj.(*unstructured.Unstructured)
	if !ok {
		return nil, false
	}
	return u.GetLabels(), true
}

// onRelated resyncs the parents whose rules select the changed object
// (before or after the change).
func (ix *relatedIndex) onRelated(gvr schema.GroupVersionResource, oldObj, obj any) {
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = d.Obj
	}
	cur, ok := obj.(*unstructured.Unstructured)
	if !ok {
		return
	}
	old, _ := oldObj.(*unstructured.Unstructured)
	if old != nil && old.GetResourceVersion() == cur.GetResourceVersion() {
		return
	}
	ix.mu.Lock()
	var parents []string
	buckets := ix.byBucket[gvr]
	for _, ns := range []string{cur.GetNamespace(), ""} {
		for uid, rules := range buckets[ns] {
			for _, r := range rules {
				if r.Matches(cur, ix.namespaceLabels) || (old != nil && r.Matches(old, ix.namespaceLabels)) {
					parents = append(parents, uid)
					break
				}
			}
		}
		if cur.GetNamespace() == "" {
			break
		}
	}
	ix.mu.Unlock()
	for _, uid := range parents {
		ix.enqueue(uid, gvr, cur.GetResourceVersion())
	}
}

// snapshot lists the objects a parent's rules select, grouped per
// resource in rule order (related.Groups). ok is false while an informer
// is still syncing.
func (ix *relatedIndex) snapshot(rules []related.Resolved) (groups []snapshot.Group, ok bool) {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	if ix.ns != nil && !ix.ns.HasSynced() {
		return nil, false
	}
	for _, r := range rules {
		if h := ix.handles[r.Res.GVR]; h == nil || !h.HasSynced() {
			return nil, false
		}
	}
	return related.Groups(rules, func(res *apiresource.Resource, namespace string) []*unstructured.Unstructured {
		if namespace != "" {
			return ix.handles[res.GVR].InNamespace(namespace)
		}
		return ix.handles[res.GVR].List()
	}, ix.namespaceLabels), true
}

// subscribeRelated listens to RelatedRules broadcasts from dispatchers.
func (w *Watcher) subscribeRelated() (*nats.Subscription, error) {
	return w.nc.Subscribe(bus.RelatedSubject, func(m *nats.Msg) {
		var rr bus.RelatedRules
		if err := json.Unmarshal(m.Data, &rr); err != nil {
			w.log.Warn("malformed related-rules broadcast", zap.Error(err))
			return
		}
		w.mu.RLock()
		wr := w.wirings[rr.Controller.ID()]
		w.mu.RUnlock()
		if wr == nil || wr.related == nil {
			return
		}
		if _, err := wr.related.register(&rr); err != nil {
			// A refusal means the dispatchers allow what this watcher
			// does not (or someone else published the rules): worth an
			// admin's look. The sync itself fails on the snapshot.
			if errors.As(err, new(*refusedError)) {
				w.log.Warn("related rules refused", zap.String("controller", rr.Controller.ID()), zap.String("parentUID", rr.ParentUID), zap.Error(err))
				return
			}
			w.log.Debug("register related rules", zap.Error(err))
		}
	})
}
