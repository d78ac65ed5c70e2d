package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"

	"github.com/metabus/metabus/pkg/api/v1alpha1"
	"github.com/metabus/metabus/pkg/apply"
	"github.com/metabus/metabus/pkg/childproc"
)

// The round trip runs upstream Metacontroller's own binary (MC_BIN, as
// hack/benchcmp takes it) on the three migrated controllers until they
// converge, stops it, starts metabus on what upstream left, then goes
// back to upstream on what metabus left. Each hand-over must recreate
// nothing and rewrite nothing; each side then carries on with a change.

// mcBinEnv names the upstream binary, as for make bench-compare.
const mcBinEnv = "MC_BIN"

// takeoverQuiet is how long the namespace must stay unwritten after the
// new controller's first hook call of every parent before the hand-over
// is judged: upstream says nothing else about when its syncs are done,
// and its writes follow its hook calls by milliseconds, which a loaded
// machine can stretch to seconds.
const takeoverQuiet = 5 * time.Second

// roundTripKinds are the kinds of every object the migrated controllers
// own or serve.
var roundTripKinds = []struct {
	kind string
	gvr  schema.GroupVersionResource
}{
	{"Widget", widgetsGVR}, {"RollSet", rollsetsGVR}, {"ConfigMap", configMapsGVR},
	{"Pod", podsGVR}, {"ControllerRevision", v1alpha1.ControllerRevisionGVR},
}

// snapshot is every object of roundTripKinds in a namespace, by
// "Kind name": whole objects, so that uid, resourceVersion, generation,
// managedFields, ownerReferences, finalizers, labels and annotations are
// all kept for comparison. The namespace's own ConfigMap
// (kube-root-ca.crt, owned by nobody) is left out.
type snapshot map[string]*unstructured.Unstructured

func takeSnapshot(ctx context.Context, t *testing.T, ns string) snapshot {
	t.Helper()
	out := snapshot{}
	for _, k := range roundTripKinds {
		list, err := dyn.Resource(k.gvr).Namespace(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatalf("list %s: %v", k.gvr.Resource, err)
		}
		for i := range list.Items {
			obj := &list.Items[i]
			if k.kind == "ConfigMap" && len(obj.GetOwnerReferences()) == 0 {
				continue
			}
			out[k.kind+" "+obj.GetName()] = obj
		}
	}
	return out
}

// versions is the resourceVersion of every object, for telling a settled
// namespace from a busy one.
func (s snapshot) versions() map[string]string {
	out := map[string]string{}
	for k, obj := range s {
		out[k] = string(obj.GetUID()) + "@" + obj.GetResourceVersion()
	}
	return out
}

// describe is one line per object: what the round trip records.
func (s snapshot) describe() string {
	keys := slices.Sorted(func(yield func(string) bool) {
		for k := range s {
			if !yield(k) {
				return
			}
		}
	})
	var b strings.Builder
	for _, k := range keys {
		obj := s[k]
		var managers, owners []string
		for _, m := range obj.GetManagedFields() {
			managers = append(managers, m.Manager+"/"+string(m.Operation))
		}
		for _, o := range obj.GetOwnerReferences() {
			owners = append(owners, o.Kind+"/"+o.Name)
		}
		fmt.Fprintf(&b, "  %s uid=%s rv=%s gen=%d finalizers=%v owners=%v managers=%v\n", k, obj.GetUID(),
			obj.GetResourceVersion(), obj.GetGeneration(), obj.GetFinalizers(), owners, managers)
	}
	return b.String()
}

// settle waits until two snapshots taken quiet apart are the same
// objects at the same resourceVersions, and returns the last.
func settle(ctx context.Context, t *testing.T, ns string, quiet time.Duration) snapshot {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	last := takeSnapshot(ctx, t, ns)
	for {
		time.Sleep(quiet)
		cur := takeSnapshot(ctx, t, ns)
		if cmp.Equal(last.versions(), cur.versions()) {
			return cur
		}
		if time.Now().After(deadline) {
			t.Fatalf("namespace %s still changing after 60s:\n%s", ns, cmp.Diff(last.versions(), cur.versions()))
		}
		last = cur
	}
}

