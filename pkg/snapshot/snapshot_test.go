package snapshot

import (
	"context"
	"encoding/json"
	"errors"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/metabus/metabus/pkg/bus"
	"github.com/metabus/metabus/pkg/natsx/natstest"
)

// fakeSource answers with a scripted sequence of results; the last one
// repeats. It records every call.
type fakeSource struct {
	mu     sync.Mutex
	script []step
	calls  []time.Time
	reqs   []Request
	// onCall runs after each call is recorded (outside the lock).
	onCall func(n int)
}

type step struct {
	result string
	err    error
}

func (f *fakeSource) Snapshot(_ context.Context, req Request) (*Response, error) {
	f.mu.Lock()
	f.calls = append(f.calls, time.Now())
	f.reqs = append(f.reqs, req)
	n := len(f.calls)
	s := f.script[min(n-1, len(f.script)-1)]
	onCall := f.onCall
	f.mu.Unlock()
	if onCall != nil {
		onCall(n)
	}
	if s.err != nil {
		return nil, s.err
	}
	// Message tells responses apart.
	return &Response{Result: s.result, Message: "call " + strconv.Itoa(n)}, nil
}

func (f *fakeSource) count() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.calls)
}

func testRequest() Request {
	return Request{
		Controller:          bus.ControllerRef{Kind: "CompositeController", Name: "hello.example", UID: "cc-uid"},
		ParentUID:           "parent-uid",
		MinResourceVersions: map[string]string{"example.com/things": "42", "/pods": "17"},
	}
}

func TestFetch(t *testing.T) {
	errBoom := errors.New("boom")
	cases := []struct {
		reason     string
		script     []step
		wait       time.Duration
		wantResult string
		wantErr    error
		wantCalls  int // 0: at least 2
		// minElapsed is a lower bound on how long Fetch takes.
		minElapsed time.Duration
	}{
		{reason: "OK at once: one call", script: []step{{result: OK}}, wait: 5 * time.Second, wantResult: OK, wantCalls: 1},
		{reason: "Retry twice, then OK", script: []step{{result: Retry}, {result: Retry}, {result: OK}}, wait: 5 * time.Second, wantResult: OK, wantCalls: 3, minElapsed: 60 * time.Millisecond},
		{reason: "NotFound is final", script: []step{{result: NotFound}}, wait: 5 * time.Second, wantResult: NotFound, wantCalls: 1},
		{reason: "ControllerGone is final", script: []step{{result: ControllerGone}}, wait: 5 * time.Second, wantResult: ControllerGone, wantCalls: 1},
		{reason: "Invalid is final", script: []step{{result: Retry}, {result: Invalid}}, wait: 5 * time.Second, wantResult: Invalid, wantCalls: 2},
		{reason: "an unknown result is not retried", script: []step{{result: "weird"}}, wait: 5 * time.Second, wantResult: "weird", wantCalls: 1},
		{reason: "Retry until the wait expires returns the Retry", script: []step{{result: Retry}}, wait: 150 * time.Millisecond, wantResult: Retry, minElapsed: 150 * time.Millisecond},
		{reason: "no wait: a Retry is returned at once", script: []step{{result: Retry}}, wait: 0, wantResult: Retry, wantCalls: 1},
		{reason: "an error is returned at once", script: []step{{err: errBoom}}, wait: 5 * time.Second, wantErr: errBoom, wantCalls: 1},
		{reason: "an error after Retries is returned", script: []step{{result: Retry}, {err: errBoom}}, wait: 5 * time.Second, wantErr: errBoom, wantCalls: 2},
	}
	for _, tc := range cases {
		t.Run(tc.reason, func(t *testing.T) {
			src := &fakeSource{script: tc.script}
			req := testRequest()
			begin := time.Now()
			resp, err := Fetch(context.Background(), src, req, tc.wait)
			elapsed := time.Since(begin)
			if tc.wantErr != nil {
				if !errors.Is(err, tc.wantErr) || resp != nil {
					t.Fatalf("%s: Fetch = %+v, %v; want nil, %v", tc.reason, resp, err, tc.wantErr)
				}
			} else {
				if err != nil {
					t.Fatalf("%s: Fetch: %v", tc.reason, err)
				}
				if resp.Result != tc.wantResult {
					t.Fatalf("%s: result %q, want %q", tc.reason, resp.Result, tc.wantResult)
				}
			}
			n := src.count()
			if tc.wantCalls > 0 && n != tc.wantCalls {
				t.Errorf("%s: %d calls, want %d", tc.reason, n, tc.wantCalls)
			}
			if tc.wantCalls == 0 && n < 2 {
				t.Errorf("%s: %d calls, want several", tc.reason, n)
			}
			if resp != nil && resp.Message != "call "+strconv.Itoa(n) {
				t.Errorf("%s: returned %q, want the last answer (call %d)", tc.reason, resp.Message, n)
			}
			if elapsed < tc.minElapsed {
				t.Errorf("%s: took %s, want at least %s", tc.reason, elapsed, tc.minElapsed)
			}
			// Generous: the longest single back-off is 640ms.
			if elapsed > tc.wait+2*time.Second {
				t.Errorf("%s: took %s with wait %s", tc.reason, elapsed, tc.wait)
			}
			for i, r := range src.reqs {
				if !reflect.DeepEqual(r, req) {
					t.Errorf("%s: call %d got request %+v, want %+v", tc.reason, i+1, r, req)
				}
			}
		})
	}
}

