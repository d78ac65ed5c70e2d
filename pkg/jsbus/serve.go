package jsbus

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"
)

// RespondJSON answers a request/reply service call (snapshot, revisions)
// whose body is a JSON Req with handle's answer as JSON. A body that does not
// decode gets service error 400; an answer that cannot be encoded or sent
// gets 500. The returned error (sending failed, e.g. over max_payload) is for
// the service's log: the caller has already been told.
func RespondJSON[Req any](r micro.Request, what string, handle func(Req) any) error {
	var req Req
	if err := json.Unmarshal(r.Data(), &req); err != nil {
		_ = r.Error("400", "malformed "+what+" request: "+err.Error(), nil)
		return nil
	}
	data, err := json.Marshal(handle(req))
	if err != nil {
		_ = r.Error("500", "encode "+what+" response: "+err.Error(), nil)
		return nil
	}
	if err := r.Respond(data); err != nil {
		// micro wraps the connection's error as text, not as a chain.
		if errors.Is(err, nats.ErrMaxPayload) || strings.Contains(err.Error(), nats.ErrMaxPayload.Error()) {
			_ = r.Error(codeTooLarge, fmt.Sprintf("%s response of %d bytes exceeds the bus's max payload", what, len(data)), nil)
			return fmt.Errorf("respond to %s request with %d bytes: %w", what, len(data), err)
		}
		_ = r.Error("500", "respond: "+err.Error(), nil)
		return fmt.Errorf("respond to %s request with %d bytes: %w", what, len(data), err)
	}
	return nil
}

// ErrTooLarge is the error RequestJSON wraps when the service's answer was
// larger than the bus carries (NATS max_payload): retrying cannot help
// until the answer shrinks, so callers report it on the object.
var ErrTooLarge = errors.New("answer exceeds the bus's max payload")

// codeTooLarge is the service error code of an answer over max_payload.
const codeTooLarge = "413"

// RequestJSON is the caller's side of RespondJSON: it sends req as JSON to a
// request/reply service on subject and decodes the answer into resp. A
// service error header (400/500 from RespondJSON) becomes an error, and no
// responder is reported as the named service not running.
func RequestJSON(ctx context.Context, nc *nats.Conn, subject, service string, timeout time.Duration, req, resp any) error {
	data, err := json.Marshal(req)
	if err != nil {
		return fmt.Errorf("encode %s request: %w", service, err)
	}
	if timeout <= 0 {
		timeout = 10 * time.Second
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	msg, err := nc.RequestWithContext(ctx, subject, data)
	if err != nil {
		if errors.Is(err, nats.ErrNoResponders) {
			return fmt.Errorf("no %s service is running: %w", service, err)
		}
		return err
	}
	if code := msg.Header.Get("Nats-Service-Error-Code"); code == codeTooLarge {
		return fmt.Errorf("%s service: %s: %w", service, msg.Header.Get("Nats-Service-Error"), ErrTooLarge)
	} else if code != "" {
		return fmt.Errorf("%s service error %s: %s", service, code, msg.Header.Get("Nats-Service-Error"))
	}
	if err := json.Unmarshal(msg.Data, resp); err != nil {
		return fmt.Errorf("decode %s response: %w", service, err)
	}
	return nil
}
