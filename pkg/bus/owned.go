package bus

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/metabus/metabus/pkg/fairq"
)

// DefaultMaxInFlight is the default Total of a replica.
const DefaultMaxInFlight = 256

// ConsumeConfig tunes Consume. Stream, Prefix and Stage are required.
type ConsumeConfig struct {
	// Stream and Prefix name the partition consumers <Prefix>pNN of Stream.
	Stream, Prefix string
	// Stage names the lease namespace (WorkStage, DesiredStage).
	Stage string
	// PerController bounds the messages of one controller running at once
	// in this replica (upstream's --workers, which is per controller).
	PerController int
	// Total bounds the messages running at once in this replica; when it
	// is reached, controllers share it by Weight.
	Total int
	// Weight (optional) is a controller's share of Total when saturated;
	// by default each message's weight extension (ExtWeight) says it.
	Weight func(ctrlID string) int
	// AckWait is the partition consumers' AckWait: held messages are kept
	// alive every AckWait/3.
	AckWait time.Duration
	// Lease is the owner lease; the lease bucket's TTL overrides it.
	Lease time.Duration
	// Ordered: a parent's messages must run in stream order even across a
	// takeover. A replica that takes a partition over while another
	// replica's messages are still unacknowledged waits (up to AckWait)
	// for them to come back first. MC_DESIRED needs it; MC_WORK does not
	// (a work item means "sync now", whatever its age).
	//
	// An ordered stage also runs a message only when it is the oldest of
	// its item left in the stream (order.go): older ones left behind by a
	// takeover or a handover are deleted as superseded, and a message no
	// longer in the stream is not run.
	Ordered bool
	// KeepOlder (ordered stages, optional) says, of an older message found
	// in the stream, that it must not be deleted as superseded: it runs
	// whenever it comes back (its effect does not depend on order).
	KeepOlder func(h nats.Header, data []byte) bool
	// Member is this replica's member id (default: host, pid and a random
	// suffix).
	Member string
	// OnError (optional) receives consumer and lease errors.
	OnError func(error)
	// Ownership (optional) is told of every partition claimed and
	// released (metrics).
	Ownership OwnershipObserver
}

// Consume runs h for the messages of the partitions this replica owns until
// ctx is done, then hands its partitions back.
//
// Topology (design.md §2, revised): each partition consumer is consumed by
// exactly one replica at a time, the holder of the partition's lease in
// OwnersBucket; replicas share the partitions by rendezvous hashing over
// the live members and hand partitions over gracefully when membership
// changes. The owner holds many messages of a partition at once and
// serializes them per parent itself (package fairq): one message per
// parent at a time, in stream order; at most PerController running per
// controller, so one controller's hanging hook holds only its own share;
// Total shared between controllers by weight. Concurrency thus scales with
// replicas × workers, not with the partition count, and a slow parent
// blocks no other parent.
//
// A handler's NakWithDelay retries the message in place after the delay,
// keeping its parent's turn: a redelivery through the server could let the
// parent's next message overtake it. A handler's ctx is cancelled when the
// replica loses the partition's lease; its settlement is then dropped and
// the message goes to the new owner after AckWait.
func Consume(ctx context.Context, js jetstream.JetStream, c ConsumeConfig, h Handler) error {
	if c.Lease <= 0 {
		c.Lease = OwnerLease
	}
	if c.AckWait <= 0 {
		c.AckWait = WorkAckWait
	}
	if c.Member == "" {
		c.Member = NewMemberID()
	}
	if c.OnError == nil {
		c.OnError = func(error) {}
	}
	kv, err := js.KeyValue(ctx, OwnersBucket)
	if err != nil {
		return fmt.Errorf("open lease bucket %s: %w", OwnersBucket, err)
	}
	// The lease is the bucket's TTL, whoever created it: fencing must
	// happen before the server lets the lease expire.
	if st, err := kv.Status(ctx); err == nil && st.TTL() > 0 {
		c.Lease = st.TTL()
	}
	if c.PerController <= 0 {
		c.PerController = 16
	}
	if c.Total <= 0 {
		c.Total = DefaultMaxInFlight
	}
	n, err := StreamPartitions(ctx, js, c.Stream)
	if err != nil {
		return err
	}
	o := &owner{
		js: js, kv: kv, c: c, h: h, n: n,
		parts:   map[string]*partition{},
		weights: map[string]int{},
		held:    map[*held]struct{}{},
		members: map[string]time.Time{},
		wake:    make(chan struct{}, 1),
		jobs:    make(chan job),
		quit:    make(chan struct{}),
	}
	weight := c.Weight
	if weight == nil {
		// Called by the queue under o.mu.
		weight = func(ctrlID string) int { return o.weights[ctrlID] }
	}
	o.q = fairq.New[*held](fairq.Limits{PerGroup: c.PerController, Total: c.Total}, weight)
	defer close(o.quit)
	return o.run(ctx)
}

