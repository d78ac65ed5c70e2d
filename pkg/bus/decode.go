package bus

import (
	"encoding/json"
	"reflect"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/metabus/metabus/pkg/ujson"
)

// decodeBody is json.Unmarshal(data, into), read directly for the bodies
// consumed per parent: the work item and the desired state. json.Unmarshal
// walks them by reflection and decodes a desired state's children through
// Unstructured.UnmarshalJSON, which has sigs.k8s.io/json parse each child
// again; that was 3-4% of an all-in-one process's CPU under load.
//
// The direct path takes bodies of the shape marshalBody writes (each field
// once, under its exact name, with a value of its type; a null leaves a
// field zero) into a zero value, and gives what json.Unmarshal gives: the
// status as encoding/json decodes an any (every number a float64), each
// child as Unstructured.UnmarshalJSON does (integers int64, a kind
// required). Anything else (a key in another case, an unknown field, a
// duplicate, a number out of range, malformed JSON, a target that is not
// zero) goes to json.Unmarshal, which decides. TestBodiesDecodeAsJSONUnmarshal
// and FuzzDecodeBody hold the two together.
func decodeBody(data []byte, into any) error {
	switch v := into.(type) {
	case *WorkItem:
		if isZero(v) {
			var w WorkItem
			if r := ujson.NewReader(data, false); w.readJSON(r) && r.End() {
				*v = w
				return nil
			}
		}
	case *DesiredState:
		if isZero(v) {
			var d DesiredState
			if r := ujson.NewReader(data, false); d.readJSON(r) && r.End() {
				*v = d
				return nil
			}
		}
	}
	return json.Unmarshal(data, into)
}

// isZero: json.Unmarshal merges into what a target holds (its maps, its
// slices' elements), the direct path does not.
func isZero[T any](v *T) bool { return reflect.ValueOf(v).Elem().IsZero() }

// Readers of one field each, called with the Reader at the value: a null
// leaves the (zero) field as it is, as json.Unmarshal does; any other
// value must be of the field's type.

// once marks field bit as read, false the second time (json.Unmarshal
// would merge a second object into the first's maps: left to it).
func once(seen *uint64, bit uint) bool {
	if *seen&(1<<bit) != 0 {
		return false
	}
	*seen |= 1 << bit
	return true
}

func readString(r *ujson.Reader, dst *string) bool {
	if r.Null() {
		return true
	}
	if r.Peek() != '"' {
		return false
	}
	s, ok := r.String()
	*dst = s
	return ok
}

func readInt[T int | int64](r *ujson.Reader, dst *T) bool {
	if r.Null() {
		return true
	}
	n, ok := r.Int()
	*dst = T(n)
	return ok
}

func readUint(r *ujson.Reader, dst *uint64) bool {
	if r.Null() {
		return true
	}
	n, ok := r.Uint()
	*dst = n
	return ok
}

func readFloat(r *ujson.Reader, dst *float64) bool {
	if r.Null() {
		return true
	}
	f, ok := r.Float()
	*dst = f
	return ok
}

func readBool(r *ujson.Reader, dst *bool) bool {
	if r.Null() {
		return true
	}
	b, ok := r.Bool()
	*dst = b
	return ok
}

// readTime gives the literal to time.Time's UnmarshalJSON, as
// json.Unmarshal does.
func readTime(r *ujson.Reader, dst *time.Time) bool {
	if r.Null() {
		return true
	}
	raw, ok := r.RawString()
	return ok && dst.UnmarshalJSON(raw) == nil
}

func readStringMap(r *ujson.Reader, dst *map[string]string) bool {
	if r.Null() {
		return true
	}
	m := make(map[string]string)
	*dst = m
	return r.Object(func(key []byte) bool {
		// A null value would be "" in json.Unmarshal's map: left to it.
		if r.Peek() != '"' {
			return false
		}
		v, ok := r.String()
		m[string(key)] = v
		return ok
	})
}

func readStringPtrMap(r *ujson.Reader, dst *map[string]*string) bool {
	if r.Null() {
		return true
	}
	m := make(map[string]*string)
	*dst = m
	return r.Object(func(key []byte) bool {
		if r.Null() {
			m[string(key)] = nil
			return true
		}
		if r.Peek() != '"' {
			return false
		}
		v, ok := r.String()
		m[string(key)] = &v
		return ok
	})
}

// readAnyMap reads a map[string]any as encoding/json does: numbers are
// float64.
func readAnyMap(r *ujson.Reader, dst *map[string]any) bool {
	if r.Null() {
		return true
	}
	if r.Peek() != '{' {
		return false
	}
	m, ok := r.Map()
	*dst = m
	return ok
}

// readObjects reads unstructured objects as json.Unmarshal does through
// Unstructured.UnmarshalJSON: each an object decoded by sigs.k8s.io/json
// (integers int64) that has a kind; a null element is a nil pointer.
func readObjects(r *ujson.Reader, dst *[]*unstructured.Unstructured) bool {
	if r.Null() {
		return true
	}
	objs := make([]*unstructured.Unstructured, 0)
	ok := r.Array(func() bool {
		if r.Null() {
			objs = append(objs, nil)
			return true
		}
		if r.Peek() != '{' {
			return false
		}
		r.PreserveInts = true
		m, ok := r.Map()
		r.PreserveInts = false
		u := &unstructured.Unstructured{Object: m}
		objs = append(objs, u)
		return ok && u.GetKind() != ""
	})
	*dst = objs
	return ok
}

