package e2e

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/metabus/metabus/internal/allinone"
	"github.com/metabus/metabus/services/dispatcher"
)

// TestWebhookCredentialsGuarded (issue #14): the dispatcher reads webhook
// credentials only from the namespaces an admin allowed (its own plus
// --secret-namespaces) and never sends them over plain http unless the
// webhook says allowInsecureCredentials. A refused controller gets a
// SyncError Event on the parent and on the controller, and its hook
// receives no request; an allowed one works. The dispatcher runs under its
// production RBAC: a namespace the flag allows but no Role grants (an admin
// who forgot the Role) is refused by the API server, with the same result.
func TestWebhookCredentialsGuarded(t *testing.T) {
	ctx := context.Background()
	allowed, other, unbound := newNamespace(t), newNamespace(t), newNamespace(t)
	// The default install lets the dispatcher read every namespace; the
	// "no-role" case needs RBAC that does not.
	narrowDispatcherSecrets(t)
	grantDispatcherSecrets(t, allowed)
	inst := startMetabus(t, allinone.Config{Dispatcher: dispatcher.Config{SecretNamespaces: []string{allowed, unbound}}}, nil)
	for _, ns := range []string{allowed, other, unbound} {
		s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "hook-token"}, Data: map[string][]byte{"token": []byte("tok-" + ns)}}
		if _, err := kube.CoreV1().Secrets(ns).Create(ctx, s, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}

	var mu sync.Mutex
	requests := map[string]int{} // by the parent's mode label
	authz := map[string]string{} // last Authorization header by mode
	hook := widgetHook(nil)
	url := hookServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		jsonHook(func(req map[string]any) (int, any) {
			meta, _ := req["parent"].(map[string]any)["metadata"].(map[string]any)
			labels, _ := meta["labels"].(map[string]any)
			mode, _ := labels["mode"].(string)
			mu.Lock()
			requests[mode]++
			authz[mode] = r.Header.Get("Authorization")
			mu.Unlock()
			return hook(req)
		}).ServeHTTP(w, r)
	}))

	controllers := []struct {
		mode, secretNS string
		allowInsecure  bool
	}{
		{mode: "other-namespace", secretNS: other, allowInsecure: true},
		{mode: "plain-http", secretNS: allowed},
		{mode: "no-role", secretNS: unbound, allowInsecure: true},
		{mode: "allowed", secretNS: allowed, allowInsecure: true},
	}
	for _, c := range controllers {
		webhook := map[string]any{"url": url, "authorization": map[string]any{
			"secretRef": map[string]any{"name": "hook-token", "namespace": c.secretNS}}}
		if c.allowInsecure {
			webhook["allowInsecureCredentials"] = true
		}
		createController(t, inst, compositeKind, "secrets-"+c.mode, map[string]any{
			"parentResource": map[string]any{"apiVersion": "test.metabus.dev/v1", "resource": "widgets",
				"labelSelector": map[string]any{"matchLabels": map[string]any{"mode": c.mode}}},
			"childResources": []any{map[string]any{"apiVersion": "v1", "resource": "configmaps"}},
			"hooks":          map[string]any{"sync": map[string]any{"webhook": webhook}},
		})
		w := newWidget(c.mode, []string{"a"}, 1)
		w.SetLabels(map[string]string{"mode": c.mode})
		if _, err := dyn.Resource(widgetsGVR).Namespace(allowed).Create(ctx, w, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}

	eventually(t, 30*time.Second, "the allowed controller's child", func() error {
		_, err := kube.CoreV1().ConfigMaps(allowed).Get(ctx, "allowed-a", metav1.GetOptions{})
		return err
	})
	mu.Lock()
	if got, want := authz["allowed"], "Bearer tok-"+allowed; got != want {
		t.Errorf("allowed controller: hook saw Authorization %q, want %q", got, want)
	}
	mu.Unlock()

	syncError := func(ns, name string, want ...string) error {
		return warningEvent(ctx, ns, name, "SyncError", want...)
	}
	nsWant := []string{"hook not called", fmt.Sprintf("Secret %s/hook-token", other), fmt.Sprintf("namespace %q", other), "--secret-namespaces"}
	httpWant := []string{"hook not called", "authorization would be sent in clear over plain http", "allowInsecureCredentials"}
	eventually(t, 30*time.Second, "a SyncError on the parent referencing another namespace", func() error {
		return syncError(allowed, "other-namespace", nsWant...)
	})
	eventually(t, 30*time.Second, "a SyncError on the parent whose credentials would go over http", func() error {
		return syncError(allowed, "plain-http", httpWant...)
	})
	eventually(t, 30*time.Second, "a SyncError on the parent whose Secret RBAC does not let the dispatcher read", func() error {
		return syncError(allowed, "no-role", "is forbidden", serviceAccount(allinone.ServiceDispatcher), unbound)
	})
	eventually(t, 30*time.Second, "SyncErrors on the refused controllers", func() error {
		if err := syncError(metav1.NamespaceDefault, "secrets-other-namespace", nsWant...); err != nil {
			return err
		}
		return syncError(metav1.NamespaceDefault, "secrets-plain-http", httpWant...)
	})

	mu.Lock()
	defer mu.Unlock()
	for _, mode := range []string{"other-namespace", "plain-http", "no-role"} {
		if requests[mode] != 0 {
			t.Errorf("%s: the hook received %d requests, want none", mode, requests[mode])
		}
	}
}
