package watcher

import (
	"errors"
	"reflect"
	"slices"
	"sort"
	"sync"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"

	"github.com/metabus/metabus/pkg/apiresource"
	"github.com/metabus/metabus/pkg/bus"
	"github.com/metabus/metabus/pkg/kinds"
	"github.com/metabus/metabus/pkg/snapshot"
)

// The watcher side of keyed kinds (kinds.KeyedPlan): a plan whose unit of
// work is (parent, map key). Its wiring also watches the plan's input
// resources, keeps indexes by map key of the inputs and of the parents'
// outputs, and turns events into work items per key (and per parent where
// the whole parent is concerned: the summary) as the KeyedPlan doc says.
// Everything goes through plan.Keyed.Rules; nothing here knows a kind.

// change is what an informer event did to an object.
type change int

const (
	// listed: in the cache when the wiring subscribed (an informer's
	// initial list, or the replay of a shared informer's cache): a resync,
	// as for parents, not news.
	listed change = iota
	// added: created since.
	added
	// updated: a new resourceVersion.
	updated
	// deleted: gone (the event's object is its last known state).
	deleted
)

// reason is the work item reason of an event of this kind of change.
func (c change) reason() string {
	if c == listed {
		return bus.ReasonResync
	}
	return bus.ReasonEvent
}

// keyedState is what a wiring of a keyed plan keeps besides its informers.
// Its indexes are fed by the wiring's input and owned handlers, so a
// snapshot may read them only once those handlers have had the initial
// state (informers.Handle.HandlersSynced).
type keyedState struct {
	mu sync.RWMutex
	// inputs: map key → the input object with that key.
	inputs map[string]keyedInput
	// outputs: owner (parent) UID → map key → the outputs tagged with the
	// key, per plan.Owned entry, by UID. A key's snapshot reads its
	// outputs in one lookup rather than filtering every output of a
	// parent that may have thousands.
	outputs map[types.UID]map[string][]map[types.UID]*unstructured.Unstructured
	// placed: per plan.Owned entry, output UID → where it is in outputs,
	// so an update or a delete finds the entry whatever its old object
	// says (a delete may come with a stale final state).
	placed []map[types.UID]outputPlace

	// selectors caches each parent's input selector for the parent's
	// resourceVersion: an input event asks every candidate parent, and
	// building a selector decodes the parent's spec.
	selMu     sync.Mutex
	selectors map[types.UID]cachedSelector
}

// keyedInput is one indexed input object.
type keyedInput struct {
	res int // index in KeyedPlan.Inputs
	obj *unstructured.Unstructured
}

// outputPlace is where an output is indexed.
type outputPlace struct {
	owner types.UID
	key   string
}

// cachedSelector is a parent's input selector, or the error that makes it
// unusable, as of the parent's resourceVersion rv.
type cachedSelector struct {
	rv  string
	sel kinds.InputSelector
	err error
}

func newKeyedState(owned int) *keyedState {
	s := &keyedState{
		inputs:    map[string]keyedInput{},
		outputs:   map[types.UID]map[string][]map[types.UID]*unstructured.Unstructured{},
		placed:    make([]map[types.UID]outputPlace, owned),
		selectors: map[types.UID]cachedSelector{},
	}
	for i := range s.placed {
		s.placed[i] = map[types.UID]outputPlace{}
	}
	return s
}

// setInput records an input event in the index: old (with its key, if
// hadKey) is replaced by cur (with its key, if hasKey); cur nil removes.
func (s *keyedState) setInput(res int, old *unstructured.Unstructured, oldKey string, hadKey bool, cur *unstructured.Unstructured, curKey string, hasKey bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if hadKey && (cur == nil || !hasKey || oldKey != curKey) {
		// Only the object it was: keys are unique per object, but an
		// index entry must never be dropped by a stale event of another.
		if in, ok := s.inputs[oldKey]; ok && in.obj.GetUID() == old.GetUID() {
			delete(s.inputs, oldKey)
		}
	}
	if cur != nil && hasKey {
		s.inputs[curKey] = keyedInput{res: res, obj: cur}
	}
}

