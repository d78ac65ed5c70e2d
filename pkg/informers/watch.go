package informers

import (
	"context"
	"fmt"
	"io"
	"net/http"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"
	"k8s.io/klog/v2"
	sigsjson "sigs.k8s.io/json"

	"github.com/metabus/metabus/pkg/ujson"
)

// watchJSON opens a watch of every namespace of gvr and decodes each event
// in one pass, straight into the object an informer caches.
//
// Why not the dynamic client's watch: client-go reads a frame, scans it
// for apiVersion and kind, decodes the WatchEvent envelope (copying the
// object's bytes), then decodes the object and scans it for its kind
// again: seven passes over every event's bytes, about a tenth of an
// all-in-one process's CPU under load (the B1 benchmark). Here the
// stream's JSON is scanned once to find the event's end and parsed once,
// with the same number handling as the dynamic client (integers stay
// int64, keys are matched case-sensitively).
//
// keys, if not nil, gives the strings of the objects' map keys
// (ujson.Reader.Keys).
func watchJSON(ctx context.Context, rc rest.Interface, gvr schema.GroupVersionResource, opts metav1.ListOptions, keys func([]byte) string) (watch.Interface, error) {
	opts.Watch = true
	body, err := rc.Get().AbsPath(resourcePath(gvr)...).
		SpecificallyVersionedParams(&opts, metav1.ParameterCodec, schema.GroupVersion{Version: "v1"}).
		SetHeader("Accept", "application/json").
		Stream(ctx)
	if err != nil {
		return nil, err
	}
	d := newEventDecoder(body)
	d.keys = keys
	return watch.NewStreamWatcherWithLogger(klog.FromContext(ctx), d,
		// 500, as client-go's own watches: the cause of a decoding error
		// is unknown.
		apierrors.NewClientErrorReporter(http.StatusInternalServerError, http.MethodGet, "ClientWatchDecoding")), nil
}

// resourcePath is the collection path of gvr across namespaces.
func resourcePath(gvr schema.GroupVersionResource) []string {
	if gvr.Group == "" {
		return []string{"api", gvr.Version, gvr.Resource}
	}
	return []string{"apis", gvr.Group, gvr.Version, gvr.Resource}
}

// eventDecoder decodes a JSON watch stream ({"type":..,"object":{..}} per
// event) into unstructured objects.
//
// Each event is framed by a ujson.Stream and parsed by a ujson.Reader,
// without reflection: what sigs.k8s.io/json's decoder (the dynamic
// client's, with the same number handling) made of it, at about half the
// allocations. An event that path does not take (malformed, or of a shape
// it leaves alone: a duplicate field, a null, a number out of range, the
// stream's end) is decoded from its first byte by that decoder, which
// keeps the stream from then on: its result and errors (io.EOF,
// io.ErrUnexpectedEOF and the reader's own, which the StreamWatcher tells
// apart) are the old decoder's by construction. TestEventDecoderMatchesSigsJSON
// holds the two together over generated streams.
type eventDecoder struct {
	body   io.ReadCloser
	stream *ujson.Stream
	// slow is the fallback, nil until an event needs it.
	slow sigsjson.Decoder
	// fast counts the events parsed without it (for tests).
	fast int
	// keys is the Reader's Keys.
	keys func([]byte) string
}

func newEventDecoder(body io.ReadCloser) *eventDecoder {
	return &eventDecoder{body: body, stream: ujson.NewStream(body)}
}

// wireEvent is metav1.WatchEvent with the object decoded in place.
type wireEvent struct {
	Type   watch.EventType `json:"type"`
	Object map[string]any  `json:"object"`
}

// Decode returns the next event. io.EOF is the stream's normal end.
func (d *eventDecoder) Decode() (watch.EventType, runtime.Object, error) {
	ev, err := d.next()
	if err != nil {
		return "", nil, err
	}
	switch ev.Type {
	case watch.Added, watch.Modified, watch.Deleted, watch.Error, watch.Bookmark:
	default:
		return "", nil, fmt.Errorf("watch event of unknown type %q", ev.Type)
	}
	if ev.Object == nil {
		return "", nil, fmt.Errorf("watch %s event without an object", ev.Type)
	}
	u := &unstructured.Unstructured{Object: ev.Object}
	if u.GetKind() == "" {
		// What the dynamic client's decoder refuses too; an ERROR event
		// carries a Status, which has a kind.
		return "", nil, fmt.Errorf("watch %s event: object has no kind", ev.Type)
	}
	return ev.Type, u, nil
}

// next decodes the next event's envelope.
func (d *eventDecoder) next() (wireEvent, error) {
	if d.slow == nil {
		if frame, ok := d.stream.Next(); ok {
			if ev, ok := parseEvent(frame, d.keys); ok {
				d.fast++
				return ev, nil
			}
		}
		d.slow = sigsjson.NewDecoderCaseSensitivePreserveInts(d.stream.Rest())
	}
	var ev wireEvent
	err := d.slow.Decode(&ev)
	return ev, err
}

// parseEvent parses one event as the old decoder does into a wireEvent,
// for the events the API server writes: each field once, "type" a string,
// "object" an object, other fields skipped; false for anything else.
func parseEvent(frame []byte, keys func([]byte) string) (wireEvent, bool) {
	var ev wireEvent
	r := ujson.NewReader(frame, true)
	r.Keys = keys
	sawType := false
	ok := r.Object(func(key []byte) bool {
		switch string(key) {
		case "type":
			if sawType || r.Peek() != '"' {
				return false
			}
			sawType = true
			s, ok := r.String()
			ev.Type = watch.EventType(s)
			return ok
		case "object":
			if ev.Object != nil || r.Peek() != '{' {
				return false
			}
			m, ok := r.Map()
			ev.Object = m
			return ok
		default:
			return r.Skip()
		}
	})
	return ev, ok && r.End()
}

// Close closes the stream.
func (d *eventDecoder) Close() { _ = d.body.Close() }
