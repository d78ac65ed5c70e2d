package hooks

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/cloudevents/sdk-go/v2/binding"
	"github.com/cloudevents/sdk-go/v2/event"
	cehttp "github.com/cloudevents/sdk-go/v2/protocol/http"

	"github.com/metabus/metabus/pkg/api/v1alpha1"
)

// A hook written for upstream Metacontroller must see exactly the JSON body it always saw,
// with Content-Type application/json, plus ce-* headers it can ignore.
func TestDoLegacyPlainJSON(t *testing.T) {
	srv, rec := serve(t, replyJSON(`{"status":{"replicas":3,"ratio":0.5},"children":[{"apiVersion":"v1","kind":"ConfigMap"}]}`))
	clock := newFakeClock()
	c := New(Options{Now: clock.Now})
	call := syncCall(hookAt(srv.URL + "/sync"))

	var resp syncResponse
	if err := c.Do(context.Background(), call, &resp); err != nil {
		t.Fatalf("Do: %v", err)
	}

	got := rec.last(t)
	want, _ := json.Marshal(call.Request)
	if got.Method != http.MethodPost {
		t.Errorf("method = %s, want POST", got.Method)
	}
	if string(got.Body) != string(want) {
		t.Errorf("body = %s\nwant   %s", got.Body, want)
	}
	for h, v := range map[string]string{
		"Content-Type":   "application/json",
		"Ce-Specversion": "1.0",
		"Ce-Type":        "io.k8s.metacontroller.hook.sync.v1",
		"Ce-Source":      call.Source,
		"Ce-Id":          call.ID,
		"Ce-Subject":     call.Subject,
		"Ce-Time":        clock.Now().Format(time.RFC3339Nano),
		"Ce-Parentuid":   "uid-1",
		"Ce-Workseq":     "00000000000000000007",
	} {
		if g := got.Header.Get(h); g != v {
			t.Errorf("header %s = %q, want %q", h, g, v)
		}
	}
	// Integers stay int64, as in objects read from the API server (and as upstream decodes).
	if r, ok := resp.Status["replicas"].(int64); !ok || r != 3 {
		t.Errorf("status.replicas = %#v, want int64(3)", resp.Status["replicas"])
	}
	if r, ok := resp.Status["ratio"].(float64); !ok || r != 0.5 {
		t.Errorf("status.ratio = %#v, want 0.5", resp.Status["ratio"])
	}
	if len(resp.Children) != 1 || resp.Children[0]["kind"] != "ConfigMap" {
		t.Errorf("children = %#v", resp.Children)
	}
}

func TestDoRequestAttributes(t *testing.T) {
	srv, rec := serve(t, replyJSON(`{}`))
	c := New(Options{})
	tests := []struct {
		reason string
		mutate func(*Call)
		header string
		want   string // "*" checks only non-empty
	}{
		{reason: "an empty ID becomes a random UUID", mutate: func(c *Call) { c.ID = "" }, header: "Ce-Id", want: "*"},
		{reason: "an empty source is derived from the controller", mutate: func(c *Call) { c.Source = "" }, header: "Ce-Source",
			want: "/apis/metacontroller.k8s.io/v1alpha1/compositecontrollers/demo"},
		{reason: "non-printable and non-ASCII values are percent-encoded", mutate: func(c *Call) { c.Extensions = map[string]string{"note": "a b\"%é\n"} },
			header: "Ce-Note", want: "a%20b%22%25%C3%A9%0A"},
		{reason: "the kind selects the type", mutate: func(c *Call) { c.Kind = "customize" }, header: "Ce-Type", want: "io.k8s.metacontroller.hook.customize.v1"},
		{reason: "no subject, no header", mutate: func(c *Call) { c.Subject = "" }, header: "Ce-Subject", want: ""},
	}
	for _, tt := range tests {
		t.Run(tt.reason, func(t *testing.T) {
			call := syncCall(hookAt(srv.URL))
			tt.mutate(&call)
			if err := c.Do(context.Background(), call, nil); err != nil {
				t.Fatalf("Do: %v", err)
			}
			got := rec.last(t).Header.Get(tt.header)
			if tt.want == "*" && len(got) != 36 || tt.want != "*" && got != tt.want {
				t.Errorf("%s = %q, want %q", tt.header, got, tt.want)
			}
		})
	}
}

