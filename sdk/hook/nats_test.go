package hook_test

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"sync"
	"testing"
	"time"

	cejs "github.com/cloudevents/sdk-go/protocol/nats_jetstream/v2"
	"github.com/cloudevents/sdk-go/v2/binding"
	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/google/go-cmp/cmp"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/metabus/metabus/internal/testing/testnats"
	"github.com/metabus/metabus/pkg/hookwire"
	"github.com/metabus/metabus/sdk/hook"
)

// serveNATS starts ServeNATS on subject in group "hooks" and stops it at
// the end of the test, checking that it returns nil.
func serveNATS(t *testing.T, nc *nats.Conn, subject string, h hook.Handler, opts ...hook.Option) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- hook.ServeNATS(ctx, nc, subject, "hooks", h, opts...) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("ServeNATS: %v", err)
		}
	})
	// Subscribed once a request finds a responder (ServeNATS flushes its
	// subscription before serving).
	deadline := time.Now().Add(5 * time.Second)
	for {
		_, err := nc.Request(subject, []byte(`{"parent":{"metadata":{"name":"ping"}}}`), time.Second)
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("no responder on %s: %v", subject, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func natsConn(t *testing.T) *nats.Conn {
	t.Helper()
	s := testnats.Serve(t, &server.Options{Port: -1, MaxPayload: 64 << 10})
	nc, err := nats.Connect(s.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// natsRequest is a hook request as metabus sends it over NATS, in mode.
func natsRequest(t *testing.T, mode hook.Mode, kind string, body []byte) *nats.Msg {
	t.Helper()
	m := nats.NewMsg("")
	switch mode {
	case hook.ModePlain:
		m.Header.Set(hookwire.HeaderContentType, hookwire.ContentTypeJSON)
		m.Data = body
	case hook.ModeBinary:
		for k, v := range map[string]string{"specversion": "1.0", "id": "req-1", "type": hookwire.EventType(kind), "source": "/apis/c",
			"subject": "/ns/p", "time": "2026-11-28T17:00:00Z", hookwire.ExtParentUID: "u-1", hookwire.ExtWorkSeq: "00000000000000000042"} {
			m.Header.Set(hookwire.HeaderPrefix+k, v)
		}
		m.Header.Set(hookwire.HeaderContentType, hookwire.ContentTypeJSON)
		m.Data = body
	case hook.ModeStructured:
		ev := event.New()
		ev.SetID("req-1")
		ev.SetType(hookwire.EventType(kind))
		ev.SetSource("/apis/c")
		ev.SetSubject("/ns/p")
		ev.SetExtension(hookwire.ExtParentUID, "u-1")
		ev.SetDataContentType(hookwire.ContentTypeJSON)
		ev.DataEncoded = body
		ev.DataBase64 = !json.Valid(body)
		data, err := json.Marshal(ev)
		if err != nil {
			t.Fatal(err)
		}
		m.Header.Set(hookwire.HeaderContentType, hookwire.ContentTypeStructured)
		m.Data = data
	}
	return m
}

// replyData decodes a successful NATS answer in mode: its JSON data, and
// the answering event (nil in plain mode).
func replyData(t *testing.T, mode hook.Mode, m *nats.Msg) ([]byte, *event.Event) {
	t.Helper()
	switch mode {
	case hook.ModeBinary:
		if got := m.Header.Get("ce-specversion"); got != "1.0" {
			t.Fatalf("binary answer without ce-specversion: %v", m.Header)
		}
		ev := event.New()
		ev.SetID(m.Header.Get("ce-id"))
		ev.SetType(m.Header.Get("ce-type"))
		ev.SetSource(m.Header.Get("ce-source"))
		ev.SetSubject(m.Header.Get("ce-subject"))
		ev.SetExtension(hookwire.ExtRequestID, m.Header.Get("ce-"+hookwire.ExtRequestID))
		if err := ev.Validate(); err != nil {
			t.Fatalf("binary answer: %v", err)
		}
		return m.Data, &ev
	case hook.ModeStructured:
		if got := m.Header.Get(hookwire.HeaderContentType); got != hookwire.ContentTypeStructured {
			t.Fatalf("structured answer with content-type %q", got)
		}
		var ev event.Event
		if err := json.Unmarshal(m.Data, &ev); err != nil {
			t.Fatalf("structured answer: %v", err)
		}
		return ev.Data(), &ev
	}
	if m.Header.Get("ce-specversion") != "" {
		t.Fatal("a plain request was answered with a CloudEvent")
	}
	return m.Data, nil
}

// TestServeNATS sends requests over a real NATS server in each mode and
// checks the answers: data in the request's mode, failures in the
// Nats-Service-Error headers, back-pressure as 429 with Retry-After.
func TestServeNATS(t *testing.T) {
	nc := natsConn(t)
	serveNATS(t, nc, "hooks.test.sync", hook.Composite(greet))
	okData := `{"status":{"finalize":false,"parentuid":"u-1","pods":1},"children":[{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p"}}]}`
	cases := []struct {
		reason    string
		kind      string
		body      []byte
		wantCode  string
		wantData  string
		wantMsg   string
		wantRetry string
	}{
		{reason: "a sync call is answered with the typed response", kind: hook.KindSync, body: parentBody(`{}`), wantData: okData},
		{reason: "a plain error is code 500 with its text", kind: hook.KindSync, body: parentBody(`{"fail":"plain"}`), wantCode: "500", wantMsg: "the database is down"},
		{reason: "an *Error keeps its code", kind: hook.KindSync, body: parentBody(`{"fail":"refuse"}`), wantCode: "422", wantMsg: "spec.who is not a name"},
		{reason: "throttled is 429 with Retry-After in seconds", kind: hook.KindSync, body: parentBody(`{"fail":"throttle"}`), wantCode: "429", wantMsg: "too many parents", wantRetry: "1.5"},
		{reason: "a panic is recovered and answered 500", kind: hook.KindSync, body: parentBody(`{"fail":"panic"}`), wantCode: "500", wantMsg: "hook panicked: boom"},
		{reason: "malformed JSON is a 400", kind: hook.KindSync, body: []byte(`{"parent":`), wantCode: "400", wantMsg: "malformed"},
		{reason: "a body above the limit is a 413 (the server's max_payload is larger)", kind: hook.KindSync,
			body: parentBody(`{"pad":"` + strings.Repeat("x", 40<<10) + `"}`), wantCode: "413", wantMsg: "at most"},
	}
	for _, tc := range cases {
		for _, mode := range []hook.Mode{hook.ModePlain, hook.ModeBinary, hook.ModeStructured} {
			t.Run(tc.reason+"/"+mode.String(), func(t *testing.T) {
				if tc.wantCode == "413" {
					// Served with a lower limit than the server's.
					serveNATS(t, nc, "hooks.test.small", hook.Composite(greet), hook.WithMaxRequestBytes(32<<10))
				}
				req := natsRequest(t, mode, tc.kind, tc.body)
				req.Subject = "hooks.test.sync"
				if tc.wantCode == "413" {
					req.Subject = "hooks.test.small"
				}
				reply, err := nc.RequestMsg(req, 5*time.Second)
				if err != nil {
					t.Fatal(err)
				}
				code := reply.Header.Get(hookwire.HeaderServiceErrorCode)
				if code != tc.wantCode {
					t.Fatalf("error code %q (%s), want %q", code, reply.Header.Get(hookwire.HeaderServiceError), tc.wantCode)
				}
				if msg := reply.Header.Get(hookwire.HeaderServiceError); !strings.Contains(msg, tc.wantMsg) {
					t.Errorf("error %q, want it to contain %q", msg, tc.wantMsg)
				}
				if got := reply.Header.Get(hookwire.HeaderRetryAfter); got != tc.wantRetry {
					t.Errorf("Retry-After %q, want %q", got, tc.wantRetry)
				}
				if tc.wantCode != "" {
					if len(reply.Data) != 0 {
						t.Errorf("a failure carries data %q", reply.Data)
					}
					return
				}
				data, ev := replyData(t, mode, reply)
				want := tc.wantData
				if mode == hook.ModePlain {
					want = strings.Replace(want, `"parentuid":"u-1",`, `"parentuid":"",`, 1)
				}
				if diff := cmp.Diff(want, string(data)); diff != "" {
					t.Errorf("data (-want +got):\n%s", diff)
				}
				if ev != nil {
					got := []string{ev.Type(), ev.Subject(), ev.Source(), ev.Extensions()[hookwire.ExtRequestID].(string)}
					want := []string{hookwire.EventType(tc.kind) + ".response", "/ns/p", "nats:hooks.test.sync", "req-1"}
					if diff := cmp.Diff(want, got); diff != "" {
						t.Errorf("answer's type, subject, source, requestid (-want +got):\n%s", diff)
					}
				}
			})
		}
	}
}

// TestServeNATSQueueGroup runs two replicas in one queue group: every
// request is answered, once, and both replicas serve; stopping one leaves
// the other answering everything.
func TestServeNATSQueueGroup(t *testing.T) {
	nc := natsConn(t)
	var mu sync.Mutex
	served := map[string]int{}
	replica := func(name string) hook.Handler {
		return hook.Composite(func(ctx context.Context, req *hook.CompositeRequest) (*hook.CompositeResponse, error) {
			mu.Lock()
			served[name]++
			mu.Unlock()
			return &hook.CompositeResponse{Status: map[string]any{"by": name}}, nil
		})
	}
	serveNATS(t, nc, "hooks.q", replica("a"))
	ctxB, stopB := context.WithCancel(context.Background())
	doneB := make(chan error, 1)
	go func() { doneB <- hook.ServeNATS(ctxB, nc, "hooks.q", "hooks", replica("b")) }()
	call := func() {
		t.Helper()
		if _, err := nc.Request("hooks.q", parentBody(`{}`), 5*time.Second); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		call()
		mu.Lock()
		both := served["a"] > 0 && served["b"] > 0
		mu.Unlock()
		if both {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("replica b never served: %v", served)
		}
	}
	stopB()
	if err := <-doneB; err != nil {
		t.Fatalf("ServeNATS b: %v", err)
	}
	mu.Lock()
	before := served["b"]
	mu.Unlock()
	for range 20 {
		call()
	}
	mu.Lock()
	defer mu.Unlock()
	if served["b"] != before {
		t.Errorf("replica b served %d calls after it stopped", served["b"]-before)
	}
}

// TestServeNATSFinishesInFlight checks that stopping ServeNATS lets a
// call in progress finish and answer.
func TestServeNATSFinishesInFlight(t *testing.T) {
	nc := natsConn(t)
	started, release := make(chan struct{}), make(chan struct{})
	h := hook.Composite(func(ctx context.Context, req *hook.CompositeRequest) (*hook.CompositeResponse, error) {
		close(started)
		<-release
		return &hook.CompositeResponse{Status: map[string]any{"done": true}}, ctx.Err()
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- hook.ServeNATS(ctx, nc, "hooks.slow", "hooks", h) }()
	replies := make(chan *nats.Msg, 1)
	go func() {
		for {
			m, err := nc.Request("hooks.slow", parentBody(`{}`), 5*time.Second)
			if err == nil {
				replies <- m
				return
			}
			select {
			case <-started:
				return
			default:
				time.Sleep(10 * time.Millisecond)
			}
		}
	}()
	<-started
	cancel()
	select {
	case err := <-done:
		t.Fatalf("ServeNATS returned (%v) with a call in progress", err)
	case <-time.After(100 * time.Millisecond):
	}
	close(release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	select {
	case m := <-replies:
		if string(m.Data) != `{"status":{"done":true},"children":null}` || m.Header.Get(hookwire.HeaderServiceErrorCode) != "" {
			t.Errorf("answer %q %v", m.Data, m.Header)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the call in progress was not answered")
	}
}

// TestServeNATSNeedsQueue checks that a subscription without a queue
// group, where every replica would answer every call, is refused.
func TestServeNATSNeedsQueue(t *testing.T) {
	nc := natsConn(t)
	err := hook.ServeNATS(context.Background(), nc, "hooks.x", "", hook.Composite(greet))
	if err == nil || !strings.Contains(err.Error(), "queue group") {
		t.Errorf("err = %v, want one asking for a queue group", err)
	}
}

// TestServeNATSHeadersVerbatim: the CloudEvents NATS binding carries
// attribute values verbatim (no percent-encoding, unlike HTTP's): a request
// written by the CloudEvents sdk's NATS binding reaches the handler with
// its values unchanged, and the answer's request id, read back by that
// binding, is the request's as sent.
func TestServeNATSHeadersVerbatim(t *testing.T) {
	nc := natsConn(t)
	var got *hook.Call
	serveNATS(t, nc, "hooks.test.verbatim", hook.HandlerFunc(func(_ context.Context, call *hook.Call) ([]byte, error) {
		if call.Mode == hook.ModeBinary {
			got = call
		}
		return []byte(`{}`), nil
	}))
	ev := event.New()
	ev.SetID("id 3%41")
	ev.SetType(hookwire.EventType(hook.KindSync))
	ev.SetSource("/apis/c")
	ev.SetSubject(`/ns/"é" 100%`)
	ev.SetExtension(hookwire.ExtParentUID, "50% off")
	if err := ev.SetData(event.ApplicationJSON, json.RawMessage(`{}`)); err != nil {
		t.Fatal(err)
	}
	var payload bytes.Buffer
	h, err := cejs.WriteMsg(binding.WithForceBinary(context.Background()), binding.ToMessage(&ev), &payload)
	if err != nil {
		t.Fatal(err)
	}
	req := &nats.Msg{Subject: "hooks.test.verbatim", Header: h, Data: payload.Bytes()}
	reply, err := nc.RequestMsg(req, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if got == nil {
		t.Fatalf("the handler saw no binary call; answer headers %v", reply.Header)
	}
	if diff := cmp.Diff([]string{"id 3%41", `/ns/"é" 100%`, "50% off"}, []string{got.ID, got.Subject, got.Extensions[hookwire.ExtParentUID]}); diff != "" {
		t.Errorf("id, subject, parentuid as the handler saw them (-sent +got):\n%s", diff)
	}
	answer, err := binding.ToEvent(context.Background(), cejs.NewMessage(reply))
	if err != nil {
		t.Fatalf("the sdk's NATS binding cannot read the answer: %v", err)
	}
	if diff := cmp.Diff([]string{`/ns/"é" 100%`, "id 3%41"}, []string{answer.Subject(), answer.Extensions()[hookwire.ExtRequestID].(string)}); diff != "" {
		t.Errorf("answer's subject and requestid (-want +got):\n%s", diff)
	}
}
