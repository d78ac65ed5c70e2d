package render

import (
	"encoding/json"
	"fmt"
	"reflect"
	"sort"
	"strings"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/metabus/metabus/pkg/apply"
	"github.com/metabus/metabus/pkg/bus"
	"github.com/metabus/metabus/pkg/discovery"
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

// Child actions.
const (
	Create    = "create"
	Update    = "update"
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

// Compare judges a desired state against the observed parent and
// children as the applier would: a desired child that exists is merged
// into it with the applier's three-way merge (package apply) and the
// merged fields that differ are listed; one that does not exist is
// created; an observed child the answer leaves out is deleted. The parent's
// own writes come from the kind (kinds.Applying.ApplyParent). It is pure.
func Compare(parent *unstructured.Unstructured, owned []*discovery.Resource, observed []snapshot.Group, ds *bus.DesiredState) (Changes, error) {
	var out Changes
	type key struct{ group, kind, ns, name string }
	keyOf := func(apiVersion, kind, ns, name string) key {
		group, _, _ := strings.Cut(apiVersion, "/")
		if !strings.Contains(apiVersion, "/") {
			group = ""
		}
		return key{group, kind, ns, name}
	}
	namespaced := func(apiVersion, kind string) bool {
		k := keyOf(apiVersion, kind, "", "")
		for _, r := range owned {
			if r.GVR.Group == k.group && r.Kind == kind {
				return r.Namespaced
			}
		}
		return parent.GetNamespace() != ""
	}
	seen := map[key]*unstructured.Unstructured{}
	for _, g := range observed {
		for _, o := range g.Objects {
			seen[keyOf(o.GetAPIVersion(), o.GetKind(), o.GetNamespace(), o.GetName())] = o
		}
	}
	wanted := map[key]bool{}
	for _, d := range ds.Children {
		if d == nil {
			continue
		}
		ns := d.GetNamespace()
		if ns == "" && namespaced(d.GetAPIVersion(), d.GetKind()) {
			ns = parent.GetNamespace()
		}
		k := keyOf(d.GetAPIVersion(), d.GetKind(), ns, d.GetName())
		wanted[k] = true
		ch := ChildChange{APIVersion: d.GetAPIVersion(), Kind: d.GetKind(), Namespace: ns, Name: d.GetName()}
		obs := seen[k]
		if obs == nil {
			ch.Action = Create
			ch.Fields = FieldChanges(nil, withoutNoise(d.Object))
			out.Children = append(out.Children, ch)
			continue
		}
		merged, changed, err := apply.UpdateChild(obs, d)
		if err != nil {
			return out, fmt.Errorf("merge %s %s: %w", d.GetKind(), d.GetName(), err)
		}
		ch.Action = Unchanged
		if changed {
			ch.Fields = FieldChanges(withoutNoise(obs.Object), withoutNoise(merged.Object))
			if len(ch.Fields) > 0 {
				ch.Action = Update
			}
		}
		out.Children = append(out.Children, ch)
	}
	var gone []ChildChange
	for k, o := range seen {
		if !wanted[k] {
			gone = append(gone, ChildChange{Action: Delete, APIVersion: o.GetAPIVersion(), Kind: o.GetKind(), Namespace: o.GetNamespace(), Name: o.GetName()})
		}
	}
	sort.Slice(gone, func(i, j int) bool {
		a, b := gone[i], gone[j]
		return a.Kind+"/"+a.Namespace+"/"+a.Name < b.Kind+"/"+b.Namespace+"/"+b.Name
	})
	out.Children = append(out.Children, gone...)
	return out, nil
}

// ParentChanges are the parent's own writes the kind plans for ds: its
// status, and the metadata patch (labels, annotations, finalizers).
func ParentChanges(c kinds.Applying, parent *unstructured.Unstructured, res *discovery.Resource, ds *bus.DesiredState) ([]FieldChange, error) {
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
// sorted by path. Maps are compared key by key; any other value (lists
// included) as a whole, by its JSON encoding (so int64(1) equals 1.0).
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
	if !jsonEqual(before, after) {
		*out = append(*out, FieldChange{Path: path, Before: before, After: after})
	}
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

func jsonEqual(a, b any) bool {
	if reflect.DeepEqual(a, b) {
		return true
	}
	ja, err1 := json.Marshal(a)
	jb, err2 := json.Marshal(b)
	return err1 == nil && err2 == nil && string(ja) == string(jb)
}
