package jsbus

import (
	"context"
	"encoding/json"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/metabus/metabus/pkg/bus"
)

// faultyJS fails selected JetStream calls ("stream", "get", "publish",
// "delete") the first n times, as a NATS leader move or a restart does.
type faultyJS struct {
	jetstream.JetStream
	f *faults
}

type faults struct {
	mu    sync.Mutex
	op    string
	left  int
	err   error
	calls map[string]int
}

func (f *faults) check(op string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.calls == nil {
		f.calls = map[string]int{}
	}
	f.calls[op]++
	if op == f.op && f.left > 0 {
		f.left--
		return f.err
	}
	return nil
}

func (j faultyJS) PublishMsg(ctx context.Context, msg *nats.Msg, opts ...jetstream.PublishOpt) (*jetstream.PubAck, error) {
	if err := j.f.check("publish"); err != nil {
		return nil, err
	}
	return j.JetStream.PublishMsg(ctx, msg, opts...)
}

func (j faultyJS) Stream(ctx context.Context, name string) (jetstream.Stream, error) {
	if err := j.f.check("stream"); err != nil {
		return nil, err
	}
	s, err := j.JetStream.Stream(ctx, name)
	if err != nil {
		return nil, err
	}
	return faultyStream{Stream: s, f: j.f}, nil
}

type faultyStream struct {
	jetstream.Stream
	f *faults
}

func (s faultyStream) GetMsg(ctx context.Context, seq uint64, opts ...jetstream.GetMsgOpt) (*jetstream.RawStreamMsg, error) {
	if err := s.f.check("get"); err != nil {
		return nil, err
	}
	return s.Stream.GetMsg(ctx, seq, opts...)
}

func (s faultyStream) DeleteMsg(ctx context.Context, seq uint64) error {
	if err := s.f.check("delete"); err != nil {
		return err
	}
	return s.Stream.DeleteMsg(ctx, seq)
}

// publishAdvisory stores a MAX_DELIVERIES advisory for seq of MC_WORK in
// MC_ADV, as the server does after MaxDeliver.
func publishAdvisory(t *testing.T, js jetstream.JetStream, data []byte) {
	t.Helper()
	subj := "$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES." + bus.WorkStream + "." + bus.PartitionConsumerName(bus.WorkConsumerPrefix, bus.DefaultPartitions, 0)
	if _, err := js.Publish(context.Background(), subj, data); err != nil {
		t.Fatalf("publish advisory: %v", err)
	}
}

