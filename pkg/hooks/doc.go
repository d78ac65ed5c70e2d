// Package hooks calls user hooks, over HTTP(S) (a webhook) or as a NATS request (hooks.<hook>.nats).
// It is the one hook client every metabus service uses, so that the wire contract of upstream
// Metacontroller is implemented exactly once. Callers hold a Caller (Client implements it);
// Client.Do does what every transport shares (validation, encoding the body once, the timeout,
// metrics, logging, the size and shape limits, decoding the answer) and hands the encoded
// request to the hook's transport (transport.go): HTTP, described below, or NATS
// (natstransport.go).
//
// # Request
//
// A hook is called with a POST whose body is the JSON of the request, unchanged from what an
// upstream Metacontroller hook has always received. The request is also a CloudEvent in binary
// mode: the event's attributes travel as ce-* headers (ce-specversion, ce-type, ce-source,
// ce-id, ce-subject, ce-time and the extensions) and datacontenttype is the ordinary
// Content-Type: application/json. A legacy hook therefore ignores headers it does not know and
// works unchanged, while a CloudEvents-aware hook sees a well-formed event. Attribute values
// are percent-encoded as the CloudEvents HTTP binding requires, because the sdk writes them
// verbatim and net/http rejects control characters.
//
// # Response
//
// Only 200 is success (and 304/412 when ETag caching is enabled and a cached body exists).
// A reply carrying ce-specversion (binary mode) or Content-Type: application/cloudevents+json
// (structured mode) is read as a CloudEvent and its data is the response; anything else is
// plain JSON. The sdk's client.Request cannot be used because it fails on plain JSON replies.
// Bodies are capped (Options.MaxResponseBytes) because a hook is untrusted input, and so is
// their shape (256Ki objects and arrays, 1Mi values), checked before decoding: 8 MiB of tiny
// values would otherwise decode to hundreds of MiB.
//
// Decoding follows upstream: JSON keys are matched case-sensitively and integers are kept as
// int64 (sigs.k8s.io/json), so unstructured children behave like objects read from the API
// server. Strict mode (default for hook version v2) also rejects unknown and duplicate fields.
//
// # Errors
//
// Do never retries: the caller owns back-off, as upstream's work queue does. Errors are typed so
// the caller can pick the right back-off: *TooManyRequestsError (429, honour RetryAfter),
// *HTTPError (other statuses), *DecodeError (a 200 whose body is unusable) and ErrTimeout.
//
// # TLS and authentication
//
// caBundle, clientTLS, authorization and basicAuth come from the webhook, or, when it sets none
// of them, from the first endpointConfigs entry whose host matches. Secret-backed material is
// re-read at most every 30s so that rotated credentials are picked up without a restart
// (upstream resolves them once). Credentials never appear in errors or logs.
//
// Two checks run before anything is read or sent, and fail the call with a *RefusedError:
// every Secret and ConfigMap reference must be in a namespace Options.SecretNamespaceAllowed
// accepts, and credentials (authorization, basicAuth, a user:password in the url) are only sent
// to https URLs, unless the webhook or the options carrying them set allowInsecureCredentials.
// A service reference is http unless its protocol is https. Options.InsecureCredentialsRefused
// makes the client ignore allowInsecureCredentials altogether.
//
// Credentials never follow a redirect to plain http (unless the call may send them in clear),
// and they follow one only to the same host and port: net/http alone would send the
// Authorization header to any port and scheme of the same host name, and to its subdomains.
//
// # Destinations
//
// Options.Destinations is an admin's policy of where hooks may be called (hosts, addresses,
// CIDRs, ports; see Destinations). It is checked on every dial, after DNS resolution and before
// the connection is opened, so neither a name resolving to a denied address, nor a rebinding
// name, nor a redirect reaches a denied destination. A denied call fails with a *RefusedError
// naming the rule.
package hooks
