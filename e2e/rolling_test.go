package e2e

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"regexp"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"
	watchtools "k8s.io/client-go/tools/watch"

	"github.com/metabus/metabus/internal/allinone"
	"github.com/metabus/metabus/pkg/api/v1alpha1"
)

// The end-to-end tests of declarative rolling updates (RollingRecreate and
// RollingInPlace with status checks). There is no kubelet: the tests set the
// Pods' Ready condition themselves, either step by step or with a
// goroutine playing the kubelet. Every test records the Pod event history of
// its namespace with a watch and derives its ordering assertions from it.

var rollsetsGVR = schema.GroupVersionResource{Group: "test.metabus.dev", Version: "v1", Resource: "rollsets"}

// RollSets are test parents too: they are deleted before their namespace.
func init() { testParents = append(testParents, rollsetsGVR) }

func rollImage(v int) string { return fmt.Sprintf("registry.invalid/rolling:v%d", v) }

// rollsetHook is a StatefulSet-like sync hook: for spec.replicas N it
// returns Pods <parent>-0..<parent>-N-1, in that order, with the labels and
// spec of spec.template, and reports status {replicas, readyReplicas}.
func rollsetHook(req map[string]any) (int, any) {
	parent := &unstructured.Unstructured{Object: req["parent"].(map[string]any)}
	replicas, _ := nestedInt(parent, "spec", "replicas")
	labels, _, _ := unstructured.NestedMap(parent.Object, "spec", "template", "metadata", "labels")
	spec, _, _ := unstructured.NestedMap(parent.Object, "spec", "template", "spec")
	children := []any{}
	for i := 0; i < int(replicas); i++ {
		children = append(children, map[string]any{
			"apiVersion": "v1",
			"kind":       "Pod",
			"metadata":   map[string]any{"name": fmt.Sprintf("%s-%d", parent.GetName(), i), "labels": labels},
			"spec":       spec,
		})
	}
	observed, ready := 0, 0
	all, _ := req["children"].(map[string]any)
	pods, _ := all["Pod.v1"].(map[string]any)
	for _, p := range pods {
		observed++
		pod, _ := p.(map[string]any)
		status, _ := pod["status"].(map[string]any)
		conds, _ := status["conditions"].([]any)
		for _, c := range conds {
			if c, ok := c.(map[string]any); ok && c["type"] == "Ready" && c["status"] == "True" {
				ready++
			}
		}
	}
	return 200, map[string]any{
		"status":   map[string]any{"replicas": observed, "readyReplicas": ready},
		"children": children,
	}
}

// rollsetController creates the RollSet controller: Pods roll out with
// method, gated on their Ready condition; only spec.template rolls out
// gradually (spec.replicas applies at once).
func rollsetController(t testing.TB, inst *instance, name, url, method string) {
	t.Helper()
	createController(t, inst, compositeKind, name, rollsetControllerSpec(url, method))
}

// rollsetControllerSpec is the spec of the RollSet controller that
// rollsetController creates.
func rollsetControllerSpec(url, method string) map[string]any {
	return map[string]any{
		"parentResource": map[string]any{
			"apiVersion": "test.metabus.dev/v1", "resource": "rollsets",
			"revisionHistory": map[string]any{"fieldPaths": []any{"spec.template"}},
		},
		"childResources": []any{map[string]any{
			"apiVersion": "v1", "resource": "pods",
			"updateStrategy": map[string]any{
				"method": method,
				"statusChecks": map[string]any{"conditions": []any{
					map[string]any{"type": "Ready", "status": "True"},
				}},
			},
		}},
		"hooks": map[string]any{"sync": map[string]any{"webhook": map[string]any{"url": url, "timeout": "5s"}}},
	}
}

func rollTemplate(name string, v int) map[string]any {
	return map[string]any{
		"metadata": map[string]any{"labels": map[string]any{"app": name}},
		"spec": map[string]any{"containers": []any{
			map[string]any{"name": "app", "image": rollImage(v)},
		}},
	}
}

// createRollSet creates a RollSet with replicas Pods at image version v.
func createRollSet(t testing.TB, ns, name string, replicas int64, v int) {
	t.Helper()
	rs := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "test.metabus.dev/v1",
		"kind":       "RollSet",
		"metadata":   map[string]any{"name": name},
		"spec": map[string]any{
			"selector": map[string]any{"matchLabels": map[string]any{"app": name}},
			"replicas": replicas,
			"template": rollTemplate(name, v),
		},
	}}
	if _, err := dyn.Resource(rollsetsGVR).Namespace(ns).Create(context.Background(), rs, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create RollSet: %v", err)
	}
}

func patchRollSet(ns, name, patch string) error {
	_, err := dyn.Resource(rollsetsGVR).Namespace(ns).Patch(context.Background(), name, types.MergePatchType, []byte(patch), metav1.PatchOptions{})
	return err
}

// setRollImage changes the template's image: a new revision.
func setRollImage(t testing.TB, ns, name string, v int) {
	t.Helper()
	tmpl, _ := json.Marshal(rollTemplate(name, v))
	if err := patchRollSet(ns, name, fmt.Sprintf(`{"spec":{"template":%s}}`, tmpl)); err != nil {
		t.Fatalf("set image v%d: %v", v, err)
	}
}

func scaleRollSet(t *testing.T, ns, name string, n int) {
	t.Helper()
	if err := patchRollSet(ns, name, fmt.Sprintf(`{"spec":{"replicas":%d}}`, n)); err != nil {
		t.Fatalf("scale to %d: %v", n, err)
	}
}

func podNames(parent string, n int) []string {
	names := make([]string, n)
	for i := range names {
		names[i] = fmt.Sprintf("%s-%d", parent, i)
	}
	return names
}

func podImage(pod *corev1.Pod) string {
	if len(pod.Spec.Containers) == 0 {
		return ""
	}
	return pod.Spec.Containers[0].Image
}

