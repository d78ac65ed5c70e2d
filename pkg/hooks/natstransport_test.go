package hooks

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	cejs "github.com/cloudevents/sdk-go/protocol/nats_jetstream/v2"
	"github.com/cloudevents/sdk-go/v2/binding"
	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/google/go-cmp/cmp"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/metabus/metabus/internal/testing/testnats"
	"github.com/metabus/metabus/pkg/api/v1alpha1"
	"github.com/metabus/metabus/pkg/hookwire"
)

// TestNATSRequestMatchesBinding: a binary-mode request carries the headers
// the sdk's NATS binding writes (its ce-datacontenttype as the binding
// spec's content-type header) and the body untouched; in either mode the
// sdk's NATS binding reads the message back as the sdk's event.
func TestNATSRequestMatchesBinding(t *testing.T) {
	now := time.Date(2026, 11, 24, 3, 4, 5, 123456789, time.UTC)
	body := []byte(`{"parent":{"metadata":{"name":"p"}},"n":12345678901234567}`)
	calls := []struct {
		reason string
		call   Call
	}{
		{"a sync with a subject and the partition extensions", Call{ID: "uid:00000000000000000007", Kind: "sync", ControllerType: "CompositeController",
			ControllerName: "c", Subject: "/apis/example.com/v1/namespaces/ns/things/p",
			Extensions: map[string]string{"partitionkey": "cc-c/uid", "parentuid": "uid", "workseq": "00000000000000000007"}}},
		{"no subject, an explicit source", Call{ID: "id-2", Kind: "customize", Source: "/apis/x/v1/y/z"}},
		// The HTTP binding would percent-encode these; the NATS binding
		// carries them verbatim, and so does metabus.
		{"values with a space, a percent sign, a quote and non-ASCII", Call{ID: "id 3%41", Kind: "sync", Source: "/apis/x/v1/y/z", Subject: "/\"é\"",
			Extensions: map[string]string{"parentuid": "50% off"}}},
	}
	for _, tc := range calls {
		ref, err := sdkEvent(&tc.call, body, now)
		if err != nil {
			t.Fatal(err)
		}
		t.Run("binary/"+tc.reason, func(t *testing.T) {
			var payload bytes.Buffer
			h, err := cejs.WriteMsg(binding.WithForceBinary(context.Background()), binding.ToMessage(&ref), &payload)
			if err != nil {
				t.Fatal(err)
			}
			want := nats.Header{}
			for k, v := range h {
				if k == "ce-datacontenttype" {
					k = hookwire.HeaderContentType
				}
				want[k] = v
			}
			got, err := natsRequest("hooks.x", v1alpha1.CloudEventsBinary, &tc.call, body, now)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(want, got.Header); diff != "" {
				t.Errorf("headers (-binding +metabus):\n%s", diff)
			}
			if !bytes.Equal(got.Data, payload.Bytes()) || !bytes.Equal(got.Data, body) {
				t.Errorf("payload %q, want the body %q", got.Data, body)
			}
			readBack(t, got, ref)
		})
		t.Run("structured/"+tc.reason, func(t *testing.T) {
			got, err := natsRequest("hooks.x", v1alpha1.CloudEventsStructured, &tc.call, body, now)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(nats.Header{hookwire.HeaderContentType: {hookwire.ContentTypeStructured}}, got.Header); diff != "" {
				t.Errorf("headers (-want +got):\n%s", diff)
			}
			readBack(t, got, ref)
		})
	}
}

// TestNATSRequestRefusesControlCharacters: a value a NATS header line
// cannot carry is an error before anything is sent, whatever its place.
func TestNATSRequestRefusesControlCharacters(t *testing.T) {
	for _, tc := range []struct {
		reason string
		call   Call
	}{
		{"a line break in the subject", Call{ID: "i", Kind: "sync", Source: "/s", Subject: "/a\r\nce-id: forged"}},
		{"a NUL in an extension", Call{ID: "i", Kind: "sync", Source: "/s", Extensions: map[string]string{"parentuid": "a\x00b"}}},
	} {
		t.Run(tc.reason, func(t *testing.T) {
			msg, err := natsRequest("hooks.x", v1alpha1.CloudEventsBinary, &tc.call, []byte(`{}`), time.Now())
			if err == nil || !strings.Contains(err.Error(), "control character") {
				t.Fatalf("natsRequest = %v, %v; want a control character error", msg, err)
			}
		})
	}
}

