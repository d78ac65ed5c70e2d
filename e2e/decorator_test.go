package e2e

import (
	"context"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"

	"github.com/metabus/metabus/internal/allinone"
	"github.com/metabus/metabus/pkg/api/v1alpha1"
)

const decoratorAnnotation = "metacontroller.k8s.io/decorator-controller"

// gadgetsGVR is a test CRD without a status subresource.
var gadgetsGVR = schema.GroupVersionResource{Group: "test.metabus.dev", Version: "v1", Resource: "gadgets"}

func decoratorFinalizer(name string) string { return "metacontroller.io/decoratorcontroller-" + name }

// attachmentsOf returns the request's attachments of one type: key → object.
func attachmentsOf(req map[string]any, typ string) (map[string]any, bool) {
	all, _ := req["attachments"].(map[string]any)
	m, ok := all[typ].(map[string]any)
	return m, ok
}

// servicePerPodHook is the reference's service-per-pod decorator: one
// Service per StatefulSet replica, selecting its Pod by the label the
// service-per-pod-label annotation names, with the ports of the
// service-per-pod-ports annotation ("port:targetPort,..."). Its finalize
// hook tears the Services down one at a time, highest ordinal first, and
// reports finalized once none is observed.
type servicePerPodHook struct {
	mu       sync.Mutex
	keys     map[string]bool // every attachment key seen
	finalize [][]string      // observed Service names per finalize call
}

func (h *servicePerPodHook) handle(req map[string]any) (int, any) {
	sts := &unstructured.Unstructured{Object: req["object"].(map[string]any)}
	observed, ok := attachmentsOf(req, "Service.v1")
	if !ok {
		return 500, "no Service.v1 entry in attachments"
	}
	var names []string
	byName := map[string]map[string]any{}
	h.mu.Lock()
	for k, v := range observed {
		h.keys[k] = true
		svc := v.(map[string]any)
		n := svc["metadata"].(map[string]any)["name"].(string)
		names = append(names, n)
		byName[n] = svc
	}
	sort.Strings(names)
	finalizing, _ := req["finalizing"].(bool)
	if finalizing {
		h.finalize = append(h.finalize, names)
	}
	h.mu.Unlock()

	if finalizing {
		// Keep all but the last one, as they are: the same spec they have.
		var keep []any
		for _, n := range names[:max(len(names)-1, 0)] {
			spec := byName[n]["spec"].(map[string]any)
			var ports []any
			for _, p := range spec["ports"].([]any) {
				pm := p.(map[string]any)
				ports = append(ports, map[string]any{"port": pm["port"], "targetPort": pm["targetPort"]})
			}
			keep = append(keep, service(n, sts.GetName(), spec["selector"], ports))
		}
		return 200, map[string]any{"attachments": keep, "finalized": len(names) == 0}
	}
	replicas, _ := nestedInt(sts, "spec", "replicas")
	ann := sts.GetAnnotations()
	labelKey := ann["service-per-pod-label"]
	var ports []any
	for _, pair := range strings.Split(ann["service-per-pod-ports"], ",") {
		p, tp, _ := strings.Cut(pair, ":")
		port, err1 := strconv.Atoi(p)
		target, err2 := strconv.Atoi(tp)
		if err1 != nil || err2 != nil {
			return 500, "bad service-per-pod-ports " + pair
		}
		ports = append(ports, map[string]any{"port": port, "targetPort": target})
	}
	var svcs []any
	for i := int64(0); i < replicas; i++ {
		pod := fmt.Sprintf("%s-%d", sts.GetName(), i)
		svcs = append(svcs, service(pod, sts.GetName(), map[string]any{labelKey: pod}, ports))
	}
	return 200, map[string]any{"attachments": svcs}
}

func service(name, app string, selector any, ports []any) map[string]any {
	return map[string]any{
		"apiVersion": "v1",
		"kind":       "Service",
		"metadata":   map[string]any{"name": name, "labels": map[string]any{"app": app}},
		"spec":       map[string]any{"selector": selector, "ports": ports},
	}
}

