package apply

import (
	"encoding/json"
	"math"
	"reflect"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

func unstructuredFrom(t testing.TB, decode func(testing.TB, string) map[string]any, s string) *unstructured.Unstructured {
	t.Helper()
	return &unstructured.Unstructured{Object: decode(t, s)}
}

func annotation(t testing.TB, obj *unstructured.Unstructured) string {
	t.Helper()
	v, found, err := unstructured.NestedString(obj.Object, "metadata", "annotations", LastAppliedAnnotation)
	if err != nil || !found {
		t.Fatalf("annotation %s missing (found=%v, err=%v) in %s", LastAppliedAnnotation, found, err, mustJSON(t, obj.Object))
	}
	return v
}

func TestLastAppliedRoundTrip(t *testing.T) {
	obj := unstructuredFrom(t, apiJSON, `{"metadata":{"name":"x","annotations":{"other":"kept"}}}`)
	last := hookJSON(t, `{"metadata":{"name":"x"},"spec":{"replicas":3,"ratio":0.5,"list":[{"name":"a"}],"s":"<&>"}}`)
	if err := SetLastApplied(obj, last); err != nil {
		t.Fatal(err)
	}
	got, err := GetLastApplied(obj)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(normalize(t, got), normalize(t, last)) {
		t.Errorf("round trip: got %s, want %s", mustJSON(t, got), mustJSON(t, last))
	}
	// Integral numbers come back as int64, as elsewhere in unstructured content.
	if r := got["spec"].(map[string]any)["replicas"]; r != int64(3) {
		t.Errorf("replicas decoded as %#v, want int64(3)", r)
	}
	if obj.GetAnnotations()["other"] != "kept" {
		t.Errorf("SetLastApplied dropped another annotation: %v", obj.GetAnnotations())
	}
}

func TestSetLastAppliedCreatesMetadata(t *testing.T) {
	obj := &unstructured.Unstructured{}
	if err := SetLastApplied(obj, map[string]any{"a": "b"}); err != nil {
		t.Fatal(err)
	}
	if got := annotation(t, obj); got != `{"a":"b"}` {
		t.Errorf("annotation = %s", got)
	}
}

func TestSetLastAppliedErrors(t *testing.T) {
	if err := SetLastApplied(nil, map[string]any{}); err == nil {
		t.Error("nil object accepted")
	}
	obj := &unstructured.Unstructured{Object: map[string]any{"metadata": "not an object"}}
	if err := SetLastApplied(obj, map[string]any{}); err == nil || !strings.Contains(err.Error(), "metadata") {
		t.Errorf("metadata of the wrong type: err = %v", err)
	}
	obj = &unstructured.Unstructured{Object: map[string]any{"metadata": map[string]any{"annotations": []any{}}}}
	if err := SetLastApplied(obj, map[string]any{}); err == nil || !strings.Contains(err.Error(), "annotations") {
		t.Errorf("annotations of the wrong type: err = %v", err)
	}
	obj = &unstructured.Unstructured{}
	if err := SetLastApplied(obj, map[string]any{"f": math.Inf(1)}); err == nil {
		t.Error("unencodable value accepted")
	}
}

func TestGetLastApplied(t *testing.T) {
	tests := []struct {
		name    string
		obj     *unstructured.Unstructured
		want    map[string]any
		wantErr string
	}{
		{name: "nil object"},
		{name: "no metadata", obj: &unstructured.Unstructured{Object: map[string]any{}}},
		{name: "no annotation", obj: unstructuredFrom(t, apiJSON, `{"metadata":{"annotations":{"a":"b"}}}`)},
		{name: "empty annotation", obj: withAnnotation(``)},
		{name: "null", obj: withAnnotation(`null`)},
		{name: "valid", obj: withAnnotation(`{"a":1}`), want: map[string]any{"a": int64(1)}},
		{name: "malformed", obj: withAnnotation(`{"a":`), wantErr: "malformed"},
		{name: "not an object", obj: withAnnotation(`[1,2]`), wantErr: "malformed"},
		{name: "trailing data", obj: withAnnotation(`{} {}`), wantErr: "malformed"},
		{
			name:    "annotation not a string",
			obj:     &unstructured.Unstructured{Object: map[string]any{"metadata": map[string]any{"annotations": map[string]any{LastAppliedAnnotation: int64(1)}}}},
			wantErr: "not a string",
		},
		{
			name:    "metadata not an object",
			obj:     &unstructured.Unstructured{Object: map[string]any{"metadata": "x"}},
			wantErr: "reading annotation",
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := GetLastApplied(tc.obj)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want it to mention %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("got %#v, want %#v", got, tc.want)
			}
		})
	}
}

func withAnnotation(value string) *unstructured.Unstructured {
	return &unstructured.Unstructured{Object: map[string]any{
		"metadata": map[string]any{"annotations": map[string]any{LastAppliedAnnotation: value}},
	}}
}

