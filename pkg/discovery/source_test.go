package discovery

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	apidiscoveryv2 "k8s.io/api/apidiscovery/v2"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/rest"

	"github.com/metabus/metabus/pkg/kubeapi"
)

// fakeAPIServer answers discovery requests from docs (path to body), with
// the aggregated media type for the paths in aggregatedPaths, a Status
// with the code in codes for others.
type fakeAPIServer struct {
	docs            map[string]any
	aggregatedPaths []string
	codes           map[string]int
}

func (f fakeAPIServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if code, ok := f.codes[r.URL.Path]; ok {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(code)
		_ = json.NewEncoder(w).Encode(metav1.Status{TypeMeta: metav1.TypeMeta{Kind: "Status", APIVersion: "v1"},
			Status: metav1.StatusFailure, Code: int32(code), Message: "broken " + r.URL.Path})
		return
	}
	doc, ok := f.docs[r.URL.Path]
	if !ok {
		http.NotFound(w, r)
		return
	}
	if slices.Contains(f.aggregatedPaths, r.URL.Path) && strings.Contains(r.Header.Get("Accept"), "as=APIGroupDiscoveryList") {
		w.Header().Set("Content-Type", acceptAggregated)
	} else {
		w.Header().Set("Content-Type", "application/json")
	}
	_ = json.NewEncoder(w).Encode(doc)
}

