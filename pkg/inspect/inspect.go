// Package inspect keeps, in each dispatcher and applier replica, a small
// bounded record of what the replica did lately (per item: its last sync or
// apply, the hook calls, a summary of the answer, the writes; per
// controller: operations and errors per minute and the last error), and
// answers the operator CLI's requests for it over NATS (the wire contract
// is in package bus, inspect.go).
//
// Cost: a sync or apply adds one map write under a mutex when it settles,
// and nothing goes on the bus unless an operator asks or tails. Memory is
// bounded by Capacity records per replica (a few hundred bytes each, plus
// the hook's status). The record lives in memory only: a restarted replica
// knows nothing from before it started, which every answer says (Since).
package inspect

import (
	"context"
	"encoding/json"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/metabus/metabus/pkg/bus"
)

// DefaultCapacity bounds the item records of one replica.
const DefaultCapacity = 10000

// maxChildren bounds the children identities kept per answer.
const maxChildren = 200

// Book is one replica's record. The zero value is not usable; use New. A
// nil *Book records nothing, so callers need no checks.
type Book struct {
	stage, member string
	capacity      int
	now           func() time.Time
	since         time.Time

	mu    sync.Mutex
	items map[string]*bus.Record // by item key
	// calls keeps, by item key, the last sync that called a hook, while
	// the item's last record is one that called none (a sync merged into
	// an earlier call): what the hook was last shown and answered is what
	// an operator asks for.
	calls map[string]*bus.Record
	ctrls map[string]*activity // by controller ID

	tailUntil atomic.Int64 // unix nanos; 0: nobody tails
	nc        atomic.Pointer[nats.Conn]
}

type activity struct {
	minutes [bus.ActivityMinutes]bus.MinuteCount
	lastErr *bus.Record
}

// New returns an empty book of a stage's replica (bus.WorkStage or
// bus.DesiredStage). capacity <= 0 is DefaultCapacity.
func New(stage, member string, capacity int) *Book {
	if capacity <= 0 {
		capacity = DefaultCapacity
	}
	return &Book{
		stage: stage, member: member, capacity: capacity, now: time.Now, since: time.Now(),
		items: map[string]*bus.Record{}, calls: map[string]*bus.Record{}, ctrls: map[string]*activity{},
	}
}

// Sync is the record of one sync in progress. Its methods are nil-safe.
type Sync struct {
	rec bus.Record
	mu  sync.Mutex // hook calls of one sync may run in parallel
}

// StartSync begins the record of a work item's sync.
func (b *Book) StartSync(item bus.WorkItem, seq uint64) *Sync {
	if b == nil {
		return nil
	}
	return &Sync{rec: bus.Record{
		Stage: b.stage, Controller: item.Controller, Parent: item.Parent, MapKey: item.MapKey,
		WorkSeq: seq, Reason: item.Reason, Attempt: item.Attempt, Started: b.now(),
	}}
}

// Hook records one hook call of the sync.
func (s *Sync) Hook(kind string, took time.Duration, err error) {
	if s == nil {
		return
	}
	h := bus.HookCallRecord{Hook: kind, Seconds: took.Seconds()}
	if err != nil {
		h.Error = err.Error()
	}
	s.mu.Lock()
	s.rec.Hooks = append(s.rec.Hooks, h)
	s.mu.Unlock()
}

// Answer records the desired state the sync published.
func (s *Sync) Answer(ds *bus.DesiredState) {
	if s == nil || ds == nil {
		return
	}
	a := &bus.AnswerSummary{
		Hook: ds.Hook, Children: Identities(ds.Children), Status: ds.Status,
		ResyncAfterSeconds: ds.ResyncAfterSeconds, Finalized: ds.Finalized, Revisions: len(ds.Revisions),
	}
	s.mu.Lock()
	s.rec.Parent = ds.Parent // as observed: with its resourceVersion
	s.rec.Answer = a
	s.mu.Unlock()
}