// input returns the input object of a map key.
func (s *keyedState) input(key string) (keyedInput, bool) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	in, ok := s.inputs[key]
	return in, ok
}

// putOutput indexes obj, an object of plan.Owned[res], under its owner and
// key (ok false: it has none, and is only removed from where it was).
func (s *keyedState) putOutput(res int, obj *unstructured.Unstructured, at outputPlace, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.removeOutputLocked(res, obj.GetUID())
	if !ok {
		return
	}
	byKey := s.outputs[at.owner]
	if byKey == nil {
		byKey = map[string][]map[types.UID]*unstructured.Unstructured{}
		s.outputs[at.owner] = byKey
	}
	groups := byKey[at.key]
	if groups == nil {
		groups = make([]map[types.UID]*unstructured.Unstructured, len(s.placed))
		byKey[at.key] = groups
	}
	if groups[res] == nil {
		groups[res] = map[types.UID]*unstructured.Unstructured{}
	}
	groups[res][obj.GetUID()] = obj
	s.placed[res][obj.GetUID()] = at
}

// removeOutput drops an output of plan.Owned[res] from the index.
func (s *keyedState) removeOutput(res int, uid types.UID) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.removeOutputLocked(res, uid)
}

func (s *keyedState) removeOutputLocked(res int, uid types.UID) {
	at, ok := s.placed[res][uid]
	if !ok {
		return
	}
	delete(s.placed[res], uid)
	byKey := s.outputs[at.owner]
	groups := byKey[at.key]
	if groups == nil || groups[res] == nil {
		return
	}
	delete(groups[res], uid)
	if len(groups[res]) > 0 {
		return
	}
	groups[res] = nil
	for _, g := range groups {
		if g != nil {
			return
		}
	}
	delete(byKey, at.key)
	if len(byKey) == 0 {
		delete(s.outputs, at.owner)
	}
}

// outputKeys lists the keys the outputs of a parent are tagged with.
func (s *keyedState) outputKeys(owner types.UID) []string {
	s.mu.RLock()
	defer s.mu.RUnlock()
	keys := make([]string, 0, len(s.outputs[owner]))
	for k := range s.outputs[owner] {
		keys = append(keys, k)
	}
	return keys
}

// outputsOf lists the outputs of a parent tagged with key, per plan.Owned
// entry, sorted by namespace and name (snapshots are stable).
func (s *keyedState) outputsOf(owner types.UID, key string) [][]*unstructured.Unstructured {
	s.mu.RLock()
	defer s.mu.RUnlock()
	out := make([][]*unstructured.Unstructured, len(s.placed))
	for i, g := range s.outputs[owner][key] {
		objs := make([]*unstructured.Unstructured, 0, len(g))
		for _, o := range g {
			objs = append(objs, o)
		}
		sortObjects(objs)
		out[i] = objs
	}
	return out
}

// dropSelector forgets a deleted parent's cached selector.
func (s *keyedState) dropSelector(uid types.UID) {
	s.selMu.Lock()
	defer s.selMu.Unlock()
	delete(s.selectors, uid)
}

// sortObjects orders objects by namespace, then name.
func sortObjects(objs []*unstructured.Unstructured) {
	sort.Slice(objs, func(i, j int) bool {
		if a, b := objs[i].GetNamespace(), objs[j].GetNamespace(); a != b {
			return a < b
		}
		return objs[i].GetName() < objs[j].GetName()
	})
}

