package render

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"

	"github.com/metabus/metabus/pkg/bus"
	"github.com/metabus/metabus/pkg/hooks"
	"github.com/metabus/metabus/pkg/mapctl"
	"github.com/metabus/metabus/pkg/related"
)

// received is one request a hook server got: its path and JSON body.
type received struct {
	Path string
	Body map[string]any
}

// recorder is a hook server that answers each path with a fixed body (or
// a status code) and records every request, in order.
type recorder struct {
	URL     string
	mu      sync.Mutex
	got     []received
	answers map[string]any // path → body, or an int status code
}

func newRecorder(t *testing.T, answers map[string]any) *recorder {
	t.Helper()
	r := &recorder{answers: answers}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		data, _ := io.ReadAll(req.Body)
		var body map[string]any
		if err := json.Unmarshal(data, &body); err != nil {
			t.Errorf("%s: a body that is no JSON object: %v", req.URL.Path, err)
		}
		r.mu.Lock()
		r.got = append(r.got, received{Path: req.URL.Path, Body: body})
		answer := r.answers[req.URL.Path]
		r.mu.Unlock()
		if code, ok := answer.(int); ok {
			http.Error(w, "hook broken", code)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(answer)
	}))
	t.Cleanup(srv.Close)
	r.URL = srv.URL
	return r
}

func (r *recorder) requests() []received {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]received(nil), r.got...)
}

// asJSON is v as a hook server decodes it.
func asJSON(t *testing.T, v any) map[string]any {
	t.Helper()
	data, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	var out map[string]any
	if err := json.Unmarshal(data, &out); err != nil {
		t.Fatal(err)
	}
	return out
}

func labelled(o *unstructured.Unstructured, l map[string]string) *unstructured.Unstructured {
	o.SetLabels(l)
	return o
}

// customizeController is the HelloWorld controller with a customize hook.
func customizeController(url string) *unstructured.Unstructured {
	c := controller(url + "/sync")
	_ = unstructured.SetNestedField(c.Object, map[string]any{"webhook": map[string]any{"url": url + "/customize"}}, "spec", "hooks", "customize")
	return c
}

