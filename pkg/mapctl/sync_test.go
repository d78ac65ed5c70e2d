package mapctl

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/metabus/metabus/pkg/api/v1alpha1"
	"github.com/metabus/metabus/pkg/apply"
	"github.com/metabus/metabus/pkg/bus"
	"github.com/metabus/metabus/pkg/hookapi"
	"github.com/metabus/metabus/pkg/kinds"
	"github.com/metabus/metabus/pkg/snapshot"
)

// withoutTombstone is validSpec without its tombstone hook.
func withoutTombstone() map[string]any {
	return specWith(func(s map[string]any) { delete(s["hooks"].(map[string]any), "tombstone") })
}

func withAnnotations(a map[string]string) func(*unstructured.Unstructured) {
	return func(u *unstructured.Unstructured) { u.SetAnnotations(a) }
}

// lastApplied records obj as the output's last applied configuration.
func lastApplied(obj map[string]any) func(*unstructured.Unstructured) {
	return func(u *unstructured.Unstructured) {
		if err := apply.SetLastApplied(u, obj); err != nil {
			panic(err) // test setup only
		}
	}
}

// pvc is an input of the sync tests.
func pvc(name, uid string) *unstructured.Unstructured {
	return object("v1", "PersistentVolumeClaim", "ns", name, uid)
}

func TestSyncGate(t *testing.T) {
	ctl := newController(t, validSpec())
	type result struct {
		Gate kinds.Gate
		Err  string
	}
	cases := []struct {
		reason string
		snap   *snapshot.Response
		want   result
	}{
		{reason: "a live key goes on", snap: &snapshot.Response{Parent: scheduleParent("ns"), MapKey: kA, Input: pvc("a", "ua")}},
		{reason: "the per-parent item goes on", snap: &snapshot.Response{Parent: scheduleParent("ns"), Summary: map[string]any{}}},
		{
			reason: "a parent being deleted is the garbage collector's: skipped, even with a bad selector",
			snap:   &snapshot.Response{Parent: scheduleParent("ns", deleting), MapKey: kA, SelectorError: "bad"},
			want:   result{Gate: kinds.Gate{Skip: true}},
		},
		{
			reason: "a selector that cannot be used fails the sync rather than mapping everything",
			snap:   &snapshot.Response{Parent: scheduleParent("ns"), MapKey: kA, SelectorError: "spec.selector of ns/p is not a label selector"},
			want:   result{Err: "cannot map: spec.selector of ns/p is not a label selector"},
		},
	}
	for _, c := range cases {
		t.Run(c.reason, func(t *testing.T) {
			g, err := ctl.SyncGate(c.snap)
			if diff := cmp.Diff(c.want, result{Gate: g, Err: errText(err)}); diff != "" {
				t.Errorf("gate (-want +got):\n%s", diff)
			}
		})
	}
}

