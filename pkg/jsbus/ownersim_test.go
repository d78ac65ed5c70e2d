package jsbus

import (
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/metabus/metabus/pkg/bus"
	"github.com/metabus/metabus/pkg/outcome"
)

// The owner simulation (issue 33): the real driver (owned.go, order.go and
// the lease checks of leaseguard.go) of several replicas of an ordered
// stage, each through its seams (seams.go) to one fake JetStream server
// and one fake clock: partition consumers that deliver, redeliver after
// AckWait and reset to their ack floor; a lease bucket whose keys expire;
// the stream's messages for the oldest-message check. Seeded schedules
// publish desired states to a few parents, cut replicas off the server
// (every call fails, nothing is delivered to them, their acks are lost)
// and heal them, and stop replicas and start new ones. The goroutines'
// interleavings are the runtime's: a seed reproduces the schedule, not
// every interleaving.
//
// Handlers wait a simulated hook call (some of them ignoring their
// context, as a paused process would) and write through LeaseGuard. It
// checks that no write is made while another handler of the same parent
// may write too, that a parent's writes never go back in stream order,
// and, once healed and settled, that every message was settled. A
// failure names what is left where.
//
//	go test ./pkg/jsbus -run 'TestOwnerSimulation$' -ownersim.schedules 200
//	go test ./pkg/jsbus -run 'TestOwnerSimulation$' -ownersim.first N -ownersim.schedules 1 -v

var (
	ownerSimSchedules = flag.Int("ownersim.schedules", 0, "owner simulation schedules (0: 4, or 2 with -short)")
	ownerSimFirst     = flag.Uint64("ownersim.first", 1, "first seed of the owner simulation")
)

const (
	fsLease   = 10 * time.Second
	fsAckWait = 15 * time.Second
	fsStep    = 50 * time.Millisecond
	fsStream  = "MC_DESIRED"
	fsPrefix  = "desired-"
)

var errFsCut = fmt.Errorf("simulated: cut off from the server: %w", context.DeadlineExceeded)

// --- the server ---

type fsServer struct {
	mu   sync.Mutex
	clk  *fakeClock
	n    int
	seq  uint64
	msgs map[uint64]string // stream: seq → subject
	cons []*fsConsumer
	kv   map[string]*fsEntry
	rev  uint64 // the lease bucket's last revision
	wats []*fsWatcher
	cut  map[string]bool // members cut off
	sim  *fsSim
}

type fsEntry struct {
	key, val string
	rev      uint64
	at       time.Time
	deleted  bool
}

type fsPend struct {
	dseq     uint64
	deadline time.Time
	count    int
}

type fsConsumer struct {
	p         int
	dseq      uint64
	delivered uint64 // the last stream seq delivered
	ackFloor  uint64
	pending   map[uint64]*fsPend
	sub       *fsSub
}

type fsSub struct {
	member string
	c      *fsConsumer
	h      jetstream.MessageHandler
	ch     chan jetstream.Msg
	done   chan struct{}
	closed chan struct{}
	once   sync.Once
}

func (sub *fsSub) Stop() {
	sub.once.Do(func() {
		close(sub.done)
	})
}
func (sub *fsSub) Drain()                  { sub.Stop() }
func (sub *fsSub) Closed() <-chan struct{} { return sub.closed }
func (sub *fsSub) run()                    { defer close(sub.closed); sub.loop() }
func (sub *fsSub) loop() {
	for {
		select {
		case <-sub.done:
			return
		case m := <-sub.ch:
			select {
			case <-sub.done:
				return
			default:
			}
			sub.h(m)
		}
	}
}

func newFsServer(clk *fakeClock, n int) *fsServer {
	srv := &fsServer{clk: clk, n: n, msgs: map[uint64]string{}, kv: map[string]*fsEntry{}, cut: map[string]bool{}}
	for p := range n {
		srv.cons = append(srv.cons, &fsConsumer{p: p, pending: map[uint64]*fsPend{}})
	}
	return srv
}

func (srv *fsServer) partOf(subj string) int {
	_, ctrl, uid, err := bus.ParseStoredSubject(subj)
	if err != nil {
		panic(err)
	}
	return bus.PartitionOf(bus.Slot(ctrl, uid), srv.n)
}

