package apply

import (
	"bytes"
	"encoding/json"
	"testing"

	utiljson "k8s.io/apimachinery/pkg/util/json"
)

// FuzzMerge decodes three JSON documents (observed and lastApplied as the API machinery does,
// desired as a hook answer, optionally with json.Number) and checks that Merge never panics,
// accepts any JSON, leaves its inputs alone, returns something that encodes as JSON, and
// applies every desired scalar and null reachable through objects.
//
// It deliberately does not assert idempotence: with adversarial lists whose items disagree
// about identity under different conventional keys, a second apply can legitimately pair
// items differently (see the package comment); TestPropertyListMapsConverge covers that.
func FuzzMerge(f *testing.F) {
	seeds := []struct {
		observed, last, desired string
		useNumber               bool
	}{
		{`{}`, `{}`, `{}`, false},
		{`{"keep":1,"remove":2,"replace":3}`, `{"remove":2,"replace":3}`, `{"replace":4,"add":5}`, false},
		{`{"a":{"x":1,"y":2}}`, `{"a":{"x":1}}`, `{"a":"str"}`, true},
		{`{"a":[1,2]}`, `{"a":[1]}`, `{"a":{"b":null}}`, false},
		{`{"c":[{"name":"nginx","image":"a"},{"name":"sidecar"}]}`, `{"c":[{"name":"nginx","image":"a"}]}`, `{"c":[{"name":"nginx","image":"b"}]}`, false},
		{`{"p":[{"port":80,"name":"a"},{"port":"80","name":"b"}]}`, `{"p":[{"port":80}]}`, `{"p":[{"port":80.0,"name":"c"},{"port":90}]}`, true},
		{`{"p":[{"containerPort":53,"protocol":"TCP"},{"containerPort":53,"protocol":"UDP"}]}`, `null`, `{"p":[{"containerPort":53},{"containerPort":53},{"containerPort":53}]}`, false},
		{`{"a":null,"b":{"c":null}}`, `{"a":null}`, `{"a":null,"b":null,"d":[null,{"e":null}]}`, false},
		{`{"n":1e400,"m":-0,"big":123456789012345678901234567890}`, `{}`, `{"n":1,"big":1.5e300}`, true},
	}
	for _, s := range seeds {
		f.Add(s.observed, s.last, s.desired, s.useNumber)
	}
	f.Fuzz(func(t *testing.T, observedJSON, lastJSON, desiredJSON string, useNumber bool) {
		var observed, last, desired map[string]any
		if utiljson.Unmarshal([]byte(observedJSON), &observed) != nil ||
			utiljson.Unmarshal([]byte(lastJSON), &last) != nil {
			return
		}
		dec := json.NewDecoder(bytes.NewReader([]byte(desiredJSON)))
		if useNumber {
			dec.UseNumber()
		}
		if dec.Decode(&desired) != nil || dec.More() {
			return
		}
		before := encode(t, observed) + encode(t, last) + encode(t, desired)

		got, err := Merge(observed, last, desired)
		if err != nil {
			t.Fatalf("Merge rejected JSON input: %v", err)
		}
		out := encode(t, got)
		if after := encode(t, observed) + encode(t, last) + encode(t, desired); after != before {
			t.Fatalf("Merge modified its inputs")
		}

		if !desiredFieldsWin(got, desired) {
			t.Fatalf("a desired scalar or null was not applied:\n desired %s\n got     %s", encode(t, desired), out)
		}
	})
}

func encode(t *testing.T, v any) string {
	t.Helper()
	raw, err := json.Marshal(v)
	if err != nil {
		t.Fatalf("does not encode as JSON: %v", err)
	}
	return string(raw)
}

// desiredFieldsWin reports whether, following objects from the top, every non-null desired
// scalar is in got with an equal value and every null desired field is absent.
func desiredFieldsWin(got, desired map[string]any) bool {
	for k, dv := range desired {
		gv, ok := got[k]
		switch d := dv.(type) {
		case nil:
			if ok {
				return false
			}
		case map[string]any:
			g, isObj := gv.(map[string]any)
			if !isObj || !desiredFieldsWin(g, d) {
				return false
			}
		case []any:
			if _, isList := gv.([]any); !isList {
				return false
			}
		default:
			if !ok || !equalJSON(gv, dv) {
				return false
			}
		}
	}
	return true
}