func TestSyncHook(t *testing.T) {
	full := newController(t, validSpec())
	mapOnly := newController(t, withoutTombstone())
	noHooks := &Controller{MC: &v1alpha1.MapController{}, obj: controllerObject(nil)}
	live := func(name string) *unstructured.Unstructured { return snap(name, kA, controlledBy("p-uid")) }
	gone := func(name string) *unstructured.Unstructured { return snap(name, kA, controlledBy("p-uid"), deleting) }
	type result struct {
		Choice kinds.HookChoice
		Err    string
	}
	cases := []struct {
		reason string
		ctl    *Controller
		snap   *snapshot.Response
		want   result
	}{
		{
			reason: "the per-parent item: its status, computed without a hook",
			ctl:    full,
			snap:   &snapshot.Response{Parent: scheduleParent("ns"), Summary: map[string]any{}},
			want:   result{Choice: kinds.HookChoice{Kind: bus.HookStatus, Local: true}},
		},
		{
			reason: "a live key: the map hook",
			ctl:    full,
			snap:   &snapshot.Response{Parent: scheduleParent("ns"), MapKey: kA, Input: pvc("a", "ua"), Children: outputGroups([]*unstructured.Unstructured{live("a-1")}, nil)},
			want:   result{Choice: kinds.HookChoice{Hook: full.MC.Spec.Hooks.Map, Kind: bus.HookMap}},
		},
		{
			reason: "a live key without outputs yet: the map hook",
			ctl:    mapOnly,
			snap:   &snapshot.Response{Parent: scheduleParent("ns"), MapKey: kA, Input: pvc("a", "ua"), Children: outputGroups(nil, nil)},
			want:   result{Choice: kinds.HookChoice{Hook: mapOnly.MC.Spec.Hooks.Map, Kind: bus.HookMap}},
		},
		{
			reason: "a detached key with live outputs: the tombstone hook decides",
			ctl:    full,
			snap:   &snapshot.Response{Parent: scheduleParent("ns"), MapKey: kA, Children: outputGroups([]*unstructured.Unstructured{gone("a-0")}, []*unstructured.Unstructured{cm("a-cm", kA)})},
			want:   result{Choice: kinds.HookChoice{Hook: full.MC.Spec.Hooks.Tombstone, Kind: bus.HookTombstone}},
		},
		{
			reason: "a detached key with live outputs and no tombstone hook: metabus deletes them by itself",
			ctl:    mapOnly,
			snap:   &snapshot.Response{Parent: scheduleParent("ns"), MapKey: kA, Children: outputGroups([]*unstructured.Unstructured{live("a-1")}, nil)},
			want:   result{Choice: kinds.HookChoice{Kind: bus.HookTombstone, Local: true}},
		},
		{
			reason: "a detached key whose outputs are all being deleted: nothing to decide",
			ctl:    full,
			snap:   &snapshot.Response{Parent: scheduleParent("ns"), MapKey: kA, Children: outputGroups([]*unstructured.Unstructured{gone("a-1")}, []*unstructured.Unstructured{gone("a-2")})},
		},
		{
			reason: "a detached key without outputs (swept already): nothing to do",
			ctl:    mapOnly,
			snap:   &snapshot.Response{Parent: scheduleParent("ns"), MapKey: kA, Children: outputGroups(nil, nil)},
		},
		{
			reason: "a live key of a controller without map hook (never decoded so) fails",
			ctl:    noHooks,
			snap:   &snapshot.Response{Parent: scheduleParent("ns"), MapKey: kA, Input: pvc("a", "ua")},
			want:   result{Err: "MapController snap has no map hook"},
		},
	}
	for _, c := range cases {
		t.Run(c.reason, func(t *testing.T) {
			choice, err := c.ctl.SyncHook(c.snap, "snapshotschedules")
			if diff := cmp.Diff(c.want, result{Choice: choice, Err: errText(err)}); diff != "" {
				t.Errorf("choice (-want +got):\n%s", diff)
			}
		})
	}
}

// syncOnce runs the dispatcher's steps 4 to 6 on snap: SyncHook,
// SyncCalls, the answer (JSON; "" for a local choice) decoded into the
// call's Response as the hook client does, and SyncDesired. It returns
// the choice, the request sent and the desired state.
func syncOnce(t *testing.T, ctl *Controller, snap *snapshot.Response, answer string) (kinds.HookChoice, any, bus.DesiredState, error) {
	t.Helper()
	choice, err := ctl.SyncHook(snap, "snapshotschedules")
	if err != nil {
		t.Fatalf("SyncHook: %v", err)
	}
	calls, err := ctl.SyncCalls(kinds.SyncInput{Snapshot: snap, Hook: choice})
	if err != nil {
		t.Fatalf("SyncCalls: %v", err)
	}
	if len(calls) != 1 {
		t.Fatalf("%d calls, want 1", len(calls))
	}
	if answer != "" {
		if err := json.Unmarshal([]byte(answer), calls[0].Response); err != nil {
			t.Fatalf("decode the answer into %T: %v", calls[0].Response, err)
		}
	}
	ds, err := ctl.SyncDesired(calls)
	return choice, calls[0].Request, ds, err
}

