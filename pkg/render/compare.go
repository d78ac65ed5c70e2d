package render

import (
	"encoding/json"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"sort"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/metabus/metabus/pkg/apiresource"
	"github.com/metabus/metabus/pkg/apply"
	"github.com/metabus/metabus/pkg/bus"
	"github.com/metabus/metabus/pkg/children"
	"github.com/metabus/metabus/pkg/kinds"
	"github.com/metabus/metabus/pkg/snapshot"
)

// Changes are what applying a desired state would do.
type Changes struct {
	Children []ChildChange `json:"children"`
	// Parent are the changes to the parent itself: its status, and
	// labels, annotations or finalizers (metadata patch).
	Parent []FieldChange `json:"parent,omitempty"`
}

// Any reports a change.
func (c Changes) Any() bool {
	if len(c.Parent) > 0 {
		return true
	}
	for _, ch := range c.Children {
		if ch.Action != Unchanged {
			return true
		}
	}
	return false
}

// Child actions: the applier's (package children's Plan), Recreate being
// a delete of a changed child whose update method is Recreate.
const (
	Create    = "create"
	Update    = "update"
	Recreate  = "recreate"
	Delete    = "delete"
	Unchanged = "unchanged"
)

// ChildChange is one child's fate.
type ChildChange struct {
	Action     string        `json:"action"`
	APIVersion string        `json:"apiVersion"`
	Kind       string        `json:"kind"`
	Namespace  string        `json:"namespace,omitempty"`
	Name       string        `json:"name"`
	Fields     []FieldChange `json:"fields,omitempty"`
}

// FieldChange is one field's value before and after (absent: nil).
type FieldChange struct {
	Path   string `json:"path"`
	Before any    `json:"before,omitempty"`
	After  any    `json:"after,omitempty"`
}

// Compare plans a desired state against the observed children exactly as
// the applier does: the kind's owner and child rules (kinds.Applying), the
// desired children normalized (package children's Normalize: owner labels
// and annotations, namespaces) and the plan of creates, updates (the
// applier's three-way merge, package apply) and deletes (children.Plan).
// An update lists the fields it changes. Observed children must be the
// parent's own (controller reference), as the watcher's snapshot gives
// them. It is pure but for resolve.
func Compare(c kinds.Applying, resolve kinds.WatchResolver, parent *unstructured.Unstructured, observed []snapshot.Group, ds *bus.DesiredState) ([]ChildChange, error) {
	decl := c.ApplyChildRules()
	rules := make([]children.Rule, 0, len(decl.Rules))
	for i, r := range decl.Rules {
		res, err := resolve(r.APIVersion, r.Resource)
		if err != nil {
			return nil, fmt.Errorf("%s[%d]: %w", decl.Field, i, err)
		}
		rules = append(rules, children.Rule{APIVersion: r.APIVersion, Resource: r.Resource, Kind: res.Kind, Namespaced: res.Namespaced, Method: r.Method})
	}
	owner, err := c.ApplyOwner(parent, ds)
	if err != nil {
		return nil, fmt.Errorf("the parent cannot own %s: %w", decl.Noun, err)
	}
	desired, err := children.Normalize(owner, rules, ds.Children)
	if err != nil {
		return nil, fmt.Errorf("the hook's answer would be rejected, nothing applied: %w", err)
	}
	obs := map[int][]*unstructured.Unstructured{}
	for i, g := range observed {
		if i < len(rules) {
			obs[i] = g.Objects
		}
	}
	actions, err := children.Plan(owner, rules, obs, desired)
	if err != nil && actions == nil {
		return nil, fmt.Errorf("plan %s: %w", decl.Noun, err)
	}
	find := func(k children.ChildKey) *unstructured.Unstructured {
		for i, objs := range obs {
			for _, o := range objs {
				ns := ""
				if rules[i].Namespaced {
					ns = o.GetNamespace()
				}
				if rules[i].APIVersion == k.APIVersion && rules[i].Kind == k.Kind && ns == k.Namespace && o.GetName() == k.Name {
					return o
				}
			}
		}
		return nil
	}
	var out []ChildChange
	acted := map[children.ChildKey]bool{}
	for _, a := range actions {
		k := a.Key()
		acted[k] = true
		ch := ChildChange{APIVersion: k.APIVersion, Kind: k.Kind, Namespace: k.Namespace, Name: k.Name}
		switch {
		case a.Op == children.OpCreate:
			ch.Action = Create
		case a.Op == children.OpUpdate:
			ch.Action = Update
			if o := find(k); o != nil {
				ch.Fields = FieldChanges(withoutNoise(o.Object), withoutNoise(a.Object.Object))
			}
		case a.Op == children.OpDelete && a.Reason == children.ReasonChangedRecreate:
			ch.Action = Recreate
			for _, d := range desired {
				if d.Object.GetName() == k.Name && d.Rule.Kind == k.Kind {
					if merged, _, err := apply.UpdateChild(a.Object, d.Object); err == nil {
						ch.Fields = FieldChanges(withoutNoise(a.Object.Object), withoutNoise(merged.Object))
					}
				}
			}
		default:
			ch.Action = Delete
		}
		out = append(out, ch)
	}
	for _, d := range desired {
		ns := ""
		if d.Rule.Namespaced {
			ns = d.Object.GetNamespace()
		}
		k := children.ChildKey{APIVersion: d.Rule.APIVersion, Kind: d.Rule.Kind, Namespace: ns, Name: d.Object.GetName()}
		if !acted[k] {
			out = append(out, ChildChange{Action: Unchanged, APIVersion: k.APIVersion, Kind: k.Kind, Namespace: k.Namespace, Name: k.Name})
		}
	}
	return out, err
}

