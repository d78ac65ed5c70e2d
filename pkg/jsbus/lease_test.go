package jsbus

import (
	"context"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/metabus/metabus/pkg/bus"
	"github.com/metabus/metabus/pkg/ownership"
)

// TestRenewalAppliedButTimedOut: a renewal the server applied but whose
// reply was lost made the next renewal fail with a revision mismatch, and
// the replica fenced a partition whose lease still named it (found by
// hack/busbench under load: 147 dropped settlements in one run). A lease
// another replica holds now is lost.
func TestRenewalAppliedButTimedOut(t *testing.T) {
	connect := replicas(t, bus.Options{})
	_, js := connect()
	ctx := context.Background()
	kv, err := js.KeyValue(ctx, bus.OwnersBucket)
	if err != nil {
		t.Fatal(err)
	}
	p := ownership.Partition{N: bus.DefaultPartitions, P: 0}
	key := bus.LeaseKey(bus.WorkStage, p.N, p.P)
	rev, err := kv.Create(ctx, key, []byte("me"))
	if err != nil {
		t.Fatal(err)
	}
	// A renewal applied by the server whose reply never reached the
	// owner: the lease moved on, the owner still holds the old revision.
	if _, err := kv.Update(ctx, key, []byte("me"), rev); err != nil {
		t.Fatal(err)
	}
	got := renewLeases(ownerAPI{js}, leaseBucket{kv}, realClock{}, bus.WorkStage, "me", []ownership.Lease{{Part: p, Rev: rev}}, 2*time.Second) // the next renewal
	e, err := kv.Get(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	want := []ownership.Renewal{{Part: p, Rev: e.Revision(), Out: ownership.OK}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("renewal of a lease still this replica's (-want +got):\n%s", diff)
	}

	if _, err := kv.Put(ctx, key, []byte("other")); err != nil {
		t.Fatal(err)
	}
	got = renewLeases(ownerAPI{js}, leaseBucket{kv}, realClock{}, bus.WorkStage, "me", []ownership.Lease{{Part: p, Rev: e.Revision()}}, 2*time.Second)
	if diff := cmp.Diff([]ownership.Renewal{{Part: p, Out: ownership.Taken}}, got); diff != "" {
		t.Errorf("renewal of a lease another replica holds (-want +got):\n%s", diff)
	}
}