// NewMemberID returns a replica id: hostname, pid and a random suffix, as
// a KV key token.
func NewMemberID() string {
	host, _ := os.Hostname()
	var b [4]byte
	_, _ = rand.Read(b[:])
	id := fmt.Sprintf("%s-%d-%s", host, os.Getpid(), hex.EncodeToString(b[:]))
	return strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_' {
			return r
		}
		return '_'
	}, id)
}

type owner struct {
	js jetstream.JetStream
	kv jetstream.KeyValue
	c  ConsumeConfig
	h  Handler

	mu      sync.Mutex
	q       *fairq.Queue[*held]
	parts   map[string]*partition // by partition name (<N>-pNN)
	held    map[*held]struct{}    // every message in hand: waiting or running
	members map[string]time.Time
	n       int            // the stream's partition count, read every lease tick
	weights map[string]int // per controller, from the messages' weight extension
	wake    chan struct{}
	jobs    chan job      // to idle handler goroutines
	quit    chan struct{} // closed when Consume returns: idle handlers exit
	// minBeat is the shortest keep-alive period of any partition (the
	// consumers' AckWait may be shorter than this replica's setting).
	minBeat atomic.Int64
	running sync.WaitGroup
}

type partState int

const (
	partWaiting   partState = iota // lease taken; waiting for a previous owner's messages
	partActive                     // consuming
	partReleasing                  // handing back: naks what arrives, waits for what runs
)

type partition struct {
	name     string    // <N>-pNN: the consumer's name without prefix, the lease's last token
	n, p     int       // layout and index
	rev      uint64    // lease revision
	deadline time.Time // stop consuming by then unless renewed
	state    partState
	since    time.Time
	cc       jetstream.ConsumeContext
	ctx      context.Context // handlers' context
	cancel   context.CancelFunc
	beat     time.Duration // keep-alive period of its held messages
	fenced   bool          // lease lost: drop every settlement
	running  int
	idle     chan struct{} // closed when running drops to 0 while releasing
}

// held is one message in hand. Its methods settle through the real
// message unless the partition was fenced.
type held struct {
	jetstream.Msg
	o        *owner
	part     *partition
	group    string
	key      string
	seq      uint64
	lastBeat time.Time
	retry    time.Duration // set by NakWithDelay: run again after it
	settled  bool
}

var errFenced = errors.New("partition lease lost: settlement dropped, the new owner gets the message")

func (m *held) fenced() bool {
	m.o.mu.Lock()
	defer m.o.mu.Unlock()
	return m.part.fenced
}

func (m *held) settle(f func() error) error {
	if m.fenced() {
		return errFenced
	}
	m.settled = true
	return f()
}

func (m *held) Ack() error { return m.settle(m.Msg.Ack) }
func (m *held) DoubleAck(ctx context.Context) error {
	return m.settle(func() error { return m.Msg.DoubleAck(ctx) })
}
func (m *held) Term() error { return m.settle(m.Msg.Term) }
func (m *held) TermWithReason(r string) error {
	return m.settle(func() error { return m.Msg.TermWithReason(r) })
}