func podReady(pod *corev1.Pod) bool {
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

var errPodReplaced = errors.New("pod replaced")

// setPodReady plays the kubelet for one Pod object (uid): it sets the Ready
// condition and reports the Pod's generation as observed, through
// pods/status. A Pod that is gone or was replaced is left alone
// (errPodReplaced or NotFound).
func setPodReady(ctx context.Context, ns, name string, uid types.UID, ready bool) error {
	var err error
	for attempt := 0; attempt < 20; attempt++ {
		var pod *corev1.Pod
		pod, err = kube.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if uid != "" && pod.UID != uid || pod.DeletionTimestamp != nil {
			return errPodReplaced
		}
		status := corev1.ConditionFalse
		if ready {
			status = corev1.ConditionTrue
		}
		conds := []corev1.PodCondition{{Type: corev1.PodReady, Status: status, LastTransitionTime: metav1.Now()}}
		for _, c := range pod.Status.Conditions {
			if c.Type != corev1.PodReady {
				conds = append(conds, c)
			}
		}
		pod.Status.Conditions = conds
		pod.Status.ObservedGeneration = pod.Generation
		if _, err = kube.CoreV1().Pods(ns).UpdateStatus(ctx, pod, metav1.UpdateOptions{}); !apierrors.IsConflict(err) {
			return err
		}
	}
	return err
}

func markReady(t *testing.T, ns, name string, uid types.UID) {
	t.Helper()
	if err := setPodReady(context.Background(), ns, name, uid, true); err != nil {
		t.Fatalf("mark %s Ready: %v", name, err)
	}
}

// waitPod waits for Pod name to exist at image version v as an object other
// than notUID, and returns its UID.
func waitPod(t *testing.T, ns, name string, v int, notUID types.UID) types.UID {
	t.Helper()
	var uid types.UID
	eventually(t, 60*time.Second, fmt.Sprintf("%s at %s", name, rollImage(v)), func() error {
		pod, err := kube.CoreV1().Pods(ns).Get(context.Background(), name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if pod.DeletionTimestamp != nil || pod.UID == notUID || podImage(pod) != rollImage(v) {
			return fmt.Errorf("%s is %s at %s (deleting: %v)", name, pod.UID, podImage(pod), pod.DeletionTimestamp != nil)
		}
		uid = pod.UID
		return nil
	})
	return uid
}

// expectPods checks that each named Pod is still the object uids names, at
// image version v.
func expectPods(ns string, uids map[string]types.UID, v int, names ...string) error {
	for _, name := range names {
		pod, err := kube.CoreV1().Pods(ns).Get(context.Background(), name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if pod.UID != uids[name] || podImage(pod) != rollImage(v) {
			return fmt.Errorf("%s is %s at %s, want the untouched %s at %s", name, pod.UID, podImage(pod), uids[name], rollImage(v))
		}
	}
	return nil
}

func expectGone(ns string, names ...string) error {
	for _, name := range names {
		_, err := kube.CoreV1().Pods(ns).Get(context.Background(), name, metav1.GetOptions{})
		if err == nil {
			return fmt.Errorf("%s still exists", name)
		}
		if !apierrors.IsNotFound(err) {
			return err
		}
	}
	return nil
}

// rollsetUpdated returns the RollSet's Updated condition.
func rollsetUpdated(ns, name string) (status, reason, message string, err error) {
	rs, err := dyn.Resource(rollsetsGVR).Namespace(ns).Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		return "", "", "", err
	}
	conds, _, _ := unstructured.NestedSlice(rs.Object, "status", "conditions")
	for _, c := range conds {
		if m, ok := c.(map[string]any); ok && m["type"] == "Updated" {
			s, _ := m["status"].(string)
			r, _ := m["reason"].(string)
			msg, _ := m["message"].(string)
			return s, r, msg, nil
		}
	}
	return "", "", "", fmt.Errorf("no Updated condition in status %v", rs.Object["status"])
}

func wantUpdated(ns, name, status, reason string) func() error {
	return func() error {
		s, r, msg, err := rollsetUpdated(ns, name)
		if err != nil {
			return err
		}
		if s != status || r != reason {
			return fmt.Errorf("Updated is %s/%s (%s), want %s/%s", s, r, msg, status, reason)
		}
		return nil
	}
}

// wantRolledOut checks the end of a rollout as the parent reports it: a
// status for its current spec with Updated True/OnLatestRevision and every
// replica Ready.
func wantRolledOut(ns, name string, replicas int64) func() error {
	return func() error {
		rs, err := dyn.Resource(rollsetsGVR).Namespace(ns).Get(context.Background(), name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if g, _ := nestedInt(rs, "status", "observedGeneration"); g != rs.GetGeneration() {
			return fmt.Errorf("status is for generation %d, the parent is at %d", g, rs.GetGeneration())
		}
		if err := wantUpdated(ns, name, "True", "OnLatestRevision")(); err != nil {
			return err
		}
		n, _ := nestedInt(rs, "status", "replicas")
		r, _ := nestedInt(rs, "status", "readyReplicas")
		if n != replicas || r != replicas {
			return fmt.Errorf("status replicas %d, readyReplicas %d, want %d", n, r, replicas)
		}
		return nil
	}
}

// startReplicas waits for the RollSet's first Pods at image version v,
// marks them Ready and waits until the parent reports them; it returns the
// Pods' UIDs.
func startReplicas(t *testing.T, ns, name string, names []string, v int) map[string]types.UID {
	t.Helper()
	uids := map[string]types.UID{}
	for _, pod := range names {
		uids[pod] = waitPod(t, ns, pod, v, "")
		markReady(t, ns, pod, uids[pod])
	}
	eventually(t, 60*time.Second, "the first Pods Ready and on the latest revision", wantRolledOut(ns, name, int64(len(names))))
	return uids
}

// checkOneRevision checks that exactly one ControllerRevision is left for
// the parent, as upstream Metacontroller writes it: named
// rollsets.test.metabus.dev-<sha1(parent UID + parentPatch JSON)>, labelled
// with the template labels plus apiGroup and resource, controlled by the
// parent, with the parent's spec.template as parentPatch and the Pods as its
// children.
func checkOneRevision(t *testing.T, ns, name string, pods []string) {
	t.Helper()
	ctx := context.Background()
	rs, err := dyn.Resource(rollsetsGVR).Namespace(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	tmpl, _, _ := unstructured.NestedMap(rs.Object, "spec", "template")
	wantPatch := map[string]any{"spec": map[string]any{"template": tmpl}}
	patchJSON, _ := json.Marshal(wantPatch) // encoding/json sorts keys, as upstream's hash input
	sum := sha1.Sum(append([]byte(rs.GetUID()), patchJSON...))
	wantName := "rollsets.test.metabus.dev-" + hex.EncodeToString(sum[:])
	wantNames := slices.Clone(pods)
	sort.Strings(wantNames)
	nameRE := regexp.MustCompile(`^rollsets\.test\.metabus\.dev-[0-9a-f]{40}$`)
	eventually(t, 60*time.Second, "exactly one ControllerRevision, as upstream's", func() error {
		list, err := dyn.Resource(v1alpha1.ControllerRevisionGVR).Namespace(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return err
		}
		var mine []unstructured.Unstructured
		for _, cr := range list.Items {
			if ref := metav1.GetControllerOf(&cr); ref != nil && ref.UID == rs.GetUID() {
				mine = append(mine, cr)
			}
		}
		if len(mine) != 1 {
			var names []string
			for _, cr := range mine {
				names = append(names, cr.GetName())
			}
			return fmt.Errorf("%d ControllerRevisions for the parent: %v", len(mine), names)
		}
		cr := mine[0]
		if !nameRE.MatchString(cr.GetName()) {
			return fmt.Errorf("name %q does not look like upstream's", cr.GetName())
		}
		if cr.GetName() != wantName {
			return fmt.Errorf("name %q, want %q (sha1 of parent UID + parentPatch, as upstream)", cr.GetName(), wantName)
		}
		wantLabels := map[string]string{"app": name,
			"metacontroller.k8s.io/apiGroup": "test.metabus.dev", "metacontroller.k8s.io/resource": "rollsets"}
		if !reflect.DeepEqual(cr.GetLabels(), wantLabels) {
			return fmt.Errorf("labels %v, want %v", cr.GetLabels(), wantLabels)
		}
		refs := cr.GetOwnerReferences()
		if len(refs) != 1 || refs[0].Kind != "RollSet" || refs[0].APIVersion != "test.metabus.dev/v1" || refs[0].Name != name ||
			refs[0].Controller == nil || !*refs[0].Controller {
			return fmt.Errorf("ownerReferences %+v, want one controller reference to RollSet %s", refs, name)
		}
		patch, _, _ := unstructured.NestedMap(cr.Object, "parentPatch")
		if !reflect.DeepEqual(patch, wantPatch) {
			return fmt.Errorf("parentPatch %v, want %v", patch, wantPatch)
		}
		kids, _ := cr.Object["children"].([]any)
		if len(kids) != 1 {
			return fmt.Errorf("children %v, want one entry for Pods", cr.Object["children"])
		}
		kid, _ := kids[0].(map[string]any)
		group, hasGroup := kid["apiGroup"]
		gotNames, _, _ := unstructured.NestedStringSlice(kid, "names")
		sort.Strings(gotNames)
		if !hasGroup || group != "" || kid["kind"] != "Pod" || !slices.Equal(gotNames, wantNames) {
			return fmt.Errorf("children %v, want [{apiGroup: \"\", kind: Pod, names: %v}]", kids, wantNames)
		}
		return nil
	})
}

// --- The Pod event history ---

// podEvent is one watch event of a Pod, or a mark the test made.
type podEvent struct {
	Type       watch.EventType // Added, Modified, Deleted, or markEvent
	At         time.Duration   // since recording started
	Name       string          // the Pod, or what the mark says
	UID        types.UID
	Image      string // the Pod's image; for a mark, the latest template image from then on
	Ready      bool
	Deleting   bool
	Generation int64
	Observed   int64 // status.observedGeneration
}

const markEvent watch.EventType = "MARK"

func (e podEvent) String() string {
	if e.Type == markEvent {
		return fmt.Sprintf("%8.3fs ---- %s (template %s)", e.At.Seconds(), e.Name, e.Image)
	}
	uid := string(e.UID)
	if len(uid) > 8 {
		uid = uid[:8]
	}
	return fmt.Sprintf("%8.3fs %-8s %s %s %s ready=%v deleting=%v generation=%d/%d",
		e.At.Seconds(), e.Type, e.Name, uid, e.Image, e.Ready, e.Deleting, e.Observed, e.Generation)
}

// podHistory records every Pod event of a namespace, in the order the API
// server serialized them, with marks of the test's own changes interleaved.
type podHistory struct {
	start time.Time
	mu    sync.Mutex
	evs   []podEvent
	subs  []func(podEvent)
}

// recordPods starts recording the Pods of ns; the history is logged if the
// test fails.
func recordPods(t testing.TB, ns string) *podHistory {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	list, err := kube.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		cancel()
		t.Fatalf("list pods: %v", err)
	}
	lw := &cache.ListWatch{WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
		return kube.CoreV1().Pods(ns).Watch(ctx, o)
	}}
	rw, err := watchtools.NewRetryWatcherWithContext(ctx, list.ResourceVersion, lw)
	if err != nil {
		cancel()
		t.Fatalf("watch pods: %v", err)
	}
	h := &podHistory{start: time.Now()}
	for i := range list.Items {
		h.add(watch.Added, &list.Items[i])
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ev := range rw.ResultChan() {
			if pod, ok := ev.Object.(*corev1.Pod); ok {
				h.add(ev.Type, pod)
			}
		}
	}()
	t.Cleanup(func() {
		rw.Stop()
		cancel()
		<-done
		if t.Failed() {
			t.Logf("Pod history:\n%s", h)
		}
	})
	return h
}

func (h *podHistory) add(typ watch.EventType, pod *corev1.Pod) {
	ev := podEvent{
		Type: typ, Name: pod.Name, UID: pod.UID, Image: podImage(pod), Ready: podReady(pod),
		Deleting: pod.DeletionTimestamp != nil, Generation: pod.Generation, Observed: pod.Status.ObservedGeneration,
	}
	h.mu.Lock()
	ev.At = time.Since(h.start)
	h.evs = append(h.evs, ev)
	subs := slices.Clone(h.subs)
	h.mu.Unlock()
	for _, f := range subs {
		f(ev)
	}
}

// mark records a change the test is about to make; image is the template
// image from then on.
func (h *podHistory) mark(what, image string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.evs = append(h.evs, podEvent{Type: markEvent, At: time.Since(h.start), Name: what, Image: image})
}

// subscribe calls f with every later Pod event, in order, on the watch
// goroutine: f must not block.
func (h *podHistory) subscribe(f func(podEvent)) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.subs = append(h.subs, f)
}

func (h *podHistory) events() []podEvent {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.evs)
}

