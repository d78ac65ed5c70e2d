package children

import (
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
)

// maxReportedProblems caps ValidationError.Error(): a hostile hook can return thousands of bad
// children, and the message ends up in events, logs and conditions. Problems keeps them all.
const maxReportedProblems = 10

// Problem is one reason a desired child was rejected. Identity fields hold whatever could be
// read from the object (possibly empty).
type Problem struct {
	Index                             int // position in the hook's list, from 0
	APIVersion, Kind, Namespace, Name string
	Message                           string
}

func (p Problem) String() string {
	if p.Kind == "" && p.APIVersion == "" && p.Name == "" {
		return fmt.Sprintf("[%d]: %s", p.Index, p.Message)
	}
	id := p.Name
	if p.Namespace != "" {
		id = p.Namespace + "/" + p.Name
	}
	return fmt.Sprintf("[%d] %s.%s %q: %s", p.Index, p.Kind, p.APIVersion, id, p.Message)
}

// ValidationError rejects a whole desired set. The set is all-or-nothing because the desired
// list is also the list of children to keep: acting on the valid part of a broken list would
// delete the children behind the invalid entries.
type ValidationError struct {
	Total    int       // number of desired children in the rejected set
	Problems []Problem // every problem found, in list order
}

func (e *ValidationError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "children: rejected all %d desired children because of %d problem(s): ", e.Total, len(e.Problems))
	for i, p := range e.Problems {
		if i == maxReportedProblems {
			fmt.Fprintf(&b, "; and %d more", len(e.Problems)-i)
			break
		}
		if i > 0 {
			b.WriteString("; ")
		}
		b.WriteString(p.String())
	}
	return b.String()
}

// Normalize validates the hook's desired children and returns them ready to apply, in the
// hook's order. It rejects the whole set (a *ValidationError listing every problem) when any
// child:
//   - is null, or has an apiVersion/kind pair that no rule declares (matched exactly: a child
//     sent in another version than declared is rejected, because the observed children the
//     hook compares against are read in the declared version);
//   - lacks metadata.name (generateName is not supported: children are identified by name);
//   - is cluster-scoped under a namespaced owner (Kubernetes forbids such owner references);
//   - names a namespace other than the owner's under a namespaced owner;
//   - is namespaced without a namespace under a cluster-scoped owner (there is nothing to
//     default it from);
//   - is listed twice (same rule, namespace and name);
//   - does not match Owner.Selector once Owner.ExtraLabels are added;
//   - has metadata fields of the wrong JSON type, or Go values that are not JSON.
//
// The returned objects are deep copies with the namespace defaulted to the owner's (under a
// namespaced owner), metadata.namespace dropped for cluster-scoped kinds (the API server
// ignores it there too), and ExtraLabels and ExtraAnnotations set. Configuration errors (bad
// rules or owner) are returned as plain errors.
func Normalize(owner Owner, rules []Rule, desired []*unstructured.Unstructured) ([]Desired, error) {
	if err := checkOwner(owner); err != nil {
		return nil, err
	}
	if err := checkRules(rules); err != nil {
		return nil, err
	}
	byType := make(map[[2]string]int, len(rules))
	for i := len(rules) - 1; i >= 0; i-- { // backwards so the first declaration wins
		byType[[2]string{rules[i].APIVersion, rules[i].Kind}] = i
	}

	out := make([]Desired, 0, len(desired))
	seen := make(map[childKey]int, len(desired))
	v := &validator{owner: owner, rules: rules}
	for i, d := range desired {
		if d == nil || d.Object == nil {
			v.add(Problem{Index: i, Message: "is null"})
			continue
		}
		obj, ruleIdx, ok := v.child(i, d, byType)
		if !ok {
			continue
		}
		key := childKey{rule: ruleIdx, namespace: obj.GetNamespace(), name: obj.GetName()}
		if first, dup := seen[key]; dup {
			v.add(v.problem(i, obj, fmt.Sprintf("is listed twice (first at index %d)", first)))
			continue
		}
		seen[key] = i
		out = append(out, Desired{Rule: &rules[ruleIdx], Object: obj})
	}
	if len(v.problems) > 0 {
		return nil, &ValidationError{Total: len(desired), Problems: v.problems}
	}
	return out, nil
}

// childKey is ChildKey with the rule as an index, for cheap map keys and ordering.
type childKey struct {
	rule            int
	namespace, name string
}

type validator struct {
	owner    Owner
	rules    []Rule
	problems []Problem
}

func (v *validator) add(p Problem) { v.problems = append(v.problems, p) }

func (v *validator) problem(i int, obj *unstructured.Unstructured, msg string) Problem {
	p := Problem{Index: i, Message: msg}
	p.APIVersion, _ = obj.Object["apiVersion"].(string)
	p.Kind, _ = obj.Object["kind"].(string)
	if meta, ok := obj.Object["metadata"].(map[string]any); ok {
		p.Name, _ = meta["name"].(string)
		p.Namespace, _ = meta["namespace"].(string)
	}
	return p
}

