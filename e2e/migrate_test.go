package e2e

import (
	"context"
	"crypto/sha1" // names only: upstream's ControllerRevision name hash
	"encoding/hex"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"

	"github.com/metabus/metabus/pkg/api/v1alpha1"
	"github.com/metabus/metabus/pkg/apply"
)

// The migration tests start from the state upstream Metacontroller v4.17.2
// leaves behind, written here object by object as upstream writes it (the
// shapes come from upstream's source, cited at each helper), stop nothing
// (upstream is simply gone), start metabus, and show that it takes over
// without writing anything until a hook's answer changes, and then
// converges as usual.

// The migrated controllers.
const (
	migratePlain   = "migrate-plain"   // CompositeController, InPlace ConfigMaps
	migrateRolling = "migrate-rolling" // CompositeController, RollingRecreate Pods (catset-like)
	migrateDeco    = "migrate-deco"    // DecoratorController, InPlace ConfigMap attachments
)

// upstreamControllerRef is the owner reference upstream puts on every
// child and ControllerRevision (common.MakeControllerRef).
func upstreamControllerRef(parent *unstructured.Unstructured) map[string]any {
	return map[string]any{
		"apiVersion": parent.GetAPIVersion(), "kind": parent.GetKind(), "name": parent.GetName(),
		"uid": string(parent.GetUID()), "controller": true, "blockOwnerDeletion": true,
	}
}

// upstreamFinalizer is the finalizer upstream's controllers with a
// finalize hook put on their parents (finalizer.NewManager in
// composite/controller.go and decorator/controller.go).
func upstreamFinalizer(kind, name string) string {
	return "metacontroller.io/" + strings.ToLower(kind) + "-" + name
}

// writeUpstreamChild writes a child as upstream wrote it. With dynamic
// apply (DynamicApply.Apply, create): the hook's object, its namespace
// defaulted to the parent's (applyNamespaceDefaults) and, for a decorator,
// the decorator annotation added, is stored as JSON in the last-applied
// annotation (SetLastApplied: encoding/json, keys sorted) before the
// controller reference is appended (claimOwnership), then created. With
// server-side apply (ServerSideApply.Apply): the same object without the
// annotation, applied with force by field manager "metacontroller".
func writeUpstreamChild(t *testing.T, s apply.Strategy, gvr schema.GroupVersionResource, desired map[string]any, parent *unstructured.Unstructured, extraAnnotations map[string]string) *unstructured.Unstructured {
	t.Helper()
	obj := &unstructured.Unstructured{Object: runtime.DeepCopyJSON(desired)}
	if obj.GetNamespace() == "" {
		obj.SetNamespace(parent.GetNamespace())
	}
	if len(extraAnnotations) > 0 {
		ann := obj.GetAnnotations()
		if ann == nil {
			ann = map[string]string{}
		}
		maps.Copy(ann, extraAnnotations)
		obj.SetAnnotations(ann)
	}
	ctx := context.Background()
	c := dyn.Resource(gvr).Namespace(obj.GetNamespace())
	if s == apply.ServerSideApply {
		meta := obj.Object["metadata"].(map[string]any)
		meta["ownerReferences"] = []any{upstreamControllerRef(parent)}
		body, err := json.Marshal(obj.Object)
		if err != nil {
			t.Fatal(err)
		}
		force := true
		out, err := c.Patch(ctx, obj.GetName(), types.ApplyPatchType, body, metav1.PatchOptions{FieldManager: "metacontroller", Force: &force})
		if err != nil {
			t.Fatalf("upstream's apply of %s: %v", obj.GetName(), err)
		}
		return out
	}
	last, err := json.Marshal(obj.Object)
	if err != nil {
		t.Fatal(err)
	}
	ann := obj.GetAnnotations()
	if ann == nil {
		ann = map[string]string{}
	}
	ann[apply.LastAppliedAnnotation] = string(last)
	obj.SetAnnotations(ann)
	obj.Object["metadata"].(map[string]any)["ownerReferences"] = []any{upstreamControllerRef(parent)}
	out, err := c.Create(ctx, obj, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("upstream's create of %s: %v", obj.GetName(), err)
	}
	return out
}

