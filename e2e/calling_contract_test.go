package e2e

import (
	"context"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/metabus/metabus/internal/allinone"
	"github.com/metabus/metabus/pkg/bus"
	"github.com/metabus/metabus/pkg/related"
	"github.com/metabus/metabus/services/dispatcher"
	"github.com/metabus/metabus/services/watcher"
)

// The calling contract (issue #22): upstream Metacontroller calls a hook
// again whenever anything it watches changes, whoever changed it,
// metabus's own writes included, and writes the status of every answer.
// Level-triggered hooks rely on that to move on: each test below is a hook
// whose next step only comes from observing what metabus wrote from its
// previous answer, and none of them asks for a resync. Each fails on a
// build that hides own writes from the hook (see
// bus.SuppressEchoesAnnotation, the opt-in that does).

// contractController creates a composite controller of widgets with
// ConfigMap children (InPlace) and the given sync hook, served by inst.
func contractController(t *testing.T, inst *instance, name string, hook func(req map[string]any) (int, any), annotations map[string]string) {
	t.Helper()
	createControllerWith(t, inst, compositeKind, name, map[string]any{
		"parentResource": map[string]any{"apiVersion": "test.metabus.dev/v1", "resource": "widgets"},
		"childResources": []any{map[string]any{
			"apiVersion": "v1", "resource": "configmaps",
			"updateStrategy": map[string]any{"method": "InPlace"},
		}},
		"hooks": map[string]any{"sync": map[string]any{"webhook": map[string]any{"url": hookServer(t, jsonHook(hook))}}},
	}, annotations)
}

// observedConfigMaps are the ConfigMap children of a composite request, by
// name.
func observedConfigMaps(req map[string]any) map[string]*unstructured.Unstructured {
	out := map[string]*unstructured.Unstructured{}
	cms, _ := req["children"].(map[string]any)["ConfigMap.v1"].(map[string]any)
	for name, obj := range cms {
		if m, ok := obj.(map[string]any); ok {
			out[name] = &unstructured.Unstructured{Object: m}
		}
	}
	return out
}

func configMap(name, app string, data map[string]any) map[string]any {
	return map[string]any{"apiVersion": "v1", "kind": "ConfigMap",
		"metadata": map[string]any{"name": name, "labels": map[string]any{"app": app}}, "data": data}
}

// TestContractStateMachineThroughOwnChildWrites is BlueGreenDeployment's
// shape, with ConfigMaps standing in for ReplicaSets and the Service: green
// is created at the parent's version; once the hook observes green there,
// it points the router at green (an update metabus makes); only a sync that
// observes the router pointing at green scales blue to zero. The router
// write is metabus's own: a build that hides it leaves blue at 3 forever.
func TestContractStateMachineThroughOwnChildWrites(t *testing.T) {
	ctx := context.Background()
	inst := startMetabus(t, allinone.Config{}, nil)
	ns := newNamespace(t)
	contractController(t, inst, "contract-swap", func(req map[string]any) (int, any) {
		parent := &unstructured.Unstructured{Object: req["parent"].(map[string]any)}
		app, version := parent.GetName(), nestedString(parent, "spec", "version")
		if v, ok := nestedInt(parent, "spec", "version"); ok {
			version = fmt.Sprint(v)
		}
		seen := observedConfigMaps(req)
		active := "blue"
		if r := seen[app+"-router"]; r != nil {
			active = nestedString(r, "data", "active")
			if active == "" {
				active = "blue"
			}
		}
		if g := seen[app+"-green"]; g != nil && nestedString(g, "data", "version") == version {
			active = "green" // green is "ready": switch traffic
		}
		blueReplicas := "3"
		if r := seen[app+"-router"]; r != nil && nestedString(r, "data", "active") == "green" {
			blueReplicas = "0" // traffic observed on green: drain blue
		}
		return 200, map[string]any{
			"status": map[string]any{"active": active, "blueReplicas": blueReplicas},
			"children": []any{
				configMap(app+"-green", app, map[string]any{"version": version}),
				configMap(app+"-router", app, map[string]any{"active": active}),
				configMap(app+"-blue", app, map[string]any{"replicas": blueReplicas}),
			},
		}
	}, nil)
	if _, err := dyn.Resource(widgetsGVR).Namespace(ns).Create(ctx, newWidget("bg", nil, 2), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 60*time.Second, "blue drained after the router moved to green", func() error {
		router, err := kube.CoreV1().ConfigMaps(ns).Get(ctx, "bg-router", metav1.GetOptions{})
		if err != nil {
			return err
		}
		blue, err := kube.CoreV1().ConfigMaps(ns).Get(ctx, "bg-blue", metav1.GetOptions{})
		if err != nil {
			return err
		}
		if router.Data["active"] != "green" || blue.Data["replicas"] != "0" {
			return fmt.Errorf("router active=%q, blue replicas=%q", router.Data["active"], blue.Data["replicas"])
		}
		return nil
	})
}

