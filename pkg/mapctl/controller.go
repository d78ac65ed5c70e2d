package mapctl

import (
	"fmt"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/metabus/metabus/pkg/api/v1alpha1"
	"github.com/metabus/metabus/pkg/bus"
	"github.com/metabus/metabus/pkg/kinds"
)

// Controller is a MapController as the services see it, through the kinds
// seam (a keyed kind: its unit of work is one parent and one map key). It
// is immutable.
type Controller struct {
	MC  *v1alpha1.MapController
	obj *unstructured.Unstructured
}

var _ kinds.Controller = (*Controller)(nil)

// New decodes and validates a MapController object (the kind table's
// Decode).
func New(obj *unstructured.Unstructured) (kinds.Controller, error) {
	mc, err := Decode(obj)
	if err != nil {
		return nil, err
	}
	return &Controller{MC: mc, obj: obj}, nil
}

// Object is the controller object.
func (c *Controller) Object() *unstructured.Unstructured { return c.obj }

// Ref identifies the controller on the bus.
func (c *Controller) Ref() bus.ControllerRef {
	return bus.ControllerRef{Kind: v1alpha1.MapControllerKind, Name: c.obj.GetName(), UID: string(c.obj.GetUID())}
}

// FinalizerName is "": a MapController never puts a finalizer on parents
// (see Finalizer).
func (c *Controller) FinalizerName() string { return "" }

// Finalizer is "".
func (c *Controller) Finalizer() string { return "" }

// ResyncPeriodSeconds is spec.resyncPeriodSeconds: each resync re-maps
// every key of every parent and asks the tombstone hook again about every
// detached key.
func (c *Controller) ResyncPeriodSeconds() *int32 { return c.MC.Spec.ResyncPeriodSeconds }

// hooks is spec.hooks, never nil (Validate requires the map hook).
func (c *Controller) hooks() v1alpha1.MapControllerHooks {
	if c.MC.Spec.Hooks == nil {
		return v1alpha1.MapControllerHooks{}
	}
	return *c.MC.Spec.Hooks
}

// name is the controller's name for errors.
func (c *Controller) name() string { return fmt.Sprintf("MapController %s", c.obj.GetName()) }
