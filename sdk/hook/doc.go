// Package hook is the SDK for metabus hook authors: typed requests and
// responses for every hook (CompositeController and DecoratorController
// sync, finalize and customize; MapController map and tombstone), and one
// Handler that serves them over HTTP (HTTPHandler) and NATS (ServeNATS)
// alike.
//
// A hook is a typed function:
//
//	h := hook.Composite(func(ctx context.Context, req *hook.CompositeRequest) (*hook.CompositeResponse, error) {
//		return &hook.CompositeResponse{Status: map[string]any{"seen": len(req.Children.Of("v1", "Pod"))}}, nil
//	})
//	http.Handle("/sync", hook.HTTPHandler(h))
//	// or: hook.ServeNATS(ctx, nc, "hooks.example.sync", "example", h)
//
// Either transport accepts a plain JSON body (what Metacontroller sends), a
// binary-mode CloudEvent (what metabus sends: ce-* headers, the JSON body
// unchanged) and a structured-mode CloudEvent, and answers in the mode it
// was called in. A CloudEvent answer has type hookwire.ResponseType of the
// request's type, the request's subject, and the request's id in the
// extension hookwire.ExtRequestID; its data is the JSON response.
//
// A handler fails with a plain error (answered as code 500 with its text),
// an *Error with a code of its choice, or Throttled(d), which asks metabus
// to retry no earlier than d without counting a failure (HTTP 429 and
// Retry-After; over NATS the same code and header next to
// Nats-Service-Error-Code). A malformed request is answered with a
// 400-class code, one above the size limit with 413, and a panic in the
// handler is recovered and answered with 500.
//
// The wire contract is package hookwire's. Package hooktest calls a
// handler with a fixture in each mode, without a cluster.
package hook
