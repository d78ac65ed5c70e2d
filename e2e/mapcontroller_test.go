package e2e

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base32"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/yaml"

	"github.com/metabus/metabus/internal/allinone"
	"github.com/metabus/metabus/pkg/api/v1alpha1"
)

// MapController end to end (issue #11). The SnapshotSchedule of the
// design proposal is played with CRDs of the tests' own
// (testdata/mapcontroller/crds.yaml): SnapSchedule parents select Disks
// (standing in for PersistentVolumeClaims) by spec.selector, and the map
// hook makes DiskSnapshots (standing in for VolumeSnapshots) of each.
//
// What the tests know about the product they state themselves rather
// than import, so that a wrong constant in the product cannot make them
// agree with it: the tag names, the map key's encoding, the shape of the
// hook bodies and of the aggregated status.

// mapCtlKind is MapController, under a name of this file's own (the
// other kinds' constants live in framework_test.go).
const mapCtlKind = v1alpha1.MapControllerKind

func init() {
	// The tests' own resource for the kind, like the other kinds' rows of
	// controllerGVRs.
	if _, ok := controllerGVRs[mapCtlKind]; !ok {
		controllerGVRs[mapCtlKind] = v1alpha1.MapControllerGVR
	}
}

// The tag every output carries.
const (
	mapKeyLabel        = "metacontroller.k8s.io/map-key"
	mapInputAnnotation = "metacontroller.k8s.io/map-input"
)

const mapGroup = "mapctl.e2e.metabus.dev"

var (
	snapSchedulesGVR = schema.GroupVersionResource{Group: mapGroup, Version: "v1", Resource: "snapschedules"}
	disksGVR         = schema.GroupVersionResource{Group: mapGroup, Version: "v1", Resource: "disks"}
	diskSnapshotsGVR = schema.GroupVersionResource{Group: mapGroup, Version: "v1", Resource: "disksnapshots"}
	transformsGVR    = schema.GroupVersionResource{Group: mapGroup, Version: "v1", Resource: "transforms"}
)

// diskSnapshotType is the key of the DiskSnapshots in a hook request's
// outputs: Kind.apiVersion, as a CompositeController's children are keyed.
const diskSnapshotType = "DiskSnapshot." + mapGroup + "/v1"

// mapKeyOf is the map key of an input as the issue defines it: SHA-256 of
// the JSON array [group, kind, namespace, name, uid], in lower-case
// base32 without padding. The encoding is frozen (existing outputs carry
// it), so the tests pin it.
func mapKeyOf(input *unstructured.Unstructured) string {
	gv, err := schema.ParseGroupVersion(input.GetAPIVersion())
	if err != nil {
		return "bad apiVersion " + input.GetAPIVersion()
	}
	data, _ := json.Marshal([]string{gv.Group, input.GetKind(), input.GetNamespace(), input.GetName(), string(input.GetUID())})
	sum := sha256.Sum256(data)
	return strings.ToLower(base32.StdEncoding.WithPadding(base32.NoPadding).EncodeToString(sum[:]))
}

// mapInputOf is the annotation naming input on its outputs.
func mapInputOf(input *unstructured.Unstructured) string {
	gv, _ := schema.ParseGroupVersion(input.GetAPIVersion())
	return strings.Join([]string{gv.Group, input.GetKind(), input.GetNamespace(), input.GetName(), string(input.GetUID())}, "/")
}

// mapCRDs installs the tests' CRDs once per run.
var mapCRDs struct {
	once sync.Once
	err  error
}

// ensureMapCRDs installs testdata/mapcontroller/crds.yaml (TestMain has,
// before kube-controller-manager started) and waits until the garbage
// collector works for them: it only looks for new types every 30s, so a
// parent deleted before that would keep its outputs for reasons that have
// nothing to do with metabus.
func ensureMapCRDs(t *testing.T) {
	t.Helper()
	mapCRDs.once.Do(func() { mapCRDs.err = installMapCRDs() })
	if mapCRDs.err != nil {
		t.Fatalf("install the MapController test CRDs: %v", mapCRDs.err)
	}
}

func installMapCRDs() error {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	if err := env.Apply(ctx, "testdata/mapcontroller/crds.yaml"); err != nil {
		return err
	}
	// The probe: a SnapSchedule owning a DiskSnapshot, deleted in the
	// foreground. It goes only once the collector has seen it being
	// deleted (so it watches SnapSchedules) and has deleted the
	// DiskSnapshot (so it watches those too).
	const ns, name = metav1.NamespaceDefault, "mapctl-gc-probe"
	owner, err := dyn.Resource(snapSchedulesGVR).Namespace(ns).Create(ctx, &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": mapGroup + "/v1", "kind": "SnapSchedule",
		"metadata": map[string]any{"name": name},
		// Selects nothing, should a MapController see it meanwhile.
		"spec": map[string]any{"selector": map[string]any{"matchLabels": map[string]any{"gc-probe": "none"}}},
	}}, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("create the probe owner: %w", err)
	}
	block := true
	dep := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": mapGroup + "/v1", "kind": "DiskSnapshot",
		"metadata": map[string]any{"name": name},
	}}
	dep.SetOwnerReferences([]metav1.OwnerReference{{APIVersion: mapGroup + "/v1", Kind: "SnapSchedule",
		Name: name, UID: owner.GetUID(), Controller: &block, BlockOwnerDeletion: &block}})
	if _, err := dyn.Resource(diskSnapshotsGVR).Namespace(ns).Create(ctx, dep, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("create the probe dependent: %w", err)
	}
	fg := metav1.DeletePropagationForeground
	if err := dyn.Resource(snapSchedulesGVR).Namespace(ns).Delete(ctx, name, metav1.DeleteOptions{PropagationPolicy: &fg}); err != nil {
		return fmt.Errorf("delete the probe owner: %w", err)
	}
	start := time.Now()
	for {
		_, errO := dyn.Resource(snapSchedulesGVR).Namespace(ns).Get(ctx, name, metav1.GetOptions{})
		_, errD := dyn.Resource(diskSnapshotsGVR).Namespace(ns).Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(errO) && apierrors.IsNotFound(errD) {
			fmt.Printf("mapcontroller e2e: the garbage collector handles the test CRDs (after %s)\n", time.Since(start).Round(time.Second))
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("the garbage collector never collected the probe (owner: %v, dependent: %v)", errO, errD)
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// cleanupParents deletes the parents of gvr in ns when the test ends, and
// waits for them to go, before the namespace is deleted (register it after
// newNamespace: cleanups run last first). Every MapController watches its
// parent resource in every namespace, so the next test's controller would
// otherwise map the leftovers of this one.
func cleanupParents(t *testing.T, gvr schema.GroupVersionResource, ns string) {
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		_ = dyn.Resource(gvr).Namespace(ns).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{})
		for ctx.Err() == nil {
			if l, err := dyn.Resource(gvr).Namespace(ns).List(ctx, metav1.ListOptions{}); err == nil && len(l.Items) == 0 {
				return
			}
			time.Sleep(100 * time.Millisecond)
		}
	})
}

// mapHooks serves a MapController's map and tombstone hooks, counts the
// calls per map key and checks the shape of every request (the problems
// fail the test when it ends).
type mapHooks struct {
	mapFn, tombstoneFn func(req map[string]any) (int, any)
	// outputTypes are the keys every request's outputs must have.
	outputTypes []string

	mu        sync.Mutex
	mapCalls  map[string]int
	tombCalls map[string]int
	// inputs are the inputs the map hook was shown, as namespace/name.
	inputs map[string]bool
	// lastMap and lastTomb are the latest request per key; firstTomb the
	// first tombstone request.
	lastMap, lastTomb, firstTomb map[string]map[string]any
	// mapsBeforeTomb is, per key, the number of map calls when the first
	// tombstone call came.
	mapsBeforeTomb map[string]int
	lastCall       time.Time
	problems       []string
}

