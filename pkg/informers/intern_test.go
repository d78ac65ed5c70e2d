package informers

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// freshDecode returns a freshly decoded copy of doc: every key and value its
// own allocation, as the watch decoder makes them.
func freshDecode(t *testing.T, doc string) *unstructured.Unstructured {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal([]byte(doc), &m); err != nil {
		t.Fatal(err)
	}
	return &unstructured.Unstructured{Object: m}
}

// keyOf returns the stored copy of key in m (not the caller's).
func keyOf(m map[string]any, key string) (string, bool) {
	for k := range m {
		if k == key {
			return k, true
		}
	}
	return "", false
}

// internDoc is a ConfigMap with a name/uid (%[1]s) and a data key (%[2]s).
const internDoc = `{"apiVersion":"v1","kind":"ConfigMap",
 "metadata":{"name":"%[1]s","namespace":"ns1","uid":"%[1]s","managedFields":[{"manager":"x"}],
  "labels":{"app":"a"},"ownerReferences":[{"apiVersion":"bench.example.com/v1","kind":"Bench","name":"p","uid":"u","controller":true}]},
 "data":{"gen":"12","%[2]s":"v"}}`

func cm(t *testing.T, name, dataKey string) *unstructured.Unstructured {
	return freshDecode(t, fmt.Sprintf(internDoc, name, dataKey))
}

func TestInternerTransform(t *testing.T) {
	long := strings.Repeat("k", internMaxLen+1)
	in := newInterner()
	a, b := cm(t, "a", long), cm(t, "b", long)
	wantA := a.DeepCopy()
	unstructured.RemoveNestedField(wantA.Object, "metadata", "managedFields")
	for _, u := range []*unstructured.Unstructured{a, b} {
		if _, err := in.transform(u); err != nil {
			t.Fatal(err)
		}
	}
	if diff := cmp.Diff(wantA.Object, a.Object); diff != "" {
		t.Fatalf("the transform changed the object beyond managedFields (-want +got):\n%s", diff)
	}

	meta := func(u *unstructured.Unstructured) map[string]any { return u.Object["metadata"].(map[string]any) }
	owner := func(u *unstructured.Unstructured) map[string]any {
		return meta(u)["ownerReferences"].([]any)[0].(map[string]any)
	}
	data := func(u *unstructured.Unstructured) map[string]any { return u.Object["data"].(map[string]any) }
	cases := []struct {
		reason string
		ma, mb map[string]any
		key    string
		shared bool
	}{
		{"a top-level key is one copy", a.Object, b.Object, "metadata", true},
		{"a nested key is one copy", meta(a), meta(b), "namespace", true},
		{"a key inside a list's objects is one copy", owner(a), owner(b), "controller", true},
		{"a user's data key is one copy", data(a), data(b), "gen", true},
		{"a key over the length limit is left alone", data(a), data(b), long, false},
	}
	for _, c := range cases {
		t.Run(c.reason, func(t *testing.T) {
			ka, oka := keyOf(c.ma, c.key)
			kb, okb := keyOf(c.mb, c.key)
			if !oka || !okb {
				t.Fatalf("key %q missing", c.key)
			}
			if got := same(ka, kb); got != c.shared {
				t.Errorf("shared = %v, want %v", got, c.shared)
			}
		})
	}

	values := []struct {
		reason string
		va, vb any
		shared bool
	}{
		{"kind is one copy", a.Object["kind"], b.Object["kind"], true},
		{"an owner's apiVersion is one copy", owner(a)["apiVersion"], owner(b)["apiVersion"], true},
		{"the namespace is one copy", meta(a)["namespace"], meta(b)["namespace"], true},
		{"other values are left alone", data(a)["gen"], data(b)["gen"], false},
	}
	for _, c := range values {
		t.Run(c.reason, func(t *testing.T) {
			if got := same(c.va.(string), c.vb.(string)); got != c.shared {
				t.Errorf("shared = %v, want %v", got, c.shared)
			}
		})
	}
}

// TestInternerBounded: a table that is full adds nothing more but still
// serves what it has, and the objects stay intact.
func TestInternerBounded(t *testing.T) {
	in := newInterner()
	in.str("metadata")
	for i := 0; len(in.m) < internMaxEntries; i++ {
		in.str(strings.Repeat("x", i%50) + string(rune('a'+i%26)) + strings.Repeat("y", i/1300))
	}
	u := freshDecode(t, `{"kind":"K","metadata":{"name":"n"},"brandnewkey":1}`)
	want := u.DeepCopy()
	if _, err := in.transform(u); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(want.Object, u.Object); diff != "" {
		t.Errorf("object changed (-want +got):\n%s", diff)
	}
	if len(in.m) != internMaxEntries {
		t.Errorf("table grew past its limit: %d entries", len(in.m))
	}
	k, _ := keyOf(u.Object, "metadata")
	if !same(k, in.m["metadata"]) {
		t.Error("a full table no longer served a key it holds")
	}
	if _, ok := in.m["brandnewkey"]; ok {
		t.Error("a full table took a new key")
	}
}

// TestInternerKeys: a one-pass watch decoding through the interner gives
// two events' objects the same copy of a key (one the decoder has no
// constant for), and the transform's own lookups then find that copy; a
// key longer than internMaxLen is the decoder's own.
func TestInternerKeys(t *testing.T) {
	long := strings.Repeat("k", internMaxLen+1)
	in := newInterner()
	event := func(name string) string {
		return `{"type":"ADDED","object":` + fmt.Sprintf(internDoc, name, long) + "}\n"
	}
	d := newEventDecoder(io.NopCloser(strings.NewReader(event("a") + event("b"))))
	d.keys = in.key
	got := drain(d)
	if len(got) != 3 || got[2].ErrVal != io.EOF {
		t.Fatalf("decoded %+v, want two events and io.EOF", got)
	}
	a, b := got[0].Object["data"].(map[string]any), got[1].Object["data"].(map[string]any)
	ka, _ := keyOf(a, "gen")
	kb, _ := keyOf(b, "gen")
	if !same(ka, kb) {
		t.Errorf("the two objects hold their own copies of the key gen")
	}
	if c := in.str("gen"); !same(c, ka) {
		t.Errorf("the interner's copy of gen is not the one the decoder handed out")
	}
	la, _ := keyOf(a, long)
	lb, _ := keyOf(b, long)
	if same(la, lb) {
		t.Errorf("a key longer than %d was interned", internMaxLen)
	}
	if d.fast != 2 {
		t.Errorf("the one-pass path decoded %d of the 2 events", d.fast)
	}
}
