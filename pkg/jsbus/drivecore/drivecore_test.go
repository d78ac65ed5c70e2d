package drivecore

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/metabus/metabus/pkg/outcome"
	"github.com/metabus/metabus/pkg/ownership"
)

func TestLeaseWrites(t *testing.T) {
	type got struct {
		Claim, Recover Answer
		Renew          bool
		Write          ownership.Outcome
	}
	for _, tc := range []struct {
		reason string
		err    Err
		want   got
	}{
		{"written: the lease is ours", ErrNone,
			got{Claim: Answer{Out: ownership.OK}, Recover: Answer{Out: ownership.OK}, Write: ownership.OK}},
		{"the key exists (or its revision moved): maybe our own earlier write, its answer lost", ErrExists,
			got{Claim: Answer{Ours: true}, Recover: Answer{Ours: true}, Renew: true, Write: ownership.Taken}},
		{"the key is gone: a recovery is too late, a rewrite was refused", ErrNotFound,
			got{Claim: Answer{Out: ownership.Failed, Report: true}, Recover: Answer{Out: ownership.Taken}, Write: ownership.Taken}},
		{"a deleted key ends a recovery; a rewrite of a deleted key failed (tried again)", ErrDeleted,
			got{Claim: Answer{Out: ownership.Failed, Report: true}, Recover: Answer{Out: ownership.Taken}, Write: ownership.Failed}},
		{"no answer: the write may or may not have happened", ErrTimeout,
			got{Claim: Answer{Out: ownership.Failed, Report: true}, Recover: Answer{Out: ownership.Failed}, Write: ownership.Failed}},
		{"any other error fails the same way", ErrOther,
			got{Claim: Answer{Out: ownership.Failed, Report: true}, Recover: Answer{Out: ownership.Failed}, Write: ownership.Failed}},
	} {
		t.Run(tc.reason, func(t *testing.T) {
			g := got{Claim: Claim(tc.err), Recover: Recover(tc.err), Renew: Renewed(tc.err), Write: OursWrite(tc.err)}
			if d := cmp.Diff(tc.want, g); d != "" {
				t.Errorf("%s (-want +got):\n%s", tc.err, d)
			}
		})
	}
}

func TestOursRead(t *testing.T) {
	type got struct {
		Rewrite bool
		Out     ownership.Outcome
	}
	for _, tc := range []struct {
		reason string
		err    Err
		mine   bool
		want   got
	}{
		{"still names this replica: rewrite it", ErrNone, true, got{true, ownership.OK}},
		{"names another replica: taken", ErrNone, false, got{false, ownership.Taken}},
		{"gone: taken (expired, or handed back)", ErrNotFound, false, got{false, ownership.Taken}},
		{"deleted: taken", ErrDeleted, false, got{false, ownership.Taken}},
		{"unreadable: failed, the core asks again", ErrTimeout, false, got{false, ownership.Failed}},
	} {
		t.Run(tc.reason, func(t *testing.T) {
			var g got
			g.Rewrite, g.Out = OursRead(tc.err, tc.mine)
			if d := cmp.Diff(tc.want, g); d != "" {
				t.Errorf("(-want +got):\n%s", d)
			}
		})
	}
}

func TestRegained(t *testing.T) {
	for _, tc := range []struct {
		reason string
		ours   ownership.Outcome
		want   ownership.Outcome
	}{
		{"rewritten: our own earlier claim, regained", ownership.OK, ownership.Regained},
		{"another replica's: taken", ownership.Taken, ownership.Taken},
		{"unknown: failed", ownership.Failed, ownership.Failed},
	} {
		t.Run(tc.reason, func(t *testing.T) {
			if d := cmp.Diff(tc.want, Regained(tc.ours)); d != "" {
				t.Errorf("(-want +got):\n%s", d)
			}
		})
	}
}

