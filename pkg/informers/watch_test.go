package informers

import (
	"errors"
	"io"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"
	"testing/iotest"
	"time"

	"github.com/google/go-cmp/cmp"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	sigsjson "sigs.k8s.io/json"
)

// newRegistry is the registry the watcher runs: one-pass watches on the
// test control plane.
func newRegistry(t *testing.T) *Registry {
	t.Helper()
	r, err := NewForConfig(env.Config, 0)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

type decoded struct {
	Type   watch.EventType
	Object map[string]any
	Err    string
}

func decodeAll(stream string) []decoded {
	d := newEventDecoder(io.NopCloser(strings.NewReader(stream)))
	defer d.Close()
	var out []decoded
	for {
		typ, obj, err := d.Decode()
		if err != nil {
			if !errors.Is(err, io.EOF) {
				out = append(out, decoded{Err: err.Error()})
			}
			return out
		}
		out = append(out, decoded{Type: typ, Object: obj.(*unstructured.Unstructured).Object})
	}
}

func TestEventDecoder(t *testing.T) {
	cm := `{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"a","generation":3},"data":{"k":"v"}}`
	for _, tc := range []struct {
		reason, stream string
		want           []decoded
	}{{
		reason: "events one after another, with the whitespace the API server puts between them",
		stream: `{"type":"ADDED","object":` + cm + "}\n" + `{"type":"MODIFIED","object":` + cm + "}\n",
		want: []decoded{
			{Type: watch.Added, Object: map[string]any{"apiVersion": "v1", "kind": "ConfigMap", "metadata": map[string]any{"name": "a", "generation": int64(3)}, "data": map[string]any{"k": "v"}}},
			{Type: watch.Modified, Object: map[string]any{"apiVersion": "v1", "kind": "ConfigMap", "metadata": map[string]any{"name": "a", "generation": int64(3)}, "data": map[string]any{"k": "v"}}},
		},
	}, {
		reason: "integers stay int64 and fractions float64, as the dynamic client decodes them",
		stream: `{"type":"DELETED","object":{"kind":"X","spec":{"n":7,"big":9007199254740993,"f":1.5}}}`,
		want:   []decoded{{Type: watch.Deleted, Object: map[string]any{"kind": "X", "spec": map[string]any{"n": int64(7), "big": int64(9007199254740993), "f": 1.5}}}},
	}, {
		reason: "a bookmark carries only the resource version",
		stream: `{"type":"BOOKMARK","object":{"kind":"ConfigMap","apiVersion":"v1","metadata":{"resourceVersion":"12"}}}`,
		want:   []decoded{{Type: watch.Bookmark, Object: map[string]any{"kind": "ConfigMap", "apiVersion": "v1", "metadata": map[string]any{"resourceVersion": "12"}}}},
	}, {
		reason: "an ERROR event's Status is passed on for the reflector to read",
		stream: `{"type":"ERROR","object":{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"Expired","code":410}}`,
		want:   []decoded{{Type: watch.Error, Object: map[string]any{"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "Expired", "code": int64(410)}}},
	}, {
		reason: "keys are matched case-sensitively: a differently cased envelope is not an event",
		stream: `{"Type":"ADDED","Object":` + cm + `}`,
		want:   []decoded{{Err: `watch event of unknown type ""`}},
	}, {
		reason: "an unknown event type is an error, not an event",
		stream: `{"type":"RENAMED","object":` + cm + `}`,
		want:   []decoded{{Err: `watch event of unknown type "RENAMED"`}},
	}, {
		reason: "an event without an object is an error",
		stream: `{"type":"ADDED"}`,
		want:   []decoded{{Err: "watch ADDED event without an object"}},
	}, {
		reason: "an object without a kind is an error, as in client-go",
		stream: `{"type":"ADDED","object":{"metadata":{"name":"a"}}}`,
		want:   []decoded{{Err: "watch ADDED event: object has no kind"}},
	}, {
		reason: "a stream cut inside an event ends with an error after the complete ones",
		stream: `{"type":"ADDED","object":{"kind":"X"}}{"type":"MODIFIED","obj`,
		want:   []decoded{{Type: watch.Added, Object: map[string]any{"kind": "X"}}, {Err: "unexpected EOF"}},
	}, {
		reason: "an empty stream is a clean end",
		stream: ``,
	}} {
		t.Run(tc.reason, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, decodeAll(tc.stream)); diff != "" {
				t.Errorf("decoded events (-want +got):\n%s", diff)
			}
		})
	}
}

// TestWatchJSONMatchesDynamicClient: on a real API server, the one-pass
// watch yields exactly the events the dynamic client's watch yields from
// the same resource version (objects with integers included), and a
// failed request is the same typed error.
func TestWatchJSONMatchesDynamicClient(t *testing.T) {
	requireEnv(t)
	ctx := testCtx(t)
	dyn := dynClient(t)
	rc, err := rest.UnversionedRESTClientFor(dynamic.ConfigFor(env.Config))
	if err != nil {
		t.Fatal(err)
	}
	leases := schema.GroupVersionResource{Group: "coordination.k8s.io", Version: "v1", Resource: "leases"}
	ns := createNamespace(t, dyn, "inf-watch")
	list, err := dyn.Resource(leases).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	opts := metav1.ListOptions{ResourceVersion: list.GetResourceVersion(), FieldSelector: "metadata.namespace=" + ns}
	mine, err := watchJSON(ctx, rc, leases, opts, newInterner().key)
	if err != nil {
		t.Fatal(err)
	}
	defer mine.Stop()
	opts.Watch = true
	theirs, err := dyn.Resource(leases).Watch(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer theirs.Stop()

	lease := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
		"metadata": map[string]any{"name": "l", "namespace": ns, "labels": map[string]any{"a": "b"}},
		"spec":     map[string]any{"holderIdentity": "x", "leaseDurationSeconds": int64(15)},
	}}
	c := dyn.Resource(leases).Namespace(ns)
	got, err := c.Create(ctx, lease, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := unstructured.SetNestedField(got.Object, int64(30), "spec", "leaseDurationSeconds"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Update(ctx, got, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := c.Delete(ctx, "l", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	want, gotEvents := collect(t, theirs, 3), collect(t, mine, 3)
	if diff := cmp.Diff(want, gotEvents); diff != "" {
		t.Errorf("one-pass watch events differ from the dynamic client's (-dynamic +one-pass):\n%s", diff)
	}
	if d, _, _ := unstructured.NestedInt64(gotEvents[1].Object, "spec", "leaseDurationSeconds"); d != 30 {
		t.Errorf("updated leaseDurationSeconds decoded as %v, want int64 30", gotEvents[1].Object["spec"])
	}

	// A failed request is the same typed error the dynamic client gives
	// (the reflector decides by its type whether to relist).
	none := schema.GroupVersionResource{Group: "nope.example.com", Version: "v1", Resource: "things"}
	if _, err := watchJSON(ctx, rc, none, metav1.ListOptions{}, nil); !apierrors.IsNotFound(err) {
		_, theirErr := dyn.Resource(none).Watch(ctx, metav1.ListOptions{Watch: true})
		t.Errorf("one-pass watch of an unknown resource: %v, want NotFound like the dynamic client's %v", err, theirErr)
	}
}

func collect(t *testing.T, w watch.Interface, n int) []decoded {
	t.Helper()
	var out []decoded
	timeout := time.After(15 * time.Second)
	for len(out) < n {
		select {
		case ev, ok := <-w.ResultChan():
			if !ok {
				t.Fatalf("watch closed after %d events", len(out))
			}
			out = append(out, decoded{Type: ev.Type, Object: toMap(t, ev.Object)})
		case <-timeout:
			t.Fatalf("%d of %d events after 15s", len(out), n)
		}
	}
	return out
}

func toMap(t *testing.T, obj runtime.Object) map[string]any {
	t.Helper()
	u, ok := obj.(*unstructured.Unstructured)
	if !ok {
		t.Fatalf("event object is %T, want *unstructured.Unstructured", obj)
	}
	return u.Object
}

// oldDecodeAll decodes a stream as the decoder before the one-pass parser
// did: sigs.k8s.io/json's stream decoder for every event.
func oldDecodeAll(r io.Reader) []decodedErr {
	d := &eventDecoder{body: io.NopCloser(r), slow: sigsjson.NewDecoderCaseSensitivePreserveInts(r)}
	return drain(d)
}

// decodedErr is an event, or the error that ended the stream (the error
// value too: the StreamWatcher tells io.EOF, io.ErrUnexpectedEOF and
// the reader's errors apart).
type decodedErr struct {
	Type   watch.EventType
	Object map[string]any
	Err    string
	ErrVal error
}

func drain(d *eventDecoder) []decodedErr {
	var out []decodedErr
	for {
		typ, obj, err := d.Decode()
		if err != nil {
			return append(out, decodedErr{Err: err.Error(), ErrVal: comparableErr(err)})
		}
		out = append(out, decodedErr{Type: typ, Object: obj.(*unstructured.Unstructured).Object})
	}
}

// comparableErr keeps the errors a StreamWatcher compares by identity.
func comparableErr(err error) error {
	if err == io.EOF || err == io.ErrUnexpectedEOF || err == errReader {
		return err
	}
	return nil
}

var errReader = errors.New("connection reset")

// chunkReader gives its data in pieces of random sizes, then err.
type chunkReader struct {
	data []byte
	r    *rand.Rand
	err  error
}

func (c *chunkReader) Read(p []byte) (int, error) {
	if len(c.data) == 0 {
		return 0, c.err
	}
	n := min(len(p), len(c.data), 1+c.r.IntN(300))
	if c.r.IntN(10) == 0 {
		n = 0 // a read that gives nothing, which io.Reader allows
	}
	copy(p, c.data[:n])
	c.data = c.data[n:]
	return n, nil
}

// TestEventDecoderMatchesSigsJSON decodes generated watch streams with
// the one-pass decoder and with sigs.k8s.io/json's stream decoder alone,
// read in random pieces: the same events, then the same error (text and,
// for the ones compared by identity, value). Streams mix the events the
// API server writes with odd envelopes (duplicate, null, cased and extra
// fields, objects that are not), corrupted bytes and cut streams.
func TestEventDecoderMatchesSigsJSON(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	n := 3000
	if testing.Short() {
		n = 1000
	}
	fast, events := 0, 0
	in := newInterner() // as an informer's watches use it
	for i := range n {
		stream := randomStream(r)
		end := io.EOF
		if r.IntN(5) == 0 {
			end = errReader
		}
		seed := r.Uint64()
		want := oldDecodeAll(&chunkReader{data: []byte(stream), r: rand.New(rand.NewPCG(seed, 1)), err: end})
		d := newEventDecoder(io.NopCloser(&chunkReader{data: []byte(stream), r: rand.New(rand.NewPCG(seed, 2)), err: end}))
		if i%2 == 0 {
			d.keys = in.key
		}
		got := drain(d)
		if diff := cmp.Diff(want, got, cmp.Comparer(func(a, b error) bool { return a == b })); diff != "" {
			t.Fatalf("stream %d %q: events differ from sigs.k8s.io/json's (-want +got):\n%s", i, stream, diff)
		}
		fast += d.fast
		events += len(got) - 1
	}
	// Most events are the API server's: the one-pass path must take
	// them, or the comparison holds little.
	if fast < events/2 {
		t.Errorf("the one-pass path decoded %d of %d events", fast, events)
	}
}

func randomStream(r *rand.Rand) string {
	var b strings.Builder
	for range r.IntN(6) {
		b.WriteString([]string{"", "\n", " ", "\r\n\t"}[r.IntN(4)])
		b.WriteString(randomEvent(r))
	}
	b.WriteString([]string{"", "\n", " "}[r.IntN(3)])
	s := b.String()
	if s != "" && r.IntN(5) == 0 {
		i := r.IntN(len(s))
		switch r.IntN(3) {
		case 0:
			const junk = "{}[]\",:\\ \x01\nae-.0"
			s = s[:i] + string(junk[r.IntN(len(junk))]) + s[i+1:]
		case 1:
			s = s[:i] + s[i+1:]
		default:
			s = s[:i]
		}
	}
	return s
}

var eventValues = []string{`0`, `-7`, `1.0`, `1e3`, `9223372036854775808`, `1e400`, `"s"`, `"\u00e9\ud83d\ude80\ud83d"`, "\"\xff\"",
	`true`, `null`, `[]`, `{}`, `[1,"a",{"b":null}]`, `{"x":{"y":[2.5]}}`}

func randomObject(r *rand.Rand) string {
	fields := []string{`"kind":"ConfigMap"`, `"apiVersion":"v1"`, `"metadata":{"name":"a","namespace":"ns","resourceVersion":"12","generation":3,"labels":{"k":"v"}}`}
	if r.IntN(10) == 0 {
		fields[0] = []string{`"kind":""`, `"kind":5`, `"Kind":"X"`, `"kind":null`}[r.IntN(4)]
	}
	for range r.IntN(4) {
		fields = append(fields, `"f`+strconv.Itoa(r.IntN(3))+`":`+eventValues[r.IntN(len(eventValues))])
	}
	r.Shuffle(len(fields), func(i, j int) { fields[i], fields[j] = fields[j], fields[i] })
	return "{" + strings.Join(fields, ",") + "}"
}

func randomEvent(r *rand.Rand) string {
	typ := `"type":` + []string{`"ADDED"`, `"MODIFIED"`, `"DELETED"`, `"BOOKMARK"`, `"ERROR"`}[r.IntN(5)]
	obj := `"object":` + randomObject(r)
	fields := []string{typ, obj}
	switch r.IntN(12) {
	case 0:
		fields = append(fields, `"object":`+randomObject(r)) // merged into the first by the old decoder
	case 1:
		fields = append(fields, `"type":"MODIFIED"`)
	case 2:
		fields = append(fields, `"type":null`)
	case 3:
		fields[1] = `"object":null`
	case 4:
		fields[1] = `"object":` + eventValues[r.IntN(len(eventValues))]
	case 5:
		fields[0] = `"type":` + eventValues[r.IntN(len(eventValues))]
	case 6:
		fields = append(fields, `"extra":`+eventValues[r.IntN(len(eventValues))])
	case 7:
		fields[0] = `"Type":"ADDED"`
	case 8:
		return []string{`null`, `[]`, `"event"`, `12`, `{}`}[r.IntN(5)]
	}
	r.Shuffle(len(fields), func(i, j int) { fields[i], fields[j] = fields[j], fields[i] })
	return "{" + strings.Join(fields, ",") + "}"
}

// TestEventDecoderLargeObject: an event many times the buffer's size,
// read a byte at a time, between small ones; the buffer shrinks back
// after it.
func TestEventDecoderLargeObject(t *testing.T) {
	big := strings.Repeat("x", 3<<20)
	stream := `{"type":"ADDED","object":{"kind":"A"}}` + "\n" +
		`{"type":"MODIFIED","object":{"kind":"B","data":{"big":"` + big + `"}}}` + "\n" +
		`{"type":"DELETED","object":{"kind":"C"}}` + "\n"
	d := newEventDecoder(io.NopCloser(iotest.OneByteReader(strings.NewReader(stream))))
	got := drain(d)
	want := []decodedErr{
		{Type: watch.Added, Object: map[string]any{"kind": "A"}},
		{Type: watch.Modified, Object: map[string]any{"kind": "B", "data": map[string]any{"big": big}}},
		{Type: watch.Deleted, Object: map[string]any{"kind": "C"}},
		{Err: "EOF", ErrVal: io.EOF},
	}
	if diff := cmp.Diff(want, got, cmp.Comparer(func(a, b error) bool { return a == b })); diff != "" {
		t.Errorf("events (-want +got):\n%s", diff)
	}
	if d.fast != 3 {
		t.Errorf("the one-pass path decoded %d of the 3 events", d.fast)
	}
}
