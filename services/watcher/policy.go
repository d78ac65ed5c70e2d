package watcher

import (
	"fmt"
	"strings"

	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/metabus/metabus/pkg/hookapi"
	"github.com/metabus/metabus/pkg/kinds"
	"github.com/metabus/metabus/pkg/related"
)

// relatedResources lists what a customize hook's related rules name. The
// dispatcher checked them against its own --related-resources, but the
// watcher, which starts the informers, checks them again against its
// policy: a dispatcher allowing more, or anyone else who may publish rules,
// cannot make it watch what its admin refused.
func relatedResources(rules []hookapi.RelatedResourceRule) []kinds.WatchedResource {
	out := make([]kinds.WatchedResource, len(rules))
	for i, r := range rules {
		out[i] = kinds.WatchedResource{Field: fmt.Sprintf("relatedResources[%d]", i), APIVersion: r.APIVersion, Resource: r.Resource}
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
func refuse(policy related.Policy, named []kinds.WatchedResource) error {
	var refusals []string
	for _, n := range named {
		gv, err := schema.ParseGroupVersion(n.APIVersion)
		if err != nil || policy.Allows(gv.Group, n.Resource) {
			continue
		}
		refusals = append(refusals, fmt.Sprintf("%s (%s %s): %s", n.Field, n.APIVersion, n.Resource, policy.Refusal(gv.Group, n.Resource)))
	}
	if len(refusals) == 0 {
		return nil
	}
	return &refusedError{refusals: refusals}
}