// Nak and NakWithDelay retry in place (see Consume).
func (m *held) Nak() error { return m.NakWithDelay(100 * time.Millisecond) }
func (m *held) NakWithDelay(d time.Duration) error {
	if m.fenced() {
		return errFenced
	}
	if d <= 0 {
		d = 100 * time.Millisecond
	}
	m.retry = d
	return nil
}
func (m *held) InProgress() error {
	if m.fenced() {
		return errFenced
	}
	return m.Msg.InProgress()
}

type newerKey struct{}

// NewerQueued reports whether, when a Consume handler was called, a later
// message of the same parent was already held behind this one: for desired
// states, this one is superseded.
func NewerQueued(ctx context.Context) bool {
	v, _ := ctx.Value(newerKey{}).(bool)
	return v
}

func (o *owner) poke() {
	select {
	case o.wake <- struct{}{}:
	default:
	}
}

func (o *owner) run(ctx context.Context) error {
	watch, err := o.kv.Watch(ctx, memberKey(o.c.Stage, "*"))
	if err != nil {
		return fmt.Errorf("watch %s members: %w", o.c.Stage, err)
	}
	defer func() { _ = watch.Stop() }()
	updates := watch.Updates()
	// Join, and learn who else is there before claiming anything, so a
	// replica joining a running stage takes only its share.
	o.renewMember(ctx)
	initial := time.NewTimer(2 * time.Second)
	for done := false; !done; {
		select {
		case e, ok := <-updates:
			if !ok || e == nil {
				done = true
				break
			}
			o.noteMember(e)
		case <-initial.C:
			done = true
		case <-ctx.Done():
			return nil
		}
	}
	initial.Stop()

	dctx, stopDispatch := context.WithCancel(context.Background())
	dispatchDone := make(chan struct{})
	go func() { defer close(dispatchDone); o.dispatch(dctx) }()
	beatDone := make(chan struct{})
	go func() { defer close(beatDone); o.heartbeat(dctx) }()

	tick := time.NewTicker(o.c.Lease / 5)
	defer tick.Stop()
	// Deadlines are checked often and without network calls: a renewal
	// stuck on an unreachable server must not delay the fence past the
	// lease's expiry.
	fence := time.NewTicker(max(o.c.Lease/20, 10*time.Millisecond))
	defer fence.Stop()
	o.balance(ctx)
loop:
	for {
		select {
		case <-ctx.Done():
			break loop
		case e, ok := <-updates:
			if !ok {
				// The watch ended (server gone): renewals still fence us
				// in time; watch again on the next tick.
				updates = nil
				continue
			}
			if e != nil && o.noteMember(e) {
				o.balance(ctx)
			}
		case <-fence.C:
			o.fenceExpired()
		case <-tick.C:
			if updates == nil {
				if w, err := o.kv.Watch(ctx, memberKey(o.c.Stage, "*")); err != nil {
					o.c.OnError(fmt.Errorf("watch %s members: %w", o.c.Stage, err))
				} else {
					_ = watch.Stop()
					watch, updates = w, w.Updates()
				}
			}
			o.renewMember(ctx)
			o.renewLeases(ctx)
			o.refreshLayout(ctx, 0)
			o.balance(ctx)
		}
	}
	// Hand every partition back, then leave. Leases are renewed until
	// then: handlers still running must not lose them.
	renewCtx, stopRenew := context.WithCancel(context.Background())
	defer stopRenew()
	go func() {
		t := time.NewTicker(o.c.Lease / 5)
		defer t.Stop()
		for {
			select {
			case <-renewCtx.Done():
				return
			case <-t.C:
				o.renewLeases(renewCtx)
			}
		}
	}()
	o.mu.Lock()
	var all []*partition
	for _, p := range o.parts {
		all = append(all, p)
	}
	o.mu.Unlock()
	var wg sync.WaitGroup
	for _, p := range all {
		wg.Add(1)
		go func() { defer wg.Done(); o.release(p) }()
	}
	wg.Wait()
	o.running.Wait()
	stopDispatch()
	<-dispatchDone
	<-beatDone
	dl, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_ = o.kv.Delete(dl, memberKey(o.c.Stage, o.c.Member))
	return nil
}