// A CloudEvents-aware hook may reply with an event; its data is the response.
func TestDoCloudEventReplies(t *testing.T) {
	data := `{"status":{"ok":true},"children":[]}`
	reply := func(ctx func(context.Context) context.Context, contentType string) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			ev := event.New()
			ev.SetID("reply-1")
			ev.SetType("io.k8s.metacontroller.hook.sync.response.v1")
			ev.SetSource("/hooks/demo")
			_ = ev.SetData(contentType, json.RawMessage(data))
			if err := cehttp.WriteResponseWriter(ctx(r.Context()), binding.ToMessage(&ev), http.StatusOK, w); err != nil {
				t.Errorf("writing the reply: %v", err)
			}
		}
	}
	raw := func(contentType, body string) http.HandlerFunc {
		return func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", contentType)
			_, _ = io.WriteString(w, body)
		}
	}
	tests := []struct {
		reason  string
		handler http.HandlerFunc
		wantErr bool
	}{
		{reason: "binary mode: ce-* headers, the body is the data", handler: reply(binding.WithForceBinary, "application/json")},
		{reason: "structured mode: the data member of an application/cloudevents+json body", handler: reply(binding.WithForceStructured, "application/json")},
		{reason: "structured mode with data_base64", handler: raw("application/cloudevents+json; charset=utf-8",
			`{"specversion":"1.0","id":"1","type":"t","source":"/s","datacontenttype":"application/json","data_base64":"`+
				"eyJzdGF0dXMiOnsib2siOnRydWV9LCJjaGlsZHJlbiI6W119"+`"}`)},
		{reason: "an event whose data is not JSON is a DecodeError", handler: reply(binding.WithForceBinary, "text/plain"), wantErr: true},
		{reason: "a malformed structured event is a DecodeError", handler: raw("application/cloudevents+json", `{"specversion":"1.0",`), wantErr: true},
		{reason: "batches are not a hook reply", handler: raw("application/cloudevents-batch+json", `[]`), wantErr: true},
	}
	c := New(Options{})
	for _, tt := range tests {
		t.Run(tt.reason, func(t *testing.T) {
			srv, _ := serve(t, tt.handler)
			var resp syncResponse
			err := c.Do(context.Background(), syncCall(hookAt(srv.URL)), &resp)
			if tt.wantErr {
				var de *DecodeError
				if !errors.As(err, &de) {
					t.Fatalf("err = %v, want a *DecodeError", err)
				}
				return
			}
			if err != nil {
				t.Fatalf("Do: %v", err)
			}
			if resp.Status["ok"] != true || resp.Children == nil {
				t.Errorf("response = %#v, want the event data decoded", resp)
			}
		})
	}
}