// handedOverIntact fails the test for every object of before that who deleted,
// recreated (a new UID) or rewrote (a new resourceVersion), showing what
// changed, and for every object it created.
func handedOverIntact(t *testing.T, who string, before, after snapshot) {
	t.Helper()
	for k, b := range before {
		a, ok := after[k]
		switch {
		case !ok:
			t.Errorf("%s deleted %s", who, k)
		case a.GetUID() != b.GetUID():
			t.Errorf("%s recreated %s: uid %s → %s", who, k, b.GetUID(), a.GetUID())
		case a.GetResourceVersion() != b.GetResourceVersion():
			t.Errorf("%s rewrote %s: resourceVersion %s → %s (-before +after):\n%s", who, k,
				b.GetResourceVersion(), a.GetResourceVersion(), cmp.Diff(b.Object, a.Object))
		}
	}
	for k := range after {
		if _, ok := before[k]; !ok {
			t.Errorf("%s created %s", who, k)
		}
	}
}

// kubeletReady plays the kubelet: every Pod of ns that is not being
// deleted and not Ready yet is marked Ready.
func kubeletReady(ctx context.Context, ns string) error {
	pods, err := kube.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	for _, p := range pods.Items {
		if p.DeletionTimestamp != nil || podIsReady(&p) {
			continue
		}
		if err := setPodReady(ctx, ns, p.Name, p.UID, true); err != nil && err != errPodReplaced {
			return err
		}
	}
	return nil
}

func podIsReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue {
			return true
		}
	}
	return false
}

// roundTripConverged checks that every migrated parent is where its hook
// wants it, in the form both implementations write: the composite's two
// ConfigMaps and status at version, the decorator's label, attachment and
// status at version, the RollSet's replicas Pods, Ready, and its status
// with the Updated condition naming its one ControllerRevision; each
// parent holding exactly its controller's finalizer.
func roundTripConverged(ctx context.Context, ns string, version int64, replicas int) func() error {
	return func() error {
		if err := kubeletReady(ctx, ns); err != nil {
			return err
		}
		for _, k := range []string{"plain-a", "plain-b"} {
			if _, err := childIs(ctx, ns, k, map[string]string{"version": fmt.Sprint(version)}); err != nil {
				return err
			}
		}
		plain, err := plainStatusAt(ctx, ns, version)
		if err != nil {
			return err
		}
		deco, err := dyn.Resource(widgetsGVR).Namespace(ns).Get(ctx, "deco", metav1.GetOptions{})
		if err != nil {
			return err
		}
		if got := deco.GetLabels()["decorated"]; got != fmt.Sprintf("v%d", version) {
			return fmt.Errorf("deco: label decorated=%q", got)
		}
		if n, _ := nestedInt(deco, "status", "attachments"); n != 1 {
			return fmt.Errorf("deco: status %v", deco.Object["status"])
		}
		if _, err := childIs(ctx, ns, "deco-att", map[string]string{"version": fmt.Sprint(version)}); err != nil {
			return err
		}
		cats, err := dyn.Resource(rollsetsGVR).Namespace(ns).Get(ctx, "cats", metav1.GetOptions{})
		if err != nil {
			return err
		}
		pods, err := kube.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return err
		}
		var names []string
		for _, p := range pods.Items {
			if p.DeletionTimestamp != nil || !podIsReady(&p) {
				return fmt.Errorf("pod %s not settled (deleting %v)", p.Name, p.DeletionTimestamp != nil)
			}
			names = append(names, p.Name)
		}
		var want []string
		for i := range replicas {
			want = append(want, fmt.Sprintf("cats-%d", i))
		}
		sort.Strings(names)
		if !slices.Equal(names, want) {
			return fmt.Errorf("pods %v, want %v", names, want)
		}
		revs, err := dyn.Resource(v1alpha1.ControllerRevisionGVR).Namespace(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return err
		}
		if len(revs.Items) != 1 {
			return fmt.Errorf("%d ControllerRevisions, want 1", len(revs.Items))
		}
		status, _, _ := unstructured.NestedMap(cats.Object, "status")
		wantStatus := map[string]any{"replicas": replicas, "readyReplicas": replicas, "observedGeneration": cats.GetGeneration(),
			"conditions": []any{map[string]any{"type": "Updated", "status": "True", "reason": "OnLatestRevision",
				"message": "latest ControllerRevision: " + revs.Items[0].GetName()}}}
		if !equalJSONValues(status, wantStatus) {
			return fmt.Errorf("cats: status %v", status)
		}
		for _, p := range []struct {
			obj        *unstructured.Unstructured
			kind, ctrl string
		}{{plain, compositeKind, migratePlain}, {deco, decoratorKind, migrateDeco}, {cats, compositeKind, migrateRolling}} {
			if want := []string{upstreamFinalizer(p.kind, p.ctrl)}; !slices.Equal(p.obj.GetFinalizers(), want) {
				return fmt.Errorf("%s: finalizers %v, want %v", p.obj.GetName(), p.obj.GetFinalizers(), want)
			}
		}
		return nil
	}
}