// noteMember records a member update; it reports whether the member set
// changed.
func (o *owner) noteMember(e jetstream.KeyValueEntry) bool {
	id := strings.TrimPrefix(e.Key(), "member."+o.c.Stage+".")
	o.mu.Lock()
	defer o.mu.Unlock()
	_, known := o.members[id]
	if e.Operation() != jetstream.KeyValuePut {
		delete(o.members, id)
		return known
	}
	o.members[id] = time.Now()
	return !known
}

func (o *owner) renewMember(ctx context.Context) {
	rctx, cancel := context.WithTimeout(ctx, o.c.Lease/5)
	defer cancel()
	if _, err := o.kv.Put(rctx, memberKey(o.c.Stage, o.c.Member), []byte(o.c.Member)); err != nil && ctx.Err() == nil {
		o.c.OnError(fmt.Errorf("renew %s membership: %w", o.c.Stage, err))
	}
}

// liveMembers are the members heard from within a lease, this one always.
func (o *owner) liveMembers() []string {
	o.mu.Lock()
	defer o.mu.Unlock()
	out := []string{o.c.Member}
	for id, seen := range o.members {
		if id == o.c.Member {
			continue
		}
		if time.Since(seen) > o.c.Lease {
			delete(o.members, id)
			continue
		}
		out = append(out, id)
	}
	return out
}

// renewLeases renews every lease held and fences the partitions whose
// lease is gone or whose deadline passed. A partition being handed back is
// renewed too: its handlers may still run (up to AckWait), and the lease
// must not expire under them.
//
// The renewals are pipelined: published at once as asynchronous
// compare-and-set writes (what KeyValue.Update sends), then their
// acknowledgements awaited. Renewals are nearly all an idle process does
// (64 partitions per stage every Lease/5), and a goroutine, a timer and a
// request round trip for each made an idle all-in-one spend several times
// the CPU of the writes themselves.
func (o *owner) renewLeases(ctx context.Context) {
	type renewal struct {
		p    *partition
		sent time.Time
		ack  jetstream.PubAckFuture
		rev  uint64
		err  error
	}
	o.mu.Lock()
	rs := make([]renewal, 0, len(o.parts))
	for _, p := range o.parts {
		rs = append(rs, renewal{p: p, rev: p.rev}) // rev: held, then renewed
	}
	o.mu.Unlock()
	for i := range rs {
		r := &rs[i]
		r.sent = time.Now()
		r.ack, r.err = o.js.PublishMsgAsync(&nats.Msg{Subject: kvPutSubject(leaseKeyOf(o.c.Stage, r.p.name)), Data: []byte(o.c.Member)},
			jetstream.WithExpectLastSequencePerSubject(r.rev))
	}
	wait := time.NewTimer(o.c.Lease / 5)
	defer wait.Stop()
	expired := false
	for i := range rs {
		r := &rs[i]
		if r.err != nil {
			continue
		}
		if expired {
			r.err = context.DeadlineExceeded
			continue
		}
		select {
		case pa := <-r.ack.Ok():
			r.rev = pa.Sequence
		case err := <-r.ack.Err():
			r.err = err
		case <-wait.C:
			expired, r.err = true, context.DeadlineExceeded
		case <-ctx.Done():
			expired, r.err = true, ctx.Err()
		}
	}
	for i := range rs {
		r := &rs[i]
		if errors.Is(r.err, jetstream.ErrKeyExists) {
			// A revision mismatch may be our own renewal, applied by the
			// server after its reply was lost: if the lease still names
			// this replica, renew against what it holds.
			rctx, cancel := context.WithTimeout(ctx, o.c.Lease/5)
			if cur, gerr := o.kv.Get(rctx, leaseKeyOf(o.c.Stage, r.p.name)); gerr == nil && string(cur.Value()) == o.c.Member {
				r.sent = time.Now()
				r.rev, r.err = o.kv.Update(rctx, leaseKeyOf(o.c.Stage, r.p.name), []byte(o.c.Member), cur.Revision())
			}
			cancel()
		}
		o.settleRenewal(ctx, r.p, r.sent, r.rev, r.err)
	}
}

