package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// Reads checked by SubjectAccessReview (issue 35 items 2 and 7): a
// controller is sent only what the ServiceAccount it acts as may list and
// watch, in each namespace, whatever the watcher itself may read.

// listWatch are the verbs the watcher asks a controller's account for.
var listWatch = []string{"list", "watch"}

// namespaceReads lets an account read Namespaces, the parents of a
// Namespace decorator.
var namespaceReads = rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"namespaces"}, Verbs: listWatch}

// suiteReads are what the suite's shared writer account may read: the
// kinds its controllers declare, Secrets excepted.
var suiteReads = []rbacv1.PolicyRule{
	{APIGroups: []string{"test.metabus.dev"}, Resources: []string{"widgets"}, Verbs: listWatch},
	{APIGroups: []string{""}, Resources: []string{"configmaps", "pods"}, Verbs: listWatch},
	namespaceReads,
}

// TestHostileRead: a tenant whose controller acts as an account that may
// read Pods in its own namespace only decorates that Namespace, and its
// customize hook asks for every Pod labelled like another tenant's, in
// every namespace (a cluster-scoped parent's related rule spans them all).
// Under the hardened profile the watcher may read every Pod, so before
// item 2 the other tenant's Pod, with the secret in its environment, was
// sent to the hook. Now the sync hook is sent the tenant's own Pod only,
// the other never appears in any hook request, and a ReadWithheld Event
// on the controller names the resource and the namespace withheld.
func TestHostileRead(t *testing.T) {
	h := startHostile(t)
	ctx := context.Background()
	own, other := newNamespace(t), newNamespace(t)
	secret := "e2e-hostile-read-" + other + "-s3cr3t"
	const label = "e2e-hostile-read"
	pod := func(ns, name string, env []corev1.EnvVar) {
		p := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"app": label}},
			Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "app", Image: "app", Env: env}}},
		}
		eventually(t, 30*time.Second, "Pod "+ns+"/"+name, func() error {
			_, err := kube.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{})
			return err
		})
	}
	pod(other, "victim", []corev1.EnvVar{{Name: "DB_PASSWORD", Value: secret}})
	pod(own, "mine", nil)

	const account = "reader"
	grantAccount(t, own, account, rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: listWatch})
	grantClusterRole(t, own, account, "e2e-hostile-read-"+own, namespaceReads)

	// requests holds every request body either hook was sent.
	var (
		mu       sync.Mutex
		requests []string
	)
	record := func(req map[string]any) {
		body, err := json.Marshal(req)
		if err != nil {
			t.Errorf("hook request: %v", err)
			return
		}
		mu.Lock()
		defer mu.Unlock()
		requests = append(requests, string(body))
	}
	customize := h.hook(t, func(req map[string]any) (int, any) {
		record(req)
		return 200, map[string]any{"relatedResources": []any{map[string]any{"apiVersion": "v1", "resource": "pods",
			"labelSelector": map[string]any{"matchLabels": map[string]any{"app": label}}}}}
	})
	syncHook := h.hook(t, func(req map[string]any) (int, any) {
		record(req)
		return 200, map[string]any{"attachments": []any{}}
	})
	ctrl := "hostile-read-" + own
	spec := namespaceDecorator(own, syncHook.URL)
	delete(spec, "attachments")
	spec["hooks"].(map[string]any)["customize"] = map[string]any{"webhook": map[string]any{"url": customize.URL}}
	h.controllerAs(t, decoratorKind, ctrl, own+"/"+account, spec)

	// seen is whether a sync request listed Pod ns/name as related.
	seen := func(ns, name string) bool {
		mu.Lock()
		defer mu.Unlock()
		for _, body := range requests {
			var req struct {
				Related map[string]map[string]struct {
					Metadata struct{ Namespace, Name string }
				}
			}
			if json.Unmarshal([]byte(body), &req) != nil {
				continue
			}
			for _, o := range req.Related["Pod.v1"] {
				if o.Metadata.Namespace == ns && o.Metadata.Name == name {
					return true
				}
			}
		}
		return false
	}
	eventually(t, 45*time.Second, "the sync hook to be sent the tenant's own Pod", func() error {
		if !seen(own, "mine") {
			return fmt.Errorf("%d sync calls, none listing Pod %s/mine as related", syncHook.count(ctrl), own)
		}
		return nil
	})
	// The request that listed the tenant's own Pod would have listed the
	// other one beside it.
	noLeak := func() {
		t.Helper()
		mu.Lock()
		defer mu.Unlock()
		for _, body := range requests {
			if strings.Contains(body, secret) || strings.Contains(body, `"victim"`) {
				t.Errorf("a hook was sent the other tenant's Pod: %.600s", body)
			}
		}
	}
	noLeak()
	eventually(t, 45*time.Second, "ReadWithheld on the controller naming the other namespace's Pods", func() error {
		return warningEvent(ctx, metav1.NamespaceDefault, ctrl, "ReadWithheld",
			"ServiceAccount "+own+"/"+account+" may not list and watch pods in namespace "+other, "withheld from the hooks")
	})
	// A resync after the Event: what was withheld stays withheld.
	calls := syncHook.count(ctrl)
	if err := touchNamespace(ctx, own); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "another sync", func() error {
		if syncHook.count(ctrl) <= calls {
			return fmt.Errorf("still %d sync calls", calls)
		}
		return nil
	})
	noLeak()
}

// touchNamespace changes a label of Namespace ns, so that its decorators
// sync again.
func touchNamespace(ctx context.Context, ns string) error {
	patch := fmt.Sprintf(`{"metadata":{"labels":{"e2e-touched":"%d"}}}`, time.Now().UnixNano())
	_, err := kube.CoreV1().Namespaces().Patch(ctx, ns, types.MergePatchType, []byte(patch), metav1.PatchOptions{})
	return err
}