// TestRenderCustomize: a controller with a customize hook is rendered as
// the dispatcher syncs it: the customize request (controller and parent),
// its answer checked, then the sync request with the related objects its
// rules select among those given.
func TestRenderCustomize(t *testing.T) {
	ctx := context.Background()
	parent := obj("example.com/v1", "HelloWorld", "ns", "p", map[string]any{"spec": map[string]any{"who": "you"}})
	parent.SetUID("parent-uid")
	x := labelled(obj("v1", "ConfigMap", "ns", "x", map[string]any{"data": map[string]any{"k": "v"}}), map[string]string{"app": "x"})
	y := labelled(obj("v1", "ConfigMap", "ns", "y", nil), map[string]string{"app": "y"})
	elsewhere := labelled(obj("v1", "ConfigMap", "other", "x", nil), map[string]string{"app": "x"})
	secret := obj("v1", "Secret", "ns", "s", nil)
	given := []*unstructured.Unstructured{x, y, elsewhere, secret}
	selectX := map[string]any{"apiVersion": "v1", "resource": "configmaps", "labelSelector": map[string]any{"matchLabels": map[string]any{"app": "x"}}}
	syncAnswer := map[string]any{"status": map[string]any{"ok": true}, "children": []any{configMap("p-cm", "hello")}}
	syncRequest := func(ctrl *unstructured.Unstructured, rel map[string]any) received {
		return received{Path: "/sync", Body: asJSON(t, map[string]any{
			"controller": ctrl.Object, "parent": parent.Object,
			"children": map[string]any{"ConfigMap.v1": map[string]any{}}, "related": rel, "finalizing": false,
		})}
	}
	customizeRequest := func(ctrl *unstructured.Unstructured) received {
		return received{Path: "/customize", Body: asJSON(t, map[string]any{"controller": ctrl.Object, "parent": parent.Object})}
	}
	cases := []struct {
		reason    string
		customize any // the customize hook's answer
		policy    []string
		// otherCustomize: the customize hook is called at another URL
		// (--customize-url) that answers this instead.
		otherCustomize any
		want           func(ctrl *unstructured.Unstructured) []received
		wantOther      []string // paths the other server got
		wantErr        string
	}{
		{
			reason:    "a label selector: the sync hook is shown the one ConfigMap of the parent's namespace it selects",
			customize: map[string]any{"relatedResources": []any{selectX}},
			want: func(ctrl *unstructured.Unstructured) []received {
				return []received{customizeRequest(ctrl), syncRequest(ctrl, map[string]any{"ConfigMap.v1": map[string]any{"x": x.Object}})}
			},
		},
		{
			reason:    "names and a second rule on the same resource: one group, each object once",
			customize: map[string]any{"relatedResources": []any{selectX, map[string]any{"apiVersion": "v1", "resource": "configmaps", "names": []any{"x", "y"}}}},
			want: func(ctrl *unstructured.Unstructured) []received {
				return []received{customizeRequest(ctrl), syncRequest(ctrl, map[string]any{"ConfigMap.v1": map[string]any{"x": x.Object, "y": y.Object}})}
			},
		},
		{
			reason:    "no related rules: the sync request's related map is empty",
			customize: map[string]any{"relatedResources": []any{}},
			want: func(ctrl *unstructured.Unstructured) []received {
				return []received{customizeRequest(ctrl), syncRequest(ctrl, map[string]any{})}
			},
		},
		{
			reason:    "a rule the policy refuses (the hardened profile's Secrets): the dispatcher's error, and no sync call",
			customize: map[string]any{"relatedResources": []any{map[string]any{"apiVersion": "v1", "resource": "secrets"}}},
			policy:    related.HardenedPolicy,
			want:      func(ctrl *unstructured.Unstructured) []received { return []received{customizeRequest(ctrl)} },
			wantErr:   "customize hook's relatedResources[0] (v1 secrets) refused, nothing watched and the sync hook not called: core/secrets is denied by -core/secrets",
		},
		{
			reason:    "an invalid rule (a v1 hook of a namespaced parent naming another namespace): refused, no sync call",
			customize: map[string]any{"relatedResources": []any{map[string]any{"apiVersion": "v1", "resource": "configmaps", "namespace": "other"}}},
			want:      func(ctrl *unstructured.Unstructured) []received { return []received{customizeRequest(ctrl)} },
			wantErr:   "customize hook returned an invalid relatedResources[0]",
		},
		{
			reason:    "the customize hook fails: a clear error, no sync call",
			customize: http.StatusInternalServerError,
			want:      func(ctrl *unstructured.Unstructured) []received { return []received{customizeRequest(ctrl)} },
			wantErr:   "customize hook failed",
		},
		{
			reason:         "--customize-url: the customize hook is called there, the sync hook at the controller's URL",
			customize:      http.StatusInternalServerError,
			otherCustomize: map[string]any{"relatedResources": []any{selectX}},
			want: func(ctrl *unstructured.Unstructured) []received {
				return []received{syncRequest(ctrl, map[string]any{"ConfigMap.v1": map[string]any{"x": x.Object}})}
			},
			wantOther: []string{"/customize"},
		},
	}
	for _, c := range cases {
		t.Run(c.reason, func(t *testing.T) {
			srv := newRecorder(t, map[string]any{"/customize": c.customize, "/sync": syncAnswer})
			ctrl := customizeController(srv.URL)
			in := Input{
				Controller: ctrl, Parent: parent, Related: given, RelatedPolicy: c.policy,
				Resolve: Offline(append([]*unstructured.Unstructured{parent}, given...)...), Hooks: hooks.New(hooks.Options{}),
			}
			var other *recorder
			if c.otherCustomize != nil {
				other = newRecorder(t, map[string]any{"/customize": c.otherCustomize})
				in.CustomizeURL = other.URL + "/customize"
			}
			res, err := Render(ctx, in)
			if c.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), c.wantErr) {
					t.Errorf("error %v, want one with %q", err, c.wantErr)
				}
			} else if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(c.want(ctrl), srv.requests()); diff != "" {
				t.Errorf("requests received (-want +got):\n%s", diff)
			}
			if other != nil {
				var paths []string
				for _, r := range other.requests() {
					paths = append(paths, r.Path)
				}
				if diff := cmp.Diff(c.wantOther, paths); diff != "" {
					t.Errorf("requests at --customize-url (-want +got):\n%s", diff)
				}
			}
			// The result lists every call made, the customize call first.
			var hooksCalled []string
			for _, r := range res.Requests {
				hooksCalled = append(hooksCalled, r.Hook)
			}
			wantHooks := []string{bus.HookCustomize, bus.HookSync}
			if c.wantErr != "" {
				wantHooks = wantHooks[:1]
			}
			if diff := cmp.Diff(wantHooks, hooksCalled); diff != "" {
				t.Errorf("Result.Requests hooks (-want +got):\n%s", diff)
			}
		})
	}
}

