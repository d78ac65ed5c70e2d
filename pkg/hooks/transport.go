package hooks

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"
)

// Caller is the seam every hook call goes through: the dispatcher and
// `metabus render` hold one, not a transport. A call is a request (Call),
// a deadline (the hook's timeout, bounded by MaxTimeout, and the context's)
// and either a decoded reply or a typed failure: ErrTimeout,
// *RefusedError (nothing sent), *TooManyRequestsError (throttled, with a
// delay), *DecodeError (malformed reply), *HTTPError (the hook failed, over
// HTTP or NATS), *NoRespondersError (nobody serves a NATS subject). Client
// is the implementation; tests of callers may substitute their own.
type Caller interface {
	Do(ctx context.Context, call Call, resp any) error
}

var _ Caller = (*Client)(nil)

// transport is one way of delivering a call, chosen per hook (webhook:
// httpTransport; nats: natsTransport). Client.Do owns the policy that does
// not depend on it (validation, encoding, timeout, metrics) and the
// transport hands what it received to Client.reply, so that limits and
// decoding are the same whatever carried the reply.
type transport interface {
	// target names the destination in errors and logs (never a password).
	target() string
	// timeout is the call's timeout, def when the hook sets none.
	timeout(def time.Duration) time.Duration
	// roundTrip sends the encoded request and decodes the reply into
	// resp; it returns the metrics code label with the result.
	roundTrip(ctx context.Context, c *Client, call *Call, body []byte, strict bool, resp any) (string, error)
}

// errBothTransports and errNoTransport are hooks that name no transport or
// two: the spec is invalid, and nothing is sent.
var (
	errBothTransports = errors.New("invalid hook: set exactly one of webhook and nats, not both")
	errNoTransport    = errors.New("hook has no webhook or nats")
)

// transportFor validates the hook's destination and returns its transport.
func (c *Client) transportFor(call *Call) (transport, error) {
	h := call.Hook
	switch {
	case h.Webhook != nil && h.NATS != nil:
		return nil, errBothTransports
	case h.NATS != nil:
		return c.natsTransportFor(h.NATS)
	case h.Webhook != nil:
		u, err := parseWebhookURL(h.Webhook)
		if err != nil {
			return nil, err
		}
		return &httpTransport{u: u, w: h.Webhook, red: u.Redacted()}, nil
	}
	return nil, errNoTransport
}

// reply checks and decodes a successful reply, whatever transport carried
// it: the size limit (Options.MaxResponseBytes), the CloudEvent envelope
// if the reply is one (binary: a ce-specversion header; structured: an
// application/cloudevents content type), then the shape limits and the
// decoding (strict or loose) of the JSON it carries. h holds the reply's
// headers with canonical keys. It returns the JSON response.
func (c *Client) reply(h http.Header, raw []byte, strict bool, resp any, target string) ([]byte, error) {
	if int64(len(raw)) > c.maxBody {
		return nil, &DecodeError{Err: fmt.Errorf("%w: more than %d bytes", ErrResponseTooLarge, c.maxBody), Body: snippet(raw), URL: target}
	}
	data, err := responseData(h, raw)
	if err != nil {
		return nil, &DecodeError{Err: err, Body: snippet(raw), URL: target}
	}
	if err := decode(data, strict, resp, target); err != nil {
		return nil, err
	}
	return data, nil
}