func (h *podHistory) String() string {
	var b strings.Builder
	for i, e := range h.events() {
		fmt.Fprintf(&b, "%4d %s\n", i, e)
	}
	return b.String()
}

// podState is a Pod as the history shows it at some point.
type podState struct {
	UID        types.UID
	Image      string
	Ready      bool
	Generation int64
	Observed   int64
}

// healthyAt says the Pod runs image and passes the rollout's status check
// (Ready, and its generation observed when it reports one).
func (s podState) healthyAt(image string) bool {
	return s.Image == image && s.Ready && (s.Observed == 0 || s.Observed >= s.Generation)
}

// replay walks the history and calls f after each event with the Pods that
// exist (and are not being deleted) at that point, and the latest template
// image marked so far.
func replay(evs []podEvent, f func(i int, ev podEvent, pods map[string]podState, latest string)) {
	pods := map[string]podState{}
	latest := ""
	for i, ev := range evs {
		switch {
		case ev.Type == markEvent:
			latest = ev.Image
		case ev.Type == watch.Deleted || ev.Deleting:
			if pods[ev.Name].UID == ev.UID {
				delete(pods, ev.Name)
			}
		default:
			pods[ev.Name] = podState{UID: ev.UID, Image: ev.Image, Ready: ev.Ready, Generation: ev.Generation, Observed: ev.Observed}
		}
		if f != nil {
			f(i, ev, pods, latest)
		}
	}
}

