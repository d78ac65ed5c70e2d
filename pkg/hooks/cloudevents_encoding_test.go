package hooks

import (
	"context"
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/cloudevents/sdk-go/v2/binding"
	"github.com/cloudevents/sdk-go/v2/event"
	cehttp "github.com/cloudevents/sdk-go/v2/protocol/http"
	"github.com/google/go-cmp/cmp"
)

// sdkRequest is the hook request built through the CloudEvents sdk (event,
// binding message, binary-mode HTTP request): the reference newRequest's
// direct encoding must match.
func sdkRequest(ctx context.Context, u *url.URL, call *Call, body []byte, now time.Time) (*http.Request, error) {
	ev, err := sdkEvent(call, body, now)
	if err != nil {
		return nil, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, u.String(), nil)
	if err != nil {
		return nil, err
	}
	if err := cehttp.WriteRequest(binding.WithForceBinary(ctx), binding.ToMessage(&ev), req); err != nil {
		return nil, err
	}
	for k, vs := range req.Header {
		if strings.HasPrefix(k, "Ce-") {
			for i, v := range vs {
				vs[i] = percentEncode(v)
			}
		}
	}
	return req, nil
}

// sdkEvent is a call's request as the CloudEvents sdk builds it.
func sdkEvent(call *Call, body []byte, now time.Time) (event.Event, error) {
	ev := event.New()
	ev.SetID(call.ID)
	ev.SetType(EventTypePrefix + call.Kind + ".v1")
	ev.SetSource(sourceOf(call))
	if call.Subject != "" {
		ev.SetSubject(call.Subject)
	}
	ev.SetTime(now)
	ev.SetDataContentType(event.ApplicationJSON)
	ev.DataEncoded = body
	for name, value := range call.Extensions {
		ev.SetExtension(name, value)
	}
	return ev, ev.Validate()
}

// TestRequestMatchesSDK: the directly written CloudEvent is the sdk's,
// header for header and byte for byte, and the sdk reads it back as the
// same event.
func TestRequestMatchesSDK(t *testing.T) {
	u, _ := url.Parse("http://hook.example/sync")
	now := time.Date(2026, 11, 24, 3, 4, 5, 123456789, time.FixedZone("x", 3600))
	body := []byte(`{"parent":{"metadata":{"name":"p"}}}`)
	for _, tc := range []struct {
		reason string
		call   Call
	}{
		{"a sync with a subject and the partition extensions", Call{ID: "id-1", Kind: "sync", ControllerType: "CompositeController",
			ControllerName: "c", Subject: "/apis/example.com/v1/namespaces/ns/things/p",
			Extensions: map[string]string{"partitionkey": "cc-c/uid", "parentuid": "uid"}}},
		{"no subject, an explicit source", Call{ID: "id-2", Kind: "customize", Source: "/apis/x/v1/y/z"}},
		{"values needing percent-encoding", Call{ID: "id 3", Kind: "finalize", ControllerType: "DecoratorController",
			ControllerName: "d", Subject: "/api/v1/namespaces/ns/configmaps/é\"%", Extensions: map[string]string{"note": "a b\tc"}}},
	} {
		t.Run(tc.reason, func(t *testing.T) {
			want, err := sdkRequest(context.Background(), u, &tc.call, body, now)
			if err != nil {
				t.Fatal(err)
			}
			got, err := newRequest(context.Background(), u, &tc.call, body, now)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(want.Header, got.Header); diff != "" {
				t.Errorf("headers (-sdk +direct):\n%s", diff)
			}
			wantBody, _ := io.ReadAll(want.Body)
			gotBody, _ := io.ReadAll(got.Body)
			if string(wantBody) != string(gotBody) || got.ContentLength != int64(len(body)) {
				t.Errorf("body %q (length %d), want %q", gotBody, got.ContentLength, wantBody)
			}
			if got.Method != want.Method || got.URL.String() != want.URL.String() {
				t.Errorf("%s %s, want %s %s", got.Method, got.URL, want.Method, want.URL)
			}
		})
	}
}
