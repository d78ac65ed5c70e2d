// Package helloworld is the HelloWorld controller of Metacontroller's
// "Create a Controller" tutorial, with its sync hook written in Go with
// metabus's hook SDK (sdk/hook): each HelloWorld parent gets one Pod that
// prints a greeting. It is served by `make run` and exercised by the e2e
// suite, and its manifests live next to it, unchanged from the tutorial
// apart from the hook URL. examples/helloworld-nats serves the same Sync
// over NATS.
package helloworld

import (
	"context"
	"embed"
	"fmt"
	"net/http"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/metabus/metabus/sdk/hook"
)

// Manifests holds crd.yaml, controller.yaml and hello.yaml from the tutorial.
//
//go:embed manifests/*.yaml
var Manifests embed.FS

// Sync computes the desired state: status counts the observed Pods, and the
// single desired Pod echoes the greeting.
func Sync(_ context.Context, req *hook.CompositeRequest) (*hook.CompositeResponse, error) {
	if req.Parent == nil {
		return nil, hook.Errorf(400, "the request has no parent")
	}
	who, _, _ := unstructured.NestedString(req.Parent.Object, "spec", "who")
	if who == "" {
		who = "World"
	}
	pod := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "v1",
		"kind":       "Pod",
		"metadata":   map[string]any{"name": req.Parent.GetName()},
		"spec": map[string]any{
			"restartPolicy": "OnFailure",
			"containers": []any{map[string]any{
				"name":    "hello",
				"image":   "busybox",
				"command": []any{"echo", fmt.Sprintf("Hello, %s!", who)},
			}},
		},
	}}
	return &hook.CompositeResponse{
		Status:   map[string]any{"pods": len(req.Children.Of("v1", "Pod"))},
		Children: []*unstructured.Unstructured{pod},
	}, nil
}

// Handler serves the sync hook over HTTP: a plain JSON body, as the
// tutorial's Python server takes, or a CloudEvent, as metabus sends.
func Handler() http.Handler {
	return hook.HTTPHandler(hook.Composite(Sync))
}
