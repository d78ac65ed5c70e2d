package revision

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"

	utiljson "k8s.io/apimachinery/pkg/util/json"
)

// obj decodes JSON the way the API machinery does (integers as int64).
func obj(t testing.TB, s string) map[string]any {
	t.Helper()
	var m map[string]any
	if err := utiljson.Unmarshal([]byte(s), &m); err != nil {
		t.Fatalf("bad test JSON %s: %v", s, err)
	}
	return m
}

func encode(t testing.TB, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatalf("encode: %v", err)
	}
	return string(b)
}

const parentJSON = `{
	"metadata": {"name": "web", "labels": {"app": "web"}},
	"spec": {"replicas": 3, "selector": {"app": "web"},
	         "template": {"metadata": {"labels": {"app": "web"}}, "spec": {"image": "v1"}},
	         "nothing": null, "scalar": "x"},
	"status": {"ready": 2}
}`

func TestParentPatch(t *testing.T) {
	cases := []struct {
		reason  string
		paths   []string
		want    string // JSON; "" means an error is expected
		wantErr string
	}{
		{reason: "no field paths means the whole spec, as upstream", paths: nil,
			want: `{"spec":{"nothing":null,"replicas":3,"scalar":"x","selector":{"app":"web"},"template":{"metadata":{"labels":{"app":"web"}},"spec":{"image":"v1"}}}}`},
		{reason: "a nested path keeps its ancestors as a partial object", paths: []string{"spec.template"},
			want: `{"spec":{"template":{"metadata":{"labels":{"app":"web"}},"spec":{"image":"v1"}}}}`},
		{reason: "several paths, including outside spec, merge into one patch", paths: []string{"spec.template.spec", "metadata.labels", "spec.replicas"},
			want: `{"metadata":{"labels":{"app":"web"}},"spec":{"replicas":3,"template":{"spec":{"image":"v1"}}}}`},
		{reason: "a wider path that overlaps a narrower one wins whatever the order", paths: []string{"spec.template.spec", "spec.template", "spec.template.metadata"},
			want: `{"spec":{"template":{"metadata":{"labels":{"app":"web"}},"spec":{"image":"v1"}}}}`},
		{reason: "missing paths are skipped: absence is part of the revision", paths: []string{"spec.missing", "spec.template.missing.deeper", "nope"},
			want: `{}`},
		{reason: "a null on the way counts as missing", paths: []string{"spec.nothing.deeper"},
			want: `{}`},
		{reason: "a null leaf is recorded as null", paths: []string{"spec.nothing"},
			want: `{"spec":{"nothing":null}}`},
		{reason: "a path through a scalar is a configuration error", paths: []string{"spec.scalar.x"},
			wantErr: "spec.scalar is not an object"},
		{reason: "a path through a number is a configuration error", paths: []string{"spec.replicas.x"},
			wantErr: "spec.replicas is not an object"},
		{reason: "empty segments are rejected", paths: []string{"spec..template"},
			wantErr: `invalid field path "spec..template"`},
		{reason: "an empty path is rejected", paths: []string{""},
			wantErr: `invalid field path ""`},
	}
	for _, tc := range cases {
		t.Run(tc.reason, func(t *testing.T) {
			parent := obj(t, parentJSON)
			got, err := ParentPatch(parent, tc.paths)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want one containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if g := encode(t, got); g != tc.want {
				t.Fatalf("got  %s\nwant %s", g, tc.want)
			}
			// The patch is a copy: editing it must not reach the parent.
			if spec, ok := got["spec"].(map[string]any); ok {
				spec["replicas"] = "changed"
				if tmpl, ok := spec["template"].(map[string]any); ok {
					tmpl["spec"] = "changed"
				}
			}
			if !reflect.DeepEqual(parent, obj(t, parentJSON)) {
				t.Fatalf("ParentPatch shares or modified the parent")
			}
		})
	}
}

