package hooks

import (
	"sync"
	"time"

	"github.com/metabus/metabus/pkg/api/v1alpha1"
)

// ETag defaults, as upstream.
const (
	defaultETagTimeout = 600 * time.Second
	defaultETagCleanup = 60 * time.Second
)

// etagConfig is the effective etag configuration of a webhook; zero means disabled.
type etagConfig struct {
	timeout, cleanup time.Duration
}

// etagOf returns the effective configuration. Each of the two durations defaults on its own
// (upstream dereferenced cacheCleanupSeconds whenever cacheTimeoutSeconds was set).
func etagOf(w *v1alpha1.Webhook) (etagConfig, bool) {
	e := w.Etag
	if e == nil || e.Enabled == nil || !*e.Enabled {
		return etagConfig{}, false
	}
	cfg := etagConfig{timeout: defaultETagTimeout, cleanup: defaultETagCleanup}
	if e.CacheTimeoutSeconds != nil && *e.CacheTimeoutSeconds > 0 {
		cfg.timeout = time.Duration(*e.CacheTimeoutSeconds) * time.Second
	}
	if e.CacheCleanupSeconds != nil && *e.CacheCleanupSeconds > 0 {
		cfg.cleanup = time.Duration(*e.CacheCleanupSeconds) * time.Second
	}
	return cfg, true
}

// etagEntry is the last 200 response of a (webhook, cache key), already unwrapped from any
// CloudEvent envelope, so a 304 reply is decoded exactly like the 200 it stands for.
type etagEntry struct {
	etag    string
	body    []byte
	expires time.Time
}

// etagStore is the cache of one webhook URL. Expired entries are never served; they are
// removed by a sweep every cleanup interval, run lazily by the calls themselves so that a
// Client needs no goroutine and no Close.
type etagStore struct {
	mu        sync.Mutex
	entries   map[string]etagEntry
	nextSweep time.Time
}

// etagCache maps webhook URL to its store.
type etagCache struct {
	mu     sync.Mutex
	stores map[string]*etagStore
	// nextSweep: every store is swept now and then, not only on a call
	// to its own URL, so a webhook that is never called again (its
	// controller deleted, its URL changed) does not keep its bodies.
	nextSweep time.Time
}

// store returns the store of url, first sweeping every store (dropping
// empty ones) when a cleanup interval has passed.
func (c *etagCache) store(url string, cfg etagConfig, now time.Time) *etagStore {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !now.Before(c.nextSweep) {
		for u, s := range c.stores {
			if s.sweep(now) == 0 && u != url {
				delete(c.stores, u)
			}
		}
		c.nextSweep = now.Add(max(cfg.cleanup, time.Second))
	}
	s, ok := c.stores[url]
	if !ok {
		if c.stores == nil {
			c.stores = make(map[string]*etagStore)
		}
		s = &etagStore{entries: make(map[string]etagEntry)}
		c.stores[url] = s
	}
	return s
}

// sweep drops expired entries and returns how many are left.
func (s *etagStore) sweep(now time.Time) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	for k, e := range s.entries {
		if !now.Before(e.expires) {
			delete(s.entries, k)
		}
	}
	return len(s.entries)
}

// get returns the live entry of key, sweeping the store when its cleanup interval is due.
func (s *etagStore) get(key string, cfg etagConfig, now time.Time) (etagEntry, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !now.Before(s.nextSweep) {
		for k, e := range s.entries {
			if !now.Before(e.expires) {
				delete(s.entries, k)
			}
		}
		s.nextSweep = now.Add(cfg.cleanup)
	}
	e, ok := s.entries[key]
	if !ok || !now.Before(e.expires) {
		return etagEntry{}, false
	}
	return e, true
}

// put records a 200 response. A 200 without ETag drops the entry: the hook no longer vouches
// for the old body, so it must not be replayed on a later 304.
func (s *etagStore) put(key, etag string, body []byte, cfg etagConfig, now time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if etag == "" {
		delete(s.entries, key)
		return
	}
	// Copy: the caller's buffer may be reused, and the cache outlives the call.
	s.entries[key] = etagEntry{etag: etag, body: append([]byte(nil), body...), expires: now.Add(cfg.timeout)}
}
