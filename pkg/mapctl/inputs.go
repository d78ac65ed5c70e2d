package mapctl

import (
	"encoding/json"
	"fmt"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
)

// InputSelector decides which objects of the input resources are inputs
// of one parent. It is immutable.
type InputSelector struct {
	sel       labels.Selector
	namespace string    // the parent's; "" for a cluster-scoped parent
	parentUID types.UID // to recognise the parent's own outputs
}

// SelectInputs builds the input selector of parent from its duck-typed
// spec.selector (a metav1.LabelSelector). A missing, null or empty
// selector selects every input: unlike a composite parent's selector it
// claims nothing, it only says what to look at, so "everything" is a
// useful default rather than a hazard. A selector that is not a label
// selector, or does not parse, is an error (the parent's sync fails with
// it rather than mapping a set the user did not ask for).
func SelectInputs(parent *unstructured.Unstructured) (*InputSelector, error) {
	if parent == nil {
		return nil, fmt.Errorf("no parent")
	}
	s := &InputSelector{
		sel:       labels.Everything(),
		namespace: parent.GetNamespace(),
		parentUID: parent.GetUID(),
	}
	raw, found, err := unstructured.NestedFieldNoCopy(parent.Object, "spec", "selector")
	if err != nil {
		return nil, fmt.Errorf("spec.selector of %s: %w", objName(parent), err)
	}
	if !found || raw == nil {
		return s, nil
	}
	data, err := json.Marshal(raw)
	if err != nil {
		return nil, fmt.Errorf("encode spec.selector of %s: %w", objName(parent), err)
	}
	var ls metav1.LabelSelector
	if err := json.Unmarshal(data, &ls); err != nil {
		return nil, fmt.Errorf("spec.selector of %s is not a label selector: %w", objName(parent), err)
	}
	if s.sel, err = metav1.LabelSelectorAsSelector(&ls); err != nil {
		return nil, fmt.Errorf("spec.selector of %s: %w", objName(parent), err)
	}
	return s, nil
}

// Namespace is where the parent's inputs live: the parent's namespace, or
// "" (every namespace, and cluster-scoped inputs) for a cluster-scoped
// parent. The watcher lists a namespaced parent's inputs from its
// namespace index rather than scanning every object.
func (s *InputSelector) Namespace() string { return s.namespace }

// Selector is the parent's label selector over inputs (Everything when it
// has none), for listing from an informer.
func (s *InputSelector) Selector() labels.Selector { return s.sel }

// Selects reports whether obj, an object of an input resource, is an input
// of the parent: in the parent's namespace when the parent is namespaced
// (so never a cluster-scoped object), matching its selector, and not
// controlled by the parent itself. The last rule is what lets a resource be
// both input and output (ConfigMaps made from ConfigMaps) without the
// controller mapping its own outputs, however broad the selector.
func (s *InputSelector) Selects(obj *unstructured.Unstructured) bool {
	if obj == nil {
		return false
	}
	if s.namespace != "" && obj.GetNamespace() != s.namespace {
		return false
	}
	if !s.sel.Matches(labels.Set(obj.GetLabels())) {
		return false
	}
	// The UID alone identifies the parent (UIDs are unique across the
	// cluster), so this holds even for a cache object without its kind.
	ref := metav1.GetControllerOfNoCopy(obj)
	return ref == nil || s.parentUID == "" || ref.UID != s.parentUID
}

// Filter returns the objects of objs that Selects, in order.
func (s *InputSelector) Filter(objs []*unstructured.Unstructured) []*unstructured.Unstructured {
	out := make([]*unstructured.Unstructured, 0, len(objs))
	for _, o := range objs {
		if s.Selects(o) {
			out = append(out, o)
		}
	}
	return out
}

func objName(o *unstructured.Unstructured) string {
	if o.GetNamespace() == "" {
		return o.GetName()
	}
	return o.GetNamespace() + "/" + o.GetName()
}
