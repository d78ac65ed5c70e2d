package readaccess

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/metabus/metabus/pkg/identity"
)

// Review asks whether s.Identity may do verb on s (the I/O edge: a
// SubjectAccessReview). An error is no answer: the scope stays unknown.
type Review func(ctx context.Context, s Scope, verb string) (bool, error)

// Options of a Cache.
type Options struct {
	// Recheck is how often each cached answer is asked again: the bound on
	// how long a change of the identity's RBAC takes to be seen (0: one
	// minute).
	Recheck time.Duration
	// Idle drops an answer no snapshot used for this long (0: ten
	// Rechecks), so scopes nobody asks about any more cost no reviews.
	Idle time.Duration
	// Max bounds the cached answers (0: 4096): identities, resources and
	// namespaces are chosen by controller authors.
	Max int
	// OnChange is called, outside the cache's lock, when a re-asked
	// review changes a verdict the cache held (an RBAC change): the
	// identity's controllers must resync, so that what became readable is
	// sent and what no longer is stops being sent.
	OnChange func(identity.Identity)
	// Now is the clock (tests).
	Now func() time.Time
}

// Cache holds review answers per scope. Lookups are a read-locked map
// access; reviews happen only for a scope never asked (Ensure), for the
// scopes of a controller whose spec changed (Refresh), and once per
// Recheck for each answer still in use (Run).
type Cache struct {
	review Review
	opt    Options

	// lookupFn is lookup as a Lookup, made once: a method value made at
	// each call would cost an allocation per object of a snapshot.
	lookupFn Lookup

	mu       sync.RWMutex
	entries  map[Scope]*entry
	inflight map[Scope]*call
}

type entry struct {
	verdict Verdict
	checked time.Time
	// used is set by lookups and cleared by each recheck round; idle
	// counts the rounds it stayed clear.
	used atomic.Bool
	idle int
}

type call struct {
	done    chan struct{}
	verdict Verdict
	err     error
}

// NewCache is a cache asking review.
func NewCache(review Review, opt Options) *Cache {
	if opt.Recheck <= 0 {
		opt.Recheck = time.Minute
	}
	if opt.Idle <= 0 {
		opt.Idle = 10 * opt.Recheck
	}
	if opt.Max <= 0 {
		opt.Max = 4096
	}
	if opt.Now == nil {
		opt.Now = time.Now
	}
	c := &Cache{review: review, opt: opt, entries: map[Scope]*entry{}, inflight: map[Scope]*call{}}
	c.lookupFn = c.lookup
	return c
}

// lookup is the cached verdict of exactly s, marking it used.
func (c *Cache) lookup(s Scope) Verdict {
	c.mu.RLock()
	e := c.entries[s]
	var v Verdict
	if e != nil {
		v = e.verdict
	}
	c.mu.RUnlock()
	if e == nil {
		return Unknown
	}
	if !e.used.Load() {
		e.used.Store(true)
	}
	return v
}

// Verdict is the decision on s from the cached answers only.
func (c *Cache) Verdict(s Scope) Verdict { return Decide(c.lookupFn, s) }

// Ensure is the decision on s, asking the reviews it still needs (at most
// two: cluster-wide, then the namespace). Concurrent callers needing the
// same review share one. An error leaves s unknown.
func (c *Cache) Ensure(ctx context.Context, s Scope) (Verdict, error) {
	for range 2 {
		next, ok := Next(c.lookupFn, s)
		if !ok {
			break
		}
		if _, err := c.ask(ctx, next, true); err != nil {
			return Unknown, err
		}
	}
	return c.Verdict(s), nil
}

