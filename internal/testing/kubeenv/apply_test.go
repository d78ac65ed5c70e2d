package kubeenv

import (
	"os"
	"path/filepath"
	"testing"
)

func TestReadManifests(t *testing.T) {
	dir := t.TempDir()
	files := map[string]string{
		// Leading and trailing separators and an empty document are skipped.
		"a.yaml": "---\napiVersion: v1\nkind: ConfigMap\nmetadata: {name: one}\ndata: {k: v}\n---\n---\n" +
			"apiVersion: v1\nkind: List\nitems:\n- {apiVersion: v1, kind: Namespace, metadata: {name: two}}\n" +
			"- {apiVersion: v1, kind: Namespace, metadata: {name: three}}\n---\n",
		"b.json":    `{"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "four"}, "spec": {"size": 3}}`,
		"notes.txt": "not a manifest",
	}
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	objs, err := readManifests(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, o := range objs {
		names = append(names, o.obj.GetKind()+"/"+o.obj.GetName())
	}
	want := []string{"ConfigMap/one", "Namespace/two", "Namespace/three", "Widget/four"}
	if len(names) != len(want) {
		t.Fatalf("got %v, want %v", names, want)
	}
	for i := range want {
		if names[i] != want[i] {
			t.Fatalf("got %v, want %v", names, want)
		}
	}
	// Integers must stay integers; the apiserver rejects 3.0 for int fields.
	if size, ok := objs[3].obj.Object["spec"].(map[string]any)["size"].(int64); !ok || size != 3 {
		t.Errorf("spec.size = %#v, want int64 3", objs[3].obj.Object["spec"])
	}

	bad := filepath.Join(dir, "bad.yaml")
	if err := os.WriteFile(bad, []byte("kind: [unclosed\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := readManifests(bad); err == nil {
		t.Error("no error for invalid YAML")
	}
	if _, err := readManifests(filepath.Join(dir, "missing.yaml")); err == nil {
		t.Error("no error for a missing file")
	}
}
