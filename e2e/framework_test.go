// Package e2e runs metabus end to end against a real kube-apiserver, etcd
// and kube-controller-manager (built from Go modules by hack/kubeenv) and a
// real embedded JetStream server.
package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/metabus/metabus/internal/allinone"
	"github.com/metabus/metabus/internal/testing/kubeenv"
	"github.com/metabus/metabus/pkg/api/v1alpha1"
	"github.com/metabus/metabus/pkg/obs"
)

var (
	env  *kubeenv.Env
	kube kubernetes.Interface
	dyn  dynamic.Interface
)

var (
	podsGVR       = schema.GroupVersionResource{Version: "v1", Resource: "pods"}
	configMapsGVR = schema.GroupVersionResource{Version: "v1", Resource: "configmaps"}
	helloGVR      = schema.GroupVersionResource{Group: "example.com", Version: "v1", Resource: "helloworlds"}
	widgetsGVR    = schema.GroupVersionResource{Group: "test.metabus.dev", Version: "v1", Resource: "widgets"}
)

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	var err error
	// Parent CRDs go in before kube-controller-manager starts: its garbage
	// collector only rediscovers resource types every 30s. The MapController
	// tests' too: installed later, the first of them waited up to those 30s
	// for the collector (ensureMapCRDs still checks that it works for them).
	env, err = kubeenv.Start(ctx, kubeenv.Options{
		CRDs: []string{"../deploy/crds", "testdata/crds", "testdata/mapcontroller/crds.yaml"},
		Log:  func(f string, a ...any) { fmt.Fprintf(os.Stderr, "kubeenv: "+f+"\n", a...) },
	})
	if err != nil {
		fmt.Fprintf(os.Stderr, "start control plane: %v\n", err)
		return 1
	}
	defer func() { _ = env.Stop() }()
	defer serviceBins.Remove()
	cfg := rest.CopyConfig(env.Config)
	cfg.QPS, cfg.Burst = 500, 1000
	kube = kubernetes.NewForConfigOrDie(cfg)
	dyn = dynamic.NewForConfigOrDie(cfg)
	if err := installProductionRBAC(ctx); err != nil {
		fmt.Fprintf(os.Stderr, "install the production RBAC: %v\n", err)
		return 1
	}
	return m.Run()
}

// instance is one running metabus (all stages in this process).
type instance struct {
	reg      *prometheus.Registry
	selector string
	nats     *server.Server
	url      string
	// stop stops it (at the latest when the test ends); it may be called
	// more than once.
	stop func()
}

// startMetabus runs metabus for the test. Each instance only serves
// controllers labelled for it, so instances of different tests never
// fight over a controller.
func startMetabus(t *testing.T, cfg allinone.Config, trace obs.Tracer) *instance {
	t.Helper()
	return startMetabusWith(t, cfg, trace, nil)
}

// startMetabusWith is startMetabus for tests and benchmarks, with an
// optional wrapper of metabus's API transport (benchmarks count requests).
func startMetabusWith(tb testing.TB, cfg allinone.Config, trace obs.Tracer, wrap func(http.RoundTripper) http.RoundTripper) *instance {
	tb.Helper()
	return startMetabusAs(tb, cfg, trace, wrap, serviceAccounts)
}

// identity is who metabus's services are to the API server.
type identity int

const (
	// serviceAccounts: each service impersonates its ServiceAccount,
	// bound by the RBAC deploy/ ships (installed by TestMain), as in a
	// real installation. Every test runs so.
	serviceAccounts identity = iota
	// superUser: the test's own admin credentials. Benchmarks only, so
	// that their API-server CPU figures stay comparable with those
	// recorded before (impersonation adds an authorization per request).
	superUser
)

// startMetabusAs is startMetabusWith with the services' identity.
func startMetabusAs(tb testing.TB, cfg allinone.Config, trace obs.Tracer, wrap func(http.RoundTripper) http.RoundTripper, who identity) *instance {
	tb.Helper()
	return startMetabusDeps(tb, cfg, trace, wrap, who, nil)
}