// inputSelector is the parent's input selector (cached per parent
// resourceVersion; selectors are immutable and shared).
func (wr *wiring) inputSelector(parent *unstructured.Unstructured) (kinds.InputSelector, error) {
	s := wr.keyed
	uid, rv := parent.GetUID(), parent.GetResourceVersion()
	s.selMu.Lock()
	c, ok := s.selectors[uid]
	s.selMu.Unlock()
	if ok && c.rv == rv {
		return c.sel, c.err
	}
	sel, err := wr.plan.Keyed.Rules.InputSelector(parent)
	if err == nil && sel == nil {
		// A kind's bug, not the parent's: still, select nothing rather
		// than crash the watcher.
		err = errNoInputSelector
	}
	s.selMu.Lock()
	s.selectors[uid] = cachedSelector{rv: rv, sel: sel, err: err}
	s.selMu.Unlock()
	return sel, err
}

// errNoInputSelector: a kind's InputSelector returned neither a selector
// nor an error.
var errNoInputSelector = errors.New("the controller's kind gave the parent no input selector")

// selectedInputs lists the objects of plan.Keyed.Inputs[i] that sel
// selects, from the informer's namespace index when it names a namespace.
func (wr *wiring) selectedInputs(i int, sel kinds.InputSelector) []*unstructured.Unstructured {
	h := wr.inputs[i]
	var candidates []*unstructured.Unstructured
	if ns := sel.Namespace(); ns != "" {
		candidates = h.InNamespace(ns)
	} else {
		candidates = h.List()
	}
	out := make([]*unstructured.Unstructured, 0, len(candidates))
	for _, o := range candidates {
		if kinds.SelectsInput(sel, o) {
			out = append(out, o)
		}
	}
	return out
}

// startKeyed adds the handlers of the plan's input resources (acquired
// by start, in wr.inputs).
func (wr *wiring) startKeyed() error {
	for i, h := range wr.inputs {
		if err := h.AddHandler(cache.ResourceEventHandlerDetailedFuncs{
			AddFunc: func(obj any, initial bool) {
				if cur, ok := obj.(*unstructured.Unstructured); ok {
					wr.onInput(i, nil, cur, addChange(initial))
				}
			},
			UpdateFunc: func(oldObj, obj any) {
				old, ok1 := oldObj.(*unstructured.Unstructured)
				cur, ok2 := obj.(*unstructured.Unstructured)
				if ok1 && ok2 && old.GetResourceVersion() != cur.GetResourceVersion() {
					// Same resourceVersion: an informer resync; the bus
					// has its own.
					wr.onInput(i, old, cur, updated)
				}
			},
			DeleteFunc: func(obj any) {
				if last, ok := deletedObject(obj); ok {
					wr.onInput(i, last, nil, deleted)
				}
			},
		}); err != nil {
			return err
		}
	}
	return nil
}

// keyedOwnedHandler is the handler of plan.Owned[i] for a keyed plan.
func (wr *wiring) keyedOwnedHandler(i int) cache.ResourceEventHandler {
	return cache.ResourceEventHandlerDetailedFuncs{
		AddFunc: func(obj any, initial bool) {
			if cur, ok := obj.(*unstructured.Unstructured); ok {
				wr.onOutput(i, nil, cur, addChange(initial))
			}
		},
		UpdateFunc: func(oldObj, obj any) {
			old, ok1 := oldObj.(*unstructured.Unstructured)
			cur, ok2 := obj.(*unstructured.Unstructured)
			if ok1 && ok2 && old.GetResourceVersion() != cur.GetResourceVersion() {
				wr.onOutput(i, old, cur, updated)
			}
		},
		DeleteFunc: func(obj any) {
			if last, ok := deletedObject(obj); ok {
				wr.onOutput(i, nil, last, deleted)
			}
		},
	}
}

func addChange(initial bool) change {
	if initial {
		return listed
	}
	return added
}

// deletedObject is the last known state of a deleted object.
func deletedObject(obj any) (*unstructured.Unstructured, bool) {
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = d.Obj
	}
	u, ok := obj.(*unstructured.Unstructured)
	return u, ok
}

