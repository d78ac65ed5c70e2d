package hook_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/metabus/metabus/sdk/hook"
	"github.com/metabus/metabus/sdk/hook/hooktest"
)

// greet is the hook of these tests: it names the parent's Pod after it,
// fails when spec.fail says so, and panics on spec.panic.
func greet(ctx context.Context, req *hook.CompositeRequest) (*hook.CompositeResponse, error) {
	spec, _, _ := unstructured.NestedMap(req.Parent.Object, "spec")
	switch spec["fail"] {
	case "plain":
		return nil, errors.New("the database is down")
	case "refuse":
		return nil, hook.Errorf(422, "spec.who is not a name")
	case "throttle":
		return nil, fmt.Errorf("busy: %w", hook.Throttled(1500*time.Millisecond, "too many parents"))
	case "panic":
		panic("boom")
	case "nothing":
		return nil, nil
	}
	call := hook.CallFrom(ctx)
	return &hook.CompositeResponse{
		Status: map[string]any{
			"pods":      int64(len(req.Children.Of("v1", "Pod"))),
			"parentuid": call.Extensions["parentuid"],
			"finalize":  req.Finalizing,
		},
		Children: []*unstructured.Unstructured{{Object: map[string]any{
			"apiVersion": "v1", "kind": "Pod", "metadata": map[string]any{"name": req.Parent.GetName()},
		}}},
	}, nil
}

func parentBody(spec string) []byte {
	return []byte(`{"controller":{"apiVersion":"metacontroller.k8s.io/v1alpha1","kind":"CompositeController","metadata":{"name":"c"}},` +
		`"parent":{"apiVersion":"example.com/v1","kind":"HelloWorld","metadata":{"name":"p","namespace":"ns","uid":"u-1"},"spec":` + spec + `},` +
		`"children":{"Pod.v1":{"p":{"metadata":{"name":"p"}}}},"related":{},"finalizing":false}`)
}

// TestHTTPHandler calls the handler over HTTP in each mode (plain JSON,
// binary and structured CloudEvents) and checks the answer's code, data or
// message, and Retry-After.
func TestHTTPHandler(t *testing.T) {
	h := hook.Composite(greet)
	okData := `{"status":{"finalize":false,"parentuid":"u-1","pods":1},"children":[{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p"}}]}`
	cases := []struct {
		reason   string
		kind     string
		body     []byte
		opts     []hook.Option
		wantCode int
		// wantData is the JSON answer; in plain mode parentuid is absent
		// (no CloudEvent, no extensions), so it is compared without it.
		wantData  string
		wantMsg   string
		wantRetry time.Duration
	}{
		{reason: "a sync call is answered with the typed response", kind: hook.KindSync, body: parentBody(`{}`), wantCode: 200, wantData: okData},
		{reason: "the same handler serves finalize", kind: hook.KindFinalize, body: parentBody(`{}`), wantCode: 200, wantData: okData},
		{reason: "a plain error is a 500 with its text", kind: hook.KindSync, body: parentBody(`{"fail":"plain"}`), wantCode: 500, wantMsg: "the database is down"},
		{reason: "an *Error keeps its code", kind: hook.KindSync, body: parentBody(`{"fail":"refuse"}`), wantCode: 422, wantMsg: "spec.who is not a name"},
		{reason: "a wrapped throttled error is a 429 with Retry-After rounded up to whole seconds", kind: hook.KindSync, body: parentBody(`{"fail":"throttle"}`), wantCode: 429, wantMsg: "too many parents", wantRetry: 2 * time.Second},
		{reason: "a panic is recovered and answered 500", kind: hook.KindSync, body: parentBody(`{"fail":"panic"}`), wantCode: 500, wantMsg: "hook panicked: boom"},
		{reason: "no response and no error is a 500", kind: hook.KindSync, body: parentBody(`{"fail":"nothing"}`), wantCode: 500, wantMsg: "neither a response nor an error"},
		{reason: "malformed JSON is a 400", kind: hook.KindSync, body: []byte(`{"parent":`), wantCode: 400, wantMsg: "malformed"},
		{reason: "a parent that is not an object is a 400", kind: hook.KindSync, body: []byte(`{"parent":"p"}`), wantCode: 400, wantMsg: "parent: want an object"},
		{reason: "a body above the limit is a 413", kind: hook.KindSync, body: parentBody(`{"pad":"` + strings.Repeat("x", 2048) + `"}`), opts: []hook.Option{hook.WithMaxRequestBytes(1024)}, wantCode: 413, wantMsg: "at most 1024"},
	}
	for _, tc := range cases {
		for _, mode := range hooktest.Modes {
			t.Run(tc.reason+"/"+mode.String(), func(t *testing.T) {
				reply, err := hooktest.Do(h, mode, tc.kind, tc.body, tc.opts...)
				if err != nil {
					t.Fatal(err)
				}
				if reply.Code != tc.wantCode {
					t.Fatalf("code %d (%s), want %d", reply.Code, reply.Message, tc.wantCode)
				}
				if !strings.Contains(reply.Message, tc.wantMsg) {
					t.Errorf("message %q, want it to contain %q", reply.Message, tc.wantMsg)
				}
				if reply.RetryAfter != tc.wantRetry {
					t.Errorf("retry after %s, want %s", reply.RetryAfter, tc.wantRetry)
				}
				if tc.wantData == "" {
					return
				}
				want := tc.wantData
				if mode == hook.ModePlain {
					want = strings.Replace(want, `"parentuid":"u-1",`, `"parentuid":"",`, 1)
				}
				if diff := cmp.Diff(want, string(reply.Data)); diff != "" {
					t.Errorf("data (-want +got):\n%s", diff)
				}
				if mode != hook.ModePlain {
					if got := reply.Event.Extensions()["requestid"]; got != "hooktest-"+tc.kind {
						t.Errorf("requestid %v, want the request's id", got)
					}
					if got := reply.Event.Subject(); got != "/ns/p" {
						t.Errorf("subject %q, want the request's", got)
					}
				}
			})
		}
	}
}

