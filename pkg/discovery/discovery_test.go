package discovery

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/metabus/metabus/pkg/apiresource"
	"github.com/metabus/metabus/pkg/kubeapi"
)

// countingClient counts ServerResources calls; with fn set it answers from
// fn instead of the embedded source.
type countingClient struct {
	Source

	mu    sync.Mutex
	calls int
	fn    func() ([]*metav1.APIResourceList, error)
}

func (c *countingClient) ServerResources(ctx context.Context) ([]*metav1.APIResourceList, error) {
	c.mu.Lock()
	c.calls++
	fn := c.fn
	c.mu.Unlock()
	if fn != nil {
		return fn()
	}
	return c.Source.ServerResources(ctx)
}

func (c *countingClient) count() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.calls
}

func (c *countingClient) set(fn func() ([]*metav1.APIResourceList, error)) {
	c.mu.Lock()
	c.fn = fn
	c.mu.Unlock()
}

// apiServer is the Source of the test's API server.
func apiServer(t *testing.T) APIServer {
	t.Helper()
	requireEnv(t)
	api, err := kubeapi.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	return APIServer{API: api}
}

func realClient(t *testing.T) *countingClient {
	t.Helper()
	return &countingClient{Source: apiServer(t)}
}

func testCtx(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 25*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func TestGetBeforeRefresh(t *testing.T) {
	c := &countingClient{}
	m := New(c)
	if r, ok := m.Get("v1", "configmaps"); ok {
		t.Fatalf("Get before Refresh = %+v", r)
	}
	if r, ok := m.GetKind("v1", "ConfigMap"); ok {
		t.Fatalf("GetKind before Refresh = %+v", r)
	}
	if c.count() != 0 {
		t.Fatal("Get/GetKind called discovery")
	}
}

func TestRefreshAgainstAPIServer(t *testing.T) {
	c := realClient(t)
	m := New(c)
	if err := m.Refresh(testCtx(t)); err != nil {
		t.Fatalf("Refresh: %v", err)
	}
	cases := []struct {
		reason     string
		apiVersion string
		resource   string
		kind       string
		gvr        schema.GroupVersionResource
		namespaced bool
		hasStatus  bool
	}{
		{reason: "core resource without status", apiVersion: "v1", resource: "configmaps", kind: "ConfigMap", gvr: schema.GroupVersionResource{Version: "v1", Resource: "configmaps"}, namespaced: true},
		{reason: "core resource with status", apiVersion: "v1", resource: "pods", kind: "Pod", gvr: schema.GroupVersionResource{Version: "v1", Resource: "pods"}, namespaced: true, hasStatus: true},
		{reason: "cluster-scoped core resource with status", apiVersion: "v1", resource: "namespaces", kind: "Namespace", gvr: schema.GroupVersionResource{Version: "v1", Resource: "namespaces"}, hasStatus: true},
		{reason: "named group", apiVersion: "apps/v1", resource: "deployments", kind: "Deployment", gvr: schema.GroupVersionResource{Group: "apps", Version: "v1", Resource: "deployments"}, namespaced: true, hasStatus: true},
		{reason: "CRD with a status subresource", apiVersion: "example.com/v1", resource: "gadgets", kind: "Gadget", gvr: schema.GroupVersionResource{Group: "example.com", Version: "v1", Resource: "gadgets"}, namespaced: true, hasStatus: true},
		{reason: "cluster-scoped CRD without a status subresource", apiVersion: "example.com/v1", resource: "gizmos", kind: "Gizmo", gvr: schema.GroupVersionResource{Group: "example.com", Version: "v1", Resource: "gizmos"}},
	}
	for _, tc := range cases {
		t.Run(tc.reason, func(t *testing.T) {
			r, ok := m.Get(tc.apiVersion, tc.resource)
			if !ok {
				t.Fatalf("%s: Get(%s, %s) not found", tc.reason, tc.apiVersion, tc.resource)
			}
			if r.GVR != tc.gvr || r.Kind != tc.kind || r.Namespaced != tc.namespaced || r.HasStatus != tc.hasStatus {
				t.Errorf("%s: Get = %+v, want GVR %v kind %s namespaced %v hasStatus %v", tc.reason, r, tc.gvr, tc.kind, tc.namespaced, tc.hasStatus)
			}
			if r.APIVersion() != tc.apiVersion {
				t.Errorf("%s: APIVersion() = %q, want %q", tc.reason, r.APIVersion(), tc.apiVersion)
			}
			for _, v := range []string{"get", "list", "watch", "create", "update", "patch", "delete"} {
				if !slices.Contains(r.Verbs, v) {
					t.Errorf("%s: verbs %v lack %s", tc.reason, r.Verbs, v)
				}
			}
			k, ok := m.GetKind(tc.apiVersion, tc.kind)
			if !ok || k != r {
				t.Errorf("%s: GetKind(%s, %s) = %+v, %v; want the same resource as Get", tc.reason, tc.apiVersion, tc.kind, k, ok)
			}
		})
	}

	misses := []struct {
		reason               string
		apiVersion, resource string
	}{
		{reason: "a subresource is not a resource", apiVersion: "v1", resource: "pods/status"},
		{reason: "a subresource is not a resource", apiVersion: "v1", resource: "pods/log"},
		{reason: "a CRD's status subresource is not a resource", apiVersion: "example.com/v1", resource: "gadgets/status"},
		{reason: "the kind is not the resource", apiVersion: "v1", resource: "ConfigMap"},
		{reason: "the group alone is not an apiVersion", apiVersion: "apps", resource: "deployments"},
		{reason: "a version that is not served", apiVersion: "example.com/v2", resource: "gadgets"},
	}
	for _, tc := range misses {
		if r, ok := m.Get(tc.apiVersion, tc.resource); ok {
			t.Errorf("%s: Get(%s, %s) = %+v", tc.reason, tc.apiVersion, tc.resource, r)
		}
	}
	if r, ok := m.GetKind("v1", "configmaps"); ok {
		t.Errorf("GetKind with a resource name = %+v", r)
	}
	if c.count() != 1 {
		t.Errorf("%d discovery calls, want 1 (Get never refreshes)", c.count())
	}
}

// resolveRuns makes TestResolveNewCRD's CRD new in every run.
var resolveRuns int

func TestResolveNewCRD(t *testing.T) {
	c := realClient(t)
	m := New(c)
	if err := m.Refresh(testCtx(t)); err != nil {
		t.Fatal(err)
	}
	// A new resource name per run: -count=N reuses the cluster.
	resolveRuns++
	plural, kind := fmt.Sprintf("doohickey%ds", resolveRuns), fmt.Sprintf("Doohickey%d", resolveRuns)
	if r, ok := m.Get("example.com/v1", plural); ok {
		t.Fatalf("%s known before its CRD exists: %+v", plural, r)
	}

	// Create the CRD after the first Refresh, and wait until the API
	// server's discovery lists it, so that one on-demand refresh must find
	// it.
	p, err := writeManifest(t.TempDir(), plural+".yaml", crd(plural, kind, "Namespaced", true))
	if err != nil {
		t.Fatal(err)
	}
	if err := env.Apply(testCtx(t), p); err != nil {
		t.Fatal(err)
	}
	probe := c.Source
	deadline := time.Now().Add(20 * time.Second)
	for {
		lists, _ := probe.ServerResources(testCtx(t))
		if slices.ContainsFunc(lists, func(l *metav1.APIResourceList) bool {
			return l != nil && l.GroupVersion == "example.com/v1" &&
				slices.ContainsFunc(l.APIResources, func(r metav1.APIResource) bool { return r.Name == plural })
		}) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the API server never listed %s", plural)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if _, ok := m.Get("example.com/v1", plural); ok {
		t.Fatalf("Get found %s without a refresh", plural)
	}

	before := c.count()
	r, err := m.Resolve(testCtx(t), "example.com/v1", plural)
	if err != nil {
		t.Fatalf("Resolve of a CRD created after Refresh: %v", err)
	}
	if r.Kind != kind || !r.Namespaced || !r.HasStatus || r.GVR.Group != "example.com" {
		t.Errorf("Resolve = %+v", r)
	}
	if n := c.count() - before; n != 1 {
		t.Errorf("Resolve made %d discovery calls, want 1", n)
	}
	// Now cached: Get, Resolve and ResolveKind do not call discovery.
	before = c.count()
	if g, ok := m.Get("example.com/v1", plural); !ok || g != r {
		t.Errorf("Get after Resolve = %+v, %v", g, ok)
	}
	if k, err := m.ResolveKind(testCtx(t), "example.com/v1", kind); err != nil || k != r {
		t.Errorf("ResolveKind after Resolve = %+v, %v", k, err)
	}
	if again, err := m.Resolve(testCtx(t), "example.com/v1", plural); err != nil || again != r {
		t.Errorf("second Resolve = %+v, %v", again, err)
	}
	if n := c.count() - before; n != 0 {
		t.Errorf("hits made %d discovery calls", n)
	}
}

func TestResolveWithoutRefresh(t *testing.T) {
	// Resolve on a fresh map refreshes on demand.
	c := realClient(t)
	m := New(c)
	r, err := m.ResolveKind(testCtx(t), "example.com/v1", "Gizmo")
	if err != nil {
		t.Fatalf("ResolveKind on an empty map: %v", err)
	}
	if r.GVR.Resource != "gizmos" || r.Namespaced || r.HasStatus {
		t.Errorf("ResolveKind = %+v", r)
	}
	if c.count() != 1 {
		t.Errorf("%d discovery calls, want 1", c.count())
	}
}

func TestResolveUnknown(t *testing.T) {
	c := realClient(t)
	m := New(c)
	if err := m.Refresh(testCtx(t)); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		reason    string
		resolve   func() (*apiresource.Resource, error)
		wantErr   string
		wantCalls int // discovery calls this case makes
	}{
		{
			reason:    "an unknown resource refreshes once, then says it is not served",
			resolve:   func() (*apiresource.Resource, error) { return m.Resolve(testCtx(t), "example.com/v1", "nonexistents") },
			wantErr:   `resource "nonexistents" in "example.com/v1" is not served by the API server`,
			wantCalls: 1,
		},
		{
			reason:    "a second miss within 2s does not refresh again",
			resolve:   func() (*apiresource.Resource, error) { return m.Resolve(testCtx(t), "v1", "nothings") },
			wantErr:   `resource "nothings" in "v1" is not served by the API server`,
			wantCalls: 0,
		},
		{
			reason:    "an unknown kind (rate-limited too)",
			resolve:   func() (*apiresource.Resource, error) { return m.ResolveKind(testCtx(t), "v1", "Nope") },
			wantErr:   `kind "Nope" in "v1" is not served by the API server`,
			wantCalls: 0,
		},
		{
			reason:    "an unknown group",
			resolve:   func() (*apiresource.Resource, error) { return m.Resolve(testCtx(t), "nosuch.example.com/v1", "things") },
			wantErr:   `resource "things" in "nosuch.example.com/v1" is not served`,
			wantCalls: 0,
		},
	}
	for _, tc := range cases {
		before := c.count()
		r, err := tc.resolve()
		if err == nil {
			t.Errorf("%s: resolved %+v", tc.reason, r)
			continue
		}
		if !strings.Contains(err.Error(), tc.wantErr) {
			t.Errorf("%s: error %q, want %q", tc.reason, err, tc.wantErr)
		}
		if n := c.count() - before; n != tc.wantCalls {
			t.Errorf("%s: %d discovery calls, want %d", tc.reason, n, tc.wantCalls)
		}
	}
	// Known resources still resolve while misses are rate-limited.
	if r, err := m.Resolve(testCtx(t), "v1", "configmaps"); err != nil || r.Kind != "ConfigMap" {
		t.Errorf("Resolve(v1, configmaps) = %+v, %v", r, err)
	}
}

