package hooks

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/metabus/metabus/pkg/api/v1alpha1"
)

// syncResponse is a typed hook response, as the services decode it.
type syncResponse struct {
	Status             map[string]any   `json:"status"`
	Children           []map[string]any `json:"children"`
	ResyncAfterSeconds float64          `json:"resyncAfterSeconds,omitempty"`
}

// captured is what a test server saw of one request.
type captured struct {
	Method string
	Header http.Header
	Body   []byte
}

// recorder is a test hook server that records requests. The mutex matters: the race detector
// does not see the happens-before edge through the socket.
type recorder struct {
	mu   sync.Mutex
	reqs []captured
}

func (r *recorder) record(req *http.Request) captured {
	body, _ := io.ReadAll(req.Body)
	c := captured{Method: req.Method, Header: req.Header.Clone(), Body: body}
	r.mu.Lock()
	r.reqs = append(r.reqs, c)
	r.mu.Unlock()
	return c
}

func (r *recorder) last(t *testing.T) captured {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.reqs) == 0 {
		t.Fatal("the hook server received no request")
	}
	return r.reqs[len(r.reqs)-1]
}

func (r *recorder) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.reqs)
}

// serve starts a test hook server that records each request and then runs h.
func serve(t *testing.T, h http.HandlerFunc) (*httptest.Server, *recorder) {
	t.Helper()
	rec := &recorder{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rec.record(r)
		h(w, r)
	}))
	t.Cleanup(srv.Close)
	return srv, rec
}

// replyJSON is a handler replying 200 with a plain JSON body.
func replyJSON(body string) http.HandlerFunc {
	return func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, body)
	}
}

func ptr[T any](v T) *T { return &v }

// hookAt is a v1 hook calling url.
func hookAt(url string) *v1alpha1.Hook {
	return &v1alpha1.Hook{Webhook: &v1alpha1.Webhook{URL: ptr(url)}}
}

func withTimeout(h *v1alpha1.Hook, d time.Duration) *v1alpha1.Hook {
	h.Webhook.Timeout = &metav1.Duration{Duration: d}
	return h
}

// syncCall is a typical sync call of a CompositeController.
func syncCall(h *v1alpha1.Hook) Call {
	return Call{
		Hook:           h,
		Kind:           "sync",
		ControllerType: "CompositeController",
		ControllerName: "demo",
		Source:         "/apis/metacontroller.k8s.io/v1alpha1/compositecontrollers/demo",
		Subject:        "apis/example.com/v1/namespaces/ns/things/a",
		ID:             "uid-1:00000000000000000007",
		Extensions:     map[string]string{"parentuid": "uid-1", "workseq": "00000000000000000007"},
		Request: map[string]any{
			"controller": map[string]any{"kind": "CompositeController"},
			"parent":     map[string]any{"metadata": map[string]any{"name": "a", "namespace": "ns"}},
			"children":   map[string]any{"ConfigMap.v1": map[string]any{}},
			"finalizing": false,
		},
	}
}

// fakeClock is a settable clock.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func newFakeClock() *fakeClock {
	return &fakeClock{t: time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)}
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) Add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// fakeSecrets serves Secrets and ConfigMaps from maps keyed "namespace/name".
type fakeSecrets struct {
	mu         sync.Mutex
	secrets    map[string]map[string][]byte
	configMaps map[string]map[string]string
	reads      int
}

func (f *fakeSecrets) setSecret(ns, name string, data map[string][]byte) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.secrets == nil {
		f.secrets = map[string]map[string][]byte{}
	}
	f.secrets[ns+"/"+name] = data
}

func (f *fakeSecrets) Secret(_ context.Context, ns, name string) (map[string][]byte, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.reads++
	d, ok := f.secrets[ns+"/"+name]
	if !ok {
		return nil, fmt.Errorf("secrets %q not found", name)
	}
	return d, nil
}

func (f *fakeSecrets) ConfigMap(_ context.Context, ns, name string) (map[string]string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.reads++
	d, ok := f.configMaps[ns+"/"+name]
	if !ok {
		return nil, fmt.Errorf("configmaps %q not found", name)
	}
	return d, nil
}

func (f *fakeSecrets) readCount() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.reads
}
