package hooks

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"runtime"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/metabus/metabus/pkg/bus"
)

// A reply the bus cannot deliver is useless, and reading a larger one only risks the
// dispatcher's memory: by default, the client reads at most bus.MaxPayload bytes.
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
		{reason: "a reply of exactly MaxPayload bytes is read", handler: plain(statusReply(bus.MaxPayload))},
		{reason: "one byte more is too large (Content-Length)", handler: plain(statusReply(bus.MaxPayload + 1)), tooLarge: true},
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

func TestJSONShape(t *testing.T) {
	type shape struct{ Containers, Values int }
	tests := []struct {
		reason string
		in     string
		want   shape
	}{
		{reason: "a scalar", in: `1`, want: shape{0, 1}},
		{reason: "empty containers", in: `{"a":[],"b":{}}`, want: shape{3, 5}},
		{reason: "structure inside strings is not counted", in: `{"a":"{[,]}","b":"\"{,"}`, want: shape{1, 3}},
		{reason: "an escaped backslash ends before the quote", in: `["\\",{}]`, want: shape{2, 4}},
	}
	for _, tt := range tests {
		t.Run(tt.reason, func(t *testing.T) {
			var got shape
			got.Containers, got.Values = jsonShape([]byte(tt.in))
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}

// A hostile hook cannot exhaust the dispatcher's memory with a reply under the byte limit
// either (issue 26): 8 MiB of empty objects decode to some 260 MiB. Such a reply is refused
// before decoding, measured: what one call allocates stays a small multiple of the body. A
// large realistic reply still decodes.
func TestResponseShapeLimit(t *testing.T) {
	fill := func(unit string) string {
		var b strings.Builder
		b.WriteString(`{"status":{"x":[`)
		for b.Len() < bus.MaxPayload-64 {
			b.WriteString(unit + ",")
		}
		b.WriteString(unit + `]}}`)
		return b.String()
	}
	// 3000 ConfigMaps of 20 keys each, about 2 MiB.
	realistic := func() string {
		var b strings.Builder
		b.WriteString(`{"children":[`)
		for i := range 3000 {
			if i > 0 {
				b.WriteByte(',')
			}
			fmt.Fprintf(&b, `{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"c-%d","labels":{"app":"x"}},"data":{`, i)
			for k := range 20 {
				if k > 0 {
					b.WriteByte(',')
				}
				fmt.Fprintf(&b, `"key-%d":"value-%d"`, k, k)
			}
			b.WriteString(`}}`)
		}
		b.WriteString(`]}`)
		return b.String()
	}
	tests := []struct {
		reason   string
		body     string
		tooLarge bool
	}{
		{reason: "8 MiB of empty objects", body: fill("{}"), tooLarge: true},
		{reason: "8 MiB of empty arrays", body: fill("[]"), tooLarge: true},
		{reason: "8 MiB of zeros", body: fill("0"), tooLarge: true},
		{reason: "8 MiB of nested objects", body: fill(`{"a":{}}`), tooLarge: true},
		{reason: "3000 ConfigMaps", body: realistic()},
	}
	c := New(Options{})
	for _, tt := range tests {
		t.Run(tt.reason, func(t *testing.T) {
			srv, _ := serve(t, replyJSON(tt.body))
			var resp syncResponse
			runtime.GC()
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			err := c.Do(context.Background(), syncCall(hookAt(srv.URL)), &resp)
			runtime.ReadMemStats(&after)
			allocated := after.TotalAlloc - before.TotalAlloc
			t.Logf("%d KiB reply: %d KiB allocated by the call", len(tt.body)>>10, allocated>>10)
			var de *DecodeError
			if got := errors.Is(err, ErrResponseTooLarge) && errors.As(err, &de); got != tt.tooLarge {
				t.Fatalf("too large: %v, want %v (err %.300v)", got, tt.tooLarge, err)
			}
			if !tt.tooLarge {
				if err != nil || len(resp.Children) != 3000 {
					t.Fatalf("Do = %.300v, %d children", err, len(resp.Children))
				}
				return
			}
			// The body read into a growing buffer, and the test server's copies of it: decoded,
			// these bodies allocate 280-430 MiB.
			if limit := uint64(6 * len(tt.body)); allocated > limit {
				t.Errorf("the refused call allocated %d MiB, more than %d MiB", allocated>>20, limit>>20)
			}
		})
	}
}