func TestApplyPatch(t *testing.T) {
	cases := []struct {
		reason  string
		parent  string
		patch   string
		paths   []string
		want    string
		wantErr string
	}{
		{reason: "the revision's template replaces the current one; replicas apply immediately",
			parent: `{"spec":{"replicas":5,"template":{"spec":{"image":"v2"}}}}`,
			patch:  `{"spec":{"template":{"spec":{"image":"v1"}}}}`, paths: []string{"spec.template"},
			want: `{"spec":{"replicas":5,"template":{"spec":{"image":"v1"}}}}`},
		{reason: "fields added to the template since the revision do not leak into it (replace, not merge)",
			parent: `{"spec":{"template":{"metadata":{"annotations":{"new":"x"}},"spec":{"image":"v2","nodeSelector":{"zone":"a"}}}}}`,
			patch:  `{"spec":{"template":{"spec":{"image":"v1"}}}}`, paths: []string{"spec.template"},
			want: `{"spec":{"template":{"spec":{"image":"v1"}}}}`},
		{reason: "a path the revision lacks is removed from the parent",
			parent: `{"metadata":{"name":"a","labels":{"tier":"x"}},"spec":{"template":{}}}`,
			patch:  `{"spec":{"template":{"a":1}}}`, paths: []string{"spec.template", "metadata.labels"},
			want: `{"metadata":{"name":"a"},"spec":{"template":{"a":1}}}`},
		{reason: "default paths replace the whole spec and leave metadata and status alone",
			parent: `{"metadata":{"name":"a"},"spec":{"replicas":5,"x":1},"status":{"s":1}}`,
			patch:  `{"spec":{"replicas":3}}`, paths: nil,
			want: `{"metadata":{"name":"a"},"spec":{"replicas":3},"status":{"s":1}}`},
		{reason: "missing or null ancestors in the parent are created",
			parent: `{"spec":null}`,
			patch:  `{"spec":{"template":{"a":1}}}`, paths: []string{"spec.template"},
			want: `{"spec":{"template":{"a":1}}}`},
		{reason: "removing under a missing ancestor is a no-op",
			parent: `{"metadata":{}}`,
			patch:  `{}`, paths: []string{"spec.template"},
			want: `{"metadata":{}}`},
		{reason: "a patch whose path runs through a scalar is an error",
			parent: `{"spec":{}}`, patch: `{"spec":"x"}`, paths: []string{"spec.template"},
			wantErr: "patch: spec is not an object"},
		{reason: "a parent whose path runs through a scalar is an error",
			parent: `{"spec":"x"}`, patch: `{"spec":{"template":{}}}`, paths: []string{"spec.template"},
			wantErr: "parent: spec is not an object"},
		{reason: "a parent whose path runs through a scalar is an error even when removing",
			parent: `{"spec":"x"}`, patch: `{}`, paths: []string{"spec.template"},
			wantErr: "parent: spec is not an object"},
		{reason: "invalid paths are rejected", parent: `{}`, patch: `{}`, paths: []string{"spec."},
			wantErr: "invalid field path"},
	}
	for _, tc := range cases {
		t.Run(tc.reason, func(t *testing.T) {
			parent, patch := obj(t, tc.parent), obj(t, tc.patch)
			got, err := ApplyPatch(parent, patch, tc.paths)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want one containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if g, w := encode(t, got), encode(t, obj(t, tc.want)); g != w {
				t.Fatalf("got  %s\nwant %s", g, w)
			}
			if encode(t, parent) != encode(t, obj(t, tc.parent)) || encode(t, patch) != encode(t, obj(t, tc.patch)) {
				t.Fatalf("ApplyPatch modified its inputs")
			}
			// The result shares nothing with the patch.
			clear(got)
			if encode(t, patch) != encode(t, obj(t, tc.patch)) {
				t.Fatalf("the result shares maps with the patch")
			}
		})
	}
}

// TestPatchRoundTrip: rendering a parent as of a revision and taking its patch again gives the
// revision's patch back, and applying a parent's own patch changes nothing.
func TestPatchRoundTrip(t *testing.T) {
	older := obj(t, `{"metadata":{"name":"web","labels":{"v":"1"}},"spec":{"replicas":3,"template":{"spec":{"image":"v1"}}}}`)
	newer := obj(t, `{"metadata":{"name":"web"},"spec":{"replicas":5,"paused":true,"template":{"metadata":{"labels":{"a":"b"}},"spec":{"image":"v2","args":["x"]}}},"status":{"x":1}}`)
	for _, tc := range []struct {
		reason string
		paths  []string
	}{
		{"default paths", nil},
		{"the template only", []string{"spec.template"}},
		{"overlapping and partly missing paths", []string{"spec.template.spec", "spec.template", "metadata.labels", "spec.absent"}},
	} {
		t.Run(tc.reason, func(t *testing.T) {
			patch, err := ParentPatch(older, tc.paths)
			if err != nil {
				t.Fatal(err)
			}
			asOf, err := ApplyPatch(newer, patch, tc.paths)
			if err != nil {
				t.Fatal(err)
			}
			again, err := ParentPatch(asOf, tc.paths)
			if err != nil {
				t.Fatal(err)
			}
			if encode(t, again) != encode(t, patch) {
				t.Fatalf("patch of the rendered parent = %s, want %s", encode(t, again), encode(t, patch))
			}
			own, _ := ParentPatch(newer, tc.paths)
			same, err := ApplyPatch(newer, own, tc.paths)
			if err != nil || encode(t, same) != encode(t, newer) {
				t.Fatalf("applying a parent's own patch changed it: %s (%v)", encode(t, same), err)
			}
		})
	}
}