func newMapHooks(t *testing.T, outputTypes []string, mapFn, tombstoneFn func(req map[string]any) (int, any)) *mapHooks {
	h := &mapHooks{
		mapFn: mapFn, tombstoneFn: tombstoneFn, outputTypes: outputTypes,
		mapCalls: map[string]int{}, tombCalls: map[string]int{}, inputs: map[string]bool{},
		lastMap: map[string]map[string]any{}, lastTomb: map[string]map[string]any{}, firstTomb: map[string]map[string]any{},
		mapsBeforeTomb: map[string]int{},
	}
	t.Cleanup(func() {
		h.mu.Lock()
		defer h.mu.Unlock()
		for _, p := range h.problems {
			t.Errorf("hook request: %s", p)
		}
	})
	return h
}

func (h *mapHooks) handler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/map", jsonHook(h.serveMap))
	mux.Handle("/tombstone", jsonHook(h.serveTombstone))
	return mux
}

// checkCommon checks what both requests have; callers hold h.mu.
func (h *mapHooks) checkCommon(hook string, req map[string]any) string {
	key, _ := req["mapKey"].(string)
	if len(key) != 52 {
		h.problems = append(h.problems, fmt.Sprintf("%s: mapKey %q is not a 52-character key", hook, key))
	}
	if c, _ := req["controller"].(map[string]any); c["kind"] != mapCtlKind {
		h.problems = append(h.problems, fmt.Sprintf("%s: controller is not the MapController: %v", hook, req["controller"]))
	}
	if p, _ := req["parent"].(map[string]any); p["metadata"] == nil {
		h.problems = append(h.problems, fmt.Sprintf("%s: no parent", hook))
	}
	outs, ok := req["outputs"].(map[string]any)
	if !ok {
		h.problems = append(h.problems, fmt.Sprintf("%s: outputs is not an object: %v", hook, req["outputs"]))
	}
	for _, typ := range h.outputTypes {
		if _, ok := outs[typ].(map[string]any); !ok {
			h.problems = append(h.problems, fmt.Sprintf("%s: outputs has no %s entry (every declared type, even empty): %v", hook, typ, sortedKeys(outs)))
		}
	}
	// Outputs of other keys are neither shown nor touched.
	for typ, objs := range outs {
		byName, _ := objs.(map[string]any)
		for name, o := range byName {
			u := &unstructured.Unstructured{Object: o.(map[string]any)}
			if got := u.GetLabels()[mapKeyLabel]; got != key {
				h.problems = append(h.problems, fmt.Sprintf("%s for key %s shown %s %s of key %q", hook, key, typ, name, got))
			}
		}
	}
	h.lastCall = time.Now()
	return key
}

func (h *mapHooks) serveMap(req map[string]any) (int, any) {
	h.mu.Lock()
	key := h.checkCommon("map", req)
	in, _ := req["input"].(map[string]any)
	if in == nil {
		h.problems = append(h.problems, "map: no input")
	} else {
		input := &unstructured.Unstructured{Object: in}
		h.inputs[input.GetNamespace()+"/"+input.GetName()] = true
		if want := mapKeyOf(input); key != want {
			h.problems = append(h.problems, fmt.Sprintf("map: mapKey %s for input %s, want %s", key, input.GetName(), want))
		}
	}
	h.mapCalls[key]++
	h.lastMap[key] = req
	h.mu.Unlock()
	return h.mapFn(req)
}

func (h *mapHooks) serveTombstone(req map[string]any) (int, any) {
	h.mu.Lock()
	key := h.checkCommon("tombstone", req)
	if in, found := req["input"]; found && in != nil {
		// The design sends no input: it may be gone for good.
		h.problems = append(h.problems, fmt.Sprintf("tombstone: key %s was sent an input", key))
	}
	if h.tombCalls[key] == 0 {
		h.firstTomb[key] = req
		h.mapsBeforeTomb[key] = h.mapCalls[key]
	}
	h.tombCalls[key]++
	h.lastTomb[key] = req
	h.mu.Unlock()
	if h.tombstoneFn == nil {
		return 500, map[string]any{"error": "this controller has no tombstone hook"}
	}
	return h.tombstoneFn(req)
}

func (h *mapHooks) mapCount(key string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.mapCalls[key]
}

func (h *mapHooks) tombCount(key string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.tombCalls[key]
}

func (h *mapHooks) mapCounts() map[string]int {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := map[string]int{}
	for k, n := range h.mapCalls {
		out[k] = n
	}
	return out
}

func (h *mapHooks) sawInput(ns, name string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.inputs[ns+"/"+name]
}

// settle waits until no hook has been called for quiet: whatever
// converging the test has caused so far is over, so that the calls after
// its next step are that step's.
func (h *mapHooks) settle(t *testing.T, quiet, timeout time.Duration) {
	t.Helper()
	eventually(t, timeout, "the hooks to settle", func() error {
		h.mu.Lock()
		defer h.mu.Unlock()
		if since := time.Since(h.lastCall); since < quiet {
			return fmt.Errorf("last call %s ago", since.Round(time.Millisecond))
		}
		return nil
	})
}

// outputsOf returns a request's outputs of one type, by name.
func outputsOf(req map[string]any, typ string) map[string]any {
	outs, _ := req["outputs"].(map[string]any)
	m, _ := outs[typ].(map[string]any)
	return m
}

// snapshotMap is the SnapshotSchedule-shaped map hook: every Disk gets a
// daily and a weekly DiskSnapshot of its current spec.version.
func snapshotMap(req map[string]any) (int, any) {
	disk := &unstructured.Unstructured{Object: req["input"].(map[string]any)}
	version, _ := nestedInt(disk, "spec", "version")
	var outs []any
	for _, sched := range []string{"daily", "weekly"} {
		outs = append(outs, diskSnapshot(disk.GetName()+"-"+sched, disk.GetName(), version))
	}
	return 200, map[string]any{"outputs": outs}
}

func diskSnapshot(name, disk string, version int64) map[string]any {
	return map[string]any{
		"apiVersion": mapGroup + "/v1", "kind": "DiskSnapshot",
		"metadata": map[string]any{"name": name},
		"spec":     map[string]any{"source": disk, "version": version},
	}
}

// snapshotController is a MapController spec: SnapSchedules map Disks to
// DiskSnapshots (InPlace), through hooks served at url.
func snapshotController(url string, tombstone bool, resyncSeconds int64, timeout string) map[string]any {
	hooks := map[string]any{"map": map[string]any{"webhook": map[string]any{"url": url + "/map"}}}
	if timeout != "" {
		hooks["map"].(map[string]any)["webhook"].(map[string]any)["timeout"] = timeout
	}
	if tombstone {
		hooks["tombstone"] = map[string]any{"webhook": map[string]any{"url": url + "/tombstone"}}
	}
	spec := map[string]any{
		"parentResource": map[string]any{"apiVersion": mapGroup + "/v1", "resource": "snapschedules"},
		"inputResources": []any{map[string]any{"apiVersion": mapGroup + "/v1", "resource": "disks"}},
		"outputResources": []any{map[string]any{"apiVersion": mapGroup + "/v1", "resource": "disksnapshots",
			"updateStrategy": map[string]any{"method": "InPlace"}}},
		"hooks": hooks,
	}
	if resyncSeconds > 0 {
		spec["resyncPeriodSeconds"] = resyncSeconds
	}
	return spec
}

