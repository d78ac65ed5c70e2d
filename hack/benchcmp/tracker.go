package main

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/tools/cache"
)

var (
	benchGVR     = schema.GroupVersionResource{Group: "bench.metabus.dev", Version: "v1", Resource: "benches"}
	configMapGVR = schema.GroupVersionResource{Version: "v1", Resource: "configmaps"}
	ccGVR        = schema.GroupVersionResource{Group: "metacontroller.k8s.io", Version: "v1alpha1", Resource: "compositecontrollers"}
)

// parentState is what the harness has seen of one parent through its
// watches, and the gen it last wrote.
type parentState struct {
	target      int64 // gen the harness last wrote (0: not yet)
	stSeen      bool
	stGen       int64 // status.observedGen
	stCount     int64 // status.childCount
	cmSeen      bool
	cmGen       int64     // data.gen of the parent's ConfigMap
	stAt, cmAt  time.Time // when stGen / cmGen last changed
	converged   bool
	convergedAt time.Time
}

func (p *parentState) isConverged() bool {
	return p.target > 0 && p.stSeen && p.stCount == 1 && p.stGen == p.target && p.cmSeen && p.cmGen == p.target
}

// tracker follows parents and their ConfigMaps through informers (watches,
// never polling) and tells when parents have converged.
type tracker struct {
	events atomic.Int64 // informer events seen, for quiet detection

	mu      sync.Mutex
	parents map[string]*parentState
	changed chan struct{} // closed and replaced whenever a parent converges
	cmMoved chan struct{} // closed and replaced whenever a ConfigMap's gen changes
	onAdd   func(*unstructured.Unstructured)

	stop chan struct{}
}

// startTracker starts the informers on benches and configmaps in ns and
// waits for their caches. onAdd, if set, is called for every parent added
// (the raw contender's trigger); it may block.
func startTracker(ctx context.Context, dyn dynamic.Interface, ns string, onAdd func(*unstructured.Unstructured)) (*tracker, error) {
	t := &tracker{parents: map[string]*parentState{}, changed: make(chan struct{}), cmMoved: make(chan struct{}), onAdd: onAdd, stop: make(chan struct{})}
	f := dynamicinformer.NewFilteredDynamicSharedInformerFactory(dyn, 0, ns, nil)
	pi := f.ForResource(benchGVR).Informer()
	ci := f.ForResource(configMapGVR).Informer()
	if _, err := pi.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: func(o any) {
			t.parentEvent(o)
			if u, ok := o.(*unstructured.Unstructured); ok && t.onAdd != nil {
				t.onAdd(u)
			}
		},
		UpdateFunc: func(_, o any) { t.parentEvent(o) },
	}); err != nil {
		return nil, err
	}
	if _, err := ci.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    t.configMapEvent,
		UpdateFunc: func(_, o any) { t.configMapEvent(o) },
	}); err != nil {
		return nil, err
	}
	f.Start(t.stop)
	sctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	for gvr, ok := range f.WaitForCacheSync(sctx.Done()) {
		if !ok {
			close(t.stop)
			return nil, fmt.Errorf("informer on %s did not sync", gvr.Resource)
		}
	}
	return t, nil
}

func (t *tracker) close() { close(t.stop) }

// state returns the parent's record, creating it; t.mu must be held.
func (t *tracker) state(name string) *parentState {
	p := t.parents[name]
	if p == nil {
		p = &parentState{}
		t.parents[name] = p
	}
	return p
}

// update re-evaluates convergence after a change; t.mu must be held.
func (t *tracker) update(p *parentState, now time.Time) {
	c := p.isConverged()
	if c == p.converged {
		return
	}
	p.converged = c
	if c {
		p.convergedAt = now
		close(t.changed)
		t.changed = make(chan struct{})
	}
}

func (t *tracker) parentEvent(o any) {
	u, ok := o.(*unstructured.Unstructured)
	if !ok {
		return
	}
	now := time.Now()
	t.events.Add(1)
	st, hasStatus, _ := unstructured.NestedMap(u.Object, "status")
	t.mu.Lock()
	defer t.mu.Unlock()
	p := t.state(u.GetName())
	if hasStatus {
		gen, count := toInt(st["observedGen"]), toInt(st["childCount"])
		if !p.stSeen || gen != p.stGen {
			p.stAt = now
		}
		p.stSeen, p.stGen, p.stCount = true, gen, count
	}
	t.update(p, now)
}

func (t *tracker) configMapEvent(o any) {
	u, ok := o.(*unstructured.Unstructured)
	if !ok {
		return
	}
	now := time.Now()
	t.events.Add(1)
	s, _, _ := unstructured.NestedString(u.Object, "data", "gen")
	gen, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	p := t.state(u.GetName())
	if !p.cmSeen || gen != p.cmGen {
		p.cmAt = now
		close(t.cmMoved)
		t.cmMoved = make(chan struct{})
	}
	p.cmSeen, p.cmGen = true, gen
	t.update(p, now)
}

// toInt reads a JSON number from an unstructured object (int64 or float64).
func toInt(v any) int64 {
	switch n := v.(type) {
	case int64:
		return n
	case float64:
		return int64(n)
	case int:
		return int64(n)
	}
	return -1
}

// setTarget records the gen the harness is about to write; call it before
// sending the write, so no watch event can race it.
func (t *tracker) setTarget(name string, gen int64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	p := t.state(name)
	p.target = gen
	t.update(p, time.Now())
}

// times returns when the parent's ConfigMap gen and status observedGen last
// changed, and when it converged.
func (t *tracker) times(name string) (cm, st, conv time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	p := t.state(name)
	return p.cmAt, p.stAt, p.convergedAt
}

// waitConverged waits until all names have converged at their targets and
// returns the latest convergence time among them.
func (t *tracker) waitConverged(ctx context.Context, names []string, timeout time.Duration) (time.Time, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	i := 0
	var last time.Time
	for {
		t.mu.Lock()
		for i < len(names) {
			p := t.state(names[i])
			if !p.converged {
				break
			}
			if p.convergedAt.After(last) {
				last = p.convergedAt
			}
			i++
		}
		ch := t.changed
		t.mu.Unlock()
		if i == len(names) {
			// A parent counted early may have been retargeted meanwhile
			// (never by the scenarios, which wait per group); recheck once.
			t.mu.Lock()
			ok := true
			for _, n := range names {
				if !t.state(n).converged {
					ok = false
					break
				}
			}
			t.mu.Unlock()
			if ok {
				return last, nil
			}
			i = 0
			continue
		}
		select {
		case <-ch:
		case <-ctx.Done():
			t.mu.Lock()
			p, done := *t.state(names[i]), 0
			for _, n := range names {
				if t.state(n).converged {
					done++
				}
			}
			t.mu.Unlock()
			return last, fmt.Errorf("%d of %d parents converged within %s; e.g. %s: target gen %d, status seen=%v gen=%d childCount=%d, ConfigMap seen=%v gen=%d",
				done, len(names), timeout, names[i], p.target, p.stSeen, p.stGen, p.stCount, p.cmSeen, p.cmGen)
		}
	}
}

// waitChild waits until the parent's ConfigMap is seen at gen and returns
// when that was; ok is false if it was not within timeout.
func (t *tracker) waitChild(ctx context.Context, name string, gen int64, timeout time.Duration) (at time.Time, ok bool) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for {
		t.mu.Lock()
		p := t.state(name)
		if p.cmSeen && p.cmGen == gen {
			at := p.cmAt
			t.mu.Unlock()
			return at, true
		}
		ch := t.cmMoved
		t.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return time.Time{}, false
		}
	}
}
