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
	b = append(b, `{"kind":`...)
	b = ujson.AppendString(b, c.Kind)
	b = append(b, `,"name":`...)
	b = ujson.AppendString(b, c.Name)
	if c.UID != "" {
		b = append(b, `,"uid":`...)
		b = ujson.AppendString(b, c.UID)
	}
	if c.Weight != 0 {
		b = append(b, `,"weight":`...)
		b = strconv.AppendInt(b, int64(c.Weight), 10)
	}
	return append(b, '}')
}

func (o ObjectRef) appendJSON(b []byte) []byte {
	b = append(b, `{"apiVersion":`...)
	b = ujson.AppendString(b, o.APIVersion)
	if o.Kind != "" {
		b = append(b, `,"kind":`...)
		b = ujson.AppendString(b, o.Kind)
	}
	if o.Resource != "" {
		b = append(b, `,"resource":`...)
		b = ujson.AppendString(b, o.Resource)
	}
	if o.Namespace != "" {
		b = append(b, `,"namespace":`...)
		b = ujson.AppendString(b, o.Namespace)
	}
	b = append(b, `,"name":`...)
	b = ujson.AppendString(b, o.Name)
	b = append(b, `,"uid":`...)
	b = ujson.AppendString(b, o.UID)
	if o.ResourceVersion != "" {
		b = append(b, `,"resourceVersion":`...)
		b = ujson.AppendString(b, o.ResourceVersion)
	}
	if o.Generation != 0 {
		b = append(b, `,"generation":`...)
		b = strconv.AppendInt(b, o.Generation, 10)
	}
	return append(b, '}')
}

func (w WorkItem) appendJSON(b []byte) ([]byte, bool) {
	b = append(b, `{"controller":`...)
	b = w.Controller.appendJSON(b)
	b = append(b, `,"parent":`...)
	b = w.Parent.appendJSON(b)
	b = append(b, `,"reason":`...)
	b = ujson.AppendString(b, w.Reason)
	if w.MapKey != "" {
		b = append(b, `,"mapKey":`...)
		b = ujson.AppendString(b, w.MapKey)
	}
	if w.Attempt != 0 {
		b = append(b, `,"attempt":`...)
		b = strconv.AppendInt(b, int64(w.Attempt), 10)
	}
	if w.Finalizer != "" {
		b = append(b, `,"finalizer":`...)
		b = ujson.AppendString(b, w.Finalizer)
	}
	if w.AfterSeq != 0 {
		b = append(b, `,"afterSeq":`...)
		b = strconv.AppendUint(b, w.AfterSeq, 10)
	}
	if len(w.MinResourceVersions) > 0 {
		b = append(b, `,"minResourceVersions":`...)
		b = appendStringMap(b, w.MinResourceVersions)
	}
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
	if d.MapKey != "" {
		b = append(b, `,"mapKey":`...)
		b = ujson.AppendString(b, d.MapKey)
	}
	if d.MapInput != "" {
		b = append(b, `,"mapInput":`...)
		b = ujson.AppendString(b, d.MapInput)
	}
	b = append(b, `,"workSeq":`...)
	b = strconv.AppendUint(b, d.WorkSeq, 10)
	b = append(b, `,"hook":`...)
	b = ujson.AppendString(b, d.Hook)
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
	if len(d.Inputs) > 0 {
		b = append(b, `,"inputs":`...)
		b = appendStringMap(b, d.Inputs)
	}
	if len(d.MinResourceVersions) > 0 {
		b = append(b, `,"minResourceVersions":`...)
		b = appendStringMap(b, d.MinResourceVersions)
	}
	if d.Attempt != 0 {
		b = append(b, `,"attempt":`...)
		b = strconv.AppendInt(b, int64(d.Attempt), 10)
	}
	if d.Finalizer != "" {
		b = append(b, `,"finalizer":`...)
		b = ujson.AppendString(b, d.Finalizer)
	}
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
	if d.LatestRevision != "" {
		b = append(b, `,"latestRevision":`...)
		b = ujson.AppendString(b, d.LatestRevision)
	}
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

func appendStringMap(b []byte, m map[string]string) []byte {
	b = append(b, '{')
	for i, k := range slices.Sorted(maps.Keys(m)) {
		if i > 0 {
			b = append(b, ',')
		}
		b = ujson.AppendString(b, k)
		b = append(b, ':')
		b = ujson.AppendString(b, m[k])
	}
	return append(b, '}')
}

func appendStringPtrMap(b []byte, m map[string]*string) []byte {
	b = append(b, '{')
	for i, k := range slices.Sorted(maps.Keys(m)) {
		if i > 0 {
			b = append(b, ',')
		}
		b = ujson.AppendString(b, k)
		b = append(b, ':')
		if v := m[k]; v == nil {
			b = append(b, "null"...)
		} else {
			b = ujson.AppendString(b, *v)
		}
	}
	return append(b, '}')
}