func TestFetchBacksOff(t *testing.T) {
	src := &fakeSource{script: []step{{result: Retry}, {result: Retry}, {result: Retry}, {result: Retry}, {result: Retry}, {result: OK}}}
	resp, err := Fetch(context.Background(), src, testRequest(), 10*time.Second)
	if err != nil || resp.Result != OK {
		t.Fatalf("Fetch = %+v, %v", resp, err)
	}
	if len(src.calls) != 6 {
		t.Fatalf("%d calls, want 6", len(src.calls))
	}
	// Delays double from 20ms: timers never fire early, so each gap is at
	// least its nominal delay.
	want := 20 * time.Millisecond
	for i := 1; i < len(src.calls); i++ {
		if gap := src.calls[i].Sub(src.calls[i-1]); gap < want {
			t.Errorf("gap before call %d = %s, want >= %s", i+1, gap, want)
		}
		want *= 2
	}
}

// Fetch documents that it waits "for at most wait in total"; its back-off
// sleeps are not clipped to the deadline.
func TestFetchRespectsWait(t *testing.T) {
	src := &fakeSource{script: []step{{result: Retry}}}
	const wait = 150 * time.Millisecond
	begin := time.Now()
	resp, err := Fetch(context.Background(), src, testRequest(), wait)
	elapsed := time.Since(begin)
	if err != nil || resp.Result != Retry {
		t.Fatalf("Fetch = %+v, %v", resp, err)
	}
	if elapsed > wait+100*time.Millisecond {
		t.Errorf("Fetch took %s with wait %s (%d attempts)", elapsed, wait, src.count())
	}
}

func TestFetchContextCancelled(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	src := &fakeSource{script: []step{{result: Retry}}}
	src.onCall = func(n int) {
		if n == 2 {
			cancel()
		}
	}
	begin := time.Now()
	resp, err := Fetch(ctx, src, testRequest(), 30*time.Second)
	if !errors.Is(err, context.Canceled) || resp != nil {
		t.Fatalf("Fetch = %+v, %v; want nil, context.Canceled", resp, err)
	}
	if n := src.count(); n != 2 {
		t.Errorf("%d calls, want 2 (no call after cancel)", n)
	}
	if d := time.Since(begin); d > 2*time.Second {
		t.Errorf("Fetch took %s to notice the cancel", d)
	}
}

// startNATS starts an embedded server and returns a connection to it.
func startNATS(t *testing.T) *nats.Conn {
	t.Helper()
	nc, _ := natstest.Start(t)
	return nc
}

