package mapctl

import (
	"fmt"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/metabus/metabus/pkg/apiresource"
	"github.com/metabus/metabus/pkg/kinds"
	"github.com/metabus/metabus/pkg/snapshot"
)

// WatchResources lists the parent, input and output resources, in spec
// order, for the admin's policy: inputs are watched like everything else,
// so a policy that forbids a resource forbids mapping it too.
func (c *Controller) WatchResources() []kinds.WatchedResource {
	spec := &c.MC.Spec
	out := make([]kinds.WatchedResource, 0, 1+len(spec.InputResources)+len(spec.OutputResources))
	out = append(out, kinds.WatchedResource{Field: "spec.parentResource",
		APIVersion: spec.ParentResource.APIVersion, Resource: spec.ParentResource.Resource})
	for i, r := range spec.InputResources {
		out = append(out, kinds.WatchedResource{Field: fmt.Sprintf("spec.inputResources[%d]", i),
			APIVersion: r.APIVersion, Resource: r.Resource})
	}
	for i, r := range spec.OutputResources {
		out = append(out, kinds.WatchedResource{Field: fmt.Sprintf("spec.outputResources[%d]", i),
			APIVersion: r.APIVersion, Resource: r.Resource})
	}
	return out
}

// WatchPlan resolves the resources: the parent resource is the only parent
// source (every parent is selected: spec.selector chooses inputs, not
// parents), the outputs are the owned sources (never adopted: an input can
// be selected by several parents, so an orphan's key does not say whose it
// is), and the inputs are the keyed plan's sources.
//
// The parent needs the status subresource: metabus writes its aggregated
// status there, and without it every status write would bump the parent's
// generation and re-map every key, forever. Its status changes are not
// events for the same reason (they are metabus's own).
func (c *Controller) WatchPlan(resolve kinds.WatchResolver) (*kinds.WatchPlan, error) {
	spec := &c.MC.Spec
	parentRes, err := resolve(spec.ParentResource.APIVersion, spec.ParentResource.Resource)
	if err != nil {
		return nil, fmt.Errorf("spec.parentResource: %w", err)
	}
	if !parentRes.HasStatus {
		return nil, fmt.Errorf("parent resource %s does not have subresource 'status' enabled (the aggregated status is written there)", parentRes.GVR)
	}
	scopes := Scopes{Parent: parentRes.Namespaced}
	rules := &watchRules{}
	for i, r := range spec.InputResources {
		res, err := resolve(r.APIVersion, r.Resource)
		if err != nil {
			return nil, fmt.Errorf("spec.inputResources[%d]: %w", i, err)
		}
		rules.inputs = append(rules.inputs, res)
		scopes.Inputs = append(scopes.Inputs, res.Namespaced)
	}
	for i, r := range spec.OutputResources {
		res, err := resolve(r.APIVersion, r.Resource)
		if err != nil {
			return nil, fmt.Errorf("spec.outputResources[%d]: %w", i, err)
		}
		rules.outputs = append(rules.outputs, res)
		scopes.Outputs = append(scopes.Outputs, res.Namespaced)
	}
	if err := CheckScopes(scopes); err != nil {
		return nil, err
	}
	return &kinds.WatchPlan{
		Parents: []kinds.WatchParent{{Res: parentRes, IgnoreStatusChanges: true}},
		Owned:   rules.outputs,
		Rules:   rules,
		Keyed:   &kinds.KeyedPlan{Inputs: rules.inputs, Rules: rules},
	}, nil
}

// watchRules are a MapController's watch decisions, per parent and per
// key.
type watchRules struct {
	inputs, outputs []*apiresource.Resource
}

var (
	_ kinds.WatchRules = (*watchRules)(nil)
	_ kinds.KeyedRules = (*watchRules)(nil)
)

// Selects is true: every object of the parent resource is a parent.
func (r *watchRules) Selects(*unstructured.Unstructured) bool { return true }

// OwnerRef is the output's controller reference (the watcher checks that
// it names a cached parent).
func (r *watchRules) OwnerRef(obj *unstructured.Unstructured) *metav1.OwnerReference {
	return metav1.GetControllerOfNoCopy(obj)
}

// WantsOrphan is never asked (the plan does not adopt).
func (r *watchRules) WantsOrphan(_, _ *unstructured.Unstructured) bool { return false }

// Observe lists every output the parent controls, per output resource, of
// every key (and untagged ones): what the per-parent status counts.
func (r *watchRules) Observe(_ *apiresource.Resource, parent *unstructured.Unstructured, caches []kinds.WatchCache) ([]snapshot.Group, string) {
	uid := string(parent.GetUID())
	groups := make([]snapshot.Group, len(caches))
	for i, h := range caches {
		groups[i] = snapshot.GroupOf(r.outputs[i])
		groups[i].Objects = append(groups[i].Objects, h.OwnedBy(uid)...)
	}
	return groups, ""
}

// ReleaseOnReplace releases nothing: there is no finalizer.
func (r *watchRules) ReleaseOnReplace(*kinds.WatchPlan) []bool { return nil }

// InputKey is the map key of an object of an input resource.
func (r *watchRules) InputKey(res *apiresource.Resource, input *unstructured.Unstructured) (string, bool) {
	ref, err := InputRefOf(res.APIVersion(), res.Kind, input)
	if err != nil {
		return "", false
	}
	return ref.Key(), true
}

// InputSelector is SelectInputs.
func (r *watchRules) InputSelector(parent *unstructured.Unstructured) (kinds.InputSelector, error) {
	s, err := SelectInputs(parent)
	if err != nil {
		return nil, err
	}
	return s, nil
}

// OutputKey is KeyOf.
func (r *watchRules) OutputKey(owned *unstructured.Unstructured) (string, bool) { return KeyOf(owned) }

// Summarize is the parent's aggregated status (Aggregate).
func (r *watchRules) Summarize(parent *unstructured.Unstructured, inputs, outputs []snapshot.Group) map[string]any {
	return Aggregate(Observed{Generation: parent.GetGeneration(), Inputs: inputs, Outputs: outputs})
}
