package e2e

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"

	"github.com/metabus/metabus/internal/allinone"
	"github.com/metabus/metabus/pkg/apply"
	"github.com/metabus/metabus/services/applier"
)

// applyStrategies are the --apply-strategy values the apply contract runs
// in: the tests that exercise child writes (create, update by every
// method, delete, status, a rolling update) run once per strategy.
var applyStrategies = []apply.Strategy{apply.DynamicApply, apply.ServerSideApply}

// withStrategies runs f once per apply strategy, as subtests named after
// it, with the all-in-one configured for it.
func withStrategies(t *testing.T, f func(t *testing.T, cfg allinone.Config)) {
	for _, s := range applyStrategies {
		t.Run(string(s), func(t *testing.T) { f(t, strategyConfig(s)) })
	}
}

func strategyConfig(s apply.Strategy) allinone.Config {
	return allinone.Config{Applier: applier.Config{Strategy: s}}
}

// updateMethods are the non-rolling update methods, each served by its own
// CompositeController of widgets labelled method=<method>.
var updateMethods = []string{"InPlace", "Recreate", "OnDelete"}

// noteHook is widgetHook with an optional field: data.note is returned
// only while the parent's spec.note is set, so a hook that stops sending a
// field can be played.
func noteHook(req map[string]any) (int, any) {
	code, resp := widgetHook(nil)(req)
	note, _, _ := unstructured.NestedString(req, "parent", "spec", "note")
	for _, c := range resp.(map[string]any)["children"].([]any) {
		if note != "" {
			c.(map[string]any)["data"].(map[string]any)["note"] = note
		}
	}
	return code, resp
}

// methodControllers creates one CompositeController per update method,
// each for the widgets labelled with its method.
func methodControllers(t *testing.T, inst *instance, prefix, url string) {
	t.Helper()
	for _, m := range updateMethods {
		createController(t, inst, compositeKind, prefix+"-"+strings.ToLower(m), map[string]any{
			"parentResource": map[string]any{"apiVersion": "test.metabus.dev/v1", "resource": "widgets",
				"labelSelector": map[string]any{"matchLabels": map[string]any{"method": m}}},
			"childResources": []any{map[string]any{"apiVersion": "v1", "resource": "configmaps",
				"updateStrategy": map[string]any{"method": m}}},
			"hooks": map[string]any{"sync": map[string]any{"webhook": map[string]any{"url": url, "timeout": "5s"}}},
		})
	}
}

