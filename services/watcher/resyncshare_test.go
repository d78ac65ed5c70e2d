package watcher

import (
	"fmt"
	"testing"
)

// TestResyncPacingReady is the pacer's rule of who may add a resync item
// to MC_WORK, per controller backlog, total and fair share of the total.
func TestResyncPacingReady(t *testing.T) {
	// pacing returns a pacing with counts[c] items in MC_WORK for c.
	pacing := func(perCtrl, total int, counts map[string]int) *resyncPacing {
		p := &resyncPacing{perCtrl: perCtrl, total: total, inflight: map[string]map[string]bool{}}
		for c, n := range counts {
			for i := 0; i < n; i++ {
				p.sent(c, fmt.Sprintf("%s.%d", c, i))
			}
		}
		return p
	}
	// hanging is 32 controllers with 32 items each: the default total.
	hanging := map[string]int{}
	for i := 0; i < 32; i++ {
		hanging[fmt.Sprint("hang", i)] = 32
	}
	withFresh := func(n int) map[string]int {
		m := map[string]int{"fresh": n}
		for c, k := range hanging {
			m[c] = k
		}
		return m
	}
	cases := []struct {
		reason         string
		perCtrl, total int
		counts         map[string]int
		ctrl           string
		want           bool
	}{
		{reason: "nothing in MC_WORK: go", perCtrl: 32, total: 1024, ctrl: "a", want: true},
		{reason: "below its backlog and the total: go", perCtrl: 32, total: 1024, counts: map[string]int{"a": 31}, ctrl: "a", want: true},
		{reason: "at its backlog: wait, whatever the total", perCtrl: 32, total: 1024, counts: map[string]int{"a": 32}, ctrl: "a", want: false},
		{reason: "32 hanging controllers hold the total: a new controller still goes (its share is 1024/33 = 31)",
			perCtrl: 32, total: 1024, counts: hanging, ctrl: "fresh", want: true},
		{reason: "beside 32 hanging controllers, a controller goes up to its fair share",
			perCtrl: 32, total: 1024, counts: withFresh(30), ctrl: "fresh", want: true},
		{reason: "beside 32 hanging controllers, a controller at its fair share waits",
			perCtrl: 32, total: 1024, counts: withFresh(31), ctrl: "fresh", want: false},
		{reason: "a hanging controller over its fair share adds nothing while the total is reached",
			perCtrl: 64, total: 1024, counts: withFresh(0), ctrl: "hang0", want: false},
		{reason: "total reached by one controller: another goes (share 5 of 10)",
			perCtrl: 10, total: 10, counts: map[string]int{"a": 10}, ctrl: "b", want: true},
		{reason: "total reached, the other at its share: wait",
			perCtrl: 10, total: 10, counts: map[string]int{"a": 10, "b": 5}, ctrl: "b", want: false},
		{reason: "more controllers than the total: each still gets one",
			perCtrl: 10, total: 2, counts: map[string]int{"a": 1, "b": 1, "c": 1}, ctrl: "d", want: true},
		{reason: "twice the total reached: a controller under its share waits",
			perCtrl: 10, total: 4, counts: map[string]int{"a": 4, "b": 4, "c": 1}, ctrl: "c", want: false},
		{reason: "twice the total reached: a controller with none in MC_WORK still gets one",
			perCtrl: 10, total: 4, counts: map[string]int{"a": 4, "b": 4}, ctrl: "c", want: true},
		{reason: "more controllers than the total: one at a time each",
			perCtrl: 10, total: 2, counts: map[string]int{"a": 1, "b": 1, "c": 1}, ctrl: "c", want: false},
	}
	for _, c := range cases {
		t.Run(c.reason, func(t *testing.T) {
			p := pacing(c.perCtrl, c.total, c.counts)
			if got := p.ready(c.ctrl); got != c.want {
				t.Errorf("%s: ready(%s) = %v, want %v (%d in MC_WORK, %d of its own)", c.reason, c.ctrl, got, c.want, p.n, len(p.inflight[c.ctrl]))
			}
		})
	}
}

// TestResyncPacingBound: however many controllers hang, the items in
// MC_WORK stay within twice the total plus one per controller, and every
// controller got at least one in.
func TestResyncPacingBound(t *testing.T) {
	const perCtrl, total, ctrls = 32, 1024, 200
	p := &resyncPacing{perCtrl: perCtrl, total: total, inflight: map[string]map[string]bool{}}
	// Controllers arrive one after another and none drains.
	for c := 0; c < ctrls; c++ {
		ctrl := fmt.Sprint("c", c)
		for i := 0; p.ready(ctrl); i++ {
			p.sent(ctrl, fmt.Sprintf("%s.%d", ctrl, i))
		}
	}
	if p.n > 2*total+ctrls {
		t.Errorf("%d items in MC_WORK, want at most %d", p.n, 2*total+ctrls)
	}
	for c := 0; c < ctrls; c++ {
		if len(p.inflight[fmt.Sprint("c", c)]) == 0 {
			t.Errorf("controller c%d got no resync in beside %d hanging ones", c, c)
		}
	}
	t.Logf("%d controllers that never drain: %d items in MC_WORK (total %d)", ctrls, p.n, total)
}