func (srv *fsServer) publish(subj string) uint64 {
	srv.mu.Lock()
	srv.seq++
	srv.msgs[srv.seq] = subj
	seq := srv.seq
	srv.mu.Unlock()
	srv.pump()
	return seq
}

// pump delivers what is due: new messages in stream order, and pending
// ones past their deadline, to each consumer's subscription.
func (srv *fsServer) pump() {
	type out struct {
		sub *fsSub
		m   jetstream.Msg
	}
	var outs []out
	srv.mu.Lock()
	now := srv.clk.Now()
	for _, c := range srv.cons {
		sub := c.sub
		if sub == nil || srv.cut[sub.member] {
			continue
		}
		var due []uint64
		for seq, p := range c.pending {
			if !now.Before(p.deadline) {
				due = append(due, seq)
			}
		}
		slices.Sort(due)
		for seq, subj := range srv.msgs {
			if seq > c.delivered && srv.partOf(subj) == c.p {
				due = append(due, seq)
			}
		}
		slices.Sort(due)
		due = slices.Compact(due)
		for _, seq := range due {
			subj, ok := srv.msgs[seq]
			if !ok {
				delete(c.pending, seq)
				continue
			}
			c.dseq++
			p := c.pending[seq]
			if p == nil {
				p = &fsPend{}
				c.pending[seq] = p
			}
			p.dseq, p.deadline = c.dseq, now.Add(fsAckWait)
			p.count++
			c.delivered = max(c.delivered, seq)
			outs = append(outs, out{sub, &fsMsg{srv: srv, c: c, member: sub.member, subj: subj, seq: seq, dseq: c.dseq, count: p.count}})
		}
	}
	srv.mu.Unlock()
	for _, o := range outs {
		select {
		case o.sub.ch <- o.m:
		case <-o.sub.done:
		}
	}
}

// settle removes seq from c's pending (ack, term); with remove, from the
// stream too (WorkQueue retention).
func (srv *fsServer) settleLocked(c *fsConsumer, seq uint64) {
	delete(c.pending, seq)
	delete(srv.msgs, seq)
	floor := c.delivered
	for s := range c.pending {
		floor = min(floor, s-1)
	}
	c.ackFloor = floor
}

// dumpLocked describes what is left in the stream and where.
func (srv *fsServer) dumpLocked() string {
	var b strings.Builder
	var seqs []uint64
	for seq := range srv.msgs {
		seqs = append(seqs, seq)
	}
	slices.Sort(seqs)
	for _, seq := range seqs {
		c := srv.cons[srv.partOf(srv.msgs[seq])]
		fmt.Fprintf(&b, "seq %d (p%d", seq, c.p)
		if p := c.pending[seq]; p != nil {
			fmt.Fprintf(&b, ", pending dseq %d due %s, %d deliveries", p.dseq, p.deadline.Sub(srv.clk.Now()), p.count)
		}
		b.WriteString("); ")
	}
	for _, c := range srv.cons {
		sub := "none"
		if c.sub != nil {
			select {
			case <-c.sub.done:
				sub = c.sub.member + " (stopped)"
			default:
				sub = c.sub.member
			}
		}
		lease := "none"
		if e := srv.live(bus.LeaseKeyOf(bus.DesiredStage, bus.PartitionConsumerName("", srv.n, c.p))); e != nil {
			lease = e.val
		}
		fmt.Fprintf(&b, "p%d: delivered %d floor %d, %d pending, subscriber %s, lease %s; ", c.p, c.delivered, c.ackFloor, len(c.pending), sub, lease)
	}
	var keys []string
	for k, e := range srv.kv {
		if !e.deleted {
			keys = append(keys, fmt.Sprintf("%s=%s (%s ago)", k, e.val, srv.clk.Now().Sub(e.at)))
		}
	}
	slices.Sort(keys)
	fmt.Fprintf(&b, "keys: %s", strings.Join(keys, ", "))
	return b.String()
}

// --- a message ---

