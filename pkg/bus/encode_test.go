package bus

import (
	"encoding/json"
	"math"
	"reflect"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// fill sets every field of the struct v points to, recursively, to a
// value that is not its zero (so that omitempty fields are written): a
// field added to a message type is then written by json.Marshal, and
// TestBodiesMatchJSONMarshal fails until the hand-written encoder writes
// it too. A type fill does not know fails the test.
func fill(t *testing.T, v reflect.Value, seed int) {
	t.Helper()
	str := func(s string) string { return s + "-<&>\u2028é\"" }
	switch v.Type() {
	case reflect.TypeFor[time.Time]():
		v.Set(reflect.ValueOf(time.Date(2026, 11, 29, 2, 30, 0, 120000+seed, time.FixedZone("x", 5*3600+1800))))
		return
	case reflect.TypeFor[[]*unstructured.Unstructured]():
		v.Set(reflect.ValueOf([]*unstructured.Unstructured{
			{Object: map[string]any{"apiVersion": "v1", "kind": "ConfigMap", "metadata": map[string]any{"name": str("c")}, "data": map[string]any{"k": str("v"), "n": int64(seed)}}},
			nil,
			{},
		}))
		return
	case reflect.TypeFor[map[string]any]():
		v.Set(reflect.ValueOf(map[string]any{"b": 1.5, "a": []any{int64(seed), nil, true, str("s")}, "o": map[string]any{}}))
		return
	case reflect.TypeFor[map[string]string]():
		v.Set(reflect.ValueOf(map[string]string{"z/" + str("k"): str("v"), "a": "1"}))
		return
	case reflect.TypeFor[map[string]*string]():
		s := str("v")
		v.Set(reflect.ValueOf(map[string]*string{"set": &s, "del": nil, "<": &s}))
		return
	}
	switch v.Kind() {
	case reflect.Struct:
		for i := range v.NumField() {
			fill(t, v.Field(i), seed+i)
		}
	case reflect.String:
		v.SetString(str(v.Type().Name()))
	case reflect.Int, reflect.Int64:
		v.SetInt(int64(seed + 3))
	case reflect.Uint64:
		v.SetUint(uint64(seed) + 1<<40)
	case reflect.Float64:
		v.SetFloat(float64(seed) + 0.25)
	case reflect.Bool:
		v.SetBool(true)
	case reflect.Slice:
		s := reflect.MakeSlice(v.Type(), 2, 2)
		for i := range 2 {
			fill(t, s.Index(i), seed+10*i)
		}
		v.Set(s)
	default:
		t.Fatalf("fill does not know %s: teach it, and the encoder in encode.go, the new field", v.Type())
	}
}

// TestBodiesMatchJSONMarshal pins the bodies NewEvent writes: exactly
// json.Marshal's bytes, and its errors.
func TestBodiesMatchJSONMarshal(t *testing.T) {
	var fullItem WorkItem
	fill(t, reflect.ValueOf(&fullItem).Elem(), 1)
	var fullDesired DesiredState
	fill(t, reflect.ValueOf(&fullDesired).Elem(), 2)
	withStatus := func(st map[string]any) DesiredState { d := fullDesired; d.Status = st; return d }
	withTime := func(at time.Time) DesiredState { d := fullDesired; d.ProducedAt = at; return d }
	emptyMaps := DesiredState{Status: map[string]any{}, Inputs: map[string]string{}, Labels: map[string]*string{}, Children: []*unstructured.Unstructured{}, Observed: []ObjectRef{}, Revisions: []RevisionChildren{}}
	for _, c := range []struct {
		reason string
		body   any
	}{
		{"a zero work item", WorkItem{}},
		{"a work item with every field", fullItem},
		{"a pointer to a work item (left to json.Marshal)", &fullItem},
		{"a zero desired state", DesiredState{}},
		{"a desired state with every field", fullDesired},
		{"empty maps and slices are omitted, empty children are []", emptyMaps},
		{"a desired state from B1", *benchDesired()},
		{"a status that cannot be encoded", withStatus(map[string]any{"x": math.NaN()})},
		{"a status of a type json.Marshal handles itself", withStatus(map[string]any{"t": time.Unix(5, 0).UTC(), "m": map[string]int{"b": 1, "a": 2}})},
		{"a year json cannot write", withTime(time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC))},
		{"an offset json cannot write", withTime(time.Date(2026, 1, 1, 0, 0, 0, 0, time.FixedZone("far", 24*3600)))},
		{"an infinite resync", DesiredState{ResyncAfterSeconds: math.Inf(1)}},
		{"a tiny resync in exponent form", DesiredState{ResyncAfterSeconds: 1e-9}},
		{"another body", map[string]string{"b": "<"}},
	} {
		t.Run(c.reason, func(t *testing.T) {
			want, wantErr := json.Marshal(c.body)
			got, err := marshalBody(c.body)
			if (err == nil) != (wantErr == nil) || (err != nil && err.Error() != wantErr.Error()) {
				t.Fatalf("error %v, json.Marshal's %v", err, wantErr)
			}
			if diff := cmp.Diff(string(want), string(got)); diff != "" {
				t.Errorf("body differs from json.Marshal's (-want +got):\n%s", diff)
			}
		})
	}
}