// serve registers a micro service on bus.SnapshotSubject like the watcher's.
func serve(t *testing.T, nc *nats.Conn, h func(micro.Request)) {
	t.Helper()
	svc, err := micro.AddService(nc, micro.Config{
		Name:       bus.SnapshotServiceName,
		Version:    "0.0.1",
		QueueGroup: bus.SnapshotQueue,
		Endpoint:   &micro.EndpointConfig{Subject: bus.SnapshotSubject, Handler: micro.HandlerFunc(h)},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = svc.Stop() })
}

func TestClientRoundTrip(t *testing.T) {
	nc := startNATS(t)
	got := make(chan Request, 1)
	serve(t, nc, func(r micro.Request) {
		var req Request
		if err := json.Unmarshal(r.Data(), &req); err != nil {
			_ = r.Error("400", err.Error(), nil)
			return
		}
		got <- req
		resp := Response{
			Result:          OK,
			ParentResource:  "things",
			ParentHasStatus: true,
			Parent: &unstructured.Unstructured{Object: map[string]any{
				"apiVersion": "example.com/v1", "kind": "Thing",
				"metadata": map[string]any{"name": "p", "namespace": "ns", "uid": req.ParentUID},
			}},
			Children: []Group{{
				APIVersion: "v1", Resource: "pods", Kind: "Pod", Namespaced: true,
				Objects: []*unstructured.Unstructured{{Object: map[string]any{
					"apiVersion": "v1", "kind": "Pod", "metadata": map[string]any{"name": "c1", "namespace": "ns"},
				}}},
			}},
		}
		data, _ := json.Marshal(resp)
		_ = r.Respond(data)
	})

	req := testRequest()
	resp, err := Client{NC: nc, Timeout: 5 * time.Second}.Snapshot(context.Background(), req)
	if err != nil {
		t.Fatalf("Snapshot: %v", err)
	}
	select {
	case r := <-got:
		if !reflect.DeepEqual(r, req) {
			t.Errorf("service received %+v, want %+v", r, req)
		}
	default:
		t.Fatal("service received nothing")
	}
	if resp.Result != OK || resp.ParentResource != "things" || !resp.ParentHasStatus {
		t.Errorf("response = %+v", resp)
	}
	if resp.Parent == nil || resp.Parent.GetUID() != "parent-uid" || resp.Parent.GetKind() != "Thing" {
		t.Errorf("parent = %+v", resp.Parent)
	}
	if len(resp.Children) != 1 || resp.Children[0].Kind != "Pod" || !resp.Children[0].Namespaced ||
		len(resp.Children[0].Objects) != 1 || resp.Children[0].Objects[0].GetName() != "c1" {
		t.Errorf("children = %+v", resp.Children)
	}
}