type fsMsg struct {
	jetstream.Msg
	srv       *fsServer
	c         *fsConsumer
	member    string
	subj      string
	seq, dseq uint64
	count     int
}

func (m *fsMsg) Subject() string      { return m.subj }
func (m *fsMsg) Headers() nats.Header { return nil }
func (m *fsMsg) Data() []byte         { return nil }
func (m *fsMsg) Metadata() (*jetstream.MsgMetadata, error) {
	return &jetstream.MsgMetadata{Sequence: jetstream.SequencePair{Stream: m.seq, Consumer: m.dseq}, NumDelivered: uint64(m.count)}, nil
}

func (m *fsMsg) do(f func(p *fsPend)) error {
	m.srv.mu.Lock()
	defer m.srv.mu.Unlock()
	if m.srv.cut[m.member] {
		return errFsCut
	}
	if p := m.c.pending[m.seq]; p != nil {
		f(p)
	}
	return nil
}

func (m *fsMsg) Ack() error {
	return m.do(func(*fsPend) { m.srv.settleLocked(m.c, m.seq) })
}
func (m *fsMsg) DoubleAck(context.Context) error { return m.Ack() }
func (m *fsMsg) Term() error                     { return m.Ack() }
func (m *fsMsg) TermWithReason(string) error     { return m.Ack() }
func (m *fsMsg) Nak() error {
	return m.do(func(p *fsPend) { p.deadline = m.srv.clk.Now() })
}
func (m *fsMsg) NakWithDelay(d time.Duration) error {
	return m.do(func(p *fsPend) { p.deadline = m.srv.clk.Now().Add(d) })
}
func (m *fsMsg) InProgress() error {
	return m.do(func(p *fsPend) { p.deadline = m.srv.clk.Now().Add(fsAckWait) })
}

// --- one replica's client ---

type fsClient struct {
	srv    *fsServer
	member string
}

func (cl fsClient) check() error {
	if cl.srv.cut[cl.member] {
		return errFsCut
	}
	return nil
}

type fsStreamInfo struct {
	jetstream.Stream
	n int
}

func (s fsStreamInfo) CachedInfo() *jetstream.StreamInfo {
	return &jetstream.StreamInfo{Config: jetstream.StreamConfig{Metadata: map[string]string{bus.PartitionsMetadata: strconv.Itoa(s.n)}}}
}

func (cl fsClient) Stream(context.Context, string) (jetstream.Stream, error) {
	cl.srv.mu.Lock()
	defer cl.srv.mu.Unlock()
	if err := cl.check(); err != nil {
		return nil, err
	}
	return fsStreamInfo{n: cl.srv.n}, nil
}

type fsCons struct {
	cl fsClient
	c  *fsConsumer
}

func (cl fsClient) consumer(name string) (*fsConsumer, error) {
	if err := cl.check(); err != nil {
		return nil, err
	}
	for _, c := range cl.srv.cons {
		if fsPrefix+bus.PartitionConsumerName("", cl.srv.n, c.p) == name {
			return c, nil
		}
	}
	return nil, jetstream.ErrConsumerNotFound
}

func (cl fsClient) Consumer(_ context.Context, _, name string) (partConsumer, error) {
	cl.srv.mu.Lock()
	defer cl.srv.mu.Unlock()
	c, err := cl.consumer(name)
	if err != nil {
		return nil, err
	}
	return fsCons{cl, c}, nil
}

func (fc fsCons) info() *jetstream.ConsumerInfo {
	c := fc.c
	return &jetstream.ConsumerInfo{NumAckPending: len(c.pending), Delivered: jetstream.SequenceInfo{Stream: c.delivered, Consumer: c.dseq},
		AckFloor: jetstream.SequenceInfo{Stream: c.ackFloor}, Config: jetstream.ConsumerConfig{AckWait: fsAckWait}}
}

func (fc fsCons) CachedInfo() *jetstream.ConsumerInfo {
	fc.cl.srv.mu.Lock()
	defer fc.cl.srv.mu.Unlock()
	return fc.info()
}

