package ujson

import (
	"encoding/json"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// TestMarshalMatchesEncodingJSON pins the bytes: for every value, Marshal
// and Append give exactly json.Marshal's output, or its error.
func TestMarshalMatchesEncodingJSON(t *testing.T) {
	cyclic := map[string]any{"a": "b"}
	cyclic["self"] = cyclic
	deep := any("leaf")
	for range 2*maxDepth + 3 {
		deep = map[string]any{"d": []any{deep}}
	}
	cases := []struct {
		reason string
		v      any
	}{
		{"nil", nil},
		{"nil map", map[string]any(nil)},
		{"nil slice", []any(nil)},
		{"empty map", map[string]any{}},
		{"empty slice", []any{}},
		{"keys sorted by bytes", map[string]any{"b": 1.0, "a": 2.0, "B": 3.0, "é": 4.0, "": 5.0, "a\x00": 6.0}},
		{"integers", map[string]any{"i64": int64(-9007199254740993), "int": 42, "i32": int32(-7), "max": int64(math.MaxInt64)}},
		{"floats in both forms", []any{0.0, math.Copysign(0, -1), 1.0, -1.5, 1e-6, 9.99e-7, 1e-7, 1.5e-10, 1e20, 1e21, 1.234e21, 1e100, -1e-300, math.MaxFloat64, math.SmallestNonzeroFloat64, 123456789.125, 0.1}},
		{"bools", []any{true, false}},
		{"HTML and control characters", "<a href=\"x&y\">\\</a>\b\f\n\r\t\x00\x01\x1f\x7f"},
		{"invalid UTF-8", "ok\xffbad\xc3(\xed\xa0\x80end"},
		{"line and paragraph separators", "a\u2028b\u2029c\u2027"},
		{"multi-byte runes", "héllo, 世界 🚀"},
		{"escaped map keys", map[string]any{"<k>": "&", "q\"uote": "\\", "\u2028": "\xff"}},
		{"a Kubernetes object", map[string]any{"apiVersion": "v1", "kind": "ConfigMap",
			"metadata": map[string]any{"name": "p-1", "namespace": "default", "labels": map[string]any{"app": "x"},
				"annotations":     map[string]any{"metacontroller.k8s.io/last-applied-configuration": `{"apiVersion":"v1","data":{"gen":"2"}}`},
				"ownerReferences": []any{map[string]any{"apiVersion": "bench/v1", "controller": true, "uid": "0d4c"}}},
			"data": map[string]any{"gen": "2", "script": "#!/bin/sh\necho \"<hi>\" && exit 0\n"}}},
		{"types left to json.Marshal", map[string]any{"t": time.Date(2026, 11, 29, 2, 0, 0, 5, time.UTC), "raw": json.RawMessage(` { "z" : 1, "a":"<"} `),
			"strs": []string{"x", "<"}, "m": map[string]string{"b": "1", "a": "2"}, "f32": float32(0.1), "u": uint8(7), "num": json.Number("12.50")}},
		{"deep nesting", deep},
		{"NaN", map[string]any{"a": []any{1.0, math.NaN()}}},
		{"infinity", map[string]any{"a": math.Inf(-1)}},
		{"unsupported type", map[string]any{"c": make(chan int)}},
		{"cycle", cyclic},
		{"invalid raw message", []any{json.RawMessage(`{`)}},
	}
	for _, c := range cases {
		t.Run(c.reason, func(t *testing.T) {
			check(t, c.v)
		})
	}
}

func check(t *testing.T, v any) {
	t.Helper()
	want, wantErr := json.Marshal(v)
	got, err := Marshal(v)
	if (err == nil) != (wantErr == nil) || (err != nil && err.Error() != wantErr.Error()) {
		t.Fatalf("Marshal error = %v, json.Marshal's = %v", err, wantErr)
	}
	if diff := cmp.Diff(string(want), string(got)); diff != "" {
		t.Errorf("Marshal differs from json.Marshal (-want +got):\n%s", diff)
	}
	prefix := []byte("prefix:")
	app, err := Append(prefix, v)
	if (err == nil) != (wantErr == nil) {
		t.Fatalf("Append error = %v, json.Marshal's = %v", err, wantErr)
	}
	wantApp := "prefix:" + string(want)
	if wantErr != nil {
		wantApp = "prefix:"
	}
	if diff := cmp.Diff(wantApp, string(app)); diff != "" {
		t.Errorf("Append differs from json.Marshal (-want +got):\n%s", diff)
	}
}

// TestMarshalRandomValues compares random trees of every type JSON
// decoding produces, with strings drawn from bytes that need escaping.
func TestMarshalRandomValues(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for i := range 2000 {
		v := randomValue(r, 0)
		want, _ := json.Marshal(v)
		got, err := Marshal(v)
		if err != nil {
			t.Fatalf("case %d: %v", i, err)
		}
		if string(got) != string(want) {
			t.Fatalf("case %d differs from json.Marshal:\nwant %s\ngot  %s", i, want, got)
		}
	}
}

func randomValue(r *rand.Rand, depth int) any {
	n := r.IntN(8)
	if depth > 4 {
		n = r.IntN(5)
	}
	switch n {
	case 0:
		return nil
	case 1:
		return r.IntN(2) == 0
	case 2:
		return randomString(r)
	case 3:
		return int64(r.Uint64())
	case 4:
		return math.Float64frombits(r.Uint64()&^(0x7ff<<52) | uint64(r.IntN(0x7ff))<<52) // never NaN or infinite
	case 5, 6:
		m := map[string]any{}
		for range r.IntN(6) {
			m[randomString(r)] = randomValue(r, depth+1)
		}
		return m
	default:
		s := make([]any, r.IntN(5))
		for j := range s {
			s[j] = randomValue(r, depth+1)
		}
		return s
	}
}

func randomString(r *rand.Rand) string {
	const alphabet = "aZ09 -_./:\"\\<>&\n\t\x00\x1f\x7f"
	var b strings.Builder
	for range r.IntN(12) {
		switch r.IntN(10) {
		case 0:
			b.WriteByte(byte(r.IntN(256))) // often invalid UTF-8
		case 1:
			b.WriteRune([]rune{'é', '世', '🚀', '\u2028', '\u2029', '\ufffd'}[r.IntN(6)])
		default:
			b.WriteByte(alphabet[r.IntN(len(alphabet))])
		}
	}
	return b.String()
}

func FuzzMarshalString(f *testing.F) {
	for _, s := range []string{"", "plain", "<&>", "\xff\xfe", "\u2028", "a\"b\\c\nd"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		check(t, map[string]any{s: []any{s}})
	})
}

func benchObject() map[string]any {
	return map[string]any{"apiVersion": "v1", "kind": "ConfigMap",
		"metadata": map[string]any{"name": "p-1", "namespace": "default", "uid": "1d4c", "resourceVersion": "123", "labels": map[string]any{"controller-uid": "0d4c4b58"},
			"annotations":     map[string]any{"metacontroller.k8s.io/last-applied-configuration": `{"apiVersion":"v1","data":{"gen":"2"},"kind":"ConfigMap","metadata":{"name":"p-1"}}`},
			"ownerReferences": []any{map[string]any{"apiVersion": "bench/v1", "kind": "Bench", "name": "p-1", "uid": "0d4c4b58", "controller": true, "blockOwnerDeletion": true}}},
		"data": map[string]any{"gen": "2"}}
}

func BenchmarkMarshalObject(b *testing.B) {
	obj := benchObject()
	b.Run("json.Marshal", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := json.Marshal(obj); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("ujson.Marshal", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := Marshal(obj); err != nil {
				b.Fatal(err)
			}
		}
	})
}
