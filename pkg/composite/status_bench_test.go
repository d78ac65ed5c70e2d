package composite

import (
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/metabus/metabus/pkg/bus"
)

// BenchmarkApplyStatus: the steady state of a resync, a hook status the
// parent already has.
func BenchmarkApplyStatus(b *testing.B) {
	parent := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "bench/v1", "kind": "Bench",
		"metadata": map[string]any{"name": "p-1", "namespace": "default", "uid": "0d4c4b58", "generation": int64(3)},
		"status":   map[string]any{"childCount": int64(1), "observedGen": int64(2), "observedGeneration": int64(3), "phase": "Ready"}}}
	ds := &bus.DesiredState{Parent: bus.ObjectRef{Generation: 3},
		Status: map[string]any{"childCount": 1.0, "observedGen": 2.0, "phase": "Ready"}}
	b.ReportAllocs()
	for b.Loop() {
		if st, err := applyStatus(parent, ds); err != nil || st != nil {
			b.Fatal(st, err)
		}
	}
}
