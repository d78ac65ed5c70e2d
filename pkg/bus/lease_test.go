package bus

import (
	"context"
	"testing"
	"time"

	"github.com/metabus/metabus/pkg/fairq"
)

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
	var errs []error
	o := &owner{js: js, kv: kv,
		c:     ConsumeConfig{Stage: WorkStage, Member: "me", Lease: OwnerLease, AckWait: WorkAckWait, OnError: func(e error) { errs = append(errs, e) }},
		parts: map[string]*partition{}, held: map[*held]struct{}{}, members: map[string]time.Time{}, wake: make(chan struct{}, 1),
		q: fairq.New[*held](fairq.Limits{PerGroup: 16, Total: 256}, nil)}
	key := LeaseKey(WorkStage, DefaultPartitions, 0)
	rev, err := kv.Create(ctx, key, []byte("me"))
	if err != nil {
		t.Fatal(err)
	}
	pctx, cancel := context.WithCancel(ctx)
	p := &partition{name: PartitionConsumerName("", DefaultPartitions, 0), n: DefaultPartitions, p: 0, rev: rev, deadline: time.Now().Add(6 * time.Second), state: partActive, ctx: pctx, cancel: cancel}
	o.parts[p.name] = p
	// A renewal applied by the server whose reply never reached the
	// owner: the lease moved on, the owner still holds the old revision.
	if _, err := kv.Update(ctx, key, []byte("me"), rev); err != nil {
		t.Fatal(err)
	}
	o.renewLeases(ctx) // the next renewal, 2 s later in real life
	e, err := kv.Get(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("lease value %q; errors: %v", e.Value(), errs)
	if p.fenced {
		t.Errorf("partition fenced although the lease is still this replica's")
	}
	if p.rev != e.Revision() {
		t.Errorf("owner holds lease revision %d, the bucket %d", p.rev, e.Revision())
	}

	// A lease another replica holds now is lost, and the partition fenced.
	if _, err := kv.Put(ctx, key, []byte("other")); err != nil {
		t.Fatal(err)
	}
	o.renewLeases(ctx)
	if !p.fenced {
		t.Errorf("partition not fenced although its lease names another replica")
	}
}