func TestPrepareCreate(t *testing.T) {
	desired := unstructuredFrom(t, hookJSON, `{"apiVersion":"v1","kind":"ConfigMap",
		"metadata":{"name":"c","labels":{"a":"b"},"annotations":{"`+LastAppliedAnnotation+`":"stale copy"}},
		"data":{"k":"v","gone":null}}`)
	before := mustJSON(t, desired.Object)

	got, err := PrepareCreate(desired)
	if err != nil {
		t.Fatal(err)
	}
	if after := mustJSON(t, desired.Object); after != before {
		t.Fatalf("desired was modified:\n before %s\n after  %s", before, after)
	}
	wantAnnotation := `{"apiVersion":"v1","data":{"gone":null,"k":"v"},"kind":"ConfigMap","metadata":{"labels":{"a":"b"},"name":"c"}}`
	if a := annotation(t, got); a != wantAnnotation {
		t.Errorf("annotation = %s\nwant the stripped desired %s", a, wantAnnotation)
	}
	want := apiJSON(t, `{"apiVersion":"v1","kind":"ConfigMap",
		"metadata":{"name":"c","labels":{"a":"b"},"annotations":{"`+LastAppliedAnnotation+`":`+mustJSON(t, wantAnnotation)+`}},
		"data":{"k":"v"}}`)
	if !reflect.DeepEqual(normalize(t, got.Object), normalize(t, want)) {
		t.Errorf("object:\n got  %s\n want %s", mustJSON(t, got.Object), mustJSON(t, want))
	}
	// A deep copy: changing the result leaves desired alone.
	got.Object["metadata"].(map[string]any)["labels"].(map[string]any)["a"] = "changed"
	if after := mustJSON(t, desired.Object); after != before {
		t.Errorf("result aliases desired")
	}
}

func TestPrepareCreateErrors(t *testing.T) {
	if _, err := PrepareCreate(nil); err == nil {
		t.Error("nil desired accepted")
	}
	if _, err := PrepareCreate(&unstructured.Unstructured{Object: map[string]any{"x": func() {}}}); err == nil {
		t.Error("non-JSON desired accepted")
	}
	if _, err := PrepareCreate(&unstructured.Unstructured{Object: map[string]any{"metadata": "x"}}); err == nil {
		t.Error("desired with non-object metadata accepted")
	}
}

// serverRoundTrip emulates what the API server returns after a write: the object re-decoded
// from JSON (integers become int64), system fields filled, defaults added, status set.
func serverRoundTrip(t testing.TB, obj *unstructured.Unstructured, resourceVersion string) *unstructured.Unstructured {
	t.Helper()
	out := unstructuredFrom(t, apiJSON, mustJSON(t, obj.Object))
	meta := out.Object["metadata"].(map[string]any)
	meta["uid"] = "0b4d6f9e-uid"
	meta["resourceVersion"] = resourceVersion
	meta["generation"] = int64(1)
	meta["creationTimestamp"] = "2026-01-02T03:04:05Z"
	meta["managedFields"] = []any{map[string]any{"manager": "metabus", "operation": "Update"}}
	if containers, ok, _ := unstructured.NestedSlice(out.Object, "spec", "containers"); ok {
		for _, c := range containers {
			c := c.(map[string]any)
			c["imagePullPolicy"] = "IfNotPresent"
			c["terminationMessagePath"] = "/dev/termination-log"
		}
		_ = unstructured.SetNestedSlice(out.Object, containers, "spec", "containers")
	}
	out.Object["status"] = map[string]any{"phase": "Running"}
	return out
}

const podDesired = `{"apiVersion":"v1","kind":"Pod",
	"metadata":{"name":"p","namespace":"ns","labels":{"app":"web"}},
	"spec":{"terminationGracePeriodSeconds":30,"containers":[
		{"name":"web","image":"nginx:1.27","ports":[{"containerPort":80,"name":"http"}],
		 "env":[{"name":"A","value":"1"}],"resources":{"limits":{"cpu":0.5}}}]}}`

func TestUpdateChildUnchangedReapply(t *testing.T) {
	desired := unstructuredFrom(t, hookJSON, podDesired)
	created, err := PrepareCreate(desired)
	if err != nil {
		t.Fatal(err)
	}
	observed := serverRoundTrip(t, created, "100")

	merged, changed, err := UpdateChild(observed, unstructuredFrom(t, hookJSON, podDesired))
	if err != nil {
		t.Fatal(err)
	}
	if changed {
		t.Errorf("re-applying the same desired reported a change:\n observed %s\n merged   %s",
			mustJSON(t, observed.Object), mustJSON(t, merged.Object))
	}
	// Numbers: desired decoded as float64 (30, 80) and the server's int64 must compare equal.
	if v, _, _ := unstructured.NestedFieldNoCopy(merged.Object, "spec", "terminationGracePeriodSeconds"); v != int64(30) {
		t.Errorf("terminationGracePeriodSeconds = %#v, want the observed int64(30)", v)
	}
	// Server defaults inside list-map items are kept.
	c := merged.Object["spec"].(map[string]any)["containers"].([]any)[0].(map[string]any)
	if c["imagePullPolicy"] != "IfNotPresent" {
		t.Errorf("defaulted field lost: %v", c)
	}
}

