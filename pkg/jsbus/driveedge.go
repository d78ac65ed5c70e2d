package jsbus

import (
	"context"
	"errors"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/metabus/metabus/pkg/jsbus/drivecore"
)

// errKind is the driver's edge: it turns a JetStream error into the kind
// the decisions of package drivecore depend on. The order matters: the
// specific errors are API errors too (a consumer not found is a 404, a key
// that exists a 400), and are told apart first.
func errKind(err error) drivecore.Err {
	var apiErr *jetstream.APIError
	switch {
	case err == nil:
		return drivecore.ErrNone
	case errors.Is(err, jetstream.ErrConsumerNotFound), errors.Is(err, jetstream.ErrKeyNotFound),
		errors.Is(err, jetstream.ErrMsgNotFound):
		return drivecore.ErrNotFound
	case errors.Is(err, jetstream.ErrKeyDeleted), errors.Is(err, jetstream.ErrConsumerDeleted):
		return drivecore.ErrDeleted
	case errors.Is(err, jetstream.ErrKeyExists):
		// Also a raw write conditional on the subject's last sequence,
		// refused (the API error's code is the same).
		return drivecore.ErrExists
	case errors.Is(err, jetstream.ErrMsgAlreadyAckd):
		return drivecore.ErrAlreadyAcked
	case errors.Is(err, jetstream.ErrNoHeartbeat):
		return drivecore.ErrNoHeartbeat
	case errors.Is(err, jetstream.ErrConsumerLeadershipChanged):
		return drivecore.ErrLeaderMoved
	case errors.As(err, &apiErr) && apiErr.Code < 500:
		return drivecore.ErrRefused
	case errors.Is(err, nats.ErrNoResponders):
		return drivecore.ErrNoResponders
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, nats.ErrTimeout):
		return drivecore.ErrTimeout
	default:
		return drivecore.ErrOther
	}
}
