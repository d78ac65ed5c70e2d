package hook

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"runtime/debug"
	"strings"
	"time"

	"github.com/metabus/metabus/pkg/hookwire"
)

// Hook kinds, as in a request's CloudEvents type.
const (
	KindSync      = hookwire.HookSync
	KindFinalize  = hookwire.HookFinalize
	KindCustomize = hookwire.HookCustomize
	KindMap       = hookwire.HookMap
	KindTombstone = hookwire.HookTombstone
)

// Mode is how a request arrived, and so how it is answered.
type Mode int

const (
	// ModePlain is a bare JSON body (a legacy Metacontroller caller); the
	// answer is the bare JSON response.
	ModePlain Mode = iota
	// ModeBinary is a binary-mode CloudEvent (ce-* headers, JSON body); the
	// answer is a binary-mode CloudEvent.
	ModeBinary
	// ModeStructured is a structured-mode CloudEvent (the whole event as
	// JSON); the answer is a structured-mode CloudEvent.
	ModeStructured
)

func (m Mode) String() string {
	switch m {
	case ModePlain:
		return "plain"
	case ModeBinary:
		return "binary"
	case ModeStructured:
		return "structured"
	}
	return fmt.Sprintf("Mode(%d)", int(m))
}

// Call is one hook request as received, whatever the transport. In
// ModePlain only Mode and Data are set.
type Call struct {
	Mode Mode
	// Type is the CloudEvents type, hookwire.EventType(<kind>).
	Type string
	// ID, Source (the controller's path), Subject (the parent's path) and
	// Time are the request's CloudEvents attributes.
	ID, Source, Subject string
	Time                time.Time
	// Extensions are the other attributes as strings: parentuid on every
	// call, workseq and partitionkey on sync, finalize and map calls.
	Extensions map[string]string
	// Data is the JSON request.
	Data []byte
}

// Kind returns the hook kind of a CloudEvent request's type ("sync",
// "finalize", ...), or "" when the type is not a metabus hook request's
// (or the request is plain JSON).
func (c *Call) Kind() string {
	k, ok := strings.CutPrefix(c.Type, hookwire.EventTypePrefix)
	if !ok {
		return ""
	}
	k, ok = strings.CutSuffix(k, ".v1")
	if !ok {
		return ""
	}
	return k
}

type callKey struct{}

// CallFrom returns the call a typed handler is serving (its CloudEvents
// attributes and extensions), or nil outside a call.
func CallFrom(ctx context.Context) *Call {
	c, _ := ctx.Value(callKey{}).(*Call)
	return c
}

// Handler serves hook calls: it gets the request and returns the JSON
// response. The typed constructors (Composite, Decorator, Customize, Map,
// Tombstone) are the usual way to make one.
type Handler interface {
	ServeHook(ctx context.Context, call *Call) ([]byte, error)
}

// HandlerFunc adapts a function to Handler.
type HandlerFunc func(ctx context.Context, call *Call) ([]byte, error)

// ServeHook calls f.
func (f HandlerFunc) ServeHook(ctx context.Context, call *Call) ([]byte, error) { return f(ctx, call) }

// Composite serves a CompositeController's sync and finalize hooks
// (req.Finalizing tells them apart).
func Composite(f func(context.Context, *CompositeRequest) (*CompositeResponse, error)) Handler {
	return typed(f, KindSync, KindFinalize)
}

// Decorator serves a DecoratorController's sync and finalize hooks.
func Decorator(f func(context.Context, *DecoratorRequest) (*DecoratorResponse, error)) Handler {
	return typed(f, KindSync, KindFinalize)
}

// Customize serves the customize hook of either controller kind.
func Customize(f func(context.Context, *CustomizeRequest) (*CustomizeResponse, error)) Handler {
	return typed(f, KindCustomize)
}

// Map serves a MapController's map hook.
func Map(f func(context.Context, *MapRequest) (*MapResponse, error)) Handler {
	return typed(f, KindMap)
}

// Tombstone serves a MapController's tombstone hook.
func Tombstone(f func(context.Context, *TombstoneRequest) (*TombstoneResponse, error)) Handler {
	return typed(f, KindTombstone)
}

