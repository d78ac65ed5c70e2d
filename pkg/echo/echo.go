// Package echo follows metabus's own answers through the applier, so that
// their writes come back to a hook in one call, and, for controllers that
// opt in, not at all.
//
// Under upstream's contract (the default) a hook sees every change, its
// own writes included, but not necessarily each in a call of its own. Two
// decisions merge calls without skipping a change:
//
//   - a dispatcher that published an answer for an item (Expect) waits,
//     boundedly, for the applier's Done note before it syncs the item
//     again (Applying), and asks for a snapshot that reflects every write
//     of that answer (Written): the hook sees them all at once, never an
//     intermediate state of them;
//   - a work item caused by an event whose snapshot is exactly what the
//     item's latest call was shown (Shown) is merged into that call: the
//     event's change was in it already.
//
// Echo suppression, the opt-in (bus.SuppressEchoesAnnotation), goes
// further:
//
// An applier that applied a desired state completely broadcasts a
// bus.Applied note: what the hook was shown, and each update it made as
// "object U from resourceVersion A to B". Dispatchers also remember what
// they showed the hook themselves. Two decisions follow, both per controller
// (a write of one controller is news to another):
//
//   - an update event whose new resourceVersion one of this controller's
//     recent writes produced is an echo: the watcher does not enqueue it
//     (Book.Wrote). Dropping the event alone is safe even if that write
//     folded in someone else's earlier change: that change had an event of
//     its own.
//   - a sync is an echo when every object the hook would be shown is either
//     as the hook's latest call saw it, or reached from there only through
//     this controller's own writes (a chain of From→To that starts at the
//     version the hook saw). The dispatcher then skips the hook (Book.Echo,
//     whose core is the pure IsEcho). The latest answer is on its way to, or
//     in, the cluster and desired states apply in order, so nothing but our
//     own writes separates the world from what that answer was computed for.
//     A write made against a version the hook never saw breaks the chain:
//     a snapshot that folds someone else's change into our write is news.
//
// What is never an echo: a delete, a create for a per-parent item (the set
// of objects changes, e.g. a child the hook asked for now exists and should
// be counted in the parent's status), and any change by anyone else. A
// keyed item's hook (a MapController's map hook) answers for its own
// outputs only and writes no status: an output it asked for, as this
// controller created it, is no news to it, so such a create is an echo
// (the applier notes a create as a write from ""). Notes travel on core NATS without persistence: a
// lost or late note only costs the hook call it would have saved.
package echo

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/metabus/metabus/pkg/bus"
	"github.com/metabus/metabus/pkg/snapshot"
)

// DefaultSize bounds how many items (and, separately, written objects) a
// Book remembers in each of its two generations.
const DefaultSize = 50000

// recentWrites is how many of its latest writes an object keeps: the
// longest chain of our own writes an echo may span.
const recentWrites = 4

// IsEcho reports whether a hook about to be shown now (UID to
// resourceVersion of every object in the request) would see only what it was
// shown at its latest call (ref), or versions that writes(uid) lead to from
// there. With creates, an object the latest call was not shown may be one
// this controller created (a chain of writes from ""); without, it is news.
// An object of ref missing from now (deleted) is always news.
func IsEcho(ref, now map[string]string, writes func(uid string) []bus.Write, creates bool) bool {
	if len(ref) == 0 || len(now) < len(ref) || (!creates && len(now) != len(ref)) {
		return false
	}
	shown := 0
	for uid, rv := range now {
		seen, ok := ref[uid]
		if ok {
			shown++
		} else if !creates {
			return false
		}
		// A created object's chain starts at "" (seen is "" when not ok).
		if !reaches(seen, rv, writes, uid) {
			return false
		}
	}
	return shown == len(ref)
}

// reaches reports whether rv is seen, or the end of a chain of our writes
// that starts at seen.
func reaches(seen, rv string, writes func(uid string) []bus.Write, uid string) bool {
	var ws []bus.Write
	if writes != nil {
		ws = writes(uid)
	}
	for step := 0; step <= len(ws); step++ {
		if rv == seen {
			return true
		}
		if rv == "" {
			return false
		}
		prev, found := "", false
		for _, w := range ws {
			if w.To == rv {
				prev, found = w.From, true
				break
			}
		}
		if !found || (prev == "" && seen != "") {
			return false
		}
		rv = prev
	}
	return false
}

