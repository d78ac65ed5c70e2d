package bus

import (
	"encoding/json"
	"maps"
	"slices"
	"strconv"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/metabus/metabus/pkg/ujson"
)

// appendJSONer is a message body that writes its own JSON: exactly
// json.Marshal's bytes for it, or ok false to leave it to json.Marshal
// (which then also reports any error).
type appendJSONer interface {
	appendJSON(b []byte) ([]byte, bool)
}

// marshalBody is json.Marshal(body), written directly for the bodies
// published per parent: the work item and the desired state.
// json.Marshal reaches a desired state's children through
// Unstructured.MarshalJSON, which encodes each with a json.Encoder of its
// own and has json.Marshal scan the result again; with the reflection
// over every map that was about 36 allocations per desired state.
// TestBodiesMatchJSONMarshal holds the bytes to json.Marshal's, for every
// field (filled by reflection, so a field added to the types without
// being written here fails it).
func marshalBody(body any) ([]byte, error) {
	if a, ok := body.(appendJSONer); ok {
		if data, ok := ujson.Build(a.appendJSON); ok {
			return data, nil
		}
	}
	return json.Marshal(body)
}

func (c ControllerRef) appendJSON(b []byte) []byte {
	b = stringField(b, `{"kind":`, c.Kind)
	b = stringField(b, `,"name":`, c.Name)
	b = optString(b, `,"uid":`, c.UID)
	b = optInt(b, `,"weight":`, int64(c.Weight))
	return append(b, '}')
}

func (o ObjectRef) appendJSON(b []byte) []byte {
	b = stringField(b, `{"apiVersion":`, o.APIVersion)
	b = optString(b, `,"kind":`, o.Kind)
	b = optString(b, `,"resource":`, o.Resource)
	b = optString(b, `,"namespace":`, o.Namespace)
	b = stringField(b, `,"name":`, o.Name)
	b = stringField(b, `,"uid":`, o.UID)
	b = optString(b, `,"resourceVersion":`, o.ResourceVersion)
	b = optInt(b, `,"generation":`, int64(o.Generation))
	return append(b, '}')
}

func (w WorkItem) appendJSON(b []byte) ([]byte, bool) {
	b = append(b, `{"controller":`...)
	b = w.Controller.appendJSON(b)
	b = append(b, `,"parent":`...)
	b = w.Parent.appendJSON(b)
	b = stringField(b, `,"reason":`, w.Reason)
	b = optString(b, `,"mapKey":`, w.MapKey)
	b = optInt(b, `,"attempt":`, int64(w.Attempt))
	b = optString(b, `,"finalizer":`, w.Finalizer)
	if w.AfterSeq != 0 {
		b = append(b, `,"afterSeq":`...)
		b = strconv.AppendUint(b, w.AfterSeq, 10)
	}
	b = optStringMap(b, `,"minResourceVersions":`, w.MinResourceVersions)
	b = append(b, `,"enqueuedAt":`...)
	var ok bool
	if b, ok = appendTime(b, w.EnqueuedAt); !ok {
		return b, false
	}
	return append(b, '}'), true
}