// onInput handles an event of an object of plan.Keyed.Inputs[i]: old is
// its previous state (nil for an add), cur its new one (nil for a delete,
// old being its last known state). Every parent whose selector selected
// the input before or selects it now gets an item for the input's key,
// and its per-parent item when the selection changed (the summary counts
// the inputs).
func (wr *wiring) onInput(i int, old, cur *unstructured.Unstructured, ch change) {
	res := wr.plan.Keyed.Inputs[i]
	rules := wr.plan.Keyed.Rules
	var (
		oldKey, curKey string
		hadKey, hasKey bool
	)
	if old != nil {
		oldKey, hadKey = rules.InputKey(res, old)
	}
	if cur != nil {
		curKey, hasKey = rules.InputKey(res, cur)
	}
	wr.keyed.setInput(i, old, oldKey, hadKey, cur, curKey, hasKey)
	if !wr.w.leader.Load() {
		return // nothing is published; the index is all a follower keeps
	}
	obj := cur
	if obj == nil {
		obj = old
	}
	reason, rv := ch.reason(), obj.GetResourceVersion()
	for pi, h := range wr.parents {
		pres := wr.plan.Parents[pi].Res
		var candidates []*unstructured.Unstructured
		if pres.Namespaced {
			candidates = h.InNamespace(obj.GetNamespace())
		} else {
			candidates = h.List()
		}
		for _, p := range candidates {
			if !wr.selects(p) {
				continue
			}
			sel, err := wr.inputSelector(p)
			if err != nil {
				continue // it selects nothing until its selector is fixed
			}
			was, now := kinds.SelectsInput(sel, old), kinds.SelectsInput(sel, cur)
			if was && hadKey {
				wr.enqueueKeyed(pres, p, oldKey, reason, res.GVR, rv, nil, false)
			}
			if now && hasKey && !(was && hadKey && oldKey == curKey) {
				wr.enqueueKeyed(pres, p, curKey, reason, res.GVR, rv, nil, false)
			}
			if was != now {
				wr.enqueueKeyed(pres, p, "", reason, res.GVR, rv, nil, false)
			}
		}
	}
}

// onOutput handles an event of an object of plan.Owned[i] (old: its
// previous state on an update; cur: its state, or its last known one when
// deleted). Its owner's item for its key hears of it, as an update (a
// possible echo of the controller's own write) when owner and key stayed;
// when either changed, the old and the new (owner, key) both do. The
// owner's per-parent item hears of what its summary could count.
func (wr *wiring) onOutput(i int, old, cur *unstructured.Unstructured, ch change) {
	gvr := wr.plan.Owned[i].GVR
	rules, keyed := wr.plan.Rules, wr.plan.Keyed.Rules
	ref := rules.OwnerRef(cur)
	key, hasKey := keyed.OutputKey(cur)
	if ch == deleted {
		wr.keyed.removeOutput(i, cur.GetUID())
	} else {
		owner, owned := wr.ownerUID(ref)
		wr.keyed.putOutput(i, cur, outputPlace{owner: owner, key: key}, owned && hasKey)
	}
	if !wr.w.leader.Load() {
		return
	}
	rv := cur.GetResourceVersion()
	if ch == updated {
		oref := rules.OwnerRef(old)
		oldKey, hadKey := keyed.OutputKey(old)
		if sameOwner(oref, ref, wr.plan.Adopts) && hadKey == hasKey && oldKey == key {
			if hasKey {
				wr.enqueueOutputOwner(gvr, ref, key, bus.ReasonEvent, rv, cur)
			}
			// An adoption keeps the "owner" for echoes (it may be the
			// controller's own), but the summary counts it.
			if refUID(oref) != refUID(ref) || summaryFieldsChanged(old, cur) {
				wr.enqueueOutputOwner(gvr, ref, "", bus.ReasonEvent, rv, nil)
			}
		} else {
			// Released, re-owned or re-keyed: both sides hear of it as
			// news (the same (owner, key) is merged into one item).
			if hadKey {
				wr.enqueueOutputOwner(gvr, oref, oldKey, bus.ReasonEvent, rv, nil)
			}
			wr.enqueueOutputOwner(gvr, oref, "", bus.ReasonEvent, rv, nil)
			if hasKey {
				wr.enqueueOutputOwner(gvr, ref, key, bus.ReasonEvent, rv, nil)
			}
			wr.enqueueOutputOwner(gvr, ref, "", bus.ReasonEvent, rv, nil)
		}
	} else {
		if hasKey {
			wr.enqueueOutputOwner(gvr, ref, key, ch.reason(), rv, nil)
		}
		wr.enqueueOutputOwner(gvr, ref, "", ch.reason(), rv, nil)
	}
	if ref == nil {
		wr.offerOrphan(gvr, cur, rv)
	}
}

