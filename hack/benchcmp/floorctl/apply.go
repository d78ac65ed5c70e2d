package main

import (
	"maps"
	"reflect"

	"k8s.io/apimachinery/pkg/util/resourceversion"
)

// The pure part of floorctl: what a hook's answer asks of the API server,
// and when the cache has caught up with the controller's own writes.

// expectation is what a parent's last sync wrote, by resourceVersion: the
// parent's status (parentRV) and each child it created, updated ("" for
// one it deleted). The parent is not synced again until the informers
// have delivered all of it, so no sync sees its own writes half done
// (the second hook call would otherwise see the child without the first
// status, or the reverse, and write again, or conflict).
type expectation struct {
	parentRV string
	children map[string]string // child name → resourceVersion written, "" deleted
}

// caughtUp reports whether the cache holds every write of e: the parent at
// parentRV or later; each child written present at its resourceVersion or
// later, or absent once seen(its resourceVersion) (the informer delivered
// the write and, since, the child's deletion); each child deleted gone.
// observed are the parent's cached children, name → resourceVersion. A
// resourceVersion that does not parse counts as caught up: the wait is
// an optimisation, never a reason to stop syncing.
//
// The cached objects' own resourceVersions decide, not only the
// informer's mark: the informer updates its cache before it hands an
// event to the handlers (which enqueue the parent), and its mark after,
// so a sync woken by the event reads the cache, not the mark, as caught
// up.
func caughtUp(e expectation, parentRV string, observed map[string]string, seen func(rv string) bool) bool {
	if e.parentRV != "" && !atLeast(parentRV, e.parentRV) {
		return false
	}
	for name, want := range e.children {
		got, ok := observed[name]
		switch {
		case want == "":
			if ok {
				return false
			}
		case ok:
			if !atLeast(got, want) {
				return false
			}
		case !seen(want):
			return false
		}
	}
	return true
}

// atLeast reports whether resourceVersion got is want or later.
func atLeast(got, want string) bool {
	c, err := resourceversion.CompareResourceVersion(got, want)
	return err != nil || c >= 0
}

// desiredStatus is the status the parent is written with: the hook's,
// with observedGeneration set to the parent's metadata.generation, as
// upstream writes it (and compares it).
func desiredStatus(hook map[string]any, generation int64) map[string]any {
	out := make(map[string]any, len(hook)+1)
	maps.Copy(out, hook)
	out["observedGeneration"] = generation
	return out
}

// childDiffers reports whether applying desired to observed would change
// it: some field desired sets (outside metadata, where only labels and
// annotations count) has another value in observed. Fields observed has
// and desired leaves out are the API server's or other writers' and do not
// count (no three-way merge: the floor's hook never removes a field).
func childDiffers(observed, desired map[string]any) bool {
	for k, dv := range desired {
		if k == "metadata" {
			dm, _ := dv.(map[string]any)
			om, _ := observed["metadata"].(map[string]any)
			for _, f := range []string{"labels", "annotations"} {
				if d, ok := dm[f]; ok && !contains(om[f], d) {
					return true
				}
			}
			continue
		}
		if !contains(observed[k], dv) {
			return true
		}
	}
	return false
}

// contains reports whether o holds d: equal values, or for objects every
// key of d present in o with a value o holds.
func contains(o, d any) bool {
	dm, dIsMap := d.(map[string]any)
	om, oIsMap := o.(map[string]any)
	if dIsMap && oIsMap {
		for k, dv := range dm {
			ov, ok := om[k]
			if !ok || !contains(ov, dv) {
				return false
			}
		}
		return true
	}
	return reflect.DeepEqual(o, d)
}

// mergeChild is the body of a child's update: observed (with its
// resourceVersion, so the write is conditional) with desired's fields laid
// over it, objects merged key by key; of desired's metadata only labels
// and annotations. observed is not modified.
func mergeChild(observed, desired map[string]any) map[string]any {
	out := maps.Clone(observed)
	for k, dv := range desired {
		if k != "metadata" {
			out[k] = overlay(observed[k], dv)
		}
	}
	om, _ := observed["metadata"].(map[string]any)
	meta := maps.Clone(om)
	if meta == nil {
		meta = map[string]any{}
	}
	if dm, ok := desired["metadata"].(map[string]any); ok {
		for _, f := range []string{"labels", "annotations"} {
			if d, ok := dm[f]; ok {
				meta[f] = overlay(om[f], d)
			}
		}
	}
	out["metadata"] = meta
	return out
}

// overlay returns d laid over o: for two objects a new object with o's
// keys and d's, merged recursively; otherwise d.
func overlay(o, d any) any {
	dm, dIsMap := d.(map[string]any)
	om, oIsMap := o.(map[string]any)
	if !dIsMap || !oIsMap {
		return d
	}
	out := maps.Clone(om)
	for k, dv := range dm {
		out[k] = overlay(om[k], dv)
	}
	return out
}

// withSelectorLabel is desired with the label controller-uid: uid when the
// controller generates its selector and desired does not set the label,
// as upstream adds it to every desired child before comparing or writing;
// otherwise desired itself. desired is not modified.
func withSelectorLabel(desired map[string]any, uid string, generateSelector bool) map[string]any {
	if !generateSelector {
		return desired
	}
	dm, _ := desired["metadata"].(map[string]any)
	labels, _ := dm["labels"].(map[string]any)
	if _, ok := labels["controller-uid"]; ok {
		return desired
	}
	labels = maps.Clone(labels)
	if labels == nil {
		labels = map[string]any{}
	}
	labels["controller-uid"] = uid
	meta := maps.Clone(dm)
	if meta == nil {
		meta = map[string]any{}
	}
	meta["labels"] = labels
	out := maps.Clone(desired)
	out["metadata"] = meta
	return out
}

// newChild is the body of a child's create: desired in the parent's
// namespace, controlled by the parent (the ownerReference upstream sets).
// desired is not modified.
func newChild(desired map[string]any, parent ownerRef) map[string]any {
	out := maps.Clone(desired)
	dm, _ := desired["metadata"].(map[string]any)
	meta := maps.Clone(dm)
	if meta == nil {
		meta = map[string]any{}
	}
	meta["namespace"] = parent.namespace
	meta["ownerReferences"] = []any{map[string]any{
		"apiVersion":         parent.apiVersion,
		"kind":               parent.kind,
		"name":               parent.name,
		"uid":                parent.uid,
		"controller":         true,
		"blockOwnerDeletion": true,
	}}
	out["metadata"] = meta
	return out
}

// ownerRef names a parent for its children's ownerReference.
type ownerRef struct {
	apiVersion, kind, namespace, name, uid string
}
