package jsbus

import (
	"context"
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/metabus/metabus/internal/testing/natstest"
	"github.com/metabus/metabus/pkg/bus"
	"github.com/metabus/metabus/pkg/snapshot"
)

func testSnapshotRequest() snapshot.Request {
	return snapshot.Request{
		Controller:          bus.ControllerRef{Kind: "CompositeController", Name: "hello.example", UID: "cc-uid"},
		ParentUID:           "parent-uid",
		MinResourceVersions: map[string]string{"example.com/things": "42", "/pods": "17"},
	}
}

// startNATSConn starts an embedded server and returns a connection to it.
func startNATSConn(t *testing.T) *nats.Conn {
	t.Helper()
	nc, _ := natstest.Start(t)
	return nc
}

// serveSnapshots registers a micro service on bus.SnapshotSubject like the watcher's.
func serveSnapshots(t *testing.T, nc *nats.Conn, h func(micro.Request)) {
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

func TestSnapshotClientRoundTrip(t *testing.T) {
	nc := startNATSConn(t)
	got := make(chan snapshot.Request, 1)
	serveSnapshots(t, nc, func(r micro.Request) {
		var req snapshot.Request
		if err := json.Unmarshal(r.Data(), &req); err != nil {
			_ = r.Error("400", err.Error(), nil)
			return
		}
		got <- req
		resp := snapshot.Response{
			Result:          snapshot.OK,
			ParentResource:  "things",
			ParentHasStatus: true,
			Parent: &unstructured.Unstructured{Object: map[string]any{
				"apiVersion": "example.com/v1", "kind": "Thing",
				"metadata": map[string]any{"name": "p", "namespace": "ns", "uid": req.ParentUID},
			}},
			Children: []snapshot.Group{{
				APIVersion: "v1", Resource: "pods", Kind: "Pod", Namespaced: true,
				Objects: []*unstructured.Unstructured{{Object: map[string]any{
					"apiVersion": "v1", "kind": "Pod", "metadata": map[string]any{"name": "c1", "namespace": "ns"},
				}}},
			}},
		}
		data, _ := json.Marshal(resp)
		_ = r.Respond(data)
	})

	req := testSnapshotRequest()
	resp, err := SnapshotClient{NC: nc, Timeout: 5 * time.Second}.Snapshot(context.Background(), req)
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
	if resp.Result != snapshot.OK || resp.ParentResource != "things" || !resp.ParentHasStatus {
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

func TestSnapshotClientErrors(t *testing.T) {
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
				serveSnapshots(t, nc, func(r micro.Request) { _ = r.Error("400", "malformed snapshot request: x", nil) })
			},
			timeout: 5 * time.Second,
			want:    []string{"snapshot service error 400: malformed snapshot request: x"},
		},
		{
			reason: "a body that is not a snapshot.Response",
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
			nc := startNATSConn(t)
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
			resp, err := SnapshotClient{NC: nc, Timeout: tc.timeout}.Snapshot(ctx, testSnapshotRequest())
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

// snapshot.Fetch over the NATS client: a service that is still catching up answers
// snapshot.Retry, then snapshot.OK.
func TestSnapshotFetchOverClient(t *testing.T) {
	nc := startNATSConn(t)
	var mu sync.Mutex
	n := 0
	serveSnapshots(t, nc, func(r micro.Request) {
		mu.Lock()
		n++
		res := snapshot.Retry
		if n >= 3 {
			res = snapshot.OK
		}
		mu.Unlock()
		data, _ := json.Marshal(snapshot.Response{Result: res})
		_ = r.Respond(data)
	})
	resp, err := snapshot.Fetch(context.Background(), SnapshotClient{NC: nc, Timeout: 5 * time.Second}, testSnapshotRequest(), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if resp.Result != snapshot.OK || n != 3 {
		t.Fatalf("snapshot.Fetch = %+v after %d requests, want ok after 3", resp, n)
	}
}

func TestSnapshotRequestJSON(t *testing.T) {
	// The wire shape is a contract between watcher and dispatcher/applier
	// replicas of different versions.
	data, err := json.Marshal(snapshot.Request{Controller: bus.ControllerRef{Kind: "CompositeController", Name: "c"}, ParentUID: "u"})
	if err != nil {
		t.Fatal(err)
	}
	want := `{"controller":{"kind":"CompositeController","name":"c"},"parentUID":"u"}`
	if string(data) != want {
		t.Errorf("request JSON = %s, want %s", data, want)
	}
	data, err = json.Marshal(snapshot.Response{Result: snapshot.NotFound, Message: "gone"})
	if err != nil {
		t.Fatal(err)
	}
	if want := `{"result":"notFound","message":"gone"}`; string(data) != want {
		t.Errorf("response JSON = %s, want %s", data, want)
	}
}
