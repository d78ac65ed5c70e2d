package jsbus

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/nats-io/nats.go/jetstream"
)

// ackMsg is a message whose confirmed acks fail until ok is set.
type ackMsg struct {
	jetstream.Msg
	ok    atomic.Bool
	tries atomic.Int32
}

func (m *ackMsg) DoubleAck(context.Context) error {
	m.tries.Add(1)
	if m.ok.Load() {
		return nil
	}
	return errors.New("ack: no answer")
}

// TestConfirmedAckRetries drives the real driver's confirmed ack (an
// ordered stage's held.ack) on a fake clock: a lost ack is tried again
// after 50 ms, 100 ms, 200 ms..., until the server confirms it, and never
// once the lease's deadline has passed by the clock, though no fence ran.
func TestConfirmedAckRetries(t *testing.T) {
	ms := time.Millisecond
	for _, tc := range []struct {
		reason    string
		fails     int  // attempts that fail before the clock moves past the deadline or ok
		expire    bool // the lease runs out after fails attempts
		wantWaits []time.Duration
		wantErr   error
		wantTries int32
	}{
		{"confirmed at once", 0, false, nil, nil, 1},
		{"confirmed at the third attempt", 2, false, []time.Duration{50 * ms, 100 * ms}, nil, 3},
		{"the waits double to at most a second", 6, false,
			[]time.Duration{50 * ms, 100 * ms, 200 * ms, 400 * ms, 800 * ms, time.Second}, nil, 7},
		{"the lease runs out while retrying: no more attempts", 2, true, []time.Duration{50 * ms, 100 * ms}, errFenced, 2},
	} {
		t.Run(tc.reason, func(t *testing.T) {
			clk := newFakeClock(time.Date(2026, 11, 28, 23, 0, 0, 0, time.UTC))
			var until atomic.Int64
			until.Store(clk.Now().Add(10 * time.Second).UnixNano())
			o := &owner{clk: clk, c: ConsumeConfig{Ordered: true, Lease: 10 * time.Second}}
			m := &ackMsg{}
			m.ok.Store(tc.fails == 0)
			hm := &held{Msg: m, o: o, lease: newLease(&until, clk)}
			done := make(chan error, 1)
			go func() { done <- hm.ack() }()
			for i := range tc.fails {
				if !clk.waitTimers(1) {
					t.Fatalf("attempt %d: the ack never waited", i+1)
				}
				switch {
				case i == tc.fails-1 && tc.expire:
					clk.Advance(10 * time.Second) // past the deadline: the sleep ends too
				case i == tc.fails-1:
					m.ok.Store(true)
					fallthrough
				default:
					clk.Advance(time.Second)
				}
			}
			var err error
			select {
			case err = <-done:
			case <-time.After(5 * time.Second):
				t.Fatal("the ack never returned")
			}
			if !errors.Is(err, tc.wantErr) {
				t.Errorf("ack = %v, want %v", err, tc.wantErr)
			}
			if d := cmp.Diff(tc.wantWaits, clk.Asked()); d != "" {
				t.Errorf("waits (-want +got):\n%s", d)
			}
			if got := m.tries.Load(); got != tc.wantTries {
				t.Errorf("%d attempts, want %d", got, tc.wantTries)
			}
			if hm.settled != (tc.wantErr == nil) {
				t.Errorf("settled = %v", hm.settled)
			}
		})
	}
}
