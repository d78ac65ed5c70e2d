package main

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestTableRowsByScenario: a row belongs to the scenario its key names up
// to the first dot, so B10's rows are not B1's (a two-character prefix
// took "b10" for "B1").
func TestTableRowsByScenario(t *testing.T) {
	prefixes := func(scenarios ...string) []string {
		cfg := &config{parents: 10, b8Controllers: 1, scenarios: map[string]bool{}}
		for _, s := range scenarios {
			cfg.scenarios[s] = true
		}
		seen := map[string]bool{}
		var out []string
		for _, r := range tableRows(cfg) {
			p, _, _ := strings.Cut(r.key, ".")
			if !seen[p] {
				seen[p] = true
				out = append(out, p)
			}
		}
		return out
	}
	for _, tc := range []struct {
		reason    string
		scenarios []string
		want      []string
	}{
		{"B1 alone: its rows and the idle row, none of B10's or B11's", []string{"B1"}, []string{"b1", "idle"}},
		{"B10 alone: its rows and the idle row, none of B1's", []string{"B10"}, []string{"idle", "b10"}},
		{"B11 alone", []string{"B11"}, []string{"idle", "b11"}},
		{"B7 and B9", []string{"B7", "B9"}, []string{"idle", "b7", "b9"}},
	} {
		t.Run(tc.reason, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, prefixes(tc.scenarios...)); diff != "" {
				t.Errorf("row scenarios (-want +got):\n%s", diff)
			}
		})
	}
}

// TestRollHook: the B11 hook returns spec.replicas Pods from the template
// and counts the Ready Pods it observed.
func TestRollHook(t *testing.T) {
	h := &rollHook{}
	srv := httptest.NewServer(h)
	defer srv.Close()
	req := map[string]any{
		"parent": map[string]any{
			"metadata": map[string]any{"name": "r"},
			"spec": map[string]any{"replicas": 2, "template": map[string]any{
				"metadata": map[string]any{"labels": map[string]any{"app": "r"}},
				"spec":     map[string]any{"containers": []any{map[string]any{"name": "app", "image": "v2"}}},
			}},
		},
		"children": map[string]any{"Pod.v1": map[string]any{
			"r-0": map[string]any{"status": map[string]any{"conditions": []any{map[string]any{"type": "Ready", "status": "True"}}}},
			"r-1": map[string]any{"status": map[string]any{"conditions": []any{map[string]any{"type": "Ready", "status": "False"}}}},
		}},
	}
	body, err := json.Marshal(req)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.Post(srv.URL, "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var got map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&got); err != nil {
		t.Fatal(err)
	}
	pod := func(name string) any {
		return map[string]any{"apiVersion": "v1", "kind": "Pod",
			"metadata": map[string]any{"name": name, "labels": map[string]any{"app": "r"}},
			"spec":     map[string]any{"containers": []any{map[string]any{"name": "app", "image": "v2"}}}}
	}
	want := map[string]any{
		"status":   map[string]any{"replicas": float64(2), "readyReplicas": float64(1)},
		"children": []any{pod("r-0"), pod("r-1")},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("answer (-want +got):\n%s", diff)
	}
	if n := h.calls.Load(); n != 1 {
		t.Errorf("calls = %d, want 1", n)
	}
}
