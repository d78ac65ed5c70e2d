package hooks

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/metabus/metabus/pkg/api/v1alpha1"
	"github.com/metabus/metabus/pkg/bus"
	"github.com/metabus/metabus/pkg/hookapi"
)

// DefaultMaxResponseBytes bounds hook replies unless Options.MaxResponseBytes says otherwise:
// what the bus can deliver (bus.MaxPayload, 8 MiB). A larger reply could never be published
// as a desired state, and reading it only costs the dispatcher memory (decoded, a reply of many
// small objects takes about 35 times its size), so the call fails with ErrResponseTooLarge.
const DefaultMaxResponseBytes int64 = bus.MaxPayload

// Secrets resolves Secret and ConfigMap data for the TLS/auth options. Services implement it
// with their Kubernetes client (ideally an informer cache); tests use a fake. Errors must not
// contain the data.
type Secrets interface {
	Secret(ctx context.Context, namespace, name string) (map[string][]byte, error)
	ConfigMap(ctx context.Context, namespace, name string) (map[string]string, error)
}

// Options configure a Client. The zero value is usable.
type Options struct {
	// Secrets resolves secret-backed options; nil makes any such option fail with a clear error.
	Secrets Secrets
	// SecretNamespaceAllowed, when set, is asked about the namespace of every Secret and
	// ConfigMap that a call's TLS/auth options reference, before any is read. An error refuses
	// the call (*RefusedError, nothing read, nothing sent) and is its reason: it should say how
	// to allow the namespace. nil allows every namespace.
	SecretNamespaceAllowed func(namespace string) error
	// SecretAllowed, when set, is asked about every Secret that a call's TLS/auth options
	// reference (after SecretNamespaceAllowed), before any is read: an error refuses the call
	// as SecretNamespaceAllowed's does. nil allows every Secret.
	SecretAllowed func(namespace, name string) error
	// Registerer receives the hook metrics; nil records none.
	Registerer prometheus.Registerer
	// Logger defaults to zap.NewNop().
	Logger *zap.Logger
	// MaxResponseBytes bounds a reply body (DefaultMaxResponseBytes if ≤0); a larger one is a
	// DecodeError, so a hostile or broken hook cannot exhaust memory.
	MaxResponseBytes int64
	// DefaultTimeout applies to webhooks without a positive timeout (DefaultTimeout if ≤0; at
	// most MaxTimeout, as every timeout).
	DefaultTimeout time.Duration
	// Now is the clock for ETag expiry, Secret refresh, Retry-After dates and ce-time
	// (time.Now if nil).
	Now func() time.Time
	// Destinations is where hooks may be called, checked at every dial (redirects included);
	// nil allows everything. A denied call fails with a *RefusedError naming the rule.
	Destinations *Destinations
	// InsecureCredentialsRefused, when set, makes the client ignore allowInsecureCredentials:
	// credentials are never sent over plain http, and refusals end with this text (it should
	// say which setting refuses them).
	InsecureCredentialsRefused string
	// NATS is the connection hooks served over NATS are called through; nil makes every NATS
	// hook fail with a clear error.
	NATS *nats.Conn
	// SubjectPrefix is the prefix every NATS hook subject must start with (DefaultSubjectPrefix
	// if empty; see CheckSubjectPrefix). A subject outside it is refused (*RefusedError), as
	// are metabus's and NATS's own subjects, whatever the prefix.
	SubjectPrefix string
	// SubjectPrefixSetting names where SubjectPrefix comes from (a flag, a Helm value), for
	// refusal messages.
	SubjectPrefixSetting string
}

// Client calls hooks. It is safe for concurrent use; share one per process so that
// connections, resolved credentials and the ETag cache are shared.
type Client struct {
	secrets        Secrets
	nsAllowed      func(namespace string) error
	secretAllowed  func(namespace, name string) error
	noInsecure     string
	log            *zap.Logger
	maxBody        int64
	defaultTimeout time.Duration
	now            func() time.Time
	metrics        *metrics
	// enc writes request bodies (as json.Marshal would, at half the cost).
	enc hookapi.Encoder

	baseTransport *http.Transport
	plain         *resolvedEndpoint // hooks without TLS/auth options

	mu        sync.Mutex
	endpoints map[string]*endpoint

	etags etagCache

	nats           *nats.Conn
	subjectPrefix  string
	subjectSetting string
}

