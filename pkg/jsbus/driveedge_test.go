package jsbus

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/metabus/metabus/pkg/jsbus/drivecore"
)

// TestErrKind: the driver's edge sorts JetStream's errors, wrapped or not,
// into the kinds its decisions take; the specific ones win over the API
// error class they belong to.
func TestErrKind(t *testing.T) {
	for _, tc := range []struct {
		reason string
		err    error
		want   drivecore.Err
	}{
		{"no error", nil, drivecore.ErrNone},
		{"a consumer not found is a 404, but not a refusal", jetstream.ErrConsumerNotFound, drivecore.ErrNotFound},
		{"wrapped", fmt.Errorf("reset: %w", jetstream.ErrConsumerNotFound), drivecore.ErrNotFound},
		{"a key not found", jetstream.ErrKeyNotFound, drivecore.ErrNotFound},
		{"a message not found", jetstream.ErrMsgNotFound, drivecore.ErrNotFound},
		{"a key deleted", jetstream.ErrKeyDeleted, drivecore.ErrDeleted},
		{"a consumer deleted", jetstream.ErrConsumerDeleted, drivecore.ErrDeleted},
		{"a key that exists", jetstream.ErrKeyExists, drivecore.ErrExists},
		{"a raw conditional publish refused is a key that exists", &jetstream.APIError{Code: 400, ErrorCode: jetstream.JSErrCodeStreamWrongLastSequence}, drivecore.ErrExists},
		{"acked already", jetstream.ErrMsgAlreadyAckd, drivecore.ErrAlreadyAcked},
		{"a missed idle heartbeat", jetstream.ErrNoHeartbeat, drivecore.ErrNoHeartbeat},
		{"a leader move (409 Leadership Change)", jetstream.ErrConsumerLeadershipChanged, drivecore.ErrLeaderMoved},
		{"another 4xx: refused", &jetstream.APIError{Code: 400, ErrorCode: 10999}, drivecore.ErrRefused},
		{"a 5xx is not a refusal", &jetstream.APIError{Code: 503, ErrorCode: 10008}, drivecore.ErrOther},
		{"no responders", nats.ErrNoResponders, drivecore.ErrNoResponders},
		{"a context deadline", fmt.Errorf("reset: %w", context.DeadlineExceeded), drivecore.ErrTimeout},
		{"a NATS timeout", nats.ErrTimeout, drivecore.ErrTimeout},
		{"anything else", errors.New("connection closed"), drivecore.ErrOther},
	} {
		t.Run(tc.reason, func(t *testing.T) {
			if d := cmp.Diff(tc.want, errKind(tc.err)); d != "" {
				t.Errorf("errKind(%v) (-want +got):\n%s", tc.err, d)
			}
		})
	}
}
