package jsbus

import (
	"context"
	"errors"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// faultJS is a replica's JetStream API with faults injected at the client:
// while slow, stream and consumer lookups hang for delay or until their
// context ends, and lease bucket reads and writes (and asynchronous
// publishes, which renew leases) fail at once, as when the meta leader is
// being elected or the server is overloaded; while layoutFails, stream
// lookups (the partition count's reads) fail at once. Message delivery,
// acks and keep-alives go through the connection untouched.
type faultJS struct {
	jetstream.JetStream
	delay       time.Duration
	slow        atomic.Bool
	layoutFails atomic.Bool
	// stale, if set, is what the next stream lookup returns (then stream
	// lookups fail while layoutFails): a replica that read the partition
	// count just before a cut-over began.
	stale atomic.Pointer[jetstream.Stream]
}

var errInjected = errors.New("injected JetStream API fault")

func (f *faultJS) hang(ctx context.Context) error {
	if !f.slow.Load() {
		return nil
	}
	t := time.NewTimer(f.delay)
	defer t.Stop()
	select {
	case <-t.C:
		return context.DeadlineExceeded
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (f *faultJS) Stream(ctx context.Context, name string) (jetstream.Stream, error) {
	if s := f.stale.Swap(nil); s != nil {
		return *s, nil
	}
	if f.layoutFails.Load() {
		return nil, errInjected
	}
	if err := f.hang(ctx); err != nil {
		return nil, err
	}
	return f.JetStream.Stream(ctx, name)
}

func (f *faultJS) Consumer(ctx context.Context, stream, name string) (jetstream.Consumer, error) {
	if err := f.hang(ctx); err != nil {
		return nil, err
	}
	return f.JetStream.Consumer(ctx, stream, name)
}

func (f *faultJS) ResetConsumer(ctx context.Context, stream, name string) (*jetstream.ConsumerResetResponse, error) {
	if err := f.hang(ctx); err != nil {
		return nil, err
	}
	return f.JetStream.ResetConsumer(ctx, stream, name)
}

func (f *faultJS) KeyValue(ctx context.Context, bucket string) (jetstream.KeyValue, error) {
	kv, err := f.JetStream.KeyValue(ctx, bucket)
	if err != nil {
		return nil, err
	}
	return &faultKV{KeyValue: kv, f: f}, nil
}

func (f *faultJS) PublishMsgAsync(m *nats.Msg, opts ...jetstream.PublishOpt) (jetstream.PubAckFuture, error) {
	if f.slow.Load() {
		return nil, errInjected
	}
	return f.JetStream.PublishMsgAsync(m, opts...)
}

// fail fails a lease bucket call while the API is slow.
func (f *faultJS) fail() error {
	if f.slow.Load() {
		return errInjected
	}
	return nil
}

type faultKV struct {
	jetstream.KeyValue
	f *faultJS
}

func (k *faultKV) Get(ctx context.Context, key string) (jetstream.KeyValueEntry, error) {
	if err := k.f.fail(); err != nil {
		return nil, err
	}
	return k.KeyValue.Get(ctx, key)
}

func (k *faultKV) Put(ctx context.Context, key string, v []byte) (uint64, error) {
	if err := k.f.fail(); err != nil {
		return 0, err
	}
	return k.KeyValue.Put(ctx, key, v)
}

func (k *faultKV) Create(ctx context.Context, key string, v []byte, opts ...jetstream.KVCreateOpt) (uint64, error) {
	if err := k.f.fail(); err != nil {
		return 0, err
	}
	return k.KeyValue.Create(ctx, key, v, opts...)
}

func (k *faultKV) Update(ctx context.Context, key string, v []byte, rev uint64) (uint64, error) {
	if err := k.f.fail(); err != nil {
		return 0, err
	}
	return k.KeyValue.Update(ctx, key, v, rev)
}

func (k *faultKV) Delete(ctx context.Context, key string, opts ...jetstream.KVDeleteOpt) error {
	if err := k.f.fail(); err != nil {
		return err
	}
	return k.KeyValue.Delete(ctx, key, opts...)
}
