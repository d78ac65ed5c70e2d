package hooks

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/metabus/metabus/pkg/api/v1alpha1"
	"github.com/metabus/metabus/pkg/hookwire"
)

// DefaultSubjectPrefix is the prefix every NATS hook subject must start
// with unless Options.SubjectPrefix says otherwise.
const DefaultSubjectPrefix = "hooks."

// maxSubjectLen bounds a hook subject: far above any sensible one, far
// below what would bloat a request.
const maxSubjectLen = 255

// reservedSubjects are subject prefixes no hook may be sent to, whatever
// the allowed prefix: metabus's own bus (every stream and service subject
// is under mc.), NATS's system and JetStream APIs ($SYS, $JS, $KV, ...),
// and reply inboxes, where a request would be taken for an answer.
var reservedSubjects = []string{"mc.", "$", "_INBOX."}

// NoRespondersError is a NATS hook call that no hook received: nothing is
// subscribed to the subject (every replica down, or a wrong subject). The
// caller retries it with backoff, as a refused connection.
type NoRespondersError struct {
	Subject string
}

func (e *NoRespondersError) Error() string {
	return "no hook is subscribed to NATS subject " + e.Subject + " (no responders)"
}

func (e *NoRespondersError) Unwrap() error { return nats.ErrNoResponders }

// ServiceError is a NATS hook's error answer (hookwire.HeaderServiceErrorCode
// other than 429): the hook failed or refused the request, as a webhook's
// non-200 status says.
type ServiceError struct {
	Code int
	// Message is the hook's hookwire.HeaderServiceError, truncated to about
	// 1 KiB and made printable.
	Message string
	Subject string
}

func (e *ServiceError) Error() string {
	if e.Message == "" {
		return fmt.Sprintf("hook nats:%s answered error %d", e.Subject, e.Code)
	}
	return fmt.Sprintf("hook nats:%s answered error %d: %s", e.Subject, e.Code, e.Message)
}

// CheckSubjectPrefix validates an allowed hook subject prefix (a setting,
// named in errors by the caller): non-empty, literal tokens ending with a
// dot, and clear of the reserved subjects.
func CheckSubjectPrefix(prefix string) error {
	if prefix == "" || !strings.HasSuffix(prefix, ".") {
		return fmt.Errorf("hook subject prefix %q must be one or more subject tokens ending with a dot, e.g. %q", prefix, DefaultSubjectPrefix)
	}
	if err := checkLiteral(strings.TrimSuffix(prefix, ".")); err != nil {
		return fmt.Errorf("hook subject prefix %q: %w", prefix, err)
	}
	if r := reserved(prefix); r != "" {
		return fmt.Errorf("hook subject prefix %q is under %s, which metabus and NATS use themselves", prefix, r)
	}
	return nil
}

// checkSubject validates a hook's subject against the allowed prefix. A
// malformed subject is an invalid spec (a plain error); a well-formed one
// outside the prefix, or under a reserved subject, is refused
// (*RefusedError naming the rule and the setting that allows it).
func (c *Client) checkSubject(subject string) error {
	if subject == "" {
		return errors.New("invalid nats hook: subject is required")
	}
	if err := checkLiteral(subject); err != nil {
		return fmt.Errorf("invalid nats hook subject %q: %w", subject, err)
	}
	target := "nats:" + subject
	if r := reserved(subject); r != "" {
		return &RefusedError{URL: target, Reason: fmt.Sprintf("NATS hook subject %s is under %s, which metabus and NATS use themselves", subject, r)}
	}
	if !strings.HasPrefix(subject, c.subjectPrefix) {
		return &RefusedError{URL: target, Reason: fmt.Sprintf("NATS hook subject %s is not under the allowed prefix %q (%s)",
			subject, c.subjectPrefix, c.subjectSetting)}
	}
	return nil
}