// Fake discovery data.

func lists(extra ...*metav1.APIResourceList) []*metav1.APIResourceList {
	base := []*metav1.APIResourceList{
		{GroupVersion: "v1", APIResources: []metav1.APIResource{
			{Name: "configmaps", Kind: "ConfigMap", Namespaced: true, Verbs: []string{"get", "list"}},
			{Name: "pods", Kind: "Pod", Namespaced: true},
			{Name: "pods/status", Kind: "Pod", Namespaced: true},
			{Name: "pods/log", Kind: "Pod", Namespaced: true},
		}},
		nil, // tolerated
		{GroupVersion: "a/b/c", APIResources: []metav1.APIResource{{Name: "broken", Kind: "Broken"}}},
		{GroupVersion: "example.com/v1", APIResources: []metav1.APIResource{
			{Name: "things", Kind: "Thing", Namespaced: true},
			// Only a scale subresource: no status.
			{Name: "things/scale", Kind: "Scale", Namespaced: true},
		}},
	}
	return append(base, extra...)
}

func fixed(ls []*metav1.APIResourceList, err error) func() ([]*metav1.APIResourceList, error) {
	return func() ([]*metav1.APIResourceList, error) { return ls, err }
}

func TestIndex(t *testing.T) {
	c := &countingClient{}
	c.set(fixed(lists(), nil))
	m := New(c)
	if err := m.Refresh(context.Background()); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		reason               string
		apiVersion, resource string
		want                 *apiresource.Resource // nil: absent
	}{
		{reason: "verbs are kept", apiVersion: "v1", resource: "configmaps", want: &apiresource.Resource{GVR: schema.GroupVersionResource{Version: "v1", Resource: "configmaps"}, Kind: "ConfigMap", Namespaced: true, Verbs: []string{"get", "list"}}},
		{reason: "status subresource", apiVersion: "v1", resource: "pods", want: &apiresource.Resource{GVR: schema.GroupVersionResource{Version: "v1", Resource: "pods"}, Kind: "Pod", Namespaced: true, HasStatus: true}},
		{reason: "a scale subresource is not a status subresource", apiVersion: "example.com/v1", resource: "things", want: &apiresource.Resource{GVR: schema.GroupVersionResource{Group: "example.com", Version: "v1", Resource: "things"}, Kind: "Thing", Namespaced: true}},
		{reason: "subresources are skipped", apiVersion: "v1", resource: "pods/log"},
		{reason: "subresources are skipped", apiVersion: "example.com/v1", resource: "things/scale"},
		{reason: "an unparseable group version is skipped", apiVersion: "a/b/c", resource: "broken"},
	}
	for _, tc := range cases {
		got, ok := m.Get(tc.apiVersion, tc.resource)
		if tc.want == nil {
			if ok {
				t.Errorf("%s: Get(%s, %s) = %+v", tc.reason, tc.apiVersion, tc.resource, got)
			}
			continue
		}
		if !ok {
			t.Errorf("%s: Get(%s, %s) not found", tc.reason, tc.apiVersion, tc.resource)
			continue
		}
		if got.GVR != tc.want.GVR || got.Kind != tc.want.Kind || got.Namespaced != tc.want.Namespaced || got.HasStatus != tc.want.HasStatus || !slices.Equal(got.Verbs, tc.want.Verbs) {
			t.Errorf("%s: Get(%s, %s) = %+v, want %+v", tc.reason, tc.apiVersion, tc.resource, got, tc.want)
		}
	}
	// The kind of a subresource does not shadow its resource's kind.
	if k, ok := m.GetKind("v1", "Pod"); !ok || k.GVR.Resource != "pods" {
		t.Errorf("GetKind(v1, Pod) = %+v, %v", k, ok)
	}
	if k, ok := m.GetKind("example.com/v1", "Scale"); ok {
		t.Errorf("GetKind(example.com/v1, Scale) = %+v: a subresource kind", k)
	}
}