// kvPutSubject is where a write of key in the lease bucket is published
// (KeyValue.Put and Update publish there; metabus uses no JetStream domain).
func kvPutSubject(key string) string { return "$KV." + OwnersBucket + "." + key }

// settleRenewal records the outcome of one lease renewal sent at sent.
func (o *owner) settleRenewal(ctx context.Context, p *partition, sent time.Time, rev uint64, err error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	switch {
	case err == nil:
		p.rev = rev
		p.deadline = sent.Add(o.c.Lease * 3 / 5)
	case errors.Is(err, jetstream.ErrKeyExists) || errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrKeyDeleted):
		o.c.OnError(fmt.Errorf("lease of %s partition %s lost: %w", o.c.Stage, p.name, err))
		o.fenceLocked(p)
	case time.Now().After(p.deadline):
		o.c.OnError(fmt.Errorf("lease of %s partition %s not renewed in time: %w", o.c.Stage, p.name, err))
		o.fenceLocked(p)
	default:
		if ctx.Err() == nil {
			o.c.OnError(fmt.Errorf("renew lease of %s partition %s: %w", o.c.Stage, p.name, err))
		}
	}
}

// fenceExpired fences every partition whose renewal deadline has passed.
func (o *owner) fenceExpired() {
	now := time.Now()
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, p := range o.parts {
		if now.After(p.deadline) {
			o.c.OnError(fmt.Errorf("lease of %s partition %s not renewed in time: stopping its handlers", o.c.Stage, p.name))
			o.fenceLocked(p)
		}
	}
}

// fenceLocked stops a partition whose lease is lost: no more messages, its
// handlers cancelled, their settlements and its waiting messages dropped
// (the server redelivers them to the new owner after AckWait).
func (o *owner) fenceLocked(p *partition) {
	if p.fenced {
		return
	}
	p.fenced = true
	o.c.released(true)
	p.cancel()
	if p.cc != nil {
		p.cc.Stop()
	}
	for _, m := range o.q.Remove(func(_, _ string, m *held) bool { return m.part == p }) {
		delete(o.held, m)
	}
	delete(o.parts, p.name)
	if p.running == 0 && p.idle != nil {
		close(p.idle)
		p.idle = nil
	}
}

// balance claims the partitions assigned to this replica that nobody
// holds, starts consuming those whose previous owner is done, and hands
// back the partitions assigned to another live member and those of a
// layout no longer current (a partition-count cut-over, layout.go).
func (o *owner) balance(ctx context.Context) {
	if ctx.Err() != nil {
		return
	}
	members := o.liveMembers()
	o.mu.Lock()
	n := o.n
	var stale []*partition
	for _, part := range o.parts {
		if part.n != n && part.state != partReleasing {
			stale = append(stale, part)
		}
	}
	o.mu.Unlock()
	for _, part := range stale {
		go o.release(part)
	}
	for p, m := range Assign(members, n) {
		name := PartitionConsumerName("", n, p)
		o.mu.Lock()
		part := o.parts[name]
		o.mu.Unlock()
		switch {
		case part == nil && m == o.c.Member:
			o.claim(ctx, n, p)
		case part != nil && m != o.c.Member && part.state != partReleasing:
			go o.release(part)
		case part != nil && part.state == partWaiting:
			o.startWhenClear(ctx, part)
		}
	}
}

