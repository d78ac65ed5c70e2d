package hooks

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/cloudevents/sdk-go/v2/binding"
	"github.com/cloudevents/sdk-go/v2/event"
	cehttp "github.com/cloudevents/sdk-go/v2/protocol/http"

	"github.com/metabus/metabus/pkg/api/v1alpha1"
	"github.com/metabus/metabus/pkg/hookwire"
)

// EventTypePrefix starts the CloudEvents type of a hook request:
// io.k8s.metacontroller.hook.<kind>.v1.
const EventTypePrefix = hookwire.EventTypePrefix

const maxExtensionName = 20 // CloudEvents spec recommendation, enforced so brokers accept them

// newRequest builds the POST for a call: the JSON body as the data of a
// CloudEvent, in binary mode unless the webhook asks for structured mode
// (binary by default, because a legacy hook only understands a plain JSON
// body). Both encodings are written directly: the sdk's event → message →
// request path cost a tenth of a hook call's CPU, and tests hold them to
// the sdk's.
func newRequest(ctx context.Context, u *url.URL, call *Call, body []byte, now time.Time) (*http.Request, error) {
	id, err := eventID(call)
	if err != nil {
		return nil, err
	}
	structured, err := structuredMode(call.Hook)
	if err != nil {
		return nil, err
	}
	if structured {
		body, err = structuredEvent(call, id, body, now)
		if err != nil {
			return nil, err
		}
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, u.String(), bytes.NewReader(body))
	if err != nil {
		return nil, fmt.Errorf("cannot build request: %w", err)
	}
	h := req.Header
	if structured {
		h["Content-Type"] = []string{hookwire.ContentTypeStructured}
		return req, nil
	}
	// The values share one array (each slice capped at one, so an Add
	// reallocates rather than overwrite a neighbour): one allocation where
	// there were eight or more per call.
	vals := make([]string, 0, 7+len(call.Extensions))
	set := func(k, v string) {
		vals = append(vals, v)
		h[k] = vals[len(vals)-1 : len(vals) : len(vals)]
	}
	set("Ce-Specversion", "1.0")
	set("Ce-Id", percentEncode(id))
	set("Ce-Type", percentEncode(hookwire.EventType(call.Kind)))
	set("Ce-Source", percentEncode(sourceOf(call)))
	if call.Subject != "" {
		set("Ce-Subject", percentEncode(call.Subject))
	}
	set("Ce-Time", now.UTC().Format(time.RFC3339Nano))
	set("Content-Type", hookwire.ContentTypeJSON)
	for name, value := range call.Extensions {
		set(extensionHeader(name), percentEncode(value))
	}
	return req, nil
}

// extensionHeaders are the canonical header names of the extensions
// metabus sets on every call, computed once.
var extensionHeaders = func() map[string]string {
	m := map[string]string{}
	for _, n := range []string{hookwire.ExtParentUID, hookwire.ExtWorkSeq, hookwire.ExtPartitionKey, hookwire.ExtRequestID} {
		m[n] = http.CanonicalHeaderKey(hookwire.HeaderPrefix + n)
	}
	return m
}()

// extensionHeader is the binary-mode header of extension name.
func extensionHeader(name string) string {
	if k, ok := extensionHeaders[name]; ok {
		return k
	}
	return http.CanonicalHeaderKey(hookwire.HeaderPrefix + name)
}

// structuredMode reports whether the hook's webhook asks for structured
// content mode; an unknown mode is an error (nothing is sent).
func structuredMode(h *v1alpha1.Hook) (bool, error) {
	if h == nil || h.Webhook == nil || h.Webhook.CloudEvents == nil || *h.Webhook.CloudEvents == "" {
		return false, nil
	}
	switch m := *h.Webhook.CloudEvents; m {
	case v1alpha1.CloudEventsBinary:
		return false, nil
	case v1alpha1.CloudEventsStructured:
		return true, nil
	default:
		return false, fmt.Errorf("unknown webhook cloudEvents mode %q (want %s or %s)", m, v1alpha1.CloudEventsBinary, v1alpha1.CloudEventsStructured)
	}
}

// structuredEvent is the call as one structured-mode CloudEvent in JSON:
// the attributes binary mode puts in headers as members, datacontenttype
// application/json, and the request (already JSON) as data.
func structuredEvent(call *Call, id string, data []byte, now time.Time) ([]byte, error) {
	var b bytes.Buffer
	b.Grow(len(data) + 512)
	b.WriteString(`{"specversion":"1.0"`)
	member := func(name, value string) error {
		v, err := json.Marshal(value)
		if err != nil {
			return fmt.Errorf("cannot encode CloudEvent attribute %s: %w", name, err)
		}
		b.WriteString(`,"` + name + `":`)
		b.Write(v)
		return nil
	}
	attrs := [][2]string{{"id", id}, {"type", hookwire.EventType(call.Kind)}, {"source", sourceOf(call)}}
	if call.Subject != "" {
		attrs = append(attrs, [2]string{"subject", call.Subject})
	}
	attrs = append(attrs, [2]string{"time", now.UTC().Format(time.RFC3339Nano)}, [2]string{"datacontenttype", hookwire.ContentTypeJSON})
	for name, value := range call.Extensions {
		attrs = append(attrs, [2]string{name, value})
	}
	for _, a := range attrs {
		if err := member(a[0], a[1]); err != nil {
			return nil, err
		}
	}
	if !json.Valid(data) {
		return nil, errors.New("cannot send a structured CloudEvent: the request is not valid JSON")
	}
	b.WriteString(`,"data":`)
	b.Write(data)
	b.WriteByte('}')
	return b.Bytes(), nil
}

