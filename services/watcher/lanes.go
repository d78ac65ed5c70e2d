package watcher

import (
	"container/list"
	"sync"
)

// resyncLanes is the queue of the resync pacer: the keys of pending resync
// items, each at most once, in two lanes.
//
// The prompt lane holds the keys a real change fanned out to (a keyed
// kind's parent changed: every map key of it must be synced again, and
// those items are resyncs only so that the dispatcher never takes them for
// echoes). The waves lane holds everything else: cache flushes, resync
// periods, a new leader's resync, a wiring's initial list.
//
// Both lanes are fed to MC_WORK only while its backlog is low (the pacer),
// so a parent with 5,000 keys whose spec changed never puts 5,000 items in
// front of every other controller's real changes. The prompt lane goes
// first, so the fan-out does not wait behind a resync wave of the whole
// cluster; within it, parents take turns one key at a time, so a small
// parent's spec change does not wait behind a big one's. Within a parent,
// and in the waves lane, keys go first in, first out.
type resyncLanes struct {
	mu     sync.Mutex
	cond   *sync.Cond
	closed bool
	// queued says where each waiting key is.
	queued map[string]*laneSlot
	// prompt holds *promptParent, in turn order; parents maps a parent's
	// ParentKey to its element there.
	prompt  *list.List
	parents map[string]*list.Element
	// waves holds keys (string).
	waves *list.List
}

// promptParent is one parent's keys in the prompt lane.
type promptParent struct {
	parent string
	keys   *list.List
}

// laneSlot is where a waiting key is: its element in waves, or in the keys
// of a parent of the prompt lane.
type laneSlot struct {
	elem   *list.Element
	parent *promptParent // nil: in waves
}

func newResyncLanes() *resyncLanes {
	q := &resyncLanes{queued: map[string]*laneSlot{}, prompt: list.New(), parents: map[string]*list.Element{}, waves: list.New()}
	q.cond = sync.NewCond(&q.mu)
	return q
}

// add queues key; prompt puts it in the prompt lane under parent (its
// ParentKey). A key already waiting keeps its place, except that a key
// waiting in the waves lane moves to the prompt lane when a real change
// fans out to it.
func (q *resyncLanes) add(key, parent string, prompt bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed {
		return
	}
	if s, ok := q.queued[key]; ok {
		if !prompt || s.parent != nil {
			return
		}
		q.waves.Remove(s.elem)
		delete(q.queued, key)
	}
	if !prompt {
		q.queued[key] = &laneSlot{elem: q.waves.PushBack(key)}
	} else {
		pe, ok := q.parents[parent]
		if !ok {
			pe = q.prompt.PushBack(&promptParent{parent: parent, keys: list.New()})
			q.parents[parent] = pe
		}
		pp := pe.Value.(*promptParent)
		q.queued[key] = &laneSlot{elem: pp.keys.PushBack(key), parent: pp}
	}
	q.cond.Signal()
}

// get waits for a key: the next parent's first key in the prompt lane, or
// else the first key of the waves lane. shutdown is true once the queue
// is shut down.
func (q *resyncLanes) get() (key string, shutdown bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	for !q.closed && len(q.queued) == 0 {
		q.cond.Wait()
	}
	if q.closed {
		return "", true
	}
	if pe := q.prompt.Front(); pe != nil {
		pp := pe.Value.(*promptParent)
		key = pp.keys.Remove(pp.keys.Front()).(string)
		if pp.keys.Len() == 0 {
			q.prompt.Remove(pe)
			delete(q.parents, pp.parent)
		} else {
			// The parent's turn is over: the others go first.
			q.prompt.MoveToBack(pe)
		}
	} else {
		key = q.waves.Remove(q.waves.Front()).(string)
	}
	delete(q.queued, key)
	return key, false
}

// len is the number of waiting keys.
func (q *resyncLanes) len() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.queued)
}

// shutDown wakes every get, which then reports shutdown.
func (q *resyncLanes) shutDown() {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.closed = true
	q.cond.Broadcast()
}