// refUID is the UID ref names ("" for none).
func refUID(ref *metav1.OwnerReference) types.UID {
	if ref == nil {
		return ""
	}
	return ref.UID
}

// summaryFieldsChanged reports an update of an output that a per-parent
// summary could count, besides the output's existence, owner and key:
// its deletionTimestamp and its status conditions. Other updates reach
// the key's item only: a parent with 5,000 outputs whose status churns
// must not recompute its summary for each of them.
func summaryFieldsChanged(old, cur *unstructured.Unstructured) bool {
	if !reflect.DeepEqual(old.GetDeletionTimestamp(), cur.GetDeletionTimestamp()) {
		return true
	}
	oc, _, _ := unstructured.NestedFieldNoCopy(old.Object, "status", "conditions")
	cc, _, _ := unstructured.NestedFieldNoCopy(cur.Object, "status", "conditions")
	return !reflect.DeepEqual(oc, cc)
}

// ownerUID is the UID of the parent ref names when it names an object of
// one of the plan's parent resources (whether cached or not: the index
// must hold outputs that arrive before their parent).
func (wr *wiring) ownerUID(ref *metav1.OwnerReference) (types.UID, bool) {
	if ref == nil {
		return "", false
	}
	gv, err := schema.ParseGroupVersion(ref.APIVersion)
	if err != nil {
		return "", false
	}
	for _, p := range wr.plan.Parents {
		if p.Res.Kind == ref.Kind && p.Res.GVR.Group == gv.Group {
			return ref.UID, true
		}
	}
	return "", false
}

// enqueueOutputOwner enqueues the item for mapKey ("": the per-parent
// item) of the parent ref names, if it is a cached parent the controller
// handles; update is the output if the event is an update that may be the
// controller's own write.
func (wr *wiring) enqueueOutputOwner(gvr schema.GroupVersionResource, ref *metav1.OwnerReference, mapKey, reason, rv string, update *unstructured.Unstructured) {
	if res, parent := wr.ownerOf(ref); parent != nil {
		wr.enqueueKeyed(res, parent, mapKey, reason, gvr, rv, update, false)
	}
}

// enqueueKeyed records a reason to sync mapKey of parent ("": the parent
// as a whole). update, if set, is the object of an update event (reason
// is then bus.ReasonEvent and rv its resourceVersion); prompt marks a
// resync that carries a real change.
func (wr *wiring) enqueueKeyed(res *apiresource.Resource, parent *unstructured.Unstructured, mapKey, reason string, gvr schema.GroupVersionResource, rv string, update *unstructured.Unstructured, prompt bool) {
	wr.w.enqueueEntry(entry{ref: wr.ref, parentRes: res, parent: parent, mapKey: mapKey, reason: reason,
		gvr: gvr, rv: rv, update: update, prompt: prompt})
}

