package jsbus

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/metabus/metabus/internal/testing/testnats"
	"github.com/metabus/metabus/pkg/bus"
	"github.com/metabus/metabus/pkg/outcome"
)

// TestLeaderMoveRepulls: when a partition consumer's leader moves in a
// NATS cluster, the pull requests the old leader held are void. The new
// leader says so (a 409 Leadership Change to each of them), and the
// consumption pulls again at once; nothing waits for a missed idle
// heartbeat, the client's other way of finding a lost pull. Here the
// heartbeat is the longest the client allows (30 s, so a lost pull is
// found 30 to 60 s after the move), and an item published after each move
// must be handled within 20 s: only the notice can do that. The moves are
// not reported as errors: the client recovers.
func TestLeaderMoveRepulls(t *testing.T) {
	if testing.Short() {
		t.Skip("runs three nats-server processes")
	}
	c := testnats.StartCluster(t, "../../deploy/nats/nats-server.conf")
	admin, err := c.Connect(testnats.AdminUser)
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	js, err := jetstream.New(admin)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	o := bus.Options{Replicas: 3, Partitions: 1}
	retry(t, ctx, "ensure the streams", func(ctx context.Context) error { return Ensure(ctx, js, o) })
	consumer := bus.PartitionConsumerName(bus.WorkConsumerPrefix, 1, 0)

	var mu sync.Mutex
	var reported []string
	handled := make(chan string, 16)
	cctx, ccancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = Consume(cctx, js, ConsumeConfig{
			Stream: bus.WorkStream, Prefix: bus.WorkConsumerPrefix, Stage: bus.WorkStage, PerController: 4,
			OnError: func(err error) {
				t.Logf("consume: %v", err)
				mu.Lock()
				reported = append(reported, err.Error())
				mu.Unlock()
			},
			pullHeartbeat: 30 * time.Second,
		}, func(_ context.Context, m jetstream.Msg) outcome.Outcome {
			var it bus.WorkItem
			if err := Decode(m, bus.TypeSyncRequested, &it); err == nil {
				handled <- it.Parent.UID
			}
			return outcome.Done()
		})
	}()
	defer func() { ccancel(); <-done }()

	pub := Publisher{JS: js}
	handle := func(uid string, within time.Duration) {
		t.Helper()
		retry(t, ctx, "publish "+uid, func(ctx context.Context) error {
			_, err := pub.PublishWork(ctx, item("c", uid))
			return err
		})
		start := time.Now()
		deadline := time.After(within)
		for {
			select {
			case got := <-handled:
				if got == uid {
					t.Logf("%s handled %s after its publish", uid, time.Since(start).Round(time.Millisecond))
					return
				}
			case <-deadline:
				t.Fatalf("work item %s not handled within %s", uid, within)
			}
		}
	}
	handle("before", time.Minute)

	for i := range 2 {
		var before string
		retry(t, ctx, "the consumer's leader", func(ctx context.Context) (err error) {
			before, err = c.ConsumerLeader(ctx, js, bus.WorkStream, consumer)
			return err
		})
		retry(t, ctx, "step the consumer's leader down", func(ctx context.Context) error {
			return testnats.StepDownConsumer(ctx, admin, bus.WorkStream, consumer)
		})
		retry(t, ctx, "a new leader", func(ctx context.Context) error {
			now, err := c.ConsumerLeader(ctx, js, bus.WorkStream, consumer)
			if err == nil && now == before {
				err = fmt.Errorf("still %s", now)
			}
			return err
		})
		handle(fmt.Sprintf("after-move-%d", i), 20*time.Second)
	}
	mu.Lock()
	defer mu.Unlock()
	for _, r := range reported {
		if strings.Contains(strings.ToLower(r), "leadership") {
			t.Errorf("a leader move was reported as an error: %s", r)
		}
	}
}

// retry runs f (each try bounded by 5 s) until it succeeds or ctx ends:
// while a leader moves, a cluster answers some requests with errors.
func retry(t *testing.T, ctx context.Context, what string, f func(context.Context) error) {
	t.Helper()
	var err error
	for {
		rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		err = f(rctx)
		cancel()
		if err == nil {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("%s: %v", what, errors.Join(err, ctx.Err()))
		case <-time.After(200 * time.Millisecond):
		}
	}
}
