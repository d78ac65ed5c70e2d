package hooks

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
)

// BenchmarkDoPlainJSON measures one sync call of a legacy hook over loopback: request
// encoding, CloudEvents headers, HTTP round trip, reading and decoding a small reply.
func BenchmarkDoPlainJSON(b *testing.B) {
	reply := []byte(`{"status":{"replicas":1},"children":[{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"a"}}]}`)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(reply)
	}))
	defer srv.Close()
	c := New(Options{})
	call := syncCall(hookAt(srv.URL + "/sync"))
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		var resp syncResponse
		if err := c.Do(ctx, call, &resp); err != nil {
			b.Fatal(err)
		}
	}
}
