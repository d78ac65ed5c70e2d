// Package related evaluates customize-hook "related resource" rules: which
// objects a parent's hook must be shown besides its children, and, the other
// way round, which parents care about a changed object. It is pure; the
// watcher keeps the informers and the index.
package related

import (
	"fmt"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/metabus/metabus/pkg/api/v1alpha1"
	"github.com/metabus/metabus/pkg/hookapi"
)

// Rule is a validated rule, ready to match objects.
type Rule struct {
	hookapi.RelatedResourceRule
	// Namespace is the namespace the rule is confined to ("" = all): a v1
	// hook of a namespaced parent only ever sees the parent's namespace.
	Namespace string
	labels    labels.Selector
	nsLabels  labels.Selector
	names     map[string]bool
}

// Compile validates r for a hook version and parent namespace ("" for a
// cluster-scoped parent) and prepares it for matching.
func Compile(r hookapi.RelatedResourceRule, version v1alpha1.HookVersion, parentNamespace string) (Rule, error) {
	if err := hookapi.Validate(r, version, parentNamespace); err != nil {
		return Rule{}, err
	}
	out := Rule{RelatedResourceRule: r, Namespace: r.Namespace}
	if version != v1alpha1.HookVersionV2 && parentNamespace != "" {
		out.Namespace = parentNamespace
	}
	var err error
	if r.LabelSelector != nil {
		if out.labels, err = metav1.LabelSelectorAsSelector(r.LabelSelector); err != nil {
			return Rule{}, fmt.Errorf("labelSelector: %w", err)
		}
	}
	if r.NamespaceSelector != nil {
		if out.nsLabels, err = metav1.LabelSelectorAsSelector(r.NamespaceSelector); err != nil {
			return Rule{}, fmt.Errorf("namespaceSelector: %w", err)
		}
	}
	if len(r.Names) > 0 {
		out.names = map[string]bool{}
		for _, n := range r.Names {
			out.names[n] = true
		}
	}
	return out, nil
}

// NeedsNamespaceLabels reports whether matching needs namespace labels.
func (r Rule) NeedsNamespaceLabels() bool { return r.nsLabels != nil }

// Matches reports whether obj is selected by the rule. nsLabels returns the
// labels of a namespace (false if unknown); it is only called for rules
// with a namespaceSelector. An empty rule selects every object in scope.
func (r Rule) Matches(obj *unstructured.Unstructured, nsLabels func(string) (map[string]string, bool)) bool {
	if obj == nil {
		return false
	}
	if r.Namespace != "" && obj.GetNamespace() != r.Namespace {
		return false
	}
	if r.names != nil && !r.names[obj.GetName()] {
		return false
	}
	if r.labels != nil && !r.labels.Matches(labels.Set(obj.GetLabels())) {
		return false
	}
	if r.nsLabels != nil {
		if obj.GetNamespace() == "" || nsLabels == nil {
			return false
		}
		l, ok := nsLabels(obj.GetNamespace())
		if !ok || !r.nsLabels.Matches(labels.Set(l)) {
			return false
		}
	}
	return true
}
