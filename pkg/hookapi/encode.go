package hookapi

import (
	"encoding/json"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"sync"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/metabus/metabus/pkg/ujson"
)

// Encoder writes hook request bodies: exactly the bytes json.Marshal gives
// for the request types of this package, at about half the cost.
//
// json.Marshal hands every object to Unstructured.MarshalJSON and
// ObjectMap.MarshalJSON, then scans and compacts what they return, once
// per level of nesting: a child's bytes are scanned three times. The
// Encoder marshals each object's map directly and writes the structure
// around it itself. It also keeps the encoding of each controller object
// (by UID, for its latest resourceVersion): the controller is the same in
// every request of a controller and was about a third of each body.
//
// The zero value is ready to use; an Encoder is safe for concurrent use.
type Encoder struct {
	ctrls sync.Map // types.UID → encodedObject
}

type encodedObject struct {
	rv   string
	data []byte
}

// Encode returns the JSON body of req. Types it does not know field by
// field (unexported or embedded fields, tag options) are left to
// json.Marshal.
func (e *Encoder) Encode(req any) ([]byte, error) {
	v := reflect.ValueOf(req)
	if v.Kind() == reflect.Pointer && !v.IsNil() {
		v = v.Elem()
	}
	if v.Kind() != reflect.Struct {
		return json.Marshal(req)
	}
	fields := planOf(v.Type())
	if fields == nil {
		return json.Marshal(req)
	}
	b := make([]byte, 0, 4096)
	b = append(b, '{')
	for i, f := range fields {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, f.key...)
		var err error
		if b, err = e.appendValue(b, v.Field(f.index)); err != nil {
			return nil, fmt.Errorf("field %s: %w", f.name, err)
		}
	}
	return append(b, '}'), nil
}

var (
	unstructuredType = reflect.TypeFor[*unstructured.Unstructured]()
	objectMapType    = reflect.TypeFor[ObjectMap]()
)

func (e *Encoder) appendValue(b []byte, v reflect.Value) ([]byte, error) {
	switch v.Type() {
	case unstructuredType:
		return appendObject(b, v.Interface().(*unstructured.Unstructured))
	case objectMapType:
		return appendObjectMap(b, v.Interface().(ObjectMap))
	}
	if v.Kind() == reflect.Interface {
		if u, ok := v.Interface().(*unstructured.Unstructured); ok {
			return e.appendController(b, u)
		}
	}
	data, err := json.Marshal(v.Interface())
	if err != nil {
		return nil, err
	}
	return append(b, data...), nil
}

// appendController is appendObject with the encoding kept per UID and
// resourceVersion (an `any` field holding an object is a controller).
func (e *Encoder) appendController(b []byte, u *unstructured.Unstructured) ([]byte, error) {
	if u == nil || u.Object == nil {
		return appendObject(b, u)
	}
	uid, rv := u.GetUID(), u.GetResourceVersion()
	if uid == "" || rv == "" {
		return appendObject(b, u)
	}
	if c, ok := e.ctrls.Load(uid); ok && c.(encodedObject).rv == rv {
		return append(b, c.(encodedObject).data...), nil
	}
	data, err := ujson.Marshal(u.Object)
	if err != nil {
		return nil, err
	}
	e.ctrls.Store(uid, encodedObject{rv: rv, data: data})
	return append(b, data...), nil
}

// appendObject writes what Unstructured.MarshalJSON gives, compacted.
func appendObject(b []byte, u *unstructured.Unstructured) ([]byte, error) {
	if u == nil {
		return append(b, "null"...), nil
	}
	if u.Object == nil {
		data, err := json.Marshal(u) // whatever Unstructured makes of it
		if err != nil {
			return nil, err
		}
		return append(b, data...), nil
	}
	return ujson.Append(b, u.Object)
}

// appendObjectMap writes what ObjectMap.MarshalJSON gives: {} for a nil
// map or inner map, keys sorted at both levels.
func appendObjectMap(b []byte, m ObjectMap) ([]byte, error) {
	b = append(b, '{')
	for i, k := range slices.Sorted(mapKeys(m)) {
		if i > 0 {
			b = append(b, ',')
		}
		b = appendKey(b, k)
		b = append(b, '{')
		inner := m[k]
		for j, name := range slices.Sorted(mapKeys(inner)) {
			if j > 0 {
				b = append(b, ',')
			}
			b = appendKey(b, name)
			var err error
			if b, err = appendObject(b, inner[name]); err != nil {
				return nil, err
			}
		}
		b = append(b, '}')
	}
	return append(b, '}'), nil
}

func mapKeys[V any](m map[string]V) func(func(string) bool) {
	return func(yield func(string) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

// appendKey writes "key": with encoding/json's string escaping.
func appendKey(b []byte, k string) []byte {
	return append(ujson.AppendString(b, k), ':')
}

// field is one field of a request struct, in declaration order (the order
// json.Marshal writes them).
type field struct {
	index int
	name  string
	key   []byte // "name":
}

var plans sync.Map // reflect.Type → []field (nil: not handled)

// planOf lists the fields of t, or returns nil when t has anything the
// Encoder does not write as json.Marshal would.
func planOf(t reflect.Type) []field {
	if p, ok := plans.Load(t); ok {
		return p.([]field)
	}
	var out []field
	for i := range t.NumField() {
		sf := t.Field(i)
		tag := sf.Tag.Get("json")
		if !sf.IsExported() || sf.Anonymous || tag == "" || tag == "-" || strings.Contains(tag, ",") {
			out = nil
			break
		}
		out = append(out, field{index: i, name: tag, key: appendKey(nil, tag)})
	}
	plans.Store(t, out)
	return out
}