// stateBefore returns the Pods just before event i.
func stateBefore(evs []podEvent, i int) map[string]podState {
	var out map[string]podState
	replay(evs[:i], func(_ int, _ podEvent, pods map[string]podState, _ string) { out = pods })
	if out == nil {
		out = map[string]podState{}
	}
	return out
}

func markIndex(evs []podEvent, what string) int {
	return slices.IndexFunc(evs, func(e podEvent) bool { return e.Type == markEvent && e.Name == what })
}

// podLife is one Pod object (UID) of a name.
type podLife struct {
	UID     types.UID
	Images  []string // every image it had, in order
	Gone    int      // index of the event where it was deleted (or began deleting); -1 if never
	Created int
}

func lives(evs []podEvent, name string) []podLife {
	var out []podLife
	for i, e := range evs {
		if e.Type == markEvent || e.Name != name {
			continue
		}
		j := slices.IndexFunc(out, func(l podLife) bool { return l.UID == e.UID })
		if j < 0 {
			out = append(out, podLife{UID: e.UID, Gone: -1, Created: i})
			j = len(out) - 1
		}
		if n := len(out[j].Images); n == 0 || out[j].Images[n-1] != e.Image {
			out[j].Images = append(out[j].Images, e.Image)
		}
		if (e.Type == watch.Deleted || e.Deleting) && out[j].Gone < 0 {
			out[j].Gone = i
		}
	}
	return out
}

func describeLives(ls []podLife) string {
	var parts []string
	for _, l := range ls {
		parts = append(parts, fmt.Sprintf("%s%v", l.UID, l.Images))
	}
	return strings.Join(parts, " → ")
}

// moveIndex finds where the rollout moved Pod name from image old to image
// new: for RollingRecreate the deletion of its last object at old that a new
// object at new replaced; for RollingInPlace the update that changed its
// image. -1 if it never happened.
func moveIndex(evs []podEvent, name, old, new string, inPlace bool) int {
	if inPlace {
		prev := ""
		for i, e := range evs {
			if e.Type == markEvent || e.Name != name {
				continue
			}
			if e.Type == watch.Modified && prev == old && e.Image == new {
				return i
			}
			prev = e.Image
		}
		return -1
	}
	ls := lives(evs, name)
	for j := len(ls) - 2; j >= 0; j-- {
		if ls[j].Images[0] == old && ls[j+1].Images[0] == new {
			return ls[j].Gone
		}
	}
	return -1
}

// checkRolledInOrder checks from the history that the Pods moved from old
// to new one at a time in the given (hook) order: when Pod k was moved,
// Pods 0..k-1 were already at new and healthy, and so was every other Pod
// at new.
func checkRolledInOrder(t *testing.T, evs []podEvent, names []string, old, new string, inPlace bool) {
	t.Helper()
	for k, name := range names {
		at := moveIndex(evs, name, old, new, inPlace)
		if at < 0 {
			t.Errorf("%s was never moved from %s to %s: %s", name, old, new, describeLives(lives(evs, name)))
			continue
		}
		pods := stateBefore(evs, at)
		for _, prev := range names[:k] {
			if s, ok := pods[prev]; !ok || !s.healthyAt(new) {
				t.Errorf("%s was moved (event %d) while %s was not yet at %s and Ready (%+v, exists: %v)", name, at, prev, new, s, ok)
			}
		}
		for other, s := range pods {
			if other != name && s.Image == new && !s.healthyAt(new) {
				t.Errorf("%s was moved (event %d) while %s, already at %s, was not Ready (%+v)", name, at, other, new, s)
			}
		}
	}
}

