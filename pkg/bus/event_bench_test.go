package bus

import (
	"encoding/json"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// benchDesired is a B1 desired state: one ConfigMap child, a status.
func benchDesired() *DesiredState {
	child := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "v1", "kind": "ConfigMap",
		"metadata": map[string]any{"name": "p-1", "namespace": "default", "labels": map[string]any{"controller-uid": "0d4c4b58-1d4c-4b58-9d4c-4b581d4c4b58"}},
		"data":     map[string]any{"gen": "2"}}}
	return &DesiredState{
		Controller: ControllerRef{Kind: "CompositeController", Name: "bench", UID: "c-uid"},
		Parent:     ObjectRef{APIVersion: "bench.metabus.dev/v1", Kind: "Bench", Resource: "benches", Namespace: "default", Name: "p-1", UID: "0d4c4b58-1d4c-4b58-9d4c-4b581d4c4b58", ResourceVersion: "12345", Generation: 1},
		WorkSeq:    77, Hook: HookSync, Children: []*unstructured.Unstructured{child},
		Status:              map[string]any{"childCount": 1.0, "gen": "2"},
		Observed:            []ObjectRef{{APIVersion: "v1", Kind: "ConfigMap", Resource: "configmaps", Namespace: "default", Name: "p-1", UID: "1d4c", ResourceVersion: "12346"}},
		MinResourceVersions: map[string]string{"bench.metabus.dev/benches": "12345", "/configmaps": "12346"},
		ProducedAt:          time.Date(2026, 11, 29, 2, 0, 0, 123456789, time.UTC),
	}
}

func BenchmarkDesiredEvent(b *testing.B) {
	ds := benchDesired()
	b.Run("encode", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := NewEvent("mc.desired.x", TypeDesired, "id", ds.Controller, ds.Parent, ds, nil); err != nil {
				b.Fatal(err)
			}
		}
	})
	ev, err := NewEvent("mc.desired.x", TypeDesired, "id", ds.Controller, ds.Parent, ds, nil)
	if err != nil {
		b.Fatal(err)
	}
	b.Run("decode", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			var got DesiredState
			if err := DecodeEvent(ev.Subject, ev.Header, ev.Data, TypeDesired, &got); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("decode/json.Unmarshal", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			var got DesiredState
			if err := json.Unmarshal(ev.Data, &got); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("json.Marshal", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := json.Marshal(ds); err != nil {
				b.Fatal(err)
			}
		}
	})
}

func BenchmarkWorkItemEvent(b *testing.B) {
	ds := benchDesired()
	it := &WorkItem{Controller: ds.Controller, Parent: ds.Parent, Reason: ReasonEvent, MinResourceVersions: ds.MinResourceVersions, EnqueuedAt: ds.ProducedAt}
	ev, err := NewEvent("mc.work.x", TypeSyncRequested, "id", it.Controller, it.Parent, it, map[string]string{ExtReason: it.Reason})
	if err != nil {
		b.Fatal(err)
	}
	b.Run("decode", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			var got WorkItem
			if err := DecodeEvent(ev.Subject, ev.Header, ev.Data, TypeSyncRequested, &got); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("decode/json.Unmarshal", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			var got WorkItem
			if err := json.Unmarshal(ev.Data, &got); err != nil {
				b.Fatal(err)
			}
		}
	})
}
