package bus

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"

	cejs "github.com/cloudevents/sdk-go/protocol/nats_jetstream/v2"
	cloudevents "github.com/cloudevents/sdk-go/v2"
	"github.com/cloudevents/sdk-go/v2/binding"
	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/google/uuid"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// ControllerSource is the CloudEvent source of a controller: its object path.
func ControllerSource(c ControllerRef) string {
	return "/apis/metacontroller.k8s.io/v1alpha1/" + strings.ToLower(c.Kind) + "s/" + c.Name
}

// ObjectPath is the CloudEvent subject of an object: its API path without
// the /api or /apis prefix, e.g. apis/example.com/v1/namespaces/ns/things/a.
func ObjectPath(o ObjectRef) string {
	var b strings.Builder
	if strings.Contains(o.APIVersion, "/") {
		b.WriteString("apis/")
	} else {
		b.WriteString("api/")
	}
	b.WriteString(o.APIVersion)
	if o.Namespace != "" {
		b.WriteString("/namespaces/")
		b.WriteString(o.Namespace)
	}
	b.WriteString("/")
	b.WriteString(o.Resource)
	b.WriteString("/")
	b.WriteString(o.Name)
	return b.String()
}

// WorkSeqString formats a stream sequence as the zero-padded, lexically
// ordered workseq extension (the sequence extension's recommendation; an
// Integer sequence type would be 32-bit).
func WorkSeqString(seq uint64) string { return fmt.Sprintf("%020d", seq) }

// NewMsg builds a NATS message carrying a CloudEvent in binary mode: the
// attributes and extensions as ce-* headers, the JSON body untouched. The
// attributes are printable ASCII by construction (UIDs, paths of DNS names,
// fixed types), which the NATS binding requires.
func NewMsg(ctx context.Context, subject, ceType, id string, ctrl ControllerRef, parent ObjectRef, body any, ext map[string]string) (*nats.Msg, error) {
	data, err := json.Marshal(body)
	if err != nil {
		return nil, fmt.Errorf("encode %s body: %w", ceType, err)
	}
	ev := cloudevents.NewEvent()
	if id == "" {
		id = uuid.NewString()
	}
	ev.SetID(id)
	ev.SetType(ceType)
	ev.SetSource(ControllerSource(ctrl))
	ev.SetSubject(ObjectPath(parent))
	ev.SetTime(time.Now())
	if err := ev.SetData(cloudevents.ApplicationJSON, data); err != nil {
		return nil, fmt.Errorf("set %s data: %w", ceType, err)
	}
	ev.SetExtension(ExtPartitionKey, ctrl.ID()+"/"+parent.UID)
	ev.SetExtension(ExtParentUID, parent.UID)
	if parent.ResourceVersion != "" {
		ev.SetExtension(ExtParentRV, parent.ResourceVersion)
	}
	if ctrl.Weight > 1 {
		ev.SetExtension(ExtWeight, strconv.Itoa(ctrl.Weight))
	}
	for k, v := range ext {
		ev.SetExtension(k, v)
	}
	if err := ev.Validate(); err != nil {
		return nil, fmt.Errorf("invalid %s event: %w", ceType, err)
	}
	var buf bytes.Buffer
	hdr, err := cejs.WriteMsg(ctx, binding.ToMessage(&ev), &buf)
	if err != nil {
		return nil, fmt.Errorf("write %s event: %w", ceType, err)
	}
	return &nats.Msg{Subject: subject, Header: hdr, Data: buf.Bytes()}, nil
}

// ToEvent decodes any bus message (binary or structured mode) with the
// CloudEvents sdk. Services use the cheaper Decode; this is for tools and
// for consumers outside metabus.
func ToEvent(ctx context.Context, m jetstream.Msg) (*event.Event, error) {
	return binding.ToEvent(ctx, cejs.NewMessage(&nats.Msg{Subject: m.Subject(), Header: m.Headers(), Data: m.Data()}))
}

// Decode checks a binary-mode message's ce-type and decodes its JSON body.
func Decode(m jetstream.Msg, wantType string, into any) error {
	if got := m.Headers().Get("ce-type"); got != wantType {
		return fmt.Errorf("message on %s has type %q, want %q", m.Subject(), got, wantType)
	}
	if err := json.Unmarshal(m.Data(), into); err != nil {
		return fmt.Errorf("decode %s on %s: %w", wantType, m.Subject(), err)
	}
	return nil
}