// startMetabusDeps is startMetabusAs with a last say on the process's
// dependencies (e.g. each service's own NATS user).
func startMetabusDeps(tb testing.TB, cfg allinone.Config, trace obs.Tracer, wrap func(http.RoundTripper) http.RoundTripper, who identity, edit func(*allinone.Deps)) *instance {
	tb.Helper()
	inst := &instance{reg: prometheus.NewRegistry(), selector: selectorOf(tb)}
	cfg.Watcher.TargetLabelSelector = "metabus.dev/e2e=" + inst.selector
	if cfg.Watcher.DiscoveryInterval == 0 {
		cfg.Watcher.DiscoveryInterval = 5 * time.Second
	}
	if cfg.Applier.DiscoveryInterval == 0 {
		cfg.Applier.DiscoveryInterval = 5 * time.Second
	}
	cfg.Listen = ""
	ctx, cancel := context.WithCancel(context.Background())
	started := make(chan struct{})
	done := make(chan error, 1)
	level := zap.InfoLevel
	if _, bench := tb.(*testing.B); bench {
		level = zap.WarnLevel // per-sync logs would be what we measure
	}
	log := zaptest.NewLogger(tb, zaptest.Level(level))
	rc := rest.CopyConfig(env.Config)
	rc.QPS, rc.Burst = 500, 1000
	rc.WrapTransport = wrap
	deps := allinone.Deps{
		REST: rc, Log: log, Metrics: inst.reg, Trace: trace,
		Started: func(s *server.Server, url string) { inst.nats, inst.url = s, url; close(started) },
	}
	if who == serviceAccounts {
		deps.ServiceREST = asServiceAccounts(rc)
	}
	if edit != nil {
		edit(&deps)
	}
	go func() { done <- allinone.Run(ctx, cfg, deps) }()
	select {
	case <-started:
	case err := <-done:
		cancel()
		tb.Fatalf("metabus did not start: %v", err)
	case <-time.After(60 * time.Second):
		cancel()
		tb.Fatal("metabus did not start in 60s")
	}
	var once sync.Once
	inst.stop = func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				if err != nil {
					tb.Errorf("metabus stopped with error: %v", err)
				}
			case <-time.After(30 * time.Second):
				tb.Errorf("metabus did not stop in 30s")
			}
		})
	}
	tb.Cleanup(inst.stop)
	return inst
}

// waitsInParallel marks a test that spends most of its time waiting (for
// a redelivery, a retention, other processes) rather than on the CPU, and
// changes no cluster-wide object (no ClusterRole narrowed, no shared
// controller): it runs beside the other such tests (go test's -parallel,
// 2 on 2 cores), after every serial test is done, so that no serial test's
// RBAC change or quiet window sees it. Each has its own label, namespace
// and NATS, as every test does.
func waitsInParallel(t *testing.T) {
	t.Helper()
	t.Parallel()
}

// selectorOf is the value of the metabus.dev/e2e label of the controllers
// the instances a test starts serve: one per test, so that a test can
// create its controllers before it starts metabus, or stop it and start
// another one that serves them.
func selectorOf(tb testing.TB) string {
	label := strings.ToLower(strings.NewReplacer("/", "-", "_", "-", "=", "-").Replace(tb.Name()))
	if len(label) > 63 {
		label = label[:63]
	}
	return strings.Trim(label, "-")
}

// label returns the label that makes a controller served by inst.
func (inst *instance) label() map[string]string {
	return map[string]string{"metabus.dev/e2e": inst.selector}
}

// counter sums a counter metric over the series whose labels include want.
func (inst *instance) counter(tb testing.TB, name string, want map[string]string) float64 {
	tb.Helper()
	mfs, err := inst.reg.Gather()
	if err != nil {
		tb.Fatalf("gather metrics: %v", err)
	}
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			if matchLabels(m, want) {
				sum += m.GetCounter().GetValue()
			}
		}
	}
	return sum
}