// checkMovesGated checks every Pod deletion of a RollingRecreate history
// from index from on: the deleted Pod was not already at the latest
// template image, every other Pod at the latest image existed and was
// healthy, no Pod was missing on its way to the latest image (deleted for
// its move and not yet recreated), and every Pod before it in hook order
// that existed was already at the latest image.
func checkMovesGated(t *testing.T, evs []podEvent, names []string, from int) {
	t.Helper()
	// The image each missing Pod comes back with, by event index.
	nextImage := func(name string, i int) string {
		for _, e := range evs[i:] {
			if e.Type != markEvent && e.Name == name && e.Type != watch.Deleted && !e.Deleting {
				return e.Image
			}
		}
		return ""
	}
	latestAt := ""
	replay(evs, func(i int, ev podEvent, _ map[string]podState, latest string) {
		if ev.Type == markEvent {
			latestAt = latest
		}
		if i < from || ev.Type != watch.Deleted {
			return
		}
		if ev.Image == latestAt {
			t.Errorf("event %d: %s was deleted although it was at the latest image %s", i, ev.Name, latestAt)
		}
		before := stateBefore(evs, i)
		k := slices.Index(names, ev.Name)
		for j, other := range names {
			if other == ev.Name {
				continue
			}
			s, ok := before[other]
			switch {
			case j < k && ok && s.Image != latestAt:
				t.Errorf("event %d: %s was deleted before %s (earlier in hook order, at %s) moved to %s", i, ev.Name, other, s.Image, latestAt)
			case ok && s.Image == latestAt && !s.healthyAt(latestAt):
				t.Errorf("event %d: %s was deleted while %s, at the latest image, was not Ready (%+v)", i, ev.Name, other, s)
			case !ok && nextImage(other, i) == latestAt:
				t.Errorf("event %d: %s was deleted while %s was missing on its way to %s", i, ev.Name, other, latestAt)
			}
		}
	})
}

// maxInFlight returns the largest number of Pods among names that were at
// once missing or not Ready, after any event from index from on, and where.
func maxInFlight(evs []podEvent, names []string, from int) (max, at int) {
	replay(evs, func(i int, ev podEvent, pods map[string]podState, _ string) {
		if i < from {
			return
		}
		n := 0
		for _, name := range names {
			if s, ok := pods[name]; !ok || !s.Ready {
				n++
			}
		}
		if n > max {
			max, at = n, i
		}
	})
	return max, at
}

// autoReady plays the kubelet for ns: every new Pod object is marked Ready
// delay after it appears; then, if set, ready is called with its name and
// image (on its own goroutine).
func autoReady(t testing.TB, h *podHistory, ns string, delay time.Duration, ready func(name, image string)) {
	ctx, cancel := context.WithCancel(context.Background())
	var mu sync.Mutex
	var wg sync.WaitGroup
	seen := map[types.UID]bool{}
	t.Cleanup(func() {
		mu.Lock()
		cancel()
		mu.Unlock()
		wg.Wait()
	})
	h.subscribe(func(ev podEvent) {
		if ev.Type == watch.Deleted || ev.Deleting || ev.Ready {
			return
		}
		mu.Lock()
		defer mu.Unlock()
		if ctx.Err() != nil || seen[ev.UID] {
			return
		}
		seen[ev.UID] = true
		wg.Add(1)
		go func() {
			defer wg.Done()
			select {
			case <-time.After(delay):
			case <-ctx.Done():
				return
			}
			err := setPodReady(ctx, ns, ev.Name, ev.UID, true)
			switch {
			case err == nil:
				if ready != nil {
					ready(ev.Name, ev.Image)
				}
			case errors.Is(err, errPodReplaced), apierrors.IsNotFound(err), ctx.Err() != nil:
			default:
				t.Logf("kubelet: mark %s Ready: %v", ev.Name, err)
			}
		}()
	})
}

// --- The tests ---

// checkRolledOnce checks the Pod history of a v1 → v2 rollout that started
// at the mark "template v2": in hook order, each move gated on the earlier
// Pods, never two Pods missing or not Ready at once, and every Pod replaced
// exactly once (one object at v1, then one at v2: never updated twice, never
// skipped).
func checkRolledOnce(t *testing.T, evs []podEvent, names []string) {
	t.Helper()
	from := markIndex(evs, "template v2")
	checkRolledInOrder(t, evs, names, rollImage(1), rollImage(2), false)
	checkMovesGated(t, evs, names, from)
	if n, at := maxInFlight(evs, names, from); n > 1 {
		t.Errorf("%d Pods were missing or not Ready at once (event %d)", n, at)
	}
	for _, pod := range names {
		if ls := lives(evs, pod); len(ls) != 2 || ls[0].Images[0] != rollImage(1) || ls[1].Images[0] != rollImage(2) {
			t.Errorf("%s: want exactly one object at v1 then one at v2 (never updated twice, never skipped), got %s", pod, describeLives(ls))
		}
	}
}

// startRollSet runs metabus with a RollSet controller using method, creates
// the RollSet name with replicas Pods at image v1 and marks them Ready. It
// returns the namespace, the Pod history recorder, the names of the first
// pods Pods in hook order, and the UIDs of the running ones.
func startRollSet(t *testing.T, ctrl, method, name string, pods, replicas int) (string, *podHistory, []string, map[string]types.UID) {
	t.Helper()
	return startRollSetWith(t, allinone.Config{}, ctrl, method, name, pods, replicas)
}

// startRollSetWith is startRollSet with metabus configured by cfg.
func startRollSetWith(t *testing.T, cfg allinone.Config, ctrl, method, name string, pods, replicas int) (string, *podHistory, []string, map[string]types.UID) {
	t.Helper()
	inst := startMetabus(t, cfg, nil)
	ns := newNamespace(t)
	h := recordPods(t, ns)
	url := hookServer(t, jsonHook(rollsetHook))
	rollsetController(t, inst, ctrl, url, method)
	names := podNames(name, pods)
	createRollSet(t, ns, name, int64(replicas), 1)
	return ns, h, names, startReplicas(t, ns, name, names[:replicas], 1)
}

