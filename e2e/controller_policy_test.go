package e2e

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/metabus/metabus/internal/allinone"
	"github.com/metabus/metabus/services/dispatcher"
	"github.com/metabus/metabus/services/watcher"
)

// TestControllerResourcesBounded (issue #14): the watcher's
// --controller-resources bounds what controllers may make metabus watch
// and send to their hooks; by default everything but Secrets.
//   - default: a CompositeController with Secret children and a
//     DecoratorController targeting Secrets are not started: a CreateError
//     Warning on each names the field, the rule and the setting to change,
//     once (not retried); no hook is called and metabus makes no API
//     request on Secrets.
//   - related: a dispatcher allowing every related rule (--related-resources=*)
//     does not get past the watcher, which checks the rules again: a rule
//     on Secrets fails the sync (SyncError naming the watcher's setting),
//     the sync hook is not called, no API request on Secrets.
//   - all: with --controller-resources=* the same CompositeController
//     converges, its Secret child written.
func TestControllerResourcesBounded(t *testing.T) {
	ctx := context.Background()
	compositeSpec := func(url string) map[string]any {
		return map[string]any{
			"parentResource": map[string]any{"apiVersion": "test.metabus.dev/v1", "resource": "widgets"},
			"childResources": []any{
				map[string]any{"apiVersion": "v1", "resource": "configmaps"},
				map[string]any{"apiVersion": "v1", "resource": "secrets"},
			},
			"hooks": map[string]any{"sync": map[string]any{"webhook": map[string]any{"url": url}}},
		}
	}
	// secretChildHook answers every widget with one Secret child.
	secretChildHook := func(calls *atomic.Int64) string {
		return hookServer(t, jsonHook(func(req map[string]any) (int, any) {
			calls.Add(1)
			name, _ := req["parent"].(map[string]any)["metadata"].(map[string]any)["name"].(string)
			return 200, map[string]any{"children": []any{map[string]any{
				"apiVersion": "v1", "kind": "Secret",
				"metadata":   map[string]any{"name": name + "-s", "labels": map[string]any{"app": name}},
				"stringData": map[string]any{"k": "v"},
			}}}
		}))
	}
	const refused = "core/secrets is denied by -core/secrets in the watcher's --controller-resources (Helm value watcher.controllerResources)"

	// The policy SECURITY.md recommends where no controller manages Secrets.
	tightened := watcher.Config{ControllerResources: []string{"*", "-core/secrets"}}

	t.Run("tightened", func(t *testing.T) {
		var secretCalls secretRequests
		inst := startMetabusWith(t, allinone.Config{Watcher: tightened}, nil, secretCalls.wrap)
		ns := newNamespace(t)
		var calls atomic.Int64
		url := secretChildHook(&calls)
		ctrl := "cres-composite"
		createController(t, inst, compositeKind, ctrl, compositeSpec(url))
		createController(t, inst, decoratorKind, "cres-decorator", map[string]any{
			"resources": []any{map[string]any{"apiVersion": "v1", "resource": "secrets"}},
			"hooks":     map[string]any{"sync": map[string]any{"webhook": map[string]any{"url": url}}},
		})
		if _, err := dyn.Resource(widgetsGVR).Namespace(ns).Create(ctx, newWidget("w", nil, 1), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		if _, err := kube.CoreV1().Secrets(ns).Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "target"}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		wants := map[string][]string{
			ctrl:             {"controller not started", "spec.childResources[1] (v1 secrets)", refused},
			"cres-decorator": {"controller not started", "spec.resources[0] (v1 secrets)", refused},
		}
		for name, want := range wants {
			eventually(t, 30*time.Second, "a CreateError on "+name, func() error {
				return warningEvent(ctx, metav1.NamespaceDefault, name, "CreateError", want...)
			})
		}
		// Not retried: a hot retry (5 ms, doubling) would repeat the Event
		// a dozen times in 5 s.
		time.Sleep(5 * time.Second)
		for name := range wants {
			if n := eventCount(t, metav1.NamespaceDefault, name, "CreateError"); n != 1 {
				t.Errorf("%s: CreateError reported %d times in 5s, want once (not retried)", name, n)
			}
		}
		if n := calls.Load(); n != 0 {
			t.Errorf("the hooks were called %d times; a refused controller must not be started", n)
		}
		if n := secretCalls.n.Load(); n != 0 {
			t.Errorf("metabus made %d API requests on Secrets; a refused controller must start no informer", n)
		}
	})

	t.Run("related", func(t *testing.T) {
		var secretCalls secretRequests
		inst := startMetabusWith(t, allinone.Config{Watcher: tightened, Dispatcher: dispatcher.Config{RelatedResources: []string{"*"}}}, nil, secretCalls.wrap)
		ns := newNamespace(t)
		customizeURL := hookServer(t, jsonHook(func(req map[string]any) (int, any) {
			return 200, map[string]any{"relatedResources": []any{map[string]any{"apiVersion": "v1", "resource": "secrets"}}}
		}))
		var syncCalls atomic.Int64
		syncURL := hookServer(t, jsonHook(func(req map[string]any) (int, any) {
			syncCalls.Add(1)
			return 200, map[string]any{"children": []any{}}
		}))
		createController(t, inst, compositeKind, "cres-related", map[string]any{
			"parentResource": map[string]any{"apiVersion": "test.metabus.dev/v1", "resource": "widgets"},
			"hooks": map[string]any{
				"sync":      map[string]any{"webhook": map[string]any{"url": syncURL}},
				"customize": map[string]any{"webhook": map[string]any{"url": customizeURL}},
			},
		})
		if _, err := dyn.Resource(widgetsGVR).Namespace(ns).Create(ctx, newWidget("rw", nil, 1), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		eventually(t, 30*time.Second, "a SyncError on the parent", func() error {
			return warningEvent(ctx, ns, "rw", "SyncError", "related resources cannot be observed", "relatedResources[0] (v1 secrets)", refused)
		})
		if n := syncCalls.Load(); n != 0 {
			t.Errorf("the sync hook was called %d times; a related rule the watcher refuses must fail the sync before it", n)
		}
		if n := secretCalls.n.Load(); n != 0 {
			t.Errorf("metabus made %d API requests on Secrets; a refused rule must start no informer", n)
		}
	})

	// The default allows every resource, as upstream: a controller with a
	// Secret child (upstream's SecretPropagation example) works unchanged.
	t.Run("default", func(t *testing.T) {
		inst := startMetabus(t, allinone.Config{}, nil)
		ns := newNamespace(t)
		var calls atomic.Int64
		createController(t, inst, compositeKind, "cres-all", compositeSpec(secretChildHook(&calls)))
		if _, err := dyn.Resource(widgetsGVR).Namespace(ns).Create(ctx, newWidget("w", nil, 1), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		eventually(t, 30*time.Second, "the Secret child", func() error {
			s, err := kube.CoreV1().Secrets(ns).Get(ctx, "w-s", metav1.GetOptions{})
			if err != nil {
				return err
			}
			if ref := metav1.GetControllerOf(s); ref == nil || ref.Name != "w" {
				return fmt.Errorf("controller reference %v", ref)
			}
			return nil
		})
	})
}

// eventCount is how many times Events of reason on the object ns/name were
// reported (the recorder counts repeats in one Event).
func eventCount(t *testing.T, ns, name, reason string) int32 {
	t.Helper()
	evs, err := kube.CoreV1().Events(ns).List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var n int32
	for _, e := range evs.Items {
		if e.InvolvedObject.Name == name && e.Reason == reason {
			n += max(e.Count, 1)
		}
	}
	return n
}