// TestRenderCustomizeNamespaceSelector: a v2 hook's namespaceSelector
// matches the labels of the Namespaces given with the related objects.
func TestRenderCustomizeNamespaceSelector(t *testing.T) {
	parent := obj("example.com/v1", "HelloWorld", "ns", "p", nil)
	parent.SetUID("parent-uid")
	prod := labelled(obj("v1", "Namespace", "", "prod", nil), map[string]string{"env": "prod"})
	dev := labelled(obj("v1", "Namespace", "", "dev", nil), map[string]string{"env": "dev"})
	inProd, inDev := obj("v1", "ConfigMap", "prod", "a", nil), obj("v1", "ConfigMap", "dev", "b", nil)
	given := []*unstructured.Unstructured{prod, dev, inProd, inDev}
	srv := newRecorder(t, map[string]any{
		"/customize": map[string]any{"relatedResources": []any{map[string]any{"apiVersion": "v1", "resource": "configmaps",
			"namespaceSelector": map[string]any{"matchLabels": map[string]any{"env": "prod"}}}}},
		"/sync": map[string]any{"children": []any{}},
	})
	ctrl := customizeController(srv.URL)
	_ = unstructured.SetNestedField(ctrl.Object, "v2", "spec", "hooks", "customize", "version")
	_ = unstructured.SetNestedField(ctrl.Object, "v2", "spec", "hooks", "sync", "version")
	if _, err := Render(context.Background(), Input{Controller: ctrl, Parent: parent, Related: given,
		Resolve: Offline(append([]*unstructured.Unstructured{parent}, given...)...), Hooks: hooks.New(hooks.Options{})}); err != nil {
		t.Fatal(err)
	}
	got := srv.requests()
	if len(got) != 2 {
		t.Fatalf("requests %+v", got)
	}
	want := asJSON(t, map[string]any{"ConfigMap.v1": map[string]any{"prod/a": inProd.Object}})
	if diff := cmp.Diff(want, got[1].Body["related"]); diff != "" {
		t.Errorf("related sent to the sync hook (-want +got):\n%s", diff)
	}
}

// mapController maps the PersistentVolumeClaims a SnapshotSchedule selects
// to ConfigMaps, its hooks at url.
func mapController(url string, tombstone bool) *unstructured.Unstructured {
	hooksSpec := map[string]any{"map": map[string]any{"webhook": map[string]any{"url": url + "/map"}}}
	if tombstone {
		hooksSpec["tombstone"] = map[string]any{"webhook": map[string]any{"url": url + "/tombstone"}}
	}
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "metacontroller.k8s.io/v1alpha1", "kind": "MapController",
		"metadata": map[string]any{"name": "snap", "uid": "ctrl-uid"},
		"spec": map[string]any{
			"parentResource":  map[string]any{"apiVersion": "ctl.example.com/v1", "resource": "snapshotschedules"},
			"inputResources":  []any{map[string]any{"apiVersion": "v1", "resource": "persistentvolumeclaims"}},
			"outputResources": []any{map[string]any{"apiVersion": "v1", "resource": "configmaps", "updateStrategy": map[string]any{"method": "InPlace"}}},
			"hooks":           hooksSpec,
		},
	}}
}