// Inputs lists the objects of a snapshot that a hook request is built from:
// the controller, the parent, the children and the related objects, by UID.
// It returns nil, which is never an echo, when the snapshot asks for
// ownership changes (adoptions or releases are news to the hook).
//
// A keyed snapshot (one map key of a keyed kind's parent, snap.MapKey set)
// lists the controller, the key's input (snap.Input, when the key is not
// detached) and the key's outputs (snap.Children), but not the parent: the
// parent's status is rewritten by its per-parent item all the time, and
// counting it would make every key's next event news. A change of the
// parent itself reaches its keys through the per-parent item's fan-out,
// whose items are resyncs and never echo-checked.
//
// A snapshot carrying a Summary (a keyed kind's per-parent snapshot) is
// computed from the watcher's caches, not from objects a hook is shown, so
// it is never an echo: nil.
func Inputs(snap *snapshot.Response) map[string]string {
	if snap == nil || snap.Parent == nil || snap.Controller == nil || snap.Summary != nil {
		return nil
	}
	in := map[string]string{string(snap.Controller.GetUID()): snap.Controller.GetResourceVersion()}
	if snap.MapKey == "" {
		in[string(snap.Parent.GetUID())] = snap.Parent.GetResourceVersion()
	} else if snap.Input != nil {
		in[string(snap.Input.GetUID())] = snap.Input.GetResourceVersion()
	}
	for _, groups := range [][]snapshot.Group{snap.Children, snap.Related} {
		for _, g := range groups {
			if len(g.Adopt) > 0 || len(g.Release) > 0 {
				return nil
			}
			for _, o := range g.Objects {
				in[string(o.GetUID())] = o.GetResourceVersion()
			}
		}
	}
	return in
}

// Book remembers, per unit of work (a parent, or one map key of a keyed
// kind's parent: bus.ItemKey), the inputs of the hook's latest call (from
// this dispatcher's own calls and from every applier's notes, whichever is
// newer by work sequence) and, per object, its latest writes. The keys of
// one parent are called independently and in parallel, so each keeps its
// own reference: one key's call never makes another's sync look new (or
// old). Both live in
// two generations of bounded maps: when the current one is full it becomes
// the old one and the older is dropped. Forgetting only costs a hook call.
// The zero value is not usable; call NewBook.
type Book struct {
	size int
	// origin names this book on the notes its process's appliers
	// broadcast, so that its own subscription skips them: they were
	// recorded directly, and decoding them again was 1.5% of an
	// all-in-one process's CPU.
	origin string

	mu        sync.Mutex
	refs, old map[string]ref         // by bus.ItemKey
	writes    map[string][]bus.Write // by controller ID / object UID, newest last
	wold      map[string][]bus.Write
	// inflight are writes this process has sent but not yet heard back
	// from, by controller ID / object UID (a parent's applies are serial,
	// so an object has at most one).
	inflight map[string]*flight
	// answers are the desired states this process published whose Done
	// note it expects, by bus.ItemKey (Expect), in two generations like
	// refs.
	answers, aold map[string]*answer
	// strategies are the apply strategies the Done notes reported, read
	// through ApplierStrategy; now is the clock they are stamped with.
	strategies Strategies
	now        func() time.Time
}

// answer is a published desired state's way through the applier: done
// closes when its Done note (or a later one of the item's) arrives, and
// fresh is what that note says its writes produced.
type answer struct {
	seq   uint64
	done  chan struct{}
	ended bool
	fresh map[string]string
}

type flight struct {
	from string
	done chan struct{}
}

type ref struct {
	seq    uint64
	inputs map[string]string
	// applied is the latest work sequence whose desired state an applier
	// reported applied completely.
	applied uint64
}

