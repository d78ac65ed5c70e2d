package hooks

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"testing"
	"time"

	"github.com/cloudevents/sdk-go/v2/binding"
	"github.com/cloudevents/sdk-go/v2/event"
	cehttp "github.com/cloudevents/sdk-go/v2/protocol/http"
	"github.com/google/go-cmp/cmp"

	"github.com/metabus/metabus/pkg/api/v1alpha1"
)

// structuredHook is a hook whose webhook asks for structured mode.
func structuredHook(u string) *v1alpha1.Hook {
	h := hookAt(u)
	h.Webhook.CloudEvents = ptr(v1alpha1.CloudEventsStructured)
	return h
}

// TestStructuredRequestMatchesSDK: in structured mode the directly written
// request has the sdk's Content-Type and no ce-* headers, its body is the
// sdk's JSON document member for member (data as a JSON value), and the
// sdk reads it back as the same event.
func TestStructuredRequestMatchesSDK(t *testing.T) {
	u, _ := url.Parse("http://hook.example/sync")
	now := time.Date(2026, 11, 24, 3, 4, 5, 123456789, time.FixedZone("x", 3600))
	body := []byte(`{"parent":{"metadata":{"name":"p","annotations":{"a":"<&>"}}}}`)
	for _, tc := range encodingCalls() {
		t.Run(tc.reason, func(t *testing.T) {
			tc.call.Hook = structuredHook(u.String())
			_, got, wantBody, gotBody := encodeBoth(t, binding.WithForceStructured, u, &tc.call, body, now)
			var wantDoc, gotDoc map[string]any
			if err := json.Unmarshal(wantBody, &wantDoc); err != nil {
				t.Fatalf("sdk body %s: %v", wantBody, err)
			}
			if err := json.Unmarshal(gotBody, &gotDoc); err != nil {
				t.Fatalf("direct body %s: %v", gotBody, err)
			}
			if diff := cmp.Diff(wantDoc, gotDoc); diff != "" {
				t.Errorf("event document (-sdk +direct):\n%s", diff)
			}
			if got.ContentLength != int64(len(gotBody)) {
				t.Errorf("Content-Length %d, body %d bytes", got.ContentLength, len(gotBody))
			}
			back, err := binding.ToEvent(context.Background(), cehttp.NewMessage(got.Header, io.NopCloser(bytes.NewReader(gotBody))))
			if err != nil {
				t.Fatalf("the sdk cannot read the request back: %v", err)
			}
			if string(back.Data()) != string(body) || back.ID() != tc.call.ID || back.DataContentType() != event.ApplicationJSON {
				t.Errorf("read back: id %q data %s datacontenttype %q", back.ID(), back.Data(), back.DataContentType())
			}
		})
	}
}

// TestDoStructured: a structured-mode hook built on the sdk reads the
// request as an event whose data is the hook request, and its structured
// reply (or a plain JSON one) is decoded as the response.
func TestDoStructured(t *testing.T) {
	const data = `{"status":{"ok":true},"children":[]}`
	for _, tc := range []struct {
		reason string
		reply  func(ctx context.Context) context.Context // nil: a plain JSON reply
	}{
		{"a structured reply to a structured request", binding.WithForceStructured},
		{"a binary reply to a structured request", binding.WithForceBinary},
		{"a plain JSON reply to a structured request", nil},
	} {
		t.Run(tc.reason, func(t *testing.T) {
			var seen *event.Event
			// Not serve: its recorder would consume the body the sdk reads.
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if got := r.Header.Get("Content-Type"); got != "application/cloudevents+json" {
					t.Errorf("Content-Type %q", got)
				}
				ev, err := binding.ToEvent(r.Context(), cehttp.NewMessageFromHttpRequest(r))
				if err != nil {
					t.Errorf("the sdk cannot read the request: %v", err)
					w.WriteHeader(http.StatusBadRequest)
					return
				}
				seen = ev
				if tc.reply == nil {
					replyJSON(data)(w, r)
					return
				}
				out := event.New()
				out.SetID("reply-" + ev.ID())
				out.SetType(ev.Type() + ".response")
				out.SetSource("/hooks/demo")
				_ = out.SetData(event.ApplicationJSON, json.RawMessage(data))
				if err := cehttp.WriteResponseWriter(tc.reply(r.Context()), binding.ToMessage(&out), http.StatusOK, w); err != nil {
					t.Errorf("writing the reply: %v", err)
				}
			}))
			t.Cleanup(srv.Close)
			call := syncCall(structuredHook(srv.URL))
			var resp syncResponse
			if err := New(Options{}).Do(context.Background(), call, &resp); err != nil {
				t.Fatalf("Do: %v", err)
			}
			if resp.Status["ok"] != true || resp.Children == nil {
				t.Errorf("response = %#v, want the reply's data decoded", resp)
			}
			if seen == nil {
				t.Fatal("the hook saw no event")
			}
			var req map[string]any
			if err := json.Unmarshal(seen.Data(), &req); err != nil {
				t.Fatalf("request data: %v", err)
			}
			wantReq, _ := json.Marshal(call.Request)
			var want map[string]any
			_ = json.Unmarshal(wantReq, &want)
			if diff := cmp.Diff(want, req); diff != "" {
				t.Errorf("request data (-want +got):\n%s", diff)
			}
			if seen.Type() != "io.k8s.metacontroller.hook.sync.v1" || seen.Extensions()["workseq"] != "00000000000000000007" {
				t.Errorf("type %q extensions %v", seen.Type(), seen.Extensions())
			}
		})
	}
}
