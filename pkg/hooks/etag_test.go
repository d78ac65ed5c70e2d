package hooks

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/metabus/metabus/pkg/api/v1alpha1"
)

// etagServer replies 200 with ETag "v<n>" and a body naming n, or notModified when the
// request's If-None-Match is the current ETag.
func etagServer(t *testing.T, notModified int) (string, *recorder, *atomic.Int32) {
	t.Helper()
	var version atomic.Int32
	version.Store(1)
	srv, rec := serve(t, func(w http.ResponseWriter, r *http.Request) {
		etag := fmt.Sprintf(`"v%d"`, version.Load())
		if r.Header.Get("If-None-Match") == etag {
			w.WriteHeader(notModified)
			return
		}
		w.Header().Set("ETag", etag)
		_, _ = io.WriteString(w, fmt.Sprintf(`{"status":{"version":%d},"children":[]}`, version.Load()))
	})
	return srv.URL, rec, &version
}

func etagHook(url string, timeout, cleanup *int32) *v1alpha1.Hook {
	h := hookAt(url)
	h.Webhook.Etag = &v1alpha1.WebhookEtagConfig{Enabled: ptr(true), CacheTimeoutSeconds: timeout, CacheCleanupSeconds: cleanup}
	return h
}

func TestETag(t *testing.T) {
	for _, notModified := range []int{http.StatusNotModified, http.StatusPreconditionFailed} {
		t.Run(http.StatusText(notModified), func(t *testing.T) {
			url, rec, version := etagServer(t, notModified)
			clock := newFakeClock()
			c := New(Options{Now: clock.Now})
			hook := etagHook(url, nil, nil)

			do := func(cacheKey string, wantIfNoneMatch string, wantVersion int64) {
				t.Helper()
				call := syncCall(hook)
				call.CacheKey = cacheKey
				var resp syncResponse
				if err := c.Do(context.Background(), call, &resp); err != nil {
					t.Fatalf("Do: %v", err)
				}
				if got := rec.last(t).Header.Get("If-None-Match"); got != wantIfNoneMatch {
					t.Errorf("If-None-Match = %q, want %q", got, wantIfNoneMatch)
				}
				if got := resp.Status["version"]; got != wantVersion {
					t.Errorf("status.version = %v, want %d", got, wantVersion)
				}
			}
			do("uid-1", "", 1)     // first call: 200, cached
			do("uid-1", `"v1"`, 1) // not modified: served from the cache
			do("uid-2", "", 1)     // another parent has its own entry
			version.Store(2)       // the hook's answer changes
			do("uid-1", `"v1"`, 2) // 200 with the new body replaces the entry
			do("uid-1", `"v2"`, 2) // and is reused
			clock.Add(601 * time.Second)
			do("uid-1", "", 2) // expired after the default 600s
		})
	}
}

func TestETagOptions(t *testing.T) {
	url, rec, _ := etagServer(t, http.StatusNotModified)
	tests := []struct {
		reason   string
		hook     *v1alpha1.Hook
		cacheKey string
		advance  time.Duration
		want     string // If-None-Match of the second call
	}{
		{reason: "only cacheTimeoutSeconds set (upstream crashed): expiry honoured", hook: etagHook(url, ptr(int32(5)), nil), cacheKey: "k", advance: 6 * time.Second},
		{reason: "only cacheTimeoutSeconds set: within the timeout", hook: etagHook(url, ptr(int32(5)), nil), cacheKey: "k", advance: 4 * time.Second, want: `"v1"`},
		{reason: "only cacheCleanupSeconds set", hook: etagHook(url, nil, ptr(int32(1))), cacheKey: "k", advance: 10 * time.Second, want: `"v1"`},
		{reason: "no cache key disables the cache", hook: etagHook(url, nil, nil), cacheKey: ""},
		{reason: "etag disabled", hook: func() *v1alpha1.Hook { h := etagHook(url, nil, nil); h.Webhook.Etag.Enabled = ptr(false); return h }(), cacheKey: "k"},
	}
	for _, tt := range tests {
		t.Run(tt.reason, func(t *testing.T) {
			clock := newFakeClock()
			c := New(Options{Now: clock.Now})
			call := syncCall(tt.hook)
			call.CacheKey = tt.cacheKey
			for i := range 2 {
				if err := c.Do(context.Background(), call, &syncResponse{}); err != nil {
					t.Fatalf("Do #%d: %v", i+1, err)
				}
				clock.Add(tt.advance)
			}
			if got := rec.last(t).Header.Get("If-None-Match"); got != tt.want {
				t.Errorf("If-None-Match = %q, want %q", got, tt.want)
			}
		})
	}
}

// Expired entries are swept every cleanup interval, so the cache does not keep every parent
// ever seen.
func TestETagSweep(t *testing.T) {
	cfg := etagConfig{timeout: 10 * time.Second, cleanup: 60 * time.Second}
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	s := &etagStore{entries: map[string]etagEntry{}}
	s.get("x", cfg, now) // first sweep, schedules the next one at +60s
	s.put("a", `"1"`, []byte(`{}`), cfg, now)
	s.put("b", `"1"`, []byte(`{}`), cfg, now.Add(55*time.Second))
	if _, ok := s.get("a", cfg, now.Add(30*time.Second)); ok {
		t.Error("an expired entry was served")
	}
	if len(s.entries) != 2 {
		t.Errorf("swept before the cleanup interval: %d entries", len(s.entries))
	}
	s.get("x", cfg, now.Add(61*time.Second))
	if _, ok := s.entries["a"]; ok || len(s.entries) != 1 {
		t.Errorf("after the sweep: %v, want only b", s.entries)
	}
	s.put("b", "", nil, cfg, now.Add(62*time.Second))
	if len(s.entries) != 0 {
		t.Error("a 200 without ETag must drop the entry")
	}
}

// TestETagStoresOfIdleURLsSwept (issue #13, defect 13): the cached bodies
// of a webhook that is never called again are dropped once expired, by
// calls to any other webhook; before, only a call to the same URL swept
// its store, so a deleted controller's bodies stayed forever.
func TestETagStoresOfIdleURLsSwept(t *testing.T) {
	cfg := etagConfig{timeout: 10 * time.Second, cleanup: time.Second}
	var c etagCache
	now := time.Unix(1000, 0)
	c.store("http://gone", cfg, now).put("parent-1", `"v1"`, []byte("{}"), cfg, now)
	c.store("http://live", cfg, now)
	// Not expired yet: kept.
	c.store("http://live", cfg, now.Add(5*time.Second))
	if _, ok := c.stores["http://gone"]; !ok {
		t.Fatal("a live entry was swept")
	}
	// Expired, and only the other webhook is called.
	c.store("http://live", cfg, now.Add(11*time.Second))
	if _, ok := c.stores["http://gone"]; ok {
		t.Error("the store of a webhook never called again kept its expired bodies")
	}
	if _, ok := c.stores["http://live"]; !ok {
		t.Error("the store being asked for was dropped")
	}
}