func TestClientErrors(t *testing.T) {
	cases := []struct {
		reason string
		// responder answers on bus.SnapshotSubject; nil: nobody listens.
		responder func(t *testing.T, nc *nats.Conn)
		timeout   time.Duration
		ctxWait   time.Duration // 0: no deadline on the caller's ctx
		want      []string
		wantIs    error
	}{
		{
			reason:  "no responders: say the watcher is not running",
			timeout: 5 * time.Second,
			want:    []string{"no snapshot service is running", "is the watcher up?"},
			wantIs:  nats.ErrNoResponders,
		},
		{
			reason: "a service error is reported with its code and description",
			responder: func(t *testing.T, nc *nats.Conn) {
				serve(t, nc, func(r micro.Request) { _ = r.Error("400", "malformed snapshot request: x", nil) })
			},
			timeout: 5 * time.Second,
			want:    []string{"snapshot service error 400: malformed snapshot request: x"},
		},
		{
			reason: "a body that is not a Response",
			responder: func(t *testing.T, nc *nats.Conn) {
				sub, err := nc.Subscribe(bus.SnapshotSubject, func(m *nats.Msg) { _ = m.Respond([]byte("not json")) })
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { _ = sub.Unsubscribe() })
			},
			timeout: 5 * time.Second,
			want:    []string{"decode snapshot response"},
		},
		{
			reason: "a service that never answers times out after Client.Timeout, naming the controller and parent",
			responder: func(t *testing.T, nc *nats.Conn) {
				sub, err := nc.Subscribe(bus.SnapshotSubject, func(*nats.Msg) {})
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { _ = sub.Unsubscribe() })
			},
			timeout: 200 * time.Millisecond,
			want:    []string{"snapshot request for cc-hello_example/parent-uid"},
			wantIs:  context.DeadlineExceeded,
		},
		{
			reason: "the caller's deadline applies with the default timeout",
			responder: func(t *testing.T, nc *nats.Conn) {
				sub, err := nc.Subscribe(bus.SnapshotSubject, func(*nats.Msg) {})
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { _ = sub.Unsubscribe() })
			},
			timeout: 0,
			ctxWait: 200 * time.Millisecond,
			want:    []string{"snapshot request for cc-hello_example/parent-uid"},
			wantIs:  context.DeadlineExceeded,
		},
	}
	for _, tc := range cases {
		t.Run(tc.reason, func(t *testing.T) {
			nc := startNATS(t)
			if tc.responder != nil {
				tc.responder(t, nc)
				if err := nc.Flush(); err != nil {
					t.Fatal(err)
				}
			}
			ctx := context.Background()
			if tc.ctxWait > 0 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, tc.ctxWait)
				defer cancel()
			}
			begin := time.Now()
			resp, err := Client{NC: nc, Timeout: tc.timeout}.Snapshot(ctx, testRequest())
			if err == nil {
				t.Fatalf("%s: Snapshot = %+v, want error", tc.reason, resp)
			}
			if resp != nil {
				t.Errorf("%s: response %+v with error", tc.reason, resp)
			}
			for _, s := range tc.want {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("%s: error %q lacks %q", tc.reason, err, s)
				}
			}
			if tc.wantIs != nil && !errors.Is(err, tc.wantIs) {
				t.Errorf("%s: error %q does not wrap %v", tc.reason, err, tc.wantIs)
			}
			if d := time.Since(begin); d > 3*time.Second {
				t.Errorf("%s: took %s", tc.reason, d)
			}
		})
	}
}

// Fetch over the NATS client: a service that is still catching up answers
// Retry, then OK.
func TestFetchOverClient(t *testing.T) {
	nc := startNATS(t)
	var mu sync.Mutex
	n := 0
	serve(t, nc, func(r micro.Request) {
		mu.Lock()
		n++
		res := Retry
		if n >= 3 {
			res = OK
		}
		mu.Unlock()
		data, _ := json.Marshal(Response{Result: res})
		_ = r.Respond(data)
	})
	resp, err := Fetch(context.Background(), Client{NC: nc, Timeout: 5 * time.Second}, testRequest(), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if resp.Result != OK || n != 3 {
		t.Fatalf("Fetch = %+v after %d requests, want ok after 3", resp, n)
	}
}

func TestRequestJSON(t *testing.T) {
	// The wire shape is a contract between watcher and dispatcher/applier
	// replicas of different versions.
	data, err := json.Marshal(Request{Controller: bus.ControllerRef{Kind: "CompositeController", Name: "c"}, ParentUID: "u"})
	if err != nil {
		t.Fatal(err)
	}
	want := `{"controller":{"kind":"CompositeController","name":"c"},"parentUID":"u"}`
	if string(data) != want {
		t.Errorf("request JSON = %s, want %s", data, want)
	}
	data, err = json.Marshal(Response{Result: NotFound, Message: "gone"})
	if err != nil {
		t.Fatal(err)
	}
	if want := `{"result":"notFound","message":"gone"}`; string(data) != want {
		t.Errorf("response JSON = %s, want %s", data, want)
	}
}