// fanOut enqueues one resync item per map key of parent: the keys of the
// inputs it selects and the keys its outputs are tagged with. They are
// resyncs so that the dispatcher never takes them for echoes (a keyed
// sync leaves the parent out of what it compares, so a parent's change
// reaches its keys only through these); prompt (a real change of the
// parent) puts them ahead of resync waves. rv is the parent's
// resourceVersion the keys' snapshots must reflect ("" for none).
func (wr *wiring) fanOut(res *apiresource.Resource, parent *unstructured.Unstructured, rv string, prompt bool) {
	if wr.keyed == nil || !wr.w.leader.Load() {
		return
	}
	for _, key := range wr.parentKeys(parent) {
		wr.enqueueKeyed(res, parent, key, bus.ReasonResync, res.GVR, rv, nil, prompt)
	}
}

// parentKeys lists the map keys of parent, sorted: the keys of the inputs
// it selects (none while its selector is unusable) and of its outputs.
func (wr *wiring) parentKeys(parent *unstructured.Unstructured) []string {
	keys := wr.keyed.outputKeys(parent.GetUID())
	if sel, err := wr.inputSelector(parent); err == nil {
		for i, res := range wr.plan.Keyed.Inputs {
			for _, in := range wr.selectedInputs(i, sel) {
				if k, ok := wr.plan.Keyed.Rules.InputKey(res, in); ok {
					keys = append(keys, k)
				}
			}
		}
	}
	slices.Sort(keys)
	return slices.Compact(keys)
}

// keyedSnapshot fills resp, the snapshot of parent (of parentRes) for a
// keyed plan. For a map key: the key's input if the parent selects it
// (else none: the key is detached) and the parent's outputs tagged with
// the key, one group per plan.Owned entry. For the parent as a whole (key
// ""): the kind's summary of the inputs it selects and the outputs it
// controls, and no children at all. view leaves out what the controller's
// identity may not read; inputWithheld reports a key whose input it may
// not read, which must not be synced.
func (wr *wiring) keyedSnapshot(resp *snapshot.Response, mapKey string, parentRes *apiresource.Resource, parent *unstructured.Unstructured, view *readView) (inputWithheld bool) {
	resp.MapKey = mapKey
	sel, err := wr.inputSelector(parent)
	if err != nil {
		resp.SelectorError = err.Error()
		sel = nil
	}
	if mapKey == "" {
		inputs := make([]snapshot.Group, len(wr.plan.Keyed.Inputs))
		for i, res := range wr.plan.Keyed.Inputs {
			inputs[i] = snapshot.GroupOf(res)
			if sel != nil {
				// Counted, never sent: no need to sort them.
				inputs[i].Objects = view.objects(res.GVR.Group, res.GVR.Resource, wr.selectedInputs(i, sel))
			}
		}
		outputs, selectorError := wr.plan.Rules.Observe(parentRes, parent, wr.caches)
		if resp.SelectorError == "" {
			resp.SelectorError = selectorError
		}
		// The summary counts only what the identity may read.
		view.groups(outputs)
		resp.Summary = wr.plan.Keyed.Rules.Summarize(parent, inputs, outputs)
		return false
	}
	if in, ok := wr.keyed.input(mapKey); ok && sel != nil && kinds.SelectsInput(sel, in.obj) {
		res := wr.plan.Keyed.Inputs[in.res]
		if !view.may(res.GVR.Group, res.GVR.Resource, in.obj.GetNamespace()) {
			// Not a detached key (whose outputs a tombstone removes): a
			// key the identity may not see is not synced at all.
			return view.unknown == nil
		}
		resp.Input = in.obj
	}
	outputs := wr.keyed.outputsOf(parent.GetUID(), mapKey)
	resp.Children = make([]snapshot.Group, len(wr.plan.Owned))
	for i, res := range wr.plan.Owned {
		resp.Children[i] = snapshot.GroupOf(res)
		if len(outputs[i]) > 0 {
			resp.Children[i].Objects = outputs[i]
		}
	}
	view.groups(resp.Children)
	return false
}
