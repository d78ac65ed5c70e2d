package e2e

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/metabus/metabus/internal/allinone"
	"github.com/metabus/metabus/pkg/related"
	"github.com/metabus/metabus/services/dispatcher"
	"github.com/metabus/metabus/services/watcher"
)

// secretRequests counts metabus's API requests on Secrets, which would
// start with the list of a Secrets informer.
type secretRequests struct{ n atomic.Int64 }

func (s *secretRequests) wrap(rt http.RoundTripper) http.RoundTripper {
	return roundTripFunc(func(r *http.Request) (*http.Response, error) {
		if strings.Contains(r.URL.Path, "/secrets") {
			s.n.Add(1)
		}
		return rt.RoundTrip(r)
	})
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// TestRelatedResourcesBounded (issues #14, #22): by default, as upstream,
// a customize hook's related rule may name Secrets and the sync hook sees
// them (upstream's SecretPropagation example needs it). Under the hardened
// profile (--related-resources and --controller-resources both
// "*,-core/secrets"; the watcher checks the rules again:
// TestControllerResourcesBounded) the same rule is refused: the sync fails
// with a SyncError Event on the parent and on the controller saying how an
// admin allows it, the sync hook is not called and metabus does not touch
// Secrets at all (no informer).
func TestRelatedResourcesBounded(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name    string
		entries []string // both flags'
		allowed bool
	}{
		{name: "default", entries: nil, allowed: true},
		{name: "hardened", entries: related.HardenedPolicy, allowed: false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var secretCalls secretRequests
			cfg := allinone.Config{Dispatcher: dispatcher.Config{RelatedResources: tc.entries}, Watcher: watcher.Config{ControllerResources: tc.entries}}
			inst := startMetabusWith(t, cfg, nil, secretCalls.wrap)
			ns := newNamespace(t)
			if _, err := kube.CoreV1().Secrets(ns).Create(ctx, &corev1.Secret{
				ObjectMeta: metav1.ObjectMeta{Name: "db"}, Data: map[string][]byte{"password": []byte("hunter2")},
			}, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			customizeURL := hookServer(t, jsonHook(func(req map[string]any) (int, any) {
				return 200, map[string]any{"relatedResources": []any{map[string]any{
					"apiVersion": "v1", "resource": "secrets", "names": []any{"db"},
				}}}
			}))
			var syncCalls atomic.Int64
			var sawSecret atomic.Bool
			syncURL := hookServer(t, jsonHook(func(req map[string]any) (int, any) {
				syncCalls.Add(1)
				rel, _ := req["related"].(map[string]any)["Secret.v1"].(map[string]any)
				sawSecret.Store(rel["db"] != nil)
				return 200, map[string]any{"children": []any{}}
			}))
			ctrl := "related-secrets-" + tc.name
			createController(t, inst, compositeKind, ctrl, map[string]any{
				"parentResource": map[string]any{"apiVersion": "test.metabus.dev/v1", "resource": "widgets"},
				"childResources": []any{map[string]any{"apiVersion": "v1", "resource": "configmaps"}},
				"hooks": map[string]any{
					"sync":      map[string]any{"webhook": map[string]any{"url": syncURL}},
					"customize": map[string]any{"webhook": map[string]any{"url": customizeURL}},
				},
			})
			if _, err := dyn.Resource(widgetsGVR).Namespace(ns).Create(ctx, newWidget("rw", nil, 1), metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}

			if tc.allowed {
				eventually(t, 30*time.Second, "the sync hook to see the related Secret", func() error {
					if !sawSecret.Load() {
						return fmt.Errorf("%d sync calls, none with the Secret", syncCalls.Load())
					}
					return nil
				})
				if secretCalls.n.Load() == 0 {
					t.Error("no API request on Secrets, though the hook saw one: the request counter is broken")
				}
				return
			}
			want := []string{"relatedResources[0] (v1 secrets) refused", "sync hook not called", "core/secrets is denied", "--related-resources", "dispatcher.relatedResources"}
			syncError := func(evNS, name string) error { return warningEvent(ctx, evNS, name, "SyncError", want...) }
			eventually(t, 30*time.Second, "a SyncError on the parent", func() error { return syncError(ns, "rw") })
			eventually(t, 30*time.Second, "a SyncError on the controller", func() error { return syncError(metav1.NamespaceDefault, ctrl) })
			if n := syncCalls.Load(); n != 0 {
				t.Errorf("the sync hook was called %d times; a refused related rule must fail the sync before it", n)
			}
			if n := secretCalls.n.Load(); n != 0 {
				t.Errorf("metabus made %d API requests on Secrets; a refused rule must start no informer", n)
			}
		})
	}
}
