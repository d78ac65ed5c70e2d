package kubeapi

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
)

func TestPath(t *testing.T) {
	tests := []struct {
		reason                       string
		gvr                          schema.GroupVersionResource
		namespace, name, subresource string
		want                         []string
	}{
		{reason: "core collection, cluster-scoped", gvr: schema.GroupVersionResource{Version: "v1", Resource: "namespaces"}, want: []string{"/api", "v1", "namespaces"}},
		{reason: "core object in a namespace", gvr: schema.GroupVersionResource{Version: "v1", Resource: "secrets"}, namespace: "ns", name: "s", want: []string{"/api", "v1", "namespaces", "ns", "secrets", "s"}},
		{reason: "named group, subresource", gvr: schema.GroupVersionResource{Group: "apps", Version: "v1", Resource: "deployments"}, namespace: "ns", name: "d", subresource: "status", want: []string{"/apis", "apps", "v1", "namespaces", "ns", "deployments", "d", "status"}},
	}
	for _, tt := range tests {
		t.Run(tt.reason, func(t *testing.T) {
			if diff := cmp.Diff(tt.want, Path(tt.gvr, tt.namespace, tt.name, tt.subresource)); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}

// request is what the fake API server received.
type request struct {
	Method, Path, ContentType string
	Body                      map[string]any
}

// fakeServer records requests and answers each with code and body.
func fakeServer(t *testing.T, code int, body any) (*Client, *[]request) {
	t.Helper()
	var got []request
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		req := request{Method: r.Method, Path: r.URL.Path, ContentType: r.Header.Get("Content-Type")}
		if raw, _ := io.ReadAll(r.Body); len(raw) > 0 {
			if err := json.Unmarshal(raw, &req.Body); err != nil {
				t.Errorf("request body is not JSON: %v", err)
			}
		}
		got = append(got, req)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(code)
		_ = json.NewEncoder(w).Encode(body)
	}))
	t.Cleanup(srv.Close)
	c, err := NewForConfig(&rest.Config{Host: srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	return c, &got
}

func TestRequests(t *testing.T) {
	cm := &corev1.ConfigMap{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "ConfigMap"},
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "c", ResourceVersion: "7"}, Data: map[string]string{"k": "v"}}
	sent := map[string]any{"apiVersion": "v1", "kind": "ConfigMap",
		"metadata": map[string]any{"namespace": "ns", "name": "c", "resourceVersion": "7"}, "data": map[string]any{"k": "v"}}
	at := Path(schema.GroupVersionResource{Version: "v1", Resource: "configmaps"}, "ns", "c", "")
	tests := []struct {
		reason string
		call   func(*Client, *corev1.ConfigMap) error
		want   request
	}{
		{
			reason: "get",
			call:   func(c *Client, out *corev1.ConfigMap) error { return c.Get(context.Background(), out, at...) },
			want:   request{Method: "GET", Path: "/api/v1/namespaces/ns/configmaps/c"},
		},
		{
			reason: "create posts JSON to the collection",
			call: func(c *Client, out *corev1.ConfigMap) error {
				return c.Create(context.Background(), at[:len(at)-1], cm, out)
			},
			want: request{Method: "POST", Path: "/api/v1/namespaces/ns/configmaps", ContentType: "application/json", Body: sent},
		},
		{
			reason: "update puts JSON with the resourceVersion",
			call:   func(c *Client, out *corev1.ConfigMap) error { return c.Update(context.Background(), at, cm, out) },
			want:   request{Method: "PUT", Path: "/api/v1/namespaces/ns/configmaps/c", ContentType: "application/json", Body: sent},
		},
		{
			reason: "patch sends the patch with its type",
			call: func(c *Client, out *corev1.ConfigMap) error {
				return c.Patch(context.Background(), at, types.StrategicMergePatchType, []byte(`{"data":{"k":"w"}}`), out)
			},
			want: request{Method: "PATCH", Path: "/api/v1/namespaces/ns/configmaps/c", ContentType: "application/strategic-merge-patch+json",
				Body: map[string]any{"data": map[string]any{"k": "w"}}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.reason, func(t *testing.T) {
			c, got := fakeServer(t, http.StatusOK, cm)
			out := &corev1.ConfigMap{}
			if err := tt.call(c, out); err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff([]request{tt.want}, *got); diff != "" {
				t.Errorf("request (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(cm, out); diff != "" {
				t.Errorf("decoded answer (-want +got):\n%s", diff)
			}
		})
	}
}

// Errors are the API server's Status, as a bare *StatusError: the event
// recorder tells errors apart by type assertions.
func TestErrors(t *testing.T) {
	status := func(code int32, reason metav1.StatusReason, causes ...metav1.StatusCause) metav1.Status {
		return metav1.Status{TypeMeta: metav1.TypeMeta{Kind: "Status", APIVersion: "v1"}, Status: metav1.StatusFailure,
			Code: code, Reason: reason, Message: "no", Details: &metav1.StatusDetails{Causes: causes}}
	}
	terminating := metav1.StatusCause{Type: corev1.NamespaceTerminatingCause, Message: "terminating"}
	type result struct {
		StatusError   bool // err.(*apierrors.StatusError), unwrapped
		Reason        metav1.StatusReason
		HasTerminated bool
	}
	tests := []struct {
		reason string
		code   int
		status metav1.Status
		want   result
	}{
		{reason: "not found", code: 404, status: status(404, metav1.StatusReasonNotFound), want: result{StatusError: true, Reason: metav1.StatusReasonNotFound}},
		{reason: "conflict", code: 409, status: status(409, metav1.StatusReasonConflict), want: result{StatusError: true, Reason: metav1.StatusReasonConflict}},
		{reason: "forbidden, causes kept", code: 403, status: status(403, metav1.StatusReasonForbidden, terminating),
			want: result{StatusError: true, Reason: metav1.StatusReasonForbidden, HasTerminated: true}},
	}
	for _, tt := range tests {
		t.Run(tt.reason, func(t *testing.T) {
			c, _ := fakeServer(t, tt.code, tt.status)
			err := c.Get(context.Background(), &corev1.ConfigMap{}, "/api/v1/namespaces/ns/configmaps/c")
			_, isStatus := err.(*apierrors.StatusError) // not errors.As: the recorder asserts so
			got := result{StatusError: isStatus, Reason: apierrors.ReasonForError(err), HasTerminated: apierrors.HasStatusCause(err, corev1.NamespaceTerminatingCause)}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("(-want +got):\n%s\nerr: %v", diff, err)
			}
		})
	}
}