// refreshLayout reads the stream's partition count; it reports whether it
// is still n.
func (o *owner) refreshLayout(ctx context.Context, n int) bool {
	cur, err := StreamPartitions(ctx, o.js, o.c.Stream)
	if err != nil {
		if ctx.Err() == nil {
			o.c.OnError(err)
		}
		return true // keep what we know; renewals still fence us
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	o.n = cur
	return cur == n
}

func (o *owner) claim(ctx context.Context, n, p int) {
	name := PartitionConsumerName("", n, p)
	key := leaseKeyOf(o.c.Stage, name)
	cctx, cancel := context.WithTimeout(ctx, o.c.Lease/5)
	defer cancel()
	sent := time.Now()
	rev, err := o.kv.Create(cctx, key, []byte(o.c.Member))
	if errors.Is(err, jetstream.ErrKeyExists) {
		// Our own earlier claim whose reply was lost still names us.
		if cur, gerr := o.kv.Get(cctx, key); gerr == nil && string(cur.Value()) == o.c.Member {
			rev, err = o.kv.Update(cctx, key, []byte(o.c.Member), cur.Revision())
		}
	}
	if err != nil {
		if !errors.Is(err, jetstream.ErrKeyExists) && ctx.Err() == nil {
			o.c.OnError(fmt.Errorf("claim %s partition %s: %w", o.c.Stage, name, err))
		}
		return // held by another replica until it hands it back or expires
	}
	hctx, hcancel := context.WithCancel(context.WithoutCancel(ctx))
	part := &partition{name: name, n: n, p: p, rev: rev, deadline: sent.Add(o.c.Lease * 3 / 5), state: partWaiting, since: time.Now(), ctx: hctx, cancel: hcancel}
	o.mu.Lock()
	o.parts[name] = part
	o.c.claimed()
	o.mu.Unlock()
	// Read the layout again after claiming: a cut-over that began before
	// the claim must not find this lease unused yet consumed (layout.go).
	if !o.refreshLayout(ctx, n) {
		go o.release(part)
		return
	}
	o.startWhenClear(ctx, part)
}

// startWhenClear starts consuming a claimed partition, except for an
// ordered stream whose previous owner still has unacknowledged messages:
// those come back first (redeliveries precede new messages) once their
// AckWait has run out, so the partition waits until then or until they
// are acknowledged.
func (o *owner) startWhenClear(ctx context.Context, part *partition) {
	cons, err := o.js.Consumer(ctx, o.c.Stream, o.c.Prefix+part.name)
	if err != nil {
		// A cut-over's new consumers appear once the old partitions are
		// handed back: not an error until then.
		if ctx.Err() == nil && (!errors.Is(err, jetstream.ErrConsumerNotFound) || time.Since(part.since) > 2*o.c.Lease) {
			o.c.OnError(fmt.Errorf("open consumer %s/%s: %w", o.c.Stream, o.c.Prefix+part.name, err))
		}
		return
	}
	// The consumer's real AckWait: streams created by another process
	// may use a shorter one than this replica's setting. Heartbeats
	// follow it, and so does the wait for a previous owner's messages.
	beat := o.c.AckWait
	if info := cons.CachedInfo(); info != nil && info.Config.AckWait > 0 && info.Config.AckWait < beat {
		beat = info.Config.AckWait
	}
	if o.c.Ordered && time.Since(part.since) < beat {
		if info := cons.CachedInfo(); info != nil && info.NumAckPending > 0 {
			return // checked again on the next tick
		}
	}
	o.mu.Lock()
	if part.fenced || part.state != partWaiting {
		o.mu.Unlock()
		return
	}
	part.state = partActive
	part.beat = beat
	if cur := time.Duration(o.minBeat.Load()); cur == 0 || beat < cur {
		o.minBeat.Store(int64(beat))
	}
	o.mu.Unlock()
	cc, err := cons.Consume(func(m jetstream.Msg) { o.receive(part, m) },
		jetstream.PullMaxMessages(256),
		// A short pull expiry bounds how long a partition can sit idle
		// when the server loses a pull request.
		jetstream.PullExpiry(5*time.Second),
		jetstream.ConsumeErrHandler(func(_ jetstream.ConsumeContext, err error) {
			if !errors.Is(err, jetstream.ErrNoHeartbeat) {
				o.c.OnError(fmt.Errorf("consume %s partition %s: %w", o.c.Stream, part.name, err))
			}
		}))
	o.mu.Lock()
	defer o.mu.Unlock()
	if err != nil {
		part.state = partWaiting
		o.c.OnError(fmt.Errorf("consume %s partition %s: %w", o.c.Stream, part.name, err))
		return
	}
	part.cc = cc
	if part.fenced || part.state == partReleasing {
		cc.Drain()
	}
}

func (o *owner) receive(part *partition, m jetstream.Msg) {
	_, ctrlID, parentUID, err := ParseStoredSubject(m.Subject())
	if err != nil {
		o.c.OnError(err)
		_ = m.TermWithReason("unparsable subject")
		return
	}
	seq, _, err := Meta(m)
	if err != nil {
		o.c.OnError(err)
		_ = m.NakWithDelay(time.Second)
		return
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	switch {
	case part.fenced:
		return // redelivered to the new owner after AckWait
	case part.state == partReleasing:
		_ = m.Nak() // to the next owner at once
		return
	}
	if w := WeightOf(m.Headers()); w > 1 {
		o.weights[ctrlID] = w
	} else {
		delete(o.weights, ctrlID)
	}
	// parentUID is the whole parent token: a keyed item's <uid>~<key>
	// (MapKeySep) makes its unit of serialization (parent, key), so keys
	// of one parent in one partition run side by side, each in order.
	hm := &held{Msg: m, o: o, part: part, group: ctrlID, key: ctrlID + "." + parentUID, seq: seq, lastBeat: time.Now()}
	o.held[hm] = struct{}{}
	o.q.Push(hm.group, hm.key, seq, hm)
	o.poke()
}

// dispatch starts every message the queue lets run.
func (o *owner) dispatch(ctx context.Context) {
	for {
		o.mu.Lock()
		for {
			_, _, _, hm, ok := o.q.Next()
			if !ok {
				break
			}
			newer := o.q.HasWaiting(hm.key)
			hm.part.running++
			o.running.Add(1)
			o.start(job{hm, newer})
		}
		o.mu.Unlock()
		select {
		case <-ctx.Done():
			return
		case <-o.wake:
		}
	}
}

// job is one message to handle.
type job struct {
	hm    *held
	newer bool
}

// workerIdle is how long a handler goroutine waits for the next message
// before it exits.
const workerIdle = 10 * time.Second

// start hands j to an idle handler goroutine, or starts one. Reusing them
// keeps their grown stacks: a fresh goroutine per message grew its stack
// through every JSON encoding and API call, about 4% of an all-in-one
// process's CPU in copystack. Called under o.mu; never blocks.
func (o *owner) start(j job) {
	select {
	case o.jobs <- j:
	default:
		go o.worker(j)
	}
}

func (o *owner) worker(j job) {
	idle := time.NewTimer(workerIdle)
	defer idle.Stop()
	for {
		o.handle(j.hm, j.newer)
		idle.Reset(workerIdle)
		select {
		case j = <-o.jobs:
		case <-idle.C:
			return
		case <-o.quit:
			return
		}
	}
}

func (o *owner) handle(hm *held, newer bool) {
	defer o.running.Done()
	ctx := context.WithValue(hm.part.ctx, newerKey{}, newer)
	backoff := time.Duration(0)
	for {
		hm.retry = 0
		if o.c.Ordered {
			run, err := oldest(ctx, o.js, o.c.Stream, hm.Subject(), hm.seq, o.c.KeepOlder)
			switch {
			case err != nil:
				if ctx.Err() == nil {
					o.c.OnError(err)
				}
				hm.retry = time.Second
			case !run:
				hm.settled = true // gone from the stream: superseded
			}
		}
		if hm.retry == 0 && !hm.settled {
			o.h(ctx, hm)
		}
		if hm.retry == 0 || hm.settled || ctx.Err() != nil {
			break
		}
		// In-place retry, keeping the parent's turn; growing while it
		// keeps failing (an unreachable dependency).
		backoff = max(hm.retry, min(2*backoff, 30*time.Second))
		t := time.NewTimer(backoff)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
		}
		if ctx.Err() != nil {
			break
		}
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if !hm.settled && !hm.part.fenced && hm.retry == 0 && hm.part.ctx.Err() == nil {
		// A handler that returned without settling: let the server
		// redeliver it, as it would after a crash.
		_ = hm.Msg.Nak()
	}
	delete(o.held, hm)
	o.q.Done(hm.key)
	hm.part.running--
	if hm.part.running == 0 && hm.part.idle != nil {
		close(hm.part.idle)
		hm.part.idle = nil
	}
	o.poke()
}

// heartbeat keeps every held message alive: the server must not redeliver
// a message this replica still holds, running or waiting its parent's turn.
func (o *owner) heartbeat(ctx context.Context) {
	for {
		period := time.Duration(o.minBeat.Load())
		if period == 0 {
			period = o.c.AckWait
		}
		t := time.NewTimer(min(max(period/12, 20*time.Millisecond), 250*time.Millisecond))
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		now := time.Now()
		var due []*held
		o.mu.Lock()
		for hm := range o.held {
			if now.Sub(hm.lastBeat) >= hm.part.beat/3 {
				hm.lastBeat = now
				due = append(due, hm)
			}
		}
		o.mu.Unlock()
		for _, hm := range due {
			_ = hm.InProgress()
		}
	}
}

// release hands a partition back: stop pulling, return what waits (the
// next owner gets it at once), let what runs finish (up to AckWait, then
// fence it), and delete the lease so the next owner may claim it.
func (o *owner) release(part *partition) {
	o.mu.Lock()
	if part.fenced || part.state == partReleasing {
		o.mu.Unlock()
		return
	}
	part.state = partReleasing
	cc := part.cc
	o.mu.Unlock()
	if cc != nil {
		cc.Drain() // buffered messages reach receive, which naks them
		select {
		case <-cc.Closed():
		case <-time.After(o.c.AckWait):
		}
	}
	o.mu.Lock()
	waiting := o.q.Remove(func(_, _ string, m *held) bool { return m.part == part })
	for _, m := range waiting {
		delete(o.held, m)
		_ = m.Msg.Nak()
	}
	var idle chan struct{}
	if part.running > 0 {
		part.idle = make(chan struct{})
		idle = part.idle
	}
	o.mu.Unlock()
	if idle != nil {
		select {
		case <-idle:
		case <-time.After(o.c.AckWait):
			o.mu.Lock()
			o.fenceLocked(part)
			o.mu.Unlock()
			return // the lease expires on its own
		}
	}
	o.mu.Lock()
	fenced := part.fenced
	rev := part.rev
	delete(o.parts, part.name)
	part.cancel()
	if !fenced {
		o.c.released(false)
	}
	o.mu.Unlock()
	if fenced {
		return
	}
	dctx, cancel := context.WithTimeout(context.Background(), o.c.Lease/5)
	defer cancel()
	if err := o.kv.Delete(dctx, leaseKeyOf(o.c.Stage, part.name), jetstream.LastRevision(rev)); err != nil {
		o.c.OnError(fmt.Errorf("hand back %s partition %s: %w", o.c.Stream, part.name, err))
	}
}
