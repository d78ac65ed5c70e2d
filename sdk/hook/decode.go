package hook

import (
	"encoding/json"
	"fmt"
	"reflect"
	"strings"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	kjson "sigs.k8s.io/json"
)

// decodeRequest decodes a request body into req, a pointer to one of the
// request structs. Keys match case-sensitively and integers stay int64, as
// metabus decodes objects, so that what a hook copies from its request
// into its answer compares equal to what the API server has.
//
// Objects are taken as the maps they decode to, not through
// Unstructured's own decoder, which refuses an object without kind: a
// hand-written fixture often leaves it out, and the hook never needs it to
// read a field.
func decodeRequest(data []byte, req any) error {
	var raw map[string]any
	if err := kjson.UnmarshalCaseSensitivePreserveInts(data, &raw); err != nil {
		return err
	}
	if raw == nil {
		return fmt.Errorf("the request is not a JSON object")
	}
	v := reflect.ValueOf(req).Elem()
	t := v.Type()
	for i := range t.NumField() {
		name, _, _ := strings.Cut(t.Field(i).Tag.Get("json"), ",")
		val := raw[name]
		if val == nil {
			continue
		}
		var err error
		switch field := v.Field(i).Addr().Interface().(type) {
		case **unstructured.Unstructured:
			*field, err = objectOf(val)
		case *ObjectMap:
			*field, err = objectMapOf(val)
		default:
			var b []byte
			if b, err = json.Marshal(val); err == nil {
				err = kjson.UnmarshalCaseSensitivePreserveInts(b, field)
			}
		}
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
	}
	return nil
}

func objectOf(v any) (*unstructured.Unstructured, error) {
	m, ok := v.(map[string]any)
	if !ok {
		return nil, fmt.Errorf("want an object, got %T", v)
	}
	return &unstructured.Unstructured{Object: m}, nil
}

func objectMapOf(v any) (ObjectMap, error) {
	outer, ok := v.(map[string]any)
	if !ok {
		return nil, fmt.Errorf("want an object of objects, got %T", v)
	}
	out := make(ObjectMap, len(outer))
	for typ, innerV := range outer {
		inner := map[string]*unstructured.Unstructured{}
		if innerV != nil {
			m, ok := innerV.(map[string]any)
			if !ok {
				return nil, fmt.Errorf("%s: want an object, got %T", typ, innerV)
			}
			for key, obj := range m {
				u, err := objectOf(obj)
				if err != nil {
					return nil, fmt.Errorf("%s[%q]: %w", typ, key, err)
				}
				inner[key] = u
			}
		}
		out[typ] = inner
	}
	return out, nil
}

// UnmarshalJSON decodes an object map, taking objects as the maps they
// decode to (see decodeRequest).
func (m *ObjectMap) UnmarshalJSON(data []byte) error {
	var raw any
	if err := kjson.UnmarshalCaseSensitivePreserveInts(data, &raw); err != nil {
		return err
	}
	if raw == nil {
		*m = nil
		return nil
	}
	om, err := objectMapOf(raw)
	if err != nil {
		return err
	}
	*m = om
	return nil
}

// The request types decode as the handlers do, whichever JSON decoder is
// used (a test decoding a fixture with encoding/json, say): objects need
// no kind, keys match case-sensitively and integers stay int64.

// UnmarshalJSON decodes r as decodeRequest does.
func (r *CompositeRequest) UnmarshalJSON(data []byte) error { return decodeRequest(data, r) }

// UnmarshalJSON decodes r as decodeRequest does.
func (r *DecoratorRequest) UnmarshalJSON(data []byte) error { return decodeRequest(data, r) }

// UnmarshalJSON decodes r as decodeRequest does.
func (r *CustomizeRequest) UnmarshalJSON(data []byte) error { return decodeRequest(data, r) }

// UnmarshalJSON decodes r as decodeRequest does.
func (r *MapRequest) UnmarshalJSON(data []byte) error { return decodeRequest(data, r) }

// UnmarshalJSON decodes r as decodeRequest does.
func (r *TombstoneRequest) UnmarshalJSON(data []byte) error { return decodeRequest(data, r) }
