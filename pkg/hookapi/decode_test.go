package hookapi

import (
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"
)

func TestDecodeCompositeSyncResponse(t *testing.T) {
	const pod = `{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p-0"},"spec":{"replicas":3,"ratio":0.5}}`
	cases := []struct {
		reason    string
		body      string
		strict    bool
		wantErr   string // substring; "" means success
		wantIndex int    // for *ObjectError, else -1
		check     func(t *testing.T, r *CompositeSyncResponse)
	}{
		{
			reason: "a well-formed response decodes, integers stay int64",
			body:   `{"status":{"replicas":1},"children":[` + pod + `],"resyncAfterSeconds":1.5}`,
			check: func(t *testing.T, r *CompositeSyncResponse) {
				if len(r.Children) != 1 || r.Children[0].GetName() != "p-0" {
					t.Fatalf("children = %v", r.Children)
				}
				spec := r.Children[0].Object["spec"].(map[string]any)
				if _, ok := spec["replicas"].(int64); !ok {
					t.Errorf("replicas is %T, want int64", spec["replicas"])
				}
				if _, ok := spec["ratio"].(float64); !ok {
					t.Errorf("ratio is %T, want float64", spec["ratio"])
				}
				if r.Status["replicas"] != int64(1) || r.ResyncAfterSeconds != 1.5 {
					t.Errorf("status/resync = %v/%v", r.Status, r.ResyncAfterSeconds)
				}
			},
		},
		{
			reason: "null children means no children",
			body:   `{"children":null}`,
			check: func(t *testing.T, r *CompositeSyncResponse) {
				if r.Children != nil {
					t.Errorf("children = %v, want nil", r.Children)
				}
			},
		},
		{
			reason: "finalize response",
			body:   `{"children":[],"finalized":true}`,
			strict: true,
			check: func(t *testing.T, r *CompositeSyncResponse) {
				if !r.Finalized || r.Children == nil || len(r.Children) != 0 {
					t.Errorf("got %+v", r)
				}
			},
		},
		{
			reason: "keys are case-sensitive: Children is not children (loose ignores it)",
			body:   `{"Children":[` + pod + `]}`,
			check: func(t *testing.T, r *CompositeSyncResponse) {
				if len(r.Children) != 0 {
					t.Errorf("case-insensitive match: %v", r.Children)
				}
			},
		},
		{reason: "strict rejects unknown fields", body: `{"children":[],"chidlren":[]}`, strict: true, wantErr: "unknown field", wantIndex: -1},
		{reason: "strict rejects duplicate fields", body: `{"children":[],"children":[]}`, strict: true, wantErr: "duplicate field", wantIndex: -1},
		{reason: "loose accepts unknown fields", body: `{"children":[],"extra":1}`},
		{reason: "unknown fields inside a child are not strict errors (free-form object)", body: `{"children":[{"apiVersion":"v1","kind":"Pod","metadata":{"name":"a"},"whatever":1}]}`, strict: true},
		{reason: "children not a list", body: `{"children":{"Pod.v1":{}}}`, wantErr: "must be a list of objects, got an object", wantIndex: -1},
		{reason: "null entry", body: `{"children":[` + pod + `,null]}`, wantErr: "children[1]: must be an object, got null", wantIndex: 1},
		{reason: "string entry", body: `{"children":["pod"]}`, wantErr: "must be an object, got a string", wantIndex: 0},
		{reason: "number entry", body: `{"children":[` + pod + `,` + pod + `,7]}`, wantErr: "children[2]: must be an object, got a number", wantIndex: 2},
		{reason: "list entry", body: `{"children":[[]]}`, wantErr: "must be an object, got a list", wantIndex: 0},
		{reason: "missing kind", body: `{"children":[{"apiVersion":"v1","metadata":{"name":"a"}}]}`, wantErr: `children[0] (.v1 "a"): kind is missing`, wantIndex: 0},
		{reason: "missing apiVersion", body: `{"children":[{"kind":"Pod","metadata":{"name":"a"}}]}`, wantErr: "apiVersion is missing", wantIndex: 0},
		{reason: "empty kind", body: `{"children":[{"apiVersion":"v1","kind":"","metadata":{"name":"a"}}]}`, wantErr: "kind is empty", wantIndex: 0},
		{reason: "kind is a number", body: `{"children":[{"apiVersion":"v1","kind":5,"metadata":{"name":"a"}}]}`, wantErr: "kind must be a string, got a number", wantIndex: 0},
		{reason: "missing metadata", body: `{"children":[{"apiVersion":"v1","kind":"Pod"}]}`, wantErr: "metadata.name is missing", wantIndex: 0},
		{reason: "metadata not an object", body: `{"children":[{"apiVersion":"v1","kind":"Pod","metadata":"x"}]}`, wantErr: "metadata must be an object, got a string", wantIndex: 0},
		{reason: "missing name", body: `{"children":[{"apiVersion":"v1","kind":"Pod","metadata":{"generateName":"p-"}}]}`, wantErr: "metadata.name is missing", wantIndex: 0},
		{reason: "number as name", body: `{"children":[{"apiVersion":"v1","kind":"Pod","metadata":{"name":42}}]}`, wantErr: "metadata.name must be a string, got a number", wantIndex: 0},
		{reason: "null name", body: `{"children":[{"apiVersion":"v1","kind":"Pod","metadata":{"name":null}}]}`, wantErr: "metadata.name is missing", wantIndex: 0},
		{reason: "number as namespace", body: `{"children":[{"apiVersion":"v1","kind":"Pod","metadata":{"name":"a","namespace":1}}]}`, wantErr: "metadata.namespace must be a string", wantIndex: 0},
		{reason: "label value not a string", body: `{"children":[{"apiVersion":"v1","kind":"Pod","metadata":{"name":"a","labels":{"n":1}}}]}`, wantErr: `metadata.labels["n"] must be a string, got a number`, wantIndex: 0},
		{reason: "annotations not an object", body: `{"children":[{"apiVersion":"v1","kind":"Pod","metadata":{"name":"a","annotations":[]}}]}`, wantErr: "metadata.annotations must be an object, got a list", wantIndex: 0},
		{reason: "status not an object", body: `{"status":"ok","children":[]}`, wantErr: "status", wantIndex: -1},
		{reason: "not JSON", body: `{"children":[`, wantErr: "decoding hook response", wantIndex: -1},
		{reason: "body is a list", body: `[]`, wantErr: "decoding hook response", wantIndex: -1},
	}
	for _, c := range cases {
		for _, strict := range []bool{c.strict, true} {
			if c.wantErr == "" && !c.strict && strict {
				continue // loose-only successes (unknown/case-mismatched fields) fail strictly
			}
			var r CompositeSyncResponse
			err := Decode([]byte(c.body), strict, &r)
			if c.wantErr == "" {
				if err != nil {
					t.Errorf("%s (strict=%v): unexpected error %v", c.reason, strict, err)
				} else if c.check != nil {
					c.check(t, &r)
				}
				continue
			}
			if err == nil || !strings.Contains(err.Error(), c.wantErr) {
				t.Errorf("%s (strict=%v): got error %v, want one containing %q", c.reason, strict, err, c.wantErr)
				continue
			}
			var oe *ObjectError
			if c.wantIndex >= 0 && (!errors.As(err, &oe) || oe.Index != c.wantIndex || oe.List != "children") {
				t.Errorf("%s (strict=%v): error %v is not an *ObjectError for children[%d]", c.reason, strict, err, c.wantIndex)
			}
		}
	}
}