func TestDoErrors(t *testing.T) {
	long := strings.Repeat("x", 5000)
	status := func(code int, body string, header ...string) http.HandlerFunc {
		return func(w http.ResponseWriter, _ *http.Request) {
			for i := 0; i+1 < len(header); i += 2 {
				w.Header().Set(header[i], header[i+1])
			}
			w.WriteHeader(code)
			_, _ = io.WriteString(w, body)
		}
	}
	chunked := func(body string) http.HandlerFunc {
		return func(w http.ResponseWriter, _ *http.Request) {
			for i := 0; i < len(body); i += 100 {
				_, _ = io.WriteString(w, body[i:min(i+100, len(body))])
				w.(http.Flusher).Flush() // no Content-Length: the limit must hold while reading
			}
		}
	}
	clock := newFakeClock()
	tests := []struct {
		reason  string
		handler http.HandlerFunc
		check   func(t *testing.T, err error)
	}{
		{reason: "500 is an HTTPError with the body truncated to about 1 KiB", handler: status(500, "boom: "+long), check: func(t *testing.T, err error) {
			var he *HTTPError
			if !errors.As(err, &he) || he.StatusCode != 500 {
				t.Fatalf("err = %v, want HTTPError 500", err)
			}
			if !strings.HasPrefix(he.Body, "boom: xxx") || len(he.Body) > maxErrorBody+32 || !strings.HasSuffix(he.Body, "(truncated)") {
				t.Errorf("body = %q (len %d), want a truncated snippet", he.Body, len(he.Body))
			}
		}},
		{reason: "a non-printable error body is made printable", handler: status(502, "bad\x00gate\nway\xff"), check: func(t *testing.T, err error) {
			var he *HTTPError
			if !errors.As(err, &he) || he.Body != "bad?gate way?" {
				t.Fatalf("err = %v, want HTTPError with body %q", err, "bad?gate way?")
			}
		}},
		{reason: "only 200 is success: 204 is an HTTPError", handler: status(204, ""), check: wantHTTPError(204)},
		{reason: "304 without a cached entry is an HTTPError", handler: status(304, ""), check: wantHTTPError(304)},
		{reason: "malformed JSON is a DecodeError", handler: replyJSON(`{"status":`), check: wantDecodeError},
		{reason: "an empty body is a DecodeError", handler: replyJSON(``), check: wantDecodeError},
		{reason: "null is a DecodeError", handler: replyJSON(" null\n"), check: wantDecodeError},
		{reason: "a wrong JSON type is a DecodeError", handler: replyJSON(`{"children":{}}`), check: wantDecodeError},
		{reason: "a body above the limit (Content-Length) is a DecodeError", handler: replyJSON(`{"status":{"x":"` + long + `"}}`), check: wantTooLarge},
		{reason: "a body above the limit (chunked) is a DecodeError", handler: chunked(`{"status":{"x":"` + long + `"}}`), check: wantTooLarge},
		{reason: "429 with Retry-After in seconds", handler: status(429, "", "Retry-After", "3"), check: wantRetryAfter(3 * time.Second)},
		{reason: "429 with Retry-After as an HTTP-date", handler: status(429, "", "Retry-After", clock.Now().Add(7*time.Second).Format(http.TimeFormat)), check: wantRetryAfter(7 * time.Second)},
		{reason: "429 with a past HTTP-date", handler: status(429, "", "Retry-After", clock.Now().Add(-time.Hour).Format(http.TimeFormat)), check: wantRetryAfter(0)},
		{reason: "429 without Retry-After", handler: status(429, ""), check: wantRetryAfter(0)},
		{reason: "429 with a malformed Retry-After", handler: status(429, "", "Retry-After", "soon"), check: wantRetryAfter(0)},
	}
	c := New(Options{Now: clock.Now, MaxResponseBytes: 4096})
	for _, tt := range tests {
		t.Run(tt.reason, func(t *testing.T) {
			srv, _ := serve(t, tt.handler)
			var resp syncResponse
			tt.check(t, c.Do(context.Background(), syncCall(hookAt(srv.URL)), &resp))
		})
	}
}

func wantHTTPError(code int) func(*testing.T, error) {
	return func(t *testing.T, err error) {
		t.Helper()
		var he *HTTPError
		if !errors.As(err, &he) || he.StatusCode != code {
			t.Fatalf("err = %v, want HTTPError %d", err, code)
		}
	}
}

func wantDecodeError(t *testing.T, err error) {
	t.Helper()
	var de *DecodeError
	if !errors.As(err, &de) {
		t.Fatalf("err = %v, want a DecodeError", err)
	}
}

