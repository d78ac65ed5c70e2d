// Package hooktest calls a hook.Handler the way metabus does, in process
// and without a cluster: with a request fixture (a JSON file or a typed
// request) as plain JSON, as a binary-mode and as a structured-mode
// CloudEvent, through the handler's real HTTP decoding and encoding.
//
//	resp := hooktest.Call[hook.CompositeResponse](t, h, hook.KindSync, req)
//
// Call and CallFile fail the test unless every mode gives the same
// answer; Do returns one mode's raw answer, to check errors and
// throttling; DoURL does the same with a hook served at a URL, in any
// language.
package hooktest

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/cloudevents/sdk-go/v2/binding"
	"github.com/cloudevents/sdk-go/v2/event"
	cehttp "github.com/cloudevents/sdk-go/v2/protocol/http"
	"github.com/google/go-cmp/cmp"
	kjson "sigs.k8s.io/json"

	"github.com/metabus/metabus/pkg/hookwire"
	"github.com/metabus/metabus/sdk/hook"
)

// Modes are the ways metabus (or a legacy caller) calls a hook.
var Modes = []hook.Mode{hook.ModePlain, hook.ModeBinary, hook.ModeStructured}

// Reply is one call's answer.
type Reply struct {
	// Code is the HTTP status: 200, or the failure's code.
	Code int
	// Data is the JSON response of a 200 (the CloudEvent's data in the
	// CloudEvents modes); Message the text of a failure.
	Data    []byte
	Message string
	// RetryAfter is a 429's delay.
	RetryAfter time.Duration
	// Event is the answer of a CloudEvents mode, nil in ModePlain.
	Event *event.Event
}

// Request builds the HTTP request metabus would send to a hook of kind
// with body in mode: in the CloudEvents modes, type
// hookwire.EventType(kind), a test source, subject and id, and the parent
// UID (read from body's "parent" or "object") as extension
// hookwire.ExtParentUID.
func Request(mode hook.Mode, kind string, body []byte) (*http.Request, error) {
	if mode == hook.ModePlain {
		r := httptest.NewRequest(http.MethodPost, "/"+kind, bytes.NewReader(body))
		r.Header.Set("Content-Type", hookwire.ContentTypeJSON)
		return r, nil
	}
	ev := event.New()
	ev.SetID("hooktest-" + kind)
	ev.SetType(hookwire.EventType(kind))
	ev.SetSource("/apis/metacontroller.k8s.io/v1alpha1/hooktest")
	ev.SetTime(time.Now())
	var peek struct {
		Parent, Object *struct {
			Metadata struct {
				Name, Namespace, UID string
			}
		}
	}
	_ = json.Unmarshal(body, &peek) // the handler reports a malformed body
	if p := firstNonNil(peek.Parent, peek.Object); p != nil {
		ev.SetSubject("/" + p.Metadata.Namespace + "/" + p.Metadata.Name)
		if p.Metadata.UID != "" {
			ev.SetExtension(hookwire.ExtParentUID, p.Metadata.UID)
		}
	}
	ev.SetDataContentType(hookwire.ContentTypeJSON)
	ev.DataEncoded = body
	// A malformed body (to test how a hook takes one) cannot be JSON data
	// in a structured event: it travels as data_base64.
	ev.DataBase64 = !json.Valid(body)
	r := httptest.NewRequest(http.MethodPost, "/"+kind, nil)
	ctx := binding.WithForceBinary(context.Background())
	if mode == hook.ModeStructured {
		data, err := json.Marshal(ev)
		if err != nil {
			return nil, fmt.Errorf("hooktest: encoding the request as a structured CloudEvent: %w", err)
		}
		r = httptest.NewRequest(http.MethodPost, "/"+kind, bytes.NewReader(data))
		r.Header.Set("Content-Type", hookwire.ContentTypeStructured)
		return r, nil
	}
	if err := cehttp.WriteRequest(ctx, binding.ToMessage(&ev), r); err != nil {
		return nil, fmt.Errorf("hooktest: encoding the request as a binary CloudEvent: %w", err)
	}
	return r, nil
}

func firstNonNil[T any](ps ...*T) *T {
	for _, p := range ps {
		if p != nil {
			return p
		}
	}
	return nil
}

// Do calls h with body in mode, as a hook of kind, and returns its answer.
// An error means the answer broke the contract (a CloudEvents call not
// answered with a CloudEvent of the right type, say).
func Do(h hook.Handler, mode hook.Mode, kind string, body []byte, opts ...hook.Option) (*Reply, error) {
	req, err := Request(mode, kind, body)
	if err != nil {
		return nil, err
	}
	return do(hook.HTTPHandler(h, opts...), req, mode, kind)
}