func (fc fsCons) Info(context.Context) (*jetstream.ConsumerInfo, error) {
	fc.cl.srv.mu.Lock()
	defer fc.cl.srv.mu.Unlock()
	if err := fc.cl.check(); err != nil {
		return nil, err
	}
	return fc.info(), nil
}

// Consume subscribes (a later subscription replaces an earlier one, as the
// server then delivers to both: a subscription left behind would be a
// driver defect this model does not show).
func (fc fsCons) Consume(h jetstream.MessageHandler, _ ...jetstream.PullConsumeOpt) (jetstream.ConsumeContext, error) {
	srv := fc.cl.srv
	srv.mu.Lock()
	if err := fc.cl.check(); err != nil {
		srv.mu.Unlock()
		return nil, err
	}
	sub := &fsSub{member: fc.cl.member, c: fc.c, h: h, ch: make(chan jetstream.Msg, 1<<12), done: make(chan struct{}), closed: make(chan struct{})}
	fc.c.sub = sub
	srv.mu.Unlock()
	go sub.run()
	srv.pump()
	return sub, nil
}

func (cl fsClient) ResetConsumer(_ context.Context, _, name string) (*jetstream.ConsumerResetResponse, error) {
	cl.srv.mu.Lock()
	c, err := cl.consumer(name)
	if err == nil {
		c.pending = map[uint64]*fsPend{}
		c.delivered = c.ackFloor
	}
	cl.srv.mu.Unlock()
	if err == nil {
		cl.srv.sim.count("consumer reset")
	}
	cl.srv.pump()
	return nil, err
}

func (cl fsClient) ServerVersion() string { return "2.14.0" }

type fsFuture struct {
	ok  chan *jetstream.PubAck
	err chan error
}

func (f fsFuture) Ok() <-chan *jetstream.PubAck { return f.ok }
func (f fsFuture) Err() <-chan error            { return f.err }
func (f fsFuture) Msg() *nats.Msg               { return nil }

func (cl fsClient) RenewAsync(key string, value []byte, rev uint64) (jetstream.PubAckFuture, error) {
	f := fsFuture{ok: make(chan *jetstream.PubAck, 1), err: make(chan error, 1)}
	nrev, err := cl.Update(context.Background(), key, value, rev)
	if err != nil {
		f.err <- err
	} else {
		f.ok <- &jetstream.PubAck{Sequence: nrev}
	}
	return f, nil
}

// live returns key's entry if it is there and not expired.
func (srv *fsServer) live(key string) *fsEntry {
	e := srv.kv[key]
	if e == nil || e.deleted || srv.clk.Now().Sub(e.at) >= fsLease {
		return nil
	}
	return e
}

func (srv *fsServer) writeLocked(key, val string, deleted bool) (uint64, []func()) {
	srv.rev++
	e := &fsEntry{key: key, val: val, rev: srv.rev, at: srv.clk.Now(), deleted: deleted}
	srv.kv[key] = e
	var sends []func()
	for _, w := range srv.wats {
		if strings.HasPrefix(key, w.prefix) {
			sends = append(sends, w.send(e))
		}
	}
	return srv.rev, sends
}

type fsKVEntry struct{ e *fsEntry }

func (x fsKVEntry) Bucket() string     { return bus.OwnersBucket }
func (x fsKVEntry) Key() string        { return x.e.key }
func (x fsKVEntry) Value() []byte      { return []byte(x.e.val) }
func (x fsKVEntry) Revision() uint64   { return x.e.rev }
func (x fsKVEntry) Created() time.Time { return x.e.at }
func (x fsKVEntry) Delta() uint64      { return 0 }
func (x fsKVEntry) Operation() jetstream.KeyValueOp {
	if x.e.deleted {
		return jetstream.KeyValueDelete
	}
	return jetstream.KeyValuePut
}

func (cl fsClient) Get(_ context.Context, key string) (jetstream.KeyValueEntry, error) {
	cl.srv.mu.Lock()
	defer cl.srv.mu.Unlock()
	if err := cl.check(); err != nil {
		return nil, err
	}
	e := cl.srv.live(key)
	if e == nil {
		return nil, jetstream.ErrKeyNotFound
	}
	return fsKVEntry{e}, nil
}