// finalizeOrder returns the distinct observed sets since the last reset.
func (h *servicePerPodHook) finalizeOrder(reset bool) []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []string
	for _, o := range h.finalize {
		s := strings.Join(o, ",")
		if len(out) == 0 || out[len(out)-1] != s {
			out = append(out, s)
		}
	}
	if reset {
		h.finalize = nil
	}
	return out
}

func newStatefulSet(name string, replicas int32, annotations map[string]string) *appsv1.StatefulSet {
	labels := map[string]string{"app": name}
	return &appsv1.StatefulSet{
		ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: annotations},
		Spec: appsv1.StatefulSetSpec{
			Replicas:    &replicas,
			ServiceName: name,
			Selector:    &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "nginx", Image: "nginx"}}},
			},
		},
	}
}

// servicesOf lists the Services of a StatefulSet (by the app label the hook
// sets), by name.
func servicesOf(ctx context.Context, ns, app string) (map[string]*corev1.Service, error) {
	list, err := kube.CoreV1().Services(ns).List(ctx, metav1.ListOptions{LabelSelector: "app=" + app})
	if err != nil {
		return nil, err
	}
	out := map[string]*corev1.Service{}
	for i := range list.Items {
		out[list.Items[i].Name] = &list.Items[i]
	}
	return out, nil
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// TestDecoratorServicePerPod is the reference's example: a StatefulSet that
// opts in through two annotations gets one Service per Pod, owned by the
// StatefulSet and marked with the decorator's annotation; the Services
// follow spec.replicas and the ports annotation (InPlace); opting out runs
// the finalize hook (ordered teardown, then the finalizer goes and the
// StatefulSet stays); opting back in restores them; deletion tears them
// down in order before the StatefulSet goes. The StatefulSet's spec is
// never written. There is no StatefulSet controller in the test cluster,
// so the test creates the Pods itself, as that controller would.
func TestDecoratorServicePerPod(t *testing.T) {
	ctx := context.Background()
	inst := startMetabus(t, allinone.Config{}, nil)
	ns := newNamespace(t)
	hook := &servicePerPodHook{keys: map[string]bool{}}
	url := hookServer(t, jsonHook(hook.handle))
	const dcName = "service-per-pod"
	fin := decoratorFinalizer(dcName)
	createController(t, inst, decoratorKind, dcName, map[string]any{
		"resources": []any{map[string]any{
			"apiVersion": "apps/v1", "resource": "statefulsets",
			"annotationSelector": map[string]any{"matchExpressions": []any{
				map[string]any{"key": "service-per-pod-label", "operator": "Exists"},
				map[string]any{"key": "service-per-pod-ports", "operator": "Exists"},
			}},
		}},
		"attachments": []any{map[string]any{"apiVersion": "v1", "resource": "services", "updateStrategy": map[string]any{"method": "InPlace"}}},
		"hooks": map[string]any{
			"sync":     map[string]any{"webhook": map[string]any{"url": url}},
			"finalize": map[string]any{"webhook": map[string]any{"url": url}},
		},
	})

	optIn := map[string]string{"service-per-pod-label": "statefulset.kubernetes.io/pod-name", "service-per-pod-ports": "80:8080"}
	sts, err := kube.AppsV1().StatefulSets(ns).Create(ctx, newStatefulSet("web", 3, optIn), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kube.AppsV1().StatefulSets(ns).Create(ctx, newStatefulSet("plain", 2, nil), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// What the StatefulSet controller would do.
	for i := 0; i < 3; i++ {
		name := fmt.Sprintf("web-%d", i)
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"app": "web", "statefulset.kubernetes.io/pod-name": name}},
			Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "nginx", Image: "nginx"}}},
		}
		if _, err := kube.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}

	// wantServices checks the Services of web: names, owner, mark, Pod
	// selection and target port.
	wantServices := func(names []string, targetPort int32) func() error {
		return func() error {
			svcs, err := servicesOf(ctx, ns, "web")
			if err != nil {
				return err
			}
			if got := sortedKeys(svcs); strings.Join(got, ",") != strings.Join(names, ",") {
				return fmt.Errorf("services %v, want %v", got, names)
			}
			for _, n := range names {
				s := svcs[n]
				ref := metav1.GetControllerOf(s)
				if ref == nil || ref.UID != sts.UID || ref.Kind != "StatefulSet" || ref.BlockOwnerDeletion == nil || !*ref.BlockOwnerDeletion {
					return fmt.Errorf("service %s controller ref %+v", n, ref)
				}
				if s.Annotations[decoratorAnnotation] != dcName {
					return fmt.Errorf("service %s annotations %v", n, s.Annotations)
				}
				if len(s.Spec.Ports) != 1 || s.Spec.Ports[0].Port != 80 || s.Spec.Ports[0].TargetPort.IntVal != targetPort {
					return fmt.Errorf("service %s ports %+v", n, s.Spec.Ports)
				}
				pods, err := kube.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: metav1.FormatLabelSelector(&metav1.LabelSelector{MatchLabels: s.Spec.Selector})})
				if err != nil {
					return err
				}
				if len(pods.Items) != 1 || pods.Items[0].Name != n {
					return fmt.Errorf("service %s selects %d pods", n, len(pods.Items))
				}
			}
			return nil
		}
	}
	stsFinalizer := func(name string, want bool) func() error {
		return func() error {
			s, err := kube.AppsV1().StatefulSets(ns).Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			for _, f := range s.Finalizers {
				if f == fin {
					if !want {
						return fmt.Errorf("%s still has finalizer %s", name, fin)
					}
					return nil
				}
			}
			if want {
				return fmt.Errorf("%s finalizers %v", name, s.Finalizers)
			}
			return nil
		}
	}

	// Owned by the StatefulSet but not marked as this decorator's: not an
	// attachment, so never shown to the hook nor deleted.
	isController := true
	manual := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "web-manual", OwnerReferences: []metav1.OwnerReference{{
			APIVersion: "apps/v1", Kind: "StatefulSet", Name: "web", UID: sts.UID, Controller: &isController,
		}}},
		Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Port: 80}}},
	}
	if _, err := kube.CoreV1().Services(ns).Create(ctx, manual, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "one Service per Pod", wantServices([]string{"web-0", "web-1", "web-2"}, 8080))
	eventually(t, 10*time.Second, "the finalizer on the StatefulSet", stsFinalizer("web", true))
	// Follows spec.replicas, and the ports annotation (InPlace).
	if _, err := kube.AppsV1().StatefulSets(ns).Patch(ctx, "web", types.MergePatchType,
		[]byte(`{"spec":{"replicas":2},"metadata":{"annotations":{"service-per-pod-ports":"80:9090"}}}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "scale down to two Services on the new target port", wantServices([]string{"web-0", "web-1"}, 9090))
	hook.mu.Lock()
	if !hook.keys["web-0"] || hook.keys[ns+"/web-0"] {
		t.Errorf("v1 attachment keys of a namespaced target are bare names; saw %v", sortedKeys(hook.keys))
	}
	hook.mu.Unlock()

	// Opt out: finalize tears the Services down in order, then releases
	// the StatefulSet, which stays.
	if _, err := kube.AppsV1().StatefulSets(ns).Patch(ctx, "web", types.MergePatchType,
		[]byte(`{"metadata":{"annotations":{"service-per-pod-ports":null}}}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "finalize on opt-out", func() error {
		if err := wantServices(nil, 0)(); err != nil {
			return err
		}
		return stsFinalizer("web", false)()
	})
	if got, want := hook.finalizeOrder(true), []string{"web-0,web-1", "web-0", ""}; strings.Join(got, "|") != strings.Join(want, "|") {
		t.Errorf("opt-out teardown observed %q, want %q", got, want)
	}

	// Opt back in.
	if _, err := kube.AppsV1().StatefulSets(ns).Patch(ctx, "web", types.MergePatchType,
		[]byte(`{"metadata":{"annotations":{"service-per-pod-ports":"80:8080"}}}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "Services back after opting in again", wantServices([]string{"web-0", "web-1"}, 8080))
	eventually(t, 10*time.Second, "the finalizer back", stsFinalizer("web", true))

	if _, err := kube.CoreV1().Services(ns).Get(ctx, "web-manual", metav1.GetOptions{}); err != nil {
		t.Errorf("a Service the StatefulSet owns but the decorator did not mark: %v", err)
	}
	hook.mu.Lock()
	if hook.keys["web-manual"] {
		t.Errorf("the hook was shown a Service without the decorator's annotation")
	}
	hook.mu.Unlock()

	// The decorator never wrote the spec: the generation only counts the
	// test's own scale-down.
	cur, err := kube.AppsV1().StatefulSets(ns).Get(ctx, "web", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if cur.Generation != 2 || *cur.Spec.Replicas != 2 {
		t.Errorf("StatefulSet generation %d replicas %d, want 2 and 2: the decorator must not write the spec", cur.Generation, *cur.Spec.Replicas)
	}

	// Deletion: ordered teardown, then the StatefulSet goes.
	if err := kube.AppsV1().StatefulSets(ns).Delete(ctx, "web", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 60*time.Second, "the StatefulSet finalized and deleted", func() error {
		_, err := kube.AppsV1().StatefulSets(ns).Get(ctx, "web", metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("still there (err=%v)", err)
	})
	if got, want := hook.finalizeOrder(false), []string{"web-0,web-1", "web-0", ""}; strings.Join(got, "|") != strings.Join(want, "|") {
		t.Errorf("deletion teardown observed %q, want %q", got, want)
	}

	// The StatefulSet that never opted in was left alone.
	if err := stsFinalizer("plain", false)(); err != nil {
		t.Error(err)
	}
	if svcs, err := servicesOf(ctx, ns, "plain"); err != nil || len(svcs) != 0 {
		t.Errorf("services of a StatefulSet without the annotations: %v %v", sortedKeys(svcs), err)
	}
}

// TestDecoratorPodNameLabel is the introduction's decorator: a Pod gets a
// label named by its pod-name-label annotation, whose value is its name.
// The same controller targets two more kinds: Widgets, which must match a
// label selector and the annotation selector both and get their status
// written through the status subresource, and Gadgets, which have no
// status subresource, so their status is replaced through the object
// itself. The Pod's status, which the hook leaves null, is untouched. A null label value deletes the label. Every
// declared attachment type is in the request even when empty, and v2 keys
// are used. resyncPeriodSeconds keeps calling the hook, and those no-op
// syncs make no API write.
func TestDecoratorPodNameLabel(t *testing.T) {
	ctx := context.Background()
	inst := startMetabus(t, allinone.Config{}, nil)
	ns := newNamespace(t)
	var mu sync.Mutex
	calls := map[string]int{}
	var badRequests []string
	url := hookServer(t, jsonHook(func(req map[string]any) (int, any) {
		obj := &unstructured.Unstructured{Object: req["object"].(map[string]any)}
		mu.Lock()
		calls[obj.GetKind()+"/"+obj.GetName()]++
		if cms, ok := attachmentsOf(req, "ConfigMap.v1"); !ok || len(cms) != 0 {
			badRequests = append(badRequests, fmt.Sprintf("attachments %v", req["attachments"]))
		}
		if rel, ok := req["related"].(map[string]any); !ok || len(rel) != 0 {
			badRequests = append(badRequests, fmt.Sprintf("related %v", req["related"]))
		}
		mu.Unlock()
		resp := map[string]any{
			"labels":      map[string]any{obj.GetAnnotations()["pod-name-label"]: obj.GetName(), "stale": nil},
			"annotations": map[string]any{"pod-name-label/decorated": "true"},
		}
		if obj.GetKind() != "Pod" {
			resp["status"] = map[string]any{"decoratedName": obj.GetName(), "count": 1}
		}
		return 200, resp
	}))
	createController(t, inst, decoratorKind, "pod-name-label", map[string]any{
		"resources": []any{
			map[string]any{
				"apiVersion": "v1", "resource": "pods",
				"annotationSelector": map[string]any{"matchExpressions": []any{map[string]any{"key": "pod-name-label", "operator": "Exists"}}},
			},
			map[string]any{
				"apiVersion": "test.metabus.dev/v1", "resource": "widgets",
				"labelSelector":      map[string]any{"matchLabels": map[string]any{"decorate": "yes"}},
				"annotationSelector": map[string]any{"matchExpressions": []any{map[string]any{"key": "pod-name-label", "operator": "Exists"}}},
			},
			map[string]any{
				"apiVersion": "test.metabus.dev/v1", "resource": "gadgets",
				"annotationSelector": map[string]any{"matchExpressions": []any{map[string]any{"key": "pod-name-label", "operator": "Exists"}}},
			},
		},
		"attachments":         []any{map[string]any{"apiVersion": "v1", "resource": "configmaps"}},
		"resyncPeriodSeconds": 1,
		"hooks":               map[string]any{"sync": map[string]any{"version": "v2", "webhook": map[string]any{"url": url}}},
	})

	newPod := func(name string, labels, annotations map[string]string) {
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels, Annotations: annotations},
			Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "busybox"}}},
		}
		if _, err := kube.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	newPod("p1", map[string]string{"stale": "x", "keep": "y"}, map[string]string{"pod-name-label": "example.com/pod-name"})
	newPod("p2", map[string]string{"stale": "x"}, nil)
	for _, w := range []struct {
		name   string
		labels map[string]string
	}{{"w1", map[string]string{"decorate": "yes"}}, {"w2", nil}} {
		obj := newWidget(w.name, []string{"a"}, 1)
		obj.SetLabels(w.labels)
		obj.SetAnnotations(map[string]string{"pod-name-label": "example.com/widget-name"})
		if _, err := dyn.Resource(widgetsGVR).Namespace(ns).Create(ctx, obj, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	gadget := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "test.metabus.dev/v1", "kind": "Gadget",
		"metadata": map[string]any{"name": "g1", "annotations": map[string]any{"pod-name-label": "example.com/gadget-name"}},
		"spec":     map[string]any{"size": int64(3)},
		"status":   map[string]any{"old": "x", "count": int64(5)},
	}}
	if _, err := dyn.Resource(gadgetsGVR).Namespace(ns).Create(ctx, gadget, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	eventually(t, 30*time.Second, "the pod, the widget and the gadget decorated", func() error {
		p, err := kube.CoreV1().Pods(ns).Get(ctx, "p1", metav1.GetOptions{})
		if err != nil {
			return err
		}
		if p.Labels["example.com/pod-name"] != "p1" || p.Labels["keep"] != "y" || p.Annotations["pod-name-label/decorated"] != "true" {
			return fmt.Errorf("p1 labels %v annotations %v", p.Labels, p.Annotations)
		}
		if _, has := p.Labels["stale"]; has {
			return fmt.Errorf("p1 label stale was not deleted: %v", p.Labels)
		}
		w, err := dyn.Resource(widgetsGVR).Namespace(ns).Get(ctx, "w1", metav1.GetOptions{})
		if err != nil {
			return err
		}
		if w.GetLabels()["example.com/widget-name"] != "w1" || nestedString(w, "status", "decoratedName") != "w1" {
			return fmt.Errorf("w1 labels %v status %v", w.GetLabels(), w.Object["status"])
		}
		// No status subresource: the status is replaced (old is gone)
		// through the main resource.
		g, err := dyn.Resource(gadgetsGVR).Namespace(ns).Get(ctx, "g1", metav1.GetOptions{})
		if err != nil {
			return err
		}
		if st, _ := g.Object["status"].(map[string]any); len(st) != 2 || st["decoratedName"] != "g1" || st["count"] != int64(1) ||
			g.GetLabels()["example.com/gadget-name"] != "g1" {
			return fmt.Errorf("g1 labels %v status %v", g.GetLabels(), g.Object["status"])
		}
		if size, _ := nestedInt(g, "spec", "size"); size != 3 {
			return fmt.Errorf("g1 spec %v", g.Object["spec"])
		}
		return nil
	})
	p1, _ := kube.CoreV1().Pods(ns).Get(ctx, "p1", metav1.GetOptions{})
	if p1.Status.Phase != corev1.PodPending || p1.Status.QOSClass == "" {
		t.Errorf("the Pod's status must be left alone when the hook returns none: %+v", p1.Status)
	}
	w1, _ := dyn.Resource(widgetsGVR).Namespace(ns).Get(ctx, "w1", metav1.GetOptions{})
	if w1.GetGeneration() != 1 {
		t.Errorf("w1 generation %d: the decorator must not write the spec", w1.GetGeneration())
	}
	if len(w1.GetFinalizers()) != 0 {
		t.Errorf("no finalize hook, but w1 has finalizers %v", w1.GetFinalizers())
	}

	// Resyncs keep coming and change nothing: no write at all.
	writes := func() float64 { return inst.counter(t, "metabus_applier_api_writes_total", nil) }
	mu.Lock()
	before := calls["Pod/p1"]
	mu.Unlock()
	g1, _ := dyn.Resource(gadgetsGVR).Namespace(ns).Get(ctx, "g1", metav1.GetOptions{})
	rvPod, rvWidget, rvGadget := p1.ResourceVersion, w1.GetResourceVersion(), g1.GetResourceVersion()
	w0 := writes()
	eventually(t, 20*time.Second, "three more syncs from resyncPeriodSeconds", func() error {
		mu.Lock()
		defer mu.Unlock()
		if calls["Pod/p1"] < before+3 || calls["Widget/w1"] < 3 || calls["Gadget/g1"] < 3 {
			return fmt.Errorf("calls %v", calls)
		}
		return nil
	})
	time.Sleep(500 * time.Millisecond) // let the last desired states be applied
	if w := writes(); w != w0 {
		t.Errorf("no-op resyncs wrote %v times to the API", w-w0)
	}
	p1, _ = kube.CoreV1().Pods(ns).Get(ctx, "p1", metav1.GetOptions{})
	w1, _ = dyn.Resource(widgetsGVR).Namespace(ns).Get(ctx, "w1", metav1.GetOptions{})
	g1, _ = dyn.Resource(gadgetsGVR).Namespace(ns).Get(ctx, "g1", metav1.GetOptions{})
	if p1.ResourceVersion != rvPod || w1.GetResourceVersion() != rvWidget || g1.GetResourceVersion() != rvGadget {
		t.Errorf("no-op resyncs changed the targets: pod rv %s→%s, widget rv %s→%s, gadget rv %s→%s", rvPod, p1.ResourceVersion,
			rvWidget, w1.GetResourceVersion(), rvGadget, g1.GetResourceVersion())
	}

	// Not selected: no annotation (p2), or the annotation without the
	// label (w2).
	mu.Lock()
	if calls["Pod/p2"] != 0 || calls["Widget/w2"] != 0 {
		t.Errorf("unselected targets were synced: %v", calls)
	}
	if len(badRequests) > 0 {
		t.Errorf("bad requests: %v", badRequests)
	}
	mu.Unlock()
	p2, _ := kube.CoreV1().Pods(ns).Get(ctx, "p2", metav1.GetOptions{})
	w2, _ := dyn.Resource(widgetsGVR).Namespace(ns).Get(ctx, "w2", metav1.GetOptions{})
	if p2.Labels["stale"] != "x" || len(w2.GetLabels()) != 0 || w2.Object["status"] != nil {
		t.Errorf("unselected targets were written: p2 labels %v, w2 labels %v status %v", p2.Labels, w2.GetLabels(), w2.Object["status"])
	}
}

// TestDecoratorClusterScopedTarget: a ClusterRole (cluster-scoped target)
// owns a RoleBinding (namespaced attachment): the hook sees it keyed
// namespace/name, a manually deleted RoleBinding is recreated, a response
// that leaves out the namespace is rejected with an InvalidDesiredState
// Event (nothing created), and deleting the ClusterRole lets the garbage
// collector take the RoleBinding.
func TestDecoratorClusterScopedTarget(t *testing.T) {
	ctx := context.Background()
	inst := startMetabus(t, allinone.Config{}, nil)
	ns := newNamespace(t)
	var mu sync.Mutex
	keys := map[string]bool{}
	url := hookServer(t, jsonHook(func(req map[string]any) (int, any) {
		cr := &unstructured.Unstructured{Object: req["object"].(map[string]any)}
		rbs, ok := attachmentsOf(req, "RoleBinding.rbac.authorization.k8s.io/v1")
		if !ok {
			return 500, "no RoleBinding entry"
		}
		mu.Lock()
		for k := range rbs {
			keys[k] = true
		}
		mu.Unlock()
		meta := map[string]any{"name": cr.GetName()}
		if cr.GetAnnotations()["omit-namespace"] == "" {
			meta["namespace"] = ns
		}
		return 200, map[string]any{"attachments": []any{map[string]any{
			"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
			"metadata": meta,
			"roleRef":  map[string]any{"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": cr.GetName()},
			"subjects": []any{map[string]any{"kind": "ServiceAccount", "name": "default", "namespace": ns}},
		}}}
	}))
	createController(t, inst, decoratorKind, "cr-binding", map[string]any{
		"resources": []any{map[string]any{
			"apiVersion": "rbac.authorization.k8s.io/v1", "resource": "clusterroles",
			"labelSelector": map[string]any{"matchLabels": map[string]any{"e2e.metabus.dev/bind-in": ns}},
		}},
		"attachments": []any{map[string]any{"apiVersion": "rbac.authorization.k8s.io/v1", "resource": "rolebindings", "updateStrategy": map[string]any{"method": "Recreate"}}},
		"hooks":       map[string]any{"sync": map[string]any{"webhook": map[string]any{"url": url}}},
	})
	viewer, nons := ns+"-viewer", ns+"-nons"
	for _, n := range []string{viewer, nons} {
		cr := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: n, Labels: map[string]string{"e2e.metabus.dev/bind-in": ns}}}
		if n == nons {
			cr.Annotations = map[string]string{"omit-namespace": "yes"}
		}
		if _, err := kube.RbacV1().ClusterRoles().Create(ctx, cr, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = kube.RbacV1().ClusterRoles().Delete(context.Background(), n, metav1.DeleteOptions{}) })
	}
	cr, err := kube.RbacV1().ClusterRoles().Get(ctx, viewer, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var firstUID types.UID
	eventually(t, 30*time.Second, "the RoleBinding attached to the ClusterRole", func() error {
		rb, err := kube.RbacV1().RoleBindings(ns).Get(ctx, viewer, metav1.GetOptions{})
		if err != nil {
			return err
		}
		ref := metav1.GetControllerOf(rb)
		if ref == nil || ref.UID != cr.UID || ref.Kind != "ClusterRole" || rb.Annotations[decoratorAnnotation] != "cr-binding" {
			return fmt.Errorf("owner %+v annotations %v", ref, rb.Annotations)
		}
		firstUID = rb.UID
		return nil
	})
	eventually(t, 10*time.Second, "the hook to observe the RoleBinding keyed namespace/name", func() error {
		mu.Lock()
		defer mu.Unlock()
		if !keys[ns+"/"+viewer] {
			return fmt.Errorf("keys %v", sortedKeys(keys))
		}
		return nil
	})

	if err := kube.RbacV1().RoleBindings(ns).Delete(ctx, viewer, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "the RoleBinding recreated", func() error {
		rb, err := kube.RbacV1().RoleBindings(ns).Get(ctx, viewer, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if rb.UID == firstUID {
			return fmt.Errorf("not deleted yet")
		}
		return nil
	})

	// A namespaced attachment of a cluster-scoped target needs a namespace.
	eventually(t, 30*time.Second, "an InvalidDesiredState event on the ClusterRole without namespace", func() error {
		evs, err := kube.CoreV1().Events("").List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + nons})
		if err != nil {
			return err
		}
		for _, e := range evs.Items {
			if e.Reason == "InvalidDesiredState" && strings.Contains(e.Message, "needs metadata.namespace") {
				return nil
			}
		}
		return fmt.Errorf("%d events, none InvalidDesiredState", len(evs.Items))
	})
	rbs, err := kube.RbacV1().RoleBindings(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, rb := range rbs.Items {
		if rb.Name == nons {
			t.Errorf("a rejected response created RoleBinding %s/%s", rb.Namespace, rb.Name)
		}
	}

	// The ownerReference is real: the garbage collector follows it.
	if err := kube.RbacV1().ClusterRoles().Delete(ctx, viewer, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 60*time.Second, "the RoleBinding garbage-collected with its ClusterRole", func() error {
		_, err := kube.RbacV1().RoleBindings(ns).Get(ctx, viewer, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("still there (err=%v)", err)
	})
}

// TestDecoratorReleasesFinalizersOfEveryTargetKind: a decorator, unlike
// the other kinds, targets several resources; with a finalize hook it puts
// its finalizer on targets of every one (a ConfigMap, a Widget and a
// cluster-scoped ClusterRole here); dropping a resource from
// spec.resources releases that resource's targets only, and deleting the
// DecoratorController releases the rest. That a deleted controller of any
// kind releases its parents and stops is TestKindsControllerDeletionReleasesFinalizers.
func TestDecoratorReleasesFinalizersOfEveryTargetKind(t *testing.T) {
	ctx := context.Background()
	inst := startMetabus(t, allinone.Config{}, nil)
	ns := newNamespace(t)
	url := hookServer(t, jsonHook(func(req map[string]any) (int, any) {
		finalizing, _ := req["finalizing"].(bool)
		return 200, map[string]any{"finalized": finalizing}
	}))
	const dcName = "dec-release"
	fin := decoratorFinalizer(dcName)
	sel := map[string]any{"matchLabels": map[string]any{"e2e.metabus.dev/release": ns}}
	createController(t, inst, decoratorKind, dcName, map[string]any{
		"resources": []any{
			map[string]any{"apiVersion": "v1", "resource": "configmaps", "labelSelector": sel},
			map[string]any{"apiVersion": "test.metabus.dev/v1", "resource": "widgets", "labelSelector": sel},
			map[string]any{"apiVersion": "rbac.authorization.k8s.io/v1", "resource": "clusterroles", "labelSelector": sel},
		},
		"hooks": map[string]any{
			"sync":     map[string]any{"webhook": map[string]any{"url": url}},
			"finalize": map[string]any{"webhook": map[string]any{"url": url}},
		},
	})
	lbls := map[string]string{"e2e.metabus.dev/release": ns}
	if _, err := kube.CoreV1().ConfigMaps(ns).Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "cm1", Labels: lbls}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	w := newWidget("w1", nil, 1)
	w.SetLabels(lbls)
	if _, err := dyn.Resource(widgetsGVR).Namespace(ns).Create(ctx, w, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	crName := ns + "-release"
	if _, err := kube.RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: crName, Labels: lbls}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = kube.RbacV1().ClusterRoles().Delete(context.Background(), crName, metav1.DeleteOptions{}) })

	finalizers := func() (map[string][]string, error) {
		out := map[string][]string{}
		cm, err := kube.CoreV1().ConfigMaps(ns).Get(ctx, "cm1", metav1.GetOptions{})
		if err != nil {
			return nil, err
		}
		out["ConfigMap"] = cm.Finalizers
		w, err := dyn.Resource(widgetsGVR).Namespace(ns).Get(ctx, "w1", metav1.GetOptions{})
		if err != nil {
			return nil, err
		}
		out["Widget"] = w.GetFinalizers()
		cr, err := kube.RbacV1().ClusterRoles().Get(ctx, crName, metav1.GetOptions{})
		if err != nil {
			return nil, err
		}
		out["ClusterRole"] = cr.Finalizers
		return out, nil
	}
	// held checks which kinds hold the finalizer (and nothing else).
	held := func(want map[string]bool) func() error {
		return func() error {
			fs, err := finalizers()
			if err != nil {
				return err
			}
			for kind, f := range fs {
				has := len(f) == 1 && f[0] == fin
				if has != want[kind] || (!want[kind] && len(f) != 0) {
					return fmt.Errorf("%s finalizers %v", kind, f)
				}
			}
			return nil
		}
	}
	eventually(t, 30*time.Second, "the finalizer on every target kind",
		held(map[string]bool{"ConfigMap": true, "Widget": true, "ClusterRole": true}))

	// A kind the controller stops targeting is released too.
	if _, err := dyn.Resource(v1alpha1.DecoratorControllerGVR).Patch(ctx, dcName, types.JSONPatchType,
		[]byte(`[{"op":"remove","path":"/spec/resources/2"}]`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "the finalizer released from the ClusterRole only",
		held(map[string]bool{"ConfigMap": true, "Widget": true}))

	if err := dyn.Resource(v1alpha1.DecoratorControllerGVR).Delete(ctx, dcName, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "the finalizer released from every target", held(nil))
}