// plainStatusAt checks the migrated composite's status: its two
// ConfigMaps and version seen by the hook, observedGeneration its
// generation; it returns the composite.
func plainStatusAt(ctx context.Context, ns string, version int64) (*unstructured.Unstructured, error) {
	if err := wantWidgetStatus(ctx, ns, "plain", 2, version)(); err != nil {
		return nil, err
	}
	plain, err := dyn.Resource(widgetsGVR).Namespace(ns).Get(ctx, "plain", metav1.GetOptions{})
	if err != nil {
		return nil, err
	}
	if og, _ := nestedInt(plain, "status", "observedGeneration"); og != plain.GetGeneration() {
		return nil, fmt.Errorf("plain: observedGeneration %d, generation %d", og, plain.GetGeneration())
	}
	return plain, nil
}

// roundTripChange changes every parent: the widgets to version, the
// RollSet to replicas.
func roundTripChange(ctx context.Context, t *testing.T, ns string, version int64, replicas int) {
	t.Helper()
	for _, p := range []struct {
		gvr        schema.GroupVersionResource
		name, body string
	}{
		{widgetsGVR, "plain", fmt.Sprintf(`{"spec":{"version":%d}}`, version)},
		{widgetsGVR, "deco", fmt.Sprintf(`{"spec":{"version":%d}}`, version)},
		{rollsetsGVR, "cats", fmt.Sprintf(`{"spec":{"replicas":%d}}`, replicas)},
	} {
		if _, err := dyn.Resource(p.gvr).Namespace(ns).Patch(ctx, p.name, types.MergePatchType, []byte(p.body), metav1.PatchOptions{}); err != nil {
			t.Fatalf("change %s: %v", p.name, err)
		}
	}
}

// carryOn changes every parent (roundTripChange), waits until who has
// converged on the change, and fails the test for every object of before
// that who recreated rather than updated in place.
func carryOn(ctx context.Context, t *testing.T, who, ns string, version int64, replicas int, before snapshot) {
	t.Helper()
	start := time.Now()
	roundTripChange(ctx, t, ns, version, replicas)
	eventually(t, 60*time.Second, who+"'s convergence on the change", roundTripConverged(ctx, ns, version, replicas))
	t.Logf("%s converged on the change in %s", who, time.Since(start).Round(time.Millisecond))
	for k, a := range takeSnapshot(ctx, t, ns) {
		if b, ok := before[k]; ok && a.GetUID() != b.GetUID() {
			t.Errorf("%s recreated %s while carrying on", who, k)
		}
	}
}

// upstreamRun is upstream Metacontroller's binary started for one test.
type upstreamRun struct {
	bin      string
	strategy apply.Strategy
	selector string
	dir      string
	n        int
}