func (cl fsClient) kvWrite(key, val string, ok func(cur *fsEntry) error, deleted bool) (uint64, error) {
	cl.srv.mu.Lock()
	if err := cl.check(); err != nil {
		cl.srv.mu.Unlock()
		return 0, err
	}
	if err := ok(cl.srv.live(key)); err != nil {
		cl.srv.mu.Unlock()
		return 0, err
	}
	rev, sends := cl.srv.writeLocked(key, val, deleted)
	cl.srv.mu.Unlock()
	for _, s := range sends {
		s()
	}
	return rev, nil
}

func (cl fsClient) Put(_ context.Context, key string, value []byte) (uint64, error) {
	return cl.kvWrite(key, string(value), func(*fsEntry) error { return nil }, false)
}

func (cl fsClient) Create(_ context.Context, key string, value []byte, _ ...jetstream.KVCreateOpt) (uint64, error) {
	tookOver := false
	rev, err := cl.kvWrite(key, string(value), func(cur *fsEntry) error {
		if cur != nil {
			return jetstream.ErrKeyExists
		}
		// Expired while another's: taken over from a replica that
		// did not hand it back.
		old := cl.srv.kv[key]
		tookOver = old != nil && !old.deleted && old.val != string(value)
		return nil
	}, false)
	if err == nil && tookOver {
		cl.srv.sim.count("lease taken over")
	}
	return rev, err
}

// atRev: the key's last revision must be rev (an expired or deleted key
// has none left: the server's last sequence for the subject is gone).
func atRev(rev uint64) func(cur *fsEntry) error {
	return func(cur *fsEntry) error {
		if cur == nil || cur.rev != rev {
			return jetstream.ErrKeyExists
		}
		return nil
	}
}

func (cl fsClient) Update(_ context.Context, key string, value []byte, rev uint64) (uint64, error) {
	return cl.kvWrite(key, string(value), atRev(rev), false)
}

func (cl fsClient) DeleteAt(_ context.Context, key string, rev uint64) error {
	cond := func(*fsEntry) error { return nil }
	if rev != 0 {
		cond = atRev(rev)
	}
	_, err := cl.kvWrite(key, "", cond, true)
	return err
}

type fsWatcher struct {
	prefix string
	ch     chan jetstream.KeyValueEntry
	done   chan struct{}
}

func (w *fsWatcher) send(e *fsEntry) func() {
	return func() {
		select {
		case w.ch <- fsKVEntry{e}:
		case <-w.done:
		}
	}
}

func (w *fsWatcher) Updates() <-chan jetstream.KeyValueEntry { return w.ch }
func (w *fsWatcher) Stop() error {
	select {
	case <-w.done:
	default:
		close(w.done)
	}
	return nil
}

func (cl fsClient) Watch(_ context.Context, keys string, _ ...jetstream.WatchOpt) (jetstream.KeyWatcher, error) {
	cl.srv.mu.Lock()
	if err := cl.check(); err != nil {
		cl.srv.mu.Unlock()
		return nil, err
	}
	w := &fsWatcher{prefix: strings.TrimSuffix(keys, "*"), ch: make(chan jetstream.KeyValueEntry, 1<<12), done: make(chan struct{})}
	var initial []*fsEntry
	for k := range cl.srv.kv {
		if e := cl.srv.live(k); e != nil && strings.HasPrefix(k, w.prefix) {
			initial = append(initial, e)
		}
	}
	cl.srv.wats = append(cl.srv.wats, w)
	cl.srv.mu.Unlock()
	for _, e := range initial {
		w.ch <- fsKVEntry{e}
	}
	w.ch <- nil
	return w, nil
}

// FirstFrom and DeleteMsg: the stream, for the oldest-message check.
func (cl fsClient) FirstFrom(_ context.Context, _, subj string, from uint64) (*jetstream.RawStreamMsg, error) {
	cl.srv.mu.Lock()
	defer cl.srv.mu.Unlock()
	if err := cl.check(); err != nil {
		return nil, err
	}
	best := uint64(0)
	for seq, s := range cl.srv.msgs {
		if seq >= from && s == subj && (best == 0 || seq < best) {
			best = seq
		}
	}
	if best == 0 {
		return nil, jetstream.ErrMsgNotFound
	}
	return &jetstream.RawStreamMsg{Subject: subj, Sequence: best}, nil
}