func TestRefreshFailures(t *testing.T) {
	partialErr := &PartialError{Failed: map[schema.GroupVersion]error{
		{Group: "metrics.k8s.io", Version: "v1beta1"}: errors.New("service unavailable"),
	}}
	hardErr := errors.New("connection refused")
	newer := &metav1.APIResourceList{GroupVersion: "example.com/v2", APIResources: []metav1.APIResource{{Name: "things", Kind: "Thing", Namespaced: true}}}

	cases := []struct {
		reason string
		// second is what discovery answers after a first, successful
		// Refresh of lists().
		second      func() ([]*metav1.APIResourceList, error)
		wantErr     string
		wantPartial bool
		// present / absent after the second Refresh.
		present, absent [][2]string
	}{
		{
			reason:      "a partial failure keeps what was discovered and reports it",
			second:      fixed(lists(newer), partialErr),
			wantErr:     "partial discovery",
			wantPartial: true,
			present:     [][2]string{{"v1", "configmaps"}, {"example.com/v2", "things"}},
		},
		{
			reason:  "a hard failure keeps the previous map",
			second:  fixed(nil, hardErr),
			wantErr: "discovery: connection refused",
			present: [][2]string{{"v1", "configmaps"}, {"example.com/v1", "things"}},
			absent:  [][2]string{{"example.com/v2", "things"}},
		},
		{
			reason:  "a successful refresh replaces the map: removed resources go",
			second:  fixed([]*metav1.APIResourceList{newer}, nil),
			present: [][2]string{{"example.com/v2", "things"}},
			absent:  [][2]string{{"v1", "configmaps"}, {"example.com/v1", "things"}},
		},
	}
	for _, tc := range cases {
		t.Run(tc.reason, func(t *testing.T) {
			c := &countingClient{}
			c.set(fixed(lists(), nil))
			m := New(c)
			if err := m.Refresh(context.Background()); err != nil {
				t.Fatal(err)
			}
			c.set(tc.second)
			err := m.Refresh(context.Background())
			if tc.wantErr == "" {
				if err != nil {
					t.Fatalf("%s: Refresh: %v", tc.reason, err)
				}
			} else {
				if err == nil || !strings.HasPrefix(err.Error(), tc.wantErr) {
					t.Fatalf("%s: Refresh = %v, want error starting with %q", tc.reason, err, tc.wantErr)
				}
				var partial *PartialError
				if got := errors.As(err, &partial); got != tc.wantPartial {
					t.Errorf("%s: error wraps a PartialError = %v, want %v", tc.reason, got, tc.wantPartial)
				}
			}
			for _, p := range tc.present {
				if _, ok := m.Get(p[0], p[1]); !ok {
					t.Errorf("%s: %s %s missing", tc.reason, p[0], p[1])
				}
			}
			for _, p := range tc.absent {
				if r, ok := m.Get(p[0], p[1]); ok {
					t.Errorf("%s: %s %s present: %+v", tc.reason, p[0], p[1], r)
				}
			}
		})
	}
}