// TestContractReadsBackItsStatus is DaemonJob's shape: when the hook sees
// its job done (a field someone else sets on the child), it records
// completion in status and keeps the child; it deletes the child only on a
// later call that reads that completion back from the parent's status
// ("we should not delete children until after we know we've recorded
// completion in our status"). The status write is metabus's own.
func TestContractReadsBackItsStatus(t *testing.T) {
	ctx := context.Background()
	inst := startMetabus(t, allinone.Config{}, nil)
	ns := newNamespace(t)
	contractController(t, inst, "contract-readback", func(req map[string]any) (int, any) {
		parent := &unstructured.Unstructured{Object: req["parent"].(map[string]any)}
		app := parent.GetName()
		if done, _, _ := unstructured.NestedBool(parent.Object, "status", "completed"); done {
			return 200, map[string]any{"status": map[string]any{"completed": true}, "children": []any{}}
		}
		job := configMap(app+"-job", app, map[string]any{"task": "run"})
		if j := observedConfigMaps(req)[app+"-job"]; j != nil && nestedString(j, "data", "done") == "yes" {
			return 200, map[string]any{"status": map[string]any{"completed": true}, "children": []any{job}}
		}
		return 200, map[string]any{"status": map[string]any{"completed": false}, "children": []any{job}}
	}, nil)
	if _, err := dyn.Resource(widgetsGVR).Namespace(ns).Create(ctx, newWidget("dj", nil, 1), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "the job ConfigMap", func() error {
		_, err := kube.CoreV1().ConfigMaps(ns).Get(ctx, "dj-job", metav1.GetOptions{})
		return err
	})
	// The job finishes: someone else marks the child done (a field the
	// hook never sets, so apply keeps it).
	patch := []byte(`{"data":{"done":"yes"}}`)
	if _, err := kube.CoreV1().ConfigMaps(ns).Patch(ctx, "dj-job", "application/merge-patch+json", patch, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 60*time.Second, "the job deleted once completion was read back from status", func() error {
		w, err := dyn.Resource(widgetsGVR).Namespace(ns).Get(ctx, "dj", metav1.GetOptions{})
		if err != nil {
			return err
		}
		done, _, _ := unstructured.NestedBool(w.Object, "status", "completed")
		_, err = kube.CoreV1().ConfigMaps(ns).Get(ctx, "dj-job", metav1.GetOptions{})
		switch {
		case !done:
			return fmt.Errorf("status.completed not recorded yet")
		case err == nil:
			return fmt.Errorf("completion recorded, the job ConfigMap still exists")
		case !apierrors.IsNotFound(err):
			return err
		}
		return nil
	})
}

