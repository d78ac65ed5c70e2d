package decorator

import (
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"slices"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// Changes are what a hook's answer asks of the target itself. The target's
// spec is never among them: a decorator only adds behaviour to an object
// that already has its own controller.
type Changes struct {
	// Labels and Annotations set a key to a value, or delete it for a nil
	// value; keys not mentioned are left alone.
	Labels      map[string]*string
	Annotations map[string]*string
	// Status replaces .status when StatusSet; otherwise .status is left
	// unchanged (the hook answered null or nothing).
	Status    map[string]any
	StatusSet bool
	// AddFinalizer is a finalizer to add if missing ("" for none).
	AddFinalizer string
}

// Update is the writes that bring a target to Changes. The zero value
// means no write at all, which is what a no-op sync must cost.
type Update struct {
	// Patch is a JSON merge patch of the target (nil: no write). It carries
	// the observed resourceVersion, so a target changed since it was
	// observed fails with a conflict instead of losing the other writer's
	// change. It holds the changed labels, annotations and finalizers and,
	// when the resource has no status subresource, the status change.
	Patch map[string]any
	// Status is the new .status to write through the status subresource
	// (nil: none to write).
	Status map[string]any
}

// IsZero reports an update with nothing to write.
func (u Update) IsZero() bool { return u.Patch == nil && u.Status == nil }

// PlanTarget computes the writes for ch against the observed target. Only
// what differs from the observed object is written: labels and
// annotations key by key, finalizers as a whole list (with the
// resourceVersion precondition, so nobody else's finalizer is lost), and
// status only when its JSON differs. statusSubresource says whether the
// target's resource serves /status: then status goes through it (the main
// resource ignores status changes), otherwise into the patch as a merge
// diff that turns the observed status into the desired one.
func PlanTarget(target *unstructured.Unstructured, ch Changes, statusSubresource bool) (Update, error) {
	var u Update
	meta := map[string]any{}
	if p := MapPatch(target.GetLabels(), ch.Labels); p != nil {
		meta["labels"] = p
	}
	if p := MapPatch(target.GetAnnotations(), ch.Annotations); p != nil {
		meta["annotations"] = p
	}
	if f := ch.AddFinalizer; f != "" && !slices.Contains(target.GetFinalizers(), f) {
		meta["finalizers"] = append(slices.Clone(target.GetFinalizers()), f)
	}
	patch := map[string]any{}
	if ch.StatusSet {
		current, _, _ := unstructured.NestedFieldNoCopy(target.Object, "status")
		same, err := StatusEqual(current, ch.Status)
		if err != nil {
			return Update{}, err
		}
		if !same {
			desired := ch.Status
			if desired == nil {
				desired = map[string]any{}
			}
			if statusSubresource {
				u.Status = desired
			} else if d, changed := mergeDiff(current, desired); changed {
				patch["status"] = d
			}
		}
	}
	if len(meta) > 0 || len(patch) > 0 {
		meta["resourceVersion"] = target.GetResourceVersion()
		patch["metadata"] = meta
		u.Patch = patch
	}
	return u, nil
}

// MapPatch returns the merge patch of a label or annotation map: the keys
// desired sets to a different value (or that are missing), and null for
// the keys desired deletes that are present. nil when nothing changes.
func MapPatch(current map[string]string, desired map[string]*string) map[string]any {
	var out map[string]any
	for _, k := range slices.Sorted(maps.Keys(desired)) {
		want := desired[k]
		got, present := current[k]
		switch {
		case want == nil && !present:
			continue
		case want == nil:
			if out == nil {
				out = map[string]any{}
			}
			out[k] = nil
		case present && got == *want:
			continue
		default:
			if out == nil {
				out = map[string]any{}
			}
			out[k] = *want
		}
	}
	return out
}

// ApplyMap returns current with desired applied (a nil value deletes).
func ApplyMap(current map[string]string, desired map[string]*string) map[string]string {
	out := maps.Clone(current)
	if out == nil {
		out = map[string]string{}
	}
	for k, v := range desired {
		if v == nil {
			delete(out, k)
		} else {
			out[k] = *v
		}
	}
	return out
}

// StatusEqual compares the observed status with a desired one by their
// canonical JSON, so int64(1) read from the API server equals float64(1)
// decoded from a hook. An absent status equals an empty one: writing {}
// over nothing would change nothing a reader can see.
func StatusEqual(current any, desired map[string]any) (bool, error) {
	if isEmpty(current) && len(desired) == 0 {
		return true, nil
	}
	return jsonEqual(current, desired)
}

func isEmpty(v any) bool {
	switch t := v.(type) {
	case nil:
		return true
	case map[string]any:
		return len(t) == 0
	}
	return false
}

func jsonEqual(a, b any) (bool, error) {
	ja, err := json.Marshal(a)
	if err != nil {
		return false, fmt.Errorf("encode status: %w", err)
	}
	jb, err := json.Marshal(b)
	if err != nil {
		return false, fmt.Errorf("encode status: %w", err)
	}
	return bytes.Equal(ja, jb), nil
}

// mergeDiff returns a JSON merge patch (RFC 7386) that turns current into
// desired: null for removed keys, recursion into objects present on both
// sides, and the desired value wherever it differs. changed is false when
// they are equal. A desired explicit null cannot be told from a removal in
// a merge patch; it removes the key.
func mergeDiff(current, desired any) (patch any, changed bool) {
	cm, cok := current.(map[string]any)
	dm, dok := desired.(map[string]any)
	if !cok || !dok {
		if same, err := jsonEqual(current, desired); err == nil && same {
			return nil, false
		}
		return desired, true
	}
	out := map[string]any{}
	for k := range cm {
		if _, keep := dm[k]; !keep {
			out[k] = nil
		}
	}
	for k, dv := range dm {
		cv, present := cm[k]
		if !present {
			out[k] = dv
			continue
		}
		if p, ch := mergeDiff(cv, dv); ch {
			out[k] = p
		}
	}
	if len(out) == 0 {
		return nil, false
	}
	return out, true
}
