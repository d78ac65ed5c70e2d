package jsbus

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

func TestNotAnsweringYet(t *testing.T) {
	canceled, cancel := context.WithCancel(context.Background())
	cancel()
	for _, tc := range []struct {
		reason string
		ctx    context.Context
		err    error
		want   bool
	}{
		{"a request that timed out", context.Background(), fmt.Errorf("look up: %w", context.DeadlineExceeded), true},
		{"nobody serves the JetStream API", context.Background(), nats.ErrNoResponders, true},
		{"the connection is being re-established", context.Background(), nats.ErrConnectionReconnecting, true},
		{"a node without a meta leader (cut from the others, an election): 503", context.Background(),
			fmt.Errorf("look up: %w", &jetstream.APIError{Code: 503, ErrorCode: 10008, Description: "JetStream system temporarily unavailable"}), true},
		{"a refusal is final", context.Background(), &jetstream.APIError{Code: 400, ErrorCode: 10025, Description: "bad request"}, false},
		{"another error is final", context.Background(), errors.New("permissions violation"), false},
		{"the caller gave up", canceled, nats.ErrTimeout, false},
	} {
		t.Run(tc.reason, func(t *testing.T) {
			if got := notAnsweringYet(tc.ctx, tc.err); got != tc.want {
				t.Errorf("notAnsweringYet(%v) = %v, want %v", tc.err, got, tc.want)
			}
		})
	}
}
