package ownership

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/metabus/metabus/pkg/fairq"
)

var (
	t0     = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	lease  = 10 * time.Second
	ackW   = 30 * time.Second
	p0     = Partition{1, 0}
	errAPI = errors.New("api")
)

// show renders effects compactly: "Kind part[ details]".
func show(effs []Effect) []string {
	names := map[Kind]string{ReadLayout: "ReadLayout", RenewMember: "RenewMember", Claim: "Claim", Renew: "Renew", Open: "Open",
		Consume: "Consume", StopConsume: "StopConsume", Deadline: "Deadline", Cancel: "Cancel", Run: "Run", Drop: "Drop",
		Reset: "Reset", DeleteLease: "DeleteLease", Recover: "Recover", ReadFloor: "ReadFloor", Leave: "Leave", Nak: "Nak",
		Owned: "Owned", Disowned: "Disowned"}
	var out []string
	for _, e := range effs {
		s := names[e.Kind]
		switch e.Kind {
		case Claim, Open, Consume, StopConsume, Cancel, Reset, ReadFloor, Owned:
			s += " " + e.Part.String()
		case Disowned:
			s += " " + e.Part.String()
			if e.Lost {
				s += " lost"
			}
		case Deadline:
			if e.Until.IsZero() {
				s += " " + e.Part.String() + " revoked"
			} else {
				s += fmt.Sprintf(" %s +%s", e.Part, e.Until.Sub(t0))
			}
		case DeleteLease, Recover:
			s += fmt.Sprintf(" %s rev %d", e.Part, e.Rev)
		case Run:
			s += fmt.Sprintf(" %d", e.ID)
			if e.Check {
				s += " checked"
			}
			if e.Newer {
				s += " newer"
			}
		case Drop, Nak:
			s += fmt.Sprint(" ", e.IDs)
		case Renew:
			var ls []string
			for _, l := range e.Leases {
				ls = append(ls, fmt.Sprintf("%s@%d", l.Part, l.Rev))
			}
			s += " " + strings.Join(ls, ",")
		}
		out = append(out, s)
	}
	return out
}

// step is one event of a scenario.
type step func(c *Core)

func at(d time.Duration) time.Time { return t0.Add(d) }

func newCore(ordered bool) *Core {
	c := New(Config{Member: "me", Lease: lease, AckWait: ackW, Ordered: ordered, Limits: fairq.Limits{PerGroup: 4, Total: 8}}, 1, t0)
	c.Ready()
	return c
}

// active: claimed at t0 (rev 1), layout confirmed, consumer state read,
// consuming (epoch 1).
var toActive = []step{
	func(c *Core) { c.Begin(t0) },
	func(c *Core) { c.ClaimDone(p0, 1, OK, t0, t0) },
	func(c *Core) { c.LayoutRead(1, 1, nil, t0) },
	func(c *Core) { c.OpenDone(p0, ConsumerState{}, nil, t0) },
}

func deliver(id, seq, dseq uint64, key string) step {
	return func(c *Core) {
		c.Deliver(Msg{ID: id, Part: p0, Epoch: 1, Group: "g", Key: key, Seq: seq, DSeq: dseq}, t0)
	}
}

func steps(ss ...[]step) []step {
	var out []step
	for _, s := range ss {
		out = append(out, s...)
	}
	return out
}

