package hooks

import (
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"
)

// ErrTimeout is matched (errors.Is) by every error caused by the webhook timeout or a deadline of
// the caller's context. Such errors also match context.DeadlineExceeded.
var ErrTimeout = errors.New("hook call timed out")

// ErrResponseTooLarge is the cause of a DecodeError for a body above Options.MaxResponseBytes.
var ErrResponseTooLarge = errors.New("hook response exceeds the size limit")

// maxErrorBody bounds the body snippets kept in errors: enough to read a hook's error message,
// small enough that a hostile hook cannot bloat logs and Kubernetes events.
const maxErrorBody = 1024

// HTTPError is a reply with a status other than 200 and 429 (or a 304/412 that cannot be served
// from the ETag cache).
type HTTPError struct {
	StatusCode int
	// Body is the start of the reply body, truncated to about 1 KiB and made printable.
	Body string
	// URL is the webhook URL with any user:password removed.
	URL string
}

func (e *HTTPError) Error() string {
	if e.Body == "" {
		return fmt.Sprintf("hook %s returned HTTP %d", e.URL, e.StatusCode)
	}
	return fmt.Sprintf("hook %s returned HTTP %d: %s", e.URL, e.StatusCode, e.Body)
}

// TooManyRequestsError is a 429 reply. The caller should requeue after RetryAfter, which is
// taken from the Retry-After header (delay-seconds or HTTP-date); it is 0 when the header is
// missing, malformed or in the past.
type TooManyRequestsError struct {
	RetryAfter time.Duration
	URL        string
}

func (e *TooManyRequestsError) Error() string {
	return fmt.Sprintf("hook %s returned HTTP 429 Too Many Requests (retry after %s)", e.URL, e.RetryAfter)
}

// DecodeError is a 200 reply whose body cannot be used: malformed JSON, an empty body or null,
// a strict-mode violation, a malformed CloudEvent, or a body above the size limit
// (errors.Is(err, ErrResponseTooLarge)).
type DecodeError struct {
	Err error
	// Body is the start of the body, truncated to about 1 KiB and made printable. It is kept
	// out of Error() on purpose: a hook's reply routinely carries Secret children, and error
	// strings end up in logs and Kubernetes events.
	Body string
	URL  string
}

func (e *DecodeError) Error() string {
	return fmt.Sprintf("hook %s: cannot decode response: %v", e.URL, e.Err)
}

func (e *DecodeError) Unwrap() error { return e.Err }

// snippet returns a printable prefix of b of at most maxErrorBody bytes.
func snippet(b []byte) string {
	truncated := false
	if len(b) > maxErrorBody {
		b, truncated = b[:maxErrorBody], true
		// Drop a multi-byte rune cut by the truncation: it is not garbage from the hook.
		i := len(b) - 1
		for i > 0 && !utf8.RuneStart(b[i]) && len(b)-i < utf8.UTFMax {
			i--
		}
		if !utf8.FullRune(b[i:]) {
			b = b[:i]
		}
	}
	var sb strings.Builder
	sb.Grow(len(b) + 16)
	for len(b) > 0 {
		r, size := utf8.DecodeRune(b)
		b = b[size:]
		switch {
		case r == utf8.RuneError && size <= 1:
			sb.WriteByte('?')
		case r == '\n' || r == '\r' || r == '\t':
			sb.WriteByte(' ')
		case unicode.IsPrint(r):
			sb.WriteRune(r)
		default:
			sb.WriteByte('?')
		}
	}
	if truncated {
		sb.WriteString("...(truncated)")
	}
	return sb.String()
}