// TestChildListValidatesWithAnyDecoder shows that the checks live in the list type, so a caller
// that uses encoding/json directly still gets an indexed error rather than a nil child.
func TestChildListValidatesWithAnyDecoder(t *testing.T) {
	var r CompositeSyncResponse
	err := json.Unmarshal([]byte(`{"children":[{"apiVersion":"v1","kind":"Pod","metadata":{"name":"a"}},null]}`), &r)
	var oe *ObjectError
	if !errors.As(err, &oe) || oe.Index != 1 {
		t.Fatalf("encoding/json: got %v, want *ObjectError at index 1", err)
	}
}

func TestDecodeDecoratorSyncResponse(t *testing.T) {
	var r DecoratorSyncResponse
	body := `{"labels":{"a":"1","gone":null},"annotations":null,"attachments":[{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"c","namespace":"ns"}}],"resyncAfterSeconds":2}`
	if err := Decode([]byte(body), true, &r); err != nil {
		t.Fatal(err)
	}
	one := "1"
	if want := map[string]*string{"a": &one, "gone": nil}; !reflect.DeepEqual(r.Labels, want) {
		t.Errorf("labels = %v, want a=1 and gone=nil (delete)", r.Labels)
	}
	if r.Status != nil {
		t.Errorf("absent status must stay nil (leave unchanged), got %v", r.Status)
	}
	if len(r.Attachments) != 1 || r.Attachments[0].GetNamespace() != "ns" || r.ResyncAfterSeconds != 2 {
		t.Errorf("got %+v", r)
	}

	err := Decode([]byte(`{"attachments":[{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"c"}},{"kind":"ConfigMap"}]}`), false, &r)
	var oe *ObjectError
	if !errors.As(err, &oe) || oe.List != "attachments" || oe.Index != 1 || !strings.Contains(err.Error(), "attachments[1]") {
		t.Errorf("got %v, want an *ObjectError for attachments[1]", err)
	}
}

// FuzzDecode checks that no body, however hostile, makes decoding panic, and that every
// accepted child is addressable.
func FuzzDecode(f *testing.F) {
	for _, s := range []string{
		`{"children":[{"apiVersion":"v1","kind":"Pod","metadata":{"name":"a"}}]}`,
		`{"children":[null,1,"x",[],{}]}`,
		`{"children":{"a":1}}`, `null`, `[]`, `{"status":null,"children":null}`,
		`{"attachments":[{"apiVersion":"v1","kind":"Pod","metadata":{"name":"a","labels":{"x":null}}}]}`,
		`{"outputs":[{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"a"}},null]}`,
	} {
		f.Add([]byte(s), false)
	}
	f.Fuzz(func(t *testing.T, body []byte, strict bool) {
		var c CompositeSyncResponse
		if Decode(body, strict, &c) == nil {
			for i, o := range c.Children {
				if o == nil || o.GetName() == "" || o.GetKind() == "" || o.GetAPIVersion() == "" {
					t.Fatalf("accepted unaddressable child %d: %v", i, o)
				}
			}
		}
		var d DecoratorSyncResponse
		_ = Decode(body, strict, &d)
		var cu CustomizeResponse
		_ = Decode(body, strict, &cu)
		var m MapResponse
		if Decode(body, strict, &m) == nil {
			for i, o := range m.Outputs {
				if o == nil || o.GetName() == "" || o.GetKind() == "" || o.GetAPIVersion() == "" {
					t.Fatalf("accepted unaddressable output %d: %v", i, o)
				}
			}
		}
		var ts TombstoneResponse
		_ = Decode(body, strict, &ts)
	})
}
