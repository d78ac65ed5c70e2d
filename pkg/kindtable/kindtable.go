// Package kindtable is the table of controller kinds metabus serves: one
// row per kind (its name, its resource, and the decoder of its core
// package). Adding a kind adds a row here; the services find every kind
// through Lookup and Decode and drive it through the kinds seam.
package kindtable

import (
	"fmt"
	"sync"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/metabus/metabus/pkg/api/v1alpha1"
	"github.com/metabus/metabus/pkg/composite"
	"github.com/metabus/metabus/pkg/decorator"
	"github.com/metabus/metabus/pkg/kinds"
	"github.com/metabus/metabus/pkg/mapctl"
)

// Kinds are the controller kinds metabus serves.
var Kinds = []kinds.Kind{
	{Name: v1alpha1.CompositeControllerKind, GVR: v1alpha1.CompositeControllerGVR, Decode: composite.New, Finalizer: composite.Finalizer},
	{Name: v1alpha1.DecoratorControllerKind, GVR: v1alpha1.DecoratorControllerGVR, Decode: decorator.New, Finalizer: decorator.Finalizer},
	{Name: v1alpha1.MapControllerKind, GVR: v1alpha1.MapControllerGVR, Decode: mapctl.New, Finalizer: mapctl.Finalizer},
}

// Lookup returns the row of a kind.
func Lookup(name string) (kinds.Kind, bool) {
	for _, k := range Kinds {
		if k.Name == name {
			return k, true
		}
	}
	return kinds.Kind{}, false
}

// Decode decodes a controller object of any kind in the table. Decoded
// controllers are shared per object version (UID and resourceVersion):
// every sync and apply of a controller's parents needs its decoded spec,
// and decoding it each time was a JSON round trip per message.
func Decode(obj *unstructured.Unstructured) (kinds.Controller, error) {
	if obj == nil {
		return nil, fmt.Errorf("no controller object")
	}
	k, ok := Lookup(obj.GetKind())
	if !ok {
		return nil, fmt.Errorf("controller %s has an unsupported kind %q", obj.GetName(), obj.GetKind())
	}
	rv := obj.GetResourceVersion()
	key := k.Name + "/" + string(obj.GetUID())
	if rv != "" && obj.GetUID() != "" {
		if c, ok := decoded.get(key, rv); ok {
			return c, nil
		}
	}
	c, err := k.Decode(obj)
	if err != nil {
		return nil, err
	}
	if rv != "" && obj.GetUID() != "" {
		decoded.put(key, rv, c)
	}
	return c, nil
}

// decodedCap bounds the cache; past it the cache starts over (it holds
// one entry per live controller, so this only matters under churn).
const decodedCap = 4096

type entry struct {
	rv string
	c  kinds.Controller
}

type cache struct {
	mu sync.Mutex
	m  map[string]entry
}

var decoded = &cache{m: map[string]entry{}}

func (c *cache) get(key, rv string) (kinds.Controller, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.m[key]
	if !ok || e.rv != rv {
		return nil, false
	}
	return e.c, true
}

func (c *cache) put(key, rv string, ctrl kinds.Controller) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.m) >= decodedCap {
		c.m = map[string]entry{}
	}
	c.m[key] = entry{rv: rv, c: ctrl}
}
