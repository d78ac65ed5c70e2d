// Package kinds is the controller-kind seam. A kind of controller
// (CompositeController, DecoratorController, MapController) is a row of the
// table in package kindtable plus a pure core package that implements
// Controller: what the watcher watches for it (Watching), how the dispatcher
// turns a snapshot into hook calls and the answers into one desired state
// (Syncing), and what the applier does with that state (Applying). The
// services drive every kind through these interfaces, one generic path per
// stage, and never switch on a kind's name.
//
// A Controller is decoded once per controller object version and shared:
// implementations are immutable, and callers never modify what they return.
package kinds

import (
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/metabus/metabus/pkg/bus"
)

// Kind is one row of the kind table: a controller API metabus serves.
type Kind struct {
	// Name is the API kind, e.g. "CompositeController". Its bus ID prefix
	// is derived from it (bus.KindIDPrefix).
	Name string
	// GVR is the resource of its controller objects.
	GVR schema.GroupVersionResource
	// Decode turns a controller object into the kind's core. An error
	// means the object is invalid (reported on it, never retried until
	// it changes).
	Decode func(obj *unstructured.Unstructured) (Controller, error)
	// Finalizer is the finalizer a controller of this kind with the given
	// name puts on parents: what must be released when the controller is
	// gone and there is no object left to decode.
	Finalizer func(controllerName string) string
}

// Controller is one controller object, decoded by its kind's core.
type Controller interface {
	// Object is the controller object it was decoded from (sent to hooks
	// as "controller").
	Object() *unstructured.Unstructured
	// Ref identifies it on the bus.
	Ref() bus.ControllerRef
	// FinalizerName is the finalizer this controller puts on parents when
	// it has a finalize hook (whether or not it has one now: a parent
	// still carrying it after the hook was removed must be released).
	FinalizerName() string
	// Finalizer is FinalizerName while the controller has a finalize hook,
	// "" otherwise.
	Finalizer() string
	// ResyncPeriodSeconds is spec.resyncPeriodSeconds (nil: none).
	ResyncPeriodSeconds() *int32

	Watching
	Syncing
	Applying
}
