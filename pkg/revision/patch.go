package revision

import (
	"errors"
	"fmt"
	"strings"
)

// defaultFieldPaths are used when revisionHistory.fieldPaths is empty, as upstream does: any
// change of the parent's spec rolls out gradually.
var defaultFieldPaths = []string{"spec"}

// ParentPatch returns the parent's fields under the dotted fieldPaths (["spec"] when
// empty) as a partial object, e.g. {"spec":{"template":{...}}} for "spec.template". Values are
// deep copies. Paths that do not exist in the parent (or stop at a null) are skipped, because
// "absent" is itself part of the revision (ApplyPatch removes such fields); a path that runs
// through a non-object, or has an empty segment, is an error.
func ParentPatch(parent map[string]any, fieldPaths []string) (map[string]any, error) {
	paths, err := splitPaths(fieldPaths)
	if err != nil {
		return nil, err
	}
	patch := map[string]any{}
	for _, path := range paths {
		v, found, err := lookup(parent, path)
		if err != nil {
			return nil, fmt.Errorf("revision: parent: %w", err)
		}
		if found {
			if err := set(patch, path, deepCopy(v)); err != nil {
				return nil, fmt.Errorf("revision: parent: %w", err)
			}
		}
	}
	return patch, nil
}

// ApplyPatch returns a deep copy of parent in which every field under fieldPaths
// (["spec"] when empty) is replaced by the patch's value, or removed when the patch has
// none: the parent "as of" the revision, to call the sync hook with. Fields outside fieldPaths
// keep their current values, since they apply immediately rather than roll out.
//
// The field paths are needed because a merge of the patch into the parent could not tell a
// field the revision lacked from one it did not record, so fields added to spec.template since
// the revision was taken would leak into the old revision's children.
//
// A path that runs through a non-object in the parent or in the patch is an error; the inputs
// are never modified.
func ApplyPatch(parent, patch map[string]any, fieldPaths []string) (map[string]any, error) {
	paths, err := splitPaths(fieldPaths)
	if err != nil {
		return nil, err
	}
	out, _ := deepCopy(parent).(map[string]any)
	if out == nil {
		out = map[string]any{}
	}
	for _, path := range paths {
		v, found, err := lookup(patch, path)
		if err != nil {
			return nil, fmt.Errorf("revision: patch: %w", err)
		}
		if found {
			err = set(out, path, deepCopy(v))
		} else {
			err = remove(out, path)
		}
		if err != nil {
			return nil, fmt.Errorf("revision: parent: %w", err)
		}
	}
	return out, nil
}

func splitPaths(fieldPaths []string) ([][]string, error) {
	if len(fieldPaths) == 0 {
		fieldPaths = defaultFieldPaths
	}
	paths := make([][]string, 0, len(fieldPaths))
	for _, p := range fieldPaths {
		segs := strings.Split(p, ".")
		for _, s := range segs {
			if s == "" {
				return nil, fmt.Errorf("revision: invalid field path %q", p)
			}
		}
		paths = append(paths, segs)
	}
	return paths, nil
}

var errNotObject = errors.New("is not an object")

// lookup returns the value at path; a missing key or a null on the way means "not found".
func lookup(obj map[string]any, path []string) (any, bool, error) {
	cur := obj
	for i, seg := range path {
		v, ok := cur[seg]
		if !ok {
			return nil, false, nil
		}
		if i == len(path)-1 {
			return v, true, nil
		}
		if v == nil {
			return nil, false, nil
		}
		if cur, ok = v.(map[string]any); !ok {
			return nil, false, fmt.Errorf("%s %w", strings.Join(path[:i+1], "."), errNotObject)
		}
	}
	return nil, false, nil
}

// set stores v at path, creating objects for missing or null intermediate fields.
func set(obj map[string]any, path []string, v any) error {
	cur := obj
	for i, seg := range path[:len(path)-1] {
		switch next := cur[seg].(type) {
		case map[string]any:
			if next == nil { // a typed nil map cannot be written to
				next = map[string]any{}
				cur[seg] = next
			}
			cur = next
		case nil:
			m := map[string]any{}
			cur[seg] = m
			cur = m
		default:
			return fmt.Errorf("%s %w", strings.Join(path[:i+1], "."), errNotObject)
		}
	}
	cur[path[len(path)-1]] = v
	return nil
}

// remove deletes the field at path, if there is one.
func remove(obj map[string]any, path []string) error {
	cur := obj
	for i, seg := range path[:len(path)-1] {
		switch next := cur[seg].(type) {
		case map[string]any:
			cur = next
		case nil:
			return nil
		default:
			return fmt.Errorf("%s %w", strings.Join(path[:i+1], "."), errNotObject)
		}
	}
	delete(cur, path[len(path)-1])
	return nil
}

// deepCopy copies the objects and lists of a JSON value; anything else is immutable or
// copied by value. Unlike runtime.DeepCopyJSONValue it accepts any scalar type, so odd input
// never panics.
func deepCopy(v any) any {
	switch v := v.(type) {
	case map[string]any:
		if v == nil {
			return v
		}
		out := make(map[string]any, len(v))
		for k, e := range v {
			out[k] = deepCopy(e)
		}
		return out
	case []any:
		if v == nil {
			return v
		}
		out := make([]any, len(v))
		for i, e := range v {
			out[i] = deepCopy(e)
		}
		return out
	default:
		return v
	}
}
