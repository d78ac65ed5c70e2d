package recorder

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/record/util"

	"github.com/metabus/metabus/pkg/events"
	"github.com/metabus/metabus/pkg/kubeapi"
)

// eventServer is an API server for Events: it keeps them by name, answers
// creates and patches (a patch of an Event it lacks is NotFound), and
// records each request as "<method> <path> <content type>".
type eventServer struct {
	mu     sync.Mutex
	events map[string]*corev1.Event
	reqs   []string
	bodies []corev1.Event // of creates
}

func newEventServer(t *testing.T) (*eventServer, *kubeapi.Client) {
	t.Helper()
	s := &eventServer{events: map[string]*corev1.Event{}}
	srv := httptest.NewServer(s)
	t.Cleanup(srv.Close)
	api, err := kubeapi.NewForConfig(&rest.Config{Host: srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	return s, api
}

func (s *eventServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.reqs = append(s.reqs, r.Method+" "+r.URL.Path+" "+r.Header.Get("Content-Type"))
	raw, _ := io.ReadAll(r.Body)
	w.Header().Set("Content-Type", "application/json")
	name := r.URL.Path[strings.LastIndex(r.URL.Path, "/")+1:]
	switch r.Method {
	case http.MethodPost:
		var e corev1.Event
		if err := json.Unmarshal(raw, &e); err != nil {
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		s.bodies = append(s.bodies, e)
		e.ResourceVersion = "1"
		s.events[e.Name] = &e
		w.WriteHeader(http.StatusCreated)
		_ = json.NewEncoder(w).Encode(e)
	case http.MethodPatch:
		e, ok := s.events[name]
		if !ok {
			w.WriteHeader(http.StatusNotFound)
			_ = json.NewEncoder(w).Encode(metav1.Status{TypeMeta: metav1.TypeMeta{Kind: "Status", APIVersion: "v1"},
				Status: metav1.StatusFailure, Reason: metav1.StatusReasonNotFound, Code: http.StatusNotFound})
			return
		}
		var p struct {
			Count int32 `json:"count"`
		}
		_ = json.Unmarshal(raw, &p)
		e.Count = p.Count
		_ = json.NewEncoder(w).Encode(e)
	default:
		w.WriteHeader(http.StatusMethodNotAllowed)
	}
}

func (s *eventServer) requests() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.reqs...)
}

// created is the bodies of the creates so far.
func (s *eventServer) created() []corev1.Event {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]corev1.Event(nil), s.bodies...)
}

// waitRequests waits until the server has n requests.
func (s *eventServer) waitRequests(t *testing.T, n int) []string {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		if r := s.requests(); len(r) >= n || time.Now().After(deadline) {
			return r
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func parent() *unstructured.Unstructured {
	u := &unstructured.Unstructured{}
	u.SetAPIVersion("example.com/v1")
	u.SetKind("Thing")
	u.SetNamespace("ns")
	u.SetName("t")
	u.SetUID("uid-1")
	return u
}

// The recorder writes through the Sink: an Event about the object in its
// namespace, then a patch counting a repeat.
func TestRecorderWritesEvents(t *testing.T) {
	s, api := newEventServer(t)
	r := New(api, Options{Component: "metabus-test"})
	defer r.Shutdown(context.Background())

	r.Warning(parent(), events.ReasonSyncError, "hook failed")
	s.waitRequests(t, 1)
	r.Warning(parent(), events.ReasonSyncError, "hook failed")
	got := s.waitRequests(t, 2)
	created := s.created()
	if len(created) != 1 {
		t.Fatalf("%d Events created, want 1", len(created))
	}
	want := []string{
		"POST /api/v1/namespaces/ns/events application/json",
		"PATCH /api/v1/namespaces/ns/events/" + created[0].Name + " application/strategic-merge-patch+json",
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("requests (-want +got):\n%s", diff)
	}
	e := created[0]
	type event struct {
		APIVersion, Kind, Type, Reason, Message, Component string
		Involved                                           corev1.ObjectReference
	}
	wantEvent := event{APIVersion: "v1", Kind: "Event", Type: corev1.EventTypeWarning, Reason: events.ReasonSyncError, Message: "hook failed", Component: "metabus-test",
		Involved: corev1.ObjectReference{APIVersion: "example.com/v1", Kind: "Thing", Namespace: "ns", Name: "t", UID: "uid-1"}}
	gotEvent := event{APIVersion: e.APIVersion, Kind: e.Kind, Type: e.Type, Reason: e.Reason, Message: e.Message, Component: e.Source.Component, Involved: e.InvolvedObject}
	if diff := cmp.Diff(wantEvent, gotEvent); diff != "" {
		t.Errorf("created Event (-want +got):\n%s", diff)
	}
}

// What the recorder relies on in the Sink's errors: a patch of an Event
// that is gone is recognised as such (the recorder then creates it), and
// an API error is a bare *StatusError (the recorder drops the Event rather
// than retrying it for minutes).
func TestSinkErrors(t *testing.T) {
	_, api := newEventServer(t)
	sink := Sink{API: api}
	_, err := sink.Patch(&corev1.Event{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "gone"}}, []byte(`{"count":2}`))
	if !util.IsKeyNotFoundError(err) {
		t.Errorf("Patch of a missing Event: %v, not a key-not-found error", err)
	}
	if _, ok := err.(*apierrors.StatusError); !ok { // not errors.As: the recorder asserts so
		t.Errorf("Patch error %T, want *apierrors.StatusError unwrapped", err)
	}
}
