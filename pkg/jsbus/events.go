package jsbus

import (
	"context"

	cejs "github.com/cloudevents/sdk-go/protocol/nats_jetstream/v2"
	"github.com/cloudevents/sdk-go/v2/binding"
	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/metabus/metabus/pkg/bus"
)

// NewMsg builds a NATS message carrying a CloudEvent in binary mode
// (bus.NewEvent).
func NewMsg(_ context.Context, subject, ceType, id string, ctrl bus.ControllerRef, parent bus.ObjectRef, body any, ext map[string]string) (*nats.Msg, error) {
	ev, err := bus.NewEvent(subject, ceType, id, ctrl, parent, body, ext)
	if err != nil {
		return nil, err
	}
	return &nats.Msg{Subject: ev.Subject, Header: nats.Header(ev.Header), Data: ev.Data}, nil
}

// ToEvent decodes any bus message (binary or structured mode) with the
// CloudEvents sdk. Services use the cheaper Decode; this is for tools and
// for consumers outside metabus.
func ToEvent(ctx context.Context, m jetstream.Msg) (*event.Event, error) {
	return binding.ToEvent(ctx, cejs.NewMessage(&nats.Msg{Subject: m.Subject(), Header: m.Headers(), Data: m.Data()}))
}

// Decode checks a binary-mode message's ce-type and decodes its JSON body
// (bus.DecodeEvent).
func Decode(m jetstream.Msg, wantType string, into any) error {
	return bus.DecodeTyped(m.Subject(), headerValue(m, bus.TypeHeader), m.Data(), wantType, into)
}
