package e2e

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"

	"github.com/metabus/metabus/internal/allinone"
)

// widgetHook returns one ConfigMap per spec.items entry, labelled to match
// the parent's selector (app=<parent name>), and reports the observed
// ConfigMaps and the spec.version it saw in status.
func widgetHook(calls *atomic.Int64) func(req map[string]any) (int, any) {
	return func(req map[string]any) (int, any) {
		if calls != nil {
			calls.Add(1)
		}
		parent := &unstructured.Unstructured{Object: req["parent"].(map[string]any)}
		items, _, _ := unstructured.NestedStringSlice(parent.Object, "spec", "items")
		version, _, _ := unstructured.NestedFieldNoCopy(parent.Object, "spec", "version")
		var children []any
		for _, it := range items {
			children = append(children, map[string]any{
				"apiVersion": "v1",
				"kind":       "ConfigMap",
				"metadata": map[string]any{
					"name":   parent.GetName() + "-" + it,
					"labels": map[string]any{"app": parent.GetName()},
				},
				"data": map[string]any{"item": it, "version": fmt.Sprint(version)},
			})
		}
		observed := 0
		if cm, ok := req["children"].(map[string]any)["ConfigMap.v1"].(map[string]any); ok {
			observed = len(cm)
		}
		return 200, map[string]any{
			"status":   map[string]any{"configMaps": observed, "version": version},
			"children": children,
		}
	}
}

func widgetController(t *testing.T, inst *instance, name, url, method string) {
	t.Helper()
	createController(t, inst, compositeKind, name, map[string]any{
		"parentResource": map[string]any{"apiVersion": "test.metabus.dev/v1", "resource": "widgets"},
		"childResources": []any{map[string]any{
			"apiVersion": "v1", "resource": "configmaps",
			"updateStrategy": map[string]any{"method": method},
		}},
		"hooks": map[string]any{"sync": map[string]any{"webhook": map[string]any{"url": url, "timeout": "5s"}}},
	})
}

func newWidget(name string, items []string, version int64) *unstructured.Unstructured {
	its := make([]any, len(items))
	for i, s := range items {
		its[i] = s
	}
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "test.metabus.dev/v1",
		"kind":       "Widget",
		"metadata":   map[string]any{"name": name},
		"spec": map[string]any{
			"selector": map[string]any{"matchLabels": map[string]any{"app": name}},
			"items":    its,
			"version":  version,
		},
	}}
}

func configMapNames(ctx context.Context, ns, app string) ([]string, error) {
	list, err := kube.CoreV1().ConfigMaps(ns).List(ctx, metav1.ListOptions{LabelSelector: "app=" + app})
	if err != nil {
		return nil, err
	}
	var names []string
	for _, cm := range list.Items {
		if cm.DeletionTimestamp == nil {
			names = append(names, cm.Name)
		}
	}
	sort.Strings(names)
	return names, nil
}

// TestChildrenConverge: a child deleted by someone else is recreated, a
// child the hook stops returning is deleted, and InPlace updates change a
// child without replacing it, in both apply strategies.
func TestChildrenConverge(t *testing.T) {
	withStrategies(t, testChildrenConverge)
}

