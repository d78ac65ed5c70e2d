package apply

import (
	"errors"
	"fmt"
	"maps"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utiljson "k8s.io/apimachinery/pkg/util/json"

	"github.com/metabus/metabus/pkg/ujson"
)

// LastAppliedAnnotation stores the desired object as last applied by metabus.
const LastAppliedAnnotation = "metacontroller.k8s.io/last-applied-configuration"

// systemMetadataFields are owned by the API server. A hook that echoes a stale copy (or sets
// them at all) must not overwrite them, so UpdateChild puts the observed values back.
var systemMetadataFields = [...]string{
	"uid",
	"resourceVersion",
	"generation",
	"creationTimestamp",
	"deletionTimestamp",
	"deletionGracePeriodSeconds",
	"managedFields",
	"selfLink",
}

// GetLastApplied returns the parsed annotation (nil, nil when absent); a malformed annotation
// is an error (callers treat it as "no last applied" but log it).
//
// An empty annotation value, or the JSON literal null, counts as absent. Numbers are decoded
// as int64 when integral and float64 otherwise, like the rest of unstructured content.
func GetLastApplied(obj *unstructured.Unstructured) (map[string]any, error) {
	if obj == nil {
		return nil, nil
	}
	raw, found, err := unstructured.NestedFieldNoCopy(obj.Object, "metadata", "annotations", LastAppliedAnnotation)
	if err != nil {
		return nil, fmt.Errorf("apply: reading annotation %s: %w", LastAppliedAnnotation, err)
	}
	if !found {
		return nil, nil
	}
	s, ok := raw.(string)
	if !ok {
		return nil, fmt.Errorf("apply: annotation %s is a %T, not a string", LastAppliedAnnotation, raw)
	}
	if s == "" {
		return nil, nil
	}
	var last map[string]any
	if err := utiljson.Unmarshal([]byte(s), &last); err != nil {
		return nil, fmt.Errorf("apply: malformed annotation %s: %w", LastAppliedAnnotation, err)
	}
	return last, nil
}

// SetLastApplied stores lastApplied (JSON) in the annotation.
//
// Other annotations are left untouched; metadata and metadata.annotations are created when
// missing, and it is an error if either exists but is not an object.
func SetLastApplied(obj *unstructured.Unstructured, lastApplied map[string]any) error {
	if obj == nil {
		return errors.New("apply: SetLastApplied on a nil object")
	}
	raw, err := ujson.Marshal(lastApplied)
	if err != nil {
		return fmt.Errorf("apply: encoding last applied configuration: %w", err)
	}
	if obj.Object == nil {
		obj.Object = map[string]any{}
	}
	return setAnnotation(obj.Object, string(raw))
}

// PrepareCreate returns a deep copy of desired with any incoming copy of the annotation stripped
// and the annotation set to the JSON of (stripped) desired, ready to be created.
//
// Null-valued fields of desired are left out of the object (null means absent) but kept in
// the annotation, which records desired exactly as UpdateChild will record it later, so the
// first update after a create sees an unchanged annotation.
func PrepareCreate(desired *unstructured.Unstructured) (*unstructured.Unstructured, error) {
	if desired == nil {
		return nil, errors.New("apply: PrepareCreate on a nil object")
	}
	if err := validate(desired.Object); err != nil {
		return nil, fmt.Errorf("apply: desired object: %w", err)
	}
	want, raw, err := strippedDesired(desired.Object)
	if err != nil {
		return nil, err
	}
	obj := cloneDesired(want).(map[string]any) // the deep copy: nothing shared with desired
	if err := setAnnotation(obj, raw); err != nil {
		return nil, err
	}
	return &unstructured.Unstructured{Object: obj}, nil
}

