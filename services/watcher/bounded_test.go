package watcher

import (
	"context"
	"fmt"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	dynamicfake "k8s.io/client-go/dynamic/fake"

	"github.com/metabus/metabus/pkg/api/v1alpha1"
	"github.com/metabus/metabus/pkg/bus"
	"github.com/metabus/metabus/pkg/discovery"
	"github.com/metabus/metabus/pkg/hookapi"
	"github.com/metabus/metabus/pkg/informers"
	"github.com/metabus/metabus/pkg/related"
)

// A controller author who keeps changing an invalid weight annotation
// (issue 26) must not grow the watcher: what it remembers to log each
// value once is one entry per controller, gone once the value is valid or
// the controller is deleted. Each distinct value is still logged once.
func TestInvalidWeightsBounded(t *testing.T) {
	ctrl := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": v1alpha1.GroupVersion.String(), "kind": v1alpha1.CompositeControllerKind,
		"metadata": map[string]any{"name": "churn", "uid": "churn-uid", "resourceVersion": "1"},
	}}
	dyn := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(),
		map[schema.GroupVersionResource]string{v1alpha1.CompositeControllerGVR: "CompositeControllerList"}, ctrl)
	core, logs := observer.New(zapcore.WarnLevel)
	w := &Watcher{log: zap.New(core), registry: informers.New(dyn, 0), wirings: map[string]*wiring{}}
	w.metrics = newMetrics(nil, w)
	h := w.registry.Acquire(v1alpha1.CompositeControllerGVR)
	t.Cleanup(h.Release)
	w.ctrlHandles = map[string]*informers.Handle{v1alpha1.CompositeControllerKind: h}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if !h.WaitForSync(ctx) {
		t.Fatal("controller cache did not sync")
	}
	ref := bus.ControllerRef{Kind: v1alpha1.CompositeControllerKind, Name: "churn", UID: "churn-uid"}
	annotate := func(v string) {
		t.Helper()
		c := ctrl.DeepCopy()
		c.SetAnnotations(map[string]string{bus.WeightAnnotation: v})
		if err := h.Informer().GetStore().Update(c); err != nil {
			t.Fatal(err)
		}
	}
	entries := func() int {
		n := 0
		w.badWeights.Range(func(any, any) bool { n++; return true })
		return n
	}

	const churn = 2000
	for i := range churn {
		annotate(fmt.Sprintf("not-a-weight-%d", i))
		for range 3 { // every work item of the controller reads it
			if got := w.controllerWeight(ref); got != 1 {
				t.Fatalf("weight %d for an invalid annotation, want 1", got)
			}
		}
	}
	if n := entries(); n != 1 {
		t.Errorf("after %d distinct invalid weights of one controller, %d entries are kept, want 1", churn, n)
	}
	if n := logs.FilterMessage("ignoring the controller's weight").Len(); n != churn {
		t.Errorf("%d warnings for %d distinct invalid values (each read 3 times), want one per value", n, churn)
	}

	annotate("3")
	if got := w.controllerWeight(ref); got != 3 {
		t.Errorf("weight %d, want 3", got)
	}
	if n := entries(); n != 0 {
		t.Errorf("%d entries kept once the weight is valid, want 0", n)
	}
	// The operator's bound, not the annotation, decides the weight granted.
	annotate("100")
	w.cfg.Weights = bus.WeightPolicy{Max: 1}
	if got := w.controllerWeight(ref); got != 1 {
		t.Errorf("weight %d for an annotation of 100 under --max-controller-weight=1, want 1", got)
	}
	w.cfg.Weights = bus.WeightPolicy{Allowed: map[string]bool{"cc-other": true}}
	if got := w.controllerWeight(ref); got != 1 {
		t.Errorf("weight %d for a controller --weighted-controllers does not name, want 1", got)
	}
	w.cfg.Weights = bus.WeightPolicy{Max: 8, Allowed: map[string]bool{ref.ID(): true}}
	if got := w.controllerWeight(ref); got != 8 {
		t.Errorf("weight %d for a named controller under --max-controller-weight=8, want 8", got)
	}
	w.cfg.Weights = bus.WeightPolicy{}
	annotate("bad-again")
	w.controllerWeight(ref)
	w.unwire(ref.ID(), "controller deleted", true)
	if n := entries(); n != 0 {
		t.Errorf("%d entries kept after the controller is gone, want 0", n)
	}
}

