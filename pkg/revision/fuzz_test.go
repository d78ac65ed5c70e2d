package revision

import (
	"strings"
	"testing"

	utiljson "k8s.io/apimachinery/pkg/util/json"
)

// FuzzPatch feeds arbitrary JSON parents and field paths to ParentPatch and ApplyPatch: they
// must never panic, applying a parent's own patch must give the parent back, and rendering
// another parent as of that patch must yield the same patch again.
func FuzzPatch(f *testing.F) {
	f.Add(`{"spec":{"template":{"a":1}}}`, `{"spec":{"replicas":2}}`, "spec.template")
	f.Add(`{"spec":"x"}`, `{"spec":{}}`, "spec.template,spec")
	f.Add(`{"spec":null,"a":{"b":[1,{"c":null}]}}`, `{}`, "a.b,spec.x.y")
	f.Add(`{}`, `{"spec":{"template":[]}}`, "")
	f.Add(`{"a":{"b":{"c":1}}}`, `{"a":{"b":2}}`, "a.b.c,a,,a..b")
	f.Fuzz(func(t *testing.T, parentJSON, otherJSON, paths string) {
		var parent, other map[string]any
		if decode(parentJSON, &parent) != nil || decode(otherJSON, &other) != nil {
			return
		}
		var fieldPaths []string
		if paths != "" {
			fieldPaths = strings.Split(paths, ",")
		}
		before := encode(t, parent) + encode(t, other)
		patch, err := ParentPatch(parent, fieldPaths)
		_, _ = ApplyPatch(parent, other, fieldPaths) // arbitrary patches: must not panic
		_, _ = ApplyPatch(other, parent, fieldPaths)
		if after := encode(t, parent) + encode(t, other); after != before {
			t.Fatalf("inputs were modified")
		}
		if err != nil {
			return
		}
		same, err := ApplyPatch(parent, patch, fieldPaths)
		if err != nil {
			t.Fatalf("applying a parent's own patch failed: %v", err)
		}
		if encode(t, same) != encode(t, parent) {
			t.Fatalf("applying a parent's own patch changed it:\n%s\n%s", encode(t, same), encode(t, parent))
		}
		asOf, err := ApplyPatch(other, patch, fieldPaths)
		if err != nil {
			return // other's shape conflicts with the paths
		}
		again, err := ParentPatch(asOf, fieldPaths)
		if err != nil || encode(t, again) != encode(t, patch) {
			t.Fatalf("round trip: %s (%v), want %s", encode(t, again), err, encode(t, patch))
		}
	})
}

func decode(s string, v *map[string]any) error {
	return utiljson.Unmarshal([]byte(s), v)
}
