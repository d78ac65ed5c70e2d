package kubeenv

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"
)

// fieldManager names this package as the owner of the fields it applies.
const fieldManager = "kubeenv"

var crdGVR = schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}

// Apply creates or updates (server-side apply, conflicts forced) every object
// in the given YAML or JSON manifest files, or in the *.yaml, *.yml and
// *.json files directly inside given directories (in name order). Files may
// hold several documents and kind: List objects. Kinds are resolved through
// discovery, so any served type works, including ones whose CRD is in the
// same call: CustomResourceDefinitions and Namespaces are applied first and
// Apply waits until every CRD is Established and its resources are served by
// discovery. Namespaced objects without a namespace go to "default".
//
// Expect the first create of a new CRD's objects within ~2s of Apply to take
// 2s: the apiserver deliberately delays creates for CRDs established less
// than 2s ago (for HA setups). Apply does not wait that out, since most
// callers do not create objects that quickly.
func (e *Env) Apply(ctx context.Context, paths ...string) error {
	return ApplyManifests(ctx, e.Config, paths...)
}

// ApplyManifests is Env.Apply against any cluster (make run uses it on the
// current kubeconfig's cluster).
func ApplyManifests(ctx context.Context, cfg *rest.Config, paths ...string) error {
	objs, err := readManifests(paths...)
	if err != nil {
		return fmt.Errorf("apply: %w", err)
	}
	if _, err := applyObjects(ctx, cfg, objs); err != nil {
		return fmt.Errorf("apply: %w", err)
	}
	return nil
}

// manifestObject is one decoded object and where it came from (for errors).
type manifestObject struct {
	obj    *unstructured.Unstructured
	source string
}

// readManifests decodes all objects in the given files and directories.
func readManifests(paths ...string) ([]manifestObject, error) {
	var files []string
	for _, p := range paths {
		st, err := os.Stat(p)
		if err != nil {
			return nil, err
		}
		if !st.IsDir() {
			files = append(files, p)
			continue
		}
		entries, err := os.ReadDir(p) // sorted by name
		if err != nil {
			return nil, err
		}
		for _, ent := range entries {
			switch strings.ToLower(filepath.Ext(ent.Name())) {
			case ".yaml", ".yml", ".json":
				if !ent.IsDir() {
					files = append(files, filepath.Join(p, ent.Name()))
				}
			}
		}
	}
	var objs []manifestObject
	for _, f := range files {
		fileObjs, err := readManifestFile(f)
		if err != nil {
			return nil, err
		}
		objs = append(objs, fileObjs...)
	}
	return objs, nil
}

// readManifestFile decodes a multi-document YAML or JSON file.
func readManifestFile(path string) ([]manifestObject, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
	var objs []manifestObject
	for doc := 1; ; doc++ {
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			if errors.Is(err, io.EOF) {
				return objs, nil
			}
			return nil, fmt.Errorf("%s: document %d: %w", path, doc, err)
		}
		raw = bytes.TrimSpace(raw)
		if len(raw) == 0 || string(raw) == "null" || string(raw) == "{}" {
			continue // empty document, e.g. a trailing "---"
		}
		source := fmt.Sprintf("%s (document %d)", path, doc)
		// Unstructured's own decoder keeps integers as int64, which a plain
		// json.Unmarshal into a map would turn into float64.
		u := &unstructured.Unstructured{}
		if err := u.UnmarshalJSON(raw); err != nil {
			return nil, fmt.Errorf("%s: %w", source, err)
		}
		if u.IsList() {
			list, err := u.ToList()
			if err != nil {
				return nil, fmt.Errorf("%s: %w", source, err)
			}
			for i := range list.Items {
				objs = append(objs, manifestObject{obj: &list.Items[i], source: fmt.Sprintf("%s item %d", source, i)})
			}
			continue
		}
		objs = append(objs, manifestObject{obj: u, source: source})
	}
}

// applyObjects applies objs in dependency order and returns how many were applied.
func applyObjects(ctx context.Context, cfg *rest.Config, objs []manifestObject) (int, error) {
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return 0, fmt.Errorf("dynamic client: %w", err)
	}
	disc, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		return 0, fmt.Errorf("discovery client: %w", err)
	}
	mapper := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(disc))

	// Types must exist before their objects: CRDs and Namespaces go first
	// (keeping file order otherwise), and CRDs must be served before anything
	// after them can be mapped.
	first := func(m manifestObject) bool {
		gk := m.obj.GroupVersionKind().GroupKind()
		return gk == (schema.GroupKind{Group: "apiextensions.k8s.io", Kind: "CustomResourceDefinition"}) ||
			gk == (schema.GroupKind{Kind: "Namespace"})
	}
	ordered := make([]manifestObject, 0, len(objs))
	for _, m := range objs {
		if first(m) {
			ordered = append(ordered, m)
		}
	}
	for _, m := range objs {
		if !first(m) {
			ordered = append(ordered, m)
		}
	}

	var crds []*unstructured.Unstructured
	crdsWaited := false
	for i, m := range ordered {
		if !crdsWaited && !first(m) {
			if err := waitCRDs(ctx, dyn, disc, crds); err != nil {
				return i, err
			}
			mapper.Reset()
			crdsWaited = true
		}
		applied, err := applyOne(ctx, dyn, mapper, m.obj)
		if err != nil {
			return i, fmt.Errorf("%s: %s %q: %w", m.source, m.obj.GetKind(), m.obj.GetName(), err)
		}
		if applied.GetKind() == "CustomResourceDefinition" {
			crds = append(crds, applied)
		}
	}
	if !crdsWaited {
		if err := waitCRDs(ctx, dyn, disc, crds); err != nil {
			return len(ordered), err
		}
	}
	return len(ordered), nil
}