func wantTooLarge(t *testing.T, err error) {
	t.Helper()
	wantDecodeError(t, err)
	if !errors.Is(err, ErrResponseTooLarge) {
		t.Fatalf("err = %v, want ErrResponseTooLarge", err)
	}
}

func wantRetryAfter(d time.Duration) func(*testing.T, error) {
	return func(t *testing.T, err error) {
		t.Helper()
		var tm *TooManyRequestsError
		if !errors.As(err, &tm) {
			t.Fatalf("err = %v, want a TooManyRequestsError", err)
		}
		if tm.RetryAfter != d {
			t.Errorf("RetryAfter = %s, want %s", tm.RetryAfter, d)
		}
	}
}

func TestDoTimeout(t *testing.T) {
	release := make(chan struct{})
	defer close(release)
	slow := func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-r.Context().Done():
		case <-release:
		case <-time.After(10 * time.Second):
		}
	}
	srv, _ := serve(t, slow)
	tests := []struct {
		reason string
		opts   Options
		hook   *v1alpha1.Hook
	}{
		{reason: "webhook.timeout bounds the call", hook: withTimeout(hookAt(srv.URL), 100*time.Millisecond)},
		{reason: "Options.DefaultTimeout applies when webhook.timeout is unset", opts: Options{DefaultTimeout: 100 * time.Millisecond}, hook: hookAt(srv.URL)},
		{reason: "a non-positive webhook.timeout falls back to the default", opts: Options{DefaultTimeout: 100 * time.Millisecond}, hook: withTimeout(hookAt(srv.URL), -time.Second)},
	}
	for _, tt := range tests {
		t.Run(tt.reason, func(t *testing.T) {
			start := time.Now()
			err := New(tt.opts).Do(context.Background(), syncCall(tt.hook), &syncResponse{})
			elapsed := time.Since(start)
			if !errors.Is(err, ErrTimeout) || !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("err = %v, want ErrTimeout and context.DeadlineExceeded", err)
			}
			if elapsed > 2*time.Second {
				t.Errorf("Do returned after %s, want about 100ms", elapsed)
			}
		})
	}
}

func TestDoCanceled(t *testing.T) {
	srv, _ := serve(t, func(w http.ResponseWriter, r *http.Request) { <-r.Context().Done() })
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(50*time.Millisecond, cancel)
	err := New(Options{}).Do(ctx, syncCall(hookAt(srv.URL)), nil)
	if !errors.Is(err, context.Canceled) || errors.Is(err, ErrTimeout) {
		t.Fatalf("err = %v, want context.Canceled and not ErrTimeout", err)
	}
}

func TestDoDecodeModes(t *testing.T) {
	const (
		unknown   = `{"status":{},"children":[],"surprise":1}`
		duplicate = `{"status":{"a":1},"status":{"b":2},"children":[]}`
		clean     = `{"status":{"a":1},"children":[]}`
	)
	v1, v2 := ptr(v1alpha1.HookVersionV1), ptr(v1alpha1.HookVersionV2)
	strict, loose := ptr(v1alpha1.ResponseUnMarshallModeStrict), ptr(v1alpha1.ResponseUnMarshallModeLoose)
	tests := []struct {
		reason  string
		version *v1alpha1.HookVersion
		mode    *v1alpha1.ResponseUnMarshallMode
		body    string
		wantErr bool
	}{
		{reason: "default (v1) is loose: unknown fields are ignored", body: unknown},
		{reason: "default (v1) is loose: duplicate fields are accepted", body: duplicate},
		{reason: "explicit v1 is loose", version: v1, body: unknown},
		{reason: "v2 defaults to strict: unknown field", version: v2, body: unknown, wantErr: true},
		{reason: "v2 defaults to strict: duplicate field", version: v2, body: duplicate, wantErr: true},
		{reason: "v2 strict accepts a clean body", version: v2, body: clean},
		{reason: "v2 with loose mode ignores unknown fields", version: v2, mode: loose, body: unknown},
		{reason: "v1 with strict mode rejects unknown fields", version: v1, mode: strict, body: unknown, wantErr: true},
		{reason: "strict rejects duplicate fields", mode: strict, body: duplicate, wantErr: true},
		{reason: "strict is case-sensitive: Status is unknown", mode: strict, body: `{"Status":{}}`, wantErr: true},
	}
	c := New(Options{})
	for _, tt := range tests {
		t.Run(tt.reason, func(t *testing.T) {
			srv, _ := serve(t, replyJSON(tt.body))
			h := hookAt(srv.URL)
			h.Version = tt.version
			h.Webhook.ResponseUnMarshallMode = tt.mode
			var resp syncResponse
			err := c.Do(context.Background(), syncCall(h), &resp)
			if tt.wantErr {
				wantDecodeError(t, err)
				return
			}
			if err != nil {
				t.Fatalf("Do: %v", err)
			}
			if resp.Status == nil || resp.Children == nil {
				t.Errorf("known fields were not decoded: %#v", resp)
			}
		})
	}
}

