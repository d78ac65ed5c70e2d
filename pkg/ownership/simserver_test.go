package ownership

import (
	"slices"
	"sort"
	"time"
)

// A model of what the protocol relies on in nats-server v2.15.2: a
// WorkQueue stream, its partition consumers (server/consumer.go: pending
// messages, the redelivery queue, BackOff, MaxDeliver, MaxAckPending, pull
// requests and interest, acks, naks, in-progress, message deletion, reset
// to the ack floor, the ack floor) and a key-value bucket with a TTL
// (server-side expiry, compare-and-set by revision).

// simMsg is a stored message.
type simMsg struct {
	seq  uint64
	item int
}

type pend struct {
	ts   time.Time // last delivery or in-progress
	dseq uint64
	sub  *simSub // the subscriber it went to
	// lease is the incarnation (creating revision) of the partition's
	// lease its replica held when it was delivered (0: none).
	lease uint64
	// askedAgain (for the checker): a handler gave this delivery back,
	// or a nak of the message's earlier delivery reached it.
	askedAgain bool
}

type pull struct {
	sub     *simSub
	n       int
	expires time.Time
}

// simConsumer is a durable pull consumer filtered to one partition.
type simConsumer struct {
	id           Partition
	sseq, dseq   uint64 // next stream sequence to deliver, next delivery sequence
	asflr, adflr uint64 // ack floors (stream, delivery)
	pending      map[uint64]*pend
	rdc          map[uint64]int
	rdq          []uint64
	waiting      []*pull
	checkAt      time.Time // scheduled pending check (zero: none)
	deleted      bool
}

type kvEntry struct {
	val     string
	rev     uint64
	created uint64 // the revision that created it: its incarnation
	at      time.Time
}

type simServer struct {
	s       *sim
	seqs    []uint64 // stream sequences stored, ascending (present or not)
	msgs    map[uint64]*simMsg
	lastSeq uint64
	n       int // partition count (stream metadata)
	cons    map[Partition]*simConsumer
	kv      map[string]*kvEntry
	kvRev   uint64
	// expired: incarnations of leases that ran out (rather than being
	// deleted by their holder).
	expired  map[uint64]bool
	ackWait  time.Duration
	backoff  []time.Duration
	maxDeliv int
	maxAck   int
}

func newSimServer(s *sim, n int, ackWait time.Duration) *simServer {
	srv := &simServer{s: s, msgs: map[uint64]*simMsg{}, n: n, cons: map[Partition]*simConsumer{}, kv: map[string]*kvEntry{}, expired: map[uint64]bool{},
		ackWait: ackWait, backoff: []time.Duration{ackWait, 2 * ackWait, 4 * ackWait, 8 * ackWait}, maxDeliv: 5, maxAck: 16}
	srv.createConsumers(n)
	return srv
}

func (srv *simServer) createConsumers(n int) {
	for p := 0; p < n; p++ {
		id := Partition{n, p}
		srv.cons[id] = &simConsumer{id: id, sseq: 1, dseq: 1, pending: map[uint64]*pend{}, rdc: map[uint64]int{}}
	}
}

func (srv *simServer) partitionOf(item, n int) int { return item % n }

func (srv *simServer) publish(item int) uint64 {
	srv.lastSeq++
	seq := srv.lastSeq
	srv.seqs = append(srv.seqs, seq)
	srv.msgs[seq] = &simMsg{seq: seq, item: item}
	for _, c := range srv.cons {
		if !c.deleted && srv.partitionOf(item, c.id.N) == c.id.P {
			srv.deliver(c)
		}
	}
	return seq
}

// --- consumer ---

func (srv *simServer) matches(c *simConsumer, seq uint64) bool {
	m := srv.msgs[seq]
	return m != nil && srv.partitionOf(m.item, c.id.N) == c.id.P
}

// next picks the next message for a waiting pull request, as getNextMsg
// does: redeliveries first (in queue order), then, below MaxAckPending,
// the next stored message at or after sseq.
func (srv *simServer) next(c *simConsumer) (seq uint64, dc int, ok bool) {
	for len(c.rdq) > 0 {
		seq = c.rdq[0]
		c.rdq = c.rdq[1:]
		p := c.pending[seq]
		if p == nil {
			continue
		}
		if srv.msgs[seq] == nil { // deleted meanwhile: as an ack
			srv.processAck(c, seq)
			continue
		}
		c.rdc[seq]++
		dc = c.rdc[seq] + 1
		if dc > srv.maxDeliv {
			srv.maxDeliveries(c, seq, dc-1)
			continue
		}
		return seq, dc, true
	}
	if len(c.pending) >= srv.maxAck {
		return 0, 0, false
	}
	i := sort.Search(len(srv.seqs), func(i int) bool { return srv.seqs[i] >= c.sseq })
	for ; i < len(srv.seqs); i++ {
		s := srv.seqs[i]
		if srv.matches(c, s) {
			c.sseq = s + 1
			return s, 1, true
		}
	}
	return 0, 0, false
}

