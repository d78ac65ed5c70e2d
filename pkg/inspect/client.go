package inspect

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/metabus/metabus/pkg/bus"
)

// Gather asks every replica of stage and collects their replies: until
// want replies came (the stage's live members; want <= 0 waits for the
// whole timeout) or timeout passed. Replicas that do not answer in time
// are missing from the result, which is not an error.
func Gather(ctx context.Context, nc *nats.Conn, stage string, req bus.InspectRequest, want int, timeout time.Duration) ([]bus.InspectReply, error) {
	data, err := json.Marshal(req)
	if err != nil {
		return nil, fmt.Errorf("encode inspect request: %w", err)
	}
	inbox := nc.NewRespInbox()
	ch := make(chan *nats.Msg, 64)
	sub, err := nc.ChanSubscribe(inbox, ch)
	if err != nil {
		return nil, fmt.Errorf("subscribe to inspect replies: %w", err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	if err := nc.PublishRequest(bus.InspectSubject(stage), inbox, data); err != nil {
		return nil, fmt.Errorf("ask %s replicas: %w", stage, err)
	}
	t := time.NewTimer(timeout)
	defer t.Stop()
	var out []bus.InspectReply
	for want <= 0 || len(out) < want {
		select {
		case m := <-ch:
			if len(m.Data) == 0 && m.Header.Get("Status") == "503" {
				return out, nil // no responders: no replica of the stage runs
			}
			var r bus.InspectReply
			if err := json.Unmarshal(m.Data, &r); err != nil {
				return out, fmt.Errorf("decode inspect reply: %w", err)
			}
			out = append(out, r)
		case <-t.C:
			return out, nil
		case <-ctx.Done():
			return out, ctx.Err()
		}
	}
	return out, nil
}

// Announce tells replicas that someone tails, now and every TailWindow/3,
// until ctx is done.
func Announce(ctx context.Context, nc *nats.Conn) error {
	t := time.NewTicker(bus.TailWindow / 3)
	defer t.Stop()
	for {
		if err := nc.Publish(bus.TailSubject, nil); err != nil {
			return fmt.Errorf("announce tail: %w", err)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}