// Refresh asks again the reviews of scopes and of every cached scope of
// id (a controller's spec changed: its answers are re-checked now, not at
// the next round). The first error is returned after every review is
// asked.
func (c *Cache) Refresh(ctx context.Context, id identity.Identity, scopes []Scope) error {
	seen := map[Scope]bool{}
	var all []Scope
	add := func(s Scope) {
		if !seen[s] {
			seen[s] = true
			all = append(all, s)
		}
	}
	for _, s := range scopes {
		add(s)
	}
	c.mu.RLock()
	for s := range c.entries {
		if s.Identity == id {
			add(s)
		}
	}
	c.mu.RUnlock()
	var errs []error
	for _, s := range all {
		if _, err := c.ask(ctx, s, true); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// Run re-asks every answer in use once per Recheck until ctx ends, and
// drops those unused for Idle. An answer whose re-check keeps failing
// turns unknown after three Rechecks: a grant revoked while the API
// server does not answer reviews is not trusted for ever.
func (c *Cache) Run(ctx context.Context, onError func(Scope, error)) {
	wait.UntilWithContext(ctx, func(ctx context.Context) { c.recheck(ctx, onError) }, c.opt.Recheck)
}

// recheck is one round of Run.
func (c *Cache) recheck(ctx context.Context, onError func(Scope, error)) {
	idleRounds := int(c.opt.Idle / c.opt.Recheck)
	var due []Scope
	c.mu.Lock()
	for s, e := range c.entries {
		if e.used.Swap(false) {
			e.idle = 0
		} else if e.idle++; e.idle >= idleRounds {
			delete(c.entries, s)
			continue
		}
		due = append(due, s)
	}
	c.mu.Unlock()
	for _, s := range due {
		if ctx.Err() != nil {
			return
		}
		if _, err := c.ask(ctx, s, false); err != nil {
			if onError != nil {
				onError(s, err)
			}
			c.expire(s)
		}
	}
}

// expire turns s unknown if its answer is older than three Rechecks.
func (c *Cache) expire(s Scope) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if e := c.entries[s]; e != nil && c.opt.Now().Sub(e.checked) > 3*c.opt.Recheck {
		e.verdict = Unknown
	}
}

// Len is the number of cached answers.
func (c *Cache) Len() int {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return len(c.entries)
}

// ask reviews s (the verbs of Verbs, up to the first denied) and stores
// the answer, sharing one review between concurrent askers of the same
// scope. use marks the answer used (a snapshot or a new wiring needs it;
// a recheck round's own review does not keep an answer alive).
func (c *Cache) ask(ctx context.Context, s Scope, use bool) (Verdict, error) {
	c.mu.Lock()
	if cl := c.inflight[s]; cl != nil {
		c.mu.Unlock()
		select {
		case <-cl.done:
			return cl.verdict, cl.err
		case <-ctx.Done():
			return Unknown, ctx.Err()
		}
	}
	cl := &call{done: make(chan struct{})}
	c.inflight[s] = cl
	c.mu.Unlock()

	verdicts := make([]Verdict, 0, len(Verbs))
	for _, verb := range Verbs {
		ok, err := c.review(ctx, s, verb)
		if err != nil {
			cl.err = fmt.Errorf("review of %s for %s: %w", verb, s, err)
			break
		}
		if !ok {
			verdicts = append(verdicts, Denied)
			break
		}
		verdicts = append(verdicts, Allowed)
	}
	changed := false
	c.mu.Lock()
	delete(c.inflight, s)
	if cl.err == nil {
		cl.verdict = Combine(verdicts...)
		e := c.entries[s]
		if e == nil {
			c.makeRoomLocked()
			e = &entry{}
			c.entries[s] = e
		}
		changed = e.verdict != Unknown && e.verdict != cl.verdict
		e.verdict, e.checked = cl.verdict, c.opt.Now()
		if use {
			e.used.Store(true)
			e.idle = 0
		}
	}
	c.mu.Unlock()
	close(cl.done)
	if changed && c.opt.OnChange != nil {
		c.opt.OnChange(s.Identity)
	}
	return cl.verdict, cl.err
}

// makeRoomLocked drops one answer when the cache is full, preferring one
// no lookup used since the last round. Called with mu held.
func (c *Cache) makeRoomLocked() {
	if len(c.entries) < c.opt.Max {
		return
	}
	var victim Scope
	found := false
	for s, e := range c.entries {
		victim, found = s, true
		if !e.used.Load() {
			break
		}
	}
	if found {
		delete(c.entries, victim)
	}
}
