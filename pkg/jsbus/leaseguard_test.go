package jsbus

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// TestLeaseGuard: a handler's writes go out while its lease holds and are
// refused, unsent, once its deadline has passed, even from a context
// derived before (no fence has run: a process resumed after a pause);
// reads pass, and so does everything outside a handler. The lease reads a
// fake clock, standing still: only the deadline moves.
func TestLeaseGuard(t *testing.T) {
	var got atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { got.Add(1) }))
	defer srv.Close()
	client := &http.Client{Transport: LeaseGuard(http.DefaultTransport)}
	var until atomic.Int64
	clk := newFakeClock(time.Date(2026, 11, 28, 23, 0, 0, 0, time.UTC))
	l := newLease(&until, clk)
	handler := leaseCtx{Context: l.ctx, l: l}
	derived, cancel := context.WithTimeout(handler, time.Minute)
	defer cancel()
	cases := []struct {
		reason string
		ctx    context.Context
		method string
		until  time.Duration // from now; the lease's deadline
		sent   bool
	}{
		{"a write while the lease holds", derived, http.MethodPut, time.Minute, true},
		{"a write after the deadline, no fence yet", derived, http.MethodPost, -time.Second, false},
		{"a read after the deadline", context.Background(), http.MethodGet, -time.Second, true},
		{"a write outside any handler", context.Background(), http.MethodDelete, -time.Second, true},
	}
	for _, c := range cases {
		t.Run(c.reason, func(t *testing.T) {
			until.Store(clk.Now().Add(c.until).UnixNano())
			before := got.Load()
			req, err := http.NewRequestWithContext(c.ctx, c.method, srv.URL, strings.NewReader("{}"))
			if err != nil {
				t.Fatal(err)
			}
			resp, err := client.Do(req)
			if err == nil {
				_ = resp.Body.Close()
			}
			if sent := got.Load() > before; sent != c.sent {
				t.Errorf("sent = %v (error %v), want %v", sent, err, c.sent)
			}
		})
	}
}