func TestUpdateChildDetectsChange(t *testing.T) {
	created, err := PrepareCreate(unstructuredFrom(t, hookJSON, podDesired))
	if err != nil {
		t.Fatal(err)
	}
	observed := serverRoundTrip(t, created, "100")
	desired := unstructuredFrom(t, hookJSON, strings.Replace(podDesired, "nginx:1.27", "nginx:1.28", 1))

	merged, changed, err := UpdateChild(observed, desired)
	if err != nil {
		t.Fatal(err)
	}
	if !changed {
		t.Fatal("changed = false for a new image")
	}
	c := merged.Object["spec"].(map[string]any)["containers"].([]any)[0].(map[string]any)
	if c["image"] != "nginx:1.28" || c["imagePullPolicy"] != "IfNotPresent" {
		t.Errorf("container = %v, want the new image and the kept default", c)
	}
	last, err := GetLastApplied(merged)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(normalize(t, last), normalize(t, desired.Object)) {
		t.Errorf("annotation holds %s, want the new desired", mustJSON(t, last))
	}
}

func TestUpdateChildRevertsSystemFieldsAndStatus(t *testing.T) {
	observed := unstructuredFrom(t, apiJSON, `{"apiVersion":"v1","kind":"ConfigMap",
		"metadata":{"name":"c","uid":"real-uid","resourceVersion":"7","generation":2,
			"creationTimestamp":"2026-01-01T00:00:00Z","managedFields":[{"manager":"x"}]},
		"data":{"k":"v"},"status":{"observed":"real"}}`)
	desired := unstructuredFrom(t, hookJSON, `{"apiVersion":"v1","kind":"ConfigMap",
		"metadata":{"name":"c","uid":"stale-uid","resourceVersion":"1","generation":9,
			"creationTimestamp":"1999-01-01T00:00:00Z","managedFields":null,
			"deletionTimestamp":"2026-01-01T00:00:00Z","deletionGracePeriodSeconds":0,"selfLink":"/x"},
		"data":{"k":"v"},"status":{"observed":"fake","extra":1}}`)
	observedBefore, desiredBefore := mustJSON(t, observed.Object), mustJSON(t, desired.Object)

	merged, changed, err := UpdateChild(observed, desired)
	if err != nil {
		t.Fatal(err)
	}
	if mustJSON(t, observed.Object) != observedBefore || mustJSON(t, desired.Object) != desiredBefore {
		t.Fatal("UpdateChild modified its inputs")
	}
	meta := merged.Object["metadata"].(map[string]any)
	for f, want := range map[string]any{"uid": "real-uid", "resourceVersion": "7", "generation": int64(2), "creationTimestamp": "2026-01-01T00:00:00Z"} {
		if meta[f] != want {
			t.Errorf("metadata.%s = %#v, want observed %#v", f, meta[f], want)
		}
	}
	if !reflect.DeepEqual(meta["managedFields"], []any{map[string]any{"manager": "x"}}) {
		t.Errorf("managedFields = %#v, want observed value back after desired nulled it", meta["managedFields"])
	}
	for _, f := range []string{"deletionTimestamp", "deletionGracePeriodSeconds", "selfLink"} {
		if v, ok := meta[f]; ok {
			t.Errorf("metadata.%s = %#v, want absent as in observed", f, v)
		}
	}
	if !reflect.DeepEqual(merged.Object["status"], map[string]any{"observed": "real"}) {
		t.Errorf("status = %#v, want observed status", merged.Object["status"])
	}
	// Only the annotation is new, so this is a change (the first apply records ownership).
	if !changed {
		t.Error("changed = false although the annotation was added")
	}

	// Status absent from observed stays absent.
	delete(observed.Object, "status")
	merged, _, err = UpdateChild(observed, desired)
	if err != nil {
		t.Fatal(err)
	}
	if s, ok := merged.Object["status"]; ok {
		t.Errorf("status = %#v, want absent as in observed", s)
	}
}

