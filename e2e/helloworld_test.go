package e2e

import (
	"context"
	"fmt"
	"io/fs"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"

	"github.com/metabus/metabus/examples/helloworld"
	"github.com/metabus/metabus/internal/allinone"
)

func manifest(t *testing.T, name string) map[string]any {
	t.Helper()
	data, err := fs.ReadFile(helloworld.Manifests, "manifests/"+name)
	if err != nil {
		t.Fatal(err)
	}
	var obj map[string]any
	if err := yaml.Unmarshal(data, &obj); err != nil {
		t.Fatalf("parse %s: %v", name, err)
	}
	return obj
}

func podCommand(pod *unstructured.Unstructured) string {
	cs, _, _ := unstructured.NestedSlice(pod.Object, "spec", "containers")
	if len(cs) == 0 {
		return ""
	}
	cmd, _, _ := unstructured.NestedStringSlice(cs[0].(map[string]any), "command")
	return strings.Join(cmd, " ")
}

// TestHelloWorld is the "Create a Controller" tutorial: a parent gets a Pod
// with the greeting, status is written, changing spec.who recreates the Pod
// (Recreate), a re-sync of an unchanged parent writes nothing, and deleting
// the parent lets the garbage collector remove the Pod.
func TestHelloWorld(t *testing.T) {
	ctx := context.Background()
	inst := startMetabus(t, allinone.Config{}, nil)
	ns := newNamespace(t)
	url := hookServer(t, helloworld.Handler())

	cc := manifest(t, "controller.yaml")
	unstructured.SetNestedField(cc, url+"/sync", "spec", "hooks", "sync", "webhook", "url")
	name, _, _ := unstructured.NestedString(cc, "metadata", "name")
	createController(t, inst, cc["kind"].(string), name, cc["spec"].(map[string]any))

	hello := &unstructured.Unstructured{Object: manifest(t, "hello.yaml")}
	parent, err := dyn.Resource(helloGVR).Namespace(ns).Create(ctx, hello, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create HelloWorld: %v", err)
	}
	start := time.Now()
	var pod *unstructured.Unstructured
	eventually(t, 30*time.Second, "the child Pod", func() error {
		p, err := dyn.Resource(podsGVR).Namespace(ns).Get(ctx, "your-name", metav1.GetOptions{})
		if err != nil {
			return err
		}
		pod = p
		return nil
	})
	t.Logf("child Pod created %s after the parent", time.Since(start).Round(time.Millisecond))
	if got, want := podCommand(pod), "echo Hello, Your Name!"; got != want {
		t.Errorf("pod command = %q, want %q", got, want)
	}
	ref := metav1.GetControllerOf(pod)
	if ref == nil || ref.UID != parent.GetUID() || ref.Kind != "HelloWorld" || ref.BlockOwnerDeletion == nil || !*ref.BlockOwnerDeletion {
		t.Errorf("pod controller ref = %+v, want the HelloWorld parent with blockOwnerDeletion", ref)
	}
	if got := pod.GetLabels()["controller-uid"]; got != string(parent.GetUID()) {
		t.Errorf("pod controller-uid label = %q, want the parent UID (generateSelector)", got)
	}
	if _, ok := pod.GetAnnotations()["metacontroller.k8s.io/last-applied-configuration"]; !ok {
		t.Errorf("pod has no last-applied-configuration annotation")
	}

	// Status: the hook counts the Pods it observed, so it converges to 1.
	eventually(t, 30*time.Second, "status.pods == 1", func() error {
		p, err := dyn.Resource(helloGVR).Namespace(ns).Get(ctx, "your-name", metav1.GetOptions{})
		if err != nil {
			return err
		}
		if n, ok := nestedInt(p, "status", "pods"); !ok || n != 1 {
			return fmt.Errorf("status = %v", p.Object["status"])
		}
		if g, ok := nestedInt(p, "status", "observedGeneration"); !ok || g != p.GetGeneration() {
			return fmt.Errorf("status.observedGeneration = %v, generation %d", p.Object["status"], p.GetGeneration())
		}
		return nil
	})

	// A change the hook's output does not depend on (a label) syncs again
	// and must write nothing: no child write, no status write. The
	// all-in-one's dispatcher settles such an answer itself ("unchanged",
	// the applier's own plan says it writes nothing); an applier that got
	// it would count a no-op apply.
	time.Sleep(500 * time.Millisecond) // let in-flight syncs of the status change settle
	writesBefore := inst.counter(t, "metabus_applier_api_writes_total", nil)
	settledBefore := inst.counter(t, "metabus_dispatcher_syncs_total", map[string]string{"result": "unchanged"}) +
		inst.counter(t, "metabus_applier_applies_total", map[string]string{"result": "noop"})
	if _, err := dyn.Resource(helloGVR).Namespace(ns).Patch(ctx, "your-name", "application/merge-patch+json",
		[]byte(`{"metadata":{"labels":{"touched":"yes"}}}`), metav1.PatchOptions{}); err != nil {
		t.Fatalf("label parent: %v", err)
	}
	eventually(t, 20*time.Second, "a sync of the relabelled parent that writes nothing", func() error {
		settled := inst.counter(t, "metabus_dispatcher_syncs_total", map[string]string{"result": "unchanged"}) +
			inst.counter(t, "metabus_applier_applies_total", map[string]string{"result": "noop"})
		if settled <= settledBefore {
			return fmt.Errorf("no sync settled unchanged and no no-op apply yet")
		}
		return nil
	})
	time.Sleep(300 * time.Millisecond)
	if after := inst.counter(t, "metabus_applier_api_writes_total", nil); after != writesBefore {
		t.Errorf("re-sync of an unchanged desired state made %v API writes, want 0", after-writesBefore)
	}

	// Recreate: a new greeting means a new Pod.
	oldUID := pod.GetUID()
	if _, err := dyn.Resource(helloGVR).Namespace(ns).Patch(ctx, "your-name", "application/merge-patch+json",
		[]byte(`{"spec":{"who":"My Name"}}`), metav1.PatchOptions{}); err != nil {
		t.Fatalf("patch spec.who: %v", err)
	}
	eventually(t, 30*time.Second, "the Pod recreated with the new greeting", func() error {
		p, err := dyn.Resource(podsGVR).Namespace(ns).Get(ctx, "your-name", metav1.GetOptions{})
		if err != nil {
			return err
		}
		if p.GetUID() == oldUID {
			return fmt.Errorf("still the old Pod")
		}
		if got := podCommand(p); got != "echo Hello, My Name!" {
			return fmt.Errorf("command %q", got)
		}
		return nil
	})

	// Garbage collection of the child when the parent goes.
	if err := dyn.Resource(helloGVR).Namespace(ns).Delete(ctx, "your-name", metav1.DeleteOptions{}); err != nil {
		t.Fatalf("delete parent: %v", err)
	}
	eventually(t, 60*time.Second, "the garbage collector to remove the Pod", func() error {
		_, err := dyn.Resource(podsGVR).Namespace(ns).Get(ctx, "your-name", metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		return fmt.Errorf("pod still there (err=%v)", err)
	})
}