// NewBook returns a Book holding up to size entries per generation
// (DefaultSize if size <= 0).
func NewBook(size int) *Book {
	if size <= 0 {
		size = DefaultSize
	}
	return &Book{size: size, origin: newOrigin(), refs: map[string]ref{}, old: map[string]ref{},
		writes: map[string][]bus.Write{}, wold: map[string][]bus.Write{}, inflight: map[string]*flight{},
		answers: map[string]*answer{}, aold: map[string]*answer{}, now: time.Now}
}

// Record takes an applier's note in: its writes, and its inputs (if any)
// as the reference of the note's item (a.Key()) unless a newer call is
// known.
func (b *Book) Record(a *bus.Applied) {
	if b == nil || a == nil || a.ParentUID == "" {
		return
	}
	ctrl := a.Controller.ID()
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(a.Inputs) > 0 {
		// A note with writes only (sent as each write happens) says
		// nothing about what the hook was shown, nor that the apply
		// completed.
		key := a.Key()
		b.refLocked(key, a.WorkSeq, a.Inputs)
		b.appliedLocked(key, a.WorkSeq)
	}
	for _, w := range a.Writes {
		b.addWriteLocked(ctrl, w)
	}
	if a.Done {
		b.doneLocked(a.Key(), a.WorkSeq, a.Fresh)
		b.strategies.Saw(a.Strategy, b.now())
	}
}

// ApplierStrategy is the apply strategy every applier that settled a
// desired state within StrategyWindow reported on its Done notes, and
// false while that is not one known strategy (Strategies.Agreed).
func (b *Book) ApplierStrategy() (string, bool) {
	if b == nil {
		return "", false
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.strategies.Agreed(b.now(), StrategyWindow)
}

// Expect records that this process is about to publish the desired state
// of work sequence seq for the parent's item with map key mapKey, and that
// its Done note (bus.Applied.Done) will follow once an applier settled it.
// Call it before publishing: an applier in this process can settle the
// desired state before the publish returns. The returned function forgets
// the expectation, for a publish that failed.
func (b *Book) Expect(ctrlID, parentUID, mapKey string, seq uint64) (cancel func()) {
	if b == nil {
		return func() {}
	}
	key := bus.ItemKey(ctrlID, parentUID, mapKey)
	a := &answer{seq: seq, done: make(chan struct{})}
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.answers) >= b.size {
		b.aold, b.answers = b.answers, make(map[string]*answer, len(b.answers))
	}
	b.answers[key] = a
	delete(b.aold, key)
	return func() {
		b.mu.Lock()
		defer b.mu.Unlock()
		if b.answers[key] == a {
			delete(b.answers, key)
		}
		if b.aold[key] == a {
			delete(b.aold, key)
		}
	}
}

// doneLocked ends the expected answer of key if the note is for its work
// sequence or a later one (desired states of an item apply in order).
func (b *Book) doneLocked(key string, seq uint64, fresh map[string]string) {
	a := b.answerLocked(key)
	if a == nil || a.ended || seq < a.seq {
		return
	}
	a.ended, a.fresh = true, fresh
	close(a.done)
}