// createDisk creates a Disk input with labels and a spec.
func createDisk(t *testing.T, ns, name string, labels map[string]string, spec map[string]any) *unstructured.Unstructured {
	t.Helper()
	d := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": mapGroup + "/v1", "kind": "Disk",
		"metadata": map[string]any{"name": name},
		"spec":     spec,
	}}
	d.SetLabels(labels)
	out, err := dyn.Resource(disksGVR).Namespace(ns).Create(context.Background(), d, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create Disk %s: %v", name, err)
	}
	return out
}

// createMapParent creates a parent of gvr (kind) whose spec.selector is
// selector.
func createMapParent(t *testing.T, gvr schema.GroupVersionResource, kind, ns, name string, selector map[string]any) *unstructured.Unstructured {
	t.Helper()
	p := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": mapGroup + "/v1", "kind": kind,
		"metadata": map[string]any{"name": name},
		"spec":     map[string]any{"selector": selector},
	}}
	out, err := dyn.Resource(gvr).Namespace(ns).Create(context.Background(), p, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create %s %s: %v", kind, name, err)
	}
	return out
}

func mergePatch(t *testing.T, gvr schema.GroupVersionResource, ns, name string, patch any, subresources ...string) {
	t.Helper()
	data, err := json.Marshal(patch)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := dyn.Resource(gvr).Namespace(ns).Patch(context.Background(), name, types.MergePatchType, data, metav1.PatchOptions{}, subresources...); err != nil {
		t.Fatalf("patch %s %s with %s: %v", gvr.Resource, name, data, err)
	}
}

// wantOutputs checks the tagged objects of gvr in ns that parent controls: one
// per entry of want (output name → the input it is made from), each
// tagged with its input's key and annotation and owned by the parent as
// its controller (blocking its deletion). check, if set, looks further at
// each output and its input.
func wantOutputs(ctx context.Context, gvr schema.GroupVersionResource, ns string, parent *unstructured.Unstructured,
	want map[string]*unstructured.Unstructured, check func(out, in *unstructured.Unstructured) error) func() error {
	return func() error {
		list, err := dyn.Resource(gvr).Namespace(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return err
		}
		got := map[string]*unstructured.Unstructured{}
		for i := range list.Items {
			o := &list.Items[i]
			if _, tagged := o.GetLabels()[mapKeyLabel]; !tagged {
				// Not made by metabus (TestMapConfigMapTransform makes
				// one by hand): an output it made without its tag would
				// be missing from what this finds.
				continue
			}
			if ref := metav1.GetControllerOfNoCopy(o); ref != nil && ref.UID == parent.GetUID() {
				got[o.GetName()] = o
			}
		}
		if g, w := strings.Join(sortedKeys(got), ","), strings.Join(sortedKeys(want), ","); g != w {
			return fmt.Errorf("outputs of %s: %s, want %s", parent.GetName(), g, w)
		}
		for name, in := range want {
			o := got[name]
			ref := metav1.GetControllerOfNoCopy(o)
			if ref.Kind != parent.GetKind() || ref.Name != parent.GetName() || ref.BlockOwnerDeletion == nil || !*ref.BlockOwnerDeletion {
				return fmt.Errorf("output %s: controller reference %+v", name, *ref)
			}
			if k := o.GetLabels()[mapKeyLabel]; k != mapKeyOf(in) {
				return fmt.Errorf("output %s: %s label %q, want %q (input %s)", name, mapKeyLabel, k, mapKeyOf(in), in.GetName())
			}
			if a := o.GetAnnotations()[mapInputAnnotation]; a != mapInputOf(in) {
				return fmt.Errorf("output %s: %s annotation %q, want %q", name, mapInputAnnotation, a, mapInputOf(in))
			}
			if check != nil {
				if err := check(o, in); err != nil {
					return fmt.Errorf("output %s: %w", name, err)
				}
			}
		}
		return nil
	}
}

// sameVersion checks that a DiskSnapshot was made from its Disk's
// current spec.version.
func sameVersion(out, in *unstructured.Unstructured) error {
	cur, err := dyn.Resource(disksGVR).Namespace(in.GetNamespace()).Get(context.Background(), in.GetName(), metav1.GetOptions{})
	if err != nil {
		return err
	}
	want, _ := nestedInt(cur, "spec", "version")
	if got, _ := nestedInt(out, "spec", "version"); got != want {
		return fmt.Errorf("spec.version %d, want %d", got, want)
	}
	return nil
}

// counts is a resource's entry in the aggregated status: total, and the
// number of objects per condition name.
type counts map[string]int64

// wantMapStatus checks the status metabus aggregates on a parent: exactly
// the given input and output counts, per plural resource, and an
// observedGeneration that is the parent's generation.
func wantMapStatus(ctx context.Context, gvr schema.GroupVersionResource, ns, name string, inputs, outputs map[string]counts) func() error {
	return func() error {
		p, err := dyn.Resource(gvr).Namespace(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		status, _ := p.Object["status"].(map[string]any)
		if g, ok := nestedInt(p, "status", "observedGeneration"); !ok || g != p.GetGeneration() {
			return fmt.Errorf("status.observedGeneration %v, generation %d", status["observedGeneration"], p.GetGeneration())
		}
		for _, f := range []struct {
			field string
			want  map[string]counts
		}{{"inputs", inputs}, {"outputs", outputs}} {
			got, _ := json.Marshal(status[f.field])
			want, _ := json.Marshal(f.want)
			if !bytes.Equal(got, want) {
				return fmt.Errorf("status.%s %s, want %s", f.field, got, want)
			}
		}
		return nil
	}
}

func getObj(t *testing.T, gvr schema.GroupVersionResource, ns, name string) *unstructured.Unstructured {
	t.Helper()
	o, err := dyn.Resource(gvr).Namespace(ns).Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("get %s %s/%s: %v", gvr.Resource, ns, name, err)
	}
	return o
}

// resourceVersions reads the resourceVersion of each named object.
func resourceVersions(t *testing.T, gvr schema.GroupVersionResource, ns string, names ...string) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, n := range names {
		out[n] = getObj(t, gvr, ns, n).GetResourceVersion()
	}
	return out
}

// unchanged reports the objects of before that changed or went since.
func unchanged(t *testing.T, gvr schema.GroupVersionResource, ns string, before map[string]string) {
	t.Helper()
	for n, rv := range before {
		o, err := dyn.Resource(gvr).Namespace(ns).Get(context.Background(), n, metav1.GetOptions{})
		switch {
		case err != nil:
			t.Errorf("%s %s must be untouched: %v", gvr.Resource, n, err)
		case o.GetResourceVersion() != rv:
			t.Errorf("%s %s must be untouched: resourceVersion %s, was %s", gvr.Resource, n, o.GetResourceVersion(), rv)
		}
	}
}

func absent(ctx context.Context, gvr schema.GroupVersionResource, ns string, names ...string) error {
	for _, n := range names {
		_, err := dyn.Resource(gvr).Namespace(ns).Get(ctx, n, metav1.GetOptions{})
		if !apierrors.IsNotFound(err) {
			return fmt.Errorf("%s %s/%s exists (err=%v)", gvr.Resource, ns, n, err)
		}
	}
	return nil
}