// upstreamRevisionName is upstream's ControllerRevision name
// (controllerRevisionName): <resource>.<group>-<sha1(parent UID + patch JSON)>.
func upstreamRevisionName(resource, group string, parentUID types.UID, patch map[string]any) string {
	raw, _ := json.Marshal(patch)
	sum := sha1.Sum(append([]byte(parentUID), raw...))
	return resource + "." + group + "-" + hex.EncodeToString(sum[:])
}

// writeUpstreamStatus writes the parent's status as upstream's last sync
// left it.
func writeUpstreamStatus(t *testing.T, gvr schema.GroupVersionResource, parent *unstructured.Unstructured, status map[string]any) *unstructured.Unstructured {
	t.Helper()
	parent = parent.DeepCopy()
	parent.Object["status"] = status
	out, err := dyn.Resource(gvr).Namespace(parent.GetNamespace()).UpdateStatus(context.Background(), parent, metav1.UpdateOptions{})
	if err != nil {
		t.Fatalf("status of %s: %v", parent.GetName(), err)
	}
	return out
}

// finalizing answers a finalize call: nothing desired, finalized.
func finalizing(req map[string]any, owned string) (bool, map[string]any) {
	if f, _ := req["finalizing"].(bool); !f {
		return false, nil
	}
	return true, map[string]any{owned: []any{}, "finalized": true}
}

// decoHook is the decorator's hook: it labels its target decorated=v<spec.version>,
// attaches one ConfigMap carrying the version, and reports the attachments
// it saw.
func decoHook(req map[string]any) (int, any) {
	if done, resp := finalizing(req, "attachments"); done {
		return 200, resp
	}
	target := &unstructured.Unstructured{Object: req["object"].(map[string]any)}
	version, _ := nestedInt(target, "spec", "version")
	seen := 0
	if cms, ok := req["attachments"].(map[string]any)["ConfigMap.v1"].(map[string]any); ok {
		seen = len(cms)
	}
	return 200, map[string]any{
		"labels": map[string]any{"decorated": fmt.Sprintf("v%d", version)},
		"attachments": []any{map[string]any{"apiVersion": "v1", "kind": "ConfigMap",
			"metadata": map[string]any{"name": target.GetName() + "-att"},
			"data":     map[string]any{"version": fmt.Sprint(version)}}},
		"status": map[string]any{"attachments": seen},
	}
}

// migrated is the upstream state of one test: the objects and their
// resourceVersions as upstream left them.
type migrated struct {
	ns                       string
	plain, rolling, deco     *unstructured.Unstructured
	revision                 string
	versions                 map[string]string // "Kind name" → resourceVersion
	plainKids, pods, attachs []string
}

func (m *migrated) record(obj *unstructured.Unstructured) {
	m.versions[obj.GetKind()+" "+obj.GetName()] = obj.GetResourceVersion()
}

// current reads the resourceVersion of every recorded object again.
func (m *migrated) current(ctx context.Context, t *testing.T) map[string]string {
	t.Helper()
	gvrs := map[string]schema.GroupVersionResource{"Widget": widgetsGVR, "RollSet": rollsetsGVR, "ConfigMap": configMapsGVR,
		"Pod": podsGVR, "ControllerRevision": v1alpha1.ControllerRevisionGVR}
	out := map[string]string{}
	for k := range m.versions {
		kind, name, _ := strings.Cut(k, " ")
		obj, err := dyn.Resource(gvrs[kind]).Namespace(m.ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			out[k] = "error: " + err.Error()
			continue
		}
		out[k] = obj.GetResourceVersion()
	}
	return out
}

