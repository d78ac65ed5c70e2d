package mapctl

import (
	"sort"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/metabus/metabus/pkg/children"
	"github.com/metabus/metabus/pkg/snapshot"
)

// A parent's observed outputs arrive as snapshot groups, one per output
// resource in spec order, each holding the objects the parent controls.
// The functions below slice them by map key. They never modify the groups
// or objects they are given; the groups they return share the objects.
//
// An owned output without a well-formed MapKeyLabel (the label was edited
// or removed by hand) belongs to no input: no map hook is shown it, no
// sweep deletes it, and only the status totals count it. Deleting what
// cannot be attributed to an input would turn a stray label edit into data
// loss; the parent's deletion still collects it.

// ForKey returns groups restricted to the outputs tagged key: one group per
// input group, in order, with Objects empty (not nil) when none is tagged,
// so that the map hook's outputs map lists every output type. Adopt and
// Release are dropped: a MapController never claims.
func ForKey(groups []snapshot.Group, key string) []snapshot.Group {
	out := make([]snapshot.Group, len(groups))
	for i, g := range groups {
		out[i] = emptyLike(g)
		for _, o := range g.Objects {
			if k, ok := KeyOf(o); ok && k == key {
				out[i].Objects = append(out[i].Objects, o)
			}
		}
	}
	return out
}

// Keys returns the distinct map keys the outputs are tagged with, sorted,
// and the outputs that have none (see above).
func Keys(groups []snapshot.Group) (keys []string, untagged []*unstructured.Unstructured) {
	seen := map[string]bool{}
	for _, g := range groups {
		for _, o := range g.Objects {
			k, ok := KeyOf(o)
			switch {
			case !ok:
				untagged = append(untagged, o)
			case !seen[k]:
				seen[k] = true
				keys = append(keys, k)
			}
		}
	}
	sort.Strings(keys)
	return keys, untagged
}

// Detached returns the keys, sorted, of outputs whose input is not among
// the live ones (the keys of the parent's current inputs): the input was
// deleted, recreated (a new UID is a new key), or is no longer selected.
// Outputs already being deleted are not counted: they are going anyway,
// and a key left with only those needs no tombstone call.
func Detached(groups []snapshot.Group, live map[string]bool) []string {
	seen := map[string]bool{}
	var out []string
	for _, g := range groups {
		for _, o := range g.Objects {
			k, ok := KeyOf(o)
			if !ok || live[k] || seen[k] || o.GetDeletionTimestamp() != nil {
				continue
			}
			seen[k] = true
			out = append(out, k)
		}
	}
	sort.Strings(out)
	return out
}

// OutputOwner is the owner of the outputs parent makes from input: the
// parent (controller reference), with the map key label and the input
// annotation added to every desired output, and a selector on the key so
// that package children rejects an output the tag would not hold. The
// applier plans one key at a time with this owner and only that key's
// observed outputs (ForKey), so outputs of other keys are never touched.
func OutputOwner(parent *unstructured.Unstructured, input InputRef) children.Owner {
	key := input.Key()
	owner := children.OwnerOf(parent)
	owner.Selector = labels.SelectorFromSet(labels.Set{MapKeyLabel: key})
	owner.ExtraLabels = map[string]string{MapKeyLabel: key}
	owner.ExtraAnnotations = map[string]string{InputAnnotation: input.Annotation()}
	return owner
}