// TestDeadLetterRetriesTransientErrors (issue 13 #5): a dead-letter move
// that fails for a transient reason (NATS unavailable, a timeout) must be
// retried, not terminated: a terminated advisory leaves the poison message
// in MC_WORK for good, holding one of its parent's two per-subject slots.
// Only permanent failures (a malformed advisory, a message already gone)
// end the advisory.
func TestDeadLetterRetriesTransientErrors(t *testing.T) {
	cases := []struct {
		reason    string
		op        string // which call fails
		times     int
		err       error
		malformed bool // the advisory itself is garbage
		gone      bool // the advisory names a message no longer stored
		wantDead  bool
		wantErrs  int // onError calls at least
	}{
		{reason: "stream lookup gets no responders (NATS restarting)", op: "stream", times: 1, err: nats.ErrNoResponders, wantDead: true, wantErrs: 1},
		{reason: "reading the poison message times out", op: "get", times: 1, err: context.DeadlineExceeded, wantDead: true, wantErrs: 1},
		{reason: "parking in MC_DLQ times out twice", op: "publish", times: 2, err: nats.ErrTimeout, wantDead: true, wantErrs: 2},
		{reason: "deleting from MC_WORK fails after parking: retried, parked once", op: "delete", times: 1, err: nats.ErrConnectionClosed, wantDead: true, wantErrs: 1},
		{reason: "malformed advisory is terminated", malformed: true, wantErrs: 1},
		{reason: "advisory for a message already gone is settled quietly", gone: true},
	}
	for i, tc := range cases {
		t.Run(tc.reason, func(t *testing.T) {
			// Each case has its own server and faults, and spends its
			// seconds waiting for the worker's retries or for a dead
			// letter that must not come.
			t.Parallel()
			raw := startBus(t, bus.Options{})
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			f := &faults{op: tc.op, left: tc.times, err: tc.err}
			js := faultyJS{JetStream: raw, f: f}
			var errs atomic.Int32
			dead := make(chan DeadLetter, 4)
			rctx, rcancel := context.WithCancel(ctx)
			defer rcancel()
			go func() {
				_ = RunDLQ(rctx, js, func(d DeadLetter) { dead <- d }, func(err error) {
					errs.Add(1)
					if rctx.Err() == nil {
						t.Logf("onError: %v", err)
					}
				})
			}()

			it := item("poison", "dead-retry-"+string(rune('a'+i)))
			if _, err := (Publisher{JS: raw}).PublishWork(ctx, it); err != nil {
				t.Fatal(err)
			}
			work, err := raw.Stream(ctx, bus.WorkStream)
			if err != nil {
				t.Fatal(err)
			}
			stored, err := work.GetLastMsgForSubject(ctx, bus.StoredWorkSubject(it.Controller.ID(), it.Parent.UID))
			if err != nil {
				t.Fatal(err)
			}
			adv := maxDeliveriesAdvisory{Stream: bus.WorkStream, Consumer: bus.PartitionConsumerName(bus.WorkConsumerPrefix, bus.DefaultPartitions, 0), StreamSeq: stored.Sequence, Deliveries: bus.MaxDeliver}
			if tc.gone {
				adv.StreamSeq = stored.Sequence + 1000
			}
			data, _ := json.Marshal(adv)
			if tc.malformed {
				data = []byte("{not json")
			}
			publishAdvisory(t, raw, data)

			wait := 2 * time.Second
			if tc.wantDead {
				wait = 10 * time.Second
			}
			var got *DeadLetter
			select {
			case d := <-dead:
				got = &d
			case <-time.After(wait):
			}
			if tc.wantDead && got == nil {
				t.Fatalf("%s: not dead-lettered (onError %d times, calls %v)", tc.reason, errs.Load(), f.calls)
			}
			if !tc.wantDead && got != nil {
				t.Fatalf("%s: unexpected dead letter %+v", tc.reason, *got)
			}
			if n := int(errs.Load()); n < tc.wantErrs {
				t.Errorf("%s: onError called %d times, want at least %d", tc.reason, n, tc.wantErrs)
			}
			_, err = work.GetMsg(ctx, stored.Sequence)
			if tc.wantDead && !errors.Is(err, jetstream.ErrMsgNotFound) {
				t.Errorf("%s: poison message still in %s (err %v): it holds one of the parent's slots", tc.reason, bus.WorkStream, err)
			}
			if !tc.wantDead && err != nil {
				t.Errorf("%s: work message touched: %v", tc.reason, err)
			}
			dlq, err := raw.Stream(ctx, bus.DLQStream)
			if err != nil {
				t.Fatal(err)
			}
			info, err := dlq.Info(ctx)
			if err != nil {
				t.Fatal(err)
			}
			wantParked := uint64(0)
			if tc.wantDead {
				wantParked = 1
			}
			if info.State.Msgs != wantParked {
				t.Errorf("%s: %d messages parked in %s, want %d", tc.reason, info.State.Msgs, bus.DLQStream, wantParked)
			}
			// The advisory is settled either way: nothing left in MC_ADV
			// and nothing redelivered.
			deadline := time.Now().Add(5 * time.Second)
			for {
				advs, err := raw.Stream(ctx, bus.AdvisoryStream)
				if err != nil {
					t.Fatal(err)
				}
				ai, err := advs.Info(ctx)
				if err != nil {
					t.Fatal(err)
				}
				if ai.State.Msgs == 0 {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("%s: advisory never settled (%d left in %s)", tc.reason, ai.State.Msgs, bus.AdvisoryStream)
				}
				time.Sleep(100 * time.Millisecond)
			}
		})
	}
}
