package mapctl

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

func TestSelectInputs(t *testing.T) {
	parent := func(namespace string, mods ...func(*unstructured.Unstructured)) *unstructured.Unstructured {
		return object("ctl.example.com/v1", "SnapshotSchedule", namespace, "p", "p-uid", mods...)
	}
	selector := func(sel any) func(*unstructured.Unstructured) { return withField(sel, "spec", "selector") }
	app := map[string]string{"app": "db"}

	// The objects every case is asked about, by name.
	candidates := []*unstructured.Unstructured{
		object("v1", "PersistentVolumeClaim", "ns", "db-ns", "1", withLabels(app)),
		object("v1", "PersistentVolumeClaim", "ns", "web-ns", "2", withLabels(map[string]string{"app": "web"})),
		object("v1", "PersistentVolumeClaim", "ns", "bare-ns", "3"),
		object("v1", "PersistentVolumeClaim", "other", "db-other", "4", withLabels(app)),
		object("v1", "PersistentVolume", "", "db-cluster", "5", withLabels(app)),
		object("v1", "ConfigMap", "ns", "own-output", "6", withLabels(app), controlledBy("p-uid")),
		object("v1", "ConfigMap", "ns", "others-output", "7", withLabels(app), controlledBy("q-uid")),
		nil,
	}

	cases := []struct {
		reason        string
		parent        *unstructured.Unstructured
		want          []string // names of the selected candidates
		wantNamespace string
		wantSelector  string
		wantErr       string
	}{
		{
			reason: "namespaced parent, no selector: everything in its namespace but its own outputs",
			parent: parent("ns"), wantNamespace: "ns",
			want: []string{"ns/db-ns", "ns/web-ns", "ns/bare-ns", "ns/others-output"},
		},
		{
			reason: "null selector is no selector",
			parent: parent("ns", selector(nil)), wantNamespace: "ns",
			want: []string{"ns/db-ns", "ns/web-ns", "ns/bare-ns", "ns/others-output"},
		},
		{
			reason: "empty selector selects everything (it claims nothing, so that is safe)",
			parent: parent("ns", selector(map[string]any{})), wantNamespace: "ns",
			want: []string{"ns/db-ns", "ns/web-ns", "ns/bare-ns", "ns/others-output"},
		},
		{
			reason: "matchLabels",
			parent: parent("ns", selector(map[string]any{"matchLabels": map[string]any{"app": "db"}})), wantNamespace: "ns",
			wantSelector: "app=db", want: []string{"ns/db-ns", "ns/others-output"},
		},
		{
			reason: "matchExpressions",
			parent: parent("ns", selector(map[string]any{"matchExpressions": []any{
				map[string]any{"key": "app", "operator": "In", "values": []any{"web", "cache"}}}})),
			wantNamespace: "ns", wantSelector: "app in (cache,web)", want: []string{"ns/web-ns"},
		},
		{
			reason:       "cluster-scoped parent: cluster-scoped inputs and every namespace",
			parent:       parent("", selector(map[string]any{"matchLabels": map[string]any{"app": "db"}})),
			wantSelector: "app=db", want: []string{"ns/db-ns", "other/db-other", "db-cluster", "ns/others-output"},
		},
		{
			reason: "an unknown operator is an error, not a silent everything",
			parent: parent("ns", selector(map[string]any{"matchExpressions": []any{
				map[string]any{"key": "app", "operator": "Near"}}})),
			wantErr: "spec.selector of ns/p",
		},
		{reason: "a selector that is not an object", parent: parent("ns", selector("app=db")), wantErr: "spec.selector of ns/p is not a label selector"},
		{reason: "a spec that is not an object", parent: parent("ns", withField("x", "spec")), wantErr: "spec.selector of ns/p"},
		{reason: "no parent", wantErr: "no parent"},
	}
	for _, c := range cases {
		t.Run(c.reason, func(t *testing.T) {
			s, err := SelectInputs(c.parent)
			if c.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), c.wantErr) {
					t.Fatalf("error %v, want one containing %q", err, c.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(c.want, names(s.Filter(candidates))); diff != "" {
				t.Errorf("selected (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(c.wantNamespace, s.Namespace()); diff != "" {
				t.Errorf("namespace (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(c.wantSelector, s.Selector().String()); diff != "" {
				t.Errorf("selector (-want +got):\n%s", diff)
			}
		})
	}
}

// TestSelectsWithoutParentUID: a parent without a UID (not yet created)
// controls nothing, so no input is taken for its output.
func TestSelectsWithoutParentUID(t *testing.T) {
	cases := []struct {
		reason string
		input  *unstructured.Unstructured
		want   bool
	}{
		{reason: "an input with no controller", input: object("v1", "ConfigMap", "ns", "a", "1"), want: true},
		{reason: "an input with a controller", input: object("v1", "ConfigMap", "ns", "b", "2", controlledBy("q-uid")), want: true},
	}
	s, err := SelectInputs(object("ctl.example.com/v1", "SnapshotSchedule", "ns", "p", ""))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range cases {
		t.Run(c.reason, func(t *testing.T) {
			if diff := cmp.Diff(c.want, s.Selects(c.input)); diff != "" {
				t.Errorf("selects (-want +got):\n%s", diff)
			}
		})
	}
}