// settledAnswers waits (for eventually) until at least n hook answers
// were settled: applied by an applier, or settled unpublished by the
// dispatcher because they would write nothing (result "unchanged").
func (inst *instance) settledAnswers(tb testing.TB, n float64) func() error {
	return func() error {
		applies := inst.counter(tb, "metabus_applier_applies_total", nil)
		unchanged := inst.counter(tb, "metabus_dispatcher_syncs_total", map[string]string{"result": "unchanged"})
		if applies+unchanged < n {
			return fmt.Errorf("%v applies and %v answers settled unchanged, want %v in all", applies, unchanged, n)
		}
		return nil
	}
}

func matchLabels(m *dto.Metric, want map[string]string) bool {
	for k, v := range want {
		found := false
		for _, lp := range m.GetLabel() {
			if lp.GetName() == k && lp.GetValue() == v {
				found = true
			}
		}
		if !found {
			return false
		}
	}
	return true
}

// newNamespace creates a namespace for the test and waits for its default
// ServiceAccount (Pods are rejected without it).
func newNamespace(t *testing.T) string {
	t.Helper()
	ctx := context.Background()
	ns, err := kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "e2e-"}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create namespace: %v", err)
	}
	t.Cleanup(func() { cleanNamespace(ns.Name) })
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := env.WaitForDefaultServiceAccount(wctx, ns.Name); err != nil {
		t.Fatalf("wait for default service account: %v", err)
	}
	return ns.Name
}

// testParents are the parent resources tests create. They are deleted (and
// waited for) before the namespace, because namespace deletion takes
// seconds and the next test's controllers, which select parents in every
// namespace, must not see leftovers.
var testParents = []schema.GroupVersionResource{widgetsGVR, helloGVR,
	{Group: "test.metabus.dev", Version: "v1", Resource: "gadgets"}}

func cleanNamespace(ns string) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for _, gvr := range testParents {
		_ = dyn.Resource(gvr).Namespace(ns).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{})
	}
	for ctx.Err() == nil {
		left := 0
		for _, gvr := range testParents {
			if l, err := dyn.Resource(gvr).Namespace(ns).List(ctx, metav1.ListOptions{}); err == nil {
				left += len(l.Items)
			}
		}
		if left == 0 {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	_ = kube.CoreV1().Namespaces().Delete(context.Background(), ns, metav1.DeleteOptions{})
}

// hookServer serves h on a loopback URL for the test's lifetime.
func hookServer(t testing.TB, h http.Handler) string {
	t.Helper()
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv.URL
}

// eventually polls f until it returns nil or timeout passes.
func eventually(t testing.TB, timeout time.Duration, what string, f func() error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	var err error
	for {
		if err = f(); err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s: %v", timeout, what, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// The controller kinds tests create, by the name their objects carry.
const (
	compositeKind = v1alpha1.CompositeControllerKind
	decoratorKind = v1alpha1.DecoratorControllerKind
)

// controllerGVRs resolves a controller kind to its resource. It is the
// tests' own table, not the product's, so that a wrong row there cannot
// make the tests agree with it.
var controllerGVRs = map[string]schema.GroupVersionResource{
	compositeKind: v1alpha1.CompositeControllerGVR,
	decoratorKind: v1alpha1.DecoratorControllerGVR,
}

// createController creates a controller of any kind, served by inst (it
// carries inst's label), and deletes it when the test ends.
func createController(t testing.TB, inst *instance, kind, name string, spec map[string]any) *unstructured.Unstructured {
	t.Helper()
	return createControllerWith(t, inst, kind, name, spec, nil)
}

// createControllerWith is createController with annotations on the
// controller object (metabus extensions such as bus.SuppressEchoesAnnotation).
func createControllerWith(t testing.TB, inst *instance, kind, name string, spec map[string]any, annotations map[string]string) *unstructured.Unstructured {
	t.Helper()
	gvr, ok := controllerGVRs[kind]
	if !ok {
		t.Fatalf("createController: unknown controller kind %q", kind)
	}
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": v1alpha1.GroupVersion.String(),
		"kind":       kind,
		"metadata":   map[string]any{"name": name},
		"spec":       spec,
	}}
	u.SetLabels(inst.label())
	if len(annotations) > 0 {
		u.SetAnnotations(annotations)
	}
	out, err := dyn.Resource(gvr).Create(context.Background(), u, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create %s %s: %v", kind, name, err)
	}
	t.Cleanup(func() {
		_ = dyn.Resource(gvr).Delete(context.Background(), out.GetName(), metav1.DeleteOptions{})
	})
	return out
}

// jsonHook adapts a function of the decoded request to a JSON webhook.
func jsonHook(f func(req map[string]any) (int, any)) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req map[string]any
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		code, resp := f(req)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(code)
		if b, ok := resp.([]byte); ok {
			_, _ = w.Write(b)
			return
		}
		_ = json.NewEncoder(w).Encode(resp)
	})
}

