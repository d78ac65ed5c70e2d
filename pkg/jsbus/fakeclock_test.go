package jsbus

import (
	"slices"
	"sort"
	"sync"
	"time"
)

// fakeClock is a clock (seams.go) that moves only when told (Advance):
// the driver's timers fire in time order as it passes them, AfterFunc's
// on goroutines of their own as time.AfterFunc's do.
type fakeClock struct {
	mu     sync.Mutex
	now    time.Time
	timers []*fakeTimer
	// asked is every duration a timer was set for, in order.
	asked []time.Duration
}

func newFakeClock(now time.Time) *fakeClock { return &fakeClock{now: now} }

type fakeTimer struct {
	c      *fakeClock
	at     time.Time
	ch     chan time.Time
	f      func()
	active bool
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) add(d time.Duration, f func()) *fakeTimer {
	c.mu.Lock()
	defer c.mu.Unlock()
	t := &fakeTimer{c: c, at: c.now.Add(d), ch: make(chan time.Time, 1), f: f, active: true}
	c.timers = append(c.timers, t)
	c.asked = append(c.asked, d)
	return t
}

// waitTimers waits (in real time, at most 5 s) until n timers are set and
// not fired: the code under test is then blocked on the clock.
func (c *fakeClock) waitTimers(n int) bool {
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		c.mu.Lock()
		active := 0
		for _, t := range c.timers {
			if t.active {
				active++
			}
		}
		c.mu.Unlock()
		if active >= n {
			return true
		}
	}
	return false
}

// Asked returns the durations asked for so far.
func (c *fakeClock) Asked() []time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.asked)
}

func (c *fakeClock) AfterFunc(d time.Duration, f func()) timer { return c.add(d, f) }

func (c *fakeClock) NewTimer(d time.Duration) timer { return c.add(d, nil) }

// Advance moves the clock d on, firing every timer due by then.
func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	var due []*fakeTimer
	keep := c.timers[:0]
	for _, t := range c.timers {
		switch {
		case !t.active:
		case !t.at.After(c.now):
			t.active = false
			due = append(due, t)
		default:
			keep = append(keep, t)
		}
	}
	c.timers = keep
	c.mu.Unlock()
	sort.SliceStable(due, func(i, j int) bool { return due[i].at.Before(due[j].at) })
	for _, t := range due {
		if t.f != nil {
			go t.f()
			continue
		}
		select {
		case t.ch <- t.at:
		default:
		}
	}
}

func (t *fakeTimer) C() <-chan time.Time { return t.ch }

func (t *fakeTimer) Stop() bool {
	t.c.mu.Lock()
	defer t.c.mu.Unlock()
	was := t.active
	t.active = false
	return was
}

func (t *fakeTimer) Reset(d time.Duration) bool {
	t.c.mu.Lock()
	defer t.c.mu.Unlock()
	was := t.active
	t.at = t.c.now.Add(d)
	if !was {
		t.active = true
		t.c.timers = append(t.c.timers, t)
	}
	return was
}