// TestCoreTransitions: the effects of the last event of each scenario.
func TestCoreTransitions(t *testing.T) {
	cases := []struct {
		reason  string
		ordered bool
		before  []step
		last    step
		want    []string
	}{
		{
			reason: "a replica alone claims the only partition when it begins",
			last:   func(c *Core) { c.Begin(t0) },
			want:   []string{"Claim 1-p00"},
		},
		{
			reason: "a claim sets the deadline at 3/5 of the lease after it was sent, reads the layout again and the consumer's state",
			before: toActive[:1],
			last:   func(c *Core) { c.ClaimDone(p0, 1, OK, t0, at(time.Second)) },
			want:   []string{"Owned 1-p00", "Deadline 1-p00 +6s", "ReadLayout", "Open 1-p00"},
		},
		{
			reason: "the consumer's state alone does not start consumption: the layout must be read after the claim (defect 6)",
			before: toActive[:2],
			last:   func(c *Core) { c.OpenDone(p0, ConsumerState{}, nil, t0) },
		},
		{
			reason: "a layout read that fails after the claim does not count as 'unchanged' (defect 6)",
			before: steps(toActive[:2], []step{func(c *Core) { c.OpenDone(p0, ConsumerState{}, nil, t0) }}),
			last:   func(c *Core) { c.LayoutRead(1, 0, errAPI, t0) },
		},
		{
			reason: "a layout read issued before the claim's answer does not confirm it",
			before: []step{func(c *Core) { c.Begin(t0) }, func(c *Core) { c.Tick(at(2 * time.Second)) }, func(c *Core) { c.ClaimDone(p0, 1, OK, t0, t0) },
				func(c *Core) { c.OpenDone(p0, ConsumerState{}, nil, t0) }},
			last: func(c *Core) { c.LayoutRead(1, 1, nil, t0) },
			want: []string{"ReadLayout"},
		},
		{
			reason: "a layout read after the claim that confirms the count starts consumption",
			before: toActive[:3],
			last:   func(c *Core) { c.OpenDone(p0, ConsumerState{}, nil, t0) },
			want:   []string{"Consume 1-p00"},
		},
		{
			reason: "a cut-over seen right after the claim hands the lease back unused",
			before: steps(toActive[:2], []step{func(c *Core) { c.OpenDone(p0, ConsumerState{}, nil, t0) }}),
			last:   func(c *Core) { c.LayoutRead(1, 2, nil, t0) },
			want:   []string{"Deadline 1-p00 revoked", "DeleteLease 1-p00 rev 1", "Claim 2-p00", "Claim 2-p01"},
		},
		{
			reason: "messages of one item run one at a time, in stream order whatever order they arrive in",
			before: steps(toActive, []step{deliver(1, 12, 1, "a")}),
			last:   deliver(2, 11, 2, "a"),
		},
		{
			reason: "a handler's return runs the item's next message",
			before: steps(toActive, []step{deliver(1, 12, 1, "a"), deliver(2, 13, 2, "a")}),
			last:   func(c *Core) { c.Done(1, true, t0) },
			want:   []string{"Run 2"},
		},
		{
			reason:  "an ordered partition that finds messages pending elsewhere checks every message before it runs",
			ordered: true,
			before:  toActive[:3],
			last: func(c *Core) {
				c.OpenDone(p0, ConsumerState{AckPending: 2, Delivered: 40, DeliveredSeq: 7, AckFloor: 30}, nil, t0)
				c.Deliver(Msg{ID: 1, Part: p0, Epoch: 1, Group: "g", Key: "a", Seq: 41, DSeq: 8}, t0)
			},
			want: []string{"Consume 1-p00", "Run 1 checked"},
		},
		{
			reason:  "it stops checking once the ack floor has passed every delivery made before",
			ordered: true,
			before: steps(toActive[:3], []step{
				func(c *Core) {
					c.OpenDone(p0, ConsumerState{AckPending: 2, Delivered: 40, DeliveredSeq: 7, AckFloor: 30}, nil, t0)
				},
				func(c *Core) { c.FloorRead(p0, ConsumerState{AckFloor: 40}, nil, t0) },
			}),
			last: func(c *Core) { c.Deliver(Msg{ID: 1, Part: p0, Epoch: 1, Group: "g", Key: "a", Seq: 41, DSeq: 8}, t0) },
			want: []string{"Run 1"},
		},
		{
			reason:  "a delivery sequence that skips one (a delivery that went to another subscriber) starts the checks",
			ordered: true,
			before:  steps(toActive, []step{deliver(1, 5, 1, "a")}),
			last:    deliver(2, 7, 3, "b"),
			want:    []string{"Run 2 checked"},
		},
		{
			reason:  "an older message of an item delivered after a newer one ran here is checked",
			ordered: true,
			before:  steps(toActive, []step{deliver(1, 5, 1, "a"), func(c *Core) { c.Done(1, true, t0) }}),
			last:    deliver(2, 4, 2, "a"),
			want:    []string{"Run 2 checked"},
		},
		{
			reason:  "a message given back unsettled (a handler's failure) makes an ordered partition check what follows",
			ordered: true,
			before:  steps(toActive, []step{deliver(1, 5, 1, "a"), deliver(2, 6, 2, "a")}),
			last:    func(c *Core) { c.Done(1, false, t0) },
			want:    []string{"Run 2 checked"},
		},
		{
			reason: "a handover stops consuming and drops what waits, then waits for what runs",
			before: steps(toActive, []step{deliver(1, 5, 1, "a"), deliver(2, 6, 2, "a")}),
			last:   func(c *Core) { c.MemberSeen(winner(), t0) },
			want:   []string{"StopConsume 1-p00", "Drop [2]"},
		},
		{
			reason: "once its handlers are done, it resets the consumer (what it dropped is delivered again at once, uncounted)",
			before: steps(toActive, []step{deliver(1, 5, 1, "a"), deliver(2, 6, 2, "a"), func(c *Core) { c.MemberSeen(winner(), t0) }}),
			last:   func(c *Core) { c.Done(1, true, t0) },
			want:   []string{"Reset 1-p00"},
		},
		{
			reason: "then it deletes the lease",
			before: steps(toActive, []step{func(c *Core) { c.MemberSeen(winner(), t0) }}),
			last:   func(c *Core) { c.ResetDone(p0, nil, t0) },
			want:   []string{"Deadline 1-p00 revoked", "DeleteLease 1-p00 rev 1"},
		},
		{
			reason: "the fence runs at the deadline: no more messages, handlers cancelled, lease revoked for writes",
			before: steps(toActive, []step{deliver(1, 5, 1, "a"), deliver(2, 6, 2, "a")}),
			last:   func(c *Core) { c.Tick(at(6 * time.Second)) },
			want:   []string{"Deadline 1-p00 revoked", "StopConsume 1-p00", "Drop [2]", "Cancel 1-p00", "RenewMember", "ReadLayout"},
		},
		{
			reason: "a reset that fails is tried again",
			before: steps(toActive, []step{func(c *Core) { c.MemberSeen(winner(), t0) }, func(c *Core) { c.ResetDone(p0, errAPI, t0) }}),
			last:   func(c *Core) { c.Tick(at(2 * time.Second)) },
			want:   []string{"RenewMember", "Renew 1-p00@1", "Reset 1-p00", "ReadLayout"},
		},
		{
			reason: "a reset that keeps failing is tried again past AckWait while the lease holds: a handover never counts a delivery",
			before: steps(toActive, []step{func(c *Core) { c.MemberSeen(winner(), t0) }}, renewedUntil(ackW)),
			last:   func(c *Core) { c.ResetDone(p0, errAPI, at(ackW)) },
		},
		{
			reason: "a consumer that cannot be reset (an old server, a missing permission) is handed back at once",
			before: steps(toActive, []step{func(c *Core) { c.MemberSeen(winner(), t0) }}),
			last:   func(c *Core) { c.ResetDone(p0, fmt.Errorf("reset: %w", ErrCannotReset), t0) },
			want:   []string{"Deadline 1-p00 revoked", "DeleteLease 1-p00 rev 1"},
		},
		{
			reason: "a stopping replica that could not reset for AckWait leaves its lease to run out, as a crash does",
			before: steps(toActive, []step{func(c *Core) { c.Stop(t0) }}, renewedUntil(ackW)),
			last:   func(c *Core) { c.ResetDone(p0, errAPI, at(ackW)) },
			want:   []string{"Deadline 1-p00 revoked", "Disowned 1-p00 lost"},
		},
		{
			reason: "a renewal sent in time but answered after the deadline does not undo the fence (handlers saw the lease end)",
			before: steps(toActive, []step{func(c *Core) { c.Tick(at(2 * time.Second)) }}),
			last:   func(c *Core) { c.RenewDone([]Renewal{{Part: p0, Rev: 2}}, at(2*time.Second), at(6*time.Second)) },
			want:   []string{"Deadline 1-p00 revoked", "StopConsume 1-p00", "Recover 1-p00 rev 2"},
		},
		{
			reason: "a fenced partition whose handlers are done tries to get its lease back",
			before: steps(toActive, []step{deliver(1, 5, 1, "a"), func(c *Core) { c.Tick(at(6 * time.Second)) }}),
			last:   func(c *Core) { c.Done(1, true, at(6*time.Second)) },
			want:   []string{"Recover 1-p00 rev 1"},
		},
		{
			reason: "a lease got back after a fence resets the consumer (what the fence dropped costs nothing), then consumes again",
			before: steps(toActive, []step{func(c *Core) { c.Tick(at(6 * time.Second)) }}),
			last:   func(c *Core) { c.RecoverDone(p0, 3, OK, at(7*time.Second), at(7*time.Second)) },
			want:   []string{"Deadline 1-p00 +13s", "Reset 1-p00"},
		},
		{
			reason: "a lease another replica holds now is not got back: lost",
			before: steps(toActive, []step{func(c *Core) { c.Tick(at(6 * time.Second)) }}),
			last:   func(c *Core) { c.RecoverDone(p0, 0, Taken, at(7*time.Second), at(7*time.Second)) },
			want:   []string{"Disowned 1-p00 lost"},
		},
		{
			reason: "a lease deleted after a handover is no longer owned",
			before: steps(toActive, []step{func(c *Core) { c.MemberSeen(winner(), t0) }, func(c *Core) { c.ResetDone(p0, nil, t0) }}),
			last:   func(c *Core) { c.ReleaseDone(p0, t0) },
			want:   []string{"Disowned 1-p00"},
		},
		{
			reason: "a claim that finds its own forgotten lease resets the consumer before it consumes",
			before: toActive[:1],
			last:   func(c *Core) { c.ClaimDone(p0, 4, Regained, t0, t0) },
			want:   []string{"Owned 1-p00", "Deadline 1-p00 +6s", "ReadLayout", "Reset 1-p00"},
		},
		{
			reason: "a claim that finds its own forgotten lease, answered too late to use, still resets once the lease is got back",
			before: steps(toActive[:1], []step{
				func(c *Core) { c.ClaimDone(p0, 4, Regained, t0, at(7*time.Second)) },
			}),
			last: func(c *Core) { c.RecoverDone(p0, 5, OK, at(7*time.Second), at(7*time.Second)) },
			want: []string{"Deadline 1-p00 +13s", "Reset 1-p00"},
		},
		{
			reason: "a renewal that finds the lease taken fences at once",
			before: steps(toActive, []step{func(c *Core) { c.Tick(at(2 * time.Second)) }}),
			last:   func(c *Core) { c.RenewDone([]Renewal{{Part: p0, Out: Taken}}, at(2*time.Second), at(2*time.Second)) },
			want:   []string{"Deadline 1-p00 revoked", "StopConsume 1-p00", "Disowned 1-p00 lost"},
		},
		{
			reason: "a renewal's answer that is not about the lease renewed is ignored",
			before: toActive,
			last:   func(c *Core) { c.RenewDone([]Renewal{{Part: p0, Out: Taken}}, t0, t0) },
		},
		{
			reason: "stopping leaves the members at once, then hands every partition back",
			before: toActive,
			last:   func(c *Core) { c.Stop(t0) },
			want:   []string{"Leave", "StopConsume 1-p00", "Reset 1-p00"},
		},
	}
	for _, tc := range cases {
		t.Run(tc.reason, func(t *testing.T) {
			c := newCore(tc.ordered)
			for _, s := range tc.before {
				s(c)
				c.Ready()
			}
			tc.last(c)
			got := show(c.Ready())
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("effects (-want +got):\n%s", diff)
			}
		})
	}
}