// ParentChanges are the parent's own writes the kind plans for ds: its
// status, and the metadata patch (labels, annotations, finalizers).
func ParentChanges(c kinds.Applying, parent *unstructured.Unstructured, res *apiresource.Resource, ds *bus.DesiredState) ([]FieldChange, error) {
	plan, err := c.ApplyParent(kinds.ApplyInput{Desired: ds, Parent: parent, ParentResource: res.GVR.Resource, ParentHasStatus: res.HasStatus})
	if err != nil {
		return nil, fmt.Errorf("plan the parent's writes: %w", err)
	}
	var out []FieldChange
	if plan.Patch != nil {
		meta, _ := plan.Patch["metadata"].(map[string]any)
		for _, f := range []string{"labels", "annotations", "finalizers"} {
			if v, ok := meta[f]; ok {
				before, _, _ := unstructured.NestedFieldNoCopy(parent.Object, "metadata", f)
				out = append(out, mergeChanges("metadata."+f, before, v)...)
			}
		}
		if st, ok := plan.Patch["status"]; ok {
			before, _, _ := unstructured.NestedFieldNoCopy(parent.Object, "status")
			out = append(out, FieldChanges(map[string]any{"status": before}, map[string]any{"status": st})...)
		}
	}
	if plan.Status != nil {
		before, _, _ := unstructured.NestedFieldNoCopy(parent.Object, "status")
		out = append(out, FieldChanges(map[string]any{"status": before}, map[string]any{"status": plan.Status})...)
	}
	if plan.RemoveFinalizer != "" {
		out = append(out, FieldChange{Path: "metadata.finalizers", Before: plan.RemoveFinalizer, After: "(removed)"})
	}
	return out, nil
}

// mergeChanges is the effect of a JSON merge patch value on a field: a map
// sets or (null) deletes keys, anything else replaces the field.
func mergeChanges(path string, before, patch any) []FieldChange {
	pm, ok := patch.(map[string]any)
	if !ok {
		if jsonEqual(before, patch) {
			return nil
		}
		return []FieldChange{{Path: path, Before: before, After: patch}}
	}
	bm, _ := before.(map[string]any)
	var out []FieldChange
	for _, k := range sortedKeys(pm) {
		old, had := bm[k]
		switch v := pm[k]; {
		case v == nil && had:
			out = append(out, FieldChange{Path: path + "." + k, Before: old})
		case v != nil && !jsonEqual(old, v):
			out = append(out, FieldChange{Path: path + "." + k, Before: old, After: v})
		}
	}
	return out
}

// withoutNoise drops what every write changes or the API server owns, so
// that a diff shows what the hook changed: the last-applied annotation,
// resourceVersion, managedFields and the like.
func withoutNoise(obj map[string]any) map[string]any {
	out := make(map[string]any, len(obj))
	for k, v := range obj {
		out[k] = v
	}
	meta, ok := obj["metadata"].(map[string]any)
	if !ok {
		return out
	}
	m := make(map[string]any, len(meta))
	for k, v := range meta {
		switch k {
		case "resourceVersion", "managedFields", "uid", "generation", "creationTimestamp", "selfLink":
			continue
		}
		m[k] = v
	}
	if ann, ok := meta["annotations"].(map[string]any); ok {
		a := make(map[string]any, len(ann))
		for k, v := range ann {
			if k != apply.LastAppliedAnnotation {
				a[k] = v
			}
		}
		if len(a) == 0 {
			delete(m, "annotations")
		} else {
			m["annotations"] = a
		}
	}
	out["metadata"] = m
	return out
}

// FieldChanges lists the leaf fields that differ between two objects,
// sorted by path. Maps are compared key by key, lists of the same length
// item by item; any other value (lists of different lengths included) as a
// whole, by its JSON encoding (so int64(1) equals 1.0).
func FieldChanges(before, after map[string]any) []FieldChange {
	var out []FieldChange
	diff("", before, after, &out)
	sort.Slice(out, func(i, j int) bool { return out[i].Path < out[j].Path })
	return out
}

func diff(path string, before, after any, out *[]FieldChange) {
	bm, bIsMap := before.(map[string]any)
	am, aIsMap := after.(map[string]any)
	if bIsMap && aIsMap || (before == nil && aIsMap) || (bIsMap && after == nil) {
		keys := map[string]bool{}
		for k := range bm {
			keys[k] = true
		}
		for k := range am {
			keys[k] = true
		}
		for _, k := range sortedKeys(keys) {
			p := k
			if path != "" {
				p = path + "." + k
			}
			diff(p, bm[k], am[k], out)
		}
		return
	}
	// Lists of the same length are compared item by item (a container's
	// changed command, not the whole list of containers).
	if bl, ok := before.([]any); ok {
		if al, ok := after.([]any); ok && len(al) == len(bl) && !jsonEqual(before, after) {
			for i := range bl {
				diff(fmt.Sprintf("%s[%d]", path, i), bl[i], al[i], out)
			}
			return
		}
	}
	if !jsonEqual(before, after) {
		*out = append(*out, FieldChange{Path: path, Before: before, After: after})
	}
}

func sortedKeys[V any](m map[string]V) []string { return slices.Sorted(maps.Keys(m)) }

func jsonEqual(a, b any) bool {
	if reflect.DeepEqual(a, b) {
		return true
	}
	ja, err1 := json.Marshal(a)
	jb, err2 := json.Marshal(b)
	return err1 == nil && err2 == nil && string(ja) == string(jb)
}