func setReady(t *testing.T, ns, name, status string) {
	t.Helper()
	mergePatch(t, diskSnapshotsGVR, ns, name, map[string]any{"status": map[string]any{"conditions": []any{
		map[string]any{"type": "Ready", "status": status, "reason": "Test", "lastTransitionTime": time.Now().UTC().Format(time.RFC3339)},
	}}}, "status")
}

// TestMapSnapshotSchedule is the design's SnapshotSchedule without a
// tombstone hook: outputs appear for each selected input and only those
// (not the other namespace's, not another label's), tagged with the
// input's key and name and owned by the parent; the map hook is shown the
// key's outputs keyed like children; the status counts inputs, outputs and
// Ready outputs; editing one input calls the hook for its key only (once,
// the echo of the outputs its answer updated calls nothing more);
// a deleted input's outputs are deleted and other keys' are untouched;
// selector changes add keys and detach them, and so does an input's label
// change; deleting the parent lets the garbage collector take the outputs
// and leaves the inputs alone.
func TestMapSnapshotSchedule(t *testing.T) {
	ensureMapCRDs(t)
	ctx := context.Background()
	inst := startMetabus(t, allinone.Config{}, nil)
	ns := newNamespace(t)
	otherNS := newNamespace(t)
	cleanupParents(t, snapSchedulesGVR, ns)
	h := newMapHooks(t, []string{diskSnapshotType}, snapshotMap, nil)
	url := hookServer(t, h.handler())
	createController(t, inst, mapCtlKind, "snapshot-schedule", snapshotController(url, false, 0, ""))

	db := map[string]string{"app": "db"}
	d1 := createDisk(t, ns, "d1", db, map[string]any{"version": int64(1)})
	d2 := createDisk(t, ns, "d2", db, map[string]any{"version": int64(1)})
	d3 := createDisk(t, ns, "d3", map[string]string{"app": "web"}, map[string]any{"version": int64(1)})
	createDisk(t, otherNS, "far", db, map[string]any{"version": int64(1)})
	parent := createMapParent(t, snapSchedulesGVR, "SnapSchedule", ns, "nightly",
		map[string]any{"matchLabels": map[string]any{"app": "db"}})

	outputs := func(disks ...*unstructured.Unstructured) func() error {
		want := map[string]*unstructured.Unstructured{}
		for _, d := range disks {
			want[d.GetName()+"-daily"], want[d.GetName()+"-weekly"] = d, d
		}
		return wantOutputs(ctx, diskSnapshotsGVR, ns, parent, want, sameVersion)
	}
	status := func(inputs, outputs int64, conds counts) func() error {
		out := counts{"total": outputs}
		for c, n := range conds {
			out[c] = n
		}
		return wantMapStatus(ctx, snapSchedulesGVR, ns, "nightly",
			map[string]counts{"disks": {"total": inputs}}, map[string]counts{"disksnapshots": out})
	}
	eventually(t, 30*time.Second, "a daily and a weekly snapshot of each selected Disk", outputs(d1, d2))
	eventually(t, 30*time.Second, "the status counting 2 inputs and 4 outputs", status(2, 4, nil))
	k1, k2 := mapKeyOf(d1), mapKeyOf(d2)

	// Conditions: Ready counts the outputs whose Ready is True. A change
	// of outputs by someone else is news to the map hook: it is called.
	h.settle(t, 2*time.Second, 30*time.Second)
	beforeReady := h.mapCounts()
	setReady(t, ns, "d1-daily", "True")
	setReady(t, ns, "d1-weekly", "True")
	setReady(t, ns, "d2-daily", "False")
	eventually(t, 30*time.Second, "status.outputs.disksnapshots.ready 2", status(2, 4, counts{"ready": 2}))
	eventually(t, 30*time.Second, "a map call for d1's key after someone else changed its outputs", func() error {
		if got := h.mapCounts()[k1]; got <= beforeReady[k1] {
			return fmt.Errorf("%d map calls, as before", got)
		}
		return nil
	})

	// One edit calls the edited input's key only.
	h.settle(t, 2*time.Second, 30*time.Second)
	before := h.mapCounts()
	d2Outputs := resourceVersions(t, diskSnapshotsGVR, ns, "d2-daily", "d2-weekly")
	mergePatch(t, disksGVR, ns, "d1", map[string]any{"spec": map[string]any{"version": 2}})
	eventually(t, 30*time.Second, "d1's snapshots following its new version", outputs(d1, d2))
	time.Sleep(2 * time.Second) // quiet period: calls that should not come
	after := h.mapCounts()
	for k := range after {
		if _, ok := before[k]; !ok {
			before[k] = 0
		}
	}
	for k, n := range before {
		got := after[k] - n
		switch {
		case k != k1 && got != 0:
			t.Errorf("editing d1 made %d map calls for key %s, want none (d1 is %s)", got, k, k1)
		case k == k1 && got != 1:
			// One input change is one map call (issue 31): the map hook
			// answers with outputs only, so the echo of the outputs it
			// asked for is no news to it (mapctl's SyncEchoable).
			t.Errorf("editing d1 made %d map calls for its key, want 1", got)
		}
	}
	unchanged(t, diskSnapshotsGVR, ns, d2Outputs)
	// That call was shown the outputs of d1, and only those (the hooks
	// check every request for outputs of other keys).
	h.mu.Lock()
	if got := sortedKeys(outputsOf(h.lastMap[k1], diskSnapshotType)); strings.Join(got, ",") != "d1-daily,d1-weekly" {
		t.Errorf("the map request after the edit showed outputs %v, want d1-daily and d1-weekly", got)
	}
	h.mu.Unlock()

	// A deleted input's outputs go (there is no tombstone hook), and only
	// those.
	d1Outputs := resourceVersions(t, diskSnapshotsGVR, ns, "d1-daily", "d1-weekly")
	if err := dyn.Resource(disksGVR).Namespace(ns).Delete(ctx, "d2", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "d2's snapshots deleted with d2", outputs(d1))
	eventually(t, 30*time.Second, "the status without d2", status(1, 2, counts{"ready": 2}))
	unchanged(t, diskSnapshotsGVR, ns, d1Outputs)
	if n := h.tombCount(k2); n != 0 {
		t.Errorf("the tombstone hook of a controller without one was called %d times", n)
	}

	// The selector grows: d3 is added, d1's outputs stay as they are.
	mergePatch(t, snapSchedulesGVR, ns, "nightly", map[string]any{"spec": map[string]any{"selector": map[string]any{
		"matchLabels":      nil,
		"matchExpressions": []any{map[string]any{"key": "app", "operator": "In", "values": []any{"db", "web"}}},
	}}})
	eventually(t, 30*time.Second, "d3 mapped after the selector grew", outputs(d1, d3))
	eventually(t, 30*time.Second, "the status of two inputs", status(2, 4, counts{"ready": 2}))
	unchanged(t, diskSnapshotsGVR, ns, d1Outputs)

	// The selector shrinks: d1 is detached and its outputs deleted.
	mergePatch(t, snapSchedulesGVR, ns, "nightly", map[string]any{"spec": map[string]any{"selector": map[string]any{
		"matchLabels": map[string]any{"app": "web"}, "matchExpressions": nil,
	}}})
	eventually(t, 30*time.Second, "d1 detached after the selector shrank", outputs(d3))
	// No output has a condition left: the count of Ready is gone with them.
	eventually(t, 30*time.Second, "the status of one input", status(1, 2, nil))

	// An input whose labels stop matching is detached too.
	d4 := createDisk(t, ns, "d4", map[string]string{"app": "web"}, map[string]any{"version": int64(1)})
	eventually(t, 30*time.Second, "a new matching Disk mapped", outputs(d3, d4))
	mergePatch(t, disksGVR, ns, "d4", map[string]any{"metadata": map[string]any{"labels": map[string]any{"app": "retired"}}})
	eventually(t, 30*time.Second, "d4 detached when its label changed", outputs(d3))
	eventually(t, 30*time.Second, "the status of one input again", status(1, 2, nil))

	if h.sawInput(otherNS, "far") {
		t.Errorf("the map hook was called for a Disk in another namespace than the parent's")
	}
	if l, err := dyn.Resource(diskSnapshotsGVR).Namespace(otherNS).List(ctx, metav1.ListOptions{}); err != nil || len(l.Items) != 0 {
		t.Errorf("outputs in another namespace: %d (%v)", len(l.Items), err)
	}

	// The parent's deletion cascades to its outputs, not to its inputs.
	if err := dyn.Resource(snapSchedulesGVR).Namespace(ns).Delete(ctx, "nightly", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 60*time.Second, "the garbage collector to delete the outputs", func() error {
		return absent(ctx, diskSnapshotsGVR, ns, "d3-daily", "d3-weekly")
	})
	for _, n := range []string{"d1", "d3", "d4"} {
		getObj(t, disksGVR, ns, n)
	}
}

