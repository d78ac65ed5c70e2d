package composite

import (
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/metabus/metabus/pkg/api/v1alpha1"
	"github.com/metabus/metabus/pkg/bus"
	"github.com/metabus/metabus/pkg/kinds"
)

// Controller is a CompositeController as the services see it, through the
// kinds seam. It is immutable.
type Controller struct {
	CC  *v1alpha1.CompositeController
	obj *unstructured.Unstructured
}

var _ kinds.Controller = (*Controller)(nil)

// New decodes a CompositeController object (the kind table's Decode).
func New(obj *unstructured.Unstructured) (kinds.Controller, error) {
	cc, err := Decode(obj)
	if err != nil {
		return nil, err
	}
	return &Controller{CC: cc, obj: obj}, nil
}

// Object is the controller object.
func (c *Controller) Object() *unstructured.Unstructured { return c.obj }

// Ref identifies the controller on the bus.
func (c *Controller) Ref() bus.ControllerRef {
	return bus.ControllerRef{Kind: v1alpha1.CompositeControllerKind, Name: c.obj.GetName(), UID: string(c.obj.GetUID())}
}

// FinalizerName is the controller's finalizer name.
func (c *Controller) FinalizerName() string { return Finalizer(c.CC.Name) }

// Finalizer is the finalizer while the controller has a finalize hook.
func (c *Controller) Finalizer() string { return ControllerFinalizer(c.CC) }

// ResyncPeriodSeconds is spec.resyncPeriodSeconds.
func (c *Controller) ResyncPeriodSeconds() *int32 { return c.CC.Spec.ResyncPeriodSeconds }
