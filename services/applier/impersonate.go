package applier

import (
	"context"
	"flag"
	"fmt"
	"sync"
	"time"

	"go.uber.org/zap"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"

	"github.com/metabus/metabus/pkg/bus"
	"github.com/metabus/metabus/pkg/events"
	ctlid "github.com/metabus/metabus/pkg/identity"
)

// This file is the controller's identity in the applier (issue 35): every
// write of a controller (children, adoptions and releases, the parent's
// patches, status and finalizers) goes through a client impersonating the
// ServiceAccount the controller acts as, so that the API server's RBAC,
// not the applier's own role, decides what it may write. Reads the
// applier makes for itself (snapshots come over the bus; the rechecks of a
// parent) stay its own.

// registerIdentityFlags adds --default-service-account (shared with the
// watcher through pkg/identity, so both resolve an identity alike).
func (c *Config) registerIdentityFlags(fs *flag.FlagSet) {
	ctlid.RegisterDefaultFlag(fs, &c.DefaultServiceAccount)
}

// writers are the clients a controller's writes go through: the dynamic
// client, and the raw one of the hot writes (nil: the dynamic client makes
// them, as in unit tests with a fake one).
type writers struct {
	dyn dynamic.Interface
	raw *rawClient
}

// newWriters builds the clients of cfg.
func newWriters(cfg *rest.Config) (writers, error) {
	raw, err := newRawClient(cfg)
	if err != nil {
		return writers{}, err
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return writers{}, fmt.Errorf("dynamic client: %w", err)
	}
	return writers{dyn: dyn, raw: raw}, nil
}

// impersonating is cfg impersonating id (a copy; cfg is not changed).
//
// It names the user only: for a ServiceAccount's user name, the API server
// adds the account's groups (id.Groups()) itself when the request names
// none, and requires only `impersonate` on that serviceaccount. Naming the
// groups would require `impersonate` on each group too, and a grant on
// system:serviceaccounts:<namespace> would let the applier claim that
// group for any user: a wider grant for the same result.
func impersonating(cfg *rest.Config, id ctlid.Identity) *rest.Config {
	out := rest.CopyConfig(cfg)
	out.Impersonate = rest.ImpersonationConfig{UserName: id.Username()}
	return out
}

// Bounds of the per-identity client cache: a cluster names a handful of
// identities, so these are far above need and only bound memory against a
// flood of distinct annotations.
const (
	maxIdentityClients = 256
	identityClientIdle = 30 * time.Minute
)

// identityClients caches the writers of each identity: building a client
// parses the config and sets up a transport, which a write must not pay.
// It holds at most max entries, the least recently used going first, and
// drops the ones unused for idle (a controller removed, or renamed to
// another account).
type identityClients struct {
	base  *rest.Config
	build func(*rest.Config) (writers, error)
	max   int
	idle  time.Duration
	now   func() time.Time

	mu      sync.Mutex
	entries map[ctlid.Identity]*identityEntry
}

type identityEntry struct {
	w    writers
	used time.Time
}

// newIdentityClients caches the writers built by build from base
// impersonating each identity.
func newIdentityClients(base *rest.Config, build func(*rest.Config) (writers, error)) *identityClients {
	return &identityClients{base: base, build: build, max: maxIdentityClients, idle: identityClientIdle, now: time.Now,
		entries: map[ctlid.Identity]*identityEntry{}}
}

// get returns the writers impersonating id (which is not none).
func (c *identityClients) get(id ctlid.Identity) (writers, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := c.now()
	if e, ok := c.entries[id]; ok {
		e.used = now
		return e.w, nil
	}
	w, err := c.build(impersonating(c.base, id))
	if err != nil {
		return writers{}, fmt.Errorf("clients impersonating %s: %w", id.Username(), err)
	}
	c.evict(now)
	c.entries[id] = &identityEntry{w: w, used: now}
	return w, nil
}

// evict drops the entries idle too long, and the least recently used one
// while the cache is full. Called with mu held.
func (c *identityClients) evict(now time.Time) {
	var oldest ctlid.Identity
	var oldestUsed time.Time
	for id, e := range c.entries {
		if now.Sub(e.used) > c.idle {
			delete(c.entries, id)
			continue
		}
		if oldestUsed.IsZero() || e.used.Before(oldestUsed) {
			oldest, oldestUsed = id, e.used
		}
	}
	if len(c.entries) >= c.max {
		delete(c.entries, oldest)
	}
}

// len is the number of cached identities.
func (c *identityClients) len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.entries)
}

// actingKey carries the identity an apply writes as, and its writers, in
// the apply's context.
type actingKey struct{}

type acting struct {
	id ctlid.Identity
	w  writers
}

// actAs returns ctx in which writes go through w as id.
func actAs(ctx context.Context, id ctlid.Identity, w writers) context.Context {
	return context.WithValue(ctx, actingKey{}, acting{id: id, w: w})
}

// writersOf are the writers of ctx's apply: the impersonating ones set by
// actAs, else the applier's own.
func (a *Applier) writersOf(ctx context.Context) writers {
	if act, ok := ctx.Value(actingKey{}).(acting); ok {
		return act.w
	}
	return writers{dyn: a.dyn, raw: a.raw}
}

// actingAs is the identity ctx's writes impersonate (none: the applier's own).
func actingAs(ctx context.Context) ctlid.Identity {
	act, _ := ctx.Value(actingKey{}).(acting)
	return act.id
}

// resolveIdentity is the identity a controller's writes impersonate, read
// from the controller object the watcher's cache holds (never from the
// desired state's message), with the operator's default. An annotation that
// does not parse refuses the apply.
func (a *Applier) resolveIdentity(annotations map[string]string) (ctlid.Identity, writers, error) {
	id, err := ctlid.Of(annotations, a.cfg.DefaultServiceAccount)
	if err != nil {
		return ctlid.Identity{}, writers{}, err
	}
	if id.None() {
		return id, writers{dyn: a.dyn, raw: a.raw}, nil
	}
	if a.identities == nil {
		return ctlid.Identity{}, writers{}, fmt.Errorf("no clients for identity %s", id)
	}
	w, err := a.identities.get(id)
	return id, w, err
}

// noteIdentity records in the apply's write log the identity its writes
// impersonate, for settle's Event of a refusal.
func noteIdentity(ctx context.Context, id ctlid.Identity) {
	if wl, _ := ctx.Value(writeLogKey{}).(*writeLog); wl != nil {
		wl.identity = id
	}
}

// identityRefused ends the apply of a controller whose identity cannot be
// told (its annotation does not parse): nothing is written, neither as the
// default nor as the applier, and the parent says why. The apply is not
// retried: the controller must change, and its change syncs its parents
// again.
func (a *Applier) identityRefused(ds *bus.DesiredState, err error) error {
	msg := fmt.Sprintf("controller %s: %v; nothing is written until the controller names a valid ServiceAccount", ds.Controller.Name, err)
	a.log.Warn("apply refused: the controller's identity is invalid", zap.String("controller", ds.Controller.Name),
		zap.String("parent", ds.Parent.Namespace+"/"+ds.Parent.Name), zap.Error(err))
	a.rec.Warning(ds.Parent.Stub(), events.ReasonInvalidIdentity, msg)
	return done(resultInvalid)
}