// TestMapTombstone: the outputs of a deleted input are shown to the
// tombstone hook (without the input), which keeps exactly the ones it
// lists (untouched) and lets the rest go; it is asked again on every
// resync of the parent (resyncPeriodSeconds), and once it stops listing
// them they are deleted, after which it is asked no more. The map hook is
// never called for the detached key, and the other input's outputs are
// never written although its key is mapped again on every resync.
func TestMapTombstone(t *testing.T) {
	ensureMapCRDs(t)
	ctx := context.Background()
	inst := startMetabus(t, allinone.Config{}, nil)
	ns := newNamespace(t)
	cleanupParents(t, snapSchedulesGVR, ns)
	var keepWeekly atomic.Bool
	keepWeekly.Store(true)
	h := newMapHooks(t, []string{diskSnapshotType}, snapshotMap, func(req map[string]any) (int, any) {
		keep := []any{}
		for name, o := range outputsOf(req, diskSnapshotType) {
			if keepWeekly.Load() && strings.HasSuffix(name, "-weekly") {
				// Only the identity counts; the rest of an entry is ignored.
				u := &unstructured.Unstructured{Object: o.(map[string]any)}
				keep = append(keep, map[string]any{"apiVersion": u.GetAPIVersion(), "kind": u.GetKind(),
					"metadata": map[string]any{"name": u.GetName()}})
			}
		}
		return 200, map[string]any{"outputs": keep}
	})
	url := hookServer(t, h.handler())
	createController(t, inst, mapCtlKind, "snapshot-retention", snapshotController(url, true, 1, ""))

	db := map[string]string{"app": "db"}
	d1 := createDisk(t, ns, "d1", db, map[string]any{"version": int64(1)})
	d2 := createDisk(t, ns, "d2", db, map[string]any{"version": int64(1)})
	parent := createMapParent(t, snapSchedulesGVR, "SnapSchedule", ns, "retained",
		map[string]any{"matchLabels": map[string]any{"app": "db"}})
	eventually(t, 30*time.Second, "the snapshots of d1 and d2", wantOutputs(ctx, diskSnapshotsGVR, ns, parent,
		map[string]*unstructured.Unstructured{"d1-daily": d1, "d1-weekly": d1, "d2-daily": d2, "d2-weekly": d2}, sameVersion))
	kept := resourceVersions(t, diskSnapshotsGVR, ns, "d1-weekly")
	d2Outputs := resourceVersions(t, diskSnapshotsGVR, ns, "d2-daily", "d2-weekly")
	k1 := mapKeyOf(d1)

	if err := dyn.Resource(disksGVR).Namespace(ns).Delete(ctx, "d1", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "d1's daily snapshot deleted, its weekly one kept", wantOutputs(ctx, diskSnapshotsGVR, ns, parent,
		map[string]*unstructured.Unstructured{"d1-weekly": d1, "d2-daily": d2, "d2-weekly": d2}, nil))
	// Asked again on each resync, and the answer holds each time.
	start := h.tombCount(k1)
	eventually(t, 30*time.Second, "the tombstone hook asked again on resyncs", func() error {
		if n := h.tombCount(k1) - start; n < 3 {
			return fmt.Errorf("%d more calls", n)
		}
		return nil
	})
	unchanged(t, diskSnapshotsGVR, ns, kept)
	eventually(t, 30*time.Second, "the status counting the kept output", wantMapStatus(ctx, snapSchedulesGVR, ns, "retained",
		map[string]counts{"disks": {"total": 1}}, map[string]counts{"disksnapshots": {"total": 3}}))
	h.mu.Lock()
	if got := sortedKeys(outputsOf(h.firstTomb[k1], diskSnapshotType)); strings.Join(got, ",") != "d1-daily,d1-weekly" {
		t.Errorf("the first tombstone request showed %v, want d1's two outputs", got)
	}
	if got := sortedKeys(outputsOf(h.lastTomb[k1], diskSnapshotType)); strings.Join(got, ",") != "d1-weekly" {
		t.Errorf("a tombstone request after the decision showed %v, want the kept output only", got)
	}
	if p, _ := h.lastTomb[k1]["parent"].(map[string]any); p == nil || (&unstructured.Unstructured{Object: p}).GetName() != "retained" {
		t.Errorf("the tombstone request's parent is not the SnapSchedule")
	}
	h.mu.Unlock()

	// The hook stops keeping it: it goes at the next resync.
	keepWeekly.Store(false)
	eventually(t, 30*time.Second, "the weekly snapshot deleted once no longer kept", func() error {
		return absent(ctx, diskSnapshotsGVR, ns, "d1-weekly")
	})
	eventually(t, 30*time.Second, "the status without d1's outputs", wantMapStatus(ctx, snapSchedulesGVR, ns, "retained",
		map[string]counts{"disks": {"total": 1}}, map[string]counts{"disksnapshots": {"total": 2}}))
	// A key without outputs is nobody's tombstone: with resyncs every
	// second, three quiet seconds would see three more calls.
	time.Sleep(time.Second) // a call under way when the output went
	n := h.tombCount(k1)
	time.Sleep(3 * time.Second)
	if more := h.tombCount(k1) - n; more != 0 {
		t.Errorf("the tombstone hook was called %d more times for a key without outputs", more)
	}
	h.mu.Lock()
	if got, want := h.mapCalls[k1], h.mapsBeforeTomb[k1]; got != want {
		t.Errorf("the map hook was called %d times for d1 after its tombstone calls began", got-want)
	}
	h.mu.Unlock()
	unchanged(t, diskSnapshotsGVR, ns, d2Outputs)
	if n := h.mapCount(mapKeyOf(d2)); n < 5 {
		t.Errorf("d2 was mapped %d times, want one per resync (the no-op check above means nothing otherwise)", n)
	}
}