// Identities names objects (at most maxChildren of them).
func Identities(objs []*unstructured.Unstructured) []bus.ObjectID {
	out := make([]bus.ObjectID, 0, min(len(objs), maxChildren))
	for _, o := range objs {
		if o == nil {
			continue
		}
		if len(out) == maxChildren {
			break
		}
		out = append(out, bus.ObjectID{APIVersion: o.GetAPIVersion(), Kind: o.GetKind(), Namespace: o.GetNamespace(), Name: o.GetName()})
	}
	return out
}

// Done ends the sync with its result label and error, and records it.
// Every hook call counts as an operation of the controller, a failed one
// as an error.
func (b *Book) Done(s *Sync, result string, err error) {
	if b == nil || s == nil {
		return
	}
	s.mu.Lock()
	r := s.rec
	s.mu.Unlock()
	calls, errs := len(r.Hooks), 0
	for _, h := range r.Hooks {
		if h.Error != "" {
			errs++
		}
	}
	b.commit(&r, result, err, calls, errs)
}

// Applied records one apply: the desired state applied, its work
// sequence, when it started, its result label and error, and the writes it
// made. It counts as one operation, a failed one as an error.
func (b *Book) Applied(ds *bus.DesiredState, started time.Time, result string, err error, writes []bus.Write) {
	if b == nil || ds == nil {
		return
	}
	r := &bus.Record{
		Stage: b.stage, Controller: ds.Controller, Parent: ds.Parent, MapKey: ds.MapKey, WorkSeq: ds.WorkSeq,
		Reason: ds.Hook, Attempt: ds.Attempt, Started: started, Writes: writes,
	}
	if started.IsZero() {
		r.Started = b.now()
	}
	errs := 0
	if err != nil && result == "error" {
		errs = 1
	}
	b.commit(r, result, err, 1, errs)
}

// commit finishes r and stores it as its item's last record; a record of a
// sync that called no hook keeps the item's last hook call beside it.
func (b *Book) commit(r *bus.Record, result string, err error, calls, errs int) {
	now := b.now()
	r.Member, r.Result = b.member, result
	r.Seconds = now.Sub(r.Started).Seconds()
	if err != nil {
		r.Error = err.Error()
	}
	ctrl := r.Controller.ID()
	key := bus.ItemKey(ctrl, r.Parent.UID, r.MapKey)
	b.mu.Lock()
	if _, ok := b.items[key]; !ok && len(b.items) >= b.capacity {
		for k := range b.items { // an arbitrary record makes room
			delete(b.items, k)
			delete(b.calls, k)
			break
		}
	}
	switch prev := b.items[key]; {
	case len(r.Hooks) > 0 || b.stage != bus.WorkStage:
		delete(b.calls, key)
	case prev != nil && len(prev.Hooks) > 0:
		b.calls[key] = prev
	}
	b.items[key] = r
	a := b.ctrls[ctrl]
	if a == nil {
		a = &activity{}
		b.ctrls[ctrl] = a
	}
	a.count(now, calls, errs)
	if result == "error" {
		a.lastErr = r
	}
	b.mu.Unlock()
	if b.tailing(now) {
		b.trace(r)
	}
}

// count adds to the minute of now, reusing the slot of a minute that has
// left the window.
func (a *activity) count(now time.Time, calls, errs int) {
	if calls == 0 && errs == 0 {
		return
	}
	m := now.Truncate(time.Minute)
	slot := &a.minutes[(m.Unix()/60)%bus.ActivityMinutes]
	if !slot.Start.Equal(m) {
		*slot = bus.MinuteCount{Start: m}
	}
	slot.Calls += calls
	slot.Errors += errs
}