// migrateControllers creates the three migrated controllers, each with
// its sync and finalize hooks at urls[name], labelled for the instances
// the test starts (metabus's, and upstream's started with the same
// --target-label-selector).
func migrateControllers(t *testing.T, urls map[string]string) {
	t.Helper()
	label := &instance{selector: selectorOf(t)}
	hooks := func(url string) map[string]any {
		return map[string]any{"sync": map[string]any{"webhook": map[string]any{"url": url}},
			"finalize": map[string]any{"webhook": map[string]any{"url": url}}}
	}
	createController(t, label, compositeKind, migratePlain, map[string]any{
		"parentResource": map[string]any{"apiVersion": "test.metabus.dev/v1", "resource": "widgets",
			"labelSelector": map[string]any{"matchLabels": map[string]any{"migrate": "plain"}}},
		"childResources": []any{map[string]any{"apiVersion": "v1", "resource": "configmaps", "updateStrategy": map[string]any{"method": "InPlace"}}},
		"hooks":          hooks(urls[migratePlain]),
	})
	rollSpec := rollsetControllerSpec(urls[migrateRolling], "RollingRecreate")
	rollSpec["hooks"] = hooks(urls[migrateRolling])
	rollSpec["parentResource"].(map[string]any)["labelSelector"] = map[string]any{"matchLabels": map[string]any{"migrate": "rolling"}}
	createController(t, label, compositeKind, migrateRolling, rollSpec)
	createController(t, label, decoratorKind, migrateDeco, map[string]any{
		"resources": []any{map[string]any{"apiVersion": "test.metabus.dev/v1", "resource": "widgets",
			"labelSelector": map[string]any{"matchLabels": map[string]any{"migrate": "deco"}}}},
		"attachments": []any{map[string]any{"apiVersion": "v1", "resource": "configmaps", "updateStrategy": map[string]any{"method": "InPlace"}}},
		"hooks":       hooks(urls[migrateDeco]),
	})
}

// migrateHooks serves the three controllers' hooks (each answering its
// finalize calls with nothing desired, finalized), counting calls per
// parent, and returns their URLs by controller name.
func migrateHooks(t *testing.T) (*hookCalls, map[string]string) {
	calls := &hookCalls{n: map[string]int{}}
	plainHook := func(req map[string]any) (int, any) {
		if done, resp := finalizing(req, "children"); done {
			return 200, resp
		}
		return widgetHook(nil)(req)
	}
	rollHook := func(req map[string]any) (int, any) {
		code, sync := rollsetHook(req)
		if done, resp := finalizing(req, "children"); done {
			// Upstream v4.17.2 puts its Updated condition into a rolling
			// parent's status while finalizing too, and panics (the
			// process exits) on an answer without status: a finalize hook
			// of a rolling controller must answer one for upstream.
			resp["status"] = sync.(map[string]any)["status"]
			return 200, resp
		}
		return code, sync
	}
	return calls, map[string]string{
		migratePlain:   hookServer(t, jsonHook(calls.wrap(plainHook))),
		migrateRolling: hookServer(t, jsonHook(calls.wrap(rollHook))),
		migrateDeco:    hookServer(t, jsonHook(calls.wrap(decoHook))),
	}
}