func TestReset(t *testing.T) {
	for _, tc := range []struct {
		reason       string
		reset, probe Err
		want         Reset
	}{
		{"reset", ErrNone, ErrNone, ResetDone},
		{"no consumer left: nothing to give back", ErrNotFound, ErrNone, ResetDone},
		{"a 4xx: the server cannot reset (before 2.14)", ErrRefused, ErrNone, ResetUnsupported},
		{"no responders: no reset API", ErrNoResponders, ErrNone, ResetUnsupported},
		{"no answer but the info answers: the request is dropped (no permission)", ErrTimeout, ErrNone, ResetUnsupported},
		{"no answer, nor from the info: the server is unreachable, try again", ErrTimeout, ErrTimeout, ResetNoAnswer},
		{"no answer, the info fails otherwise: try again", ErrTimeout, ErrOther, ResetNoAnswer},
		{"a 5xx (no consumer leader yet): try again", ErrOther, ErrNone, ResetError},
		{"a deleted consumer is not a missing one: try again", ErrDeleted, ErrNone, ResetError},
	} {
		t.Run(tc.reason, func(t *testing.T) {
			got := ResetAnswer(tc.reset)
			if got == ResetProbe {
				got = ResetProbed(tc.probe)
			}
			if d := cmp.Diff(tc.want, got); d != "" {
				t.Errorf("reset %s, info %s (-want +got):\n%s", tc.reset, tc.probe, d)
			}
		})
	}
}

func TestConsumeFailures(t *testing.T) {
	type got struct{ Ends, Report, StartReport bool }
	for _, tc := range []struct {
		reason string
		err    Err
		want   got
	}{
		{"a missed idle heartbeat: the client pulls again", ErrNoHeartbeat, got{false, false, true}},
		{"a leader move voided the pull: the client pulls again", ErrLeaderMoved, got{false, false, true}},
		{"consumer gone (a cut-over): ends, silently", ErrNotFound, got{true, false, false}},
		{"consumer deleted: ends, silently", ErrDeleted, got{true, false, false}},
		{"anything else is reported; the client goes on", ErrOther, got{false, true, true}},
		{"a timeout is reported", ErrTimeout, got{false, true, true}},
	} {
		t.Run(tc.reason, func(t *testing.T) {
			var g got
			g.Ends, g.Report = ConsumeFailure(tc.err)
			g.StartReport = StartFailure(tc.err)
			if d := cmp.Diff(tc.want, g); d != "" {
				t.Errorf("(-want +got):\n%s", d)
			}
		})
	}
}

func TestSettleOf(t *testing.T) {
	type got struct {
		Settle  Settle
		Unknown bool
	}
	for _, tc := range []struct {
		reason string
		kind   outcome.Kind
		want   got
	}{
		{"done: acked", outcome.KindDone, got{SettleAck, false}},
		{"terminal: termed with its reason", outcome.KindTerminal, got{SettleTerm, false}},
		{"no outcome (the context ended first): given back silently", 0, got{SettleGiveBack, false}},
		{"a kind the runtime does not settle: given back and reported", outcome.Kind(99), got{SettleGiveBack, true}},
	} {
		t.Run(tc.reason, func(t *testing.T) {
			var g got
			g.Settle, g.Unknown = SettleOf(tc.kind)
			if d := cmp.Diff(tc.want, g); d != "" {
				t.Errorf("(-want +got):\n%s", d)
			}
		})
	}
}

func TestAck(t *testing.T) {
	t.Run("the waits between attempts double from 50 ms to at most 1 s", func(t *testing.T) {
		var b AckBackoff
		var got []time.Duration
		for range 8 {
			got = append(got, b.Next())
		}
		ms := time.Millisecond
		want := []time.Duration{50 * ms, 100 * ms, 200 * ms, 400 * ms, 800 * ms, time.Second, time.Second, time.Second}
		if d := cmp.Diff(want, got); d != "" {
			t.Errorf("(-want +got):\n%s", d)
		}
	})
	for _, tc := range []struct {
		reason     string
		api, lease time.Duration
		want       time.Duration
	}{
		{"the default lease: an API request's bound", 5 * time.Second, 30 * time.Second, 5 * time.Second},
		{"a short lease: a renewal period", 5 * time.Second, 10 * time.Second, 2 * time.Second},
	} {
		t.Run(tc.reason, func(t *testing.T) {
			if d := cmp.Diff(tc.want, AckTimeout(tc.api, tc.lease)); d != "" {
				t.Errorf("(-want +got):\n%s", d)
			}
		})
	}
	for _, tc := range []struct {
		reason string
		err    Err
		want   bool
	}{
		{"confirmed", ErrNone, true},
		{"acked already (an earlier attempt's answer was lost)", ErrAlreadyAcked, true},
		{"no answer: try again", ErrTimeout, false},
		{"an error: try again", ErrOther, false},
	} {
		t.Run(tc.reason, func(t *testing.T) {
			if d := cmp.Diff(tc.want, Acked(tc.err)); d != "" {
				t.Errorf("(-want +got):\n%s", d)
			}
		})
	}
}

