package dispatcher

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/metabus/metabus/pkg/bus"
)

// A hook's resyncAfterSeconds request is the author's to make, for every
// parent at every answer: asked at 0.1 s over thousands of parents it once
// put thousands of items of one controller into MC_WORK, where they filled
// the partitions' MaxAckPending that every controller shares, and another
// controller's change waited behind them on the server. The watcher paces
// its own resyncs per controller by counting that controller's items in
// MC_WORK (--resync-backlog); the hook-asked ones are paced the same way,
// where they go in: the in-process timer of a short request and the
// schedule relay of a long one both ask the gate, and while the
// controller has its backlog of items in MC_WORK the request waits
// (re-armed, or scheduled again in MC_SCHED) instead of adding one. Only
// resyncs the hook asked for wait: a real change, a retry, the watcher's
// resync are never held by this.

// resyncGateWait is how long a held-back request waits before asking
// again; it is also how long a controller's count is trusted (between
// counts, the requests let in are counted here).
const resyncGateWait = time.Second

// resyncGate bounds, per controller, the items in MC_WORK when a
// hook-asked resync is about to go in. Safe for concurrent use.
type resyncGate struct {
	// limit is the backlog (--resync-after-backlog); ≤ 0: every request
	// goes in at once (as upstream).
	limit int
	// count reads how many items of a controller MC_WORK holds.
	count func(ctx context.Context, ctrlID string) (int, error)

	mu    sync.Mutex
	ctrls map[string]*gateCount
	// lastSweep: counts older than a minute are forgotten, so controllers
	// that stopped asking cost nothing.
	lastSweep time.Time
}

type gateCount struct {
	n  int       // items in MC_WORK: the last count plus the requests let in since
	at time.Time // when it was counted
}

func newResyncGate(limit int, count func(ctx context.Context, ctrlID string) (int, error)) *resyncGate {
	return &resyncGate{limit: limit, count: count, ctrls: map[string]*gateCount{}}
}

// admit reports how long a hook-asked resync of ctrlID must wait before it
// asks again (0: it goes into MC_WORK now, and is counted). A count older
// than resyncGateWait is read again first; a count that fails lets the
// request in (a resync is never lost to a failed look at the stream).
func (g *resyncGate) admit(ctx context.Context, ctrlID string, now time.Time) (time.Duration, error) {
	if g == nil || g.limit <= 0 {
		return 0, nil
	}
	g.mu.Lock()
	st := g.ctrls[ctrlID]
	stale := st == nil || now.Sub(st.at) >= resyncGateWait
	g.mu.Unlock()
	var err error
	if stale {
		// Counted outside the lock: a network call. Concurrent requests
		// of one controller may count twice; the later count wins.
		var n int
		if n, err = g.count(ctx, ctrlID); err != nil {
			err = fmt.Errorf("count %s's items in %s: %w", ctrlID, bus.WorkStream, err)
		}
		g.mu.Lock()
		if err == nil {
			g.ctrls[ctrlID] = &gateCount{n: n, at: now}
		}
		g.sweepLocked(now)
		g.mu.Unlock()
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	st = g.ctrls[ctrlID]
	if st == nil { // never counted: let it in
		return 0, err
	}
	if st.n >= g.limit {
		return resyncGateWait, err
	}
	st.n++
	return 0, err
}

func (g *resyncGate) sweepLocked(now time.Time) {
	if now.Sub(g.lastSweep) < time.Minute {
		return
	}
	g.lastSweep = now
	for id, st := range g.ctrls {
		if now.Sub(st.at) > time.Minute {
			delete(g.ctrls, id)
		}
	}
}

// streamCounter counts a controller's items in MC_WORK: the subjects (a
// parent, or one map key of it, each at most one pending item) that the
// stream holds under the controller's filter.
func streamCounter(js jetstream.JetStream) func(ctx context.Context, ctrlID string) (int, error) {
	var (
		mu     sync.Mutex
		stream jetstream.Stream
	)
	return func(ctx context.Context, ctrlID string) (int, error) {
		mu.Lock()
		s := stream
		mu.Unlock()
		if s == nil {
			var err error
			if s, err = js.Stream(ctx, bus.WorkStream); err != nil {
				return 0, err
			}
			mu.Lock()
			stream = s
			mu.Unlock()
		}
		info, err := s.Info(ctx, jetstream.WithSubjectFilter(bus.StoredWorkFilter(ctrlID)))
		if err != nil {
			return 0, err
		}
		return len(info.State.Subjects), nil
	}
}