// readBack reads msg with the sdk's NATS binding and compares the event
// with want.
func readBack(t *testing.T, msg *nats.Msg, want event.Event) {
	t.Helper()
	ev, err := binding.ToEvent(context.Background(), cejs.NewMessage(msg))
	if err != nil {
		t.Fatalf("the sdk cannot read the request: %v", err)
	}
	if diff := cmp.Diff(want.String(), ev.String()); diff != "" {
		t.Errorf("event read back (-want +got):\n%s", diff)
	}
	if !bytes.Equal(compactJSON(t, ev.Data()), compactJSON(t, want.Data())) {
		t.Errorf("data %s, want %s", ev.Data(), want.Data())
	}
}

func compactJSON(t *testing.T, b []byte) []byte {
	t.Helper()
	var out bytes.Buffer
	if err := json.Compact(&out, b); err != nil {
		t.Fatalf("%q: %v", b, err)
	}
	return out.Bytes()
}

func TestCheckSubject(t *testing.T) {
	c := New(Options{SubjectPrefix: "hooks.", SubjectPrefixSetting: "--hook-subject-prefix"})
	cases := []struct {
		reason, subject string
		// want is "" for an accepted subject, else a part of the error;
		// refused says it is a *RefusedError rather than an invalid spec.
		want    string
		refused bool
	}{
		{reason: "a literal subject under the prefix", subject: "hooks.hello.sync"},
		{reason: "one token under the prefix", subject: "hooks.x"},
		{reason: "no subject", subject: "", want: "subject is required"},
		{reason: "a * wildcard", subject: "hooks.*", want: "wildcard '*'"},
		{reason: "a > wildcard", subject: "hooks.a.>", want: "wildcard '>'"},
		{reason: "a wildcard inside a token", subject: "hooks.a*b", want: "wildcard '*'"},
		{reason: "an empty token", subject: "hooks..a", want: "empty token"},
		{reason: "a trailing dot", subject: "hooks.a.", want: "empty token"},
		{reason: "a space", subject: "hooks.a b", want: "printable ASCII"},
		{reason: "a control character", subject: "hooks.a\x00", want: "printable ASCII"},
		{reason: "too long", subject: "hooks." + strings.Repeat("a", 300), want: "longer than"},
		{reason: "outside the prefix", subject: "other.sync", want: `not under the allowed prefix "hooks." (--hook-subject-prefix)`, refused: true},
		{reason: "the prefix's own token", subject: "hooks", want: "not under the allowed prefix", refused: true},
		{reason: "a prefix lookalike", subject: "hooksx.a", want: "not under the allowed prefix", refused: true},
		{reason: "metabus's work stream", subject: "mc.work.cc-x.uid", want: "under mc.", refused: true},
		{reason: "JetStream's API", subject: "$JS.API.STREAM.DELETE.MC_WORK", want: "under $", refused: true},
		{reason: "the system account", subject: "$SYS.REQ.SERVER.PING", want: "under $", refused: true},
		{reason: "a reply inbox", subject: "_INBOX.abc", want: "under _INBOX.", refused: true},
	}
	for _, tc := range cases {
		t.Run(tc.reason, func(t *testing.T) {
			err := c.checkSubject(tc.subject)
			got := ""
			if err != nil {
				got = err.Error()
			}
			if tc.want == "" {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			if !strings.Contains(got, tc.want) {
				t.Errorf("error %q, want it to contain %q", got, tc.want)
			}
			var refused *RefusedError
			if errors.As(err, &refused) != tc.refused {
				t.Errorf("refused = %v, want %v (%v)", !tc.refused, tc.refused, err)
			}
		})
	}
}

func TestCheckSubjectPrefix(t *testing.T) {
	for _, tc := range []struct{ reason, prefix, want string }{
		{reason: "the default", prefix: "hooks."},
		{reason: "several tokens", prefix: "team-a.hooks."},
		{reason: "empty", prefix: "", want: "ending with a dot"},
		{reason: "no dot at the end", prefix: "hooks", want: "ending with a dot"},
		{reason: "a wildcard", prefix: "hooks.*.", want: "wildcard"},
		{reason: "the bus's subjects", prefix: "mc.", want: "under mc."},
		{reason: "under the bus's subjects", prefix: "mc.hooks.", want: "under mc."},
		{reason: "JetStream's API", prefix: "$JS.", want: "under $"},
		{reason: "inboxes", prefix: "_INBOX.", want: "under _INBOX."},
	} {
		t.Run(tc.reason, func(t *testing.T) {
			got := ""
			if err := CheckSubjectPrefix(tc.prefix); err != nil {
				got = err.Error()
			}
			if (tc.want == "") != (got == "") || !strings.Contains(got, tc.want) {
				t.Errorf("CheckSubjectPrefix(%q) = %q, want %q", tc.prefix, got, tc.want)
			}
		})
	}
}

// natsHook is a hook served over NATS at subject.
func natsHook(subject string, timeout time.Duration) *v1alpha1.Hook {
	h := &v1alpha1.Hook{NATS: &v1alpha1.NATSHook{Subject: subject}}
	if timeout > 0 {
		h.NATS.Timeout = &metav1.Duration{Duration: timeout}
	}
	return h
}

// natsCall is a sync call of a hook served over NATS at subject.
func natsCall(subject string, timeout time.Duration) Call {
	return Call{Hook: natsHook(subject, timeout), Kind: "sync", ControllerType: "CompositeController", ControllerName: "c",
		Subject: "/apis/x/v1/namespaces/ns/things/p", ID: "uid:1", Extensions: map[string]string{"parentuid": "uid"},
		Request: map[string]any{"parent": map[string]any{"metadata": map[string]any{"name": "p"}}}}
}

// startNATS runs an embedded server and returns a connection to it.
func startNATS(t *testing.T) *nats.Conn {
	t.Helper()
	s := testnats.Serve(t, &server.Options{Host: "127.0.0.1", Port: -1})
	nc, err := nats.Connect(s.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// reply is a responder's answer.
type reply struct {
	header nats.Header
	data   string
}

func TestNATSReplies(t *testing.T) {
	nc := startNATS(t)
	ce := func(extra nats.Header) nats.Header {
		h := nats.Header{"ce-specversion": {"1.0"}, "ce-id": {"r"}, "ce-type": {"t"}, "ce-source": {"/s"}}
		for k, v := range extra {
			h[k] = v
		}
		return h
	}
	errHeader := func(code, msg string, extra ...string) nats.Header {
		h := nats.Header{hookwire.HeaderServiceErrorCode: {code}, hookwire.HeaderServiceError: {msg}}
		for i := 0; i+1 < len(extra); i += 2 {
			h[extra[i]] = []string{extra[i+1]}
		}
		return h
	}
	okBody := `{"status":{"ok":true},"children":[{"kind":"ConfigMap"}]}`
	okResp := syncResponse{Status: map[string]any{"ok": true}, Children: []map[string]any{{"kind": "ConfigMap"}}}
	cases := []struct {
		reason string
		reply  reply
		strict bool
		want   syncResponse
		// check inspects the error (nil: success expected).
		check func(t *testing.T, err error)
	}{
		{reason: "plain JSON", reply: reply{data: okBody}, want: okResp},
		{reason: "a binary CloudEvent", reply: reply{header: ce(nats.Header{"content-type": {"application/json"}}), data: okBody}, want: okResp},
		{reason: "a binary CloudEvent, headers in another case", reply: reply{header: nats.Header{"Ce-Specversion": {"1.0"}, "Ce-Id": {"r"},
			"Ce-Type": {"t"}, "Ce-Source": {"/s"}, "Content-Type": {"application/json"}}, data: okBody}, want: okResp},
		{reason: "a structured CloudEvent", reply: reply{header: nats.Header{"content-type": {hookwire.ContentTypeStructured}},
			data: `{"specversion":"1.0","id":"r","type":"t","source":"/s","datacontenttype":"application/json","data":` + okBody + `}`}, want: okResp},
		{reason: "a hook error", reply: reply{header: errHeader("500", "database\ndown")}, check: func(t *testing.T, err error) {
			var se *ServiceError
			if !errors.As(err, &se) || se.Code != 500 || se.Message != "database down" {
				t.Errorf("error %v, want ServiceError 500 with the message", err)
			}
		}},
		{reason: "a refusal by the hook (4xx) is the hook's error too", reply: reply{header: errHeader("400", "bad request")}, check: func(t *testing.T, err error) {
			var se *ServiceError
			if !errors.As(err, &se) || se.Code != 400 {
				t.Errorf("error %v, want ServiceError 400", err)
			}
		}},
		{reason: "throttled with an integer Retry-After", reply: reply{header: errHeader("429", "busy", hookwire.HeaderRetryAfter, "3")}, check: wantRetryAfter(3 * time.Second)},
		{reason: "throttled with a decimal Retry-After", reply: reply{header: errHeader("429", "busy", hookwire.HeaderRetryAfter, "0.25")}, check: wantRetryAfter(250 * time.Millisecond)},
		{reason: "throttled without Retry-After", reply: reply{header: errHeader("429", "busy")}, check: wantRetryAfter(0)},
		{reason: "throttled with a malformed Retry-After", reply: reply{header: errHeader("429", "busy", hookwire.HeaderRetryAfter, "soon")}, check: wantRetryAfter(0)},
		{reason: "a malformed error code", reply: reply{header: errHeader("oops", "x")}, check: decodeErrorWith("malformed Nats-Service-Error-Code")},
		{reason: "garbage", reply: reply{data: "<html>"}, check: decodeErrorWith("invalid character")},
		{reason: "empty", reply: reply{}, check: decodeErrorWith("empty response body")},
		{reason: "null", reply: reply{data: "null"}, check: decodeErrorWith("response is null")},
		{reason: "oversized", reply: reply{data: `{"status":{"pad":"` + strings.Repeat("x", 2048) + `"}}`}, check: wantTooLarge},
		{reason: "a batch of CloudEvents", reply: reply{header: nats.Header{"content-type": {"application/cloudevents-batch+json"}}, data: "[]"},
			check: decodeErrorWith("batched CloudEvents replies are not supported")},
		{reason: "a CloudEvent whose data is not JSON", reply: reply{header: ce(nats.Header{"content-type": {"text/plain"}}), data: "hi"},
			check: decodeErrorWith(`datacontenttype "text/plain"`)},
		{reason: "strict mode refuses unknown fields", strict: true, reply: reply{data: `{"status":{},"extra":1}`}, check: decodeErrorWith("strict decoding")},
	}
	for i, tc := range cases {
		t.Run(tc.reason, func(t *testing.T) {
			subject := "hooks.t" + string(rune('a'+i))
			sub, err := nc.Subscribe(subject, func(m *nats.Msg) {
				r := nats.NewMsg(m.Reply)
				r.Header, r.Data = tc.reply.header, []byte(tc.reply.data)
				_ = m.RespondMsg(r)
			})
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = sub.Unsubscribe() }()
			c := New(Options{NATS: nc, MaxResponseBytes: 1024})
			call := natsCall(subject, 5*time.Second)
			if tc.strict {
				m := v1alpha1.ResponseUnMarshallModeStrict
				call.Hook.NATS.ResponseUnMarshallMode = &m
			}
			var got syncResponse
			err = c.Do(context.Background(), call, &got)
			if tc.check == nil {
				if err != nil {
					t.Fatal(err)
				}
				if diff := cmp.Diff(tc.want, got); diff != "" {
					t.Errorf("response (-want +got):\n%s", diff)
				}
				return
			}
			if err == nil {
				t.Fatal("no error")
			}
			tc.check(t, err)
		})
	}
}

// decodeErrorWith is wantDecodeError also requiring part in the message.
func decodeErrorWith(part string) func(*testing.T, error) {
	return func(t *testing.T, err error) {
		t.Helper()
		wantDecodeError(t, err)
		if !strings.Contains(err.Error(), part) {
			t.Errorf("error %v, want it to contain %q", err, part)
		}
	}
}

// TestNATSFailures: no responder, a hook that never answers, an invalid
// spec, and a refused subject, each typed as the dispatcher expects.
func TestNATSFailures(t *testing.T) {
	nc := startNATS(t)
	hang, err := nc.Subscribe("hooks.hang", func(*nats.Msg) {})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = hang.Unsubscribe() }()
	var sent int
	spy, err := nc.Subscribe("other.>", func(*nats.Msg) { sent++ })
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = spy.Unsubscribe() }()
	c := New(Options{NATS: nc})
	both := natsCall("hooks.x", 0)
	u := "http://127.0.0.1:1/"
	both.Hook.Webhook = &v1alpha1.Webhook{URL: &u}
	structured, bogus := v1alpha1.CloudEventsStructured, v1alpha1.CloudEventsMode("bogus")
	withMode := func(m *v1alpha1.CloudEventsMode) Call {
		c := natsCall("hooks.nobody", 0)
		c.Hook.NATS.CloudEvents = m
		return c
	}
	for _, tc := range []struct {
		reason string
		call   Call
		check  func(*testing.T, error)
	}{
		{reason: "no responders", call: natsCall("hooks.nobody", 0), check: func(t *testing.T, err error) {
			var nr *NoRespondersError
			if !errors.As(err, &nr) || !errors.Is(err, nats.ErrNoResponders) || !strings.Contains(err.Error(), "no hook is subscribed to NATS subject hooks.nobody") {
				t.Errorf("error %v, want NoRespondersError", err)
			}
		}},
		{reason: "no responders, structured mode", call: withMode(&structured), check: func(t *testing.T, err error) {
			var nr *NoRespondersError
			if !errors.As(err, &nr) {
				t.Errorf("error %v, want NoRespondersError", err)
			}
		}},
		{reason: "a hook that never answers", call: natsCall("hooks.hang", 200*time.Millisecond), check: func(t *testing.T, err error) {
			if !errors.Is(err, ErrTimeout) || !errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("error %v, want ErrTimeout", err)
			}
		}},
		{reason: "both webhook and nats", call: both, check: wantMessage("set exactly one of webhook and nats")},
		{reason: "an unknown cloudEvents mode", call: withMode(&bogus), check: wantMessage(`unknown cloudEvents mode "bogus"`)},
		{reason: "a subject outside the prefix", call: natsCall("other.x", 0), check: func(t *testing.T, err error) {
			var refused *RefusedError
			if !errors.As(err, &refused) {
				t.Errorf("error %v, want RefusedError", err)
			}
		}},
	} {
		t.Run(tc.reason, func(t *testing.T) {
			err := c.Do(context.Background(), tc.call, &syncResponse{})
			if err == nil {
				t.Fatal("no error")
			}
			tc.check(t, err)
		})
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	if sent != 0 {
		t.Errorf("%d requests reached a refused subject", sent)
	}
	if err := New(Options{}).Do(context.Background(), natsCall("hooks.x", 0), nil); err == nil || !strings.Contains(err.Error(), "no NATS connection") {
		t.Errorf("a client without a NATS connection: %v", err)
	}
}

func wantMessage(part string) func(*testing.T, error) {
	return func(t *testing.T, err error) {
		if !strings.Contains(err.Error(), part) {
			t.Errorf("error %q, want it to contain %q", err, part)
		}
	}
}