// TestRollingRecreateInOrder: a template change recreates the Pods one at a
// time in hook order, each only once the previous one is Ready; while the
// updated Pod is not Ready the rollout waits (Updated False/RolloutWaiting)
// and resumes when it is. At the end a single ControllerRevision is left,
// shaped as upstream's. Both apply strategies.
func TestRollingRecreateInOrder(t *testing.T) {
	withStrategies(t, testRollingRecreateInOrder)
}

func testRollingRecreateInOrder(t *testing.T, cfg allinone.Config) {
	const name = "web"
	ns, h, names, old := startRollSetWith(t, cfg, "rollsets-recreate", "RollingRecreate", name, 3, 3)

	h.mark("template v2", rollImage(2))
	setRollImage(t, ns, name, 2)
	for k, pod := range names {
		uid := waitPod(t, ns, pod, 2, old[pod])
		eventually(t, 30*time.Second, fmt.Sprintf("the rollout to wait for %s", pod), wantUpdated(ns, name, "False", "RolloutWaiting"))
		if k == 0 {
			// Hold the updated Pod not Ready: nothing else may change.
			time.Sleep(2 * time.Second)
			if err := expectPods(ns, old, 1, names[1:]...); err != nil {
				t.Fatalf("while %s was not Ready: %v", pod, err)
			}
			if err := wantUpdated(ns, name, "False", "RolloutWaiting")(); err != nil {
				t.Fatalf("while %s was not Ready: %v", pod, err)
			}
		}
		markReady(t, ns, pod, uid)
	}
	eventually(t, 60*time.Second, "the rollout to complete", wantRolledOut(ns, name, 3))
	checkOneRevision(t, ns, name, names)

	checkRolledOnce(t, h.events(), names)
}

// TestRollingScaleDuringRollout: replicas are not part of the revision
// history, so scaling applies at once mid-rollout: new Pods start at the
// new template even while the rollout waits, removed Pods go (whatever
// their revision), and the rollout of the remaining ones completes in order.
func TestRollingScaleDuringRollout(t *testing.T) {
	const name = "scaled"
	ns, h, names, old := startRollSet(t, "rollsets-scale", "RollingRecreate", name, 5, 3)

	h.mark("template v2", rollImage(2))
	setRollImage(t, ns, name, 2)
	up0 := waitPod(t, ns, names[0], 2, old[names[0]])
	eventually(t, 30*time.Second, "the rollout to wait for "+names[0], wantUpdated(ns, name, "False", "RolloutWaiting"))

	// Scale up while the rollout waits: the new Pods are created at once, at v2.
	h.mark("scale to 5", rollImage(2))
	scaleRollSet(t, ns, name, 5)
	waitPod(t, ns, names[3], 2, "")
	waitPod(t, ns, names[4], 2, "")
	if err := expectPods(ns, old, 1, names[1:3]...); err != nil {
		t.Fatalf("after scaling up: %v", err)
	}

	// Scale down: the Pods past the new count go, the v1 one included.
	h.mark("scale to 2", rollImage(2))
	scaleRollSet(t, ns, name, 2)
	eventually(t, 30*time.Second, "the Pods beyond 2 replicas to go", func() error { return expectGone(ns, names[2:]...) })
	if err := expectPods(ns, old, 1, names[1]); err != nil {
		t.Fatalf("after scaling down: %v", err)
	}

	markReady(t, ns, names[0], up0)
	up1 := waitPod(t, ns, names[1], 2, old[names[1]])
	markReady(t, ns, names[1], up1)
	eventually(t, 60*time.Second, "the rollout to complete", wantRolledOut(ns, name, 2))
	checkOneRevision(t, ns, name, names[:2])

	evs := h.events()
	checkRolledInOrder(t, evs, names[:2], rollImage(1), rollImage(2), false)
	for _, pod := range names[3:] {
		if ls := lives(evs, pod); len(ls) != 1 || !slices.Equal(ls[0].Images, []string{rollImage(2)}) {
			t.Errorf("%s: want one object, created at v2, got %s", pod, describeLives(ls))
		}
	}
	ls := lives(evs, names[2])
	if len(ls) != 1 || !slices.Equal(ls[0].Images, []string{rollImage(1)}) {
		t.Errorf("%s: want its one v1 object only (removed, never rolled), got %s", names[2], describeLives(ls))
	} else if ls[0].Gone < markIndex(evs, "scale to 2") {
		t.Errorf("%s was deleted (event %d) before the scale-down", names[2], ls[0].Gone)
	}
}

// TestRollingChildDeletedMidRollout: a Pod deleted before its turn is
// recreated at its own (old) revision, and later rolled like the others.
func TestRollingChildDeletedMidRollout(t *testing.T) {
	ctx := context.Background()
	const name = "drained"
	ns, h, names, old := startRollSet(t, "rollsets-deleted", "RollingRecreate", name, 3, 3)

	h.mark("template v2", rollImage(2))
	setRollImage(t, ns, name, 2)
	up0 := waitPod(t, ns, names[0], 2, old[names[0]])
	eventually(t, 30*time.Second, "the rollout to wait for "+names[0], wantUpdated(ns, name, "False", "RolloutWaiting"))

	if err := expectPods(ns, old, 1, names[1:]...); err != nil {
		t.Fatalf("while %s was not Ready: %v", names[0], err)
	}
	// A node drain deletes the last Pod, which has not been moved yet.
	h.mark("delete "+names[2], rollImage(2))
	victim := old[names[2]]
	if err := kube.CoreV1().Pods(ns).Delete(ctx, names[2], metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &victim}}); err != nil {
		t.Fatal(err)
	}
	back := waitPod(t, ns, names[2], 1, victim)
	if err := expectPods(ns, old, 1, names[1]); err != nil {
		t.Fatalf("after the drain: %v", err)
	}
	markReady(t, ns, names[2], back)

	markReady(t, ns, names[0], up0)
	up1 := waitPod(t, ns, names[1], 2, old[names[1]])
	markReady(t, ns, names[1], up1)
	up2 := waitPod(t, ns, names[2], 2, back)
	markReady(t, ns, names[2], up2)
	eventually(t, 60*time.Second, "the rollout to complete", wantRolledOut(ns, name, 3))
	checkOneRevision(t, ns, name, names)

	evs := h.events()
	checkRolledInOrder(t, evs, names, rollImage(1), rollImage(2), false)
	want := []string{rollImage(1), rollImage(1), rollImage(2)}
	ls := lives(evs, names[2])
	var got []string
	for _, l := range ls {
		got = append(got, l.Images...)
	}
	if !slices.Equal(got, want) {
		t.Errorf("%s: want objects at %v (the drained one, its replacement at its own revision, its update), got %s", names[2], want, describeLives(ls))
	}
}