func (d DesiredState) appendJSON(b []byte) ([]byte, bool) {
	var ok bool
	b = append(b, `{"controller":`...)
	b = d.Controller.appendJSON(b)
	b = append(b, `,"parent":`...)
	b = d.Parent.appendJSON(b)
	b = optString(b, `,"mapKey":`, d.MapKey)
	b = optString(b, `,"mapInput":`, d.MapInput)
	b = append(b, `,"workSeq":`...)
	b = strconv.AppendUint(b, d.WorkSeq, 10)
	b = stringField(b, `,"hook":`, d.Hook)
	b = append(b, `,"children":`...)
	if b, ok = appendObjects(b, d.Children); !ok {
		return b, false
	}
	if len(d.Status) > 0 {
		b = append(b, `,"status":`...)
		var err error
		if b, err = ujson.Append(b, d.Status); err != nil {
			return b, false
		}
	}
	if d.ResyncAfterSeconds != 0 {
		b = append(b, `,"resyncAfterSeconds":`...)
		var err error
		if b, err = ujson.Append(b, d.ResyncAfterSeconds); err != nil {
			return b, false
		}
	}
	if d.Finalized {
		b = append(b, `,"finalized":true`...)
	}
	if len(d.Observed) > 0 {
		b = append(b, `,"observed":[`...)
		for i, o := range d.Observed {
			if i > 0 {
				b = append(b, ',')
			}
			b = o.appendJSON(b)
		}
		b = append(b, ']')
	}
	b = optStringMap(b, `,"inputs":`, d.Inputs)
	b = optStringMap(b, `,"minResourceVersions":`, d.MinResourceVersions)
	b = optInt(b, `,"attempt":`, int64(d.Attempt))
	b = optString(b, `,"finalizer":`, d.Finalizer)
	if len(d.Labels) > 0 {
		b = append(b, `,"labels":`...)
		b = appendStringPtrMap(b, d.Labels)
	}
	if len(d.Annotations) > 0 {
		b = append(b, `,"annotations":`...)
		b = appendStringPtrMap(b, d.Annotations)
	}
	if d.StatusSet {
		b = append(b, `,"statusSet":true`...)
	}
	b = append(b, `,"producedAt":`...)
	if b, ok = appendTime(b, d.ProducedAt); !ok {
		return b, false
	}
	b = optString(b, `,"latestRevision":`, d.LatestRevision)
	if len(d.Revisions) > 0 {
		b = append(b, `,"revisions":[`...)
		for i, r := range d.Revisions {
			if i > 0 {
				b = append(b, ',')
			}
			b = append(b, `{"name":`...)
			b = ujson.AppendString(b, r.Name)
			b = append(b, `,"children":`...)
			if b, ok = appendObjects(b, r.Children); !ok {
				return b, false
			}
			b = append(b, '}')
		}
		b = append(b, ']')
	}
	return append(b, '}'), true
}

// appendObjects writes objects as json.Marshal does through
// Unstructured.MarshalJSON: the object's map, compacted (null for a nil
// slice, pointer or map).
func appendObjects(b []byte, objs []*unstructured.Unstructured) ([]byte, bool) {
	if objs == nil {
		return append(b, "null"...), true
	}
	b = append(b, '[')
	for i, u := range objs {
		if i > 0 {
			b = append(b, ',')
		}
		if u == nil {
			b = append(b, "null"...)
			continue
		}
		var err error
		if b, err = ujson.Append(b, u.Object); err != nil {
			return b, false
		}
	}
	return append(b, ']'), true
}

// appendTime writes t as its MarshalJSON does: AppendText's strict
// RFC 3339, quoted (false when it cannot: a year outside [0, 9999] or an
// offset of a day or more).
func appendTime(b []byte, t time.Time) ([]byte, bool) {
	out, err := t.AppendText(append(b, '"'))
	if err != nil {
		return b, false
	}
	return append(out, '"'), true
}

// stringField writes key (`,"name":`) and v.
func stringField(b []byte, key, v string) []byte {
	return ujson.AppendString(append(b, key...), v)
}

// optString is stringField unless v is empty (omitempty).
func optString(b []byte, key, v string) []byte {
	if v == "" {
		return b
	}
	return stringField(b, key, v)
}

// optInt writes key and v unless v is 0 (omitempty).
func optInt(b []byte, key string, v int64) []byte {
	if v == 0 {
		return b
	}
	return strconv.AppendInt(append(b, key...), v, 10)
}

// optStringMap writes key and m unless m is empty (omitempty).
func optStringMap(b []byte, key string, m map[string]string) []byte {
	if len(m) == 0 {
		return b
	}
	return appendStringMap(append(b, key...), m)
}

func appendStringMap(b []byte, m map[string]string) []byte {
	return appendSortedMap(b, m, ujson.AppendString)
}

// appendStringPtrMap writes a nil value as null.
func appendStringPtrMap(b []byte, m map[string]*string) []byte {
	return appendSortedMap(b, m, func(b []byte, v *string) []byte {
		if v == nil {
			return append(b, "null"...)
		}
		return ujson.AppendString(b, *v)
	})
}

// appendSortedMap writes m as json.Marshal does: keys in byte order.
func appendSortedMap[V any](b []byte, m map[string]V, value func([]byte, V) []byte) []byte {
	b = append(b, '{')
	for i, k := range slices.Sorted(maps.Keys(m)) {
		if i > 0 {
			b = append(b, ',')
		}
		b = ujson.AppendString(b, k)
		b = value(append(b, ':'), m[k])
	}
	return append(b, '}')
}
