package jsbus

import (
	"context"
	"testing"
	"time"

	"github.com/metabus/metabus/pkg/bus"
)

// TestScheduleKeepsSoonerDeadline (issue 13 #15): a parent has one
// schedule, and a later deadline (a resync) must not replace a sooner one
// (a retry), while a sooner one replaces a later one.
func TestScheduleKeepsSoonerDeadline(t *testing.T) {
	js := startBus(t, bus.Options{})
	ctx := context.Background()
	p := Publisher{JS: js}
	now := time.Now()
	cases := []struct {
		name   string
		reason string
		uid    string
		first  time.Duration
		second time.Duration
		want   time.Duration
	}{
		{"later does not replace sooner", "a resync in an hour must not push back a retry in a minute", "u1", time.Minute, time.Hour, time.Minute},
		{"sooner replaces later", "a retry in a minute comes before a resync in an hour", "u2", time.Hour, time.Minute, time.Minute},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			it := item("c", tc.uid)
			for _, d := range []time.Duration{tc.first, tc.second} {
				if err := p.Schedule(ctx, it, now.Add(d)); err != nil {
					t.Fatal(err)
				}
			}
			subject, err := bus.SchedSubject(it.Controller.ID(), tc.uid)
			if err != nil {
				t.Fatal(err)
			}
			got, ok := p.scheduledAt(ctx, subject)
			want := now.Add(tc.want).Add(time.Second - 1).Truncate(time.Second)
			if !ok || !got.Equal(want) {
				t.Errorf("%s: pending schedule at %v (found %v), want %v", tc.reason, got, ok, want)
			}
		})
	}
}

func TestKeepPending(t *testing.T) {
	now := time.Unix(1000, 0)
	for _, tc := range []struct {
		reason      string
		pending, at time.Time
		want        bool
	}{
		{reason: "a sooner schedule still ahead wins", pending: now.Add(2 * time.Second), at: now.Add(5 * time.Second), want: true},
		{reason: "the same time: keep it", pending: now.Add(5 * time.Second), at: now.Add(5 * time.Second), want: true},
		{reason: "a later pending schedule is replaced by the sooner one", pending: now.Add(10 * time.Second), at: now.Add(5 * time.Second), want: false},
		{reason: "just due: the server is about to fire it", pending: now.Add(-time.Second), at: now.Add(5 * time.Second), want: true},
		{reason: "minutes past due: it was never fired, replace it", pending: now.Add(-3 * time.Minute), at: now.Add(time.Second), want: false},
	} {
		t.Run(tc.reason, func(t *testing.T) {
			if got := keepPending(tc.pending, tc.at, now); got != tc.want {
				t.Errorf("keepPending = %v, want %v", got, tc.want)
			}
		})
	}
}
