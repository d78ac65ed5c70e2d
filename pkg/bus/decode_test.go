package bus

import (
	"encoding/json"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/metabus/metabus/pkg/ujson"
)

// checkBody holds decodeBody to json.Unmarshal for data into a zero T:
// the same error-ness and, without an error, the same value (an int64
// and a float64 differ for cmp, a nil and an empty slice or map too).
// fast reports whether the direct path took it.
func checkBody[T WorkItem | DesiredState](t *testing.T, data []byte) (fast bool) {
	t.Helper()
	var want, got T
	wantErr := json.Unmarshal(data, &want)
	err := decodeBody(data, &got)
	if (err == nil) != (wantErr == nil) {
		t.Fatalf("decodeBody(%s) error = %v, json.Unmarshal's = %v", data, err, wantErr)
	}
	if wantErr == nil {
		if diff := cmp.Diff(want, got); diff != "" {
			t.Fatalf("decodeBody(%s) differs from json.Unmarshal (-want +got):\n%s", data, diff)
		}
	}
	var direct T
	r := ujson.NewReader(data, false)
	switch d := any(&direct).(type) {
	case *WorkItem:
		fast = d.readJSON(r) && r.End()
	case *DesiredState:
		fast = d.readJSON(r) && r.End()
	}
	if fast && wantErr != nil {
		t.Fatalf("the direct path took %s, which json.Unmarshal rejects: %v", data, wantErr)
	}
	return fast
}

func fullBodies(t *testing.T) (WorkItem, DesiredState) {
	var item WorkItem
	fill(t, reflect.ValueOf(&item).Elem(), 1)
	var desired DesiredState
	fill(t, reflect.ValueOf(&desired).Elem(), 2)
	return item, desired
}

func mustMarshal(t *testing.T, v any) []byte {
	t.Helper()
	data, err := marshalBody(v)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// TestBodiesDecodeAsJSONUnmarshal pins the decoding of the bodies
// marshalBody writes: json.Unmarshal's value, from the direct path. The
// bodies have every field set (by reflection, fill), so a field added to
// the types without being read by decode.go fails here ("direct path
// took it" false) instead of going quietly to json.Unmarshal.
func TestBodiesDecodeAsJSONUnmarshal(t *testing.T) {
	item, desired := fullBodies(t)
	release := DesiredState{Hook: HookRelease, Finalizer: "f", Children: nil, ProducedAt: time.Unix(5, 0).UTC()}
	for _, c := range []struct {
		reason string
		data   []byte
		fast   bool
		desc   bool // a DesiredState (else a WorkItem)
	}{
		{"a work item with every field", mustMarshal(t, item), true, false},
		{"a zero work item", mustMarshal(t, WorkItem{}), true, false},
		{"a desired state with every field", mustMarshal(t, desired), true, true},
		{"a zero desired state", mustMarshal(t, DesiredState{}), true, true},
		{"a desired state from B1", mustMarshal(t, benchDesired()), true, true},
		{"a release without children (null)", mustMarshal(t, release), true, true},
		{"nulls leave fields zero", []byte(`{"controller":null,"parent":{"name":null},"reason":null,"attempt":null,"minResourceVersions":null,"enqueuedAt":null}`), true, false},
		{"whitespace and another field order", []byte(" {\n\"reason\" : \"event\", \"parent\":{\"uid\":\"u\",\"apiVersion\":\"v1\"},\"controller\":{\"name\":\"n\",\"kind\":\"K\"}}\n"), true, false},
		{"a key in another case is json.Unmarshal's", []byte(`{"Reason":"event","PARENT":{"UID":"u"}}`), false, false},
		{"an unknown field is json.Unmarshal's", []byte(`{"reason":"event","extra":[1,{"a":null}]}`), false, false},
		{"a duplicate field is json.Unmarshal's", []byte(`{"minResourceVersions":{"a":"1"},"minResourceVersions":{"b":"2"}}`), false, false},
		{"a fraction in an integer field is an error", []byte(`{"attempt":1.0}`), false, false},
		{"an exponent in an integer field is an error", []byte(`{"attempt":1e2}`), false, false},
		{"a negative sequence is an error", []byte(`{"afterSeq":-1}`), false, false},
		{"a sequence beyond uint64 is an error", []byte(`{"afterSeq":18446744073709551616}`), false, false},
		{"a string for a number is an error", []byte(`{"attempt":"1"}`), false, false},
		{"a time that is not RFC 3339 is an error", []byte(`{"enqueuedAt":"yesterday"}`), false, false},
		{"an escaped time is an error (time.Time sees the literal)", []byte(`{"enqueuedAt":"2026-11-29T02:00:00\u005a"}`), false, false},
		{"a null in a string map is json.Unmarshal's", []byte(`{"minResourceVersions":{"a":null}}`), false, false},
		{"trailing garbage is an error", []byte(`{"reason":"x"} {}`), false, false},
		{"malformed JSON is an error", []byte(`{"reason":"x",}`), false, false},
		{"status numbers are float64, children's int64", []byte(`{"status":{"n":1,"big":9007199254740993},"children":[{"kind":"K","n":1,"big":9007199254740993}]}`), true, true},
		{"a child without a kind is an error", []byte(`{"children":[{"apiVersion":"v1"}]}`), false, true},
		{"a child that is not an object is an error", []byte(`{"children":["x"]}`), false, true},
		{"null children elements are nil", []byte(`{"children":[null,{"kind":"K"}],"revisions":[null,{"name":"r","children":[]}],"observed":[null]}`), true, true},
		{"empty collections are empty, not nil", []byte(`{"children":[],"status":{},"observed":[],"inputs":{},"labels":{}}`), true, true},
		{"a null label deletes", []byte(`{"labels":{"a":null,"b":"x"}}`), true, true},
		{"a float out of range in status is an error", []byte(`{"status":{"x":1e400}}`), false, true},
		{"an integer out of range in a child is a float", []byte(`{"children":[{"kind":"K","n":99999999999999999999}]}`), true, true},
		{"a status that is not an object is an error", []byte(`{"status":[1]}`), false, true},
		{"a bool for a string is an error", []byte(`{"hook":true}`), false, true},
		{"a string for a bool is an error", []byte(`{"finalized":"true"}`), false, true},
	} {
		t.Run(c.reason, func(t *testing.T) {
			var fast bool
			if c.desc {
				fast = checkBody[DesiredState](t, c.data)
			} else {
				fast = checkBody[WorkItem](t, c.data)
			}
			if fast != c.fast {
				t.Errorf("direct path took it: %v, want %v", fast, c.fast)
			}
		})
	}
}

// TestDecodeBodyIntoNonZero: json.Unmarshal merges into a target's maps;
// decodeBody leaves such a target to it.
func TestDecodeBodyIntoNonZero(t *testing.T) {
	data := []byte(`{"minResourceVersions":{"b":"2"}}`)
	want := WorkItem{MinResourceVersions: map[string]string{"a": "1"}}
	got := WorkItem{MinResourceVersions: map[string]string{"a": "1"}}
	if err := json.Unmarshal(data, &want); err != nil {
		t.Fatal(err)
	}
	if err := decodeBody(data, &got); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("(-json.Unmarshal +decodeBody):\n%s", diff)
	}
}