// checkLiteral accepts a literal NATS subject: dot-separated non-empty
// tokens of printable ASCII without spaces and without the wildcards * and
// > (refused anywhere in a token, so that nothing reads as a wildcard to
// any tool).
func checkLiteral(s string) error {
	if len(s) > maxSubjectLen {
		return fmt.Errorf("longer than %d bytes", maxSubjectLen)
	}
	for _, tok := range strings.Split(s, ".") {
		if tok == "" {
			return errors.New("empty token (a leading, trailing or double dot)")
		}
	}
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == '*' || c == '>':
			return fmt.Errorf("wildcard %q: a hook subject must be literal", c)
		case c <= ' ' || c > '~':
			return errors.New("only printable ASCII without spaces is allowed")
		}
	}
	return nil
}

// reserved returns the reserved prefix s falls under, or "".
func reserved(s string) string {
	for _, r := range reservedSubjects {
		if strings.HasPrefix(s, r) || s+"." == r {
			return r
		}
	}
	return ""
}

// natsTransport calls a hook served over NATS: a request to its subject.
type natsTransport struct {
	h *v1alpha1.NATSHook
}

func (c *Client) natsTransportFor(h *v1alpha1.NATSHook) (transport, error) {
	if err := c.checkSubject(h.Subject); err != nil {
		return nil, err
	}
	switch mode(h) {
	case v1alpha1.CloudEventsBinary, v1alpha1.CloudEventsStructured:
	default:
		return nil, fmt.Errorf("invalid nats hook: unknown cloudEvents mode %q (want binary or structured)", *h.CloudEvents)
	}
	if c.nats == nil {
		return nil, errors.New("nats hook " + h.Subject + " cannot be called: this client has no NATS connection for hooks")
	}
	return &natsTransport{h: h}, nil
}

func mode(h *v1alpha1.NATSHook) v1alpha1.CloudEventsMode {
	if h.CloudEvents == nil || *h.CloudEvents == "" {
		return v1alpha1.CloudEventsBinary
	}
	return *h.CloudEvents
}

func (t *natsTransport) target() string { return "nats:" + t.h.Subject }

func (t *natsTransport) timeout(def time.Duration) time.Duration {
	d := def
	if t.h.Timeout != nil && t.h.Timeout.Duration > 0 {
		d = t.h.Timeout.Duration
	}
	return min(d, MaxTimeout)
}

// codeOK is the metrics code of a successful NATS reply: NATS has no
// status, and hookwire gives error codes HTTP's meaning.
const codeOK = "200"

func (t *natsTransport) roundTrip(ctx context.Context, c *Client, call *Call, body []byte, strict bool, resp any) (string, error) {
	target := t.target()
	msg, err := natsRequest(t.h.Subject, mode(t.h), call, body, c.now())
	if err != nil {
		return codeError, fmt.Errorf("hooks: %s: %w", target, err)
	}
	res, err := c.nats.RequestMsgWithContext(ctx, msg)
	if err != nil {
		switch {
		case errors.Is(err, nats.ErrNoResponders):
			return codeError, &NoRespondersError{Subject: t.h.Subject}
		case errors.Is(ctx.Err(), context.DeadlineExceeded) || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout):
			return codeTimeout, fmt.Errorf("hooks: request to %s: %w: %w", target, ErrTimeout, context.DeadlineExceeded)
		case errors.Is(ctx.Err(), context.Canceled):
			return codeError, fmt.Errorf("hooks: request to %s: %w", target, context.Canceled)
		}
		return codeError, fmt.Errorf("hooks: request to %s: %w", target, err)
	}
	h := make(http.Header, len(res.Header))
	for k, v := range res.Header {
		h[http.CanonicalHeaderKey(k)] = v
	}
	if raw := h.Get(hookwire.HeaderServiceErrorCode); raw != "" {
		return serviceError(h, raw, t.h.Subject, target)
	}
	_, err = c.reply(h, res.Data, strict, resp, target)
	return codeOK, err
}