func TestSyncMap(t *testing.T) {
	ctl := newController(t, validSpec())
	mine := controlledBy("p-uid")
	a1 := snap("a-1", kA, mine)
	aCM := cm("a-cm", kA, mine)
	class := object("storage.k8s.io/v1", "StorageClass", "", "fast", "u")
	classRef := InputRef{Group: "storage.k8s.io", Kind: "StorageClass", Name: "fast", UID: "u"}
	clusterParent := object("ctl.example.com/v1", "Schedule", "", "p", "p-uid")
	fastCM := object("v1", "ConfigMap", "ns", "fast-cm", "", withKey(classRef.Key()), mine)
	desiredSnap := map[string]any{
		"apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshot",
		"metadata": map[string]any{"name": "a-1"},
		"spec":     map[string]any{"source": map[string]any{"persistentVolumeClaimName": "a"}},
	}
	cases := []struct {
		reason      string
		snap        *snapshot.Response
		answer      string
		wantRequest hookapi.MapRequest
		wantDesired bus.DesiredState
	}{
		{
			reason: "the hook is shown the input and the key's outputs keyed like children; its outputs and resync are the key's, tagged with the input",
			snap: &snapshot.Response{Controller: ctl.Object(), Parent: scheduleParent("ns"), MapKey: kA, Input: pvc("a", "ua"),
				Children: outputGroups([]*unstructured.Unstructured{a1}, []*unstructured.Unstructured{aCM})},
			answer: `{"outputs":[{"apiVersion":"snapshot.storage.k8s.io/v1","kind":"VolumeSnapshot","metadata":{"name":"a-1"},"spec":{"source":{"persistentVolumeClaimName":"a"}}}],"resyncAfterSeconds":30}`,
			wantRequest: hookapi.MapRequest{
				Controller: ctl.Object(), Parent: scheduleParent("ns"), MapKey: kA, Input: pvc("a", "ua"),
				Outputs: hookapi.ObjectMap{
					"VolumeSnapshot.snapshot.storage.k8s.io/v1": {"a-1": a1},
					"ConfigMap.v1": {"a-cm": aCM},
				},
			},
			wantDesired: bus.DesiredState{
				Children:           []*unstructured.Unstructured{{Object: desiredSnap}},
				ResyncAfterSeconds: 30,
				MapInput:           "/PersistentVolumeClaim/ns/a/ua",
			},
		},
		{
			reason: "a new input: every output type shown, empty; an answer without outputs wants none",
			snap: &snapshot.Response{Controller: ctl.Object(), Parent: scheduleParent("ns"), MapKey: kB, Input: pvc("b", "ub"),
				Children: outputGroups(nil, nil)},
			answer: `{"outputs":[]}`,
			wantRequest: hookapi.MapRequest{
				Controller: ctl.Object(), Parent: scheduleParent("ns"), MapKey: kB, Input: pvc("b", "ub"),
				Outputs: hookapi.ObjectMap{"VolumeSnapshot.snapshot.storage.k8s.io/v1": {}, "ConfigMap.v1": {}},
			},
			wantDesired: bus.DesiredState{Children: []*unstructured.Unstructured{}, MapInput: "/PersistentVolumeClaim/ns/b/ub"},
		},
		{
			reason: "a cluster-scoped parent's outputs are keyed namespace/name; a cluster-scoped input names no namespace",
			snap: &snapshot.Response{Controller: ctl.Object(), Parent: clusterParent, MapKey: classRef.Key(), Input: class,
				Children: outputGroups(nil, []*unstructured.Unstructured{fastCM})},
			answer: `{"outputs":null,"resyncAfterSeconds":0.5}`,
			wantRequest: hookapi.MapRequest{
				Controller: ctl.Object(), Parent: clusterParent, MapKey: classRef.Key(), Input: class,
				Outputs: hookapi.ObjectMap{"VolumeSnapshot.snapshot.storage.k8s.io/v1": {}, "ConfigMap.v1": {"ns/fast-cm": fastCM}},
			},
			wantDesired: bus.DesiredState{ResyncAfterSeconds: 0.5, MapInput: "storage.k8s.io/StorageClass//fast/u"},
		},
	}
	for _, c := range cases {
		t.Run(c.reason, func(t *testing.T) {
			choice, req, ds, err := syncOnce(t, ctl, c.snap, c.answer)
			if err != nil {
				t.Fatalf("SyncDesired: %v", err)
			}
			if choice.Kind != bus.HookMap || choice.Local {
				t.Fatalf("choice %+v, want the map hook", choice)
			}
			if diff := cmp.Diff(c.wantRequest, req); diff != "" {
				t.Errorf("request (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(c.wantDesired, ds); diff != "" {
				t.Errorf("desired state (-want +got):\n%s", diff)
			}
			appliable(t, ctl, c.snap, ds)
		})
	}
}

func TestSyncStatus(t *testing.T) {
	ctl := newController(t, validSpec())
	summary := map[string]any{
		"observedGeneration": int64(2),
		"inputs":             map[string]any{"persistentvolumeclaims": map[string]any{"total": int64(1)}},
		"outputs":            map[string]any{"volumesnapshots": map[string]any{"total": int64(1)}},
	}
	cases := []struct {
		reason string
		snap   *snapshot.Response
		want   bus.DesiredState
	}{
		{
			reason: "the per-parent item's desired state is the watcher's summary as the status, and no outputs",
			snap:   &snapshot.Response{Controller: ctl.Object(), Parent: scheduleParent("ns"), Summary: summary},
			want:   bus.DesiredState{Status: summary},
		},
		{
			reason: "an empty summary is still a status",
			snap:   &snapshot.Response{Controller: ctl.Object(), Parent: scheduleParent("ns"), Summary: map[string]any{}},
			want:   bus.DesiredState{Status: map[string]any{}},
		},
	}
	for _, c := range cases {
		t.Run(c.reason, func(t *testing.T) {
			choice, req, ds, err := syncOnce(t, ctl, c.snap, "")
			if err != nil {
				t.Fatalf("SyncDesired: %v", err)
			}
			if diff := cmp.Diff(kinds.HookChoice{Kind: bus.HookStatus, Local: true}, choice); diff != "" {
				t.Errorf("choice (-want +got):\n%s", diff)
			}
			if req != nil {
				t.Errorf("request %#v, want none (nothing is sent)", req)
			}
			if diff := cmp.Diff(c.want, ds); diff != "" {
				t.Errorf("desired state (-want +got):\n%s", diff)
			}
		})
	}
}

func TestSyncTombstone(t *testing.T) {
	full := newController(t, validSpec())
	mapOnly := newController(t, withoutTombstone())
	mine := controlledBy("p-uid")
	annA := refA.Annotation()
	tagged := withAnnotations(map[string]string{InputAnnotation: annA})
	a1Applied := map[string]any{
		"apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshot",
		"metadata": map[string]any{"name": "a-1", "namespace": "ns",
			"labels":      map[string]any{MapKeyLabel: kA},
			"annotations": map[string]any{InputAnnotation: annA}},
		"spec": map[string]any{"source": map[string]any{"persistentVolumeClaimName": "a"}},
	}
	a1 := snap("a-1", kA, mine, tagged, lastApplied(a1Applied), withField("true", "status", "readyToUse"))
	// Recorded by an older writer without type or namespace.
	a2 := snap("a-2", kA, mine, tagged, lastApplied(map[string]any{"metadata": map[string]any{"name": "a-2"}, "spec": map[string]any{"x": "y"}}))
	aGone := snap("a-gone", kA, mine, tagged, deleting)
	aCM := cm("a-cm", kA, mine, tagged, withField(map[string]any{"k": "v"}, "data"))
	aBad := cm("a-bad", kA, mine, withAnnotations(map[string]string{InputAnnotation: annA, apply.LastAppliedAnnotation: "{not json"}))
	untaggedInput := cm("a-cm", kA, mine)
	garbledInput := snap("a-1", kA, mine, withAnnotations(map[string]string{InputAnnotation: "PersistentVolumeClaim/a"}))

	keep := func(apiVersion, kind, name string) string {
		return `{"apiVersion":"` + apiVersion + `","kind":"` + kind + `","metadata":{"name":"` + name + `"}}`
	}
	answer := func(entries ...string) string { return `{"outputs":[` + strings.Join(entries, ",") + `]}` }
	keepA1 := keep("snapshot.storage.k8s.io/v1", "VolumeSnapshot", "a-1")

	cases := []struct {
		reason      string
		ctl         *Controller
		outputs     []snapshot.Group
		answer      string // "" for a local answer
		wantRequest any
		wantDesired bus.DesiredState
		wantErr     string // prefix
	}{
		{
			reason:      "no tombstone hook: every live output is deleted (none desired); the input is read from the outputs",
			ctl:         mapOnly,
			outputs:     outputGroups([]*unstructured.Unstructured{a1, aGone}, []*unstructured.Unstructured{aCM}),
			wantDesired: bus.DesiredState{Children: []*unstructured.Unstructured{}, MapInput: annA},
		},
		{
			reason:      "no tombstone hook, outputs naming no input: deleted all the same, with no input",
			ctl:         mapOnly,
			outputs:     outputGroups(nil, []*unstructured.Unstructured{untaggedInput}),
			wantDesired: bus.DesiredState{Children: []*unstructured.Unstructured{}},
		},
		{
			reason:      "no tombstone hook: the input is the first output's that names one",
			ctl:         mapOnly,
			outputs:     outputGroups([]*unstructured.Unstructured{garbledInput}, []*unstructured.Unstructured{untaggedInput, aCM}),
			wantDesired: bus.DesiredState{Children: []*unstructured.Unstructured{}, MapInput: annA},
		},
		{
			reason:      "no tombstone hook, an input annotation that does not parse names no input",
			ctl:         mapOnly,
			outputs:     outputGroups([]*unstructured.Unstructured{garbledInput}, nil),
			wantDesired: bus.DesiredState{Children: []*unstructured.Unstructured{}},
		},
		{
			reason:  "the hook keeps one of two outputs: it is desired exactly as metabus last applied it, the other is not desired",
			ctl:     full,
			outputs: outputGroups([]*unstructured.Unstructured{a1, aGone}, []*unstructured.Unstructured{aCM}),
			answer:  answer(keepA1),
			wantRequest: hookapi.TombstoneRequest{
				Controller: full.Object(), Parent: scheduleParent("ns"), MapKey: kA,
				Outputs: hookapi.ObjectMap{
					"VolumeSnapshot.snapshot.storage.k8s.io/v1": {"a-1": a1, "a-gone": aGone},
					"ConfigMap.v1": {"a-cm": aCM},
				},
			},
			wantDesired: bus.DesiredState{Children: []*unstructured.Unstructured{{Object: a1Applied}}, MapInput: annA},
		},
		{
			reason:  "a kept output metabus never applied is desired by identity only, which changes none of its fields",
			ctl:     full,
			outputs: outputGroups([]*unstructured.Unstructured{a1}, []*unstructured.Unstructured{aCM}),
			answer:  answer(keep("v1", "ConfigMap", "a-cm")),
			wantRequest: hookapi.TombstoneRequest{
				Controller: full.Object(), Parent: scheduleParent("ns"), MapKey: kA,
				Outputs: hookapi.ObjectMap{"VolumeSnapshot.snapshot.storage.k8s.io/v1": {"a-1": a1}, "ConfigMap.v1": {"a-cm": aCM}},
			},
			wantDesired: bus.DesiredState{
				Children: []*unstructured.Unstructured{{Object: map[string]any{
					"apiVersion": "v1", "kind": "ConfigMap",
					"metadata": map[string]any{"name": "a-cm", "namespace": "ns"},
				}}},
				MapInput: annA,
			},
		},
		{
			reason:  "a last-applied configuration without type or namespace gets the output's",
			ctl:     full,
			outputs: outputGroups([]*unstructured.Unstructured{a1, a2}, nil),
			answer:  answer(keepA1, keep("snapshot.storage.k8s.io/v1", "VolumeSnapshot", "a-2")),
			wantRequest: hookapi.TombstoneRequest{
				Controller: full.Object(), Parent: scheduleParent("ns"), MapKey: kA,
				Outputs: hookapi.ObjectMap{"VolumeSnapshot.snapshot.storage.k8s.io/v1": {"a-1": a1, "a-2": a2}, "ConfigMap.v1": {}},
			},
			wantDesired: bus.DesiredState{
				Children: []*unstructured.Unstructured{
					{Object: a1Applied},
					{Object: map[string]any{
						"apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshot",
						"metadata": map[string]any{"name": "a-2", "namespace": "ns"},
						"spec":     map[string]any{"x": "y"},
					}},
				},
				MapInput: annA,
			},
		},
		{
			reason:  "the hook keeps nothing (or only what is being deleted): nothing desired",
			ctl:     full,
			outputs: outputGroups([]*unstructured.Unstructured{a1, aGone}, nil),
			answer:  answer(keep("snapshot.storage.k8s.io/v1", "VolumeSnapshot", "a-gone")),
			wantRequest: hookapi.TombstoneRequest{
				Controller: full.Object(), Parent: scheduleParent("ns"), MapKey: kA,
				Outputs: hookapi.ObjectMap{"VolumeSnapshot.snapshot.storage.k8s.io/v1": {"a-1": a1, "a-gone": aGone}, "ConfigMap.v1": {}},
			},
			wantDesired: bus.DesiredState{Children: []*unstructured.Unstructured{}, MapInput: annA},
		},
		{
			reason:  "the hook keeps an output, but no output names the input: it cannot be tagged, so it is only deleted",
			ctl:     full,
			outputs: outputGroups([]*unstructured.Unstructured{garbledInput}, []*unstructured.Unstructured{untaggedInput}),
			answer:  answer(keepA1, keep("v1", "ConfigMap", "a-cm")),
			wantRequest: hookapi.TombstoneRequest{
				Controller: full.Object(), Parent: scheduleParent("ns"), MapKey: kA,
				Outputs: hookapi.ObjectMap{"VolumeSnapshot.snapshot.storage.k8s.io/v1": {"a-1": garbledInput}, "ConfigMap.v1": {"a-cm": untaggedInput}},
			},
			wantDesired: bus.DesiredState{Children: []*unstructured.Unstructured{}},
		},
		{
			reason:  "a kept output whose last-applied configuration does not parse cannot be kept as applied",
			ctl:     full,
			outputs: outputGroups(nil, []*unstructured.Unstructured{aBad}),
			answer:  answer(keep("v1", "ConfigMap", "a-bad")),
			wantRequest: hookapi.TombstoneRequest{
				Controller: full.Object(), Parent: scheduleParent("ns"), MapKey: kA,
				Outputs: hookapi.ObjectMap{"VolumeSnapshot.snapshot.storage.k8s.io/v1": {}, "ConfigMap.v1": {"a-bad": aBad}},
			},
			wantErr: "MapController snap: keep ConfigMap a-bad: apply: malformed annotation",
		},
	}
	for _, c := range cases {
		t.Run(c.reason, func(t *testing.T) {
			s := &snapshot.Response{Controller: c.ctl.Object(), Parent: scheduleParent("ns"), MapKey: kA, Children: c.outputs}
			choice, req, ds, err := syncOnce(t, c.ctl, s, c.answer)
			if choice.Kind != bus.HookTombstone || choice.Local != (c.answer == "") {
				t.Fatalf("choice %+v, want a tombstone, local: %v", choice, c.answer == "")
			}
			if diff := cmp.Diff(c.wantRequest, req); diff != "" {
				t.Errorf("request (-want +got):\n%s", diff)
			}
			if c.wantErr != "" {
				if err == nil || !strings.HasPrefix(err.Error(), c.wantErr) {
					t.Fatalf("error %v, want one starting with %q", err, c.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("SyncDesired: %v", err)
			}
			if diff := cmp.Diff(c.wantDesired, ds); diff != "" {
				t.Errorf("desired state (-want +got):\n%s", diff)
			}
			appliable(t, c.ctl, s, ds)
		})
	}
}

// appliable checks that the applier can own the outputs of ds, a desired
// state SyncDesired made from snap, once the dispatcher has filled in its
// routing fields.
func appliable(t *testing.T, ctl *Controller, snap *snapshot.Response, ds bus.DesiredState) {
	t.Helper()
	ds.MapKey = snap.MapKey
	if _, err := ctl.ApplyOwner(snap.Parent, &ds); err != nil {
		t.Errorf("the applier cannot own the desired outputs: %v", err)
	}
}

func TestSyncCallsErrors(t *testing.T) {
	ctl := newController(t, validSpec())
	cases := []struct {
		reason string
		snap   *snapshot.Response
		hook   kinds.HookChoice
		want   string
	}{
		{
			reason: "an input that is not the key's (the watcher keys by the resource's kind)",
			snap:   &snapshot.Response{Parent: scheduleParent("ns"), MapKey: kB, Input: pvc("a", "ua"), Children: outputGroups(nil, nil)},
			hook:   kinds.HookChoice{Hook: ctl.MC.Spec.Hooks.Map, Kind: bus.HookMap},
			want:   "MapController snap: input ns/a does not have map key " + kB,
		},
		{
			reason: "an input object of another kind than the key's",
			snap:   &snapshot.Response{Parent: scheduleParent("ns"), MapKey: kA, Input: object("v1", "ConfigMap", "ns", "a", "ua"), Children: outputGroups(nil, nil)},
			hook:   kinds.HookChoice{Hook: ctl.MC.Spec.Hooks.Map, Kind: bus.HookMap},
			want:   "MapController snap: input ns/a does not have map key " + kA,
		},
		{
			reason: "an input without UID has no key",
			snap:   &snapshot.Response{Parent: scheduleParent("ns"), MapKey: kA, Input: pvc("a", ""), Children: outputGroups(nil, nil)},
			hook:   kinds.HookChoice{Hook: ctl.MC.Spec.Hooks.Map, Kind: bus.HookMap},
			want:   `MapController snap: input "a" of kind "PersistentVolumeClaim": a map key needs kind, name and UID`,
		},
		{
			reason: "an output that cannot be shown to the hook",
			snap: &snapshot.Response{Parent: scheduleParent("ns"), MapKey: kA, Input: pvc("a", "ua"),
				Children: outputGroups([]*unstructured.Unstructured{snap("", kA)}, nil)},
			hook: kinds.HookChoice{Hook: ctl.MC.Spec.Hooks.Map, Kind: bus.HookMap},
			want: "MapController snap: build hook request: ",
		},
		{
			reason: "the same for the tombstone hook",
			snap:   &snapshot.Response{Parent: scheduleParent("ns"), MapKey: kA, Children: outputGroups([]*unstructured.Unstructured{snap("", kA)}, nil)},
			hook:   kinds.HookChoice{Hook: ctl.MC.Spec.Hooks.Tombstone, Kind: bus.HookTombstone},
			want:   "MapController snap: build hook request: ",
		},
		{
			reason: "a per-parent snapshot without summary has no status to write",
			snap:   &snapshot.Response{Parent: scheduleParent("ns")},
			hook:   kinds.HookChoice{Kind: bus.HookStatus, Local: true},
			want:   "MapController snap: no status summary in the parent's snapshot",
		},
		{
			reason: "a hook kind MapController does not have",
			snap:   &snapshot.Response{Parent: scheduleParent("ns"), MapKey: kA, Input: pvc("a", "ua")},
			hook:   kinds.HookChoice{Hook: ctl.MC.Spec.Hooks.Map, Kind: bus.HookSync},
			want:   `MapController snap: no "sync" hook`,
		},
	}
	for _, c := range cases {
		t.Run(c.reason, func(t *testing.T) {
			calls, err := ctl.SyncCalls(kinds.SyncInput{Snapshot: c.snap, Hook: c.hook})
			if err == nil || !strings.HasPrefix(err.Error(), c.want) {
				t.Fatalf("error %v, want one starting with %q", err, c.want)
			}
			if calls != nil {
				t.Errorf("calls %v with the error", calls)
			}
		})
	}
}

func TestSyncDesiredErrors(t *testing.T) {
	ctl := newController(t, validSpec())
	cases := []struct {
		reason string
		calls  []kinds.HookCall
		want   string
	}{
		{
			reason: "an answer SyncCalls did not allocate",
			calls:  []kinds.HookCall{{Request: hookapi.MapRequest{}, Response: &hookapi.MapResponse{}}},
			want:   "MapController snap: a *hookapi.MapResponse is not one of its answers",
		},
		{reason: "no answer", want: "MapController snap: 0 hook answers for a parent, want 1"},
		{
			reason: "two answers for one key",
			calls:  []kinds.HookCall{{Response: &mapAnswer{}}, {Response: &mapAnswer{}}},
			want:   "MapController snap: 2 hook answers for a parent, want 1",
		},
	}
	for _, c := range cases {
		t.Run(c.reason, func(t *testing.T) {
			ds, err := ctl.SyncDesired(c.calls)
			if diff := cmp.Diff(c.want, errText(err)); diff != "" {
				t.Errorf("error (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(bus.DesiredState{}, ds); diff != "" {
				t.Errorf("desired state with the error (-want +got):\n%s", diff)
			}
		})
	}
}

func TestSyncTraits(t *testing.T) {
	plain := newController(t, validSpec())
	optedIn := newController(t, validSpec())
	optedIn.obj.SetAnnotations(map[string]string{bus.SuppressEchoesAnnotation: "true"})
	withEndpoints := newController(t, specWith(func(s map[string]any) {
		s["endpointConfigs"] = []any{map[string]any{"host": "hooks.example.com", "allowInsecureCredentials": true}}
	}))
	yes := true
	cases := []struct {
		reason string
		got    func() any
		want   any
	}{
		{reason: "no endpoint configs", got: func() any { return plain.SyncEndpoints() }, want: []v1alpha1.EndpointConfig(nil)},
		{
			reason: "the endpoint configs serve every hook",
			got:    func() any { return withEndpoints.SyncEndpoints() },
			want:   []v1alpha1.EndpointConfig{{Host: "hooks.example.com", WebhookAuth: v1alpha1.WebhookAuth{AllowInsecureCredentials: &yes}}},
		},
		{reason: "no customize hook: nothing related", got: func() any { return plain.SyncCustomizeHook() }, want: (*v1alpha1.Hook)(nil)},
		{reason: "the echo of a key's own outputs never calls the map hook, even without the opt-in (one call per input change)",
			got: func() any { return plain.SyncEchoable() }, want: true},
		{reason: "opted in: the same", got: func() any { return optedIn.SyncEchoable() }, want: true},
		{reason: "a key's request is the objects it is shown: a repeat of the latest call merges into it",
			got: func() any { return plain.SyncInputsComplete() }, want: true},
		{
			reason: "outputs never roll out: no revisions",
			got: func() any {
				r, err := plain.SyncRevisions(scheduleParent("ns"))
				return []any{r, errText(err)}
			},
			want: []any{(*kinds.Revisions)(nil), ""},
		},
		{
			reason: "so no call is ever re-targeted at one",
			got: func() any {
				call, err := plain.SyncAsOf(kinds.HookCall{Request: hookapi.MapRequest{}, Response: &mapAnswer{}}, scheduleParent("ns"))
				return []any{call, errText(err)}
			},
			want: []any{kinds.HookCall{}, "MapController snap: outputs have no revisions"},
		},
	}
	for _, c := range cases {
		t.Run(c.reason, func(t *testing.T) {
			if diff := cmp.Diff(c.want, c.got()); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}
