package hook

import (
	"encoding/json"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// ObjectMap is how a request carries observed objects (children,
// attachments, outputs, related objects): the outer key is
// "<Kind>.<apiVersion>" ("Pod.v1", "StatefulSet.apps/v1"), the inner key
// the object's name, or "<namespace>/<name>" (hook version v2, or a
// namespaced object of a cluster-scoped parent). Every declared type is
// present, as an empty map when nothing of it is observed.
type ObjectMap map[string]map[string]*unstructured.Unstructured

// Of returns the observed objects of one type by key (nil if the type is
// not in the map): req.Children.Of("v1", "Pod").
func (m ObjectMap) Of(apiVersion, kind string) map[string]*unstructured.Unstructured {
	return m[kind+"."+apiVersion]
}

// MarshalJSON writes {} rather than null for a nil map or inner map, as
// metabus does, so that a request built in a test encodes as metabus's.
func (m ObjectMap) MarshalJSON() ([]byte, error) {
	out := make(map[string]map[string]*unstructured.Unstructured, len(m))
	for k, inner := range m {
		if inner == nil {
			inner = map[string]*unstructured.Unstructured{}
		}
		out[k] = inner
	}
	return json.Marshal(out)
}

// CompositeRequest is the body of a CompositeController's sync and
// finalize hooks; Finalizing tells them apart, so one handler can serve
// both.
type CompositeRequest struct {
	// Controller is the whole CompositeController.
	Controller *unstructured.Unstructured `json:"controller"`
	Parent     *unstructured.Unstructured `json:"parent"`
	Children   ObjectMap                  `json:"children"`
	// Related holds what the customize hook selected ({} without one).
	Related    ObjectMap `json:"related"`
	Finalizing bool      `json:"finalizing"`
}

// CompositeResponse is the answer of a CompositeController's sync or
// finalize hook.
type CompositeResponse struct {
	// Status replaces the parent's whole .status.
	Status map[string]any `json:"status"`
	// Children is the complete desired set: observed children left out are
	// deleted. Each needs apiVersion, kind and metadata.name.
	Children []*unstructured.Unstructured `json:"children"`
	// ResyncAfterSeconds asks for one more sync after that delay (> 0).
	ResyncAfterSeconds float64 `json:"resyncAfterSeconds,omitempty"`
	// Finalized, from the finalize hook, says cleanup is complete.
	Finalized bool `json:"finalized,omitempty"`
}

// DecoratorRequest is the body of a DecoratorController's sync and
// finalize hooks.
type DecoratorRequest struct {
	Controller *unstructured.Unstructured `json:"controller"`
	// Object is the decorated target.
	Object      *unstructured.Unstructured `json:"object"`
	Attachments ObjectMap                  `json:"attachments"`
	Related     ObjectMap                  `json:"related"`
	Finalizing  bool                       `json:"finalizing"`
}

// DecoratorResponse is the answer of a DecoratorController's sync or
// finalize hook.
type DecoratorResponse struct {
	// Labels and Annotations are set on the target (a nil value removes
	// the key; keys not mentioned are left alone).
	Labels      map[string]*string `json:"labels"`
	Annotations map[string]*string `json:"annotations"`
	// Status replaces the target's .status when non-nil.
	Status map[string]any `json:"status"`
	// Attachments is the complete desired set of attachments.
	Attachments        []*unstructured.Unstructured `json:"attachments"`
	ResyncAfterSeconds float64                      `json:"resyncAfterSeconds,omitempty"`
	Finalized          bool                         `json:"finalized,omitempty"`
}

// CustomizeRequest is the body of the customize hook of either controller
// kind (for a DecoratorController, Parent is the target).
type CustomizeRequest struct {
	Controller *unstructured.Unstructured `json:"controller"`
	Parent     *unstructured.Unstructured `json:"parent"`
}

// CustomizeResponse is the answer of a customize hook.
type CustomizeResponse struct {
	RelatedResources []RelatedResourceRule `json:"relatedResources"`
}

// RelatedResourceRule selects related objects that the sync and finalize
// hooks then receive under Related.
type RelatedResourceRule struct {
	APIVersion        string                `json:"apiVersion"`
	Resource          string                `json:"resource"`
	LabelSelector     *metav1.LabelSelector `json:"labelSelector,omitempty"`
	NamespaceSelector *metav1.LabelSelector `json:"namespaceSelector,omitempty"`
	Namespace         string                `json:"namespace,omitempty"`
	Names             []string              `json:"names,omitempty"`
}

// MapRequest is the body of a MapController's map hook: one input of one
// parent, and the outputs that parent already has for it.
type MapRequest struct {
	Controller *unstructured.Unstructured `json:"controller"`
	Parent     *unstructured.Unstructured `json:"parent"`
	// MapKey identifies the input; it is opaque (log it, do not parse it).
	MapKey  string                     `json:"mapKey"`
	Input   *unstructured.Unstructured `json:"input"`
	Outputs ObjectMap                  `json:"outputs"`
}

// MapResponse is the answer of a map hook.
type MapResponse struct {
	// Outputs is the complete desired set for this input.
	Outputs            []*unstructured.Unstructured `json:"outputs"`
	ResyncAfterSeconds float64                      `json:"resyncAfterSeconds,omitempty"`
}

// TombstoneRequest is the body of a MapController's tombstone hook, for
// the outputs of an input that is gone.
type TombstoneRequest struct {
	Controller *unstructured.Unstructured `json:"controller"`
	Parent     *unstructured.Unstructured `json:"parent"`
	MapKey     string                     `json:"mapKey"`
	Outputs    ObjectMap                  `json:"outputs"`
}

// TombstoneResponse is the answer of a tombstone hook.
type TombstoneResponse struct {
	// Outputs lists the observed outputs to keep (apiVersion, kind,
	// metadata.namespace and metadata.name); the others are deleted.
	Outputs []*unstructured.Unstructured `json:"outputs"`
}