// New returns a Client.
func New(opts Options) *Client {
	c := &Client{
		secrets:        opts.Secrets,
		nsAllowed:      opts.SecretNamespaceAllowed,
		secretAllowed:  opts.SecretAllowed,
		log:            opts.Logger,
		maxBody:        opts.MaxResponseBytes,
		defaultTimeout: opts.DefaultTimeout,
		now:            opts.Now,
		noInsecure:     opts.InsecureCredentialsRefused,
		endpoints:      make(map[string]*endpoint),
		nats:           opts.NATS,
		subjectPrefix:  opts.SubjectPrefix,
		subjectSetting: opts.SubjectPrefixSetting,
	}
	if c.subjectPrefix == "" {
		c.subjectPrefix = DefaultSubjectPrefix
	}
	if c.subjectSetting == "" {
		c.subjectSetting = "the hook subject prefix setting"
	}
	if c.log == nil {
		c.log = zap.NewNop()
	}
	if c.maxBody <= 0 {
		c.maxBody = DefaultMaxResponseBytes
	}
	if c.defaultTimeout <= 0 {
		c.defaultTimeout = DefaultTimeout
	}
	if c.now == nil {
		c.now = time.Now
	}
	c.baseTransport = newBaseTransport(opts.Destinations)
	c.plain = &resolvedEndpoint{client: newHTTPClient(c.baseTransport)}
	c.metrics = newMetrics(opts.Registerer, c.log)
	return c
}

// newHTTPClient is the client of one transport. It has no Timeout: the per-call context
// carries the webhook timeout, which also bounds Secret resolution and reading the body.
func newHTTPClient(t *http.Transport) *http.Client {
	return &http.Client{Transport: t, CheckRedirect: checkRedirect}
}

// Call describes one hook invocation.
type Call struct {
	Hook            *v1alpha1.Hook
	EndpointConfigs []v1alpha1.EndpointConfig
	// Kind is the hook kind ("sync", "finalize", "customize", "map", "tombstone"); the CE type
	// is io.k8s.metacontroller.hook.<kind>.v1. It is also the metrics "hook" label.
	Kind string
	// ControllerType ("CompositeController", "DecoratorController", ...) and ControllerName
	// label the metrics.
	ControllerType string
	ControllerName string
	// Source is the CE source, the controller object path, e.g.
	// /apis/metacontroller.k8s.io/v1alpha1/compositecontrollers/<name>. When empty it is
	// derived from ControllerType and ControllerName.
	Source string
	// Subject is the CE subject: the parent path.
	Subject string
	// ID is the CE id (e.g. <parentUID>:<workseq>); "" means a random UUID.
	ID string
	// Extensions are extra CE extensions; names must be lower-case a-z0-9, at most 20 long
	// (e.g. parentuid, partitionkey, workseq, traceparent).
	Extensions map[string]string
	// CacheKey keys the ETag cache (e.g. the parent UID); "" disables ETags for this call.
	CacheKey string
	// Request is marshalled (encoding/json) as the JSON body.
	Request any
}

// Do sends call.Request to the hook, over the transport the hook names (an HTTP POST for a
// webhook, a NATS request for nats), and decodes a successful reply into resp, a pointer (nil:
// the reply is checked but discarded). It never retries. Errors are *HTTPError,
// *TooManyRequestsError, *DecodeError, *NoRespondersError, errors matching ErrTimeout, and
// plain errors for invalid configuration, cancellation and transport failures. A call whose
// options reference a namespace that Options.SecretNamespaceAllowed rejects, that would send
// credentials over plain http without allowInsecureCredentials, or whose NATS subject is outside
// the allowed prefix, fails with a *RefusedError before any Secret is read or anything is sent.
//
// What does not depend on the transport happens here, once: the hook's validation, the request
// body's encoding, the timeout, the metabus_hook_* metrics and logging; and, through
// Client.reply, the size and shape limits and the decoding of the answer.
func (c *Client) Do(ctx context.Context, call Call, resp any) error {
	if call.Hook == nil {
		return errors.New("hooks: call has no hook")
	}
	if call.Kind == "" {
		return errors.New("hooks: call has no kind")
	}
	t, err := c.transportFor(&call)
	if err != nil {
		return fmt.Errorf("hooks: %s hook of %s %s: %w", call.Kind, call.ControllerType, call.ControllerName, err)
	}
	target := t.target()
	strict, err := strictMode(call.Hook)
	if err != nil {
		return fmt.Errorf("hooks: %s: %w", target, err)
	}
	body, err := c.enc.Encode(call.Request)
	if err != nil {
		return fmt.Errorf("hooks: %s: cannot marshal request: %w", target, err)
	}

	ctx, cancel := context.WithTimeout(ctx, t.timeout(c.defaultTimeout))
	defer cancel()

	done := c.metrics.start(call.ControllerType, call.ControllerName, call.Kind)
	code, err := t.roundTrip(ctx, c, &call, body, strict, resp)
	done(code)
	if err != nil {
		c.log.Debug("hook call failed", zap.String("target", target), zap.String("hook", call.Kind),
			zap.String("controller", call.ControllerName), zap.String("code", code), zap.Error(err))
	}
	return err
}

// httpTransport calls a webhook: a POST to its URL.
type httpTransport struct {
	u   *url.URL
	w   *v1alpha1.Webhook
	red string // u without a password, for errors and logs
}

func (t *httpTransport) target() string { return t.red }

func (t *httpTransport) timeout(def time.Duration) time.Duration { return timeoutOr(t.w, def) }

func (t *httpTransport) roundTrip(ctx context.Context, c *Client, call *Call, body []byte, strict bool, resp any) (string, error) {
	return c.do(ctx, call, t.u, t.red, body, strict, resp)
}