// window lists the minutes of the last ActivityMinutes that had activity,
// oldest first.
func (a *activity) window(now time.Time) []bus.MinuteCount {
	oldest := now.Truncate(time.Minute).Add(-(bus.ActivityMinutes - 1) * time.Minute)
	var out []bus.MinuteCount
	for _, m := range a.minutes {
		if !m.Start.IsZero() && !m.Start.Before(oldest) {
			out = append(out, m)
		}
	}
	sortMinutes(out)
	return out
}

func sortMinutes(ms []bus.MinuteCount) {
	for i := 1; i < len(ms); i++ {
		for j := i; j > 0 && ms[j].Start.Before(ms[j-1].Start); j-- {
			ms[j], ms[j-1] = ms[j-1], ms[j]
		}
	}
}

// Reply answers a request from the book.
func (b *Book) Reply(req bus.InspectRequest) bus.InspectReply {
	if b == nil {
		return bus.InspectReply{}
	}
	now := b.now()
	out := bus.InspectReply{Member: b.member, Stage: b.stage, Since: b.since}
	b.mu.Lock()
	defer b.mu.Unlock()
	if req.ParentUID != "" {
		for _, r := range b.items {
			if r.Parent.UID == req.ParentUID && (req.Controller == "" || r.Controller.ID() == req.Controller) {
				out.Records = append(out.Records, *r)
				if c := b.calls[bus.ItemKey(r.Controller.ID(), r.Parent.UID, r.MapKey)]; c != nil {
					out.Records = append(out.Records, *c)
				}
			}
		}
	}
	for id, a := range b.ctrls {
		if req.Controller != "" && id != req.Controller {
			continue
		}
		if req.ParentUID != "" && req.Controller == "" {
			continue
		}
		ca := bus.ControllerActivity{Controller: id, Minutes: a.window(now)}
		if a.lastErr != nil {
			le := *a.lastErr
			ca.LastError = &le
		}
		out.Controllers = append(out.Controllers, ca)
	}
	return out
}

func (b *Book) tailing(now time.Time) bool {
	until := b.tailUntil.Load()
	return until != 0 && now.UnixNano() < until
}

func (b *Book) trace(r *bus.Record) {
	nc := b.nc.Load()
	if nc == nil {
		return
	}
	data, err := json.Marshal(r)
	if err != nil {
		return
	}
	_ = nc.Publish(bus.TraceSubject(b.stage, r.Controller.ID(), bus.ParentToken(r.Parent.UID, r.MapKey)), data)
}

// Serve answers inspect requests and notes tail announcements on nc until
// the returned function is called.
func (b *Book) Serve(nc *nats.Conn) (stop func(), err error) {
	if b == nil || nc == nil {
		return func() {}, nil
	}
	b.nc.Store(nc)
	req, err := nc.Subscribe(bus.InspectSubject(b.stage), func(m *nats.Msg) {
		var r bus.InspectRequest
		if len(m.Data) > 0 && json.Unmarshal(m.Data, &r) != nil {
			return
		}
		data, err := json.Marshal(b.Reply(r))
		if err != nil || m.Reply == "" {
			return
		}
		_ = m.Respond(data)
	})
	if err != nil {
		return nil, err
	}
	tail, err := nc.Subscribe(bus.TailSubject, func(*nats.Msg) {
		b.tailUntil.Store(b.now().Add(bus.TailWindow).UnixNano())
	})
	if err != nil {
		_ = req.Unsubscribe()
		return nil, err
	}
	return func() {
		_ = req.Unsubscribe()
		_ = tail.Unsubscribe()
		b.nc.Store(nil)
	}, nil
}

type syncKey struct{}

// WithSync carries the record of a sync in progress to the code that calls
// hooks and publishes the answer.
func WithSync(ctx context.Context, s *Sync) context.Context {
	if s == nil {
		return ctx
	}
	return context.WithValue(ctx, syncKey{}, s)
}

// SyncOf is the sync record ctx carries (nil if none).
func SyncOf(ctx context.Context) *Sync {
	s, _ := ctx.Value(syncKey{}).(*Sync)
	return s
}