// TestContractResyncAfterOnOwnStatusWrite is upstream's TestResyncAfter,
// for both kinds: the first call only records status; the call that status
// write brings asks for resyncAfterSeconds: 0.1; the resync's call reports
// the time it took in status. Nothing but metabus's own status write brings
// the second call.
func TestContractResyncAfterOnOwnStatusWrite(t *testing.T) {
	for _, kind := range []string{compositeKind, decoratorKind} {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			inst := startMetabus(t, allinone.Config{}, nil)
			ns := newNamespace(t)
			var mu sync.Mutex
			var armedAt time.Time
			hook := func(req map[string]any) (int, any) {
				obj, _ := req["parent"].(map[string]any)
				if obj == nil {
					obj, _ = req["object"].(map[string]any)
				}
				parent := &unstructured.Unstructured{Object: obj}
				mu.Lock()
				defer mu.Unlock()
				phase := nestedString(parent, "status", "phase")
				resp := map[string]any{}
				switch {
				case phase == "":
					resp["status"] = map[string]any{"phase": "armed"}
				case phase == "armed" && armedAt.IsZero():
					armedAt = time.Now()
					resp["status"] = map[string]any{"phase": "armed"}
					resp["resyncAfterSeconds"] = 0.1
				case phase == "armed":
					resp["status"] = map[string]any{"phase": "done", "elapsedSeconds": time.Since(armedAt).Seconds()}
				default:
					st, _ := obj["status"].(map[string]any)
					resp["status"] = st
				}
				if kind == compositeKind {
					resp["children"] = []any{}
				}
				return 200, resp
			}
			// Each kind selects only its own parent: the two subtests run
			// side by side, and a write of one must not sync the other.
			selector := map[string]any{"matchLabels": map[string]any{"resync": kind}}
			spec := map[string]any{"hooks": map[string]any{"sync": map[string]any{"webhook": map[string]any{"url": hookServer(t, jsonHook(hook))}}}}
			if kind == compositeKind {
				spec["parentResource"] = map[string]any{"apiVersion": "test.metabus.dev/v1", "resource": "widgets", "labelSelector": selector}
			} else {
				spec["resources"] = []any{map[string]any{"apiVersion": "test.metabus.dev/v1", "resource": "widgets", "labelSelector": selector}}
			}
			// The parent exists before the controller, so that its first
			// sync (the controller's start) is the only call that is not
			// brought by the status write.
			w := newWidget("ra", nil, 1)
			w.SetLabels(map[string]string{"resync": kind})
			if _, err := dyn.Resource(widgetsGVR).Namespace(ns).Create(ctx, w, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			createController(t, inst, kind, "contract-resync-"+map[string]string{compositeKind: "cc", decoratorKind: "dc"}[kind], spec)
			eventually(t, 60*time.Second, "the resync's call to report its delay", func() error {
				w, err := dyn.Resource(widgetsGVR).Namespace(ns).Get(ctx, "ra", metav1.GetOptions{})
				if err != nil {
					return err
				}
				if _, found, _ := unstructured.NestedFieldNoCopy(w.Object, "status", "elapsedSeconds"); !found {
					return fmt.Errorf("status %v", w.Object["status"])
				}
				return nil
			})
		})
	}
}

// tlsHook is an https hook server answering with h, and its CA in PEM.
func tlsHook(t *testing.T, h http.Handler) (url, caPEM string) {
	t.Helper()
	srv := httptest.NewTLSServer(h)
	t.Cleanup(srv.Close)
	ca := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw})
	return srv.URL, string(ca)
}

// secretsScenario is what upstream's webhook-auth example and its
// SecretPropagation example need from the defaults: a webhook whose
// bearer token and basic-auth credentials live in a namespace of the
// controller author's choosing (upstream's example uses the controller's
// own namespace, "metacontroller"), and a customize hook naming Secrets.
type secretsScenario struct {
	mu sync.Mutex
	// authz is the Authorization header each hook saw last, by path.
	authz map[string]string
	// calls counts requests by path.
	calls map[string]int
	// propagated is the related Secret's data the propagate hook saw.
	propagated string
}

func (s *secretsScenario) handler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req map[string]any
		_ = json.NewDecoder(r.Body).Decode(&req)
		s.mu.Lock()
		s.calls[r.URL.Path]++
		s.authz[r.URL.Path] = r.Header.Get("Authorization")
		s.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		parent, _ := req["parent"].(map[string]any)
		name, _ := parent["metadata"].(map[string]any)["name"].(string)
		switch r.URL.Path {
		case "/customize":
			_ = json.NewEncoder(w).Encode(map[string]any{"relatedResources": []any{map[string]any{
				"apiVersion": "v1", "resource": "secrets", "names": []any{"shared"}}}})
		case "/propagate":
			var data string
			for _, obj := range mapOf(mapOf(req["related"])["Secret.v1"]) {
				if d, ok := mapOf(obj)["data"].(map[string]any); ok {
					data, _ = d["value"].(string)
				}
			}
			s.mu.Lock()
			s.propagated = data
			s.mu.Unlock()
			_ = json.NewEncoder(w).Encode(map[string]any{"children": []any{
				configMap(name+"-copy", name, map[string]any{"value": data})}})
		default:
			_ = json.NewEncoder(w).Encode(map[string]any{"children": []any{
				configMap(name+"-authed", name, map[string]any{"via": r.URL.Path})}})
		}
	})
}

