package jsbus

import (
	"context"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/metabus/metabus/pkg/bus"
)

// The driver's seams (issue 33): Consume's owner reads time through a
// clock and talks to JetStream through the narrow interfaces below, each
// holding only the methods it calls, so that a test can put a fake clock
// and a fake JetStream behind them. Production uses the real clock and
// jetstream.JetStream (ownerAPI adapts it).

// clock is how the driver reads time and waits for it.
type clock interface {
	Now() time.Time
	// AfterFunc calls f on a goroutine of its own after d.
	AfterFunc(d time.Duration, f func()) timer
	// NewTimer sends the time on C after d.
	NewTimer(d time.Duration) timer
}

// timer is a clock's timer (time.Timer's methods the driver uses).
type timer interface {
	C() <-chan time.Time
	Stop() bool
	Reset(d time.Duration) bool
}

// after is time.After on c.
func after(c clock, d time.Duration) <-chan time.Time { return c.NewTimer(d).C() }

// sleep is time.Sleep on c.
func sleep(c clock, d time.Duration) { <-after(c, d) }

type realClock struct{}

func (realClock) Now() time.Time { return time.Now() }

func (realClock) AfterFunc(d time.Duration, f func()) timer {
	return realTimer{time.AfterFunc(d, f)}
}

func (realClock) NewTimer(d time.Duration) timer { return realTimer{time.NewTimer(d)} }

type realTimer struct{ *time.Timer }

func (t realTimer) C() <-chan time.Time { return t.Timer.C }

// ownerJS is what the driver uses of the JetStream API: the partition
// consumers (their state, consumption and reset), the stream's partition
// count, and the pipelined lease renewals.
type ownerJS interface {
	streamLookup
	Consumer(ctx context.Context, stream, name string) (partConsumer, error)
	ResetConsumer(ctx context.Context, stream, name string) (*jetstream.ConsumerResetResponse, error)
	// RenewAsync sends a write of key in the lease bucket conditional
	// on its revision rev, without waiting for the answer (pipelined
	// renewals).
	RenewAsync(key string, value []byte, rev uint64) (jetstream.PubAckFuture, error)
	// ServerVersion is the connected server's version (a reset that
	// proved impossible names it).
	ServerVersion() string
}

// streamLookup reads a stream (its partition count, StreamPartitions).
type streamLookup interface {
	Stream(ctx context.Context, name string) (jetstream.Stream, error)
}

// partConsumer is what the driver uses of a partition consumer.
type partConsumer interface {
	CachedInfo() *jetstream.ConsumerInfo
	Info(ctx context.Context) (*jetstream.ConsumerInfo, error)
	Consume(h jetstream.MessageHandler, opts ...jetstream.PullConsumeOpt) (jetstream.ConsumeContext, error)
}

// leaseKV is what the driver uses of the lease bucket: the member keys
// and their watch, and the leases' conditional writes. Every condition is
// an argument (JetStream's options are opaque to a fake); the driver
// passes Create and Watch no options.
type leaseKV interface {
	Get(ctx context.Context, key string) (jetstream.KeyValueEntry, error)
	Put(ctx context.Context, key string, value []byte) (uint64, error)
	Create(ctx context.Context, key string, value []byte, opts ...jetstream.KVCreateOpt) (uint64, error)
	Update(ctx context.Context, key string, value []byte, revision uint64) (uint64, error)
	// DeleteAt deletes key if its revision is rev (0: whatever it is).
	DeleteAt(ctx context.Context, key string, rev uint64) error
	Watch(ctx context.Context, keys string, opts ...jetstream.WatchOpt) (jetstream.KeyWatcher, error)
}

// leaseBucket is the real lease bucket behind leaseKV.
type leaseBucket struct{ jetstream.KeyValue }

func (b leaseBucket) DeleteAt(ctx context.Context, key string, rev uint64) error {
	if rev == 0 {
		return b.Delete(ctx, key)
	}
	return b.Delete(ctx, key, jetstream.LastRevision(rev))
}

// msgStore is what the oldest-message check of an ordered stage (order.go)
// uses of the stream: read the first message of an item from a sequence
// on, and delete one.
type msgStore interface {
	FirstFrom(ctx context.Context, stream, subj string, from uint64) (*jetstream.RawStreamMsg, error)
	DeleteMsg(ctx context.Context, stream string, seq uint64) error
}

// ownerAPI is the real JetStream behind ownerJS and msgStore.
type ownerAPI struct{ js jetstream.JetStream }

func (a ownerAPI) Stream(ctx context.Context, name string) (jetstream.Stream, error) {
	return a.js.Stream(ctx, name)
}

func (a ownerAPI) Consumer(ctx context.Context, stream, name string) (partConsumer, error) {
	c, err := a.js.Consumer(ctx, stream, name)
	if err != nil {
		return nil, err
	}
	return copyingConsumer{Consumer: c, nc: a.js.Conn()}, nil
}

func (a ownerAPI) ResetConsumer(ctx context.Context, stream, name string) (*jetstream.ConsumerResetResponse, error) {
	return a.js.ResetConsumer(ctx, stream, name)
}

// RenewAsync publishes where KeyValue.Update does, with the same
// condition.
func (a ownerAPI) RenewAsync(key string, value []byte, rev uint64) (jetstream.PubAckFuture, error) {
	return a.js.PublishMsgAsync(&nats.Msg{Subject: kvPutSubject(key), Data: value}, jetstream.WithExpectLastSequencePerSubject(rev))
}

func (a ownerAPI) ServerVersion() string { return a.js.Conn().ConnectedServerVersion() }

func (a ownerAPI) FirstFrom(ctx context.Context, stream, subj string, from uint64) (*jetstream.RawStreamMsg, error) {
	return firstFrom(ctx, a.js, stream, subj, from)
}

func (a ownerAPI) DeleteMsg(ctx context.Context, stream string, seq uint64) error {
	return deleteMsg(ctx, a.js, stream, seq)
}

// kvPutSubject is where a write of key in the lease bucket is published
// (KeyValue.Put and Update publish there; metabus uses no JetStream domain).
func kvPutSubject(key string) string { return "$KV." + bus.OwnersBucket + "." + key }