// applyOne server-side applies one object, mapping its kind to a resource.
func applyOne(ctx context.Context, dyn dynamic.Interface, mapper *restmapper.DeferredDiscoveryRESTMapper, obj *unstructured.Unstructured) (*unstructured.Unstructured, error) {
	gvk := obj.GroupVersionKind()
	if gvk.Kind == "" || gvk.Version == "" {
		return nil, errors.New("object has no apiVersion or kind")
	}
	mapping, err := restMapping(ctx, mapper, gvk)
	if err != nil {
		return nil, err
	}
	var ri dynamic.ResourceInterface = dyn.Resource(mapping.Resource)
	if mapping.Scope.Name() == meta.RESTScopeNameNamespace {
		if obj.GetNamespace() == "" {
			obj.SetNamespace(metav1.NamespaceDefault)
		}
		ri = dyn.Resource(mapping.Resource).Namespace(obj.GetNamespace())
	} else {
		obj.SetNamespace("")
	}
	if obj.GetName() == "" {
		// Server-side apply needs a name; generateName objects can only be created.
		if obj.GetGenerateName() == "" {
			return nil, errors.New("object has neither metadata.name nor metadata.generateName")
		}
		return ri.Create(ctx, obj, metav1.CreateOptions{FieldManager: fieldManager})
	}
	return ri.Apply(ctx, obj.GetName(), obj, metav1.ApplyOptions{FieldManager: fieldManager, Force: true})
}

// restMapping resolves gvk, refreshing discovery for a short while: a type
// whose CRD was just created can take a moment to appear.
func restMapping(ctx context.Context, mapper *restmapper.DeferredDiscoveryRESTMapper, gvk schema.GroupVersionKind) (*meta.RESTMapping, error) {
	deadline := time.Now().Add(10 * time.Second)
	for {
		mapping, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
		if err == nil {
			return mapping, nil
		}
		if !meta.IsNoMatchError(err) || time.Now().After(deadline) {
			return nil, fmt.Errorf("resolve kind %s: %w", gvk, err)
		}
		mapper.Reset()
		if err := sleepCtx(ctx, 200*time.Millisecond); err != nil {
			return nil, fmt.Errorf("resolve kind %s: %w", gvk, err)
		}
	}
}

// waitCRDs waits until every CRD is Established and discovery lists its
// resource in each served version. The discovery check matters for
// kube-controller-manager started right afterwards: its garbage collector
// learns the types to watch from discovery, once at start and then only
// every 30s.
func waitCRDs(ctx context.Context, dyn dynamic.Interface, disc discovery.DiscoveryInterface, crds []*unstructured.Unstructured) error {
	for _, crd := range crds {
		name := crd.GetName()
		err := poll(ctx, 60*time.Second, 100*time.Millisecond, func(ctx context.Context) error {
			cur, err := dyn.Resource(crdGVR).Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return err
			}
			if !crdEstablished(cur) {
				return errors.New("condition Established is not True yet")
			}
			group, _, _ := unstructured.NestedString(cur.Object, "spec", "group")
			plural, _, _ := unstructured.NestedString(cur.Object, "spec", "names", "plural")
			versions, _, _ := unstructured.NestedSlice(cur.Object, "spec", "versions")
			for _, v := range versions {
				vm, _ := v.(map[string]any)
				vname, _ := vm["name"].(string)
				if served, _ := vm["served"].(bool); !served {
					continue
				}
				gv := schema.GroupVersion{Group: group, Version: vname}.String()
				list, err := disc.ServerResourcesForGroupVersion(gv)
				if err != nil {
					return fmt.Errorf("discovery of %s: %w", gv, err)
				}
				if !slices.ContainsFunc(list.APIResources, func(r metav1.APIResource) bool { return r.Name == plural }) {
					return fmt.Errorf("discovery of %s does not list %s yet", gv, plural)
				}
			}
			return nil
		})
		if err != nil {
			return fmt.Errorf("wait for CRD %s: %w", name, err)
		}
	}
	return nil
}

// crdEstablished reports whether a CRD has condition Established=True.
func crdEstablished(crd *unstructured.Unstructured) bool {
	conds, _, _ := unstructured.NestedSlice(crd.Object, "status", "conditions")
	for _, c := range conds {
		cm, _ := c.(map[string]any)
		if cm["type"] == "Established" && cm["status"] == "True" {
			return true
		}
	}
	return false
}

// poll calls f every interval until it returns nil, timeout passes or ctx
// ends; the error then includes f's last error.
func poll(ctx context.Context, timeout, interval time.Duration, f func(context.Context) error) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for {
		err := f(ctx)
		if err == nil {
			return nil
		}
		if serr := sleepCtx(ctx, interval); serr != nil {
			return fmt.Errorf("%w (last error: %v)", serr, err)
		}
	}
}

// sleepCtx sleeps for d or until ctx ends.
func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
