package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	cloudevents "github.com/cloudevents/sdk-go/v2"
	"github.com/nats-io/nats.go"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	eventsconsumer "github.com/metabus/metabus/examples/events-consumer"
	"github.com/metabus/metabus/internal/allinone"
	"github.com/metabus/metabus/pkg/bus"
	"github.com/metabus/metabus/services/applier"
)

// TestBusEvents (issue 34): with --bus-events, a consumer using the
// CloudEvents JetStream binding (as examples/events-consumer does) observes
// an applied event for the create, the update and the delete of a parent's
// children, each with its work sequence (growing) and the children changed,
// and a desired-state event for each; a Secret child's data is in no event.
func TestBusEvents(t *testing.T) {
	ctx := context.Background()
	inst := startMetabus(t, allinone.Config{Applier: applier.Config{BusEvents: true}}, nil)
	ns := newNamespace(t)
	const secretValue = "s3cr3t-value"
	url := hookServer(t, jsonHook(func(req map[string]any) (int, any) {
		parent := &unstructured.Unstructured{Object: req["parent"].(map[string]any)}
		items, _, _ := unstructured.NestedStringSlice(parent.Object, "spec", "items")
		version, _, _ := unstructured.NestedFieldNoCopy(parent.Object, "spec", "version")
		var children []any
		for _, it := range items {
			children = append(children, map[string]any{"apiVersion": "v1", "kind": "ConfigMap",
				"metadata": map[string]any{"name": parent.GetName() + "-" + it, "labels": map[string]any{"app": parent.GetName()}},
				"data":     map[string]any{"version": fmt.Sprint(version)}})
		}
		children = append(children, map[string]any{"apiVersion": "v1", "kind": "Secret",
			"metadata":   map[string]any{"name": parent.GetName() + "-creds", "labels": map[string]any{"app": parent.GetName()}},
			"stringData": map[string]any{"password": secretValue}})
		return 200, map[string]any{"status": map[string]any{"version": version}, "children": children}
	}))
	createController(t, inst, compositeKind, "events-"+ns, map[string]any{
		"parentResource": map[string]any{"apiVersion": "test.metabus.dev/v1", "resource": "widgets"},
		"childResources": []any{
			map[string]any{"apiVersion": "v1", "resource": "configmaps", "updateStrategy": map[string]any{"method": "InPlace"}},
			map[string]any{"apiVersion": "v1", "resource": "secrets"},
		},
		"hooks": map[string]any{"sync": map[string]any{"webhook": map[string]any{"url": url, "timeout": "5s"}}},
	})

	// The consumer: the example's, on the sdk's JetStream binding, reading
	// MC_EVENTS, which the applier creates when it starts.
	nc, err := nats.Connect(inst.url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := nc.JetStream()
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "the applier creates "+bus.EventsStream, func() error {
		_, err := js.StreamInfo(bus.EventsStream)
		return err
	})
	var (
		mu       sync.Mutex
		received []cloudevents.Event
	)
	rctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- eventsconsumer.Receive(rctx, nc, bus.EventsRoot+".>", func(e cloudevents.Event) {
			mu.Lock()
			received = append(received, e)
			mu.Unlock()
		})
	}()
	t.Cleanup(func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("consumer: %v", err)
		}
	})

	// applied returns the applied events of the widget's parent so far
	// whose body satisfies keep.
	applied := func(keep func(bus.AppliedEvent) bool) []bus.AppliedEvent {
		mu.Lock()
		defer mu.Unlock()
		var out []bus.AppliedEvent
		for _, e := range received {
			var a bus.AppliedEvent
			if e.Type() != bus.TypeApplied || json.Unmarshal(e.Data(), &a) != nil || a.Parent.Namespace != ns {
				continue
			}
			if keep(a) {
				out = append(out, a)
			}
		}
		return out
	}
	changed := func(list []bus.ChildChange, name string) bool {
		for _, c := range list {
			if c.Name == name && c.Namespace == ns {
				return true
			}
		}
		return false
	}
	waitApplied := func(what string, keep func(bus.AppliedEvent) bool) bus.AppliedEvent {
		t.Helper()
		var got bus.AppliedEvent
		eventually(t, 60*time.Second, what, func() error {
			evs := applied(keep)
			if len(evs) == 0 {
				return fmt.Errorf("no such applied event among %d received", len(received))
			}
			got = evs[0]
			return nil
		})
		return got
	}

	w := newWidget("ev", []string{"a", "b"}, 1)
	w, err = dyn.Resource(widgetsGVR).Namespace(ns).Create(ctx, w, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	created := waitApplied("an applied event creating ev-a, ev-b and the Secret", func(a bus.AppliedEvent) bool {
		return a.Outcome == bus.OutcomeApplied && changed(a.Created, "ev-a") && changed(a.Created, "ev-b") && changed(a.Created, "ev-creds")
	})

	eventually(t, 30*time.Second, "update the widget", func() error {
		cur, err := dyn.Resource(widgetsGVR).Namespace(ns).Get(ctx, "ev", metav1.GetOptions{})
		if err != nil {
			return err
		}
		_ = unstructured.SetNestedField(cur.Object, int64(2), "spec", "version")
		_ = unstructured.SetNestedStringSlice(cur.Object, []string{"a"}, "spec", "items")
		_, err = dyn.Resource(widgetsGVR).Namespace(ns).Update(ctx, cur, metav1.UpdateOptions{})
		return err
	})
	updated := waitApplied("an applied event updating ev-a", func(a bus.AppliedEvent) bool {
		return a.Outcome == bus.OutcomeApplied && changed(a.Updated, "ev-a")
	})
	deleted := waitApplied("an applied event deleting ev-b", func(a bus.AppliedEvent) bool {
		return a.Outcome == bus.OutcomeApplied && changed(a.Deleted, "ev-b")
	})
	if !(created.WorkSeq > 0 && created.WorkSeq < updated.WorkSeq && created.WorkSeq < deleted.WorkSeq) {
		t.Errorf("work sequences: create %d, update %d, delete %d; want them set and growing", created.WorkSeq, updated.WorkSeq, deleted.WorkSeq)
	}
	if created.Parent.UID != string(w.GetUID()) || created.Hook != bus.HookSync {
		t.Errorf("applied event of parent %s by hook %q, want %s by sync", created.Parent.UID, created.Hook, w.GetUID())
	}

	mu.Lock()
	defer mu.Unlock()
	desired := 0
	for _, e := range received {
		if strings.Contains(string(e.Data()), secretValue) || strings.Contains(string(e.Data()), "czNjcjN0LXZhbHVl") {
			t.Errorf("event %s (%s) carries the Secret's value: %s", e.ID(), e.Type(), e.Data())
		}
		if e.Type() == bus.TypeDesired && strings.Contains(e.Subject(), "/namespaces/"+ns+"/") {
			desired++
			if e.Extensions()[bus.ExtRedacted] == nil {
				t.Errorf("desired-state event %s has no %s extension, though its Secret child was redacted", e.ID(), bus.ExtRedacted)
			}
		}
		if ws, _ := e.Extensions()[bus.ExtWorkSeq].(string); len(ws) != 20 {
			t.Errorf("event %s has workseq %q, want 20 digits", e.ID(), ws)
		}
	}
	if desired < 2 {
		t.Errorf("%d desired-state events, want one per desired state (at least the create's and the update's)", desired)
	}
}