func TestRetries(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	ms := time.Millisecond
	for _, tc := range []struct {
		reason string
		outs   []outcome.Outcome
		want   []time.Duration
	}{
		{"a failing dependency is tried less and less often",
			[]outcome.Outcome{outcome.Retry(0, 0), outcome.Retry(0, 0), outcome.Retry(0, 0), outcome.Retry(0, 0)},
			[]time.Duration{100 * ms, 200 * ms, 400 * ms, 800 * ms}},
		{"the backoff stops growing at outcome.MaxRetryWait",
			[]outcome.Outcome{outcome.Retry(20*time.Second, 0), outcome.Retry(20*time.Second, 0), outcome.Retry(20*time.Second, 0)},
			[]time.Duration{20 * time.Second, outcome.MaxRetryWait, outcome.MaxRetryWait}},
		{"throttling and RetryAt do not count as retries",
			[]outcome.Outcome{outcome.Retry(0, 0), outcome.Throttled(3 * time.Second), outcome.RetryAt(now.Add(time.Second)), outcome.Retry(0, 0)},
			[]time.Duration{100 * ms, 3 * time.Second, time.Second, 200 * ms}},
		{"an outcome's own attempt wins over the count",
			[]outcome.Outcome{outcome.Retry(0, 0), outcome.Retry(0, 4)},
			[]time.Duration{100 * ms, 800 * ms}},
		{"a failed oldest check is retried after a second, uncounted",
			[]outcome.Outcome{CheckFailed(), CheckFailed(), CheckFailed()},
			[]time.Duration{time.Second, 2 * time.Second, 4 * time.Second}},
	} {
		t.Run(tc.reason, func(t *testing.T) {
			var r Retries
			var got []time.Duration
			for _, o := range tc.outs {
				got = append(got, r.Wait(o, now))
			}
			if d := cmp.Diff(tc.want, got); d != "" {
				t.Errorf("(-want +got):\n%s", d)
			}
		})
	}
}

func TestBeatPeriod(t *testing.T) {
	for _, tc := range []struct {
		reason             string
		configured, server time.Duration
		cur, want, wantMin time.Duration
	}{
		{"the consumer's AckWait is unset: ours", 30 * time.Second, 0, 0, 30 * time.Second, 30 * time.Second},
		{"a shorter AckWait on the consumer wins", 30 * time.Second, 10 * time.Second, 0, 10 * time.Second, 10 * time.Second},
		{"a longer one does not", 30 * time.Second, 60 * time.Second, 0, 30 * time.Second, 30 * time.Second},
		{"the owner's shortest period so far stays if shorter", 30 * time.Second, 0, 10 * time.Second, 30 * time.Second, 10 * time.Second},
		{"a shorter partition lowers the owner's", 30 * time.Second, 6 * time.Second, 10 * time.Second, 6 * time.Second, 6 * time.Second},
	} {
		t.Run(tc.reason, func(t *testing.T) {
			p := BeatPeriod(tc.configured, tc.server)
			got := []time.Duration{p, MinBeat(tc.cur, p)}
			if d := cmp.Diff([]time.Duration{tc.want, tc.wantMin}, got); d != "" {
				t.Errorf("(-want +got):\n%s", d)
			}
		})
	}
}

