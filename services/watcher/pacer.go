package watcher

import (
	"sync"
	"time"
)

// Pacing of real-change work items per parent: the first change after a
// quiet spell is published at once; while the parent keeps changing, its
// publishes are spaced by a window that starts at paceMin and grows
// paceFactor-fold each time more than one event was merged into the item,
// or its change came inside the window, up to paceMax. Events of an item
// dropped as echo-only (our own writes) count for nothing. The last change
// of a burst is always published (it is merged into the pending item), so
// the hook always sees the final state.
//
// Why: MC_WORK already keeps at most one pending item per parent, but a fast
// sync drains it before the next change of a burst arrives, so 100
// back-to-back updates of one parent cost about 100 hook calls. Spacing
// bounds a burst of any length to about log_paceFactor(burst/paceMin) + 2
// syncs (4 for a 0.5 s burst) without delaying an isolated change.
const (
	paceMin    = 32 * time.Millisecond
	paceMax    = 500 * time.Millisecond
	paceFactor = 4
	// paceIdle is how long a parent's pacing state is kept after its last
	// publish; after it the parent counts as quiet anyway.
	paceIdle = 10 * time.Second
)

// pacer holds the pacing state of parents with recent changes. Safe for
// concurrent use.
type pacer struct {
	mu        sync.Mutex
	keys      map[string]*pace
	lastSweep time.Time
}

type pace struct {
	next   time.Time     // earliest time the next item may be published
	step   time.Duration // the window after the last publish
	events int           // events merged since the last publish
	// waited: an event came inside the window and had to wait, i.e. the
	// parent changed again right after a publish.
	waited bool
	last   time.Time // last publish
}

func newPacer() *pacer { return &pacer{keys: map[string]*pace{}} }

// event records a change of key at now and returns how long its item should
// wait before it is published (0: at once).
func (p *pacer) event(key string, now time.Time) time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	st := p.stateLocked(key)
	st.events++
	if !now.Before(st.next) {
		return 0
	}
	st.waited = true
	return st.next.Sub(now)
}

// published records that key's item went out at now, and sets the window
// before the next one: wider if the parent kept changing while the item
// waited, back to the minimum otherwise.
func (p *pacer) published(key string, now time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	st := p.stateLocked(key)
	if st.events > 1 || st.waited {
		st.step = min(max(st.step*paceFactor, paceMin), paceMax)
	} else {
		st.step = paceMin
	}
	st.events, st.waited = 0, false
	st.last = now
	st.next = now.Add(st.step)
	if now.Sub(p.lastSweep) > paceIdle {
		p.lastSweep = now
		for k, s := range p.keys {
			if now.Sub(s.last) > paceIdle && s.events == 0 {
				delete(p.keys, k)
			}
		}
	}
}

// dropped records that key's pending item was not published after all
// (every event behind it was an echo of the controller's own writes): its
// events were not a burst of changes, and must not widen the window of
// the next real change. Without this, a parent changed every few hundred
// milliseconds, each change echoed by our child and status writes, saw its
// window grow to paceMax and each change wait for it (BenchmarkIdleLatency:
// 340 ms per change instead of ~12).
func (p *pacer) dropped(key string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if st := p.keys[key]; st != nil {
		st.events, st.waited = 0, false
	}
}

func (p *pacer) stateLocked(key string) *pace {
	st := p.keys[key]
	if st == nil {
		st = &pace{}
		p.keys[key] = st
	}
	return st
}

// len is the number of parents with pacing state (for tests and metrics).
func (p *pacer) len() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.keys)
}
