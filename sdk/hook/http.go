package hook

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"math"
	"net/http"
	"strconv"
	"time"

	"github.com/cloudevents/sdk-go/v2/binding"
	cehttp "github.com/cloudevents/sdk-go/v2/protocol/http"

	"github.com/metabus/metabus/pkg/hookwire"
)

// HTTPHandler serves h as a webhook: a POST whose body is plain JSON (a
// legacy Metacontroller caller), a binary-mode CloudEvent (what metabus
// sends by default) or a structured-mode one, answered in the mode it
// came in. Failures are answered with their code and message as text
// (500 for a plain error or a panic, 400 for a malformed request, 413 for
// one above the size limit), a *ThrottledError with 429 and Retry-After.
func HTTPHandler(h Handler, opts ...Option) http.Handler {
	o := newOptions(opts)
	return &httpHandler{h: h, o: o}
}

type httpHandler struct {
	h Handler
	o options
}

func (s *httpHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		s.fail(w, nil, Errorf(http.StatusMethodNotAllowed, "a hook is called with POST, not %s", r.Method))
		return
	}
	call, err := s.decode(w, r)
	if err != nil {
		s.fail(w, nil, err)
		return
	}
	data, err := s.o.invoke(r.Context(), s.h, call)
	if err != nil {
		answerError(w, err) // invoke told the error log
		return
	}
	if call.Mode == ModePlain {
		w.Header().Set("Content-Type", hookwire.ContentTypeJSON)
		_, _ = w.Write(data)
		return
	}
	source := s.o.source
	if source == "" {
		source = r.URL.Path
		if source == "" {
			source = "/"
		}
	}
	ev, err := replyEvent(call, source, data, s.o.now())
	if err != nil {
		s.fail(w, call, err)
		return
	}
	if call.Mode == ModeStructured {
		body, err := json.Marshal(ev)
		if err != nil {
			s.fail(w, call, err)
			return
		}
		w.Header().Set("Content-Type", hookwire.ContentTypeStructured)
		_, _ = w.Write(body)
		return
	}
	// The sdk's writer percent-encodes header values as the HTTP binding
	// requires.
	ctx := binding.WithForceBinary(context.Background())
	if err := cehttp.WriteResponseWriter(ctx, binding.ToMessage(ev), http.StatusOK, w); err != nil {
		s.o.logError(call, err) // headers may be sent: nothing more to say
	}
}

// decode reads and decodes a request. Its errors are *Error (400-class).
func (s *httpHandler) decode(w http.ResponseWriter, r *http.Request) (*Call, error) {
	if r.ContentLength > s.o.maxRequest {
		return nil, Errorf(http.StatusRequestEntityTooLarge, "request of %d bytes, at most %d are accepted", r.ContentLength, s.o.maxRequest)
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, s.o.maxRequest))
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			return nil, Errorf(http.StatusRequestEntityTooLarge, "request above %d bytes", s.o.maxRequest)
		}
		return nil, Errorf(http.StatusBadRequest, "cannot read the request: %v", err)
	}
	mode, err := modeOf(r.Header.Get("Content-Type"), r.Header.Get("Ce-Specversion") != "")
	if err != nil {
		return nil, err
	}
	switch mode {
	case ModeStructured:
		return structuredCall(body)
	case ModeBinary:
		ev, err := binding.ToEvent(context.Background(), cehttp.NewMessage(r.Header, io.NopCloser(bytes.NewReader(body))))
		if err != nil {
			return nil, Errorf(http.StatusBadRequest, "malformed binary-mode CloudEvent: %v", err)
		}
		return callOf(ev, ModeBinary)
	}
	return &Call{Mode: ModePlain, Data: body}, nil
}

func (s *httpHandler) fail(w http.ResponseWriter, call *Call, err error) {
	s.o.logError(call, err)
	answerError(w, err)
}

func answerError(w http.ResponseWriter, err error) {
	f := failureOf(err)
	if f.code == hookwire.CodeThrottled {
		w.Header().Set(hookwire.HeaderRetryAfter, strconv.FormatInt(retrySeconds(f.retryAfter), 10))
	}
	http.Error(w, f.message, f.code)
}

// retrySeconds rounds a delay up to whole seconds, the unit HTTP's
// Retry-After has, so that the retry never comes early.
func retrySeconds(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64(math.Ceil(d.Seconds()))
}