// deliver serves the waiting pull requests as far as messages allow.
func (srv *simServer) deliver(c *simConsumer) {
	if c.deleted {
		return
	}
	now := srv.s.now
	for len(c.waiting) > 0 {
		w := c.waiting[0]
		if !w.sub.alive || !now.Before(w.expires) || w.n <= 0 {
			c.waiting = c.waiting[1:]
			continue
		}
		seq, dc, ok := srv.next(c)
		if !ok {
			break
		}
		dseq := c.dseq
		c.dseq++
		if old := c.pending[seq]; old != nil {
			srv.kvGet(leaseKey(c.id)) // notes an expiry
			srv.s.onRedelivered(c, seq, old)
		}
		var lease uint64
		if e := srv.kvGet(leaseKey(c.id)); e != nil && e.val == w.sub.r.id {
			lease = e.created
		}
		c.pending[seq] = &pend{ts: now, dseq: dseq, sub: w.sub, lease: lease}
		srv.s.onDelivered(c, seq, dc)
		w.n--
		if w.n == 0 {
			c.waiting = c.waiting[1:]
		}
		w.sub.r.receive(w.sub, seq, dseq, dc)
	}
	srv.scheduleCheck(c)
}

func (srv *simServer) deadlineOf(c *simConsumer, seq uint64, p *pend) time.Time {
	i := min(c.rdc[seq], len(srv.backoff)-1)
	return p.ts.Add(srv.backoff[i])
}

func (srv *simServer) scheduleCheck(c *simConsumer) {
	var next time.Time
	for seq, p := range c.pending {
		if slices.Contains(c.rdq, seq) {
			continue
		}
		if d := srv.deadlineOf(c, seq, p); next.IsZero() || d.Before(next) {
			next = d
		}
	}
	if next.IsZero() || (!c.checkAt.IsZero() && !next.Before(c.checkAt)) {
		return
	}
	c.checkAt = next
	srv.s.at(next, func() {
		if c.checkAt.Equal(next) {
			c.checkAt = time.Time{}
		}
		srv.checkPending(c)
	})
}

// checkPending queues expired deliveries for redelivery, sorted by
// sequence within one pass, or gives up on them after MaxDeliver.
func (srv *simServer) checkPending(c *simConsumer) {
	if c.deleted {
		return
	}
	now := srv.s.now
	var expired []uint64
	for seq, p := range c.pending {
		if now.Before(srv.deadlineOf(c, seq, p)) || slices.Contains(c.rdq, seq) {
			continue
		}
		if c.rdc[seq]+1 >= srv.maxDeliv {
			srv.maxDeliveries(c, seq, c.rdc[seq]+1)
			continue
		}
		expired = append(expired, seq)
	}
	if len(expired) > 0 {
		slices.Sort(expired)
		c.rdq = append(c.rdq, expired...)
		off := now.Sub(c.pending[expired[0]].ts)
		for _, seq := range expired {
			c.pending[seq].ts = c.pending[seq].ts.Add(off)
		}
	}
	srv.deliver(c)
}

func (srv *simServer) maxDeliveries(c *simConsumer, seq uint64, deliveries int) {
	p := c.pending[seq]
	if p != nil {
		srv.kvGet(leaseKey(c.id)) // notes an expiry
		srv.s.onRedelivered(c, seq, p)
	}
	delete(c.pending, seq)
	c.rdc[seq] = deliveries
	if p != nil {
		srv.moveAckFloor(c, p.dseq, seq)
	}
	srv.s.onMaxDeliveries(c, seq)
}

func (srv *simServer) moveAckFloor(c *simConsumer, dseq, sseq uint64) {
	if len(c.pending) == 0 {
		c.adflr, c.asflr = c.dseq-1, c.sseq-1
		return
	}
	if dseq == c.adflr+1 {
		c.adflr, c.asflr = dseq, sseq
		for ss := sseq + 1; ss < c.sseq; ss++ {
			if p, ok := c.pending[ss]; ok {
				if p.dseq > 0 {
					c.adflr, c.asflr = p.dseq-1, ss-1
				}
				break
			}
		}
	}
}

func (srv *simServer) processAck(c *simConsumer, seq uint64) {
	p, ok := c.pending[seq]
	if !ok {
		return
	}
	delete(c.pending, seq)
	delete(c.rdc, seq)
	c.rdq = slices.DeleteFunc(c.rdq, func(s uint64) bool { return s == seq })
	srv.moveAckFloor(c, p.dseq, seq)
}

// ack settles a delivery of c: a WorkQueue stream then drops the message.
// It reports whether the server answers (an ack above the delivery
// pointer, after a reset, is ignored without an answer).
func (srv *simServer) ack(c *simConsumer, seq uint64) bool {
	if c.deleted || seq >= c.sseq {
		return false
	}
	srv.processAck(c, seq)
	srv.removeMsg(seq)
	srv.deliver(c)
	return true
}