// TestDecodeBodyMutations compares generated variants of full bodies: a
// field dropped, set to a value of another type, renamed in another case
// or duplicated, bytes corrupted.
func TestDecodeBodyMutations(t *testing.T) {
	item, desired := fullBodies(t)
	bodies := [][]byte{mustMarshal(t, item), mustMarshal(t, desired), mustMarshal(t, benchDesired())}
	r := rand.New(rand.NewPCG(7, 8))
	n := 3000
	if testing.Short() {
		n = 1000
	}
	fast := 0
	for range n {
		data := mutateBody(t, r, bodies[r.IntN(len(bodies))])
		f1 := checkBody[WorkItem](t, data)
		f2 := checkBody[DesiredState](t, data)
		if f1 || f2 {
			fast++
		}
	}
	if fast < n/4 {
		t.Errorf("the direct path took %d of %d variants", fast, n)
	}
}

var mutationValues = []any{nil, int64(0), int64(-3), 1.5, "s", "2026-11-29T02:30:00Z", true, false, map[string]any{}, []any{},
	map[string]any{"kind": "K", "n": int64(1)}, []any{nil, map[string]any{"kind": "K"}}, map[string]any{"a": "b"}, map[string]any{"a": nil}}

func mutateBody(t *testing.T, r *rand.Rand, body []byte) []byte {
	t.Helper()
	v, err := ujson.Decode(body)
	if err != nil {
		t.Fatal(err)
	}
	top := v.(map[string]any)
	if r.IntN(2) == 0 {
		mutateTree(r, top, 0)
	}
	data, err := ujson.Marshal(top)
	if err != nil {
		t.Fatal(err)
	}
	s := string(data)
	switch r.IntN(8) {
	case 0: // a duplicate key
		s = strings.Replace(s, `{"`, `{"reason":"x","`, 1)
		s = strings.Replace(s, `,"hook":`, `,"hook":"a","hook":`, 1)
	case 1: // a key in another case
		s = strings.Replace(s, `"name":`, `"Name":`, 1)
	case 2:
		if s != "" {
			i := r.IntN(len(s))
			s = s[:i] + s[i+1:]
		}
	case 3: // numbers in forms Marshal does not write
		s = strings.Replace(s, `"attempt":`, `"attempt":1e1,"x":`, 1)
		s = strings.Replace(s, `"workSeq":`, `"workSeq":-0,"y":`, 1)
	}
	return []byte(s)
}

func mutateTree(r *rand.Rand, m map[string]any, depth int) {
	for k, v := range m {
		switch r.IntN(30) {
		case 0:
			delete(m, k)
		case 1:
			m[k] = mutationValues[r.IntN(len(mutationValues))]
		default:
			if sub, ok := v.(map[string]any); ok && depth < 3 {
				mutateTree(r, sub, depth+1)
			}
		}
	}
}

// FuzzDecodeBody compares decodeBody with json.Unmarshal on any input,
// into a work item and a desired state.
func FuzzDecodeBody(f *testing.F) {
	var item WorkItem
	var desired DesiredState
	// fill needs a *testing.T; the fuzz seeds use the B1 bodies and
	// hand-written ones.
	ds := benchDesired()
	item = WorkItem{Controller: ds.Controller, Parent: ds.Parent, Reason: ReasonRetry, Attempt: 2, AfterSeq: 9, MinResourceVersions: ds.MinResourceVersions, EnqueuedAt: ds.ProducedAt}
	desired = *ds
	for _, v := range []any{item, desired} {
		data, err := marshalBody(v)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
	}
	f.Add([]byte(`{"children":[null,{"kind":"K","n":1}],"status":{"n":1},"labels":{"a":null}}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		checkBody[WorkItem](t, data)
		checkBody[DesiredState](t, data)
	})
}