// overlapTracer detects two replicas handling the same parent at once.
type overlapTracer struct {
	mu       sync.Mutex
	active   map[string]int
	overlaps atomic.Int64
	calls    atomic.Int64
	where    []string
}

func newOverlapTracer() *overlapTracer { return &overlapTracer{active: map[string]int{}} }

func (o *overlapTracer) trace(stage, uid string) func() {
	key := stage + "/" + uid
	o.calls.Add(1)
	o.mu.Lock()
	o.active[key]++
	if o.active[key] > 1 {
		o.overlaps.Add(1)
		o.where = append(o.where, key)
	}
	o.mu.Unlock()
	return func() {
		o.mu.Lock()
		o.active[key]--
		o.mu.Unlock()
	}
}

func nestedString(obj *unstructured.Unstructured, path ...string) string {
	s, _, _ := unstructured.NestedString(obj.Object, path...)
	return s
}

func nestedInt(obj *unstructured.Unstructured, path ...string) (int64, bool) {
	v, found, err := unstructured.NestedFieldNoCopy(obj.Object, path...)
	if err != nil || !found {
		return 0, false
	}
	switch n := v.(type) {
	case int64:
		return n, true
	case float64:
		return int64(n), true
	}
	return 0, false
}

// createRaw creates any object through the dynamic client, resolving its
// resource from the tables the tests use.
func createRaw(t *testing.T, obj map[string]any) {
	t.Helper()
	u := &unstructured.Unstructured{Object: obj}
	var gvr schema.GroupVersionResource
	switch u.GetKind() {
	case "CompositeController":
		gvr = v1alpha1.CompositeControllerGVR
	case "Gadget":
		gvr = schema.GroupVersionResource{Group: "test.metabus.dev", Version: "v1", Resource: "gadgets"}
	default:
		t.Fatalf("createRaw: unknown kind %s", u.GetKind())
	}
	ri := dyn.Resource(gvr)
	var err error
	if ns := u.GetNamespace(); ns != "" {
		_, err = ri.Namespace(ns).Create(context.Background(), u, metav1.CreateOptions{})
	} else {
		_, err = ri.Create(context.Background(), u, metav1.CreateOptions{})
		t.Cleanup(func() { _ = ri.Delete(context.Background(), u.GetName(), metav1.DeleteOptions{}) })
	}
	if err != nil {
		t.Fatalf("create %s %s: %v", u.GetKind(), u.GetName(), err)
	}
}

// warningEvent returns nil once a Warning Event with reason on the object
// ns/name has a message containing every one of want.
func warningEvent(ctx context.Context, ns, name, reason string, want ...string) error {
	evs, err := kube.CoreV1().Events(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	for _, e := range evs.Items {
		if e.InvolvedObject.Name != name || e.Reason != reason || e.Type != corev1.EventTypeWarning {
			continue
		}
		ok := true
		for _, w := range want {
			ok = ok && strings.Contains(e.Message, w)
		}
		if ok {
			return nil
		}
	}
	return fmt.Errorf("no %s Event on %s/%s mentioning %q yet", reason, ns, name, want)
}