// nak gives a delivery back, as nats-server's processNak does: ignored
// if its delivery sequence is out of range (at or below the delivery ack
// floor, or beyond the delivery pointer) or the message is not pending,
// whichever delivery of it the nak was for. asked (for the checker) says
// a handler asked for the redelivery.
func (srv *simServer) nak(c *simConsumer, seq, dseq uint64, asked bool) {
	p := c.pending[seq]
	if c.deleted || dseq <= c.adflr || dseq > c.dseq || p == nil || slices.Contains(c.rdq, seq) {
		return
	}
	p.askedAgain = p.askedAgain || asked
	c.rdq = append(c.rdq, seq)
	srv.deliver(c)
}

func (srv *simServer) inProgress(c *simConsumer, seq uint64) {
	if p := c.pending[seq]; p != nil && !c.deleted {
		p.ts = srv.s.now
		srv.scheduleCheck(c)
	}
}

func (srv *simServer) removeMsg(seq uint64) {
	if srv.msgs[seq] == nil {
		return
	}
	delete(srv.msgs, seq)
	i := sort.Search(len(srv.seqs), func(i int) bool { return srv.seqs[i] >= seq })
	srv.seqs = slices.Delete(srv.seqs, i, i+1)
}

// deleteMsg deletes a message: a consumer holding it pending treats it
// as acknowledged.
func (srv *simServer) deleteMsg(seq uint64) {
	srv.removeMsg(seq)
	for _, c := range srv.cons {
		if c.pending[seq] != nil {
			srv.processAck(c, seq)
			srv.deliver(c)
		}
	}
}

func (srv *simServer) reset(c *simConsumer) {
	c.pending, c.rdc, c.rdq = map[uint64]*pend{}, map[uint64]int{}, nil
	c.sseq, c.dseq = c.asflr+1, 1
	c.adflr, c.asflr = 0, c.sseq-1
	srv.s.onReset(c)
	srv.deliver(c)
}

func (srv *simServer) info(c *simConsumer) ConsumerState {
	return ConsumerState{AckPending: len(c.pending), Delivered: c.sseq - 1, DeliveredSeq: c.dseq - 1, AckFloor: c.asflr}
}

// firstOf is the first message of item in the stream at or after from.
func (srv *simServer) firstOf(item int, from uint64) (uint64, bool) {
	i := sort.Search(len(srv.seqs), func(i int) bool { return srv.seqs[i] >= from })
	for ; i < len(srv.seqs); i++ {
		if m := srv.msgs[srv.seqs[i]]; m != nil && m.item == item {
			return m.seq, true
		}
	}
	return 0, false
}

// --- key-value bucket (TTL = lease) ---

func (srv *simServer) kvGet(key string) *kvEntry {
	e := srv.kv[key]
	if e != nil && !srv.s.now.Before(e.at.Add(srv.s.lease)) {
		delete(srv.kv, key)
		srv.expired[e.created] = true
		return nil
	}
	return e
}

func (srv *simServer) kvCreate(key, val string) (uint64, bool) {
	if srv.kvGet(key) != nil {
		return 0, false
	}
	srv.kvRev++
	srv.kv[key] = &kvEntry{val: val, rev: srv.kvRev, created: srv.kvRev, at: srv.s.now}
	return srv.kvRev, true
}

func (srv *simServer) kvUpdate(key, val string, rev uint64) (uint64, bool) {
	e := srv.kvGet(key)
	if e == nil || e.rev != rev {
		return 0, false
	}
	srv.kvRev++
	e.val, e.rev, e.at = val, srv.kvRev, srv.s.now
	return srv.kvRev, true
}

func (srv *simServer) kvPut(key, val string) {
	srv.kvRev++
	srv.kv[key] = &kvEntry{val: val, rev: srv.kvRev, at: srv.s.now}
}

func (srv *simServer) kvDelete(key string, rev uint64) bool {
	e := srv.kvGet(key)
	if e == nil || (rev != 0 && e.rev != rev) {
		return false
	}
	delete(srv.kv, key)
	return true
}

// leased reports whether some lease of layout n is held.
func (srv *simServer) leased(n int) bool {
	for p := 0; p < n; p++ {
		if srv.kvGet(leaseKey(Partition{n, p})) != nil {
			return true
		}
	}
	return false
}

func leaseKey(p Partition) string { return "lease." + p.String() }

// reconcile is the watcher's layout keeper: once no lease of another
// layout is held, it deletes that layout's consumers and creates the
// current one's (which deliver what is left from the start).
func (srv *simServer) reconcile() {
	old := -1
	for id := range srv.cons {
		if id.N != srv.n {
			old = id.N
		}
	}
	if old < 0 || srv.leased(old) {
		return
	}
	for id, c := range srv.cons {
		if id.N == old {
			c.deleted = true
			delete(srv.cons, id)
			srv.s.onConsumerDeleted(c)
		}
	}
	srv.createConsumers(srv.n)
	for _, c := range srv.cons {
		srv.deliver(c)
	}
}