// child validates and completes one desired object. It records every problem it can find
// (rather than stopping at the first) so that one round trip shows the hook author all of them.
func (v *validator) child(i int, in *unstructured.Unstructured, byType map[[2]string]int) (*unstructured.Unstructured, int, bool) {
	before := len(v.problems)
	fail := func(msg string) { v.add(v.problem(i, in, msg)) }

	copied, err := cloneValue(in.Object)
	if err != nil {
		fail(err.Error())
		return nil, 0, false
	}
	obj := &unstructured.Unstructured{Object: copied.(map[string]any)}

	apiVersion, okA := stringField(obj.Object, "apiVersion")
	kind, okK := stringField(obj.Object, "kind")
	ruleIdx, known := byType[[2]string{apiVersion, kind}]
	switch {
	case !okA || !okK:
		fail("apiVersion and kind must be strings")
	case apiVersion == "" || kind == "":
		fail("apiVersion and kind are required")
	case !known:
		fail(fmt.Sprintf("%s.%s is not a declared child resource (declared: %s)", kind, apiVersion, v.declared()))
	}

	meta, err := metadata(obj.Object)
	if err != nil {
		fail(err.Error())
		return nil, 0, false
	}
	name, okN := stringField(meta, "name")
	switch {
	case !okN:
		fail("metadata.name must be a string")
	case name == "":
		fail("metadata.name is required")
	}
	namespace, okNS := stringField(meta, "namespace")
	if !okNS {
		fail("metadata.namespace must be a string")
	}

	if known && okNS {
		if msg := v.placeNamespace(meta, v.rules[ruleIdx].Namespaced, namespace); msg != "" {
			fail(msg)
		}
	}

	lbls, err := injectStrings(meta, "labels", v.owner.ExtraLabels)
	if err != nil {
		fail(err.Error())
	} else if v.owner.Selector != nil && !v.owner.Selector.Matches(labels.Set(lbls)) {
		fail(fmt.Sprintf("labels {%s} do not match the owner's selector %q, so the child would be orphaned", labels.Set(lbls), v.owner.Selector))
	}
	if _, err := injectStrings(meta, "annotations", v.owner.ExtraAnnotations); err != nil {
		fail(err.Error())
	}

	if len(v.problems) > before {
		return nil, 0, false
	}
	return obj, ruleIdx, true
}

// placeNamespace applies the scope rules to metadata.namespace (in the copy), returning a
// problem message or "".
func (v *validator) placeNamespace(meta map[string]any, namespaced bool, namespace string) string {
	switch {
	case !namespaced && v.owner.Namespaced:
		return fmt.Sprintf("is cluster-scoped, which cannot be owned by a namespaced owner (%s/%s)", v.owner.Namespace, v.owner.Name)
	case !namespaced:
		delete(meta, "namespace")
	case v.owner.Namespaced && namespace == "":
		meta["namespace"] = v.owner.Namespace
	case v.owner.Namespaced && namespace != v.owner.Namespace:
		return fmt.Sprintf("is in namespace %q, but children of a namespaced owner must be in its namespace %q", namespace, v.owner.Namespace)
	case !v.owner.Namespaced && namespace == "":
		return "is namespaced and needs metadata.namespace, because a cluster-scoped owner has no namespace to default from"
	}
	return ""
}

func (v *validator) declared() string {
	names := make([]string, len(v.rules))
	for i, r := range v.rules {
		names[i] = r.Kind + "." + r.APIVersion
	}
	if len(names) == 0 {
		return "none"
	}
	return strings.Join(names, ", ")
}

// stringField returns m[key] as a string; absent or null is "", and ok is false only for a
// value of another type.
func stringField(m map[string]any, key string) (string, bool) {
	switch s := m[key].(type) {
	case string:
		return s, true
	case nil:
		return "", true
	default:
		return "", false
	}
}

// metadata returns the object's metadata map, creating it when absent or null (the copy is
// ours to complete).
func metadata(obj map[string]any) (map[string]any, error) {
	switch m := obj["metadata"].(type) {
	case map[string]any:
		if m != nil {
			return m, nil
		}
	case nil:
	default:
		return nil, fmt.Errorf("metadata must be an object, got %T", obj["metadata"])
	}
	created := map[string]any{}
	obj["metadata"] = created
	return created, nil
}

// injectStrings reads meta[field] as a string map, sets extra into it (extra wins) and returns
// the resulting map. The field is only written when extra is non-empty, so an object the hook
// sent without labels stays without labels.
func injectStrings(meta map[string]any, field string, extra map[string]string) (map[string]string, error) {
	var current map[string]any
	switch m := meta[field].(type) {
	case map[string]any:
		current = m
	case nil:
	default:
		return nil, fmt.Errorf("metadata.%s must be an object, got %T", field, meta[field])
	}
	out := make(map[string]string, len(current)+len(extra))
	for k, val := range current {
		s, ok := val.(string)
		if !ok {
			return nil, fmt.Errorf("metadata.%s[%q] must be a string, got %T", field, k, val)
		}
		out[k] = s
	}
	if len(extra) == 0 {
		return out, nil
	}
	if current == nil {
		current = make(map[string]any, len(extra))
		meta[field] = current
	}
	for _, k := range slices.Sorted(maps.Keys(extra)) {
		current[k] = extra[k]
		out[k] = extra[k]
	}
	return out, nil
}

// cloneValue deep-copies JSON-like content. Unlike runtime.DeepCopyJSONValue it returns an
// error instead of panicking on values that are not JSON (structs, channels, typed maps), and it
// accepts every Go number type, which is what objects built in Go code tend to contain.
func cloneValue(v any) (any, error) {
	switch t := v.(type) {
	case map[string]any:
		if t == nil {
			return map[string]any(nil), nil
		}
		out := make(map[string]any, len(t))
		for k, val := range t {
			c, err := cloneValue(val)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", k, err)
			}
			out[k] = c
		}
		return out, nil
	case []any:
		if t == nil {
			return []any(nil), nil
		}
		out := make([]any, len(t))
		for i, val := range t {
			c, err := cloneValue(val)
			if err != nil {
				return nil, fmt.Errorf("[%d]: %w", i, err)
			}
			out[i] = c
		}
		return out, nil
	case nil, string, bool, json.Number,
		int, int8, int16, int32, int64, uint, uint8, uint16, uint32, uint64, float32, float64:
		return t, nil // immutable values
	default:
		return nil, fmt.Errorf("value of Go type %T is not JSON", v)
	}
}
