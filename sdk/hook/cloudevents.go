package hook

import (
	"encoding/json"
	"fmt"
	"mime"
	"strings"
	"time"

	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/cloudevents/sdk-go/v2/types"
	"github.com/google/uuid"

	"github.com/metabus/metabus/pkg/hookwire"
)

// modeOf tells the mode of a request from its content type and whether it
// has a ce-specversion header. A batch of events is refused: metabus
// sends one request per call.
func modeOf(contentType string, hasSpecVersion bool) (Mode, error) {
	mt, _, _ := mime.ParseMediaType(contentType)
	switch {
	case mt == "application/cloudevents-batch+json":
		return 0, Errorf(415, "batched CloudEvents are not supported: metabus sends one event per call")
	case strings.HasPrefix(mt, "application/cloudevents"):
		return ModeStructured, nil
	case hasSpecVersion:
		return ModeBinary, nil
	}
	return ModePlain, nil
}

// structuredCall decodes a structured-mode event.
func structuredCall(body []byte) (*Call, error) {
	var ev event.Event
	if err := json.Unmarshal(body, &ev); err != nil {
		return nil, Errorf(400, "malformed structured CloudEvent: %v", err)
	}
	return callOf(&ev, ModeStructured)
}

// binaryEvent builds a binary-mode event from its attributes (lower-case
// names without the ce- prefix), content type and body, as the NATS
// protocol binding carries them.
func binaryEvent(attrs map[string]string, contentType string, data []byte) (*event.Event, error) {
	if v := attrs["specversion"]; v != event.CloudEventsVersionV1 {
		return nil, Errorf(400, "unsupported CloudEvents specversion %q (want %s)", v, event.CloudEventsVersionV1)
	}
	ev := event.New()
	for name, v := range attrs {
		switch name {
		case "specversion", "datacontenttype": // the content type is the header's
		case "id":
			ev.SetID(v)
		case "source":
			ev.SetSource(v)
		case "type":
			ev.SetType(v)
		case "subject":
			ev.SetSubject(v)
		case "dataschema":
			ev.SetDataSchema(v)
		case "time":
			t, err := types.ParseTime(v)
			if err != nil {
				return nil, Errorf(400, "malformed ce-time %q: %v", v, err)
			}
			ev.SetTime(t)
		default:
			ev.SetExtension(name, v) // a bad name fails callOf's Validate
		}
	}
	if contentType != "" {
		ev.SetDataContentType(contentType)
	}
	ev.DataEncoded = data
	return &ev, nil
}

// callOf checks a received event and turns it into a Call. Its data must
// be JSON: it is the hook's request body.
func callOf(ev *event.Event, mode Mode) (*Call, error) {
	if err := ev.Validate(); err != nil {
		return nil, Errorf(400, "invalid CloudEvent: %v", err)
	}
	if dt := ev.DataMediaType(); dt != "" && dt != event.ApplicationJSON && dt != event.TextJSON && !strings.HasSuffix(dt, "+json") {
		return nil, Errorf(415, "CloudEvent datacontenttype %q: a hook request is application/json", dt)
	}
	call := &Call{
		Mode:    mode,
		Type:    ev.Type(),
		ID:      ev.ID(),
		Source:  ev.Source(),
		Subject: ev.Subject(),
		Time:    ev.Time(),
		Data:    ev.Data(),
	}
	if ext := ev.Extensions(); len(ext) > 0 {
		call.Extensions = make(map[string]string, len(ext))
		for k, v := range ext {
			s, err := types.Format(v)
			if err != nil {
				return nil, Errorf(400, "CloudEvents extension %q: %v", k, err)
			}
			call.Extensions[k] = s
		}
	}
	return call, nil
}

// replyEvent is the CloudEvent answer to call: its data the response,
// type hookwire.ResponseType of the request's, the request's subject, and
// the request's id as extension hookwire.ExtRequestID.
func replyEvent(call *Call, source string, data []byte, now time.Time) (*event.Event, error) {
	ev := event.New()
	ev.SetID(uuid.NewString())
	ev.SetType(hookwire.ResponseType(call.Type))
	ev.SetSource(source)
	if call.Subject != "" {
		ev.SetSubject(call.Subject)
	}
	ev.SetTime(now)
	ev.SetExtension(hookwire.ExtRequestID, call.ID)
	ev.SetDataContentType(hookwire.ContentTypeJSON)
	ev.DataEncoded = data
	if err := ev.Validate(); err != nil {
		return nil, fmt.Errorf("answer is not a valid CloudEvent: %w", err)
	}
	return &ev, nil
}

// binaryAttrs lists a reply's attributes as the binary mode writes them:
// name (without prefix) and value.
func binaryAttrs(ev *event.Event) [][2]string {
	out := [][2]string{
		{"specversion", ev.SpecVersion()},
		{"id", ev.ID()},
		{"type", ev.Type()},
		{"source", ev.Source()},
		{"time", ev.Time().UTC().Format(time.RFC3339Nano)},
	}
	if s := ev.Subject(); s != "" {
		out = append(out, [2]string{"subject", s})
	}
	for k, v := range ev.Extensions() {
		s, _ := types.Format(v) // set by replyEvent as strings
		out = append(out, [2]string{k, s})
	}
	return out
}