// TestHTTPHandlerRefuses covers requests that never reach the handler's
// function: wrong method, hook kind or content, malformed CloudEvents.
func TestHTTPHandlerRefuses(t *testing.T) {
	h := hook.HTTPHandler(hook.Composite(greet))
	body := string(parentBody(`{}`))
	cases := []struct {
		reason   string
		method   string
		header   map[string]string
		body     string
		wantCode int
		wantMsg  string
	}{
		{reason: "GET is not a hook call", method: http.MethodGet, wantCode: 405, wantMsg: "POST"},
		{reason: "a map request sent to a composite handler is refused",
			header: map[string]string{"Ce-Specversion": "1.0", "Ce-Id": "1", "Ce-Source": "/s", "Ce-Type": "io.k8s.metacontroller.hook.map.v1", "Content-Type": "application/json"},
			body:   body, wantCode: 400, wantMsg: "serves sync and finalize hooks"},
		{reason: "a binary CloudEvent without a type is malformed",
			header: map[string]string{"Ce-Specversion": "1.0", "Ce-Id": "1", "Ce-Source": "/s", "Content-Type": "application/json"},
			body:   body, wantCode: 400, wantMsg: "type"},
		{reason: "a binary CloudEvent of another specversion is refused",
			header: map[string]string{"Ce-Specversion": "0.1", "Ce-Id": "1", "Ce-Source": "/s", "Ce-Type": "t", "Content-Type": "application/json"},
			body:   body, wantCode: 400, wantMsg: "CloudEvent"},
		{reason: "data that is not JSON is refused",
			header: map[string]string{"Ce-Specversion": "1.0", "Ce-Id": "1", "Ce-Source": "/s", "Ce-Type": "io.k8s.metacontroller.hook.sync.v1", "Content-Type": "text/plain"},
			body:   body, wantCode: 415, wantMsg: "text/plain"},
		{reason: "a structured event that is not JSON is malformed",
			header: map[string]string{"Content-Type": "application/cloudevents+json"}, body: "{", wantCode: 400, wantMsg: "structured"},
		{reason: "a structured event without an id is invalid",
			header: map[string]string{"Content-Type": "application/cloudevents+json"},
			body:   `{"specversion":"1.0","source":"/s","type":"io.k8s.metacontroller.hook.sync.v1","data":` + body + `}`, wantCode: 400, wantMsg: "id"},
		{reason: "a batch is refused",
			header: map[string]string{"Content-Type": "application/cloudevents-batch+json"}, body: "[]", wantCode: 415, wantMsg: "batch"},
	}
	for _, tc := range cases {
		t.Run(tc.reason, func(t *testing.T) {
			method := tc.method
			if method == "" {
				method = http.MethodPost
			}
			req, _ := http.NewRequest(method, "/sync", strings.NewReader(tc.body))
			for k, v := range tc.header {
				req.Header.Set(k, v)
			}
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, req)
			if rec.Code != tc.wantCode || !strings.Contains(rec.Body.String(), tc.wantMsg) {
				t.Errorf("got %d %q, want %d containing %q", rec.Code, rec.Body.String(), tc.wantCode, tc.wantMsg)
			}
		})
	}
}

// TestErrorLog checks that a panic reaches the error log with its stack,
// and a malformed request with no call.
func TestErrorLog(t *testing.T) {
	type logged struct {
		call *hook.Call
		err  error
	}
	var got []logged
	opt := hook.WithErrorLog(func(c *hook.Call, err error) { got = append(got, logged{c, err}) })
	if _, err := hooktest.Do(hook.Composite(greet), hook.ModeBinary, hook.KindSync, parentBody(`{"fail":"panic"}`), opt); err != nil {
		t.Fatal(err)
	}
	if _, err := hooktest.Do(hook.Composite(greet), hook.ModeBinary, hook.KindSync, []byte(`[`), opt); err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 {
		t.Fatalf("%d errors logged, want 2: %v", len(got), got)
	}
	if got[0].call == nil || got[0].call.ID != "hooktest-sync" || !strings.Contains(got[0].err.Error(), "goroutine") {
		t.Errorf("panic logged as %+v, want the call and a stack", got[0])
	}
	if !strings.Contains(got[1].err.Error(), "malformed") {
		t.Errorf("malformed request logged as %v", got[1].err)
	}
}