func testChildrenConverge(t *testing.T, cfg allinone.Config) {
	ctx := context.Background()
	inst := startMetabus(t, cfg, nil)
	ns := newNamespace(t)
	url := hookServer(t, jsonHook(widgetHook(nil)))
	widgetController(t, inst, "widgets-converge", url, "InPlace")

	if _, err := dyn.Resource(widgetsGVR).Namespace(ns).Create(ctx, newWidget("w", []string{"a", "b", "c"}, 1), metav1.CreateOptions{}); err != nil {
		t.Fatalf("create widget: %v", err)
	}
	want := func(names ...string) func() error {
		return func() error {
			got, err := configMapNames(ctx, ns, "w")
			if err != nil {
				return err
			}
			if strings.Join(got, ",") != strings.Join(names, ",") {
				return fmt.Errorf("configmaps %v, want %v", got, names)
			}
			return nil
		}
	}
	eventually(t, 30*time.Second, "three children", want("w-a", "w-b", "w-c"))

	// Someone else deletes a child: it comes back (a new object).
	old, err := kube.CoreV1().ConfigMaps(ns).Get(ctx, "w-b", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := kube.CoreV1().ConfigMaps(ns).Delete(ctx, "w-b", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "the deleted child to be recreated", func() error {
		cm, err := kube.CoreV1().ConfigMaps(ns).Get(ctx, "w-b", metav1.GetOptions{})
		if err != nil {
			return err
		}
		if cm.UID == old.UID {
			return fmt.Errorf("same object")
		}
		return nil
	})

	// The hook stops returning a child: it is deleted.
	keep, err := kube.CoreV1().ConfigMaps(ns).Get(ctx, "w-a", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := dyn.Resource(widgetsGVR).Namespace(ns).Patch(ctx, "w", types.MergePatchType,
		[]byte(`{"spec":{"items":["a","b"],"version":2}}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "the undesired child to be deleted", want("w-a", "w-b"))

	// InPlace: w-a is updated, not replaced.
	eventually(t, 30*time.Second, "w-a updated in place", func() error {
		cm, err := kube.CoreV1().ConfigMaps(ns).Get(ctx, "w-a", metav1.GetOptions{})
		if err != nil {
			return err
		}
		if cm.Data["version"] != "2" {
			return fmt.Errorf("data %v", cm.Data)
		}
		if cm.UID != keep.UID {
			return fmt.Errorf("w-a was replaced")
		}
		return nil
	})
}

// TestBurstCoalesces: 50 quick updates to one parent end with the hook
// having seen the final state, in far fewer than 50 hook calls.
func TestBurstCoalesces(t *testing.T) {
	ctx := context.Background()
	inst := startMetabus(t, allinone.Config{}, nil)
	ns := newNamespace(t)
	var calls atomic.Int64
	var lastSeen atomic.Int64
	inner := widgetHook(&calls)
	url := hookServer(t, jsonHook(func(req map[string]any) (int, any) {
		if v, ok := req["parent"].(map[string]any)["spec"].(map[string]any)["version"].(float64); ok {
			lastSeen.Store(int64(v))
		}
		// A realistic hook takes a moment; updates pile up meanwhile.
		time.Sleep(50 * time.Millisecond)
		return inner(req)
	}))
	widgetController(t, inst, "widgets-burst", url, "InPlace")
	if _, err := dyn.Resource(widgetsGVR).Namespace(ns).Create(ctx, newWidget("burst", []string{"x"}, 0), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "the first sync", func() error {
		if calls.Load() == 0 {
			return fmt.Errorf("no hook call yet")
		}
		return nil
	})
	time.Sleep(300 * time.Millisecond)
	before := calls.Load()
	const updates = 50
	for i := 1; i <= updates; i++ {
		patch := fmt.Sprintf(`{"spec":{"version":%d}}`, i)
		if _, err := dyn.Resource(widgetsGVR).Namespace(ns).Patch(ctx, "burst", types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
			t.Fatalf("update %d: %v", i, err)
		}
	}
	eventually(t, 30*time.Second, "the hook to see the final state", func() error {
		if v := lastSeen.Load(); v != updates {
			return fmt.Errorf("hook last saw version %d", v)
		}
		return nil
	})
	eventually(t, 30*time.Second, "status to report the final version", func() error {
		w, err := dyn.Resource(widgetsGVR).Namespace(ns).Get(ctx, "burst", metav1.GetOptions{})
		if err != nil {
			return err
		}
		if v, _ := nestedInt(w, "status", "version"); v != updates {
			return fmt.Errorf("status %v", w.Object["status"])
		}
		return nil
	})
	time.Sleep(500 * time.Millisecond) // let trailing syncs (status write echo) finish
	n := calls.Load() - before
	t.Logf("%d updates to one parent caused %d hook calls", updates, n)
	if n >= updates/2 {
		t.Errorf("%d updates caused %d hook calls; want far fewer (work items must coalesce)", updates, n)
	}
}

// TestReplicasNeverOverlap: with 2 dispatchers and 2 appliers (separate NATS
// connections pulling the same partition consumers, snapshots over NATS)
// and 200 parents changing concurrently, no parent is ever synced or
// applied by two replicas at once, and every parent converges.
func TestReplicasNeverOverlap(t *testing.T) {
	ctx := context.Background()
	tracer := newOverlapTracer()
	inst := startMetabus(t, allinone.Config{Dispatchers: 2, Appliers: 2, SnapshotsOverNATS: true}, tracer.trace)
	ns := newNamespace(t)
	url := hookServer(t, jsonHook(func(req map[string]any) (int, any) {
		time.Sleep(time.Millisecond)
		return widgetHook(nil)(req)
	}))
	widgetController(t, inst, "widgets-replicas", url, "InPlace")

	const parents = 200
	const rounds = 3
	var wg sync.WaitGroup
	errs := make(chan error, parents)
	sem := make(chan struct{}, 16)
	for i := 0; i < parents; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			name := fmt.Sprintf("p%03d", i)
			if _, err := dyn.Resource(widgetsGVR).Namespace(ns).Create(ctx, newWidget(name, []string{"c"}, 0), metav1.CreateOptions{}); err != nil {
				errs <- err
				return
			}
			for r := 1; r <= rounds; r++ {
				patch := fmt.Sprintf(`{"spec":{"version":%d}}`, r)
				if _, err := dyn.Resource(widgetsGVR).Namespace(ns).Patch(ctx, name, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
					errs <- err
					return
				}
			}
		}(i)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("drive parents: %v", err)
	}
	start := time.Now()
	eventually(t, 120*time.Second, "every parent to converge", func() error {
		list, err := dyn.Resource(widgetsGVR).Namespace(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return err
		}
		pending := 0
		for i := range list.Items {
			v, _ := nestedInt(&list.Items[i], "status", "version")
			n, _ := nestedInt(&list.Items[i], "status", "configMaps")
			if v != rounds || n != 1 {
				pending++
			}
		}
		if len(list.Items) != parents || pending > 0 {
			return fmt.Errorf("%d of %d parents not converged", pending, len(list.Items))
		}
		cms, err := kube.CoreV1().ConfigMaps(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return err
		}
		updated := 0
		for _, cm := range cms.Items {
			if cm.Data["version"] == fmt.Sprint(rounds) {
				updated++
			}
		}
		if updated != parents {
			return fmt.Errorf("%d of %d children at the final version", updated, parents)
		}
		return nil
	})
	t.Logf("converged %s after the last update; %d sync/apply handlings traced, %d overlaps",
		time.Since(start).Round(time.Millisecond), tracer.calls.Load(), tracer.overlaps.Load())
	if n := tracer.overlaps.Load(); n != 0 {
		t.Errorf("%d times a parent was handled by two replicas at once: %v", n, tracer.where)
	}
	if tracer.calls.Load() == 0 {
		t.Errorf("tracer saw nothing: the test is not instrumented")
	}
}

// TestHookFailures: a hook answering 500, timing out, or returning malformed
// JSON gets a SyncError Event and is retried with backoff, while another
// controller keeps serving its parents.
func TestHookFailures(t *testing.T) {
	ctx := context.Background()
	inst := startMetabus(t, allinone.Config{}, nil)
	ns := newNamespace(t)

	var mu sync.Mutex
	callTimes := map[string][]time.Time{}
	record := func(req map[string]any) string {
		name := req["parent"].(map[string]any)["metadata"].(map[string]any)["name"].(string)
		mu.Lock()
		callTimes[name] = append(callTimes[name], time.Now())
		mu.Unlock()
		return name
	}
	bad := hookServer(t, jsonHook(func(req map[string]any) (int, any) {
		switch record(req) {
		case "fails":
			return 500, map[string]any{"error": "boom"}
		case "slow":
			time.Sleep(3 * time.Second) // longer than the 1s webhook timeout
			return 200, map[string]any{}
		default:
			return 200, []byte(`{"status": {"oops": `)
		}
	}))
	createController(t, inst, compositeKind, "widgets-broken", map[string]any{
		"parentResource": map[string]any{"apiVersion": "test.metabus.dev/v1", "resource": "widgets",
			"labelSelector": map[string]any{"matchExpressions": []any{map[string]any{"key": "health", "operator": "DoesNotExist"}}}},
		"childResources": []any{map[string]any{"apiVersion": "v1", "resource": "configmaps"}},
		"hooks":          map[string]any{"sync": map[string]any{"webhook": map[string]any{"url": bad, "timeout": "1s"}}},
	})
	for _, name := range []string{"fails", "slow", "malformed"} {
		if _, err := dyn.Resource(widgetsGVR).Namespace(ns).Create(ctx, newWidget(name, nil, 1), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	// A healthy controller for the widgets labelled health=good.
	good := hookServer(t, jsonHook(widgetHook(nil)))
	goodNS := newNamespace(t)
	createController(t, inst, compositeKind, "widgets-good", map[string]any{
		"parentResource": map[string]any{"apiVersion": "test.metabus.dev/v1", "resource": "widgets",
			"labelSelector": map[string]any{"matchLabels": map[string]any{"health": "good"}}},
		"childResources": []any{map[string]any{"apiVersion": "v1", "resource": "configmaps"}},
		"hooks":          map[string]any{"sync": map[string]any{"webhook": map[string]any{"url": good}}},
	})
	eventually(t, 30*time.Second, "SyncError events for each failing parent", func() error {
		evs, err := kube.CoreV1().Events(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return err
		}
		seen := map[string]string{}
		for _, e := range evs.Items {
			if e.Reason == "SyncError" && e.Type == "Warning" {
				seen[e.InvolvedObject.Name] = e.Message
			}
		}
		for _, name := range []string{"fails", "slow", "malformed"} {
			if _, ok := seen[name]; !ok {
				return fmt.Errorf("no SyncError event for %s yet (have %v)", name, seen)
			}
		}
		for name, msg := range seen {
			t.Logf("event on %s: %s", name, msg)
		}
		return nil
	})

	// Retries with growing gaps (1s, 2s, 4s...).
	eventually(t, 20*time.Second, "three attempts per failing parent", func() error {
		mu.Lock()
		defer mu.Unlock()
		for _, name := range []string{"fails", "slow", "malformed"} {
			if len(callTimes[name]) < 3 {
				return fmt.Errorf("%s called %d times", name, len(callTimes[name]))
			}
		}
		return nil
	})
	mu.Lock()
	for _, name := range []string{"fails", "malformed"} {
		ts := callTimes[name]
		g1, g2 := ts[1].Sub(ts[0]), ts[2].Sub(ts[1])
		t.Logf("%s: retry gaps %s, %s", name, g1.Round(time.Millisecond), g2.Round(time.Millisecond))
		// Backoff is 1s then 2s; schedules fire on whole seconds, so
		// each gap may be up to a second longer.
		if g1 < 900*time.Millisecond || g2 < 1800*time.Millisecond {
			t.Errorf("%s: retry gaps %s then %s; want exponential backoff from 1s", name, g1, g2)
		}
	}
	mu.Unlock()

	// Meanwhile the healthy controller serves its parent promptly.
	start := time.Now()
	w := newWidget("healthy", []string{"a"}, 7)
	w.SetLabels(map[string]string{"health": "good"})
	if _, err := dyn.Resource(widgetsGVR).Namespace(goodNS).Create(ctx, w, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 15*time.Second, "the healthy controller's child", func() error {
		_, err := kube.CoreV1().ConfigMaps(goodNS).Get(ctx, "healthy-a", metav1.GetOptions{})
		return err
	})
	t.Logf("healthy parent served in %s while the broken hook kept failing", time.Since(start).Round(time.Millisecond))
	// Nothing was written for the broken parents.
	for _, name := range []string{"fails", "slow", "malformed"} {
		w, err := dyn.Resource(widgetsGVR).Namespace(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if _, found := w.Object["status"]; found {
			t.Errorf("%s got a status although its hook never answered: %v", name, w.Object["status"])
		}
	}
}
