package mapctl

import (
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/metabus/metabus/pkg/hookapi"
	"github.com/metabus/metabus/pkg/snapshot"
)

// TombstoneDecision is what happens to the outputs of one detached key.
type TombstoneDecision struct {
	// Keep and Delete have one group per output group, in order (Objects
	// empty, not nil, when nothing is in them). Outputs already being
	// deleted are in neither: there is nothing to write for them, and
	// nothing can keep them.
	Keep, Delete []snapshot.Group
	// Unknown are entries of the tombstone answer that name no observed
	// output of the key. They are ignored (a tombstone hook can neither
	// create nor adopt), but worth an Event: the hook may be answering
	// with the wrong names.
	Unknown []*unstructured.Unstructured
}

// outputID identifies an output: API group (not version: another version
// names the same object), kind, namespace ("" when cluster-scoped), name.
type outputID struct{ group, kind, namespace, name string }

// DecideTombstone splits the outputs of one detached key (ForKey) into
// those kept and those deleted. answer is the tombstone hook's answer, or
// nil when the controller has no tombstone hook: then every output is
// deleted. Otherwise the outputs it lists are kept and the rest deleted.
//
// An entry names an output by API group, kind, namespace and name. Under a
// namespaced parent an entry without a namespace means the parent's, as
// for desired children; for a cluster-scoped output type the entry's
// namespace is ignored. Nothing but the identity of an entry is used: kept
// outputs stay as they are.
func DecideTombstone(outputs []snapshot.Group, answer *hookapi.TombstoneResponse, parentNamespace string) TombstoneDecision {
	// The scope of each output type, to read entries as the API would.
	namespaced := map[[2]string]bool{}
	for _, g := range outputs {
		namespaced[[2]string{apiGroup(g.APIVersion), g.Kind}] = g.Namespaced
	}
	keep := map[outputID]bool{}
	var entries []outputID // parallel to answer.Outputs
	if answer != nil {
		entries = make([]outputID, len(answer.Outputs))
		for i, e := range answer.Outputs {
			if e == nil {
				continue
			}
			gv, err := schema.ParseGroupVersion(e.GetAPIVersion())
			if err != nil {
				continue // names nothing; reported as unknown below
			}
			id := outputID{gv.Group, e.GetKind(), e.GetNamespace(), e.GetName()}
			if ns, known := namespaced[[2]string{id.group, id.kind}]; known {
				switch {
				case !ns:
					id.namespace = ""
				case id.namespace == "":
					id.namespace = parentNamespace
				}
			}
			entries[i] = id
			keep[id] = true
		}
	}

	d := TombstoneDecision{Keep: make([]snapshot.Group, len(outputs)), Delete: make([]snapshot.Group, len(outputs))}
	seen := map[outputID]bool{}
	for i, g := range outputs {
		d.Keep[i], d.Delete[i] = emptyLike(g), emptyLike(g)
		group := apiGroup(g.APIVersion)
		for _, o := range g.Objects {
			if o == nil {
				continue
			}
			id := outputID{group, g.Kind, o.GetNamespace(), o.GetName()}
			if !g.Namespaced {
				id.namespace = ""
			}
			seen[id] = true
			switch {
			case o.GetDeletionTimestamp() != nil:
			case keep[id]:
				d.Keep[i].Objects = append(d.Keep[i].Objects, o)
			default:
				d.Delete[i].Objects = append(d.Delete[i].Objects, o)
			}
		}
	}
	for i, id := range entries {
		if e := answer.Outputs[i]; e != nil && !seen[id] {
			d.Unknown = append(d.Unknown, e)
		}
	}
	return d
}

// emptyLike is a group of g's resource with no objects.
func emptyLike(g snapshot.Group) snapshot.Group {
	return snapshot.Group{APIVersion: g.APIVersion, Resource: g.Resource, Kind: g.Kind, Namespaced: g.Namespaced,
		Objects: []*unstructured.Unstructured{}}
}

// apiGroup is the group of an apiVersion ("" for the core group, and for
// one that does not parse: it then matches nothing declared).
func apiGroup(apiVersion string) string {
	gv, err := schema.ParseGroupVersion(apiVersion)
	if err != nil {
		return "\x00" + apiVersion
	}
	return gv.Group
}
