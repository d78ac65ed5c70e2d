package hookapi

import (
	"bytes"
	"errors"
	"fmt"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	sigsjson "sigs.k8s.io/json"

	"github.com/metabus/metabus/pkg/ujson"
)

// Decode decodes a hook response body into v (a pointer to one of the response types) the way
// upstream does: object keys are matched case-sensitively and integers stay int64, so desired
// objects compare equal to the same objects read from the API server. strict (the default for
// hook version v2, or responseUnMarshallMode: strict) additionally rejects unknown and duplicate
// fields of the typed response; like upstream, the contents of desired objects are not subject
// to it, since they are free-form Kubernetes objects.
func Decode(data []byte, strict bool, v any) error {
	if !strict {
		if err := sigsjson.UnmarshalCaseSensitivePreserveInts(data, v); err != nil {
			return fmt.Errorf("hookapi: decoding hook response: %w", err)
		}
		return nil
	}
	strictErrs, err := sigsjson.UnmarshalStrict(data, v)
	if err != nil {
		return fmt.Errorf("hookapi: decoding hook response: %w", err)
	}
	if len(strictErrs) > 0 {
		return fmt.Errorf("hookapi: hook response rejected by strict decoding: %w", errors.Join(strictErrs...))
	}
	return nil
}

// ChildList is the "children" list of a composite hook response. It has the same underlying
// type as []*unstructured.Unstructured, so it can be passed wherever one is expected; the named
// type only exists to validate entries while decoding (see ObjectError).
type ChildList []*unstructured.Unstructured

// UnmarshalJSON decodes and validates the list; see decodeObjectList.
func (l *ChildList) UnmarshalJSON(data []byte) error {
	objs, err := decodeObjectList(data, "children")
	if err != nil {
		return err
	}
	*l = objs
	return nil
}

// AttachmentList is the "attachments" list of a decorator hook response; see ChildList.
type AttachmentList []*unstructured.Unstructured

// UnmarshalJSON decodes and validates the list; see decodeObjectList.
func (l *AttachmentList) UnmarshalJSON(data []byte) error {
	objs, err := decodeObjectList(data, "attachments")
	if err != nil {
		return err
	}
	*l = objs
	return nil
}

// ObjectError reports an unusable entry of a desired-object list in a hook response.
type ObjectError struct {
	List  string // "children", "attachments" or "outputs"
	Index int    // position in the list, from 0
	// APIVersion, Kind and Name are whatever could be read from the entry (possibly empty),
	// to help the hook author find it.
	APIVersion, Kind, Name string
	Reason                 string
}

func (e *ObjectError) Error() string {
	what := ""
	if e.Kind != "" || e.APIVersion != "" || e.Name != "" {
		what = fmt.Sprintf(" (%s %q)", GroupVersionKindKey(e.APIVersion, e.Kind), e.Name)
	}
	return fmt.Sprintf("hookapi: hook response %s[%d]%s: %s", e.List, e.Index, what, e.Reason)
}

// decodeObjectList decodes a JSON list of Kubernetes objects and checks that every entry can be
// addressed: a JSON object with non-empty string apiVersion, kind and metadata.name, a string
// metadata.namespace if any, and string maps for labels and annotations if any. Anything else
// fails the whole list, because acting on part of a desired set would delete the children the
// hook meant to keep. A null list is an empty one (a hook with nothing to create may say so).
//
// Entries are decoded on their own rather than through unstructured.Unstructured's decoder,
// which would accept a null entry as a nil pointer and does not report which entry failed.
func decodeObjectList(data []byte, list string) ([]*unstructured.Unstructured, error) {
	if bytes.Equal(bytes.TrimSpace(data), []byte("null")) {
		return nil, nil
	}
	// ujson.Decode: sigs.k8s.io/json's PreserveInts result without its
	// reflection (a hook's children are the bulk of every response).
	raw, err := ujson.Decode(data)
	if err != nil {
		return nil, fmt.Errorf("hookapi: hook response %s: %w", list, err)
	}
	items, ok := raw.([]any)
	if !ok {
		return nil, fmt.Errorf("hookapi: hook response %s must be a list of objects, got %s", list, jsonType(raw))
	}
	out := make([]*unstructured.Unstructured, len(items))
	for i, item := range items {
		obj, ok := item.(map[string]any)
		if !ok {
			return nil, &ObjectError{List: list, Index: i, Reason: "must be an object, got " + jsonType(item)}
		}
		if err := checkObject(obj); err != nil {
			err.List, err.Index = list, i
			return nil, err
		}
		out[i] = &unstructured.Unstructured{Object: obj}
	}
	return out, nil
}

// checkObject validates the fields metabus needs to address a desired object. The returned
// error has only the identity and reason filled in.
func checkObject(obj map[string]any) *ObjectError {
	e := &ObjectError{}
	e.APIVersion, _ = obj["apiVersion"].(string)
	e.Kind, _ = obj["kind"].(string)
	meta, metaOK := obj["metadata"].(map[string]any)
	if metaOK {
		e.Name, _ = meta["name"].(string)
	}
	fail := func(reason string) *ObjectError { e.Reason = reason; return e }

	if r := requiredString(obj, "apiVersion"); r != "" {
		return fail(r)
	}
	if r := requiredString(obj, "kind"); r != "" {
		return fail(r)
	}
	if !metaOK {
		if _, present := obj["metadata"]; present && obj["metadata"] != nil {
			return fail("metadata must be an object, got " + jsonType(obj["metadata"]))
		}
		return fail("metadata.name is missing")
	}
	if r := requiredString(meta, "name"); r != "" {
		return fail("metadata." + r)
	}
	if ns, present := meta["namespace"]; present && ns != nil {
		if _, ok := ns.(string); !ok {
			return fail("metadata.namespace must be a string, got " + jsonType(ns))
		}
	}
	for _, field := range [...]string{"labels", "annotations"} {
		v, present := meta[field]
		if !present || v == nil {
			continue
		}
		m, ok := v.(map[string]any)
		if !ok {
			return fail("metadata." + field + " must be an object, got " + jsonType(v))
		}
		for k, val := range m {
			if _, ok := val.(string); !ok {
				return fail(fmt.Sprintf("metadata.%s[%q] must be a string, got %s", field, k, jsonType(val)))
			}
		}
	}
	return nil
}

// requiredString returns "" when m[key] is a non-empty string, else the reason it is not.
func requiredString(m map[string]any, key string) string {
	v, present := m[key]
	switch s, ok := v.(string); {
	case !present || v == nil:
		return key + " is missing"
	case !ok:
		return key + " must be a string, got " + jsonType(v)
	case s == "":
		return key + " is empty"
	}
	return ""
}

// jsonType names the JSON type of a decoded value for error messages.
func jsonType(v any) string {
	switch v.(type) {
	case nil:
		return "null"
	case map[string]any:
		return "an object"
	case []any:
		return "a list"
	case string:
		return "a string"
	case bool:
		return "a boolean"
	case int64, float64:
		return "a number"
	default:
		return fmt.Sprintf("%T", v)
	}
}
