package bus

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/metabus/metabus/pkg/fairq"
)

// lateKV applies one Update on the server but reports a timeout, as a
// client does when the reply comes later than its deadline.
type lateKV struct {
	jetstream.KeyValue
	fail atomic.Bool
}

func (k *lateKV) Update(ctx context.Context, key string, value []byte, rev uint64) (uint64, error) {
	r, err := k.KeyValue.Update(ctx, key, value, rev)
	if err == nil && k.fail.CompareAndSwap(true, false) {
		return 0, context.DeadlineExceeded
	}
	return r, err
}

// TestRenewalAppliedButTimedOut: a renewal the server applied but whose
// reply was lost made the next renewal fail with a revision mismatch, and
// the replica fenced a partition whose lease still named it (found by
// hack/busbench under load: 147 dropped settlements in one run).
func TestRenewalAppliedButTimedOut(t *testing.T) {
	connect := replicas(t, Options{})
	_, js := connect()
	ctx := context.Background()
	kv, err := js.KeyValue(ctx, OwnersBucket)
	if err != nil {
		t.Fatal(err)
	}
	lk := &lateKV{KeyValue: kv}
	var errs []error
	o := &owner{js: js, kv: lk,
		c:     ConsumeConfig{Stage: WorkStage, Member: "me", Lease: OwnerLease, AckWait: WorkAckWait, OnError: func(e error) { errs = append(errs, e) }},
		parts: map[string]*partition{}, held: map[*held]struct{}{}, members: map[string]time.Time{}, wake: make(chan struct{}, 1),
		q: fairq.New[*held](fairq.Limits{PerGroup: 16, Total: 256}, nil)}
	rev, err := kv.Create(ctx, LeaseKey(WorkStage, DefaultPartitions, 0), []byte("me"))
	if err != nil {
		t.Fatal(err)
	}
	pctx, cancel := context.WithCancel(ctx)
	p := &partition{name: PartitionConsumerName("", DefaultPartitions, 0), n: DefaultPartitions, p: 0, rev: rev, deadline: time.Now().Add(6 * time.Second), state: partActive, ctx: pctx, cancel: cancel}
	o.parts[p.name] = p
	lk.fail.Store(true)
	o.renewLeases(ctx) // applied by the server, the reply "lost"
	o.renewLeases(ctx) // the next renewal, 2 s later in real life
	e, _ := kv.Get(ctx, LeaseKey(WorkStage, DefaultPartitions, 0))
	t.Logf("lease value %q; errors: %v", e.Value(), errs)
	if p.fenced {
		t.Errorf("partition fenced although the lease is still this replica's")
	}
}
