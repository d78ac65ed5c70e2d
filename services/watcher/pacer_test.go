package watcher

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// TestPacer drives the pacer with a simulated clock: each step is an event
// at a time offset, and publishes happen as soon as the pacer allows (as the
// publisher workers would).
func TestPacer(t *testing.T) {
	cases := []struct {
		name   string
		reason string
		events []time.Duration // event times, ascending
		// want are the publish times.
		want []time.Duration
	}{
		{"isolated", "a lone change goes at once", []time.Duration{0}, []time.Duration{0}},
		{"spaced changes", "changes further apart than the minimum window all go at once",
			[]time.Duration{0, 40 * time.Millisecond, 80 * time.Millisecond},
			[]time.Duration{0, 40 * time.Millisecond, 80 * time.Millisecond}},
		{"close changes", "a change inside the window waits for it, and widens the next",
			[]time.Duration{0, 20 * time.Millisecond, 40 * time.Millisecond},
			[]time.Duration{0, 32 * time.Millisecond, 160 * time.Millisecond}},
		{"burst", "a 500 ms burst of changes 4 ms apart costs 4 publishes, the last after the burst",
			burst(126, 4*time.Millisecond),
			[]time.Duration{0, 32 * time.Millisecond, 160 * time.Millisecond, 660 * time.Millisecond}},
		{"quiet after burst", "after a burst and a quiet spell, a change goes at once again",
			append(burst(50, 4*time.Millisecond), 3*time.Second),
			[]time.Duration{0, 32 * time.Millisecond, 160 * time.Millisecond, 660 * time.Millisecond, 3 * time.Second}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, simulatePacer(tc.events)); diff != "" {
				t.Errorf("%s: publish times (-want +got):\n%s", tc.reason, diff)
			}
		})
	}
}

func burst(n int, gap time.Duration) []time.Duration {
	out := make([]time.Duration, n)
	for i := range out {
		out[i] = time.Duration(i) * gap
	}
	return out
}

// simulatePacer returns when items would be published for events at the
// given offsets: an event schedules a publish at now+delay unless one is
// already scheduled (the pending item absorbs it, as the workqueue does).
func simulatePacer(events []time.Duration) []time.Duration {
	p := newPacer()
	t0 := time.Unix(1000, 0)
	const key = "cc-x/uid"
	var published []time.Duration
	due := time.Duration(-1) // scheduled publish, -1: none
	flush := func(until time.Duration) {
		if due >= 0 && due <= until {
			p.published(key, t0.Add(due))
			published = append(published, due)
			due = -1
		}
	}
	for _, at := range events {
		flush(at)
		d := p.event(key, t0.Add(at))
		if due < 0 || at+d < due {
			due = at + d
		}
		flush(at)
	}
	flush(time.Hour)
	return published
}

// TestPacerForgetsQuietParents: pacing state of a parent that has been
// quiet for paceIdle is dropped, so the map does not grow with every parent
// that ever changed.
func TestPacerForgetsQuietParents(t *testing.T) {
	p := newPacer()
	t0 := time.Unix(1000, 0)
	p.event("a", t0)
	p.published("a", t0)
	p.event("b", t0.Add(paceIdle+2*time.Second))
	p.published("b", t0.Add(paceIdle+2*time.Second))
	if n := p.len(); n != 1 {
		t.Errorf("%d parents with pacing state after one went quiet for %s, want 1", n, paceIdle)
	}
}

// TestPacerEchoesDoNotWiden: a parent changed every 300 ms, each change
// echoed twice by the controller's own writes inside the window (the
// pending item then dropped as echo-only), keeps the minimum window: each
// change goes at once. Counting the dropped echoes as a burst widened the
// window to paceMax and made every change wait for it.
func TestPacerEchoesDoNotWiden(t *testing.T) {
	for _, tc := range []struct {
		reason string
		drop   bool // the echo-only item is reported dropped
		want   []time.Duration
	}{
		{"dropped echoes are not a burst", true, []time.Duration{0, 0, 0, 0, 0, 0}},
		{"counted as a burst (echoes never reported dropped), they widen the window until changes wait", false,
			[]time.Duration{0, 0, 0, 200 * time.Millisecond, 400 * time.Millisecond, 600 * time.Millisecond}},
	} {
		t.Run(tc.reason, func(t *testing.T) {
			p := newPacer()
			t0 := time.Unix(1000, 0)
			const key = "cc-x/uid"
			var delays []time.Duration
			for i := range 6 {
				at := t0.Add(time.Duration(i) * 300 * time.Millisecond)
				d := p.event(key, at)
				delays = append(delays, d)
				p.published(key, at.Add(d))
				// Two echoes 5 and 10 ms later wait for the window...
				p.event(key, at.Add(d+5*time.Millisecond))
				p.event(key, at.Add(d+10*time.Millisecond))
				if tc.drop {
					// ...and their item is dropped as echo-only.
					p.dropped(key)
				}
			}
			if diff := cmp.Diff(tc.want, delays); diff != "" {
				t.Errorf("%s: delay of each change (-want +got):\n%s", tc.reason, diff)
			}
		})
	}
}
