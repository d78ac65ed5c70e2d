// Package decorator holds the DecoratorController rules shared by the
// watcher, dispatcher and applier: which objects a controller targets
// (label and annotation selectors keyed by group and kind), which hook a
// target gets, and how a hook's labels, annotations and status turn into
// writes on the target. It is pure: no I/O.
package decorator

import (
	"encoding/json"
	"fmt"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/metabus/metabus/pkg/api/v1alpha1"
	"github.com/metabus/metabus/pkg/bus"
	"github.com/metabus/metabus/pkg/composite"
)

// ControllerAnnotation marks an attachment with the name of the
// DecoratorController that manages it. Together with a controller
// ownerReference to the target it is what makes an object an attachment
// (upstream Metacontroller's contract; there is no adoption).
const ControllerAnnotation = "metacontroller.k8s.io/decorator-controller"

// Finalizer is the finalizer of a DecoratorController with a finalize hook.
func Finalizer(name string) string { return "metacontroller.io/decoratorcontroller-" + name }

// ControllerFinalizer is the finalizer the controller puts on targets (""
// when it has no finalize hook).
func ControllerFinalizer(dc *v1alpha1.DecoratorController) string {
	if dc.Spec.Hooks == nil || dc.Spec.Hooks.Finalize == nil {
		return ""
	}
	return Finalizer(dc.Name)
}

// Decode decodes a DecoratorController from its unstructured form.
func Decode(obj *unstructured.Unstructured) (*v1alpha1.DecoratorController, error) {
	if obj == nil {
		return nil, fmt.Errorf("no DecoratorController object")
	}
	data, err := json.Marshal(obj.Object)
	if err != nil {
		return nil, fmt.Errorf("encode controller: %w", err)
	}
	var dc v1alpha1.DecoratorController
	if err := json.Unmarshal(data, &dc); err != nil {
		return nil, fmt.Errorf("decode DecoratorController %s: %w", obj.GetName(), err)
	}
	return &dc, nil
}

// IsAttachment reports whether obj is marked as managed by the named
// DecoratorController (the ownerReference is checked separately).
func IsAttachment(obj *unstructured.Unstructured, controller string) bool {
	return obj.GetAnnotations()[ControllerAnnotation] == controller
}

// Hook kinds.
const (
	HookSync     = bus.HookSync
	HookFinalize = bus.HookFinalize
)

// ChooseHook picks the hook for a target. A target is finalized when it is
// being deleted or no longer selected (opt-out), and only if it carries the
// controller's finalizer: without it the controller never committed to
// cleaning up (no finalize hook, or never synced with one), so there is
// nothing to call and kind is "". Otherwise the sync hook is chosen; hook is
// nil when the controller declares none.
func ChooseHook(dc *v1alpha1.DecoratorController, target *unstructured.Unstructured, selected bool) (hook *v1alpha1.Hook, kind string, finalizing bool) {
	hs := dc.Spec.Hooks
	if hs == nil {
		hs = &v1alpha1.DecoratorControllerHooks{}
	}
	if target.GetDeletionTimestamp() != nil || !selected {
		if hs.Finalize == nil || !composite.HasFinalizer(target, Finalizer(dc.Name)) {
			return nil, "", true
		}
		return hs.Finalize, HookFinalize, true
	}
	return hs.Sync, HookSync, false
}