func TestResolveFailures(t *testing.T) {
	partialErr := &PartialError{Failed: map[schema.GroupVersion]error{
		{Group: "metrics.k8s.io", Version: "v1beta1"}: errors.New("service unavailable"),
	}}
	cases := []struct {
		reason   string
		answer   func() ([]*metav1.APIResourceList, error)
		resource string
		wantErr  string // "" means resolved
	}{
		{reason: "a partial failure still resolves what was discovered", answer: fixed(lists(), partialErr), resource: "things"},
		{reason: "a partial failure without the resource: not served", answer: fixed(lists(), partialErr), resource: "widgets", wantErr: `resource "widgets" in "example.com/v1" is not served`},
		{reason: "a hard failure is returned as is", answer: fixed(nil, errors.New("connection refused")), resource: "things", wantErr: "discovery: connection refused"},
	}
	for _, tc := range cases {
		t.Run(tc.reason, func(t *testing.T) {
			c := &countingClient{}
			c.set(tc.answer)
			m := New(c)
			r, err := m.Resolve(context.Background(), "example.com/v1", tc.resource)
			if tc.wantErr == "" {
				if err != nil || r.Kind != "Thing" {
					t.Fatalf("%s: Resolve = %+v, %v", tc.reason, r, err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("%s: Resolve = %+v, %v; want error containing %q", tc.reason, r, err, tc.wantErr)
			}
		})
	}
}

func TestRun(t *testing.T) {
	c := &countingClient{}
	c.set(fixed(lists(), nil))
	m := New(c)
	var mu sync.Mutex
	var errs []error
	onError := func(err error) {
		mu.Lock()
		errs = append(errs, err)
		mu.Unlock()
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		m.Run(ctx, 10*time.Millisecond, onError)
	}()
	waitUntil := func(what string, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for !cond() {
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting for %s", what)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	waitUntil("periodic refreshes", func() bool { return c.count() >= 3 })
	if _, ok := m.Get("v1", "configmaps"); !ok {
		t.Error("Run did not fill the map")
	}
	mu.Lock()
	if len(errs) != 0 {
		t.Errorf("onError called on success: %v", errs)
	}
	mu.Unlock()

	c.set(fixed(nil, errors.New("down")))
	waitUntil("onError", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(errs) > 0
	})
	mu.Lock()
	if !strings.Contains(errs[0].Error(), "down") {
		t.Errorf("onError got %v", errs[0])
	}
	mu.Unlock()

	cancel()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not return after cancel")
	}
	// A nil onError is allowed.
	ctx2, cancel2 := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel2()
	m.Run(ctx2, 5*time.Millisecond, nil)
}
