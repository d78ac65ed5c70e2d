// Package composite holds CompositeController rules shared by the watcher,
// dispatcher and applier: how a parent selects its children, which hook a
// parent gets, and the finalizer and label names of the upstream contract.
package composite

import (
	"encoding/json"
	"fmt"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/metabus/metabus/pkg/api/v1alpha1"
	"github.com/metabus/metabus/pkg/bus"
)

// ControllerUIDLabel is the label generateSelector puts on children.
const ControllerUIDLabel = "controller-uid"

// Finalizer is the finalizer of a CompositeController with a finalize hook.
func Finalizer(name string) string { return "metacontroller.io/compositecontroller-" + name }

// Decode decodes a CompositeController from its unstructured form.
func Decode(obj *unstructured.Unstructured) (*v1alpha1.CompositeController, error) {
	if obj == nil {
		return nil, fmt.Errorf("no CompositeController object")
	}
	data, err := json.Marshal(obj.Object)
	if err != nil {
		return nil, fmt.Errorf("encode controller: %w", err)
	}
	var cc v1alpha1.CompositeController
	if err := json.Unmarshal(data, &cc); err != nil {
		return nil, fmt.Errorf("decode CompositeController %s: %w", obj.GetName(), err)
	}
	return &cc, nil
}

// GeneratesSelector reports spec.generateSelector.
func GeneratesSelector(spec v1alpha1.CompositeControllerSpec) bool {
	return spec.GenerateSelector != nil && *spec.GenerateSelector
}

// ParentSelector returns the label selector a parent claims children with:
// controller-uid=<uid> with generateSelector, else the parent's
// spec.selector, which must exist, parse and not be empty (an empty selector
// would claim every object in the namespace).
func ParentSelector(spec v1alpha1.CompositeControllerSpec, parent *unstructured.Unstructured) (labels.Selector, error) {
	if GeneratesSelector(spec) {
		return labels.SelectorFromSet(labels.Set{ControllerUIDLabel: string(parent.GetUID())}), nil
	}
	raw, found, err := unstructured.NestedFieldNoCopy(parent.Object, "spec", "selector")
	if err != nil || !found || raw == nil {
		return nil, fmt.Errorf("parent %s has no spec.selector (and the controller does not set generateSelector)", name(parent))
	}
	data, err := json.Marshal(raw)
	if err != nil {
		return nil, fmt.Errorf("encode spec.selector of %s: %w", name(parent), err)
	}
	var ls metav1.LabelSelector
	if err := json.Unmarshal(data, &ls); err != nil {
		return nil, fmt.Errorf("spec.selector of %s is not a label selector: %w", name(parent), err)
	}
	if len(ls.MatchLabels) == 0 && len(ls.MatchExpressions) == 0 {
		return nil, fmt.Errorf("spec.selector of %s is empty", name(parent))
	}
	sel, err := metav1.LabelSelectorAsSelector(&ls)
	if err != nil {
		return nil, fmt.Errorf("spec.selector of %s: %w", name(parent), err)
	}
	return sel, nil
}

// ExtraLabels are the labels metabus adds to every desired child.
func ExtraLabels(spec v1alpha1.CompositeControllerSpec, parent *unstructured.Unstructured) map[string]string {
	if GeneratesSelector(spec) {
		return map[string]string{ControllerUIDLabel: string(parent.GetUID())}
	}
	return nil
}

// Deselected reports whether the parent no longer matches
// parentResource.labelSelector.
func Deselected(spec v1alpha1.CompositeControllerSpec, parent *unstructured.Unstructured) bool {
	ls := spec.ParentResource.LabelSelector
	if ls == nil {
		return false
	}
	sel, err := metav1.LabelSelectorAsSelector(ls)
	return err == nil && !sel.Matches(labels.Set(parent.GetLabels()))
}

// HasFinalizer reports whether obj carries finalizer f.
func HasFinalizer(obj *unstructured.Unstructured, f string) bool {
	if f == "" {
		return false
	}
	for _, x := range obj.GetFinalizers() {
		if x == f {
			return true
		}
	}
	return false
}

// ControllerFinalizer is the finalizer the controller puts on parents ("" if
// it has no finalize hook).
func ControllerFinalizer(cc *v1alpha1.CompositeController) string {
	if cc.Spec.Hooks == nil || cc.Spec.Hooks.Finalize == nil {
		return ""
	}
	return Finalizer(cc.Name)
}

// gcFinalizers are the garbage collector's own; while one is present the
// collector is still working on the parent's dependents.
var gcFinalizers = []string{metav1.FinalizerDeleteDependents, metav1.FinalizerOrphanDependents}

// WaitingForGC reports a parent being deleted whose garbage-collector
// finalizers are still present. Upstream calls the sync hook then, which
// can recreate children the collector is deleting; metabus waits until the
// collector is done (its finalizer removal is an update that brings the
// parent back).
func WaitingForGC(parent *unstructured.Unstructured) bool {
	if parent.GetDeletionTimestamp() == nil {
		return false
	}
	for _, f := range gcFinalizers {
		if HasFinalizer(parent, f) {
			return true
		}
	}
	return false
}

// ChooseHook picks sync or finalize. finalize runs while the parent is being
// deleted or no longer matches the parent label selector, when the
// controller has a finalize hook; without one there is nothing to call and
// kind is "".
func ChooseHook(cc *v1alpha1.CompositeController, parent *unstructured.Unstructured) (hook *v1alpha1.Hook, kind string, finalizing bool) {
	hs := cc.Spec.Hooks
	if hs == nil {
		hs = &v1alpha1.CompositeControllerHooks{}
	}
	if parent.GetDeletionTimestamp() != nil || Deselected(cc.Spec, parent) {
		if hs.Finalize == nil {
			return nil, "", true
		}
		return hs.Finalize, bus.HookFinalize, true
	}
	return hs.Sync, bus.HookSync, false
}

func name(o *unstructured.Unstructured) string {
	if o.GetNamespace() == "" {
		return o.GetName()
	}
	return o.GetNamespace() + "/" + o.GetName()
}