// UpdateChild computes the object to write for an existing child: it strips any incoming
// annotation copy from desired, merges (observed, lastApplied-from-observed, desired), sets the
// annotation to the stripped desired, then reverts system fields (metadata.uid, resourceVersion,
// generation, creationTimestamp, deletionTimestamp, deletionGracePeriodSeconds, managedFields,
// selfLink) and the whole top-level `status` to their observed values (absent stays absent).
// changed reports whether the result differs from observed (semantic deep equality on the JSON
// values, so int64(1) and float64(1) are equal) — callers skip the API write when !changed.
//
// A malformed annotation on observed is treated as absent (a pure overlay) rather than
// failing: the write then replaces it with a good one, where an error would leave the child
// stuck forever. Callers that want to log it can call GetLastApplied on observed first.
// Neither observed nor desired is modified, and merged shares no maps or slices with them.
//
// In the steady state (the stored annotation is byte-identical to the new one) desired itself
// is used as lastApplied instead of decoding the annotation: it is what the annotation encodes.
func UpdateChild(observed, desired *unstructured.Unstructured) (merged *unstructured.Unstructured, changed bool, err error) {
	if observed == nil || desired == nil {
		return nil, false, errors.New("apply: UpdateChild needs both an observed and a desired object")
	}
	if err := validate(observed.Object); err != nil {
		return nil, false, fmt.Errorf("apply: observed object: %w", err)
	}
	if err := validate(desired.Object); err != nil {
		return nil, false, fmt.Errorf("apply: desired object: %w", err)
	}
	want, raw, err := strippedDesired(desired.Object)
	if err != nil {
		return nil, false, err
	}
	out := merge(observed.Object, lastAppliedFor(observed, want, raw), want)
	if err := setAnnotation(out, raw); err != nil {
		return nil, false, err
	}
	if err := revertSystemFields(out, observed.Object); err != nil {
		return nil, false, err
	}
	return &unstructured.Unstructured{Object: out}, !equalJSON(out, observed.Object), nil
}

// strippedDesired returns desired without any copy of the annotation (a hook may echo back
// what it observed), and its JSON for the annotation. Nothing here or in the merge writes to
// desired, so it is shared rather than deep-copied; only the maps on the path to a stripped
// annotation are copied.
func strippedDesired(desired map[string]any) (map[string]any, string, error) {
	want := desired
	if meta, ok := desired["metadata"].(map[string]any); ok {
		if ann, ok := meta["annotations"].(map[string]any); ok {
			if _, present := ann[LastAppliedAnnotation]; present {
				ann = maps.Clone(ann)
				delete(ann, LastAppliedAnnotation)
				meta = maps.Clone(meta)
				if len(ann) == 0 {
					delete(meta, "annotations") // it only existed to carry the copy
				} else {
					meta["annotations"] = ann
				}
				want = maps.Clone(desired)
				want["metadata"] = meta
			}
		}
	}
	raw, err := ujson.Marshal(want)
	if err != nil {
		return nil, "", fmt.Errorf("apply: encoding last applied configuration: %w", err)
	}
	return want, string(raw), nil
}

// lastAppliedFor returns the lastApplied to merge observed with. In the steady state the
// stored annotation is byte for byte the JSON of the new desired; then desired itself is what
// the annotation encodes, and decoding it again would only cost time on every resync.
// A malformed annotation counts as absent (see UpdateChild).
func lastAppliedFor(observed *unstructured.Unstructured, want map[string]any, raw string) map[string]any {
	if stored, found, _ := unstructured.NestedFieldNoCopy(observed.Object, "metadata", "annotations", LastAppliedAnnotation); found && stored == raw {
		return want
	}
	last, err := GetLastApplied(observed)
	if err != nil {
		return nil
	}
	return last
}

// setAnnotation writes the annotation into obj, creating metadata and annotations as needed.
func setAnnotation(obj map[string]any, value string) error {
	meta, err := childObject(obj, "metadata", "metadata")
	if err != nil {
		return err
	}
	ann, err := childObject(meta, "annotations", "metadata.annotations")
	if err != nil {
		return err
	}
	ann[LastAppliedAnnotation] = value
	return nil
}

// childObject returns parent[key] as an object, creating it when missing or null.
func childObject(parent map[string]any, key, path string) (map[string]any, error) {
	switch v := parent[key].(type) {
	case map[string]any:
		if v != nil {
			return v, nil
		}
	case nil:
	default:
		return nil, fmt.Errorf("apply: cannot set annotation %s: %s is a %T, not an object", LastAppliedAnnotation, path, v)
	}
	m := map[string]any{}
	parent[key] = m
	return m, nil
}

// revertSystemFields puts the observed status and server-owned metadata back into merged:
// those are never metabus's to write through an update (status has its own subresource).
func revertSystemFields(merged, observed map[string]any) error {
	if status, ok := observed["status"]; ok {
		merged["status"] = clone(status)
	} else {
		delete(merged, "status")
	}
	meta, err := childObject(merged, "metadata", "metadata")
	if err != nil {
		return err
	}
	observedMeta, _ := observed["metadata"].(map[string]any)
	for _, f := range systemMetadataFields {
		if v, ok := observedMeta[f]; ok {
			meta[f] = clone(v)
		} else {
			delete(meta, f)
		}
	}
	return nil
}