func mapOf(v any) map[string]any { m, _ := v.(map[string]any); return m }

// start creates the Secrets in secretNS, the three controllers and a
// widget for each in ns.
func (s *secretsScenario) start(t *testing.T, inst *instance, ns, secretNS, prefix string) {
	t.Helper()
	ctx := context.Background()
	for name, data := range map[string]map[string][]byte{
		"hook-token": {"token": []byte("tok-" + secretNS)},
		"hook-basic": {"username": []byte("user"), "password": []byte("pass-" + secretNS)},
	} {
		if _, err := kube.CoreV1().Secrets(secretNS).Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name}, Data: data}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := kube.CoreV1().Secrets(ns).Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "shared"},
		Data: map[string][]byte{"value": []byte("secret")}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	url, ca := tlsHook(t, s.handler())
	webhook := func(path string, auth map[string]any) map[string]any {
		w := map[string]any{"url": url + path, "caBundle": map[string]any{"inline": ca}}
		for k, v := range auth {
			w[k] = v
		}
		return w
	}
	controllers := map[string]map[string]any{
		"bearer": {"sync": map[string]any{"webhook": webhook("/bearer", map[string]any{"authorization": map[string]any{
			"type": "Bearer", "secretRef": map[string]any{"name": "hook-token", "namespace": secretNS, "key": "token"}}})}},
		"basic": {"sync": map[string]any{"webhook": webhook("/basic", map[string]any{"basicAuth": map[string]any{
			"secretRef": map[string]any{"name": "hook-basic", "namespace": secretNS}}})}},
		"propagate": {
			"customize": map[string]any{"webhook": webhook("/customize", nil)},
			"sync":      map[string]any{"webhook": webhook("/propagate", nil)},
		},
	}
	for mode, hooks := range controllers {
		createController(t, inst, compositeKind, prefix+"-"+mode, map[string]any{
			"parentResource": map[string]any{"apiVersion": "test.metabus.dev/v1", "resource": "widgets",
				"labelSelector": map[string]any{"matchLabels": map[string]any{"mode": mode}}},
			"childResources": []any{map[string]any{"apiVersion": "v1", "resource": "configmaps"}},
			"hooks":          hooks,
		})
		w := newWidget(mode, nil, 1)
		w.SetLabels(map[string]string{"mode": mode})
		if _, err := dyn.Resource(widgetsGVR).Namespace(ns).Create(ctx, w, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
}

func newSecretsScenario() *secretsScenario {
	return &secretsScenario{authz: map[string]string{}, calls: map[string]int{}}
}

// TestContractSecretsUnderDefaults: with nothing configured (the shipped
// defaults, the shipped RBAC), webhook credentials in a namespace of the
// author's choosing are read and sent over https, and a customize hook may
// name Secrets, as upstream allows; upstream's webhook-auth and
// SecretPropagation examples depend on both.
func TestContractSecretsUnderDefaults(t *testing.T) {
	ctx := context.Background()
	inst := startMetabus(t, allinone.Config{}, nil)
	ns, secretNS := newNamespace(t), newNamespace(t)
	s := newSecretsScenario()
	s.start(t, inst, ns, secretNS, "defaults")
	for _, name := range []string{"bearer-authed", "basic-authed", "propagate-copy"} {
		eventually(t, 60*time.Second, "child "+name, func() error {
			_, err := kube.CoreV1().ConfigMaps(ns).Get(ctx, name, metav1.GetOptions{})
			return err
		})
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if got, want := s.authz["/bearer"], "Bearer tok-"+secretNS; got != want {
		t.Errorf("bearer hook saw Authorization %q, want %q", got, want)
	}
	if got := s.authz["/basic"]; got == "" || got[:6] != "Basic " {
		t.Errorf("basic hook saw Authorization %q, want Basic credentials", got)
	}
	if s.propagated != "c2VjcmV0" { // base64 of "secret", as a Secret's data is sent
		t.Errorf("the propagate hook saw the related Secret's value %q, want c2VjcmV0", s.propagated)
	}
}

// TestContractSecretsHardened: the same controllers under the hardened
// profile (Secrets from the dispatcher's own namespace only, no Secrets in
// related rules or controllers) are refused before anything is read or
// sent, each with a SyncError Event on the parent naming the setting that
// refused it, and the refused hooks receive nothing.
func TestContractSecretsHardened(t *testing.T) {
	ctx := context.Background()
	cfg := allinone.Config{
		Dispatcher: dispatcher.Config{SecretNamespaces: []string{}, RelatedResources: related.HardenedPolicy},
		Watcher:    watcher.Config{ControllerResources: related.HardenedPolicy},
	}
	inst := startMetabus(t, cfg, nil)
	ns, secretNS := newNamespace(t), newNamespace(t)
	s := newSecretsScenario()
	s.start(t, inst, ns, secretNS, "hardened")
	for parent, want := range map[string][]string{
		"bearer":    {"hook not called", fmt.Sprintf("Secret %s/hook-token", secretNS), "--secret-namespaces"},
		"basic":     {"hook not called", fmt.Sprintf("Secret %s/hook-basic", secretNS), "--secret-namespaces"},
		"propagate": {"relatedResources[0] (v1 secrets) refused", "--related-resources"},
	} {
		eventually(t, 60*time.Second, "a SyncError on "+parent, func() error {
			return warningEvent(ctx, ns, parent, "SyncError", want...)
		})
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, path := range []string{"/bearer", "/basic", "/propagate"} {
		if s.calls[path] != 0 {
			t.Errorf("%s: the hook received %d requests under the hardened profile, want none", path, s.calls[path])
		}
	}
}

// TestSuppressEchoesOptIn: the opt-in annotation brings back echo
// suppression for a controller whose hook is a fixpoint of its own writes
// (see TestOwnWritesCostNoHookCall for what it saves), and only for it: a
// controller without it beside it on the same installation is shown its
// own status write. After both parents settle, each is updated once: the
// plain hook must then be called with the status it answered, the
// opted-in one never.
func TestSuppressEchoesOptIn(t *testing.T) {
	ctx := context.Background()
	inst := startMetabus(t, allinone.Config{}, nil)
	ns := newNamespace(t)
	type counter struct {
		mu sync.Mutex
		// seen is the status.observedVersion each call was shown (0: none).
		seen []int64
	}
	hook := func(c *counter) func(req map[string]any) (int, any) {
		return func(req map[string]any) (int, any) {
			parent := &unstructured.Unstructured{Object: req["parent"].(map[string]any)}
			seen, _ := nestedInt(parent, "status", "observedVersion")
			c.mu.Lock()
			c.seen = append(c.seen, seen)
			c.mu.Unlock()
			v, _ := nestedInt(parent, "spec", "version")
			return 200, map[string]any{"status": map[string]any{"observedVersion": v}, "children": []any{}}
		}
	}
	var plain, opted counter
	modes := []struct {
		mode string
		c    *counter
		ann  map[string]string
	}{
		{mode: "plain", c: &plain},
		{mode: "opted", c: &opted, ann: map[string]string{bus.SuppressEchoesAnnotation: "true"}},
	}
	for _, m := range modes {
		createControllerWith(t, inst, compositeKind, "echo-"+m.mode, map[string]any{
			"parentResource": map[string]any{"apiVersion": "test.metabus.dev/v1", "resource": "widgets",
				"labelSelector": map[string]any{"matchLabels": map[string]any{"mode": m.mode}}},
			"childResources": []any{map[string]any{"apiVersion": "v1", "resource": "configmaps"}},
			"hooks":          map[string]any{"sync": map[string]any{"webhook": map[string]any{"url": hookServer(t, jsonHook(hook(m.c)))}}},
		}, m.ann)
		w := newWidget(m.mode, nil, 1)
		w.SetLabels(map[string]string{"mode": m.mode})
		if _, err := dyn.Resource(widgetsGVR).Namespace(ns).Create(ctx, w, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	waitObserved := func(mode string, v int64) {
		eventually(t, 30*time.Second, fmt.Sprintf("%s at observedVersion %d", mode, v), func() error {
			w, err := dyn.Resource(widgetsGVR).Namespace(ns).Get(ctx, mode, metav1.GetOptions{})
			if err != nil {
				return err
			}
			if got, _ := nestedInt(w, "status", "observedVersion"); got != v {
				return fmt.Errorf("status %v", w.Object["status"])
			}
			return nil
		})
	}
	for _, m := range modes {
		waitObserved(m.mode, 1)
	}
	time.Sleep(time.Second) // the first convergence's trailing calls
	for _, m := range modes {
		if _, err := dyn.Resource(widgetsGVR).Namespace(ns).Patch(ctx, m.mode, "application/merge-patch+json",
			[]byte(`{"spec":{"version":2}}`), metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	for _, m := range modes {
		waitObserved(m.mode, 2)
	}
	eventually(t, 30*time.Second, "the plain hook to be shown the status written from its answer", func() error {
		plain.mu.Lock()
		defer plain.mu.Unlock()
		if !slices.Contains(plain.seen, 2) {
			return fmt.Errorf("calls were shown observedVersion %v", plain.seen)
		}
		return nil
	})
	time.Sleep(2 * time.Second) // room for a call the echo would bring
	opted.mu.Lock()
	defer opted.mu.Unlock()
	if slices.Contains(opted.seen, 2) {
		t.Errorf("the opted-in hook was shown its own status write (calls were shown observedVersion %v)", opted.seen)
	}
}

// TestContractOneCallPerAnswer (issue 31): the writes of one answer come
// back to the hook in one call, never one call per write nor an
// intermediate state of them. A new parent whose hook creates three
// children and reports in status how many it was shown costs the
// contract's minimum, three calls: the first (nothing yet), the one that
// sees all three children with the first status, and the one that sees
// the second status and answers the same. Upstream's workqueue merges
// such writes by timing only; a build that calls once per write, or
// takes its snapshot before the answer's writes are all back, makes more
// calls or shows the hook one or two children.
func TestContractOneCallPerAnswer(t *testing.T) {
	ctx := context.Background()
	inst := startMetabus(t, allinone.Config{}, nil)
	ns := newNamespace(t)
	type shown struct{ children, status int64 }
	var (
		mu    sync.Mutex
		calls []shown
	)
	contractController(t, inst, "contract-merge", func(req map[string]any) (int, any) {
		parent := &unstructured.Unstructured{Object: req["parent"].(map[string]any)}
		app := parent.GetName()
		seen := int64(len(observedConfigMaps(req)))
		status, ok := nestedInt(parent, "status", "children")
		if !ok {
			status = -1
		}
		mu.Lock()
		calls = append(calls, shown{children: seen, status: status})
		mu.Unlock()
		return 200, map[string]any{
			"status": map[string]any{"children": seen},
			"children": []any{
				configMap(app+"-a", app, map[string]any{"k": "a"}),
				configMap(app+"-b", app, map[string]any{"k": "b"}),
				configMap(app+"-c", app, map[string]any{"k": "c"}),
			},
		}
	}, nil)
	if _, err := dyn.Resource(widgetsGVR).Namespace(ns).Create(ctx, newWidget("merge", nil, 1), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "status.children = 3", func() error {
		w, err := dyn.Resource(widgetsGVR).Namespace(ns).Get(ctx, "merge", metav1.GetOptions{})
		if err != nil {
			return err
		}
		if got, _ := nestedInt(w, "status", "children"); got != 3 {
			return fmt.Errorf("status %v", w.Object["status"])
		}
		return nil
	})
	time.Sleep(3 * time.Second) // room for any call the last status write would bring
	mu.Lock()
	defer mu.Unlock()
	want := []shown{{children: 0, status: -1}, {children: 3, status: 0}, {children: 3, status: 3}}
	if !slices.Equal(calls, want) {
		t.Errorf("calls were shown (children, status.children) %v, want %v", calls, want)
	}
}