// methodWidget is the widget of method m: items, version 1, spec.note.
func methodWidget(t *testing.T, ns, m string, items []string, note string) string {
	t.Helper()
	name := "w-" + strings.ToLower(m)
	w := newWidget(name, items, 1)
	w.SetLabels(map[string]string{"method": m})
	if note != "" {
		w.Object["spec"].(map[string]any)["note"] = note
	}
	if _, err := dyn.Resource(widgetsGVR).Namespace(ns).Create(context.Background(), w, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	return name
}

// childIs checks a ConfigMap child's data (a "" value: absent).
func childIs(ctx context.Context, ns, name string, data map[string]string) (*corev1.ConfigMap, error) {
	cm, err := kube.CoreV1().ConfigMaps(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return nil, err
	}
	for k, v := range data {
		if got, ok := cm.Data[k]; (v == "" && ok) || (v != "" && got != v) {
			return cm, fmt.Errorf("%s: data %v, want %s=%q", name, cm.Data, k, v)
		}
	}
	return cm, nil
}

// otherTeamApplies sets fields on a child under another field manager, as
// a team's own tooling would: a label and a data key metabus's hook never
// returns.
func otherTeamApplies(t *testing.T, ns, name string) {
	t.Helper()
	body := fmt.Sprintf(`{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":%q,"namespace":%q,"labels":{"team":"other"}},"data":{"extra":"kept"}}`, name, ns)
	if _, err := dyn.Resource(configMapsGVR).Namespace(ns).Patch(context.Background(), name, types.ApplyPatchType, []byte(body),
		metav1.PatchOptions{FieldManager: "other-team"}); err != nil {
		t.Fatalf("the other team's apply on %s: %v", name, err)
	}
}

// othersKept checks that the other team's fields are on cm.
func othersKept(cm *corev1.ConfigMap) error {
	if cm.Labels["team"] != "other" || cm.Data["extra"] != "kept" {
		return fmt.Errorf("%s lost the other team's fields: labels %v, data %v", cm.Name, cm.Labels, cm.Data)
	}
	return nil
}

// versions records the resourceVersion of objects, to show that nothing
// wrote them.
func versions(ctx context.Context, t *testing.T, ns string) map[string]string {
	t.Helper()
	out := map[string]string{}
	cms, err := kube.CoreV1().ConfigMaps(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, cm := range cms.Items {
		if len(cm.OwnerReferences) > 0 {
			out["ConfigMap "+cm.Name] = cm.ResourceVersion
		}
	}
	ws, err := dyn.Resource(widgetsGVR).Namespace(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range ws.Items {
		out["Widget "+w.GetName()] = w.GetResourceVersion()
	}
	return out
}

// TestContractApply runs the child-write contract in both strategies:
// children are created; a field another manager sets is kept and costs
// no write; a hook answer that changes a value and drops a field updates
// an InPlace child in place (the field removed, the other manager's kept),
// recreates a Recreate child and leaves an OnDelete one; a child no longer
// returned is deleted; the parent's status follows.
func TestContractApply(t *testing.T) {
	withStrategies(t, func(t *testing.T, cfg allinone.Config) {
		ctx := context.Background()
		inst := startMetabus(t, cfg, nil)
		ns := newNamespace(t)
		methodControllers(t, inst, "contract", hookServer(t, jsonHook(noteHook)))
		for _, m := range updateMethods {
			methodWidget(t, ns, m, []string{"a", "b"}, "first")
		}
		uids := map[string]types.UID{}
		for _, m := range updateMethods {
			w := "w-" + strings.ToLower(m)
			for _, it := range []string{"a", "b"} {
				name := w + "-" + it
				eventually(t, 30*time.Second, name+" created", func() error {
					cm, err := childIs(ctx, ns, name, map[string]string{"item": it, "version": "1", "note": "first"})
					if err == nil {
						uids[name] = cm.UID
					}
					return err
				})
				otherTeamApplies(t, ns, name)
			}
			eventually(t, 30*time.Second, w+"'s status", wantWidgetStatus(ctx, ns, w, 2, 1))
		}

		// The other team's writes come back as events: the syncs they
		// cause must write nothing.
		time.Sleep(time.Second)
		before := versions(ctx, t, ns)
		time.Sleep(3 * time.Second)
		if after := versions(ctx, t, ns); !mapsEqual(before, after) {
			t.Errorf("metabus wrote although nothing changed:\n before %v\n after  %v", before, after)
		}

		// A new answer: version 2, no note, item b gone.
		for _, m := range updateMethods {
			if _, err := dyn.Resource(widgetsGVR).Namespace(ns).Patch(ctx, "w-"+strings.ToLower(m), types.MergePatchType,
				[]byte(`{"spec":{"items":["a"],"version":2,"note":null}}`), metav1.PatchOptions{}); err != nil {
				t.Fatal(err)
			}
		}
		for _, m := range updateMethods {
			w := "w-" + strings.ToLower(m)
			eventually(t, 30*time.Second, w+"-b deleted", func() error {
				if _, err := kube.CoreV1().ConfigMaps(ns).Get(ctx, w+"-b", metav1.GetOptions{}); err == nil {
					return fmt.Errorf("%s-b still there", w)
				}
				return nil
			})
			eventually(t, 30*time.Second, w+"'s status", wantWidgetStatus(ctx, ns, w, 1, 2))
		}
		eventually(t, 30*time.Second, "the InPlace child updated in place", func() error {
			cm, err := childIs(ctx, ns, "w-inplace-a", map[string]string{"version": "2", "note": ""})
			if err != nil {
				return err
			}
			if cm.UID != uids["w-inplace-a"] {
				return fmt.Errorf("replaced")
			}
			return othersKept(cm)
		})
		eventually(t, 30*time.Second, "the Recreate child recreated", func() error {
			cm, err := childIs(ctx, ns, "w-recreate-a", map[string]string{"version": "2", "note": ""})
			if err != nil {
				return err
			}
			if cm.UID == uids["w-recreate-a"] {
				return fmt.Errorf("not recreated")
			}
			return nil
		})
		cm, err := childIs(ctx, ns, "w-ondelete-a", map[string]string{"version": "1", "note": "first"})
		if err != nil || cm.UID != uids["w-ondelete-a"] {
			t.Errorf("the OnDelete child was changed: %v", err)
		} else if err := othersKept(cm); err != nil {
			t.Error(err)
		}
		applies := inst.counter(t, "metabus_applier_api_writes_total", map[string]string{"verb": "apply"})
		if ssa := cfg.Applier.Strategy == apply.ServerSideApply; ssa != (applies > 0) {
			t.Errorf("%s made %v server-side applies", cfg.Applier.Strategy, applies)
		}
	})
}

// wantWidgetStatus checks a widget's status: the children its hook saw and
// the version.
func wantWidgetStatus(ctx context.Context, ns, name string, configMaps, version int64) func() error {
	return func() error {
		w, err := dyn.Resource(widgetsGVR).Namespace(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		n, _ := nestedInt(w, "status", "configMaps")
		v, _ := nestedInt(w, "status", "version")
		if n != configMaps || v != version {
			return fmt.Errorf("%s status %v, want configMaps %d, version %d", name, w.Object["status"], configMaps, version)
		}
		return nil
	}
}

func mapsEqual(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

// hookCalls counts the hook calls per parent name, for a test to wait
// until a newly started installation has synced every parent.
type hookCalls struct {
	mu sync.Mutex
	n  map[string]int
}

func (h *hookCalls) wrap(f func(map[string]any) (int, any)) func(map[string]any) (int, any) {
	return func(req map[string]any) (int, any) {
		name, _, _ := unstructured.NestedString(req, "parent", "metadata", "name")
		if name == "" { // a decorator's target
			name, _, _ = unstructured.NestedString(req, "object", "metadata", "name")
		}
		h.mu.Lock()
		h.n[name]++
		h.mu.Unlock()
		return f(req)
	}
}

func (h *hookCalls) reset() {
	h.mu.Lock()
	h.n = map[string]int{}
	h.mu.Unlock()
}

func (h *hookCalls) calledFor(names ...string) func() error {
	return func() error {
		h.mu.Lock()
		defer h.mu.Unlock()
		for _, n := range names {
			if h.n[n] == 0 {
				return fmt.Errorf("no hook call for %s yet", n)
			}
		}
		return nil
	}
}

// lastApplied reports whether a child carries dynamic apply's annotation.
func lastApplied(ctx context.Context, ns, name string) (bool, error) {
	cm, err := kube.CoreV1().ConfigMaps(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return false, err
	}
	_, ok := cm.Annotations[apply.LastAppliedAnnotation]
	return ok, nil
}

// TestContractStrategySwitch: an installation switched from dynamic apply to
// server-side apply and back, while it runs (stopped and started with the
// other strategy, nothing else changed), recreates no child and loses no
// field another field manager set, for every update method; after each
// switch a changed answer converges as usual. A Recreate child that
// server-side apply recreated (without dynamic apply's annotation) is not
// recreated again by dynamic apply for the annotation alone.
func TestContractStrategySwitch(t *testing.T) {
	ctx := context.Background()
	calls := &hookCalls{n: map[string]int{}}
	url := hookServer(t, jsonHook(calls.wrap(noteHook)))
	ns := newNamespace(t)
	widgets := []string{"w-inplace", "w-recreate", "w-ondelete"}
	children := []string{"w-inplace-a", "w-recreate-a", "w-ondelete-a"}

	phase := func(s apply.Strategy, first bool) *instance {
		t.Helper()
		calls.reset()
		inst := startMetabus(t, strategyConfig(s), nil)
		if first {
			methodControllers(t, inst, "switch", url)
			for _, m := range updateMethods {
				methodWidget(t, ns, m, []string{"a"}, "")
			}
		}
		eventually(t, 30*time.Second, fmt.Sprintf("%s: a sync of every parent", s), calls.calledFor(widgets...))
		return inst
	}
	uidsOf := func() map[string]types.UID {
		out := map[string]types.UID{}
		for _, c := range children {
			cm, err := kube.CoreV1().ConfigMaps(ns).Get(ctx, c, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			out[c] = cm.UID
		}
		return out
	}
	check := func(when string, uids map[string]types.UID) {
		t.Helper()
		for _, c := range children {
			cm, err := kube.CoreV1().ConfigMaps(ns).Get(ctx, c, metav1.GetOptions{})
			if err != nil {
				t.Fatalf("%s: %v", when, err)
			}
			if cm.UID != uids[c] {
				t.Errorf("%s: %s was recreated", when, c)
			}
			if err := othersKept(cm); err != nil {
				t.Errorf("%s: %v", when, err)
			}
		}
	}

	// Dynamic apply: the children, and the other team's fields on them.
	dynamic := phase(apply.DynamicApply, true)
	for _, c := range children {
		eventually(t, 30*time.Second, c+" created", func() error { _, err := childIs(ctx, ns, c, map[string]string{"version": "1"}); return err })
		otherTeamApplies(t, ns, c)
	}
	uids := uidsOf()
	dynamic.stop()

	// Server-side apply takes over: the InPlace child loses dynamic
	// apply's annotation with its first apply (as upstream), the Recreate
	// child's dry run finds nothing to change.
	ssa := phase(apply.ServerSideApply, false)
	eventually(t, 30*time.Second, "the InPlace child applied server-side", func() error {
		if has, err := lastApplied(ctx, ns, "w-inplace-a"); err != nil || has {
			return fmt.Errorf("annotation still there (%v)", err)
		}
		return nil
	})
	eventually(t, 30*time.Second, "the Recreate child's dry run", func() error {
		if n := ssa.counter(t, "metabus_applier_api_writes_total", map[string]string{"verb": "apply_dry_run"}); n < 1 {
			return fmt.Errorf("no dry run yet")
		}
		return nil
	})
	time.Sleep(time.Second)
	check("after the switch to server-side apply", uids)

	// A changed answer converges: InPlace in place, Recreate recreated
	// (by server-side apply, so without the annotation).
	for _, w := range widgets[:2] {
		if _, err := dyn.Resource(widgetsGVR).Namespace(ns).Patch(ctx, w, types.MergePatchType, []byte(`{"spec":{"version":2}}`), metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, 30*time.Second, "the InPlace child at version 2", func() error {
		cm, err := childIs(ctx, ns, "w-inplace-a", map[string]string{"version": "2"})
		if err != nil {
			return err
		}
		return othersKept(cm)
	})
	eventually(t, 30*time.Second, "the Recreate child recreated at version 2", func() error {
		cm, err := childIs(ctx, ns, "w-recreate-a", map[string]string{"version": "2"})
		if err == nil && cm.UID == uids["w-recreate-a"] {
			return fmt.Errorf("not recreated yet")
		}
		return err
	})
	if has, err := lastApplied(ctx, ns, "w-recreate-a"); err != nil || has {
		t.Fatalf("the child server-side apply created carries dynamic apply's annotation (%v)", err)
	}
	otherTeamApplies(t, ns, "w-recreate-a")
	uids = uidsOf()
	ssa.stop()

	// Back to dynamic apply: it records its annotation in place on both
	// children (the Recreate one included: never recreated for it).
	dynamic = phase(apply.DynamicApply, false)
	for _, c := range children[:2] {
		eventually(t, 30*time.Second, c+" recorded by dynamic apply", func() error {
			if has, err := lastApplied(ctx, ns, c); err != nil || !has {
				return fmt.Errorf("no annotation yet (%v)", err)
			}
			return nil
		})
	}
	check("after the switch back to dynamic apply", uids)
	if _, err := dyn.Resource(widgetsGVR).Namespace(ns).Patch(ctx, "w-inplace", types.MergePatchType, []byte(`{"spec":{"version":3}}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "the InPlace child at version 3", func() error {
		cm, err := childIs(ctx, ns, "w-inplace-a", map[string]string{"version": "3"})
		if err != nil {
			return err
		}
		if cm.UID != uids["w-inplace-a"] {
			return fmt.Errorf("replaced")
		}
		return othersKept(cm)
	})
}
