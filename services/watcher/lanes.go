package watcher

import (
	"container/list"
	"strings"
	"sync"
)

// resyncLanes is the queue of the resync pacer: the keys of pending resync
// items, each at most once, per controller, in two lanes.
//
// The prompt lane holds the keys a real change fanned out to (a keyed
// kind's parent changed: every map key of it must be synced again, and
// those items are resyncs only so that the dispatcher never takes them for
// echoes). The waves lane holds everything else: cache flushes, resync
// periods, a new leader's resync, a wiring's initial list.
//
// Both lanes are fed to MC_WORK only while the controller's own resyncs in
// MC_WORK are few (the pacer), so a parent with 5,000 keys whose spec
// changed never puts 5,000 items in front of every other controller's real
// changes, and one controller's backlog (a hook that hangs) never holds
// another controller's resyncs back. Controllers take turns; within one,
// the prompt lane goes first, so the fan-out does not wait behind a resync
// wave; within the prompt lane, parents take turns one key at a time, so a
// small parent's spec change does not wait behind a big one's. Within a
// parent, and in the waves lane, keys go first in, first out.
type resyncLanes struct {
	mu     sync.Mutex
	closed bool
	// notify has a value when keys were added (or the lanes shut down)
	// since the pacer last looked.
	notify chan struct{}
	// queued says where each waiting key is.
	queued map[string]*laneSlot
	// ctrls holds the lanes of each controller with waiting keys; ring,
	// them in turn order.
	ctrls map[string]*ctrlLanes
	ring  *list.List
}

// ctrlLanes are one controller's lanes.
type ctrlLanes struct {
	ctrl string
	elem *list.Element // in the ring
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
	c      *ctrlLanes
}

func newResyncLanes() *resyncLanes {
	return &resyncLanes{notify: make(chan struct{}, 1), queued: map[string]*laneSlot{}, ctrls: map[string]*ctrlLanes{}, ring: list.New()}
}

// controllerOf is the controller of a key or parent key ("<ctrlID>/...").
func controllerOf(key string) string {
	c, _, _ := strings.Cut(key, "/")
	return c
}

func (q *resyncLanes) poke() {
	select {
	case q.notify <- struct{}{}:
	default:
	}
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
		s.c.waves.Remove(s.elem)
		delete(q.queued, key)
	}
	ctrl := controllerOf(key)
	c := q.ctrls[ctrl]
	if c == nil {
		c = &ctrlLanes{ctrl: ctrl, prompt: list.New(), parents: map[string]*list.Element{}, waves: list.New()}
		c.elem = q.ring.PushBack(c)
		q.ctrls[ctrl] = c
	}
	if !prompt {
		q.queued[key] = &laneSlot{elem: c.waves.PushBack(key), c: c}
	} else {
		pe, ok := c.parents[parent]
		if !ok {
			pe = c.prompt.PushBack(&promptParent{parent: parent, keys: list.New()})
			c.parents[parent] = pe
		}
		pp := pe.Value.(*promptParent)
		q.queued[key] = &laneSlot{elem: pp.keys.PushBack(key), parent: pp, c: c}
	}
	q.poke()
}

// take returns the next key of the first controller, in turn order, that
// ready accepts (nil: any): its next parent's first key in the prompt
// lane, or else the first key of its waves lane. That controller's turn is
// then over. ok is false when no controller with waiting keys is ready.
func (q *resyncLanes) take(ready func(ctrl string) bool) (key string, ok bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	for e := q.ring.Front(); e != nil; e = e.Next() {
		c := e.Value.(*ctrlLanes)
		if ready != nil && !ready(c.ctrl) {
			continue
		}
		if pe := c.prompt.Front(); pe != nil {
			pp := pe.Value.(*promptParent)
			key = pp.keys.Remove(pp.keys.Front()).(string)
			if pp.keys.Len() == 0 {
				c.prompt.Remove(pe)
				delete(c.parents, pp.parent)
			} else {
				// The parent's turn is over: the others go first.
				c.prompt.MoveToBack(pe)
			}
		} else {
			key = c.waves.Remove(c.waves.Front()).(string)
		}
		delete(q.queued, key)
		if c.prompt.Len() == 0 && c.waves.Len() == 0 {
			q.ring.Remove(c.elem)
			delete(q.ctrls, c.ctrl)
		} else {
			q.ring.MoveToBack(c.elem)
		}
		return key, true
	}
	return "", false
}

// get waits for a key of any controller. shutdown is true once the queue
// is shut down.
func (q *resyncLanes) get() (key string, shutdown bool) {
	for {
		if key, ok := q.take(nil); ok {
			return key, false
		}
		if q.isClosed() {
			return "", true
		}
		<-q.notify
	}
}

// waiting returns the controllers with waiting keys.
func (q *resyncLanes) waiting() []string {
	q.mu.Lock()
	defer q.mu.Unlock()
	out := make([]string, 0, len(q.ctrls))
	for e := q.ring.Front(); e != nil; e = e.Next() {
		out = append(out, e.Value.(*ctrlLanes).ctrl)
	}
	return out
}

func (q *resyncLanes) isClosed() bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.closed
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
	if q.closed {
		return
	}
	q.closed = true
	q.queued = map[string]*laneSlot{}
	q.ctrls = map[string]*ctrlLanes{}
	q.ring.Init()
	close(q.notify)
}