func (cl fsClient) DeleteMsg(_ context.Context, _ string, seq uint64) error {
	cl.srv.mu.Lock()
	defer cl.srv.mu.Unlock()
	if err := cl.check(); err != nil {
		return err
	}
	for _, c := range cl.srv.cons {
		delete(c.pending, seq)
	}
	if _, ok := cl.srv.msgs[seq]; ok {
		delete(cl.srv.msgs, seq)
		cl.srv.sim.count("superseded deleted")
	}
	return nil
}

// --- the simulation ---

type fsHandler struct {
	ctx  context.Context
	item string
	hook time.Duration
}

// fsOptions put old defects back (TestOwnerSimulationFindsOldDefects).
type fsOptions struct {
	// unchecked: the stage is consumed as unordered, the driver before
	// the oldest-message check (and the confirmed ack).
	unchecked bool
	// guard wraps the handlers' writes (LeaseGuard).
	guard func(http.RoundTripper) http.RoundTripper
}

type fsSim struct {
	t       *testing.T
	opt     fsOptions
	rng     *rand.Rand // the schedule's
	hookRng *rand.Rand // the handlers' (under mu)
	clk     *fakeClock
	srv     *fsServer
	mu      sync.Mutex
	running map[string][]*fsHandler // parent → handlers started, not returned
	written map[string]uint64       // parent → newest seq written
	fail    []string
	writes  int
	// seen counts what the schedule exercised, by kind.
	seen map[string]int
}

func (s *fsSim) count(kind string) {
	s.mu.Lock()
	s.seen[kind]++
	s.mu.Unlock()
}

func (s *fsSim) violate(format string, args ...any) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.fail = append(s.fail, fmt.Sprintf("t=%s: ", s.clk.Now().Format("15:04:05.000"))+fmt.Sprintf(format, args...))
}

// handle is every replica's handler: a hook call of 0 to 3 s, then the
// write, through the lease guard as the applier's writes are.
func (s *fsSim) handle(ctx context.Context, m jetstream.Msg) outcome.Outcome {
	_, _, item, _ := bus.ParseStoredSubject(m.Subject())
	md, _ := m.Metadata()
	h := &fsHandler{ctx: ctx, item: item}
	s.mu.Lock()
	hook := time.Duration(s.hookRng.IntN(60)) * fsStep
	// Some hook calls ignore the context (or the process pauses) for
	// up to 20 s: their write comes after the fence.
	deaf := s.hookRng.IntN(8) == 0
	if deaf {
		hook = time.Duration(s.hookRng.IntN(400)) * fsStep
	}
	h.hook = hook
	s.running[item] = append(s.running[item], h)
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		s.running[item] = slices.DeleteFunc(s.running[item], func(x *fsHandler) bool { return x == h })
		s.mu.Unlock()
	}()
	if md.NumDelivered > 1 {
		s.count("redelivered")
	}
	done := ctx.Done()
	if deaf {
		done = nil
	}
	select {
	case <-after(s.clk, hook):
	case <-done:
		s.count("fenced while running")
		return outcome.Outcome{}
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPut, "http://apiserver/"+item, http.NoBody)
	if err != nil {
		s.violate("%v", err)
		return outcome.Outcome{}
	}
	resp, err := s.opt.guard(roundTripFunc(func(*http.Request) (*http.Response, error) {
		s.write(h, md.Sequence.Stream)
		return &http.Response{StatusCode: http.StatusOK, Body: http.NoBody}, nil
	})).RoundTrip(req)
	if err != nil {
		s.count("write refused")
		return outcome.Outcome{}
	}
	_ = resp.Body.Close()
	return outcome.Done()
}