// upstreamState writes what upstream v4.17.2 leaves behind after
// converging, for the three controllers (created here, before metabus
// starts, labelled for the instance the test starts later): children
// written with strategy s.
func upstreamState(t *testing.T, s apply.Strategy, urls map[string]string) *migrated {
	t.Helper()
	ctx := context.Background()
	m := &migrated{ns: newNamespace(t), versions: map[string]string{}}
	ns := m.ns
	// If the test ends before metabus released them, upstream's
	// finalizers would keep the parents (and the namespace) forever.
	t.Cleanup(func() { stripParentFinalizers(ns) })
	migrateControllers(t, urls)

	// The composite: a Widget with two ConfigMaps; its status is the
	// hook's with observedGeneration (updateParentStatus).
	w := newWidget("plain", []string{"a", "b"}, 1)
	w.SetLabels(map[string]string{"migrate": "plain"})
	w.SetFinalizers([]string{upstreamFinalizer(compositeKind, migratePlain)})
	plain, err := dyn.Resource(widgetsGVR).Namespace(ns).Create(ctx, w, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	_, answer := widgetHook(nil)(map[string]any{"parent": plain.Object, "children": map[string]any{"ConfigMap.v1": map[string]any{}}})
	for _, c := range answer.(map[string]any)["children"].([]any) {
		kid := writeUpstreamChild(t, s, configMapsGVR, c.(map[string]any), plain, nil)
		m.record(kid)
		m.plainKids = append(m.plainKids, kid.GetName())
	}
	m.plain = writeUpstreamStatus(t, widgetsGVR, plain, map[string]any{
		"configMaps": int64(2), "version": int64(1), "observedGeneration": plain.GetGeneration()})
	m.record(m.plain)

	// The rolling composite, settled on its one revision: Pods Ready (the
	// kubelet's doing), a ControllerRevision as newControllerRevision makes
	// it (named by the hash of the parent UID and its patch, labelled with
	// the template's labels and the parent's group and resource, owned by
	// the parent) holding both Pods (in no particular order: upstream
	// appends them as it iterates a map), and the status with upstream's
	// Updated condition (rolling_update.go: no lastTransitionTime).
	rs := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "test.metabus.dev/v1", "kind": "RollSet",
		"metadata": map[string]any{"name": "cats", "labels": map[string]any{"migrate": "rolling"},
			"finalizers": []any{upstreamFinalizer(compositeKind, migrateRolling)}},
		"spec": map[string]any{"selector": map[string]any{"matchLabels": map[string]any{"app": "cats"}},
			"replicas": int64(2), "template": rollTemplate("cats", 1)},
	}}
	rolling, err := dyn.Resource(rollsetsGVR).Namespace(ns).Create(ctx, rs, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	_, answer = rollsetHook(map[string]any{"parent": rolling.Object, "children": map[string]any{"Pod.v1": map[string]any{}}})
	for _, c := range answer.(map[string]any)["children"].([]any) {
		pod := writeUpstreamChild(t, s, podsGVR, c.(map[string]any), rolling, nil)
		markReady(t, ns, pod.GetName(), pod.GetUID())
		m.pods = append(m.pods, pod.GetName())
	}
	tmpl, _, _ := unstructured.NestedMap(rolling.Object, "spec", "template")
	patch := map[string]any{"spec": map[string]any{"template": tmpl}}
	m.revision = upstreamRevisionName("rollsets", "test.metabus.dev", rolling.GetUID(), patch)
	rawPatch, _ := json.Marshal(patch)
	var parentPatch map[string]any
	_ = json.Unmarshal(rawPatch, &parentPatch)
	names := slices.Clone(m.pods)
	slices.Reverse(names)
	cr := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": v1alpha1.GroupVersion.String(), "kind": "ControllerRevision",
		"metadata": map[string]any{"name": m.revision, "namespace": ns,
			"labels": map[string]any{"app": "cats", "metacontroller.k8s.io/apiGroup": "test.metabus.dev",
				"metacontroller.k8s.io/resource": "rollsets"},
			"ownerReferences": []any{upstreamControllerRef(rolling)}},
		"parentPatch": parentPatch,
		"children":    []any{map[string]any{"apiGroup": "", "kind": "Pod", "names": toAny(names)}},
	}}
	crOut, err := dyn.Resource(v1alpha1.ControllerRevisionGVR).Namespace(ns).Create(ctx, cr, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	m.record(crOut)
	m.rolling = writeUpstreamStatus(t, rollsetsGVR, rolling, map[string]any{
		"replicas": int64(2), "readyReplicas": int64(2), "observedGeneration": rolling.GetGeneration(),
		"conditions": []any{map[string]any{"type": "Updated", "status": "True", "reason": "OnLatestRevision",
			"message": "latest ControllerRevision: " + m.revision}},
	})
	m.record(m.rolling)
	for _, p := range m.pods {
		pod, err := dyn.Resource(podsGVR).Namespace(ns).Get(ctx, p, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		m.record(pod)
	}

	// The decorator's target: its labels from the hook, upstream's
	// finalizer, its status; the attachment carries the decorator
	// annotation in its last-applied configuration (added before
	// ManageChildren).
	d := newWidget("deco", []string{"x"}, 1)
	d.SetLabels(map[string]string{"migrate": "deco", "decorated": "v1"})
	d.SetFinalizers([]string{upstreamFinalizer(decoratorKind, migrateDeco)})
	deco, err := dyn.Resource(widgetsGVR).Namespace(ns).Create(ctx, d, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	_, answer = decoHook(map[string]any{"object": deco.Object, "attachments": map[string]any{"ConfigMap.v1": map[string]any{}}})
	for _, c := range answer.(map[string]any)["attachments"].([]any) {
		att := writeUpstreamChild(t, s, configMapsGVR, c.(map[string]any), deco,
			map[string]string{"metacontroller.k8s.io/decorator-controller": migrateDeco})
		m.record(att)
		m.attachs = append(m.attachs, att.GetName())
	}
	m.deco = writeUpstreamStatus(t, widgetsGVR, deco, map[string]any{"attachments": int64(1)})
	m.record(m.deco)
	return m
}

func toAny(ss []string) []any {
	out := make([]any, len(ss))
	for i, s := range ss {
		out[i] = s
	}
	return out
}

// TestMigrateFromUpstream: metabus started on the state upstream v4.17.2
// leaves behind (upstream's dynamic apply, or its server-side apply with
// metabus started with the same strategy) writes nothing to any parent,
// child or ControllerRevision while the hooks' answers are what upstream
// last applied; an answer that changes then converges as usual; the
// parents' upstream finalizers are metabus's own (deleting a parent runs
// its finalize hook and releases them).
func TestMigrateFromUpstream(t *testing.T) {
	for _, s := range applyStrategies {
		t.Run(string(s), func(t *testing.T) { testMigrateFromUpstream(t, s) })
	}
}

func testMigrateFromUpstream(t *testing.T, s apply.Strategy) {
	ctx := context.Background()
	calls, urls := migrateHooks(t)
	m := upstreamState(t, s, urls)
	ns := m.ns
	before := m.current(ctx, t)

	// Upstream is gone; metabus starts on its state.
	inst := startMetabus(t, strategyConfig(s), nil)
	t.Cleanup(func() { deleteMigrated(t, m) }) // before metabus stops: its finalize hooks release them
	eventually(t, 60*time.Second, "metabus's first sync of every parent", calls.calledFor("plain", "cats", "deco"))
	eventually(t, 30*time.Second, "the applies of those syncs", inst.settledAnswers(t, 3))
	time.Sleep(2 * time.Second) // any write would have been made by now
	after := m.current(ctx, t)
	for k, rv := range before {
		if after[k] != rv {
			obj := describeMigrated(ctx, m.ns, k)
			t.Errorf("%s was written at takeover: resourceVersion %s → %s\n%s", k, rv, after[k], obj)
		}
	}
	if s == apply.DynamicApply {
		if n := inst.counter(t, "metabus_applier_api_writes_total", nil); n != 0 {
			t.Errorf("metabus made %v API writes at takeover", n)
		}
	}
	if t.Failed() {
		t.FailNow()
	}

	// The answers change: the composite's version, the decorator
	// target's version, the rolling parent's replicas.
	roundTripChange(ctx, t, ns, 2, 3)
	uidOf := func(gvr schema.GroupVersionResource, name string) types.UID {
		obj, err := dyn.Resource(gvr).Namespace(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return obj.GetUID()
	}
	plainUIDs := map[string]types.UID{}
	for _, k := range m.plainKids {
		plainUIDs[k] = uidOf(configMapsGVR, k)
	}
	for _, k := range m.plainKids {
		eventually(t, 30*time.Second, k+" at version 2, in place", func() error {
			cm, err := childIs(ctx, ns, k, map[string]string{"version": "2"})
			if err == nil && cm.UID != plainUIDs[k] {
				return fmt.Errorf("replaced")
			}
			return err
		})
	}
	eventually(t, 30*time.Second, "the composite's status", func() error {
		_, err := plainStatusAt(ctx, ns, 2)
		return err
	})
	eventually(t, 30*time.Second, "the decorator's label and attachment", func() error {
		w, err := dyn.Resource(widgetsGVR).Namespace(ns).Get(ctx, "deco", metav1.GetOptions{})
		if err != nil {
			return err
		}
		if w.GetLabels()["decorated"] != "v2" {
			return fmt.Errorf("labels %v", w.GetLabels())
		}
		_, err = childIs(ctx, ns, "deco-att", map[string]string{"version": "2"})
		return err
	})
	eventually(t, 30*time.Second, "the rolling parent's new Pod", func() error {
		_, err := kube.CoreV1().Pods(ns).Get(ctx, "cats-2", metav1.GetOptions{})
		return err
	})
	markReady(t, ns, "cats-2", "")
	eventually(t, 30*time.Second, "the rolling parent settled on its revision, in upstream's form", func() error {
		rs, err := dyn.Resource(rollsetsGVR).Namespace(ns).Get(ctx, "cats", metav1.GetOptions{})
		if err != nil {
			return err
		}
		status, _, _ := unstructured.NestedMap(rs.Object, "status")
		want := map[string]any{"replicas": int64(3), "readyReplicas": int64(3), "observedGeneration": rs.GetGeneration(),
			"conditions": []any{map[string]any{"type": "Updated", "status": "True", "reason": "OnLatestRevision",
				"message": "latest ControllerRevision: " + m.revision}}}
		if !equalJSONValues(status, want) {
			got, _ := json.Marshal(status)
			return fmt.Errorf("status %s", got)
		}
		cr, err := dyn.Resource(v1alpha1.ControllerRevisionGVR).Namespace(ns).Get(ctx, m.revision, metav1.GetOptions{})
		if err != nil {
			return err
		}
		kids, _, _ := unstructured.NestedSlice(cr.Object, "children")
		if len(kids) != 1 || len(kids[0].(map[string]any)["names"].([]any)) != 3 {
			return fmt.Errorf("revision children %v", kids)
		}
		return nil
	})

	// Deleting the parents runs metabus's finalize hooks under upstream's
	// finalizer names.
	deleteMigrated(t, m)
}

// deleteMigrated deletes the migrated parents and waits until they are
// gone: their upstream finalizers released by metabus.
func deleteMigrated(t *testing.T, m *migrated) {
	ctx := context.Background()
	for _, p := range roundTripParents {
		_ = dyn.Resource(p.gvr).Namespace(m.ns).Delete(ctx, p.name, metav1.DeleteOptions{})
	}
	eventually(t, 30*time.Second, "the parents' finalizers released by their finalize hooks", parentsGone(ctx, m.ns))
}

// describeMigrated renders an object for a failure message.
func describeMigrated(ctx context.Context, ns, key string) string {
	kind, name, _ := strings.Cut(key, " ")
	gvr := map[string]schema.GroupVersionResource{"Widget": widgetsGVR, "RollSet": rollsetsGVR, "ConfigMap": configMapsGVR,
		"Pod": podsGVR, "ControllerRevision": v1alpha1.ControllerRevisionGVR}[kind]
	obj, err := dyn.Resource(gvr).Namespace(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return err.Error()
	}
	unstructured.RemoveNestedField(obj.Object, "spec")
	raw, _ := json.MarshalIndent(obj.Object, "  ", "  ")
	return "  " + string(raw)
}

// equalJSONValues compares two JSON values as JSON (numbers by value).
func equalJSONValues(a, b any) bool {
	ra, _ := json.Marshal(a)
	rb, _ := json.Marshal(b)
	var x, y any
	_ = json.Unmarshal(ra, &x)
	_ = json.Unmarshal(rb, &y)
	rx, _ := json.Marshal(x)
	ry, _ := json.Marshal(y)
	return string(rx) == string(ry)
}
