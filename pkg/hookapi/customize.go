package hookapi

import (
	"errors"
	"fmt"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/metabus/metabus/pkg/api/v1alpha1"
)

// CustomizeRequest is the body sent to the customize hook of either controller kind. For a
// DecoratorController, Parent is the decorated target (upstream uses the same field name).
type CustomizeRequest struct {
	Controller any                        `json:"controller"`
	Parent     *unstructured.Unstructured `json:"parent"`
}

// CustomizeResponse is the body returned by a customize hook.
type CustomizeResponse struct {
	RelatedResources []RelatedResourceRule `json:"relatedResources"`
}

// RelatedResourceRule selects related objects whose observed state the sync and finalize hooks
// receive under "related". Check it with Validate before use.
type RelatedResourceRule struct {
	APIVersion string `json:"apiVersion"`
	Resource   string `json:"resource"`
	// LabelSelector selects by labels; an empty selector ({}) selects everything.
	LabelSelector *metav1.LabelSelector `json:"labelSelector,omitempty"`
	// NamespaceSelector restricts namespaced objects to namespaces whose labels match.
	NamespaceSelector *metav1.LabelSelector `json:"namespaceSelector,omitempty"`
	// Namespace restricts namespaced objects to one namespace.
	Namespace string `json:"namespace,omitempty"`
	// Names selects individual objects by name.
	Names []string `json:"names,omitempty"`
}

// Validate checks one rule returned by a customize hook of the given version ("" means v1)
// against the combination rules of upstream Metacontroller. parentNamespace is the namespace of
// the parent (or decorator target), "" for a cluster-scoped one; it is a string rather than a
// bool because a v1 rule of a namespaced parent may name a namespace only if it is the parent's.
//
// The rules:
//   - apiVersion and resource are required;
//   - names cannot be combined with labelSelector or namespaceSelector, and an entry of names
//     must not be empty;
//   - namespace cannot be combined with namespaceSelector;
//   - v1, namespaced parent: the hook only ever sees the parent's namespace, so namespaceSelector
//     is not allowed and namespace, when set, must equal the parent's;
//   - v2 lifts that restriction (any namespace, any scope);
//   - selectors must be valid label selectors.
//
// Whether the resource exists, and whether a namespace is meaningful for it (cluster-scoped
// resources ignore it), needs discovery and is left to the caller. All problems are reported,
// joined into one error.
func Validate(rule RelatedResourceRule, version v1alpha1.HookVersion, parentNamespace string) error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }

	if rule.APIVersion == "" {
		bad("apiVersion is required")
	}
	if rule.Resource == "" {
		bad("resource is required")
	}
	if len(rule.Names) > 0 && (rule.LabelSelector != nil || rule.NamespaceSelector != nil) {
		bad("names cannot be combined with labelSelector or namespaceSelector")
	}
	for i, n := range rule.Names {
		if n == "" {
			bad("names[%d] is empty", i)
		}
	}
	if rule.Namespace != "" && rule.NamespaceSelector != nil {
		bad("namespace cannot be combined with namespaceSelector")
	}
	if version != v1alpha1.HookVersionV2 && parentNamespace != "" {
		if rule.NamespaceSelector != nil {
			bad("namespaceSelector is not allowed for a namespaced parent with hook version v1 (use v2)")
		}
		if rule.Namespace != "" && rule.Namespace != parentNamespace {
			bad("namespace %q differs from the parent's namespace %q, which hook version v1 requires (use v2)", rule.Namespace, parentNamespace)
		}
	}
	if rule.LabelSelector != nil {
		if _, err := metav1.LabelSelectorAsSelector(rule.LabelSelector); err != nil {
			bad("invalid labelSelector: %w", err)
		}
	}
	if rule.NamespaceSelector != nil {
		if _, err := metav1.LabelSelectorAsSelector(rule.NamespaceSelector); err != nil {
			bad("invalid namespaceSelector: %w", err)
		}
	}
	if len(errs) == 0 {
		return nil
	}
	return fmt.Errorf("hookapi: related resource rule %s %q: %w", rule.APIVersion, rule.Resource, errors.Join(errs...))
}
