// Package fairq decides which held message a replica runs next. It is the
// pure core of a stage's consumer: no goroutines, no clocks, no I/O.
//
// Three rules, in this order:
//   - one message at a time per key (a parent), in sequence order: a key's
//     next message waits until the running one is done;
//   - at most PerGroup messages running per group (a controller), so one
//     controller's slow or hanging hook can hold only its own share;
//   - at most Total running in all, shared between groups by weight when
//     saturated (stride scheduling: the group that has received the least
//     service per unit of weight goes next).
package fairq

import (
	"sort"
)

// Limits bound concurrency. Values ≤ 0 mean 1.
type Limits struct {
	// PerGroup is how many messages of one group may run at once.
	PerGroup int
	// Total is how many messages may run at once in all.
	Total int
}

// Queue holds messages of type T. The zero value is not usable: call New.
type Queue[T any] struct {
	limits  Limits
	weight  func(group string) int
	groups  map[string]*group[T]
	keys    map[string]*key[T]
	running int
	held    int
	// vtime is the pass of the last group served: an idle group that
	// becomes busy starts here, so it neither owes nor is owed service
	// for the time it had nothing to do.
	vtime float64
}

type group[T any] struct {
	name    string
	ready   []*key[T] // keys with a message and none running, FIFO
	running int
	pass    float64
}

type key[T any] struct {
	name, group string
	msgs        []entry[T] // sorted by seq
	running     bool
	queued      bool // in its group's ready list
}

type entry[T any] struct {
	seq uint64
	v   T
}

// New returns an empty queue. weight (optional) gives a group's share
// when the total limit is reached; missing or ≤ 0 weights count as 1.
func New[T any](l Limits, weight func(group string) int) *Queue[T] {
	if l.PerGroup <= 0 {
		l.PerGroup = 1
	}
	if l.Total <= 0 {
		l.Total = 1
	}
	return &Queue[T]{limits: l, weight: weight, groups: map[string]*group[T]{}, keys: map[string]*key[T]{}}
}

// Push adds a message of key k in group g with sequence seq. A key's
// messages run in seq order whatever order they arrive in (a redelivery
// can arrive after a later message of the same key).
func (q *Queue[T]) Push(g, k string, seq uint64, v T) {
	ks := q.keys[k]
	if ks == nil {
		ks = &key[T]{name: k, group: g}
		q.keys[k] = ks
	}
	i := sort.Search(len(ks.msgs), func(i int) bool { return ks.msgs[i].seq > seq })
	ks.msgs = append(ks.msgs, entry[T]{})
	copy(ks.msgs[i+1:], ks.msgs[i:])
	ks.msgs[i] = entry[T]{seq: seq, v: v}
	q.held++
	q.makeReady(ks)
}

func (q *Queue[T]) group(name string) *group[T] {
	gs := q.groups[name]
	if gs == nil {
		gs = &group[T]{name: name, pass: q.vtime}
		q.groups[name] = gs
	}
	return gs
}

// makeReady puts a key with messages and none running on its group's
// ready list.
func (q *Queue[T]) makeReady(ks *key[T]) {
	if ks.running || ks.queued || len(ks.msgs) == 0 {
		return
	}
	gs := q.group(ks.group)
	if len(gs.ready) == 0 && gs.running == 0 && gs.pass < q.vtime {
		gs.pass = q.vtime
	}
	gs.ready = append(gs.ready, ks)
	ks.queued = true
}

// Next takes the message to run now, if the limits allow one: the first
// message of the first ready key of the eligible group with the lowest
// pass (ties: the group name, for determinism). The key stays busy until
// Done.
func (q *Queue[T]) Next() (g, k string, seq uint64, v T, ok bool) {
	if q.running >= q.limits.Total {
		return "", "", 0, v, false
	}
	var best *group[T]
	for _, gs := range q.groups {
		if len(gs.ready) == 0 || gs.running >= q.limits.PerGroup {
			continue
		}
		if best == nil || gs.pass < best.pass || (gs.pass == best.pass && gs.name < best.name) {
			best = gs
		}
	}
	if best == nil {
		return "", "", 0, v, false
	}
	ks := best.ready[0]
	best.ready[0] = nil
	best.ready = best.ready[1:]
	ks.queued = false
	ks.running = true
	e := ks.msgs[0]
	ks.msgs[0] = entry[T]{}
	ks.msgs = ks.msgs[1:]
	best.running++
	q.running++
	q.held--
	q.vtime = best.pass
	w := 1
	if q.weight != nil {
		if x := q.weight(best.name); x > 0 {
			w = x
		}
	}
	best.pass += 1 / float64(w)
	return best.name, ks.name, e.seq, e.v, true
}

// Done ends the running message of key k; its next message, if any,
// becomes ready. Empty keys and idle groups are forgotten.
func (q *Queue[T]) Done(k string) {
	ks := q.keys[k]
	if ks == nil || !ks.running {
		return
	}
	ks.running = false
	q.running--
	gs := q.groups[ks.group]
	gs.running--
	q.makeReady(ks)
	q.forget(ks)
}

func (q *Queue[T]) forget(ks *key[T]) {
	if ks.running || len(ks.msgs) > 0 {
		return
	}
	delete(q.keys, ks.name)
	if gs := q.groups[ks.group]; gs != nil && gs.running == 0 && len(gs.ready) == 0 {
		delete(q.groups, ks.group)
	}
}

// Remove takes out every waiting (not running) message for which drop
// returns true, and returns them in key and seq order, so they can be
// handed back (a partition given to another replica).
func (q *Queue[T]) Remove(drop func(g, k string, v T) bool) []T {
	var out []T
	names := make([]string, 0, len(q.keys))
	for n := range q.keys {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		ks := q.keys[n]
		kept := ks.msgs[:0]
		for _, e := range ks.msgs {
			if drop(ks.group, ks.name, e.v) {
				out = append(out, e.v)
				q.held--
				continue
			}
			kept = append(kept, e)
		}
		ks.msgs = kept
		if len(ks.msgs) == 0 && ks.queued {
			gs := q.groups[ks.group]
			for i, r := range gs.ready {
				if r == ks {
					gs.ready = append(gs.ready[:i], gs.ready[i+1:]...)
					break
				}
			}
			ks.queued = false
		}
		q.forget(ks)
	}
	return out
}

// HasWaiting reports whether key k has a message waiting behind the one
// running (or about to run).
func (q *Queue[T]) HasWaiting(k string) bool {
	ks := q.keys[k]
	return ks != nil && len(ks.msgs) > 0
}

// Running is the number of messages running.
func (q *Queue[T]) Running() int { return q.running }

// Waiting is the number of messages held but not running.
func (q *Queue[T]) Waiting() int { return q.held }

// Groups is the number of groups with messages running or waiting.
func (q *Queue[T]) Groups() int { return len(q.groups) }