// Applying returns a channel that closes when the latest desired state
// this process published for the parent's item with map key mapKey has
// been settled by an applier (its Done note arrived), or nil when none is
// outstanding. A sync of the item made before then would show the hook
// only part of that answer's writes, and the rest would each cost a call.
func (b *Book) Applying(ctrlID, parentUID, mapKey string) <-chan struct{} {
	if b == nil {
		return nil
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	a := b.answerLocked(bus.ItemKey(ctrlID, parentUID, mapKey))
	if a == nil || a.ended {
		return nil
	}
	return a.done
}

// answerLocked is the expected answer of key, nil if none.
func (b *Book) answerLocked(key string) *answer {
	if a := b.answers[key]; a != nil {
		return a
	}
	return b.aold[key]
}

// Written returns, and forgets, the resourceVersions the writes of the
// item's latest settled answer produced, per resource (bus.Applied.Fresh):
// the freshness floor under which the next snapshot shows all of them.
// It returns nil while the answer is outstanding or when nothing is known.
func (b *Book) Written(ctrlID, parentUID, mapKey string) map[string]string {
	if b == nil {
		return nil
	}
	key := bus.ItemKey(ctrlID, parentUID, mapKey)
	b.mu.Lock()
	defer b.mu.Unlock()
	a := b.answerLocked(key)
	if a == nil || !a.ended {
		return nil
	}
	delete(b.answers, key)
	delete(b.aold, key)
	return a.fresh
}

// Shown reports whether the latest hook call of the parent's item with map
// key mapKey was shown exactly now: the same objects, each at the same
// resourceVersion. A sync that would show the hook now is then a repeat of
// that call: whatever caused it was already shown, so calling again merges
// into that call rather than skipping a change (upstream's contract holds:
// the hook has seen every change, its own writes included). A call whose
// inputs were not just objects (nil) is never repeated this way.
func (b *Book) Shown(ctrlID, parentUID, mapKey string, now map[string]string) bool {
	if b == nil || len(now) == 0 {
		return false
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	r, ok := b.lookupLocked(bus.ItemKey(ctrlID, parentUID, mapKey))
	return ok && len(r.inputs) > 0 && maps.Equal(r.inputs, now)
}

func (b *Book) addWriteLocked(ctrl string, w bus.Write) {
	if w.UID == "" || w.To == "" {
		return
	}
	key := ctrl + "/" + w.UID
	prev := b.writesLocked(key)
	if slices.Contains(prev, w) {
		return // the same write twice (recorded in-process, then broadcast)
	}
	if len(b.writes) >= b.size {
		b.wold, b.writes = b.writes, make(map[string][]bus.Write, len(b.writes))
	}
	// Sized to what it holds: most objects have one recent write, and
	// room for recentWrites was held for each of them.
	keep := prev[max(0, len(prev)-(recentWrites-1)):]
	ws := make([]bus.Write, 0, len(keep)+1)
	ws = append(ws, keep...)
	b.writes[key] = append(ws, w)
}

// Begin records that this process is about to update object uid of the
// controller, written against resourceVersion from. The returned function
// must be called when the write returns, with the resourceVersion it
// produced ("" if it failed). Until then, Await lets a sync that would be an
// echo once the write is known wait for it instead of calling the hook: the
// write's watch event can reach a dispatcher before the writer has read the
// API server's answer.
func (b *Book) Begin(ctrlID, uid, from string) func(to string) {
	if b == nil || uid == "" || from == "" {
		return func(string) {}
	}
	key := ctrlID + "/" + uid
	f := &flight{from: from, done: make(chan struct{})}
	b.mu.Lock()
	b.inflight[key] = f
	b.mu.Unlock()
	return func(to string) {
		b.mu.Lock()
		if to != "" {
			b.addWriteLocked(ctrlID, bus.Write{UID: uid, From: from, To: to})
		}
		if b.inflight[key] == f {
			delete(b.inflight, key)
		}
		b.mu.Unlock()
		close(f.done)
	}
}

// Await returns a channel that closes when a write in flight on one of the
// objects in now returns, or nil if none is in flight: a sync that is not
// an echo yet may become one then.
func (b *Book) Await(ctrlID string, now map[string]string) <-chan struct{} {
	if b == nil {
		return nil
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	for uid := range now {
		if f := b.inflight[ctrlID+"/"+uid]; f != nil {
			return f.done
		}
	}
	return nil
}

// Called records that the hook of the parent's item with map key mapKey
// ("" for the per-parent item) was called at work sequence seq with inputs
// (nil: a call whose inputs are not just objects, after which nothing is
// an echo until the next call).
func (b *Book) Called(ctrlID, parentUID, mapKey string, seq uint64, inputs map[string]string) {
	if b == nil {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.refLocked(bus.ItemKey(ctrlID, parentUID, mapKey), seq, inputs)
}

func (b *Book) refLocked(key string, seq uint64, inputs map[string]string) {
	cur, ok := b.lookupLocked(key)
	if ok && cur.seq > seq {
		return
	}
	b.storeLocked(key, ref{seq: seq, inputs: inputs, applied: cur.applied})
}

// appliedLocked records that the desired state of work sequence seq was
// applied completely.
func (b *Book) appliedLocked(key string, seq uint64) {
	if cur, ok := b.lookupLocked(key); ok && cur.applied < seq {
		cur.applied = seq
		b.storeLocked(key, cur)
	}
}

func (b *Book) storeLocked(key string, r ref) {
	if len(b.refs) >= b.size {
		b.old, b.refs = b.refs, make(map[string]ref, len(b.refs))
	}
	b.refs[key] = r
	delete(b.old, key)
}

func (b *Book) lookupLocked(key string) (ref, bool) {
	if r, ok := b.refs[key]; ok {
		return r, true
	}
	r, ok := b.old[key]
	return r, ok
}

func (b *Book) writesLocked(key string) []bus.Write {
	if ws, ok := b.writes[key]; ok {
		return ws
	}
	return b.wold[key]
}

// Superseded reports whether the latest known hook call of the parent's
// item with map key mapKey was made for a work item later than seq and its
// desired state was applied completely: then the sync of seq, whose apply conflicted, has nothing
// left to do that an echo check of that call would not see. A later call
// whose apply is unknown, still running or conflicted too does not count:
// a conflict requeue folded into another parent's queued item (refused
// as already queued) would otherwise be lost with its apply.
func (b *Book) Superseded(ctrlID, parentUID, mapKey string, seq uint64) bool {
	if b == nil {
		return false
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	r, ok := b.lookupLocked(bus.ItemKey(ctrlID, parentUID, mapKey))
	return ok && r.seq > seq && r.applied >= r.seq
}

// Wrote reports whether one of the controller's recent writes of object uid
// produced resourceVersion rv.
func (b *Book) Wrote(ctrlID, uid, rv string) bool {
	if b == nil || rv == "" {
		return false
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, w := range b.writesLocked(ctrlID + "/" + uid) {
		if w.To == rv {
			return true
		}
	}
	return false
}

// Echo reports whether a sync of the parent's item with map key mapKey
// ("" for the per-parent item) whose hook would be shown now is an echo of
// that item's latest hook call.
func (b *Book) Echo(ctrlID, parentUID, mapKey string, now map[string]string) bool {
	if b == nil || len(now) == 0 {
		return false
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	r, _ := b.lookupLocked(bus.ItemKey(ctrlID, parentUID, mapKey))
	// Creates are echoes to a keyed item only (see the package doc).
	return IsEcho(r.inputs, now, func(uid string) []bus.Write { return b.writesLocked(ctrlID + "/" + uid) }, mapKey != "")
}

// Subscribe feeds the Book from AppliedSubject until the subscription ends.
// Malformed notes are ignored: they are hints.
func (b *Book) Subscribe(nc *nats.Conn) (*nats.Subscription, error) {
	return nc.Subscribe(bus.AppliedSubject, func(m *nats.Msg) {
		if m.Header != nil && m.Header.Get(bus.AppliedOriginHeader) == b.origin {
			return // this process's own note, recorded when it was made
		}
		var a bus.Applied
		if err := json.Unmarshal(m.Data, &a); err == nil {
			b.Record(&a)
		}
	})
}

// Origin is what the notes of b's process carry in
// bus.AppliedOriginHeader ("" for a nil book: no process-wide book).
func (b *Book) Origin() string {
	if b == nil {
		return ""
	}
	return b.origin
}

// newOrigin is a random name for a book.
func newOrigin() string {
	var r [12]byte
	_, _ = rand.Read(r[:]) // never fails (crypto/rand)
	return hex.EncodeToString(r[:])
}

// Publish broadcasts a note; origin, if not "", is the Origin of the book
// it was recorded in directly.
func Publish(nc *nats.Conn, a *bus.Applied, origin string) error {
	data, err := json.Marshal(a)
	if err != nil {
		return err
	}
	m := &nats.Msg{Subject: bus.AppliedSubject, Data: data}
	if origin != "" {
		m.Header = nats.Header{bus.AppliedOriginHeader: []string{origin}}
	}
	return nc.PublishMsg(m)
}