// typed decodes the request into Req, calls f and encodes its answer. A
// CloudEvent of another metabus hook kind is refused (400): it means the
// controller points this hook's URL or subject at the wrong handler, and
// decoding one body as another would answer nonsense.
func typed[Req, Resp any](f func(context.Context, *Req) (*Resp, error), kinds ...string) Handler {
	return HandlerFunc(func(ctx context.Context, call *Call) ([]byte, error) {
		if k := call.Kind(); call.Mode != ModePlain && strings.HasPrefix(call.Type, hookwire.EventTypePrefix) && !contains(kinds, k) {
			return nil, Errorf(400, "this handler serves %s hooks, not a request of type %q", strings.Join(kinds, " and "), call.Type)
		}
		req := new(Req)
		if err := decodeRequest(call.Data, req); err != nil {
			return nil, Errorf(400, "malformed %T: %v", req, err)
		}
		resp, err := f(ctx, req)
		if err != nil {
			return nil, err
		}
		if resp == nil {
			return nil, errors.New("the hook returned neither a response nor an error")
		}
		data, err := json.Marshal(resp)
		if err != nil {
			return nil, fmt.Errorf("cannot encode the response: %w", err)
		}
		return data, nil
	})
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// Error is a failed call with a status code of HTTP's meaning (4xx the
// request was refused, 5xx the hook failed). A handler's plain error is
// answered as an Error with code 500 and the error's text.
type Error struct {
	Code    int
	Message string
}

func (e *Error) Error() string { return fmt.Sprintf("hook error %d: %s", e.Code, e.Message) }

// Errorf returns an *Error with the code and a formatted message.
func Errorf(code int, format string, args ...any) error {
	return &Error{Code: code, Message: fmt.Sprintf(format, args...)}
}

// ThrottledError is back-pressure: metabus retries the call no earlier
// than RetryAfter, without counting it as a hook failure (HTTP 429 with
// Retry-After; over NATS, code 429 with a Retry-After header).
type ThrottledError struct {
	RetryAfter time.Duration
	Reason     string
}

func (e *ThrottledError) Error() string {
	if e.Reason == "" {
		return fmt.Sprintf("throttled, retry after %s", e.RetryAfter)
	}
	return fmt.Sprintf("throttled, retry after %s: %s", e.RetryAfter, e.Reason)
}

// Throttled returns a *ThrottledError asking to be called again after d.
func Throttled(d time.Duration, reason string) error {
	return &ThrottledError{RetryAfter: d, Reason: reason}
}

// failure is how an error is answered: a code, a message, and a delay
// for a throttled one.
type failure struct {
	code       int
	message    string
	retryAfter time.Duration
}

func failureOf(err error) failure {
	var te *ThrottledError
	if errors.As(err, &te) {
		return failure{code: hookwire.CodeThrottled, message: te.Error(), retryAfter: te.RetryAfter}
	}
	var he *Error
	if errors.As(err, &he) {
		code := he.Code
		if code < 400 || code > 599 {
			code = 500 // a failure must not read as success or redirect
		}
		return failure{code: code, message: he.Message}
	}
	return failure{code: 500, message: err.Error()}
}

// DefaultMaxRequestBytes bounds a request body: metabus's default NATS
// max_payload, above which metabus cannot send a request anyway.
const DefaultMaxRequestBytes = 8 << 20

// Option tunes HTTPHandler and ServeNATS.
type Option func(*options)

type options struct {
	maxRequest  int64
	source      string
	onError     func(*Call, error)
	concurrency int
	now         func() time.Time
}

func newOptions(opts []Option) options {
	o := options{maxRequest: DefaultMaxRequestBytes, concurrency: 64, now: time.Now}
	for _, opt := range opts {
		opt(&o)
	}
	return o
}

// WithMaxRequestBytes bounds a request body (DefaultMaxRequestBytes
// unless n > 0); a larger one is refused with code 413.
func WithMaxRequestBytes(n int64) Option {
	return func(o *options) {
		if n > 0 {
			o.maxRequest = n
		}
	}
}

// WithSource sets the CloudEvents source of answers (by default the HTTP
// request's path, or "nats:<subject>").
func WithSource(source string) Option { return func(o *options) { o.source = source } }

// WithErrorLog has f told of every call that is answered with an error:
// malformed requests, the handler's errors, and panics (with their stack).
// call is nil when the request could not be decoded.
func WithErrorLog(f func(call *Call, err error)) Option { return func(o *options) { o.onError = f } }

// WithConcurrency bounds the calls ServeNATS serves at once (64 unless
// n > 0); the next request waits in NATS meanwhile.
func WithConcurrency(n int) Option {
	return func(o *options) {
		if n > 0 {
			o.concurrency = n
		}
	}
}

// invoke calls h, turning a panic into a 500 so that one bad request
// cannot take the hook process down.
func (o *options) invoke(ctx context.Context, h Handler, call *Call) (data []byte, err error) {
	defer func() {
		if p := recover(); p != nil {
			data = nil
			err = &Error{Code: 500, Message: fmt.Sprintf("hook panicked: %v", p)}
			o.logError(call, fmt.Errorf("%w\n%s", err, debug.Stack()))
		}
	}()
	data, err = h.ServeHook(context.WithValue(ctx, callKey{}, call), call)
	if err != nil {
		o.logError(call, err)
	}
	return data, err
}

func (o *options) logError(call *Call, err error) {
	if o.onError != nil {
		o.onError(call, err)
	}
}
