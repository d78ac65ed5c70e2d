package jsbus

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/metabus/metabus/internal/testing/testnats"
	"github.com/metabus/metabus/pkg/bus"
	"github.com/metabus/metabus/pkg/ownership"
)

// TestHandoverWithoutResetPermission: replicas whose NATS user may not
// reset consumers (a deployment whose permissions predate issue 24) still
// hand partitions over, without waiting for AckWait: the server drops the
// denied request, so the reset goes unanswered while the consumer's info
// answers, and the owner takes that as a consumer that cannot be reset
// (what it left pending comes back after AckWait, counted, as before). A
// reset that goes unanswered for any other reason is retried while the
// lease holds, however long it takes, so that no handover counts a
// delivery; without that distinction this handover would never end.
func TestHandoverWithoutResetPermission(t *testing.T) {
	t.Parallel() // waits out leases and AckWaits, on a server of its own
	const ackWait = 20 * time.Second
	s := testnats.Serve(t, &server.Options{
		Host: "127.0.0.1", Port: -1, JetStream: true, StoreDir: t.TempDir(),
		Users: []*server.User{{Username: "app", Password: "app", Permissions: &server.Permissions{
			Publish: &server.SubjectPermission{Allow: []string{">"}, Deny: []string{"$JS.API.CONSUMER.RESET.>"}},
		}}},
	})
	connect := func() jetstream.JetStream {
		nc, err := nats.Connect(s.ClientURL(), nats.UserInfo("app", "app"), nats.ErrorHandler(func(*nats.Conn, *nats.Subscription, error) {}))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(nc.Close)
		js, err := jetstream.New(nc)
		if err != nil {
			t.Fatal(err)
		}
		return js
	}
	js := connect()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if err := Ensure(ctx, js, bus.Options{OwnerLease: time.Second, DesiredAckWait: ackWait, Partitions: 1}); err != nil {
		t.Fatal(err)
	}
	if _, err := js.ResetConsumer(ctx, bus.DesiredStream, bus.DesiredConsumerPrefix+bus.PartitionConsumerName("", 1, 0)); err == nil {
		t.Fatal("the user may reset consumers: the test's permissions are wrong")
	}
	a := newApplied(t)
	slow := func(replica string) Handler { return a.slowHandler(replica, 200*time.Millisecond) }
	pub := Publisher{JS: js}
	parents := parentUIDs(20)
	for i, p := range parents {
		if err := pub.PublishDesired(ctx, desired("c", p, uint64(i+1))); err != nil {
			t.Fatal(err)
		}
	}
	// a hands the partition over: its reset is the one that fails. It
	// must be counted and reported, naming the server's version.
	aObs := newOwnership()
	var (
		errMu   sync.Mutex
		aErrors []error
	)
	aDone := make(chan struct{})
	go func() {
		defer close(aDone)
		_ = Consume(ctx, connect(), ConsumeConfig{Stream: bus.DesiredStream, Prefix: bus.DesiredConsumerPrefix, Stage: bus.DesiredStage,
			PerController: 8, AckWait: ackWait, Ordered: true, Member: "a", Ownership: aObs,
			OnError: func(err error) { errMu.Lock(); aErrors = append(aErrors, err); errMu.Unlock() }}, slow("a"))
	}()
	time.Sleep(1500 * time.Millisecond)
	b := winner("b", "a")
	start := time.Now()
	bDone := consumeDesired(ctx, connect(), b, ackWait, slow(b))
	kv, err := js.KeyValue(ctx, bus.OwnersBucket)
	if err != nil {
		t.Fatal(err)
	}
	key := bus.LeaseKey(bus.DesiredStage, 1, 0)
	// b's join (2 s), a's running handlers, the unanswered reset (5 s),
	// a lease tick: well within AckWait.
	waitFor(t, ackWait*3/4, b+" owns the partition", func() bool {
		e, err := kv.Get(ctx, key)
		return err == nil && string(e.Value()) == b
	})
	t.Logf("%s owns the partition %s after it started", b, time.Since(start).Round(time.Millisecond))
	waitFor(t, 2*ackWait, "every desired state applied", func() bool {
		for i, p := range parents {
			if a.last(p) != uint64(i+1) {
				return false
			}
		}
		return true
	})
	cancel()
	<-aDone
	<-bDone
	aObs.mu.Lock()
	unsupported := aObs.resetFailed[bus.DesiredStage+"/"+ResetUnsupported]
	aObs.mu.Unlock()
	if unsupported == 0 {
		t.Errorf("resets counted as failed %v, want %s/%s", aObs.resetFailed, bus.DesiredStage, ResetUnsupported)
	}
	errMu.Lock()
	defer errMu.Unlock()
	var reported []error
	for _, err := range aErrors {
		if errors.Is(err, ownership.ErrCannotReset) {
			reported = append(reported, err)
		}
	}
	if len(reported) != 1 || !strings.Contains(reported[0].Error(), "NATS server "+server.VERSION) || !strings.Contains(reported[0].Error(), "permission") {
		t.Errorf("a reported %d reset failures %v, want one naming server %s and the missing permission", len(reported), reported, server.VERSION)
	}
}

// TestCannotResetReportedOnce: every handover of a replica meets a server
// that cannot reset again; each is counted, the first alone reported.
func TestCannotResetReportedOnce(t *testing.T) {
	_, js := replicas(t, bus.Options{Partitions: 1})()
	obs := newOwnership()
	var reported []error
	o := &owner{js: ownerAPI{js}, c: ConsumeConfig{Stage: bus.WorkStage, Ownership: obs, OnError: func(err error) { reported = append(reported, err) }}}
	for i := range 3 {
		o.cannotResetOnce(fmt.Errorf("reset consumer MC_WORK/p%d: %w", i, ownership.ErrCannotReset))
	}
	if diff := cmp.Diff(map[string]int{bus.WorkStage + "/" + ResetUnsupported: 3}, obs.resetFailed); diff != "" {
		t.Errorf("counted (-want +got):\n%s", diff)
	}
	if len(reported) != 1 || !errors.Is(reported[0], ownership.ErrCannotReset) || !strings.Contains(reported[0].Error(), "MC_WORK/p0") {
		t.Errorf("reported %v, want the first failure alone", reported)
	}
}