// write records h's write of seq and checks it.
func (s *fsSim) write(h *fsHandler, seq uint64) {
	item := h.item
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, o := range s.running[item] {
		if o != h && LeaseValid(o.ctx) == nil {
			s.fail = append(s.fail, fmt.Sprintf("parent %s: seq %d written while another handler may write", item, seq))
		}
	}
	if last := s.written[item]; seq < last {
		s.fail = append(s.fail, fmt.Sprintf("parent %s: seq %d written after seq %d", item, seq, last))
	}
	s.written[item] = max(s.written[item], seq)
	s.writes++
}

type fsReplica struct {
	member string
	o      *owner
	cancel context.CancelFunc
	done   chan struct{}
}

func (s *fsSim) start(i int) *fsReplica {
	member := fmt.Sprintf("r%d", i)
	cl := fsClient{srv: s.srv, member: member}
	c := ConsumeConfig{Stream: fsStream, Prefix: fsPrefix, Stage: bus.DesiredStage, Ordered: !s.opt.unchecked, Member: member,
		Lease: fsLease, AckWait: fsAckWait, PerController: 16, Total: 64, OnError: func(error) {}}
	o := newOwner(cl, cl, cl, s.clk, c, s.handle, s.srv.n)
	ctx, cancel := context.WithCancel(context.Background())
	r := &fsReplica{member: member, o: o, cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(r.done)
		defer close(o.quit)
		_ = o.run(ctx)
	}()
	return r
}

// advance moves the clock a step and lets the goroutines it woke run.
func (s *fsSim) advance() {
	s.clk.Advance(fsStep)
	s.srv.pump()
	time.Sleep(200 * time.Microsecond)
}

// stop stops r (it hands its partitions back), moving the clock on until
// it has.
func (s *fsSim) stop(r *fsReplica) {
	r.cancel()
	for range 4000 {
		select {
		case <-r.done:
			return
		default:
			s.advance()
		}
	}
	s.violate("replica %s did not stop within 200 s", r.member)
}

