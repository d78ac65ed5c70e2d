package jsbus

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/micro"
)

// TestRequestJSONTooLarge: the caller learns that the answer was too
// large as ErrTooLarge, which it reports instead of retrying quietly.
func TestRequestJSONTooLarge(t *testing.T) {
	nc, _ := startNATS(t)
	svc, err := micro.AddService(nc, micro.Config{Name: "big", Version: "0.0.1", Endpoint: &micro.EndpointConfig{
		Subject: "big.svc",
		Handler: micro.HandlerFunc(func(r micro.Request) {
			_ = RespondJSON(r, "big", func(struct{}) any { return strings.Repeat("x", int(nc.MaxPayload())+1) })
		}),
	}})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = svc.Stop() }()
	var out string
	err = RequestJSON(context.Background(), nc, "big.svc", "big", 5*time.Second, struct{}{}, &out)
	if !errors.Is(err, ErrTooLarge) {
		t.Fatalf("RequestJSON error %v, want ErrTooLarge", err)
	}
}

func TestRespondJSON(t *testing.T) {
	nc, _ := startNATS(t)
	type req struct{ N int }
	type resp struct{ Double int }
	sendErrs := make(chan error, 10)
	svc, err := micro.AddService(nc, micro.Config{Name: "test", Version: "0.0.1", Endpoint: &micro.EndpointConfig{
		Subject: "test.svc",
		Handler: micro.HandlerFunc(func(r micro.Request) {
			sendErrs <- RespondJSON(r, "test", func(q req) any {
				if q.N < 0 {
					return map[string]any{"bad": func() {}} // not encodable
				}
				if q.N > 1000 {
					return strings.Repeat("x", q.N) // over max_payload
				}
				return resp{Double: 2 * q.N}
			})
		}),
	}})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = svc.Stop() }()

	cases := []struct {
		name, body, reason string
		wantCode, wantErr  string
		wantDouble         int
	}{
		{name: "ok", body: `{"N":21}`, wantDouble: 42, reason: "the answer is handle's result as JSON"},
		{name: "malformed", body: `{"N":`, wantCode: "400", wantErr: "malformed test request", reason: "the caller sent garbage"},
		{name: "unencodable", body: `{"N":-1}`, wantCode: "500", wantErr: "encode test response", reason: "the service's answer cannot be encoded"},
		{name: "too large", body: `{"N":9000000}`, wantCode: "413", wantErr: "exceeds the bus's max payload", reason: "the answer is larger than the bus carries"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			msg, err := nc.Request("test.svc", []byte(tc.body), 5*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			if got := msg.Header.Get("Nats-Service-Error-Code"); got != tc.wantCode {
				t.Fatalf("error code %q, want %q: %s", got, tc.wantCode, tc.reason)
			}
			if tc.wantCode != "" {
				if got := msg.Header.Get("Nats-Service-Error"); !strings.Contains(got, tc.wantErr) {
					t.Errorf("error %q, want it to contain %q", got, tc.wantErr)
				}
			} else {
				var r resp
				if err := json.Unmarshal(msg.Data, &r); err != nil || r.Double != tc.wantDouble {
					t.Errorf("answer %s (%v), want Double=%d: %s", msg.Data, err, tc.wantDouble, tc.reason)
				}
			}
			if err := <-sendErrs; (err != nil) != (tc.wantCode == "413") {
				t.Errorf("RespondJSON returned %v; want an error only when the answer could not be sent", err)
			}
		})
	}
}