// TestRenderMapController: a MapController's parent is rendered as the
// dispatcher syncs its work items: the per-parent status, one map call per
// input the parent selects (shown only that input and its outputs), the
// tombstone hook for a key whose input is gone, each planned against its
// key's outputs.
func TestRenderMapController(t *testing.T) {
	ctx := context.Background()
	parent := obj("ctl.example.com/v1", "SnapshotSchedule", "ns", "daily", map[string]any{
		"spec": map[string]any{"selector": map[string]any{"matchLabels": map[string]any{"backup": "yes"}}}})
	parent.SetUID("parent-uid")
	pvc := func(ns, name string, backup bool) *unstructured.Unstructured {
		o := obj("v1", "PersistentVolumeClaim", ns, name, nil)
		o.SetUID(types.UID(name + "-uid"))
		if backup {
			o.SetLabels(map[string]string{"backup": "yes"})
		}
		return o
	}
	a, b := pvc("ns", "a", true), pvc("ns", "b", true)
	inputs := []*unstructured.Unstructured{a, b, pvc("ns", "unlabelled", false), pvc("other", "c", true)}
	refOf := func(name string) mapctl.InputRef {
		return mapctl.InputRef{Kind: "PersistentVolumeClaim", Namespace: "ns", Name: name, UID: name + "-uid"}
	}
	keyA, keyB, keyGone := refOf("a").Key(), refOf("b").Key(), refOf("gone").Key()
	yes := true
	output := func(name string, ref mapctl.InputRef, size string) *unstructured.Unstructured {
		o := obj("v1", "ConfigMap", "ns", name, map[string]any{"data": map[string]any{"size": size}})
		o.SetLabels(map[string]string{mapctl.MapKeyLabel: ref.Key()})
		o.SetAnnotations(map[string]string{mapctl.InputAnnotation: ref.Annotation()})
		o.SetOwnerReferences([]metav1.OwnerReference{{APIVersion: "ctl.example.com/v1", Kind: "SnapshotSchedule", Name: "daily", UID: "parent-uid", Controller: &yes}})
		return o
	}
	aSnap, goneSnap := output("a-snap", refOf("a"), "1Gi"), output("gone-snap", refOf("gone"), "3Gi")
	outputs := []*unstructured.Unstructured{aSnap, goneSnap}
	// The map hook answers one ConfigMap per input, named after it.
	mapAnswer := func(name string) map[string]any {
		return map[string]any{"outputs": []any{map[string]any{"apiVersion": "v1", "kind": "ConfigMap",
			"metadata": map[string]any{"name": name + "-snap"}, "data": map[string]any{"size": "2Gi"}}}}
	}
	mapRequest := func(ctrl *unstructured.Unstructured, key string, input *unstructured.Unstructured, outs map[string]any) received {
		return received{Path: "/map", Body: asJSON(t, map[string]any{
			"controller": ctrl.Object, "parent": parent.Object, "mapKey": key, "input": input.Object,
			"outputs": map[string]any{"ConfigMap.v1": outs},
		})}
	}
	change := func(action, name string) ChildChange {
		return ChildChange{Action: action, APIVersion: "v1", Kind: "ConfigMap", Namespace: "ns", Name: name}
	}
	sizeChange := ChildChange{Action: Update, APIVersion: "v1", Kind: "ConfigMap", Namespace: "ns", Name: "a-snap",
		Fields: []FieldChange{{Path: "data.size", Before: "1Gi", After: "2Gi"}}}
	cases := []struct {
		reason    string
		tombstone bool
		want      func(ctrl *unstructured.Unstructured) []received
		wantKeys  []keyWant
	}{
		{
			reason:    "the tombstone hook: a map call per selected input, the detached key's outputs to the tombstone hook",
			tombstone: true,
			want: func(ctrl *unstructured.Unstructured) []received {
				return sortedByKey([]received{
					mapRequest(ctrl, keyA, a, map[string]any{"a-snap": aSnap.Object}),
					mapRequest(ctrl, keyB, b, map[string]any{}),
					{Path: "/tombstone", Body: asJSON(t, map[string]any{"controller": ctrl.Object, "parent": parent.Object, "mapKey": keyGone,
						"outputs": map[string]any{"ConfigMap.v1": map[string]any{"gone-snap": goneSnap.Object}}})},
				})
			},
			wantKeys: []keyWant{
				{Key: keyA, Input: "ns/a", Hook: bus.HookMap, Changes: []ChildChange{sizeChange}},
				{Key: keyB, Input: "ns/b", Hook: bus.HookMap, Changes: []ChildChange{change(Create, "b-snap")}},
				{Key: keyGone, Hook: bus.HookTombstone, Changes: []ChildChange{change(Delete, "gone-snap")}},
			},
		},
		{
			reason: "no tombstone hook: the detached key's outputs are deleted without a call",
			want: func(ctrl *unstructured.Unstructured) []received {
				return sortedByKey([]received{
					mapRequest(ctrl, keyA, a, map[string]any{"a-snap": aSnap.Object}),
					mapRequest(ctrl, keyB, b, map[string]any{}),
				})
			},
			wantKeys: []keyWant{
				{Key: keyA, Input: "ns/a", Hook: bus.HookMap, Changes: []ChildChange{sizeChange}},
				{Key: keyB, Input: "ns/b", Hook: bus.HookMap, Changes: []ChildChange{change(Create, "b-snap")}},
				{Key: keyGone, Hook: bus.HookTombstone, Changes: []ChildChange{change(Delete, "gone-snap")}},
			},
		},
	}
	for _, c := range cases {
		t.Run(c.reason, func(t *testing.T) {
			var mu sync.Mutex
			var got []received
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
				var body map[string]any
				_ = json.NewDecoder(req.Body).Decode(&body)
				mu.Lock()
				got = append(got, received{Path: req.URL.Path, Body: body})
				mu.Unlock()
				w.Header().Set("Content-Type", "application/json")
				if req.URL.Path == "/tombstone" {
					_ = json.NewEncoder(w).Encode(map[string]any{"outputs": []any{}})
					return
				}
				in, _ := body["input"].(map[string]any)
				name, _ := in["metadata"].(map[string]any)["name"].(string)
				_ = json.NewEncoder(w).Encode(mapAnswer(name))
			}))
			defer srv.Close()
			ctrl := mapController(srv.URL, c.tombstone)
			known := append(append([]*unstructured.Unstructured{parent}, inputs...), outputs...)
			res, err := Render(ctx, Input{Controller: ctrl, Parent: parent, Inputs: inputs, Children: outputs,
				Resolve: Offline(known...), Hooks: hooks.New(hooks.Options{})})
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(c.want(ctrl), sortedByKey(got)); diff != "" {
				t.Errorf("requests received (-want +got):\n%s", diff)
			}
			var keys []keyWant
			for _, k := range res.Keys {
				if k.Error != "" {
					t.Errorf("key %s: %s", k.Key, k.Error)
				}
				keys = append(keys, keyWant{Key: k.Key, Input: k.Input, Hook: k.Hook, Changes: k.Changes.Children})
			}
			if diff := cmp.Diff(sortedKeyWants(c.wantKeys), keys); diff != "" {
				t.Errorf("keys (-want +got):\n%s", diff)
			}
			// The per-parent item: the aggregated status, no hook call.
			if res.Hook != bus.HookStatus || len(res.Requests) != 0 || res.Desired == nil || res.Desired.Status == nil {
				t.Errorf("per-parent unit %+v", res.Unit)
			}
			if !res.Changed() {
				t.Error("Changed() false with keys to change")
			}
		})
	}
}

// keyWant is what a map key's render is checked for.
type keyWant struct {
	Key, Input, Hook string
	Changes          []ChildChange
}

// sortedByKey orders received requests by their map key (render calls
// keys in key order, which hashes make unreadable in a table).
func sortedByKey(rs []received) []received {
	out := slices.Clone(rs)
	slices.SortStableFunc(out, func(a, b received) int {
		ka, _ := a.Body["mapKey"].(string)
		kb, _ := b.Body["mapKey"].(string)
		return strings.Compare(ka, kb)
	})
	return out
}

func sortedKeyWants(ks []keyWant) []keyWant {
	out := slices.Clone(ks)
	slices.SortFunc(out, func(a, b keyWant) int { return strings.Compare(a.Key, b.Key) })
	return out
}
