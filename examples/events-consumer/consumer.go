// Package eventsconsumer is an example consumer of metabus's bus events
// (docs/events.md): it subscribes to the stream MC_EVENTS through the
// CloudEvents sdk's NATS JetStream protocol binding, as any CloudEvents
// consumer would, and describes the applied events it receives. The
// command in cmd/events-consumer prints them; the e2e test TestBusEvents
// reads the events through Receive.
package eventsconsumer

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"

	cejs "github.com/cloudevents/sdk-go/protocol/nats_jetstream/v2"
	cloudevents "github.com/cloudevents/sdk-go/v2"
	"github.com/nats-io/nats.go"

	"github.com/metabus/metabus/pkg/bus"
)

// InboxPrefix is the reply prefix the read-only events user may subscribe
// to (deploy/nats/nats-server.conf): JetStream delivers and answers on it.
const InboxPrefix = "_INBOX_events"

// Receive calls handle with every event on subject (a filter under
// metabus.events.>, e.g. metabus.events.applied.>) that MC_EVENTS holds,
// from the oldest it keeps, then as they come, until ctx is done. The
// consumer is ephemeral: a restarted consumer starts from the oldest again
// (use a durable one, nats.Durable, to resume instead).
func Receive(ctx context.Context, nc *nats.Conn, subject string, handle func(cloudevents.Event)) error {
	// BindStream: the events user may not look streams up by subject.
	consumer, err := cejs.NewConsumerFromConn(nc, bus.EventsStream, subject, nil,
		[]nats.SubOpt{nats.BindStream(bus.EventsStream), nats.DeliverAll()})
	if err != nil {
		return fmt.Errorf("consume %s from %s: %w", subject, bus.EventsStream, err)
	}
	client, err := cloudevents.NewClient(consumer)
	if err != nil {
		return fmt.Errorf("CloudEvents client: %w", err)
	}
	return client.StartReceiver(ctx, handle)
}

// Describe is one line about an applied event: the parent, the work
// sequence, the outcome and what changed. Other events are described by
// their type and subject.
func Describe(e cloudevents.Event) (string, error) {
	if e.Type() != bus.TypeApplied {
		return fmt.Sprintf("%s %s (id %s)", e.Type(), e.Subject(), e.ID()), nil
	}
	var a bus.AppliedEvent
	if err := json.Unmarshal(e.Data(), &a); err != nil {
		return "", fmt.Errorf("applied event %s: %w", e.ID(), err)
	}
	var b strings.Builder
	parent := a.Parent.Name
	if a.Parent.Namespace != "" {
		parent = a.Parent.Namespace + "/" + parent
	}
	fmt.Fprintf(&b, "%s %s %s seq=%d %s", a.Controller.Name, a.Parent.Kind, parent, a.WorkSeq, a.Outcome)
	if a.Reason != "" {
		fmt.Fprintf(&b, " (%s)", a.Reason)
	}
	for _, l := range []struct {
		what string
		list []bus.ChildChange
	}{{"created", a.Created}, {"updated", a.Updated}, {"deleted", a.Deleted}} {
		if len(l.list) == 0 {
			continue
		}
		names := make([]string, len(l.list))
		for i, c := range l.list {
			names[i] = c.Kind + " " + c.Name
		}
		fmt.Fprintf(&b, " %s: %s;", l.what, strings.Join(names, ", "))
	}
	if a.StatusWritten {
		b.WriteString(" status written")
	}
	return strings.TrimSuffix(b.String(), ";"), nil
}