// Invalid calls fail with a clear error and never panic or reach the hook.
func TestDoInvalidCalls(t *testing.T) {
	srv, rec := serve(t, replyJSON(`{}`))
	good := func() Call { return syncCall(hookAt(srv.URL)) }
	tests := []struct {
		reason string
		call   func() Call
		resp   any
		want   string
	}{
		{reason: "nil hook", call: func() Call { c := good(); c.Hook = nil; return c }, want: "no hook"},
		{reason: "nil webhook", call: func() Call { c := good(); c.Hook.Webhook = nil; return c }, want: "has no webhook"},
		{reason: "neither url nor service", call: func() Call { c := good(); c.Hook.Webhook.URL = nil; return c }, want: "url or service"},
		{reason: "no kind", call: func() Call { c := good(); c.Kind = ""; return c }, want: "no kind"},
		{reason: "unknown hook version", call: func() Call { c := good(); c.Hook.Version = ptr(v1alpha1.HookVersion("v9")); return c }, want: "hook version"},
		{reason: "unknown decode mode", call: func() Call {
			c := good()
			c.Hook.Webhook.ResponseUnMarshallMode = ptr(v1alpha1.ResponseUnMarshallMode("Sloppy"))
			return c
		}, want: "responseUnMarshallMode"},
		{reason: "unknown CloudEvents mode", call: func() Call {
			c := good()
			c.Hook.Webhook.CloudEvents = ptr(v1alpha1.CloudEventsMode("Structured"))
			return c
		}, want: "cloudEvents mode"},
		{reason: "upper-case extension name", call: func() Call { c := good(); c.Extensions = map[string]string{"ParentUID": "x"}; return c }, want: "extension name"},
		{reason: "extension overriding a core attribute", call: func() Call { c := good(); c.Extensions = map[string]string{"source": "x"}; return c }, want: "source"},
		{reason: "unmarshalable request", call: func() Call { c := good(); c.Request = make(chan int); return c }, want: "marshal request"},
		{reason: "typed nil response pointer", call: good, resp: (*syncResponse)(nil), want: "decode"},
	}
	c := New(Options{})
	for _, tt := range tests {
		t.Run(tt.reason, func(t *testing.T) {
			before := rec.count()
			err := c.Do(context.Background(), tt.call(), tt.resp)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err = %v, want it to mention %q", err, tt.want)
			}
			if tt.resp == nil && rec.count() != before {
				t.Errorf("an invalid call reached the hook")
			}
		})
	}
}

func TestDoNilResponseDiscardsBody(t *testing.T) {
	srv, _ := serve(t, replyJSON(`{"anything":[1,2]}`))
	if err := New(Options{}).Do(context.Background(), syncCall(hookAt(srv.URL)), nil); err != nil {
		t.Fatalf("Do: %v", err)
	}
}