// start runs upstream as hack/benchcmp does (childproc.StartUpstream),
// serving the controllers labelled for the test and applying with the
// test's strategy, and stops it when the test ends at the latest.
func (u *upstreamRun) start(t *testing.T) *childproc.Proc {
	t.Helper()
	u.n++
	logPath := filepath.Join(u.dir, fmt.Sprintf("upstream-%d.log", u.n))
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	p, err := childproc.StartUpstream(ctx, u.bin, env.Kubeconfig, logPath, []string{
		"--target-label-selector=metabus.dev/e2e=" + u.selector,
		"--apply-strategy=" + string(u.strategy),
		// As the e2e metabus instances: new resource types within seconds.
		"--discovery-interval=5s",
	})
	if err != nil {
		t.Fatalf("start upstream: %v", err)
	}
	t.Cleanup(func() {
		_ = p.Stop()
		if t.Failed() {
			logTail(t, p.LogPath())
		}
	})
	return p
}

// logTail logs the end of a log file.
func logTail(t *testing.T, path string) {
	data, err := os.ReadFile(path)
	if err != nil {
		t.Logf("%s: %v", path, err)
		return
	}
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	if len(lines) > 40 {
		lines = lines[len(lines)-40:]
	}
	t.Logf("last lines of %s:\n%s", path, strings.Join(lines, "\n"))
}

// TestMigrateUpstreamRoundTrip: upstream v4.17.2's own binary converges
// the three migrated controllers; metabus, started on what it left,
// recreates and rewrites nothing, then carries a change through; upstream,
// started again on what metabus left, recreates and rewrites nothing,
// then carries a change through and releases its finalizers on deletion.
// Without MC_BIN it is skipped; TestMigrateFromUpstream still shows
// metabus taking over upstream's state as upstream's source writes it.
func TestMigrateUpstreamRoundTrip(t *testing.T) {
	bin := os.Getenv(mcBinEnv)
	if bin == "" {
		t.Skip("MC_BIN is not set: the round trip with upstream Metacontroller's own binary is skipped " +
			"(make migrate-upstream MC_BIN=/path/to/metacontroller runs it; TestMigrateFromUpstream runs without it)")
	}
	if fi, err := os.Stat(bin); err != nil || fi.IsDir() || fi.Mode()&0o111 == 0 {
		t.Fatalf("MC_BIN=%s is not an executable file (%v)", bin, err)
	}
	for _, s := range applyStrategies {
		t.Run(string(s), func(t *testing.T) { testMigrateUpstreamRoundTrip(t, bin, s) })
	}
}

