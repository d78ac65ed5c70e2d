package watcher

import (
	"fmt"
	"strings"

	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/metabus/metabus/pkg/api/v1alpha1"
	"github.com/metabus/metabus/pkg/hookapi"
	"github.com/metabus/metabus/pkg/related"
)

// namedResource is one resource a controller makes the watcher watch, and
// the field that names it (spec.parentResource, relatedResources[0]...).
type namedResource struct {
	field string
	v1alpha1.ResourceRule
}

// compositeResources lists what a CompositeController's spec names.
func compositeResources(spec v1alpha1.CompositeControllerSpec) []namedResource {
	out := []namedResource{{field: "spec.parentResource", ResourceRule: spec.ParentResource.ResourceRule}}
	for i, c := range spec.ChildResources {
		out = append(out, namedResource{field: fmt.Sprintf("spec.childResources[%d]", i), ResourceRule: c.ResourceRule})
	}
	return out
}

// decoratorResources lists what a DecoratorController's spec names.
func decoratorResources(spec v1alpha1.DecoratorControllerSpec) []namedResource {
	var out []namedResource
	for i, r := range spec.Resources {
		out = append(out, namedResource{field: fmt.Sprintf("spec.resources[%d]", i), ResourceRule: r.ResourceRule})
	}
	for i, a := range spec.Attachments {
		out = append(out, namedResource{field: fmt.Sprintf("spec.attachments[%d]", i), ResourceRule: a.ResourceRule})
	}
	return out
}

// relatedResources lists what a customize hook's related rules name. The
// dispatcher checked them against its own --related-resources, but the
// watcher, which starts the informers, checks them again against its
// policy: a dispatcher allowing more, or anyone else who may publish rules,
// cannot make it watch what its admin refused.
func relatedResources(rules []hookapi.RelatedResourceRule) []namedResource {
	out := make([]namedResource, len(rules))
	for i, r := range rules {
		out[i] = namedResource{field: fmt.Sprintf("relatedResources[%d]", i), ResourceRule: v1alpha1.ResourceRule{APIVersion: r.APIVersion, Resource: r.Resource}}
	}
	return out
}

// refusedError lists the resources of a controller (or of a customize
// hook's related rules) that the admin's policy does not let it watch.
type refusedError struct {
	refusals []string
}

func (e *refusedError) Error() string { return strings.Join(e.refusals, "; ") }

// refuse returns a *refusedError for the resources policy does not allow,
// nil if it allows them all. The names are checked as written: discovery
// resolves exactly the plural resource of an apiVersion, so what is checked
// is what would be watched. An apiVersion that does not parse is left to
// discovery, which cannot resolve it either.
func refuse(policy related.Policy, named []namedResource) error {
	var refusals []string
	for _, n := range named {
		gv, err := schema.ParseGroupVersion(n.APIVersion)
		if err != nil || policy.Allows(gv.Group, n.Resource) {
			continue
		}
		refusals = append(refusals, fmt.Sprintf("%s (%s %s): %s", n.field, n.APIVersion, n.Resource, policy.Refusal(gv.Group, n.Resource)))
	}
	if len(refusals) == 0 {
		return nil
	}
	return &refusedError{refusals: refusals}
}