// eventID checks the call's extension names and returns its CE id (a new
// UUID when it has none), for every transport.
func eventID(call *Call) (string, error) {
	for name := range call.Extensions {
		if err := checkExtensionName(name); err != nil {
			return "", err
		}
	}
	if call.ID == "" {
		return newUUID(), nil
	}
	return call.ID, nil
}

// sourceOf returns the CE source: call.Source, or the controller object path derived from
// the controller type and name.
func sourceOf(call *Call) string {
	if call.Source != "" {
		return call.Source
	}
	if call.ControllerType != "" && call.ControllerName != "" {
		return "/apis/metacontroller.k8s.io/v1alpha1/" + strings.ToLower(call.ControllerType) + "s/" + call.ControllerName
	}
	return "metabus"
}

// checkExtensionName enforces the CloudEvents naming rule (lower-case a-z and 0-9); the sdk
// also accepts upper case, which HTTP headers would not preserve.
func checkExtensionName(name string) error {
	if name == "" || len(name) > maxExtensionName {
		return fmt.Errorf("invalid CloudEvents extension name %q: must be 1-%d characters", name, maxExtensionName)
	}
	for i := 0; i < len(name); i++ {
		if c := name[i]; (c < 'a' || c > 'z') && (c < '0' || c > '9') {
			return fmt.Errorf("invalid CloudEvents extension name %q: only a-z and 0-9 are allowed", name)
		}
	}
	switch name {
	case "specversion", "id", "source", "type", "subject", "time", "datacontenttype", "dataschema", "data", "data_base64":
		return fmt.Errorf("invalid CloudEvents extension name %q: it is a core attribute", name)
	}
	return nil
}

// percentEncode applies the CloudEvents HTTP binding rule for header values: space, '"', '%'
// and every byte outside printable ASCII are percent-encoded (UTF-8 bytes for non-ASCII).
// The sdk writes values verbatim, and net/http refuses control characters.
func percentEncode(s string) string {
	i := 0
	for i < len(s) && !mustEncode(s[i]) {
		i++
	}
	if i == len(s) {
		return s // the common case: no allocation
	}
	const hexdigits = "0123456789ABCDEF"
	var sb strings.Builder
	sb.Grow(len(s) + 16)
	sb.WriteString(s[:i])
	for ; i < len(s); i++ {
		c := s[i]
		if mustEncode(c) {
			sb.WriteByte('%')
			sb.WriteByte(hexdigits[c>>4])
			sb.WriteByte(hexdigits[c&0xf])
		} else {
			sb.WriteByte(c)
		}
	}
	return sb.String()
}

func mustEncode(c byte) bool {
	return c <= ' ' || c > '~' || c == '"' || c == '%'
}

// newUUID returns a random (version 4) UUID.
func newUUID() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	var out [36]byte
	hex.Encode(out[0:8], b[0:4])
	out[8] = '-'
	hex.Encode(out[9:13], b[4:6])
	out[13] = '-'
	hex.Encode(out[14:18], b[6:8])
	out[18] = '-'
	hex.Encode(out[19:23], b[8:10])
	out[23] = '-'
	hex.Encode(out[24:], b[10:])
	return string(out[:])
}

// responseData returns the JSON payload of a 200 reply: the data of a CloudEvent when the reply
// is one (binary mode: a ce-specversion header; structured mode: an application/cloudevents
// content type), else the body itself.
func responseData(h http.Header, body []byte) ([]byte, error) {
	mt, _, _ := mime.ParseMediaType(h.Get("Content-Type"))
	structured := strings.HasPrefix(mt, "application/cloudevents")
	if h.Get("Ce-Specversion") == "" && !structured {
		return body, nil
	}
	if mt == event.ApplicationCloudEventsBatchJSON {
		return nil, errors.New("batched CloudEvents replies are not supported")
	}
	msg := cehttp.NewMessage(h, io.NopCloser(bytes.NewReader(body)))
	ev, err := binding.ToEvent(context.Background(), msg)
	if err != nil {
		return nil, fmt.Errorf("malformed CloudEvent reply: %w", err)
	}
	if dt := ev.DataMediaType(); !jsonMediaType(dt) {
		return nil, fmt.Errorf("CloudEvent reply has datacontenttype %q, want application/json", dt)
	}
	return ev.Data(), nil
}

func jsonMediaType(mt string) bool {
	return mt == "" || mt == event.ApplicationJSON || mt == event.TextJSON || strings.HasSuffix(mt, "+json")
}
