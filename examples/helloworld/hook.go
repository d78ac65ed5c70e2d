// Package helloworld is the HelloWorld controller of Metacontroller's
// "Create a Controller" tutorial, with its sync hook written in Go: each
// HelloWorld parent gets one Pod that prints a greeting. It is served by
// `make run` and exercised by the e2e suite, and its manifests live next to
// it, unchanged from the tutorial apart from the hook URL.
package helloworld

import (
	"embed"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
)

// Manifests holds crd.yaml, controller.yaml and hello.yaml from the tutorial.
//
//go:embed manifests/*.yaml
var Manifests embed.FS

// SyncRequest is the part of the sync request this hook reads.
type SyncRequest struct {
	Parent struct {
		Metadata struct {
			Name string `json:"name"`
		} `json:"metadata"`
		Spec struct {
			Who string `json:"who"`
		} `json:"spec"`
	} `json:"parent"`
	Children map[string]map[string]json.RawMessage `json:"children"`
}

// Sync computes the desired state: status counts the observed Pods, and the
// single desired Pod echoes the greeting.
func Sync(req SyncRequest) map[string]any {
	who := req.Parent.Spec.Who
	if who == "" {
		who = "World"
	}
	return map[string]any{
		"status": map[string]any{"pods": len(req.Children["Pod.v1"])},
		"children": []any{map[string]any{
			"apiVersion": "v1",
			"kind":       "Pod",
			"metadata":   map[string]any{"name": req.Parent.Metadata.Name},
			"spec": map[string]any{
				"restartPolicy": "OnFailure",
				"containers": []any{map[string]any{
					"name":    "hello",
					"image":   "busybox",
					"command": []any{"echo", fmt.Sprintf("Hello, %s!", who)},
				}},
			},
		}},
	}
}

// Handler serves the sync hook as a plain JSON webhook, exactly like the
// tutorial's Python server: it does not know about CloudEvents.
func Handler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(io.LimitReader(r.Body, 16<<20))
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		var req SyncRequest
		if err := json.Unmarshal(body, &req); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(Sync(req))
	})
}
