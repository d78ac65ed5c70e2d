package applier

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/google/go-cmp/cmp"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/rest"
)

// TestRawClient: the raw client sends what the dynamic client would (method,
// path, JSON body), reads back only the resourceVersion, and turns the API
// server's Status answers into the same typed errors.
func TestRawClient(t *testing.T) {
	type request struct {
		Method, Path string
		Body         map[string]any
	}
	var got []request
	answer := func(w http.ResponseWriter, code int, v any) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(code)
		_ = json.NewEncoder(w).Encode(v)
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		data, _ := io.ReadAll(r.Body)
		var body map[string]any
		_ = json.Unmarshal(data, &body)
		got = append(got, request{Method: r.Method, Path: r.URL.Path, Body: body})
		name, _, _ := unstructured.NestedString(body, "metadata", "name")
		switch name {
		case "taken":
			answer(w, http.StatusConflict, metav1.Status{TypeMeta: metav1.TypeMeta{Kind: "Status", APIVersion: "v1"},
				Status: metav1.StatusFailure, Reason: metav1.StatusReasonAlreadyExists, Code: http.StatusConflict})
		case "forbidden":
			answer(w, http.StatusForbidden, metav1.Status{TypeMeta: metav1.TypeMeta{Kind: "Status", APIVersion: "v1"},
				Status: metav1.StatusFailure, Reason: metav1.StatusReasonForbidden, Code: http.StatusForbidden})
		case "stale":
			answer(w, http.StatusConflict, metav1.Status{TypeMeta: metav1.TypeMeta{Kind: "Status", APIVersion: "v1"},
				Status: metav1.StatusFailure, Reason: metav1.StatusReasonConflict, Code: http.StatusConflict})
		default:
			body["metadata"].(map[string]any)["resourceVersion"] = "43"
			body["metadata"].(map[string]any)["uid"] = "u-" + name
			answer(w, http.StatusOK, body)
		}
	}))
	defer srv.Close()
	rc, err := newRawClient(&rest.Config{Host: srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	obj := func(name, ns string) *unstructured.Unstructured {
		o := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "v1", "kind": "ConfigMap",
			"metadata": map[string]any{"name": name, "namespace": ns, "resourceVersion": "42"}}}
		return o
	}
	cms := schema.GroupVersionResource{Version: "v1", Resource: "configmaps"}
	things := schema.GroupVersionResource{Group: "example.com", Version: "v1", Resource: "things"}
	ctx := context.Background()
	for _, tc := range []struct {
		reason  string
		do      func() (string, error)
		want    request
		wantRV  string
		wantErr func(error) bool
	}{
		{
			reason: "a namespaced core create posts to the collection and reads back the new object's UID and resourceVersion",
			do: func() (string, error) {
				w, err := rc.create(ctx, cms, "ns", obj("a", "ns"))
				return w.UID + "@" + w.ResourceVersion, err
			},
			want:   request{Method: "POST", Path: "/api/v1/namespaces/ns/configmaps"},
			wantRV: "u-a@43",
		},
		{
			reason: "a create of a taken name is AlreadyExists",
			do: func() (string, error) {
				_, err := rc.create(ctx, cms, "ns", obj("taken", "ns"))
				return "", err
			},
			want:    request{Method: "POST", Path: "/api/v1/namespaces/ns/configmaps"},
			wantErr: apierrors.IsAlreadyExists,
		},
		{
			reason: "a create RBAC refuses is Forbidden (what becomes an ApplyForbidden Event)",
			do: func() (string, error) {
				_, err := rc.create(ctx, cms, "ns", obj("forbidden", "ns"))
				return "", err
			},
			want:    request{Method: "POST", Path: "/api/v1/namespaces/ns/configmaps"},
			wantErr: apierrors.IsForbidden,
		},
		{
			reason: "an update RBAC refuses is Forbidden",
			do: func() (string, error) {
				return rc.update(ctx, cms, obj("forbidden", "ns"), "")
			},
			want:    request{Method: "PUT", Path: "/api/v1/namespaces/ns/configmaps/forbidden"},
			wantErr: apierrors.IsForbidden,
		},
		{
			reason: "an update puts to the object and reads back its resourceVersion",
			do:     func() (string, error) { return rc.update(ctx, cms, obj("a", "ns"), "") },
			want:   request{Method: "PUT", Path: "/api/v1/namespaces/ns/configmaps/a"},
			wantRV: "43",
		},
		{
			reason: "a status update of a cluster-scoped custom resource goes to /status",
			do:     func() (string, error) { return rc.update(ctx, things, obj("a", ""), "status") },
			want:   request{Method: "PUT", Path: "/apis/example.com/v1/things/a/status"},
			wantRV: "43",
		},
		{
			reason:  "a stale update is a Conflict",
			do:      func() (string, error) { return rc.update(ctx, cms, obj("stale", "ns"), "") },
			want:    request{Method: "PUT", Path: "/api/v1/namespaces/ns/configmaps/stale"},
			wantErr: apierrors.IsConflict,
		},
	} {
		t.Run(tc.reason, func(t *testing.T) {
			got = nil
			rv, err := tc.do()
			if tc.wantErr != nil {
				if !tc.wantErr(err) {
					t.Fatalf("error %v is not the expected kind", err)
				}
			} else if err != nil {
				t.Fatal(err)
			}
			if rv != tc.wantRV {
				t.Errorf("resourceVersion %q, want %q", rv, tc.wantRV)
			}
			if len(got) != 1 {
				t.Fatalf("%d requests, want 1", len(got))
			}
			if diff := cmp.Diff(tc.want, request{Method: got[0].Method, Path: got[0].Path}); diff != "" {
				t.Errorf("request (-want +got):\n%s", diff)
			}
			if name, _, _ := unstructured.NestedString(got[0].Body, "metadata", "name"); name == "" {
				t.Errorf("the body carries no object: %v", got[0].Body)
			}
		})
	}
}

// TestWithResourceVersion: the stand-in for a write's answer has the new
// resourceVersion and leaves the written object as it was.
func TestWithResourceVersion(t *testing.T) {
	in := &unstructured.Unstructured{Object: map[string]any{"metadata": map[string]any{"name": "a", "uid": "u", "resourceVersion": "1"}, "data": map[string]any{"k": "v"}}}
	out := withResourceVersion(withStatus(in, map[string]any{"ready": true}), "2")
	if out.GetResourceVersion() != "2" || out.GetUID() != "u" || out.Object["status"] == nil {
		t.Errorf("answer %v", out.Object)
	}
	if in.GetResourceVersion() != "1" || in.Object["status"] != nil {
		t.Errorf("the written object changed: %v", in.Object)
	}
}