// TestRollingInPlace: RollingInPlace updates the Pods in place (same
// objects), one at a time in hook order, each once the previous one has
// observed its update (status.observedGeneration) and is Ready again.
// Both apply strategies.
func TestRollingInPlace(t *testing.T) {
	withStrategies(t, testRollingInPlace)
}

func testRollingInPlace(t *testing.T, cfg allinone.Config) {
	ctx := context.Background()
	const name = "inplace"
	ns, h, names, old := startRollSetWith(t, cfg, "rollsets-inplace", "RollingInPlace", name, 3, 3)

	h.mark("template v2", rollImage(2))
	setRollImage(t, ns, name, 2)
	for k, pod := range names {
		eventually(t, 60*time.Second, pod+" updated in place", func() error {
			p, err := kube.CoreV1().Pods(ns).Get(ctx, pod, metav1.GetOptions{})
			if err != nil {
				return err
			}
			if p.UID != old[pod] {
				return fmt.Errorf("%s was replaced", pod)
			}
			if podImage(p) != rollImage(2) {
				return fmt.Errorf("%s at %s", pod, podImage(p))
			}
			if p.Generation <= p.Status.ObservedGeneration {
				return fmt.Errorf("%s: the update did not bump metadata.generation (%d, observed %d)", pod, p.Generation, p.Status.ObservedGeneration)
			}
			return nil
		})
		// Its "kubelet" has not seen the update yet: it still reports
		// Ready for the old spec, which must not count.
		if k == 0 {
			time.Sleep(1500 * time.Millisecond)
			if err := expectPods(ns, old, 1, names[1:]...); err != nil {
				t.Fatalf("before %s observed its update: %v", pod, err)
			}
			if s, r, msg, err := rollsetUpdated(ns, name); err != nil || s != "False" {
				t.Fatalf("before %s observed its update: Updated %s/%s (%s), %v", pod, s, r, msg, err)
			}
		}
		// It restarts with the new spec: observed, not Ready.
		if err := setPodReady(ctx, ns, pod, old[pod], false); err != nil {
			t.Fatal(err)
		}
		eventually(t, 30*time.Second, fmt.Sprintf("the rollout to wait for %s", pod), wantUpdated(ns, name, "False", "RolloutWaiting"))
		if k == 0 {
			time.Sleep(1500 * time.Millisecond)
			if err := expectPods(ns, old, 1, names[1:]...); err != nil {
				t.Fatalf("while %s was not Ready: %v", pod, err)
			}
		}
		markReady(t, ns, pod, old[pod])
	}
	eventually(t, 60*time.Second, "the rollout to complete", wantRolledOut(ns, name, 3))
	checkOneRevision(t, ns, name, names)

	evs := h.events()
	checkRolledInOrder(t, evs, names, rollImage(1), rollImage(2), true)
	for _, pod := range names {
		if ls := lives(evs, pod); len(ls) != 1 || !slices.Equal(ls[0].Images, []string{rollImage(1), rollImage(2)}) {
			t.Errorf("%s: want one object updated from v1 to v2, got %s", pod, describeLives(ls))
		}
	}
}