// do performs the call and returns the metrics code label with the result.
func (c *Client) do(ctx context.Context, call *Call, u *url.URL, target string, body []byte, strict bool, resp any) (string, error) {
	w := call.Hook.Webhook
	ep, err := c.endpointFor(ctx, w, call.EndpointConfigs, u)
	if err != nil {
		if ctxErr := contextError(ctx, target, err); ctxErr != nil {
			return codeTimeout, ctxErr
		}
		return codeError, fmt.Errorf("hooks: %s: %w", target, err)
	}
	a, _ := effectiveAuth(w, call.EndpointConfigs, u)
	st := &callState{insecureAllowed: c.insecureAllowed(w, a)}
	now := c.now()
	req, err := newRequest(withCallState(ctx, st), u, call, body, now)
	if err != nil {
		return codeError, fmt.Errorf("hooks: %s: %w", target, err)
	}
	if ep.authHeader != "" {
		req.Header.Set("Authorization", ep.authHeader)
	}

	var (
		store  *etagStore
		cfg    etagConfig
		cached etagEntry
		hit    bool
	)
	if ec, ok := etagOf(w); ok && call.CacheKey != "" {
		cfg, store = ec, c.etags.store(u.String(), ec, c.now())
		// The entry is taken now, so a 304 can be served even if it expires mid-call.
		if cached, hit = store.get(call.CacheKey, cfg, now); hit {
			req.Header.Set("If-None-Match", cached.etag)
		}
	}

	res, err := c.metrics.roundTrip(ep.client, req, call.ControllerType, call.ControllerName, call.Kind, target)
	if err != nil {
		if refused := refusal(err, target, st); refused != nil {
			return codeError, refused
		}
		if te := contextError(ctx, target, err); te != nil {
			return codeTimeout, te
		}
		return codeError, fmt.Errorf("hooks: POST %s: %w", target, unwrapURLError(err))
	}
	defer closeBody(res.Body)
	code := httpCode(res.StatusCode)

	switch {
	case res.StatusCode == http.StatusOK:
	case hit && (res.StatusCode == http.StatusNotModified || res.StatusCode == http.StatusPreconditionFailed):
		// 412 is what RFC 9110 prescribes for a matching If-None-Match on a POST; 304 is
		// what hooks written for upstream send. Both mean "same as last time".
		return code, decode(cached.body, strict, resp, target)
	case res.StatusCode == http.StatusTooManyRequests:
		return code, &TooManyRequestsError{RetryAfter: retryAfter(res.Header.Get("Retry-After"), c.now()), URL: target}
	default:
		b, err := io.ReadAll(io.LimitReader(res.Body, maxErrorBody+1))
		if err != nil {
			if te := contextError(ctx, target, err); te != nil {
				return codeTimeout, te
			}
		}
		return code, &HTTPError{StatusCode: res.StatusCode, Body: snippet(b), URL: target}
	}

	raw, err := readBody(res.Body, res.ContentLength, c.maxBody)
	if err != nil {
		if te := contextError(ctx, target, err); te != nil {
			return codeTimeout, te
		}
		if errors.Is(err, ErrResponseTooLarge) {
			return code, &DecodeError{Err: err, Body: snippet(raw), URL: target}
		}
		return codeError, fmt.Errorf("hooks: %s: cannot read response: %w", target, err)
	}
	data, err := c.reply(res.Header, raw, strict, resp, target)
	if err != nil {
		return code, err
	}
	if store != nil {
		store.put(call.CacheKey, res.Header.Get("ETag"), data, cfg, c.now())
	}
	return code, nil
}

// httpCode is a status code as the metrics' code label.
func httpCode(status int) string { return strconv.Itoa(status) }

// contextError returns a typed error when err was caused by the call's deadline (ErrTimeout)
// or the caller's cancellation, and nil otherwise.
func contextError(ctx context.Context, target string, err error) error {
	var ne net.Error
	switch {
	case errors.Is(ctx.Err(), context.DeadlineExceeded) || errors.Is(err, context.DeadlineExceeded):
		return fmt.Errorf("hooks: POST %s: %w: %w", target, ErrTimeout, context.DeadlineExceeded)
	case errors.Is(ctx.Err(), context.Canceled):
		return fmt.Errorf("hooks: POST %s: %w", target, context.Canceled)
	case errors.As(err, &ne) && ne.Timeout():
		// Transport-level timeouts (dial, TLS handshake) are timeouts of the hook too.
		return fmt.Errorf("hooks: POST %s: %w: %w (%w)", target, ErrTimeout, context.DeadlineExceeded, unwrapURLError(err))
	}
	return nil
}

// unwrapURLError drops the *url.Error wrapper, whose message repeats the method and URL.
func unwrapURLError(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		return ue.Err
	}
	return err
}

// closeBody drains a little of what is left so the connection can be reused, then closes.
func closeBody(b io.ReadCloser) {
	_, _ = io.CopyN(io.Discard, b, 64<<10)
	_ = b.Close()
}
