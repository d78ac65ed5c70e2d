package watcher

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	"k8s.io/client-go/tools/cache"

	"github.com/metabus/metabus/pkg/api/v1alpha1"
	"github.com/metabus/metabus/pkg/apiresource"
	"github.com/metabus/metabus/pkg/decorator"
	"github.com/metabus/metabus/pkg/kindtable"
)

// TestOwnedEventsRouted wires many controllers over one ConfigMap informer
// and checks, by counting the handler calls the registry makes, that each
// ConfigMap event reaches only the wirings it can concern: with a scan,
// every event reached every wiring.
func TestOwnedEventsRouted(t *testing.T) {
	const decorators, gadgetComposites = 30, 30
	gadgetsGVR := schema.GroupVersionResource{Group: "example.com", Version: "v1", Resource: "gadgets"}
	gadgetsRes := &apiresource.Resource{GVR: gadgetsGVR, Kind: "Gadget", Namespaced: true, HasStatus: true}
	resolve := func(apiVersion, resource string) (*apiresource.Resource, error) {
		if apiVersion+"/"+resource == "example.com/v1/gadgets" {
			return gadgetsRes, nil
		}
		return fakeResolve(apiVersion, resource)
	}
	listKinds := map[schema.GroupVersionResource]string{thingsGVR: "ThingList", configmapsGVR: "ConfigMapList", gadgetsGVR: "GadgetList"}
	p := thing("p", "10", map[string]string{"deco": "yes"}, map[string]any{"app": "x"})
	dyn := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(), listKinds, p)

	w := leadingWatcher(dyn)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(func() {
		for _, wr := range w.wirings {
			wr.stop()
		}
		cancel()
		w.out.shutDown()
	})

	// The controllers: one composite of Things (it adopts), decorators of
	// Things with attachments, composites of Gadgets (they adopt too).
	ctrls := []*unstructured.Unstructured{compositeObj}
	for i := range decorators {
		ctrls = append(ctrls, controllerObj(v1alpha1.DecoratorControllerKind, fmt.Sprintf("deco%d", i), map[string]any{
			"resources":   []any{map[string]any{"apiVersion": "example.com/v1", "resource": "things"}},
			"attachments": []any{map[string]any{"apiVersion": "v1", "resource": "configmaps"}},
		}))
	}
	for i := range gadgetComposites {
		ctrls = append(ctrls, controllerObj(v1alpha1.CompositeControllerKind, fmt.Sprintf("gadgets%d", i), map[string]any{
			"parentResource": map[string]any{"apiVersion": "example.com/v1", "resource": "gadgets"},
			"childResources": []any{map[string]any{"apiVersion": "v1", "resource": "configmaps"}},
		}))
	}
	for _, obj := range ctrls {
		ctrl, err := kindtable.Decode(obj)
		if err != nil {
			t.Fatal(err)
		}
		plan, err := ctrl.WatchPlan(resolve)
		if err != nil {
			t.Fatal(err)
		}
		wr := w.newWiring(ctrl.Ref(), obj, "", nil, plan)
		if err := wr.start(ctx); err != nil {
			t.Fatal(err)
		}
		w.wirings[obj.GetName()] = wr
	}
	// A catch-all subscriber added last is called last for each event: once
	// it has an event, every wiring the event concerns has had it.
	seen := make(chan string, 16)
	all := w.registry.Acquire(configmapsGVR)
	t.Cleanup(all.Release)
	if err := all.AddHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { seen <- "add " + obj.(*unstructured.Unstructured).GetName() },
		UpdateFunc: func(_, obj any) { seen <- "update " + obj.(*unstructured.Unstructured).GetName() },
		DeleteFunc: func(obj any) { seen <- "delete " + obj.(*unstructured.Unstructured).GetName() },
	}); err != nil {
		t.Fatal(err)
	}
	sctx, scancel := context.WithTimeout(ctx, 10*time.Second)
	defer scancel()
	if !all.WaitForSync(sctx) {
		t.Fatal("ConfigMap cache did not sync")
	}

	// calls is the ConfigMap handler calls of each wiring, by group.
	type calls struct{ Things, Deco3, OtherDecos, Gadgets uint64 }
	count := func() calls {
		var c calls
		for name, wr := range w.wirings {
			n := wr.owned[0].Calls()
			switch {
			case name == "comp":
				c.Things += n
			case name == "deco3":
				c.Deco3 += n
			case len(name) > 4 && name[:4] == "deco":
				c.OtherDecos += n
			default:
				c.Gadgets += n
			}
		}
		return c
	}
	cms := dyn.Resource(configmapsGVR).Namespace("ns")
	mark := map[string]string{decorator.ControllerAnnotation: "deco3"}
	gadgetChild := configMap("g", "", nil, nil, "")
	yes := true
	gadgetChild.SetOwnerReferences([]metav1.OwnerReference{{APIVersion: "example.com/v1", Kind: "Gadget", Name: "x", UID: types.UID("x-uid"), Controller: &yes}})

	for _, step := range []struct {
		reason string
		seen   string
		do     func(dynamic.ResourceInterface) error
		want   calls
	}{{
		reason: "a child of a Thing reaches the Things composite only",
		seen:   "add c",
		do:     create(configMap("c", "", nil, nil, "p")),
		want:   calls{Things: 1},
	}, {
		reason: "marked as deco3's attachment: the Things composite and deco3, no other decorator",
		seen:   "update c",
		do:     update(configMap("c", "", nil, mark, "p")),
		want:   calls{Things: 1, Deco3: 1},
	}, {
		reason: "an orphan reaches every composite (they adopt), no decorator",
		seen:   "add o",
		do:     create(configMap("o", "", map[string]string{"app": "x"}, nil, "")),
		want:   calls{Things: 1, Gadgets: gadgetComposites},
	}, {
		reason: "a child of a Gadget reaches the Gadget composites only",
		seen:   "add g",
		do:     create(gadgetChild),
		want:   calls{Gadgets: gadgetComposites},
	}, {
		reason: "the attachment's deletion reaches its owner's kind and deco3",
		seen:   "delete c",
		do:     func(ri dynamic.ResourceInterface) error { return ri.Delete(ctx, "c", metav1.DeleteOptions{}) },
		want:   calls{Things: 1, Deco3: 1},
	}} {
		before := count()
		if err := step.do(cms); err != nil {
			t.Fatalf("%s: %v", step.reason, err)
		}
		waitSeen(t, seen, step.seen)
		after := count()
		got := calls{after.Things - before.Things, after.Deco3 - before.Deco3, after.OtherDecos - before.OtherDecos, after.Gadgets - before.Gadgets}
		if diff := cmp.Diff(step.want, got); diff != "" {
			t.Errorf("%s: handler calls (-want +got):\n%s", step.reason, diff)
		}
	}
}

func create(obj *unstructured.Unstructured) func(dynamic.ResourceInterface) error {
	return func(ri dynamic.ResourceInterface) error {
		_, err := ri.Create(context.Background(), obj, metav1.CreateOptions{})
		return err
	}
}

func update(obj *unstructured.Unstructured) func(dynamic.ResourceInterface) error {
	return func(ri dynamic.ResourceInterface) error {
		_, err := ri.Update(context.Background(), obj, metav1.UpdateOptions{})
		return err
	}
}

// waitSeen waits for the catch-all subscriber to report event want.
func waitSeen(t *testing.T, seen <-chan string, want string) {
	t.Helper()
	timeout := time.After(10 * time.Second)
	for {
		select {
		case got := <-seen:
			if got == want {
				return
			}
		case <-timeout:
			t.Fatalf("event %q never reached the informer's subscribers", want)
		}
	}
}
