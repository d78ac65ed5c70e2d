package hooks

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/metabus/metabus/pkg/natsx"
)

// A reply the bus cannot deliver is useless, and reading a larger one only risks the
// dispatcher's memory: by default, the client reads at most natsx.MaxPayload bytes.
func TestDefaultResponseLimitIsTheBusPayload(t *testing.T) {
	// statusReply is a valid sync reply of exactly n bytes.
	statusReply := func(n int) string {
		const head, tail = `{"status":{"x":"`, `"}}`
		return head + strings.Repeat("x", n-len(head)-len(tail)) + tail
	}
	plain := func(body string) http.HandlerFunc {
		return func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			_, _ = io.WriteString(w, body)
		}
	}
	chunked := func(body string) http.HandlerFunc {
		return func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			for i := 0; i < len(body); i += 64 << 10 {
				if _, err := io.WriteString(w, body[i:min(i+64<<10, len(body))]); err != nil {
					return // the client stopped reading
				}
				w.(http.Flusher).Flush() // no Content-Length: the limit must hold while reading
			}
		}
	}
	tests := []struct {
		reason   string
		handler  http.HandlerFunc
		tooLarge bool
	}{
		{reason: "a reply of exactly MaxPayload bytes is read", handler: plain(statusReply(natsx.MaxPayload))},
		{reason: "one byte more is too large (Content-Length)", handler: plain(statusReply(natsx.MaxPayload + 1)), tooLarge: true},
		{reason: "9 MiB is too large (Content-Length)", handler: plain(statusReply(9 << 20)), tooLarge: true},
		{reason: "9 MiB is too large (chunked)", handler: chunked(statusReply(9 << 20)), tooLarge: true},
		{reason: "31 MiB is too large (chunked)", handler: chunked(statusReply(31 << 20)), tooLarge: true},
	}
	c := New(Options{})
	for _, tt := range tests {
		t.Run(tt.reason, func(t *testing.T) {
			srv, _ := serve(t, tt.handler)
			var resp syncResponse
			err := c.Do(context.Background(), syncCall(hookAt(srv.URL)), &resp)
			var de *DecodeError
			got := errors.Is(err, ErrResponseTooLarge) && errors.As(err, &de)
			if diff := cmp.Diff(tt.tooLarge, got); diff != "" {
				t.Fatalf("too large (-want +got):\n%s\nerr: %.300v", diff, err)
			}
			if !tt.tooLarge && err != nil {
				t.Fatalf("err = %.300v, want nil", err)
			}
		})
	}
}