func runOwnerSchedule(t *testing.T, seed uint64, opt fsOptions, seen map[string]int) []string {
	rng := rand.New(rand.NewPCG(seed, seed^0x2545f4914f6cdd1d))
	clk := newFakeClock(time.Date(2026, 11, 28, 23, 0, 0, 0, time.UTC))
	s := &fsSim{t: t, opt: opt, rng: rng, hookRng: rand.New(rand.NewPCG(seed+1, seed)), clk: clk, srv: newFsServer(clk, 1<<rng.IntN(3)),
		running: map[string][]*fsHandler{}, written: map[string]uint64{}, seen: seen}
	s.srv.sim = s
	items := make([]string, 2+rng.IntN(6))
	for i := range items {
		items[i] = fmt.Sprintf("parent%d", i)
	}
	var reps []*fsReplica
	next := 0
	for range 1 + rng.IntN(3) {
		reps = append(reps, s.start(next))
		next++
	}
	published := 0
	for range 1200 { // 60 s
		switch r := rng.IntN(400); {
		case r < 40:
			s.srv.publish(bus.StoredDesiredSubject("c", items[rng.IntN(len(items))]))
			published++
		case r < 42 && len(reps) > 0:
			// Cut a replica off for 2 to 30 s.
			m := reps[rng.IntN(len(reps))].member
			s.srv.mu.Lock()
			s.srv.cut[m] = true
			s.srv.mu.Unlock()
			heal := clk.Now().Add(time.Duration(2+rng.IntN(28)) * time.Second)
			go func() {
				<-clk.NewTimer(heal.Sub(clk.Now())).C()
				s.srv.mu.Lock()
				delete(s.srv.cut, m)
				s.srv.mu.Unlock()
			}()
		case r < 43 && len(reps) > 1:
			i := rng.IntN(len(reps))
			s.stop(reps[i])
			reps = slices.Delete(reps, i, i+1)
		case r < 44 && len(reps) < 4:
			reps = append(reps, s.start(next))
			next++
		}
		s.advance()
	}
	// Heal and settle: nothing cut off, up to 10 minutes to finish (a
	// parent's backlog runs one message at a time, and some hook calls
	// take 20 s).
	s.srv.mu.Lock()
	clear(s.srv.cut)
	s.srv.mu.Unlock()
	for range 12000 {
		s.advance()
		s.srv.mu.Lock()
		left := len(s.srv.msgs)
		s.srv.mu.Unlock()
		if left == 0 {
			break
		}
	}
	s.srv.mu.Lock()
	if left := len(s.srv.msgs); left > 0 {
		var rs []string
		for _, r := range reps {
			r.o.mu.Lock()
			var held []string
			for _, hm := range r.o.msgs {
				held = append(held, fmt.Sprintf("%d", hm.seq))
			}
			rs = append(rs, fmt.Sprintf("%s: running %d waiting %d held [%s] parts %v", r.member, r.o.core.Running(), r.o.core.Waiting(), strings.Join(held, " "), r.o.core.Partitions()))
			r.o.mu.Unlock()
		}
		s.mu.Lock()
		var hs []string
		for item, l := range s.running {
			for _, h := range l {
				hs = append(hs, fmt.Sprintf("%s (lease %v, hook %s)", item, LeaseValid(h.ctx), h.hook))
			}
		}
		s.mu.Unlock()
		s.fail = append(s.fail, fmt.Sprintf("%d of %d messages never settled: %s; replicas: %s; handlers running: %s", left, published, s.srv.dumpLocked(), strings.Join(rs, "; "), strings.Join(hs, ", ")))
	}
	s.srv.mu.Unlock()
	for _, r := range reps {
		s.stop(r)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	t.Logf("seed %d: %d partitions, %d parents, %d replicas started, %d published, %d writes", seed, s.srv.n, len(items), next, published, s.writes)
	return s.fail
}

// TestOwnerSimulation: the real driver of every replica keeps one writer
// per parent at a time, a parent's writes in order, and settles
// everything, whatever the schedule's cut-offs, stops and starts.
func TestOwnerSimulation(t *testing.T) {
	n := *ownerSimSchedules
	if n == 0 {
		n = 4
		if testing.Short() {
			n = 2
		}
	}
	seen := map[string]int{}
	for seed := *ownerSimFirst; seed < *ownerSimFirst+uint64(n); seed++ {
		if fails := runOwnerSchedule(t, seed, fsOptions{guard: LeaseGuard}, seen); len(fails) > 0 {
			t.Errorf("seed %d: %d violations, the first: %v", seed, len(fails), fails[:min(3, len(fails))])
		}
	}
	t.Logf("exercised: %v", seen)
	if n < 4 {
		return
	}
	// Schedules that stopped producing these would leave the driver's
	// handovers and fences unchecked.
	for _, k := range []string{"lease taken over", "redelivered", "consumer reset", "superseded deleted", "write refused"} {
		if seen[k] == 0 {
			t.Errorf("no schedule exercised %q", k)
		}
	}
}

// TestOwnerSimulationFindsOldDefects: the simulation finds, in the real
// driver, the defects the oldest-message check and the lease guard fixed:
// an ordered stage consumed without the check runs what a takeover
// redelivers out of order, and handlers that write without the guard
// write while the next owner's do.
func TestOwnerSimulationFindsOldDefects(t *testing.T) {
	pass := func(rt http.RoundTripper) http.RoundTripper { return rt }
	for _, tc := range []struct {
		reason string
		opt    fsOptions
		want   string
	}{
		{"no oldest check after a takeover", fsOptions{unchecked: true, guard: LeaseGuard}, "written after"},
		{"writes not guarded by the lease", fsOptions{guard: pass}, "another handler may write"},
	} {
		t.Run(tc.reason, func(t *testing.T) {
			// A seed replays its fault schedule, not the goroutines'
			// interleaving: on a quiet machine a few seeds find both
			// defects, but under the load of the parallel suites (CI) the
			// unguarded writes' overlap took more than 10 (seen once).
			// Seeds stop at the first finding, so more cost nothing when
			// the simulation works.
			const seeds = 40
			for seed := uint64(1); seed <= seeds; seed++ {
				for _, f := range runOwnerSchedule(t, seed, tc.opt, map[string]int{}) {
					if strings.Contains(f, tc.want) {
						t.Logf("found by seed %d: %s", seed, f)
						return
					}
				}
			}
			t.Errorf("%d schedules found no %q", seeds, tc.want)
		})
	}
}