func testMigrateUpstreamRoundTrip(t *testing.T, bin string, s apply.Strategy) {
	ctx := context.Background()
	calls, urls := migrateHooks(t)
	ns := newNamespace(t)
	// Whatever happens, the parents must not keep the namespace forever
	// with finalizers nobody releases.
	t.Cleanup(func() { stripParentFinalizers(ns) })
	migrateControllers(t, urls)
	up := &upstreamRun{bin: bin, strategy: s, selector: selectorOf(t), dir: t.TempDir()}

	// 1. Upstream converges the parents from scratch.
	start := time.Now()
	upstream := up.start(t)
	for _, w := range []struct{ name, label string }{{"plain", "plain"}, {"deco", "deco"}} {
		obj := newWidget(w.name, []string{"a", "b"}, 1)
		if w.name == "deco" {
			obj = newWidget(w.name, []string{"x"}, 1)
		}
		obj.SetLabels(map[string]string{"migrate": w.label})
		if _, err := dyn.Resource(widgetsGVR).Namespace(ns).Create(ctx, obj, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	cats := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "test.metabus.dev/v1", "kind": "RollSet",
		"metadata": map[string]any{"name": "cats", "labels": map[string]any{"migrate": "rolling"}},
		"spec": map[string]any{"selector": map[string]any{"matchLabels": map[string]any{"app": "cats"}},
			"replicas": int64(2), "template": rollTemplate("cats", 1)},
	}}
	if _, err := dyn.Resource(rollsetsGVR).Namespace(ns).Create(ctx, cats, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 120*time.Second, "upstream's convergence", roundTripConverged(ctx, ns, 1, 2))
	t.Logf("upstream converged in %s", time.Since(start).Round(time.Millisecond))
	if err := upstream.Stop(); err != nil {
		t.Fatal(err)
	}
	left := settle(ctx, t, ns, 2*time.Second)
	t.Logf("upstream left (%s):\n%s", s, left.describe())

	// 2. Metabus takes over: it syncs every parent and writes nothing.
	calls.reset()
	start = time.Now()
	inst := startMetabus(t, strategyConfig(s), nil)
	eventually(t, 60*time.Second, "metabus's first sync of every parent", calls.calledFor("plain", "cats", "deco"))
	eventually(t, 30*time.Second, "the applies of those syncs", inst.settledAnswers(t, 3))
	took := settle(ctx, t, ns, takeoverQuiet)
	t.Logf("metabus took over in %s", time.Since(start).Round(time.Millisecond))
	handedOverIntact(t, "metabus at takeover", left, took)
	if s == apply.DynamicApply {
		if n := inst.counter(t, "metabus_applier_api_writes_total", nil); n != 0 {
			t.Errorf("metabus made %v API writes at takeover", n)
		}
	}
	if t.Failed() {
		t.FailNow()
	}

	// Metabus carries on: a new version, a third replica.
	carryOn(ctx, t, "metabus", ns, 2, 3, took)
	inst.stop()
	left = settle(ctx, t, ns, 2*time.Second)
	t.Logf("metabus left (%s):\n%s", s, left.describe())

	// 3. Back to upstream: it syncs every parent and writes nothing.
	calls.reset()
	start = time.Now()
	upstream = up.start(t)
	eventually(t, 60*time.Second, "upstream's first sync of every parent", calls.calledFor("plain", "cats", "deco"))
	took = settle(ctx, t, ns, takeoverQuiet)
	t.Logf("upstream took back over in %s", time.Since(start).Round(time.Millisecond))
	handedOverIntact(t, "upstream at takeover", left, took)
	if t.Failed() {
		t.FailNow()
	}

	// Upstream carries on: a new version, back to two replicas.
	carryOn(ctx, t, "upstream", ns, 3, 2, took)

	// Upstream runs the finalize hooks metabus's finalizers stand for.
	for _, p := range roundTripParents {
		if err := dyn.Resource(p.gvr).Namespace(ns).Delete(ctx, p.name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, 60*time.Second, "upstream releasing the parents' finalizers", parentsGone(ctx, ns))
	_ = upstream.Stop()
}

// roundTripParents are the migrated parents.
var roundTripParents = []struct {
	gvr  schema.GroupVersionResource
	name string
}{{widgetsGVR, "plain"}, {widgetsGVR, "deco"}, {rollsetsGVR, "cats"}}

// parentsGone returns nil once every migrated parent is deleted.
func parentsGone(ctx context.Context, ns string) func() error {
	return func() error {
		for _, p := range roundTripParents {
			obj, err := dyn.Resource(p.gvr).Namespace(ns).Get(ctx, p.name, metav1.GetOptions{})
			if apierrors.IsNotFound(err) {
				continue
			}
			if err != nil {
				return err
			}
			return fmt.Errorf("%s still there, finalizers %v", p.name, obj.GetFinalizers())
		}
		return nil
	}
}

// stripParentFinalizers removes whatever finalizers the migrated parents
// of ns still hold.
func stripParentFinalizers(ns string) {
	ctx := context.Background()
	for _, p := range roundTripParents {
		_, _ = dyn.Resource(p.gvr).Namespace(ns).Patch(ctx, p.name, types.MergePatchType,
			[]byte(`{"metadata":{"finalizers":null}}`), metav1.PatchOptions{})
	}
}