// TestRollingTwoAppliersNeverInterleave: with two dispatchers and two
// appliers, a rollout that is superseded mid-way (v1 → v2, then v3 while a
// Pod is being moved to v2) never has two Pods of the latest template in
// flight, never moves a Pod while one at the latest template is unhealthy,
// never applies the parent on two appliers at once, and ends at v3 with one
// ControllerRevision.
//
// "In flight" is missing or not Ready. Upstream's rule only gates on the
// children of the latest revision, so the one Pod that was in flight for v2
// when v3 came may still be coming back at v2 while v3's first Pod moves:
// that Pod is counted separately (at most one such, at most two in all).
func TestRollingTwoAppliersNeverInterleave(t *testing.T) {
	tracer := newOverlapTracer()
	inst := startMetabus(t, allinone.Config{Appliers: 2, Dispatchers: 2}, tracer.trace)
	ns := newNamespace(t)
	h := recordPods(t, ns)
	url := hookServer(t, jsonHook(rollsetHook))
	rollsetController(t, inst, "rollsets-two-appliers", url, "RollingRecreate")
	const name = "twice"
	names := podNames(name, 4)

	// pod 1 deleted for v2 → supersede with v3 right then.
	var once sync.Once
	superseded := make(chan error, 1)
	h.subscribe(func(ev podEvent) {
		if ev.Type == watch.Deleted && ev.Name == names[1] && ev.Image == rollImage(1) {
			once.Do(func() {
				go func() {
					h.mark("template v3", rollImage(3))
					tmpl, _ := json.Marshal(rollTemplate(name, 3))
					superseded <- patchRollSet(ns, name, fmt.Sprintf(`{"spec":{"template":%s}}`, tmpl))
				}()
			})
		}
	})
	autoReady(t, h, ns, 300*time.Millisecond, nil)
	createRollSet(t, ns, name, 4, 1)
	eventually(t, 60*time.Second, "the first Pods Ready", wantRolledOut(ns, name, 4))

	h.mark("template v2", rollImage(2))
	setRollImage(t, ns, name, 2)
	select {
	case err := <-superseded:
		if err != nil {
			t.Fatalf("set image v3: %v", err)
		}
	case <-time.After(60 * time.Second):
		t.Fatalf("%s was never deleted for v2", names[1])
	}
	eventually(t, 90*time.Second, "the rollout to v3 to complete", func() error {
		for _, pod := range names {
			p, err := kube.CoreV1().Pods(ns).Get(context.Background(), pod, metav1.GetOptions{})
			if err != nil {
				return err
			}
			if podImage(p) != rollImage(3) || !podReady(p) {
				return fmt.Errorf("%s at %s, ready %v", pod, podImage(p), podReady(p))
			}
		}
		return wantRolledOut(ns, name, 4)()
	})
	checkOneRevision(t, ns, name, names)

	evs := h.events()
	from := markIndex(evs, "template v2")
	checkMovesGated(t, evs, names, from)
	// In flight, by the template image each episode ends at.
	strict, _ := maxInFlight(evs, names, from)
	latest, total := 0, 0
	var latestAt, totalAt int
	replay(evs, func(i int, ev podEvent, pods map[string]podState, img string) {
		if i < from {
			return
		}
		nl, nt := 0, 0
		for _, pod := range names {
			if s, ok := pods[pod]; ok && s.Ready {
				continue
			}
			nt++
			if episodeTarget(evs, pod, i) == img {
				nl++
			}
		}
		if nl > latest {
			latest, latestAt = nl, i
		}
		if nt > total {
			total, totalAt = nt, i
		}
	})
	t.Logf("at most %d Pods in flight at once (%d of them for the latest template)", strict, latest)
	if latest > 1 {
		t.Errorf("%d Pods were in flight for the latest template at once (event %d)", latest, latestAt)
	}
	if total > 2 {
		t.Errorf("%d Pods were in flight at once (event %d)", total, totalAt)
	}
	for _, pod := range names {
		ls := lives(evs, pod)
		var seq []string
		for _, l := range ls {
			seq = append(seq, l.Images...)
		}
		forward := len(seq) > 0 && seq[len(seq)-1] == rollImage(3)
		for j := 1; j < len(seq); j++ {
			forward = forward && seq[j-1] < seq[j]
		}
		if !forward {
			t.Errorf("%s: images must only move forward to v3, each once: %s", pod, describeLives(ls))
		}
	}
	if n := tracer.overlaps.Load(); n != 0 {
		t.Errorf("%d times the parent was handled by two replicas at once: %v", n, tracer.where)
	}
	if tracer.calls.Load() == 0 {
		t.Errorf("tracer saw nothing: the test is not instrumented")
	}
}

// episodeTarget is the image Pod name has when it is next Ready at or after
// event i (the end of its current in-flight episode); "" if never.
func episodeTarget(evs []podEvent, name string, i int) string {
	for _, e := range evs[i:] {
		if e.Type != markEvent && e.Name == name && e.Type != watch.Deleted && !e.Deleting && e.Ready {
			return e.Image
		}
	}
	return ""
}

// TestRollingHookPerRevision: while a rollout is in progress the sync hook is
// asked about the parent as of every live revision (the old template and the
// new one), and those calls run at the same time, so a slow hook costs one
// hook latency per sync rather than one per revision. During the rollout the
// hook holds each call until another one is in flight (an old-template call
// waits up to 3s, a new-template one 0.5s) and records how many it saw at
// once.
func TestRollingHookPerRevision(t *testing.T) {
	var (
		mu          sync.Mutex
		rolling     bool
		inflight    int
		maxInflight int
		seen        = map[string]bool{} // template images asked about during the rollout
		arrived     = sync.NewCond(&mu)
	)
	hook := jsonHook(func(req map[string]any) (int, any) {
		parent := &unstructured.Unstructured{Object: req["parent"].(map[string]any)}
		containers, _, _ := unstructured.NestedSlice(parent.Object, "spec", "template", "spec", "containers")
		image := ""
		if len(containers) > 0 {
			image, _ = containers[0].(map[string]any)["image"].(string)
		}
		mu.Lock()
		inflight++
		maxInflight = max(maxInflight, inflight)
		arrived.Broadcast()
		if rolling {
			seen[image] = true
			wait := 500 * time.Millisecond
			if image == rollImage(1) {
				wait = 3 * time.Second
			}
			for deadline := time.Now().Add(wait); inflight < 2 && time.Now().Before(deadline); {
				go func() { time.Sleep(100 * time.Millisecond); arrived.Broadcast() }()
				arrived.Wait()
			}
		}
		inflight--
		mu.Unlock()
		return rollsetHook(req)
	})
	inst := startMetabus(t, allinone.Config{}, nil)
	ns := newNamespace(t)
	h := recordPods(t, ns)
	rollsetController(t, inst, "rollsets-per-revision", hookServer(t, hook), "RollingRecreate")
	const name = "per-revision"
	names := podNames(name, 2)
	createRollSet(t, ns, name, 2, 1)
	old := startReplicas(t, ns, name, names, 1)
	autoReady(t, h, ns, 0, nil)

	mu.Lock()
	rolling, maxInflight = true, 0
	mu.Unlock()
	setRollImage(t, ns, name, 2)
	waitPod(t, ns, names[0], 2, old[names[0]])
	eventually(t, 60*time.Second, "the rollout to complete", wantRolledOut(ns, name, 2))

	mu.Lock()
	defer mu.Unlock()
	rolling = false
	if !seen[rollImage(1)] || !seen[rollImage(2)] {
		t.Errorf("during the rollout the hook was asked about templates %v, want both v1 and v2", seen)
	}
	if maxInflight < 2 {
		t.Errorf("at most %d hook call(s) at once: the revisions of a parent were asked one after another", maxInflight)
	}
}
