package decorator

import (
	"fmt"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/metabus/metabus/pkg/api/v1alpha1"
)

// ResolvedRule is a resource rule with the kind its resource serves (from
// discovery, or from the target object itself; see RulesForTarget).
type ResolvedRule struct {
	v1alpha1.DecoratorControllerResourceRule
	Kind string
}

// GroupKind is the rule's API group and kind.
func (r ResolvedRule) GroupKind() schema.GroupKind {
	return schema.GroupKind{Group: apiGroup(r.APIVersion), Kind: r.Kind}
}

// Selector decides which objects a DecoratorController targets. Rules are
// keyed by API group and kind, not version: an object read in another
// version of the same resource is the same object. An object is selected
// when it satisfies both the label and the annotation selector of a rule
// for its group and kind (absent selectors match everything). Should a
// controller declare several rules for one group and kind (say, two
// versions), matching any of them is enough; upstream keeps only the last
// one, which silently ignores the others.
type Selector struct {
	byGK map[schema.GroupKind][]matcher
}

type matcher struct {
	labels      labels.Selector
	annotations annotationSelector
}

// NewSelector compiles the rules. A selector that does not parse fails the
// whole controller: guessing would decorate the wrong objects.
func NewSelector(rules []ResolvedRule) (*Selector, error) {
	s := &Selector{byGK: map[schema.GroupKind][]matcher{}}
	for i, r := range rules {
		if r.Kind == "" {
			return nil, fmt.Errorf("spec.resources[%d] (%s %s): kind unknown", i, r.APIVersion, r.Resource)
		}
		m := matcher{labels: labels.Everything()}
		if r.LabelSelector != nil {
			sel, err := metav1.LabelSelectorAsSelector(r.LabelSelector)
			if err != nil {
				return nil, fmt.Errorf("spec.resources[%d].labelSelector: %w", i, err)
			}
			m.labels = sel
		}
		as, err := newAnnotationSelector(r.AnnotationSelector)
		if err != nil {
			return nil, fmt.Errorf("spec.resources[%d].annotationSelector: %w", i, err)
		}
		m.annotations = as
		gk := r.GroupKind()
		s.byGK[gk] = append(s.byGK[gk], m)
	}
	return s, nil
}

// Handles reports whether some rule names the group and kind.
func (s *Selector) Handles(gk schema.GroupKind) bool {
	_, ok := s.byGK[gk]
	return ok
}

// Matches reports whether obj, by its apiVersion's group and its kind, is
// targeted by a rule whose selectors it satisfies.
func (s *Selector) Matches(obj *unstructured.Unstructured) bool {
	gk := schema.GroupKind{Group: apiGroup(obj.GetAPIVersion()), Kind: obj.GetKind()}
	return s.MatchesMeta(gk, obj.GetLabels(), obj.GetAnnotations())
}

// MatchesMeta is Matches on the parts it looks at.
func (s *Selector) MatchesMeta(gk schema.GroupKind, lbls, annotations map[string]string) bool {
	for _, m := range s.byGK[gk] {
		if m.labels.Matches(labels.Set(lbls)) && m.annotations.matches(annotations) {
			return true
		}
	}
	return false
}

// RulesForTarget resolves, without discovery, the rules that can apply to
// a target whose resource name is known (a work item and a snapshot carry
// it): a rule applies when it names the target's API group and resource,
// and then its kind is the target's. The dispatcher uses it to tell a
// selected target from one that opted out.
func RulesForTarget(spec v1alpha1.DecoratorControllerSpec, target *unstructured.Unstructured, resource string) []ResolvedRule {
	group := apiGroup(target.GetAPIVersion())
	var out []ResolvedRule
	for _, r := range spec.Resources {
		if apiGroup(r.APIVersion) == group && r.Resource == resource {
			out = append(out, ResolvedRule{DecoratorControllerResourceRule: r, Kind: target.GetKind()})
		}
	}
	return out
}

// Selected reports whether the controller selects target, a resource
// object of the named plural resource.
func Selected(spec v1alpha1.DecoratorControllerSpec, target *unstructured.Unstructured, resource string) (bool, error) {
	s, err := NewSelector(RulesForTarget(spec, target, resource))
	if err != nil {
		return false, err
	}
	return s.Matches(target), nil
}

// annotationSelector is a label selector over annotations. It is evaluated
// directly rather than through labels.Selector because annotation values
// are free-form: "80:8080,443:8443" is a fine annotation value but not a
// valid label value, and label-selector parsing would reject it.
type annotationSelector struct {
	match map[string]string
	exprs []requirement
}

type requirement struct {
	key    string
	op     metav1.LabelSelectorOperator
	values map[string]bool
}

func newAnnotationSelector(s *v1alpha1.AnnotationSelector) (annotationSelector, error) {
	var out annotationSelector
	if s == nil {
		return out, nil
	}
	for k := range s.MatchAnnotations {
		if errs := validation.IsQualifiedName(k); len(errs) > 0 {
			return out, fmt.Errorf("matchAnnotations key %q: %s", k, strings.Join(errs, "; "))
		}
	}
	out.match = s.MatchAnnotations
	for i, e := range s.MatchExpressions {
		if errs := validation.IsQualifiedName(e.Key); len(errs) > 0 {
			return out, fmt.Errorf("matchExpressions[%d].key %q: %s", i, e.Key, strings.Join(errs, "; "))
		}
		r := requirement{key: e.Key, op: e.Operator, values: map[string]bool{}}
		for _, v := range e.Values {
			r.values[v] = true
		}
		switch e.Operator {
		case metav1.LabelSelectorOpIn, metav1.LabelSelectorOpNotIn:
			if len(e.Values) == 0 {
				return out, fmt.Errorf("matchExpressions[%d]: operator %s needs values", i, e.Operator)
			}
		case metav1.LabelSelectorOpExists, metav1.LabelSelectorOpDoesNotExist:
			if len(e.Values) != 0 {
				return out, fmt.Errorf("matchExpressions[%d]: operator %s takes no values", i, e.Operator)
			}
		default:
			return out, fmt.Errorf("matchExpressions[%d]: unknown operator %q", i, e.Operator)
		}
		out.exprs = append(out.exprs, r)
	}
	return out, nil
}

// matches has label-selector semantics: every matchAnnotations entry must be
// present with that value, and every expression must hold (NotIn and
// DoesNotExist hold for an absent key).
func (a annotationSelector) matches(annotations map[string]string) bool {
	for k, v := range a.match {
		if got, ok := annotations[k]; !ok || got != v {
			return false
		}
	}
	for _, r := range a.exprs {
		v, ok := annotations[r.key]
		switch r.op {
		case metav1.LabelSelectorOpIn:
			if !ok || !r.values[v] {
				return false
			}
		case metav1.LabelSelectorOpNotIn:
			if ok && r.values[v] {
				return false
			}
		case metav1.LabelSelectorOpExists:
			if !ok {
				return false
			}
		case metav1.LabelSelectorOpDoesNotExist:
			if ok {
				return false
			}
		}
	}
	return true
}

// apiGroup returns the group of an apiVersion ("" for the core group).
func apiGroup(apiVersion string) string {
	group, _, found := strings.Cut(apiVersion, "/")
	if !found {
		return ""
	}
	return group
}