// renewedUntil ticks and renews the lease (rev 2, answered at once) every
// 2s until d.
func renewedUntil(d time.Duration) []step {
	var out []step
	for x := 2 * time.Second; x < d; x += 2 * time.Second {
		x := x
		out = append(out, func(c *Core) { c.Tick(at(x)) }, func(c *Core) { c.RenewDone([]Renewal{{Part: p0, Rev: 2}}, at(x), at(x)) })
	}
	return out
}

// winner is a member that takes the only partition from "me".
func winner() string {
	for i := 0; ; i++ {
		m := fmt.Sprintf("m%d", i)
		if Assign([]string{"me", m}, 1)[0] == m {
			return m
		}
	}
}

// TestDrainBound: handlers that outlive a handover are cancelled after
// AckWait, and the lease is given up (fenced) after another AckWait if
// they still run; renewals go on meanwhile.
func TestDrainBound(t *testing.T) {
	c := newCore(false)
	for _, s := range steps(toActive, []step{deliver(1, 5, 1, "a"), func(c *Core) { c.MemberSeen(winner(), t0) }}) {
		s(c)
		c.Ready()
	}
	var events []string
	for d := 2 * time.Second; d <= 2*ackW+2*time.Second; d += 2 * time.Second {
		c.Tick(at(d))
		for _, e := range show(c.Ready()) {
			if strings.HasPrefix(e, "Cancel") || strings.HasPrefix(e, "Recover") || strings.HasPrefix(e, "Deadline 1-p00 revoked") {
				events = append(events, fmt.Sprintf("%s at %s", e, d))
			}
		}
		c.MemberSeen(winner(), at(d))
		c.RenewDone([]Renewal{{Part: p0, Rev: 1}}, at(d), at(d))
		c.Ready()
	}
	want := []string{"Cancel 1-p00 at 30s", "Deadline 1-p00 revoked at 1m0s"}
	if diff := cmp.Diff(want, events); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
}
