package deploy

import (
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestBusEventsOptIn: the bus's events are off in every shipped install,
// and the kustomize component and the Helm value events.enabled turn them
// on with the same applier flags (the flags' defaults, which
// cmd/applier's tests hold to docs/operating.md).
func TestBusEventsOptIn(t *testing.T) {
	want := []string{"--bus-events", "--bus-events-max-age=1h", "--bus-events-max-bytes=268435456", "--bus-events-replicas=3"}
	eventArgs := func(args []string) []string {
		var out []string
		for _, a := range args {
			if len(a) >= len("--bus-events") && a[:len("--bus-events")] == "--bus-events" {
				out = append(out, a)
			}
		}
		return out
	}

	def, err := renderChart(nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := eventArgs(args(def, "Deployment/metabus-applier")); len(got) != 0 {
		t.Errorf("the default chart turns events on: %v", got)
	}
	on, err := renderChart(map[string]any{"events": map[string]any{"enabled": true}})
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(want, eventArgs(args(on, "Deployment/metabus-applier"))); diff != "" {
		t.Errorf("chart with events.enabled (-want +got):\n%s", diff)
	}
	for _, svc := range []string{"watcher", "dispatcher", "revisions"} {
		if got := eventArgs(args(on, "Deployment/metabus-"+svc)); len(got) != 0 {
			t.Errorf("events.enabled gives the %s %v", svc, got)
		}
	}
	if _, err := renderChart(map[string]any{"events": map[string]any{"enabled": true, "maxAge": "an hour"}}); err == nil {
		t.Error("events.maxAge \"an hour\" is accepted")
	}

	for _, base := range []string{kustomizeDefault, kustomizeHardened} {
		abs, err := filepath.Abs(base)
		if err != nil {
			t.Fatal(err)
		}
		component, _ := filepath.Abs(filepath.Join("components", "bus-events"))
		dir := t.TempDir()
		// kustomize takes relative paths only.
		relBase, err1 := filepath.Rel(dir, abs)
		relComp, err2 := filepath.Rel(dir, component)
		if err1 != nil || err2 != nil {
			t.Fatal(err1, err2)
		}
		k := "resources:\n- " + relBase + "\ncomponents:\n- " + relComp + "\n"
		if err := os.WriteFile(filepath.Join(dir, "kustomization.yaml"), []byte(k), 0o644); err != nil {
			t.Fatal(err)
		}
		plain, err := kustomizeBuild(base)
		if err != nil {
			t.Fatal(err)
		}
		with, err := kustomizeBuild(dir)
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range []struct {
			name string
			objs []map[string]any
			want []string
		}{{base, plain, nil}, {base + " with components/bus-events", with, want}} {
			objs, err := byKindName(c.objs)
			if err != nil {
				t.Fatal(err)
			}
			got := eventArgs(args(objs, "Deployment/metabus-applier"))
			if !slices.Equal(got, c.want) {
				t.Errorf("kustomize %s: applier event flags %v, want %v", c.name, got, c.want)
			}
		}
	}
}