// DoURL is Do against a hook served at url, in any language: it sends
// the request metabus would send in mode and checks the answer by the same
// rules.
func DoURL(ctx context.Context, url string, mode hook.Mode, kind string, body []byte) (*Reply, error) {
	req, err := Request(mode, kind, body)
	if err != nil {
		return nil, err
	}
	out, err := http.NewRequestWithContext(ctx, http.MethodPost, url, req.Body)
	if err != nil {
		return nil, fmt.Errorf("hooktest: %w", err)
	}
	out.Header = req.Header
	res, err := http.DefaultClient.Do(out)
	if err != nil {
		return nil, fmt.Errorf("hooktest: %w", err)
	}
	return decodeReply(res, mode, kind)
}

// do sends req to an HTTP hook handler and decodes the answer.
func do(h http.Handler, req *http.Request, mode hook.Mode, kind string) (*Reply, error) {
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return decodeReply(rec.Result(), mode, kind)
}

// decodeReply decodes an answer, which must be in mode and, as a
// CloudEvent, say it answers a request of kind.
func decodeReply(res *http.Response, mode hook.Mode, kind string) (*Reply, error) {
	defer res.Body.Close()
	body, err := io.ReadAll(res.Body)
	if err != nil {
		return nil, err
	}
	reply := &Reply{Code: res.StatusCode}
	if res.StatusCode != http.StatusOK {
		reply.Message = string(bytes.TrimSpace(body))
		if res.StatusCode == hookwire.CodeThrottled {
			secs, err := strconv.ParseInt(res.Header.Get(hookwire.HeaderRetryAfter), 10, 64)
			if err != nil {
				return nil, fmt.Errorf("hooktest: 429 with Retry-After %q: %w", res.Header.Get(hookwire.HeaderRetryAfter), err)
			}
			reply.RetryAfter = time.Duration(secs) * time.Second
		}
		return reply, nil
	}
	if mode == hook.ModePlain {
		if res.Header.Get("Ce-Specversion") != "" {
			return nil, fmt.Errorf("hooktest: a plain JSON call was answered with a CloudEvent")
		}
		reply.Data = body
		return reply, nil
	}
	msg := cehttp.NewMessage(res.Header, io.NopCloser(bytes.NewReader(body)))
	if got, want := msg.ReadEncoding(), map[hook.Mode]binding.Encoding{hook.ModeBinary: binding.EncodingBinary, hook.ModeStructured: binding.EncodingStructured}[mode]; got != want {
		return nil, fmt.Errorf("hooktest: a %s call was answered in encoding %s", mode, got)
	}
	ev, err := binding.ToEvent(context.Background(), msg)
	if err != nil {
		return nil, fmt.Errorf("hooktest: the answer is not a CloudEvent: %w", err)
	}
	if want := hookwire.ResponseType(hookwire.EventType(kind)); ev.Type() != want {
		return nil, fmt.Errorf("hooktest: the answer has type %q, want %q", ev.Type(), want)
	}
	reply.Event, reply.Data = ev, ev.Data()
	return reply, nil
}

// Call calls h with req (a typed request, or a []byte JSON body) in every
// mode and returns the response decoded into a Resp. The test fails if a
// call fails or the modes answer differently.
func Call[Resp any](t testing.TB, h hook.Handler, kind string, req any) *Resp {
	t.Helper()
	body, ok := req.([]byte)
	if !ok {
		var err error
		if body, err = json.Marshal(req); err != nil {
			t.Fatalf("hooktest: encoding the request: %v", err)
		}
	}
	var first *Resp
	for _, mode := range Modes {
		reply, err := Do(h, mode, kind, body)
		if err != nil {
			t.Fatalf("hooktest: %s call: %v", mode, err)
		}
		if reply.Code != http.StatusOK {
			t.Fatalf("hooktest: %s call answered %d: %s", mode, reply.Code, reply.Message)
		}
		resp := new(Resp)
		if err := kjson.UnmarshalCaseSensitivePreserveInts(reply.Data, resp); err != nil {
			t.Fatalf("hooktest: %s call: decoding the response: %v", mode, err)
		}
		if first == nil {
			first = resp
		} else if diff := cmp.Diff(first, resp); diff != "" {
			t.Fatalf("hooktest: the %s call answered differently from the plain one (-plain +%s):\n%s", mode, mode, diff)
		}
	}
	return first
}

// CallFile is Call with the request read from a JSON file.
func CallFile[Resp any](t testing.TB, h hook.Handler, kind, path string) *Resp {
	t.Helper()
	body, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("hooktest: %v", err)
	}
	return Call[Resp](t, h, kind, body)
}