func fakeSource(t *testing.T, f fakeAPIServer) APIServer {
	t.Helper()
	srv := httptest.NewServer(f)
	t.Cleanup(srv.Close)
	api, err := kubeapi.NewForConfig(&rest.Config{Host: srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	return APIServer{API: api}
}

// plainDocs is an API server without aggregated discovery: the core group,
// example.com/v1 and v2, and metrics.k8s.io/v1beta1.
func plainDocs() map[string]any {
	return map[string]any{
		"/api": metav1.APIVersions{Versions: []string{"v1"}},
		"/apis": metav1.APIGroupList{Groups: []metav1.APIGroup{
			{Name: "example.com", Versions: []metav1.GroupVersionForDiscovery{{GroupVersion: "example.com/v1", Version: "v1"}, {GroupVersion: "example.com/v2", Version: "v2"}}},
			{Name: "metrics.k8s.io", Versions: []metav1.GroupVersionForDiscovery{{GroupVersion: "metrics.k8s.io/v1beta1", Version: "v1beta1"}}},
		}},
		"/api/v1": metav1.APIResourceList{GroupVersion: "v1", APIResources: []metav1.APIResource{
			{Name: "pods", Kind: "Pod", Namespaced: true, Verbs: []string{"get"}},
			{Name: "pods/status", Kind: "Pod", Namespaced: true, Verbs: []string{"get"}},
		}},
		// An old API server without the group version in the list.
		"/apis/example.com/v1":         metav1.APIResourceList{APIResources: []metav1.APIResource{{Name: "things", Kind: "Thing", Namespaced: true}}},
		"/apis/example.com/v2":         metav1.APIResourceList{GroupVersion: "example.com/v2", APIResources: []metav1.APIResource{{Name: "things", Kind: "Thing", Namespaced: true}}},
		"/apis/metrics.k8s.io/v1beta1": metav1.APIResourceList{GroupVersion: "metrics.k8s.io/v1beta1", APIResources: []metav1.APIResource{{Name: "pods", Kind: "PodMetrics", Namespaced: true}}},
	}
}

// aggregatedDocs is an API server with aggregated discovery: the same
// resources, metrics.k8s.io stale.
func aggregatedDocs() map[string]any {
	kind := func(g, v, k string) *metav1.GroupVersionKind {
		return &metav1.GroupVersionKind{Group: g, Version: v, Kind: k}
	}
	things := func(v string) apidiscoveryv2.APIVersionDiscovery {
		return apidiscoveryv2.APIVersionDiscovery{Version: v, Resources: []apidiscoveryv2.APIResourceDiscovery{
			{Resource: "things", ResponseKind: kind("example.com", v, "Thing"), Scope: apidiscoveryv2.ScopeNamespace},
		}}
	}
	return map[string]any{
		"/api": apidiscoveryv2.APIGroupDiscoveryList{Items: []apidiscoveryv2.APIGroupDiscovery{{
			Versions: []apidiscoveryv2.APIVersionDiscovery{{Version: "v1", Resources: []apidiscoveryv2.APIResourceDiscovery{
				{Resource: "pods", ResponseKind: kind("", "v1", "Pod"), Scope: apidiscoveryv2.ScopeNamespace, Verbs: []string{"get"},
					Subresources: []apidiscoveryv2.APISubresourceDiscovery{
						{Subresource: "status", ResponseKind: kind("", "v1", "Pod"), Verbs: []string{"get"}},
						{Subresource: "nokind"}, // left out, as client-go does
					}},
				{Resource: "kindless", Scope: apidiscoveryv2.ScopeCluster}, // left out
			}}},
		}}},
		"/apis": apidiscoveryv2.APIGroupDiscoveryList{Items: []apidiscoveryv2.APIGroupDiscovery{
			{ObjectMeta: metav1.ObjectMeta{Name: "example.com"}, Versions: []apidiscoveryv2.APIVersionDiscovery{things("v1"), things("v2")}},
			{ObjectMeta: metav1.ObjectMeta{Name: "metrics.k8s.io"}, Versions: []apidiscoveryv2.APIVersionDiscovery{
				{Version: "v1beta1", Freshness: apidiscoveryv2.DiscoveryFreshnessStale},
			}},
		}},
	}
}

func TestAPIServerSource(t *testing.T) {
	metrics := schema.GroupVersion{Group: "metrics.k8s.io", Version: "v1beta1"}
	type result struct {
		Lists   []*metav1.APIResourceList
		Failed  []schema.GroupVersion // of a PartialError
		Hard    bool                  // any other error
		Partial bool
	}
	wantLists := []*metav1.APIResourceList{
		{GroupVersion: "v1", APIResources: []metav1.APIResource{
			{Name: "pods", Kind: "Pod", Namespaced: true, Verbs: []string{"get"}},
			{Name: "pods/status", Kind: "Pod", Namespaced: true, Verbs: []string{"get"}},
		}},
		{GroupVersion: "example.com/v1", APIResources: []metav1.APIResource{{Name: "things", Kind: "Thing", Namespaced: true}}},
		{GroupVersion: "example.com/v2", APIResources: []metav1.APIResource{{Name: "things", Kind: "Thing", Namespaced: true}}},
	}
	tests := []struct {
		reason string
		server fakeAPIServer
		want   result
	}{
		{
			reason: "plain discovery: one broken aggregated API fails alone",
			server: fakeAPIServer{docs: plainDocs(), codes: map[string]int{"/apis/metrics.k8s.io/v1beta1": http.StatusServiceUnavailable}},
			want:   result{Lists: wantLists, Failed: []schema.GroupVersion{metrics}, Partial: true},
		},
		{
			reason: "plain discovery, all well",
			server: fakeAPIServer{docs: plainDocs()},
			want: result{Lists: append(slices.Clone(wantLists), &metav1.APIResourceList{GroupVersion: "metrics.k8s.io/v1beta1",
				APIResources: []metav1.APIResource{{Name: "pods", Kind: "PodMetrics", Namespaced: true}}})},
		},
		{
			reason: "aggregated discovery: a stale group version fails alone",
			server: fakeAPIServer{docs: aggregatedDocs(), aggregatedPaths: []string{"/api", "/apis"}},
			want:   result{Lists: wantLists, Failed: []schema.GroupVersion{metrics}, Partial: true},
		},
		{
			reason: "a failing /api fails the whole listing",
			server: fakeAPIServer{docs: plainDocs(), codes: map[string]int{"/api": http.StatusInternalServerError}},
			want:   result{Hard: true},
		},
		{
			reason: "a forbidden /apis is no group, as in client-go",
			server: fakeAPIServer{docs: plainDocs(), codes: map[string]int{"/apis": http.StatusForbidden}},
			want:   result{Lists: wantLists[:1]},
		},
	}
	// The aggregated answers carry fields the plain ones above leave
	// empty (group, version of each resource): compared without them.
	ignore := cmp.Transformer("bare", func(r metav1.APIResource) metav1.APIResource {
		r.Group, r.Version = "", ""
		return r
	})
	for _, tt := range tests {
		t.Run(tt.reason, func(t *testing.T) {
			lists, err := fakeSource(t, tt.server).ServerResources(context.Background())
			got := result{Lists: lists}
			var partial *PartialError
			switch {
			case errors.As(err, &partial):
				got.Partial = true
				for gv := range partial.Failed {
					got.Failed = append(got.Failed, gv)
				}
			case err != nil:
				got = result{Hard: true}
			}
			if diff := cmp.Diff(tt.want, got, ignore); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}

func TestPartialErrorMessage(t *testing.T) {
	err := &PartialError{Failed: map[schema.GroupVersion]error{
		{Group: "z.example.com", Version: "v1"}:       errors.New("down"),
		{Group: "metrics.k8s.io", Version: "v1beta1"}: errors.New("503"),
	}}
	want := "unable to list the resources of metrics.k8s.io/v1beta1: 503; z.example.com/v1: down"
	if err.Error() != want {
		t.Errorf("Error() = %q, want %q", err.Error(), want)
	}
}

// The aggregated documents of a real API server index as the plain ones
// do: the conversion loses nothing metabus uses.
func TestAggregatedMatchesPlain(t *testing.T) {
	agg := apiServer(t)
	plain := agg
	plain.plain = true
	aggLists, err := agg.ServerResources(testCtx(t))
	if err != nil {
		t.Fatal(err)
	}
	plainLists, err := plain.ServerResources(testCtx(t))
	if err != nil {
		t.Fatal(err)
	}
	aggByRes, aggByKind := index(aggLists)
	plainByRes, plainByKind := index(plainLists)
	if len(aggByRes) < 10 {
		t.Fatalf("only %d resources discovered", len(aggByRes))
	}
	if diff := cmp.Diff(plainByRes, aggByRes); diff != "" {
		t.Errorf("by resource (-plain +aggregated):\n%s", diff)
	}
	if diff := cmp.Diff(plainByKind, aggByKind); diff != "" {
		t.Errorf("by kind (-plain +aggregated):\n%s", diff)
	}
}
