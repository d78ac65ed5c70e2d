package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cloudevents/sdk-go/v2/binding"
	"github.com/cloudevents/sdk-go/v2/event"
	cehttp "github.com/cloudevents/sdk-go/v2/protocol/http"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/metabus/metabus/internal/allinone"
)

// TestStructuredWebhook (issue 34): a controller whose webhook says
// cloudEvents: structured (accepted by the CRD of a real API server) sends
// its hook structured CloudEvents, which a hook built on the sdk reads, and
// the hook's structured reply converges the children.
func TestStructuredWebhook(t *testing.T) {
	ctx := context.Background()
	inst := startMetabus(t, allinone.Config{}, nil)
	ns := newNamespace(t)
	var structured, other atomic.Int64
	hook := widgetHook(nil)
	url := hookServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Content-Type") != "application/cloudevents+json" {
			other.Add(1)
			http.Error(w, "want a structured CloudEvent", http.StatusBadRequest)
			return
		}
		ev, err := binding.ToEvent(r.Context(), cehttp.NewMessageFromHttpRequest(r))
		if err != nil {
			other.Add(1)
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		var req map[string]any
		if err := json.Unmarshal(ev.Data(), &req); err != nil || ev.Type() != "io.k8s.metacontroller.hook.sync.v1" {
			other.Add(1)
			http.Error(w, fmt.Sprintf("type %q, data: %v", ev.Type(), err), http.StatusBadRequest)
			return
		}
		structured.Add(1)
		_, resp := hook(req)
		out := event.New()
		out.SetID("re-" + ev.ID())
		out.SetType("io.k8s.metacontroller.hook.sync.response.v1")
		out.SetSource("/e2e/structured")
		_ = out.SetData(event.ApplicationJSON, resp)
		_ = cehttp.WriteResponseWriter(binding.WithForceStructured(r.Context()), binding.ToMessage(&out), http.StatusOK, w)
	}))
	createController(t, inst, compositeKind, "structured-"+ns, map[string]any{
		"parentResource": map[string]any{"apiVersion": "test.metabus.dev/v1", "resource": "widgets"},
		"childResources": []any{map[string]any{"apiVersion": "v1", "resource": "configmaps"}},
		"hooks": map[string]any{"sync": map[string]any{"webhook": map[string]any{
			"url": url, "timeout": "5s", "cloudEvents": "structured"}}},
	})
	if _, err := dyn.Resource(widgetsGVR).Namespace(ns).Create(ctx, newWidget("st", []string{"a", "b"}, 1), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 60*time.Second, "children of a structured hook's answer", func() error {
		names, err := configMapNames(ctx, ns, "st")
		if err != nil {
			return err
		}
		if len(names) != 2 {
			return fmt.Errorf("configmaps %v, want st-a and st-b", names)
		}
		return nil
	})
	if structured.Load() == 0 || other.Load() != 0 {
		t.Errorf("%d structured requests, %d others; want only structured ones", structured.Load(), other.Load())
	}
}