// A customize hook naming a new namespace, or another resource, at every
// call (issue 26) must not grow the watcher: the related index keeps the
// buckets and informers that the parents' current rules need, no more.
func TestRelatedIndexBounded(t *testing.T) {
	configmaps := schema.GroupVersionResource{Version: "v1", Resource: "configmaps"}
	secrets := schema.GroupVersionResource{Version: "v1", Resource: "secrets"}
	namespaces := schema.GroupVersionResource{Version: "v1", Resource: "namespaces"}
	dyn := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(), map[schema.GroupVersionResource]string{
		configmaps: "ConfigMapList", secrets: "SecretList", namespaces: "NamespaceList",
	})
	disc := discovery.New(discovery.SourceFunc(func(context.Context) ([]*metav1.APIResourceList, error) {
		return []*metav1.APIResourceList{{GroupVersion: "v1", APIResources: []metav1.APIResource{
			{Name: "configmaps", Kind: "ConfigMap", Namespaced: true, Verbs: metav1.Verbs{"list", "watch"}},
			{Name: "secrets", Kind: "Secret", Namespaced: true, Verbs: metav1.Verbs{"list", "watch"}},
			{Name: "namespaces", Kind: "Namespace", Verbs: metav1.Verbs{"list", "watch"}},
		}}}, nil
	}))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if err := disc.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	policy, err := related.ParsePolicy([]string{"*"})
	if err != nil {
		t.Fatal(err)
	}
	w := &Watcher{log: zap.NewNop(), registry: informers.New(dyn, 0), disc: disc, resources: policy}
	ix := newRelatedIndex(ctx, w, func(string, schema.GroupVersionResource, string) {})
	t.Cleanup(ix.release)
	register := func(uid string, rules ...hookapi.RelatedResourceRule) {
		t.Helper()
		if _, err := ix.register(&bus.RelatedRules{ParentUID: uid, ParentNamespace: "home", HookVersion: "v2", Rules: rules}); err != nil {
			t.Fatal(err)
		}
	}
	named := func(resource, ns string) hookapi.RelatedResourceRule {
		return hookapi.RelatedResourceRule{APIVersion: "v1", Resource: resource, Namespace: ns, Names: []string{"x"}}
	}
	bySelector := hookapi.RelatedResourceRule{APIVersion: "v1", Resource: "secrets",
		NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"team": "a"}}}

	type size struct{ Buckets, Handles int }
	check := func(what string, want size) {
		t.Helper()
		var got size
		got.Buckets, got.Handles = ix.size()
		if got != want {
			t.Errorf("%s: index holds %+v, want %+v", what, got, want)
		}
	}

	const churn = 2000
	for i := range churn {
		register("p", named("configmaps", fmt.Sprintf("ns-%d", i)))
		register("q", named("configmaps", "fixed"))
	}
	check(fmt.Sprintf("two parents, one of which named %d namespaces in turn", churn), size{Buckets: 2, Handles: 1})

	for i := range 50 {
		if i%2 == 0 {
			register("p", bySelector)
		} else {
			register("p", named("configmaps", fmt.Sprintf("other-%d", i)))
		}
	}
	check("a parent alternating between resources, ending on configmaps", size{Buckets: 2, Handles: 1})
	register("p", bySelector)
	check("a parent on a namespaceSelector rule for secrets", size{Buckets: 2, Handles: 3})

	ix.drop("p")
	check("the first parent deleted", size{Buckets: 1, Handles: 1})
	ix.drop("q")
	check("both parents deleted", size{Buckets: 0, Handles: 0})
}