func (c *ControllerRef) readJSON(r *ujson.Reader) bool {
	if r.Null() {
		return true
	}
	var seen uint64
	return r.Object(func(key []byte) bool {
		switch string(key) {
		case "kind":
			return once(&seen, 0) && readString(r, &c.Kind)
		case "name":
			return once(&seen, 1) && readString(r, &c.Name)
		case "uid":
			return once(&seen, 2) && readString(r, &c.UID)
		case "weight":
			return once(&seen, 3) && readInt(r, &c.Weight)
		}
		return false
	})
}

func (o *ObjectRef) readJSON(r *ujson.Reader) bool {
	if r.Null() {
		return true
	}
	var seen uint64
	return r.Object(func(key []byte) bool {
		switch string(key) {
		case "apiVersion":
			return once(&seen, 0) && readString(r, &o.APIVersion)
		case "kind":
			return once(&seen, 1) && readString(r, &o.Kind)
		case "resource":
			return once(&seen, 2) && readString(r, &o.Resource)
		case "namespace":
			return once(&seen, 3) && readString(r, &o.Namespace)
		case "name":
			return once(&seen, 4) && readString(r, &o.Name)
		case "uid":
			return once(&seen, 5) && readString(r, &o.UID)
		case "resourceVersion":
			return once(&seen, 6) && readString(r, &o.ResourceVersion)
		case "generation":
			return once(&seen, 7) && readInt(r, &o.Generation)
		}
		return false
	})
}

func (w *WorkItem) readJSON(r *ujson.Reader) bool {
	var seen uint64
	return r.Object(func(key []byte) bool {
		switch string(key) {
		case "controller":
			return once(&seen, 0) && w.Controller.readJSON(r)
		case "parent":
			return once(&seen, 1) && w.Parent.readJSON(r)
		case "reason":
			return once(&seen, 2) && readString(r, &w.Reason)
		case "mapKey":
			return once(&seen, 3) && readString(r, &w.MapKey)
		case "attempt":
			return once(&seen, 4) && readInt(r, &w.Attempt)
		case "finalizer":
			return once(&seen, 5) && readString(r, &w.Finalizer)
		case "afterSeq":
			return once(&seen, 6) && readUint(r, &w.AfterSeq)
		case "minResourceVersions":
			return once(&seen, 7) && readStringMap(r, &w.MinResourceVersions)
		case "enqueuedAt":
			return once(&seen, 8) && readTime(r, &w.EnqueuedAt)
		}
		return false
	})
}

func (d *DesiredState) readJSON(r *ujson.Reader) bool {
	var seen uint64
	return r.Object(func(key []byte) bool {
		switch string(key) {
		case "controller":
			return once(&seen, 0) && d.Controller.readJSON(r)
		case "parent":
			return once(&seen, 1) && d.Parent.readJSON(r)
		case "mapKey":
			return once(&seen, 2) && readString(r, &d.MapKey)
		case "mapInput":
			return once(&seen, 3) && readString(r, &d.MapInput)
		case "workSeq":
			return once(&seen, 4) && readUint(r, &d.WorkSeq)
		case "hook":
			return once(&seen, 5) && readString(r, &d.Hook)
		case "children":
			return once(&seen, 6) && readObjects(r, &d.Children)
		case "status":
			return once(&seen, 7) && readAnyMap(r, &d.Status)
		case "resyncAfterSeconds":
			return once(&seen, 8) && readFloat(r, &d.ResyncAfterSeconds)
		case "finalized":
			return once(&seen, 9) && readBool(r, &d.Finalized)
		case "observed":
			return once(&seen, 10) && readObjectRefs(r, &d.Observed)
		case "inputs":
			return once(&seen, 11) && readStringMap(r, &d.Inputs)
		case "minResourceVersions":
			return once(&seen, 12) && readStringMap(r, &d.MinResourceVersions)
		case "attempt":
			return once(&seen, 13) && readInt(r, &d.Attempt)
		case "finalizer":
			return once(&seen, 14) && readString(r, &d.Finalizer)
		case "labels":
			return once(&seen, 15) && readStringPtrMap(r, &d.Labels)
		case "annotations":
			return once(&seen, 16) && readStringPtrMap(r, &d.Annotations)
		case "statusSet":
			return once(&seen, 17) && readBool(r, &d.StatusSet)
		case "producedAt":
			return once(&seen, 18) && readTime(r, &d.ProducedAt)
		case "latestRevision":
			return once(&seen, 19) && readString(r, &d.LatestRevision)
		case "revisions":
			return once(&seen, 20) && readRevisions(r, &d.Revisions)
		}
		return false
	})
}

func readObjectRefs(r *ujson.Reader, dst *[]ObjectRef) bool {
	if r.Null() {
		return true
	}
	refs := make([]ObjectRef, 0)
	ok := r.Array(func() bool {
		refs = append(refs, ObjectRef{})
		return refs[len(refs)-1].readJSON(r)
	})
	*dst = refs
	return ok
}

func readRevisions(r *ujson.Reader, dst *[]RevisionChildren) bool {
	if r.Null() {
		return true
	}
	revs := make([]RevisionChildren, 0)
	ok := r.Array(func() bool {
		if r.Null() {
			revs = append(revs, RevisionChildren{})
			return true
		}
		var rc RevisionChildren
		var seen uint64
		ok := r.Object(func(key []byte) bool {
			switch string(key) {
			case "name":
				return once(&seen, 0) && readString(r, &rc.Name)
			case "children":
				return once(&seen, 1) && readObjects(r, &rc.Children)
			}
			return false
		})
		revs = append(revs, rc)
		return ok
	})
	*dst = revs
	return ok
}
