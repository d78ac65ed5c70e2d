package related

import (
	"fmt"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/metabus/metabus/pkg/api/v1alpha1"
	"github.com/metabus/metabus/pkg/apiresource"
	"github.com/metabus/metabus/pkg/bus"
	"github.com/metabus/metabus/pkg/hookapi"
	"github.com/metabus/metabus/pkg/snapshot"
)

// Accept takes in a customize hook's related rules for parent as metabus
// does where they enter it (the dispatcher, and `metabus render`, which
// must refuse what the dispatcher refuses): each must be valid for the
// hook version and the parent's namespace, and name a resource policy
// allows (a *RefusedError otherwise). It returns them as the dispatcher
// broadcasts them and sends them with a snapshot request (never nil
// Rules: "no related objects" is an answer too).
func Accept(ctrl bus.ControllerRef, parent *unstructured.Unstructured, version v1alpha1.HookVersion, rules []hookapi.RelatedResourceRule, policy Policy) (*bus.RelatedRules, error) {
	for i, r := range rules {
		if _, err := Compile(r, version, parent.GetNamespace()); err != nil {
			return nil, fmt.Errorf("customize hook returned an invalid relatedResources[%d]: %w", i, err)
		}
		if err := CheckRule(policy, i, r); err != nil {
			return nil, err
		}
	}
	if rules == nil {
		rules = []hookapi.RelatedResourceRule{}
	}
	return &bus.RelatedRules{
		Controller:      ctrl,
		ParentUID:       string(parent.GetUID()),
		ParentNamespace: parent.GetNamespace(),
		HookVersion:     string(version),
		Rules:           rules,
	}, nil
}

// RefusedError is a related rule naming a resource the admin's policy
// (--related-resources) does not let customize hooks watch. The
// dispatcher checks it where the hook's answer enters metabus, before the
// rules are broadcast or sent with a snapshot request: the watcher, which
// starts the informers, only learns rules from dispatchers (NATS
// permissions let no other user publish them). It is the controller's
// fault, not the parent's.
type RefusedError struct {
	Index                int
	APIVersion, Resource string
	Why                  string
}

func (e *RefusedError) Error() string {
	return fmt.Sprintf("customize hook's relatedResources[%d] (%s %s) refused, nothing watched and the sync hook not called: %s",
		e.Index, e.APIVersion, e.Resource, e.Why)
}

// CheckRule refuses rule i of a customize response if policy does not
// allow its resource. The sync fails rather than going on without those
// objects: a hook shown an empty list where objects exist could act on it
// (delete children it believes unneeded).
func CheckRule(policy Policy, i int, r hookapi.RelatedResourceRule) error {
	gv, err := schema.ParseGroupVersion(r.APIVersion)
	if err != nil {
		return fmt.Errorf("customize hook returned an invalid relatedResources[%d]: apiVersion %q: %w", i, r.APIVersion, err)
	}
	if policy.Allows(gv.Group, r.Resource) {
		return nil
	}
	return &RefusedError{Index: i, APIVersion: r.APIVersion, Resource: r.Resource, Why: policy.Refusal(gv.Group, r.Resource)}
}

// Resolved is a compiled rule and the resource it names.
type Resolved struct {
	Res  *apiresource.Resource
	Rule Rule
}

// Resolve compiles a parent's rules and resolves the resources they name
// through resolve (API discovery), in rule order.
func Resolve(rr *bus.RelatedRules, resolve func(apiVersion, resource string) (*apiresource.Resource, error)) ([]Resolved, error) {
	version := v1alpha1.HookVersion(rr.HookVersion)
	out := make([]Resolved, 0, len(rr.Rules))
	for i, r := range rr.Rules {
		res, err := resolve(r.APIVersion, r.Resource)
		if err != nil {
			return nil, fmt.Errorf("relatedResources[%d]: %w", i, err)
		}
		c, err := Compile(r, version, rr.ParentNamespace)
		if err != nil {
			return nil, fmt.Errorf("relatedResources[%d]: %w", i, err)
		}
		out = append(out, Resolved{Res: res, Rule: c})
	}
	return out, nil
}

// Groups lists the objects rules select, as a snapshot shows them to the
// sync hook: one group per resource in the order rules first name it, an
// object selected by several rules once. candidates lists the objects of
// a rule's resource in its namespace (all namespaces for ""); nsLabels
// returns a namespace's labels (for rules with a namespaceSelector).
func Groups(rules []Resolved, candidates func(res *apiresource.Resource, namespace string) []*unstructured.Unstructured, nsLabels func(string) (map[string]string, bool)) []snapshot.Group {
	var groups []snapshot.Group
	index := map[schema.GroupVersionResource]int{}
	seen := map[string]bool{}
	for _, r := range rules {
		gi, found := index[r.Res.GVR]
		if !found {
			gi = len(groups)
			index[r.Res.GVR] = gi
			groups = append(groups, snapshot.Group{
				APIVersion: r.Rule.APIVersion, Resource: r.Res.GVR.Resource, Kind: r.Res.Kind,
				Namespaced: r.Res.Namespaced, Objects: []*unstructured.Unstructured{},
			})
		}
		for _, o := range candidates(r.Res, r.Rule.Namespace) {
			// Live objects are told apart by UID; objects from files
			// (render) may have none.
			id := string(o.GetUID())
			if id == "" {
				id = r.Res.GVR.String() + " " + o.GetNamespace() + "/" + o.GetName()
			}
			if seen[id] || !r.Rule.Matches(o, nsLabels) {
				continue
			}
			seen[id] = true
			groups[gi].Objects = append(groups[gi].Objects, o)
		}
	}
	return groups
}