// serviceError turns an error answer into the error a webhook's status
// would give: 429 is throttling (Retry-After seconds), anything else the
// hook's failure.
func serviceError(h http.Header, raw, subject, target string) (string, error) {
	code, err := strconv.Atoi(strings.TrimSpace(raw))
	if err != nil || code < 100 || code > 999 {
		return codeError, &DecodeError{Err: fmt.Errorf("malformed %s header %q", hookwire.HeaderServiceErrorCode, snippet([]byte(raw))), URL: target}
	}
	if code == hookwire.CodeThrottled {
		return strconv.Itoa(code), &TooManyRequestsError{RetryAfter: retryAfterSeconds(h.Get(hookwire.HeaderRetryAfter)), URL: target}
	}
	return strconv.Itoa(code), &ServiceError{Code: code, Message: snippet([]byte(h.Get(hookwire.HeaderServiceError))), Subject: subject}
}

// retryAfterSeconds parses a NATS Retry-After: seconds, integer or
// decimal. Missing, malformed and non-positive values mean 0.
func retryAfterSeconds(v string) time.Duration {
	secs, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
	if err != nil || !(secs > 0) {
		return 0
	}
	if secs >= float64(maxRetryAfter/time.Second) {
		return maxRetryAfter
	}
	return time.Duration(secs * float64(time.Second))
}

// natsRequest builds a call's request message as the CloudEvents NATS
// binding does. Binary mode: every attribute and extension in a
// "ce-<name>" header with its value verbatim (the NATS binding, unlike the
// HTTP one, has no percent-encoding, and a hook reading the headers with
// its CloudEvents SDK takes them as they are), content-type
// application/json, the request body untouched as payload. A value a NATS
// header line cannot carry (a control character) is an error, not sent. Structured mode: the whole event as
// JSON, content-type application/cloudevents+json.
func natsRequest(subject string, m v1alpha1.CloudEventsMode, call *Call, body []byte, now time.Time) (*nats.Msg, error) {
	msg := nats.NewMsg(subject)
	if m == v1alpha1.CloudEventsStructured {
		id, err := eventID(call)
		if err != nil {
			return nil, err
		}
		// The same document a structured webhook request carries.
		if msg.Data, err = structuredEvent(call, id, body, now); err != nil {
			return nil, err
		}
		msg.Header[hookwire.HeaderContentType] = []string{hookwire.ContentTypeStructured}
		return msg, nil
	}
	attrs, err := ceAttributes(call, now)
	if err != nil {
		return nil, err
	}
	for _, a := range attrs {
		if i := strings.IndexFunc(a[1], func(r rune) bool { return r < ' ' || r == 0x7f }); i >= 0 {
			return nil, fmt.Errorf("CloudEvents attribute %s has a control character at byte %d, which a NATS header cannot carry", a[0], i)
		}
		msg.Header[hookwire.HeaderPrefix+a[0]] = []string{a[1]}
	}
	msg.Header[hookwire.HeaderContentType] = []string{hookwire.ContentTypeJSON}
	msg.Data = body
	return msg, nil
}

// ceAttributes are a call's CloudEvents attributes and extensions, as
// (name, value) pairs.
func ceAttributes(call *Call, now time.Time) ([][2]string, error) {
	id, err := eventID(call)
	if err != nil {
		return nil, err
	}
	attrs := make([][2]string, 0, 6+len(call.Extensions))
	attrs = append(attrs,
		[2]string{"specversion", "1.0"},
		[2]string{"id", id},
		[2]string{"type", hookwire.EventType(call.Kind)},
		[2]string{"source", sourceOf(call)},
		[2]string{"time", now.UTC().Format(time.RFC3339Nano)})
	if call.Subject != "" {
		attrs = append(attrs, [2]string{"subject", call.Subject})
	}
	for name, value := range call.Extensions {
		attrs = append(attrs, [2]string{name, value})
	}
	return attrs, nil
}