// TestMapConfigMapTransform: ConfigMaps made from ConfigMaps, with a
// selector that matches the outputs too (they copy their input's
// labels). The recursion guard ignores the inputs the parent controls
// itself, so no output of an output ever appears, even after an edit; a
// ConfigMap controlled by another parent is an input like any other.
func TestMapConfigMapTransform(t *testing.T) {
	ensureMapCRDs(t)
	ctx := context.Background()
	inst := startMetabus(t, allinone.Config{}, nil)
	ns := newNamespace(t)
	cleanupParents(t, transformsGVR, ns)
	const cmType = "ConfigMap.v1"
	var mu sync.Mutex
	var problems []string
	h := newMapHooks(t, []string{cmType}, func(req map[string]any) (int, any) {
		in := &unstructured.Unstructured{Object: req["input"].(map[string]any)}
		parent := &unstructured.Unstructured{Object: req["parent"].(map[string]any)}
		if ref := metav1.GetControllerOfNoCopy(in); ref != nil && ref.UID == parent.GetUID() {
			mu.Lock()
			problems = append(problems, fmt.Sprintf("%s was shown its own output %s", parent.GetName(), in.GetName()))
			mu.Unlock()
		}
		data := map[string]any{}
		src, _, _ := unstructured.NestedStringMap(in.Object, "data")
		for k, v := range src {
			data[strings.ToUpper(k)] = strings.ToUpper(v)
		}
		out := map[string]any{
			"apiVersion": "v1", "kind": "ConfigMap",
			"metadata": map[string]any{"name": in.GetName() + "-upper", "labels": in.GetLabels()},
			"data":     data,
		}
		return 200, map[string]any{"outputs": []any{out}}
	}, nil)
	url := hookServer(t, h.handler())
	createController(t, inst, mapCtlKind, "configmap-upper", map[string]any{
		"parentResource":  map[string]any{"apiVersion": mapGroup + "/v1", "resource": "transforms"},
		"inputResources":  []any{map[string]any{"apiVersion": "v1", "resource": "configmaps"}},
		"outputResources": []any{map[string]any{"apiVersion": "v1", "resource": "configmaps", "updateStrategy": map[string]any{"method": "InPlace"}}},
		"hooks":           map[string]any{"map": map[string]any{"webhook": map[string]any{"url": url + "/map"}}},
	})

	cm := func(name, team string, data map[string]string, owner *unstructured.Unstructured) *unstructured.Unstructured {
		c := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"team": team}}, Data: data}
		if owner != nil {
			yes := true
			c.OwnerReferences = []metav1.OwnerReference{{APIVersion: owner.GetAPIVersion(), Kind: owner.GetKind(),
				Name: owner.GetName(), UID: owner.GetUID(), Controller: &yes}}
		}
		created, err := kube.CoreV1().ConfigMaps(ns).Create(ctx, c, metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("create ConfigMap %s: %v", name, err)
		}
		obj, err := dyn.Resource(configMapsGVR).Namespace(ns).Get(ctx, created.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return obj
	}
	// other transforms the red team's ConfigMaps, and controls one of the
	// blue team's by hand: that one is main's input all the same.
	other := createMapParent(t, transformsGVR, "Transform", ns, "other", map[string]any{"matchLabels": map[string]any{"team": "red"}})
	a := cm("a", "blue", map[string]string{"greeting": "hello"}, nil)
	b := cm("b", "blue", map[string]string{"subject": "world"}, nil)
	c := cm("c", "blue", map[string]string{"owned": "elsewhere"}, other)
	red := cm("red", "red", map[string]string{"colour": "red"}, nil)
	blue := createMapParent(t, transformsGVR, "Transform", ns, "main", map[string]any{"matchLabels": map[string]any{"team": "blue"}})

	upper := func(out, in *unstructured.Unstructured) error {
		cur, err := kube.CoreV1().ConfigMaps(ns).Get(ctx, in.GetName(), metav1.GetOptions{})
		if err != nil {
			return err
		}
		got, _, _ := unstructured.NestedStringMap(out.Object, "data")
		for k, v := range cur.Data {
			if got[strings.ToUpper(k)] != strings.ToUpper(v) {
				return fmt.Errorf("data %v, want the upper case of %v", got, cur.Data)
			}
		}
		if out.GetLabels()["team"] != in.GetLabels()["team"] {
			return fmt.Errorf("labels %v: the output must match its parent's selector for the guard to matter", out.GetLabels())
		}
		return nil
	}
	converged := func() error {
		if err := wantOutputs(ctx, configMapsGVR, ns, blue,
			map[string]*unstructured.Unstructured{"a-upper": a, "b-upper": b, "c-upper": c}, upper)(); err != nil {
			return err
		}
		return wantOutputs(ctx, configMapsGVR, ns, other, map[string]*unstructured.Unstructured{"red-upper": red}, upper)()
	}
	// noRecursion fails on any output of an output.
	noRecursion := func() error {
		list, err := kube.CoreV1().ConfigMaps(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return err
		}
		for _, o := range list.Items {
			if strings.HasSuffix(o.Name, "-upper-upper") {
				return fmt.Errorf("an output of an output: %s", o.Name)
			}
		}
		return nil
	}
	eventually(t, 30*time.Second, "one upper-case ConfigMap per input", converged)
	// main counts its 3 inputs, not its outputs; other its input and
	// both ConfigMaps it controls (c carries no key: only counted).
	eventually(t, 30*time.Second, "main's status", wantMapStatus(ctx, transformsGVR, ns, "main",
		map[string]counts{"configmaps": {"total": 3}}, map[string]counts{"configmaps": {"total": 3}}))
	eventually(t, 30*time.Second, "other's status", wantMapStatus(ctx, transformsGVR, ns, "other",
		map[string]counts{"configmaps": {"total": 1}}, map[string]counts{"configmaps": {"total": 2}}))

	// An edit re-maps its input; the updated output, which the selector
	// matches, must still not be taken for an input.
	h.settle(t, time.Second, 30*time.Second)
	if _, err := kube.CoreV1().ConfigMaps(ns).Patch(ctx, "a", types.MergePatchType,
		[]byte(`{"data":{"greeting":"bonjour"}}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "a-upper following a", func() error {
		o, err := kube.CoreV1().ConfigMaps(ns).Get(ctx, "a-upper", metav1.GetOptions{})
		if err != nil {
			return err
		}
		if o.Data["GREETING"] != "BONJOUR" {
			return fmt.Errorf("data %v", o.Data)
		}
		return nil
	})
	time.Sleep(2 * time.Second) // quiet period: room for a recursion to show
	if err := noRecursion(); err != nil {
		t.Error(err)
	}
	if err := converged(); err != nil {
		t.Error(err)
	}
	for _, out := range []string{"a-upper", "b-upper", "c-upper", "red-upper"} {
		if h.sawInput(ns, out) {
			t.Errorf("the map hook was shown %s, an output, as an input", out)
		}
	}
	mu.Lock()
	for _, p := range problems {
		t.Error(p)
	}
	mu.Unlock()
}

// poll is eventually without failing the test: the last error, or nil.
func poll(timeout time.Duration, f func() error) error {
	deadline := time.Now().Add(timeout)
	for {
		err := f()
		if err == nil || time.Now().After(deadline) {
			return err
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// warnings lists the Warning Events on the object ns/name, for messages.
func warnings(ctx context.Context, ns, name string) string {
	evs, err := kube.CoreV1().Events(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return err.Error()
	}
	var out []string
	for _, e := range evs.Items {
		if e.InvolvedObject.Name == name && e.Type == corev1.EventTypeWarning {
			out = append(out, fmt.Sprintf("%s (x%d): %s", e.Reason, e.Count, e.Message))
		}
	}
	if len(out) == 0 {
		return "none"
	}
	return strings.Join(out, "; ")
}

// TestMapBadAnswers: a map answer that cannot be applied as a whole (an
// output of a kind the controller does not declare, one in another
// namespace, a body that is not JSON, no answer within the webhook's
// timeout) is a SyncError Event on the parent (the words) and
// changes no output, also on the retries: neither the bad key's existing
// one (the answer also changes it) nor another key's, and no output is
// created for the bad key (the answer also asks for a valid new one), nor
// for a new input answered badly from the start. Answering well again
// applies the whole answer.
func TestMapBadAnswers(t *testing.T) {
	ensureMapCRDs(t)
	ctx := context.Background()
	inst := startMetabus(t, allinone.Config{}, nil)
	ns := newNamespace(t)
	otherNS := newNamespace(t)
	cleanupParents(t, snapSchedulesGVR, ns)
	// The hook misbehaves as the input's spec.mode says; its outputs
	// follow spec.version.
	h := newMapHooks(t, []string{diskSnapshotType}, func(req map[string]any) (int, any) {
		disk := &unstructured.Unstructured{Object: req["input"].(map[string]any)}
		mode := nestedString(disk, "spec", "mode")
		version, _ := nestedInt(disk, "spec", "version")
		outs := []any{diskSnapshot(disk.GetName()+"-daily", disk.GetName(), version)}
		if mode == "ok" {
			return 200, map[string]any{"outputs": outs}
		}
		outs = append(outs, diskSnapshot(disk.GetName()+"-extra", disk.GetName(), version))
		switch mode {
		case "undeclared":
			outs = append(outs, map[string]any{"apiVersion": "v1", "kind": "ConfigMap",
				"metadata": map[string]any{"name": disk.GetName() + "-cm"}})
		case "namespace":
			elsewhere := diskSnapshot(disk.GetName()+"-elsewhere", disk.GetName(), version)
			elsewhere["metadata"].(map[string]any)["namespace"] = otherNS
			outs = append(outs, elsewhere)
		case "nonjson":
			return 200, []byte(`{"outputs": [`)
		case "timeout":
			time.Sleep(3 * time.Second) // the webhook's timeout is 1s
		}
		return 200, map[string]any{"outputs": outs}
	}, nil)
	url := hookServer(t, h.handler())
	createController(t, inst, mapCtlKind, "snapshot-bad-answers", snapshotController(url, false, 0, "1s"))

	// reason is the Event of each bad answer: a failed call and an answer
	// the applier rejects as a whole are both SyncErrors for a
	// MapController (its kind row's RejectReason; the other kinds keep
	// InvalidDesiredState for the latter).
	for _, tt := range []struct{ mode, reason string }{
		{"undeclared", "SyncError"},
		{"namespace", "SyncError"},
		{"nonjson", "SyncError"},
		{"timeout", "SyncError"},
	} {
		mode := tt.mode
		t.Run(mode, func(t *testing.T) {
			sel := map[string]string{"case": mode}
			good := createDisk(t, ns, mode+"-good", sel, map[string]any{"mode": "ok", "version": int64(1)})
			bad := createDisk(t, ns, mode+"-bad", sel, map[string]any{"mode": "ok", "version": int64(1)})
			parent := createMapParent(t, snapSchedulesGVR, "SnapSchedule", ns, "bad-"+mode,
				map[string]any{"matchLabels": map[string]any{"case": mode}})
			eventually(t, 30*time.Second, "both keys' outputs", wantOutputs(ctx, diskSnapshotsGVR, ns, parent,
				map[string]*unstructured.Unstructured{mode + "-good-daily": good, mode + "-bad-daily": bad}, sameVersion))
			h.settle(t, 500*time.Millisecond, 30*time.Second)
			before := resourceVersions(t, diskSnapshotsGVR, ns, mode+"-good-daily", mode+"-bad-daily")

			mergePatch(t, disksGVR, ns, mode+"-bad", map[string]any{"spec": map[string]any{"mode": mode, "version": 2}})
			fresh := createDisk(t, ns, mode+"-new", sel, map[string]any{"mode": mode, "version": int64(1)})
			freshKey := mapKeyOf(fresh)
			// The Event is checked without stopping the test, so that
			// whether anything was applied is checked all the same.
			if err := poll(30*time.Second, func() error { return warningEvent(ctx, ns, "bad-"+mode, tt.reason) }); err != nil {
				t.Errorf("no %s Event on the parent in 30s; its Warning Events: %s", tt.reason, warnings(ctx, ns, "bad-"+mode))
			} else {
				t.Logf("Warning Events on the parent: %s", warnings(ctx, ns, "bad-"+mode))
			}
			// Quiet period: the first retries (after 1s and 2s) must
			// not apply anything either.
			time.Sleep(3 * time.Second)
			unchanged(t, diskSnapshotsGVR, ns, before)
			if err := absent(ctx, diskSnapshotsGVR, ns, mode+"-bad-extra", mode+"-new-daily", mode+"-new-extra"); err != nil {
				t.Errorf("an output of a bad answer: %v", err)
			}
			if err := absent(ctx, configMapsGVR, ns, mode+"-bad-cm", mode+"-new-cm"); err != nil {
				t.Errorf("an undeclared output of a bad answer: %v", err)
			}
			if err := absent(ctx, diskSnapshotsGVR, otherNS, mode+"-bad-elsewhere", mode+"-new-elsewhere"); err != nil {
				t.Errorf("an output in another namespace: %v", err)
			}
			if l, err := dyn.Resource(diskSnapshotsGVR).Namespace(ns).List(ctx, metav1.ListOptions{LabelSelector: mapKeyLabel + "=" + freshKey}); err != nil || len(l.Items) != 0 {
				t.Errorf("outputs of a key never answered well: %d (%v)", len(l.Items), err)
			}

			// Answering well again applies the whole answer.
			mergePatch(t, disksGVR, ns, mode+"-bad", map[string]any{"spec": map[string]any{"mode": "ok"}})
			eventually(t, 60*time.Second, "the edited input mapped once answered well", wantOutputs(ctx, diskSnapshotsGVR, ns, parent,
				map[string]*unstructured.Unstructured{mode + "-good-daily": good, mode + "-bad-daily": bad}, sameVersion))
		})
	}
}

// The SnapshotSchedule example (examples/snapshot-schedule): its CRDs,
// manifests and Python hook, run as a user would.
const mapExampleDir = "../examples/snapshot-schedule"

var (
	snapshotSchedulesGVR = schema.GroupVersionResource{Group: "ctl.example.com", Version: "v1", Resource: "snapshotschedules"}
	pvcSnapshotsGVR      = schema.GroupVersionResource{Group: "ctl.example.com", Version: "v1", Resource: "pvcsnapshots"}
	pvcsGVR              = schema.GroupVersionResource{Version: "v1", Resource: "persistentvolumeclaims"}
)

// exampleManifest reads one of the example's manifests.
func exampleManifest(t *testing.T, name string) *unstructured.Unstructured {
	t.Helper()
	data, err := os.ReadFile(mapExampleDir + "/manifests/" + name)
	if err != nil {
		t.Fatal(err)
	}
	var obj map[string]any
	if err := yaml.Unmarshal(data, &obj); err != nil {
		t.Fatalf("parse %s: %v", name, err)
	}
	return &unstructured.Unstructured{Object: obj}
}

// startExampleHook runs the example's hook.py on a free loopback port
// until the test ends, and returns its URL.
func startExampleHook(t *testing.T) string {
	t.Helper()
	python, err := exec.LookPath("python3")
	if err != nil {
		t.Fatalf("python3 is needed to run the example's hook: %v", err)
	}
	cmd := exec.Command(python, mapExampleDir+"/hook.py", "--host", "127.0.0.1", "--port", "0")
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("hook.py's log:\n%s", tail(stderr.String(), 40))
		}
	})
	first := make(chan string, 1)
	go func() {
		s := bufio.NewScanner(stdout)
		if s.Scan() {
			first <- s.Text()
		}
		close(first)
		_, _ = io.Copy(io.Discard, stdout)
	}()
	select {
	case line := <-first:
		url, ok := strings.CutPrefix(line, "listening on ")
		if !ok {
			t.Fatalf("hook.py said %q, want its address", line)
		}
		return url
	case <-time.After(20 * time.Second):
		t.Fatal("hook.py did not start in 20s")
	}
	return ""
}

// exampleCalls records, per map key, the number of map calls and how many
// outputs each tombstone answer kept.
type exampleCalls struct {
	mu   sync.Mutex
	maps map[string]int
	kept map[string][]int
}

// proxy forwards hook calls to the Python hook, recording them.
func (c *exampleCalls) proxy(target string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		resp, err := http.Post(target+r.URL.Path, "application/json", bytes.NewReader(body))
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		defer resp.Body.Close()
		answer, err := io.ReadAll(resp.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		var req struct {
			MapKey string `json:"mapKey"`
		}
		var ans struct {
			Outputs []any `json:"outputs"`
		}
		_ = json.Unmarshal(body, &req)
		_ = json.Unmarshal(answer, &ans)
		c.mu.Lock()
		switch r.URL.Path {
		case "/map":
			c.maps[req.MapKey]++
		case "/tombstone":
			c.kept[req.MapKey] = append(c.kept[req.MapKey], len(ans.Outputs))
		}
		c.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(resp.StatusCode)
		_, _ = w.Write(answer)
	})
}

func (c *exampleCalls) keptAnswers(key string) []int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]int(nil), c.kept[key]...)
}

// TestMapSnapshotScheduleExample runs the example as its README says, with
// the Python hook, a shorter resync and retention: a selected claim gets
// one snapshot, owned by the schedule and tagged with the claim's key, and
// the schedule counts them; the other claim gets none. Once the claim is
// deleted, the tombstone hook keeps its snapshot until the retention has
// passed, and then lets it go.
func TestMapSnapshotScheduleExample(t *testing.T) {
	// Most of its half minute is the snapshot's retention.
	waitsInParallel(t)
	ctx := context.Background()
	if err := env.Apply(ctx, mapExampleDir+"/manifests/crd.yaml"); err != nil {
		t.Fatalf("install the example's CRDs: %v", err)
	}
	inst := startMetabus(t, allinone.Config{}, nil)
	ns := newNamespace(t)
	cleanupParents(t, snapshotSchedulesGVR, ns)
	calls := &exampleCalls{maps: map[string]int{}, kept: map[string][]int{}}
	url := hookServer(t, calls.proxy(startExampleHook(t)))

	mc := exampleManifest(t, "controller.yaml")
	for _, hook := range []string{"map", "tombstone"} {
		if err := unstructured.SetNestedField(mc.Object, url+"/"+hook, "spec", "hooks", hook, "webhook", "url"); err != nil {
			t.Fatal(err)
		}
	}
	// The tombstone hook is asked again on each resync: every second
	// rather than every minute, for the test to see the retention pass.
	if err := unstructured.SetNestedField(mc.Object, int64(1), "spec", "resyncPeriodSeconds"); err != nil {
		t.Fatal(err)
	}
	createController(t, inst, mapCtlKind, mc.GetName(), mc.Object["spec"].(map[string]any))

	create := func(gvr schema.GroupVersionResource, obj *unstructured.Unstructured) *unstructured.Unstructured {
		t.Helper()
		out, err := dyn.Resource(gvr).Namespace(ns).Create(ctx, obj, metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("create %s %s: %v", obj.GetKind(), obj.GetName(), err)
		}
		return out
	}
	claim := create(pvcsGVR, exampleManifest(t, "pvc.yaml"))
	other := exampleManifest(t, "pvc.yaml")
	other.SetName("scratch")
	other.SetLabels(map[string]string{"app": "web"})
	create(pvcsGVR, other)
	sched := exampleManifest(t, "schedule.yaml")
	const retention = 30 * time.Second
	if err := unstructured.SetNestedField(sched.Object, "30s", "spec", "retention"); err != nil {
		t.Fatal(err)
	}
	schedule := create(snapshotSchedulesGVR, sched)

	var snap *unstructured.Unstructured
	eventually(t, 30*time.Second, "a snapshot of the selected claim", func() error {
		list, err := dyn.Resource(pvcSnapshotsGVR).Namespace(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return err
		}
		if len(list.Items) != 1 {
			return fmt.Errorf("%d snapshots, want 1", len(list.Items))
		}
		s := &list.Items[0]
		if src := nestedString(s, "spec", "source", "persistentVolumeClaimName"); src != claim.GetName() {
			return fmt.Errorf("snapshot %s of %q, want %s", s.GetName(), src, claim.GetName())
		}
		if ref := metav1.GetControllerOfNoCopy(s); ref == nil || ref.UID != schedule.GetUID() {
			return fmt.Errorf("snapshot %s controller %v, want the schedule", s.GetName(), ref)
		}
		if k := s.GetLabels()[mapKeyLabel]; k != mapKeyOf(claim) {
			return fmt.Errorf("snapshot %s key %q, want the claim's %q", s.GetName(), k, mapKeyOf(claim))
		}
		snap = s
		return nil
	})
	eventually(t, 30*time.Second, "the schedule's status", wantMapStatus(ctx, snapshotSchedulesGVR, ns, schedule.GetName(),
		map[string]counts{"persistentvolumeclaims": {"total": 1}}, map[string]counts{"pvcsnapshots": {"total": 1}}))

	// The claim goes (the test plays the pvc-protection controller, which
	// the test cluster does not run).
	if err := kube.CoreV1().PersistentVolumeClaims(ns).Delete(ctx, claim.GetName(), metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := kube.CoreV1().PersistentVolumeClaims(ns).Patch(ctx, claim.GetName(), types.MergePatchType,
		[]byte(`{"metadata":{"finalizers":null}}`), metav1.PatchOptions{}); err != nil && !apierrors.IsNotFound(err) {
		t.Fatal(err)
	}
	key := mapKeyOf(claim)
	eventually(t, 30*time.Second, "the tombstone hook keeping the snapshot", func() error {
		if ks := calls.keptAnswers(key); len(ks) == 0 || ks[0] != 1 {
			return fmt.Errorf("tombstone answers (outputs kept) %v", ks)
		}
		return nil
	})
	if _, err := dyn.Resource(pvcSnapshotsGVR).Namespace(ns).Get(ctx, snap.GetName(), metav1.GetOptions{}); err != nil {
		t.Errorf("the snapshot the tombstone hook keeps: %v", err)
	}
	eventually(t, retention+60*time.Second, "the snapshot deleted after its retention", func() error {
		return absent(ctx, pvcSnapshotsGVR, ns, snap.GetName())
	})
	// Kept until then: creation timestamps have whole seconds.
	if age := time.Since(snap.GetCreationTimestamp().Time); age < retention-time.Second {
		t.Errorf("the snapshot was deleted %s after its creation, before its retention (%s)", age.Round(time.Second), retention)
	}
	if ks := calls.keptAnswers(key); ks[len(ks)-1] != 0 {
		t.Errorf("the last tombstone answer kept %d outputs, want none: %v", ks[len(ks)-1], ks)
	}
	eventually(t, 30*time.Second, "the schedule's status without the claim", wantMapStatus(ctx, snapshotSchedulesGVR, ns, schedule.GetName(),
		map[string]counts{"persistentvolumeclaims": {"total": 0}}, map[string]counts{"pvcsnapshots": {"total": 0}}))
}
