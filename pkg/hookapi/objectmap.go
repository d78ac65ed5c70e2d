package hookapi

import (
	"encoding/json"
	"errors"
	"fmt"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/metabus/metabus/pkg/api/v1alpha1"
)

// GroupVersionKindKey returns the outer object-map key for a type: "<kind>.<apiVersion>", for
// example "Pod.v1" or "StatefulSet.apps/v1".
func GroupVersionKindKey(apiVersion, kind string) string {
	return kind + "." + apiVersion
}

// ObjectKey returns the inner object-map key of one object (see the package documentation for
// the rules). Any version other than v2 is treated as v1, the upstream default. namespace is
// ignored for cluster-scoped objects.
func ObjectKey(version v1alpha1.HookVersion, parentNamespaced, objNamespaced bool, namespace, name string) string {
	if !objNamespaced {
		return name
	}
	if version == v1alpha1.HookVersionV2 || !parentNamespaced {
		return namespace + "/" + name
	}
	return name
}

// ObjectMap is the wire form of observed objects: outer key from GroupVersionKindKey, inner key
// from ObjectKey. It marshals nil maps as {} (see the package documentation).
type ObjectMap map[string]map[string]*unstructured.Unstructured

// MarshalJSON encodes m, writing {} instead of null for a nil map or a nil inner map, and
// null for a nil object (which ObjectMapBuilder never stores).
func (m ObjectMap) MarshalJSON() ([]byte, error) {
	if m == nil {
		return []byte("{}"), nil
	}
	out := make(map[string]map[string]*unstructured.Unstructured, len(m))
	for k, inner := range m {
		if inner == nil {
			inner = map[string]*unstructured.Unstructured{}
		}
		out[k] = inner
	}
	// encoding/json sorts map keys, so the body is deterministic (stable ETags and logs).
	return json.Marshal(out)
}

// ObjectMapBuilder fills an ObjectMap with the key rules of one hook version and parent scope.
// The zero value is not usable; call NewObjectMap.
type ObjectMapBuilder struct {
	version          v1alpha1.HookVersion
	parentNamespaced bool
	m                ObjectMap
}

// NewObjectMap starts an object map for a hook of the given version ("" means v1) whose parent
// (composite parent or decorator target) is namespaced or not.
func NewObjectMap(version v1alpha1.HookVersion, parentNamespaced bool) *ObjectMapBuilder {
	return &ObjectMapBuilder{version: version, parentNamespaced: parentNamespaced, m: ObjectMap{}}
}

// Ensure makes the type present in the map, as {} if nothing of it is added. Call it for every
// declared child or attachment type.
func (b *ObjectMapBuilder) Ensure(apiVersion, kind string) {
	key := GroupVersionKindKey(apiVersion, kind)
	if _, ok := b.m[key]; !ok {
		b.m[key] = map[string]*unstructured.Unstructured{}
	}
}

// Add stores obj under its type and key. objNamespaced is the scope of obj's resource (from
// discovery, not guessed from metadata.namespace). obj is stored as is, not copied: it must not
// be modified while the map is in use.
//
// It is an error for obj to lack apiVersion, kind or name, for a namespaced obj to lack a
// namespace, or for two objects to collide on one key; the latter means the caller passed
// objects that the hook could not tell apart (for example two namespaces under a v1 map of a
// namespaced parent), and silently dropping one would hide it from the hook.
func (b *ObjectMapBuilder) Add(obj *unstructured.Unstructured, objNamespaced bool) error {
	if obj == nil {
		return errors.New("hookapi: cannot add a nil object to an object map")
	}
	apiVersion, kind, name, namespace := obj.GetAPIVersion(), obj.GetKind(), obj.GetName(), obj.GetNamespace()
	if apiVersion == "" || kind == "" || name == "" {
		return fmt.Errorf("hookapi: object %q of kind %q (apiVersion %q) lacks apiVersion, kind or name", name, kind, apiVersion)
	}
	if objNamespaced && namespace == "" {
		return fmt.Errorf("hookapi: namespaced object %s %q has no namespace", GroupVersionKindKey(apiVersion, kind), name)
	}
	gvk := GroupVersionKindKey(apiVersion, kind)
	inner := b.m[gvk]
	if inner == nil {
		inner = map[string]*unstructured.Unstructured{}
		b.m[gvk] = inner
	}
	key := ObjectKey(b.version, b.parentNamespaced, objNamespaced, namespace, name)
	if prev, dup := inner[key]; dup && prev != obj {
		return fmt.Errorf("hookapi: two %s objects share the key %q (namespaces %q and %q)", gvk, key, prev.GetNamespace(), namespace)
	}
	inner[key] = obj
	return nil
}

// Map returns the map built so far. The builder keeps sharing it, so stop adding once the map
// is handed to a request.
func (b *ObjectMapBuilder) Map() ObjectMap {
	return b.m
}
