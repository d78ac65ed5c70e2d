package echo

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestStrategiesAgreed(t *testing.T) {
	t0 := time.Date(2026, 11, 28, 20, 0, 0, 0, time.UTC)
	type note struct {
		strategy string
		at       time.Duration // after t0
	}
	for _, c := range []struct {
		reason string
		notes  []note
		now    time.Duration
		want   string
		wantOK bool
	}{
		{reason: "no note yet: unknown", now: 0},
		{reason: "one strategy reported", notes: []note{{"dynamic-apply", 0}, {"dynamic-apply", time.Minute}}, now: 2 * time.Minute, want: "dynamic-apply", wantOK: true},
		{reason: "two strategies within the window: appliers disagree", notes: []note{{"dynamic-apply", 0}, {"server-side-apply", time.Minute}}, now: 2 * time.Minute},
		{reason: "an older strategy out of the window no longer counts", notes: []note{{"dynamic-apply", 0}, {"server-side-apply", 5 * time.Minute}}, now: StrategyWindow + time.Minute, want: "server-side-apply", wantOK: true},
		{reason: "a note without a strategy (an older applier) is unknown and blocks agreement", notes: []note{{"dynamic-apply", 0}, {"", time.Minute}}, now: 2 * time.Minute},
		{reason: "only notes without a strategy: unknown", notes: []note{{"", 0}}, now: time.Minute},
		{reason: "every note out of the window: unknown again", notes: []note{{"dynamic-apply", 0}}, now: StrategyWindow + time.Second},
		{reason: "a late note does not move the last report back", notes: []note{{"dynamic-apply", 9 * time.Minute}, {"dynamic-apply", time.Minute}}, now: StrategyWindow + 2*time.Minute, want: "dynamic-apply", wantOK: true},
	} {
		t.Run(c.reason, func(t *testing.T) {
			var s Strategies
			for _, n := range c.notes {
				s.Saw(n.strategy, t0.Add(n.at))
			}
			got, ok := s.Agreed(t0.Add(c.now), StrategyWindow)
			if diff := cmp.Diff([2]any{c.want, c.wantOK}, [2]any{got, ok}); diff != "" {
				t.Errorf("Agreed (-want +got):\n%s", diff)
			}
		})
	}
}