func TestBeatWait(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		reason string
		next   time.Time
		period time.Duration
		want   time.Duration
	}{
		{"nothing known yet: the floor, period/12", time.Time{}, 30 * time.Second, 250 * time.Millisecond},
		{"a short AckWait scans sooner at first", time.Time{}, 600 * time.Millisecond, 50 * time.Millisecond},
		{"the floor is at least 20 ms", time.Time{}, 120 * time.Millisecond, 20 * time.Millisecond},
		{"a keep-alive due at once still waits the floor", now, 30 * time.Second, 250 * time.Millisecond},
		{"the floor is at most 250 ms", time.Time{}, 60 * time.Second, 250 * time.Millisecond},
		{"sleeps until the earliest keep-alive due", now.Add(4 * time.Second), 30 * time.Second, 4 * time.Second},
		{"one overdue: the floor", now.Add(-time.Second), 30 * time.Second, 250 * time.Millisecond},
		{"never longer than period/3, for messages arriving meanwhile", now.Add(time.Minute), 30 * time.Second, 10 * time.Second},
		{"a period/3 under the floor: the floor", now.Add(time.Second), 30 * time.Millisecond, 20 * time.Millisecond},
	} {
		t.Run(tc.reason, func(t *testing.T) {
			if d := cmp.Diff(tc.want, BeatWait(now, tc.next, tc.period)); d != "" {
				t.Errorf("(-want +got):\n%s", d)
			}
		})
	}
}

func TestScan(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	s := time.Second
	type visit struct {
		last time.Time
		beat time.Duration
	}
	type res struct {
		Due  bool
		Last time.Time
	}
	for _, tc := range []struct {
		reason   string
		now      time.Time
		visits   []visit
		want     []res
		wantNext time.Time
	}{
		{"nothing held: no next", t0, nil, nil, time.Time{}},
		{"a young message is not due; the next scan is when it is", t0.Add(2 * s),
			[]visit{{t0, 30 * s}}, []res{{false, t0}}, t0.Add(10 * s)},
		{"a message kept alive beat/3 ago is due, and due again beat/3 from now", t0.Add(10 * s),
			[]visit{{t0, 30 * s}}, []res{{true, t0.Add(10 * s)}}, t0.Add(20 * s)},
		{"the next scan is the earliest of all, whatever partition", t0.Add(10 * s),
			[]visit{{t0, 30 * s}, {t0.Add(9 * s), 6 * s}, {t0.Add(5 * s), 60 * s}},
			[]res{{true, t0.Add(10 * s)}, {false, t0.Add(9 * s)}, {false, t0.Add(5 * s)}}, t0.Add(11 * s)},
	} {
		t.Run(tc.reason, func(t *testing.T) {
			sc := Scan{Now: tc.now}
			var got []res
			for _, v := range tc.visits {
				var r res
				r.Due, r.Last = sc.Visit(v.last, v.beat)
				got = append(got, r)
			}
			if d := cmp.Diff(tc.want, got); d != "" {
				t.Errorf("visits (-want +got):\n%s", d)
			}
			if d := cmp.Diff(tc.wantNext, sc.Next); d != "" {
				t.Errorf("next (-want +got):\n%s", d)
			}
		})
	}
}

// TestModeOf: every effect the core emits has a mode, so a kind added to
// the core without its driver is found here rather than dropped silently.
func TestModeOf(t *testing.T) {
	want := map[ownership.Kind]Mode{
		ownership.ReadLayout: Async, ownership.RenewMember: Async, ownership.Claim: Async, ownership.Renew: Async,
		ownership.Open: Async, ownership.Consume: Start, ownership.StopConsume: Start, ownership.Deadline: Inline,
		ownership.Cancel: Inline, ownership.Run: Inline, ownership.Drop: Inline, ownership.Reset: Async,
		ownership.DeleteLease: Async, ownership.Recover: Async, ownership.ReadFloor: Async, ownership.Leave: Async,
		ownership.Nak: Inline, ownership.Owned: Inline, ownership.Disowned: Inline,
	}
	got := map[ownership.Kind]Mode{}
	for k := ownership.Kind(0); k <= ownership.Disowned+1; k++ {
		m, ok := ModeOf(k)
		if ok {
			got[k] = m
		}
	}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("modes (-want +got):\n%s", d)
	}
}
