package bus

import (
	"encoding/json"
	"fmt"

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
		_ = r.Error("500", "respond: "+err.Error(), nil)
		return fmt.Errorf("respond to %s request with %d bytes: %w", what, len(data), err)
	}
	return nil
}