func TestUpdateChildSharesNothingWithInputs(t *testing.T) {
	created, err := PrepareCreate(unstructuredFrom(t, hookJSON, podDesired))
	if err != nil {
		t.Fatal(err)
	}
	observed := serverRoundTrip(t, created, "1")
	desired := unstructuredFrom(t, hookJSON, strings.Replace(podDesired, `"A","value":"1"`, `"A","value":"2"`, 1))
	desired.Object["spec"].(map[string]any)["newList"] = []any{map[string]any{"k": "v"}}
	observedBefore, desiredBefore := mustJSON(t, observed.Object), mustJSON(t, desired.Object)

	merged, _, err := UpdateChild(observed, desired)
	if err != nil {
		t.Fatal(err)
	}
	scribble(merged.Object)
	if mustJSON(t, observed.Object) != observedBefore || mustJSON(t, desired.Object) != desiredBefore {
		t.Fatal("writing to the result changed an input")
	}
}

// scribble overwrites every scalar and appends to every object reachable from v.
func scribble(v any) {
	switch t := v.(type) {
	case map[string]any:
		for k, e := range t {
			switch e.(type) {
			case map[string]any, []any:
				scribble(e)
			default:
				t[k] = "scribbled"
			}
		}
		t["scribbled"] = true
	case []any:
		for i, e := range t {
			switch e.(type) {
			case map[string]any, []any:
				scribble(e)
			default:
				t[i] = "scribbled"
			}
		}
	}
}

func TestUpdateChildStripsIncomingAnnotation(t *testing.T) {
	desired := unstructuredFrom(t, hookJSON, `{"kind":"ConfigMap","metadata":{"name":"c"},"data":{"k":"v"}}`)
	created, err := PrepareCreate(desired)
	if err != nil {
		t.Fatal(err)
	}
	observed := serverRoundTrip(t, created, "1")
	// A hook that echoes the observed object's metadata back, annotation included.
	echo := unstructuredFrom(t, hookJSON, mustJSON(t, desired.Object))
	echo.Object["metadata"] = map[string]any{"name": "c", "annotations": observed.Object["metadata"].(map[string]any)["annotations"]}

	merged, changed, err := UpdateChild(observed, echo)
	if err != nil {
		t.Fatal(err)
	}
	if changed {
		t.Errorf("echoing the annotation made a change:\n %s\n %s", mustJSON(t, observed.Object), mustJSON(t, merged.Object))
	}
	if a := annotation(t, merged); strings.Contains(a, "last-applied") {
		t.Errorf("annotation nests a copy of itself: %s", a)
	}
}

func TestUpdateChildMalformedAnnotationSelfHeals(t *testing.T) {
	observed := unstructuredFrom(t, apiJSON, `{"metadata":{"name":"c","annotations":{"`+LastAppliedAnnotation+`":"{oops"}},
		"data":{"mine":"1","theirs":"2"}}`)
	desired := unstructuredFrom(t, hookJSON, `{"metadata":{"name":"c"},"data":{"mine":"3"}}`)
	merged, changed, err := UpdateChild(observed, desired)
	if err != nil {
		t.Fatalf("a malformed annotation should not block the update: %v", err)
	}
	if !changed {
		t.Error("changed = false")
	}
	want := map[string]any{"mine": "3", "theirs": "2"}
	if !reflect.DeepEqual(merged.Object["data"], want) {
		t.Errorf("data = %v, want the overlay %v", merged.Object["data"], want)
	}
	if _, err := GetLastApplied(merged); err != nil {
		t.Errorf("annotation still malformed: %v", err)
	}
}

func TestUpdateChildErrors(t *testing.T) {
	ok := &unstructured.Unstructured{Object: map[string]any{"metadata": map[string]any{"name": "x"}}}
	tests := []struct {
		name              string
		observed, desired *unstructured.Unstructured
	}{
		{"nil observed", nil, ok},
		{"nil desired", ok, nil},
		{"bad desired value", ok, &unstructured.Unstructured{Object: map[string]any{"x": []int{1}}}},
		{"bad observed value", &unstructured.Unstructured{Object: map[string]any{"x": struct{}{}}}, ok},
		{"desired metadata not an object", ok, &unstructured.Unstructured{Object: map[string]any{"metadata": "x"}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if _, _, err := UpdateChild(tc.observed, tc.desired); err == nil {
				t.Error("no error")
			}
		})
	}
}

// The annotation must not depend on the Go number types of desired, or a hook answer decoded
// with json.Number would look like a change every time.
func TestAnnotationIndependentOfNumberTypes(t *testing.T) {
	a, err := PrepareCreate(&unstructured.Unstructured{Object: map[string]any{"n": float64(3), "f": 0.5}})
	if err != nil {
		t.Fatal(err)
	}
	b, err := PrepareCreate(&unstructured.Unstructured{Object: map[string]any{"n": json.Number("3"), "f": json.Number("0.5")}})
	if err != nil {
		t.Fatal(err)
	}
	if annotation(t, a) != annotation(t, b) {
		t.Errorf("annotations differ: %s vs %s", annotation(t, a), annotation(t, b))
	}
}
