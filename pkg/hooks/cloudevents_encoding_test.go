package hooks

import (
	"context"
	"encoding/json"
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

// sdkEncode builds the hook request through the CloudEvents sdk (event,
// binding message, HTTP request), the reference newRequest's direct
// encoding must match, in the content mode ctx
// forces (binding.WithForceBinary or WithForceStructured); header values
// are percent-encoded as the HTTP binding asks, which the sdk leaves out.
func sdkEncode(ctx context.Context, u *url.URL, call *Call, body []byte, now time.Time) (*http.Request, error) {
	ev, err := sdkEvent(call, body, now)
	if err != nil {
		return nil, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, u.String(), nil)
	if err != nil {
		return nil, err
	}
	if err := cehttp.WriteRequest(ctx, binding.ToMessage(&ev), req); err != nil {
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

// sdkEvent is a call's request as the CloudEvents sdk builds it, for
// every transport's encoding test.
func sdkEvent(call *Call, body []byte, now time.Time) (event.Event, error) {
	ev := event.New()
	ev.SetID(call.ID)
	ev.SetType(EventTypePrefix + call.Kind + ".v1")
	ev.SetSource(sourceOf(call))
	if call.Subject != "" {
		ev.SetSubject(call.Subject)
	}
	ev.SetTime(now)
	if err := ev.SetData(event.ApplicationJSON, json.RawMessage(body)); err != nil {
		return event.Event{}, err
	}
	for name, value := range call.Extensions {
		ev.SetExtension(name, value)
	}
	return ev, ev.Validate()
}

// encodingCall is a call the encoding tests send, with why.
type encodingCall struct {
	reason string
	call   Call
}

// encodingCalls are the calls both content modes are held to the sdk with.
func encodingCalls() []encodingCall {
	return []encodingCall{
		{"a sync with a subject and the partition extensions", Call{ID: "id-1", Kind: "sync", ControllerType: "CompositeController",
			ControllerName: "c", Subject: "/apis/example.com/v1/namespaces/ns/things/p",
			Extensions: map[string]string{"partitionkey": "cc-c/uid", "parentuid": "uid", "workseq": "00000000000000000009"}}},
		{"no subject, an explicit source", Call{ID: "id-2", Kind: "customize", Source: "/apis/x/v1/y/z"}},
		{"values needing percent-encoding in a header", Call{ID: "id 3", Kind: "finalize", ControllerType: "DecoratorController",
			ControllerName: "d", Subject: "/api/v1/namespaces/ns/configmaps/é\"%", Extensions: map[string]string{"note": "a b\tc"}}},
	}
}

// encodeBoth builds call's request through the sdk, in the content mode
// force selects, and directly (newRequest); it reports a difference of
// their headers and returns both requests and bodies.
func encodeBoth(t *testing.T, force func(context.Context) context.Context, u *url.URL, call *Call, body []byte, now time.Time) (want, got *http.Request, wantBody, gotBody []byte) {
	t.Helper()
	want, err := sdkEncode(force(context.Background()), u, call, body, now)
	if err != nil {
		t.Fatal(err)
	}
	got, err = newRequest(context.Background(), u, call, body, now)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(want.Header, got.Header); diff != "" {
		t.Errorf("headers (-sdk +direct):\n%s", diff)
	}
	wantBody, _ = io.ReadAll(want.Body)
	gotBody, _ = io.ReadAll(got.Body)
	return want, got, wantBody, gotBody
}

// TestRequestMatchesSDK: the directly written CloudEvent is the sdk's,
// header for header and byte for byte, and the sdk reads it back as the
// same event.
func TestRequestMatchesSDK(t *testing.T) {
	u, _ := url.Parse("http://hook.example/sync")
	now := time.Date(2026, 11, 24, 3, 4, 5, 123456789, time.FixedZone("x", 3600))
	body := []byte(`{"parent":{"metadata":{"name":"p"}}}`)
	for _, tc := range encodingCalls() {
		t.Run(tc.reason, func(t *testing.T) {
			want, got, wantBody, gotBody := encodeBoth(t, binding.WithForceBinary, u, &tc.call, body, now)
			if string(wantBody) != string(gotBody) || got.ContentLength != int64(len(body)) {
				t.Errorf("body %q (length %d), want %q", gotBody, got.ContentLength, wantBody)
			}
			if got.Method != want.Method || got.URL.String() != want.URL.String() {
				t.Errorf("%s %s, want %s %s", got.Method, got.URL, want.Method, want.URL)
			}
		})
	}
}
