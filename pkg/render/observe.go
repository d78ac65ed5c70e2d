package render

import (
	"context"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/metabus/metabus/pkg/apiresource"
)

// Lister lists the objects of a resource in a namespace ("": all).
type Lister func(ctx context.Context, res *apiresource.Resource, namespace string) ([]*unstructured.Unstructured, error)

// ListCache is a list of objects read as a kinds.WatchCache.
type ListCache []*unstructured.Unstructured

func controllerOf(o *unstructured.Unstructured) *metav1.OwnerReference {
	for _, r := range o.GetOwnerReferences() {
		if r.Controller != nil && *r.Controller {
			return &r
		}
	}
	return nil
}

// OwnedBy lists the objects whose controller reference names uid.
func (c ListCache) OwnedBy(uid string) []*unstructured.Unstructured {
	var out []*unstructured.Unstructured
	for _, o := range c {
		if r := controllerOf(o); r != nil && string(r.UID) == uid {
			out = append(out, o)
		}
	}
	return out
}

// Orphans lists the objects of a namespace with no controller.
func (c ListCache) Orphans(namespace string) []*unstructured.Unstructured {
	var out []*unstructured.Unstructured
	for _, o := range c {
		if o.GetNamespace() == namespace && controllerOf(o) == nil {
			out = append(out, o)
		}
	}
	return out
}

// AllOrphans lists the objects with no controller.
func (c ListCache) AllOrphans() []*unstructured.Unstructured {
	var out []*unstructured.Unstructured
	for _, o := range c {
		if controllerOf(o) == nil {
			out = append(out, o)
		}
	}
	return out
}

// ControlledByName lists the objects whose controller reference names a
// group, kind and name in a namespace, whatever its UID.
func (c ListCache) ControlledByName(group, kind, namespace, name string) []*unstructured.Unstructured {
	var out []*unstructured.Unstructured
	for _, o := range c {
		r := controllerOf(o)
		if r == nil || o.GetNamespace() != namespace || r.Kind != kind || r.Name != name {
			continue
		}
		g, _, found := strings.Cut(r.APIVersion, "/")
		if !found {
			g = "" // the core group: "v1"
		}
		if g == group {
			out = append(out, o)
		}
	}
	return out
}
