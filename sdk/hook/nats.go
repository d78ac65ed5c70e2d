package hook

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/metabus/metabus/pkg/hookwire"
)

// ServeNATS serves h on a NATS subject in a queue group, so that the
// replicas of a hook share its calls and take over from one another. A
// request is a binary-mode CloudEvent (ce-* headers and a JSON payload), a
// structured-mode one (content-type application/cloudevents+json) or plain
// JSON, and is answered in the same mode. A failure is answered with an
// empty payload and the headers Nats-Service-Error-Code and
// Nats-Service-Error; a *ThrottledError with code 429 and Retry-After (in
// seconds).
//
// ServeNATS subscribes, returns an error if that fails, and otherwise
// serves until ctx is done; it then drains the subscription, waits for the
// calls in progress (their context is not cancelled with ctx) and returns
// nil.
func ServeNATS(ctx context.Context, nc *nats.Conn, subject, queue string, h Handler, opts ...Option) error {
	if subject == "" || queue == "" {
		return errors.New("hook: ServeNATS needs a subject and a queue group (replicas share calls through the group)")
	}
	o := newOptions(opts)
	if o.source == "" {
		o.source = "nats:" + subject
	}
	callCtx := context.WithoutCancel(ctx)
	slots := make(chan struct{}, o.concurrency)
	var inFlight sync.WaitGroup
	sub, err := nc.QueueSubscribe(subject, queue, func(m *nats.Msg) {
		// Waiting here holds back delivery of the next request, which
		// NATS buffers, instead of starting unbounded goroutines.
		slots <- struct{}{}
		inFlight.Add(1)
		go func() {
			defer inFlight.Done()
			defer func() { <-slots }()
			o.serveMsg(callCtx, nc, h, m)
		}()
	})
	if err != nil {
		return fmt.Errorf("hook: subscribing to %s in queue group %s: %w", subject, queue, err)
	}
	// The subscription is known to the server once the flush returns, so a
	// caller that starts requesting after ServeNATS is up finds a responder.
	flushCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	err = nc.FlushWithContext(flushCtx)
	cancel()
	if err != nil && ctx.Err() == nil {
		_ = sub.Unsubscribe()
		return fmt.Errorf("hook: subscribing to %s: %w", subject, err)
	}
	closed := sub.StatusChanged(nats.SubscriptionClosed)
	<-ctx.Done()
	if err := sub.Drain(); err != nil && !errors.Is(err, nats.ErrConnectionClosed) && !errors.Is(err, nats.ErrBadSubscription) {
		o.logError(nil, fmt.Errorf("draining %s: %w", subject, err))
	}
	// Drain delivers what was buffered, then closes the subscription (at
	// once if the connection is gone).
	if sub.IsValid() {
		<-closed
	}
	inFlight.Wait()
	return nil
}

// serveMsg answers one request.
func (o *options) serveMsg(ctx context.Context, nc *nats.Conn, h Handler, m *nats.Msg) {
	if m.Reply == "" {
		o.logError(nil, fmt.Errorf("a message on %s has no reply subject: it was published, not requested, and is dropped", m.Subject))
		return
	}
	call, err := o.decodeNATS(m)
	if err != nil {
		o.logError(nil, err)
		o.respondError(nc, m, err)
		return
	}
	data, err := o.invoke(ctx, h, call)
	if err != nil {
		o.respondError(nc, m, err)
		return
	}
	reply, err := o.natsReply(call, data)
	if err == nil && int64(len(reply.Data)) > nc.MaxPayload() {
		err = fmt.Errorf("the response of %d bytes is above the NATS server's max_payload of %d", len(reply.Data), nc.MaxPayload())
	}
	if err != nil {
		o.logError(call, err)
		o.respondError(nc, m, err)
		return
	}
	reply.Subject = m.Reply
	if err := nc.PublishMsg(reply); err != nil {
		o.logError(call, fmt.Errorf("answering on %s: %w", m.Reply, err))
	}
}

// decodeNATS decodes a request. Header names are matched without regard
// to case, as hookwire asks of readers.
func (o *options) decodeNATS(m *nats.Msg) (*Call, error) {
	if int64(len(m.Data)) > o.maxRequest {
		return nil, Errorf(413, "request of %d bytes, at most %d are accepted", len(m.Data), o.maxRequest)
	}
	var contentType string
	attrs := map[string]string{}
	for k, v := range m.Header {
		if len(v) == 0 {
			continue
		}
		lk := strings.ToLower(k)
		if name, ok := strings.CutPrefix(lk, hookwire.HeaderPrefix); ok {
			attrs[name] = v[0]
		} else if lk == hookwire.HeaderContentType {
			contentType = v[0]
		}
	}
	_, hasVersion := attrs["specversion"]
	mode, err := modeOf(contentType, hasVersion)
	if err != nil {
		return nil, err
	}
	switch mode {
	case ModeStructured:
		return structuredCall(m.Data)
	case ModeBinary:
		ev, err := binaryEvent(attrs, contentType, m.Data)
		if err != nil {
			return nil, err
		}
		return callOf(ev, ModeBinary)
	}
	return &Call{Mode: ModePlain, Data: m.Data}, nil
}

// natsReply is the answer message in the call's mode (Subject unset).
func (o *options) natsReply(call *Call, data []byte) (*nats.Msg, error) {
	reply := nats.NewMsg("")
	if call.Mode == ModePlain {
		reply.Header.Set(hookwire.HeaderContentType, hookwire.ContentTypeJSON)
		reply.Data = data
		return reply, nil
	}
	ev, err := replyEvent(call, o.source, data, o.now())
	if err != nil {
		return nil, err
	}
	if call.Mode == ModeStructured {
		body, err := json.Marshal(ev)
		if err != nil {
			return nil, fmt.Errorf("encoding the answer: %w", err)
		}
		reply.Header.Set(hookwire.HeaderContentType, hookwire.ContentTypeStructured)
		reply.Data = body
		return reply, nil
	}
	for _, a := range binaryAttrs(ev) {
		reply.Header.Set(hookwire.HeaderPrefix+a[0], a[1])
	}
	reply.Header.Set(hookwire.HeaderContentType, hookwire.ContentTypeJSON)
	reply.Data = data
	return reply, nil
}

// respondError answers with the NATS services error headers.
func (o *options) respondError(nc *nats.Conn, m *nats.Msg, err error) {
	f := failureOf(err)
	reply := nats.NewMsg(m.Reply)
	reply.Header.Set(hookwire.HeaderServiceErrorCode, strconv.Itoa(f.code))
	reply.Header.Set(hookwire.HeaderServiceError, headerSafe(f.message))
	if f.code == hookwire.CodeThrottled {
		reply.Header.Set(hookwire.HeaderRetryAfter, strconv.FormatFloat(max(f.retryAfter.Seconds(), 0), 'f', -1, 64))
	}
	if perr := nc.PublishMsg(reply); perr != nil {
		o.logError(nil, fmt.Errorf("answering on %s: %w", m.Reply, perr))
	}
}

// headerSafe makes a message fit in one header value: NATS headers are
// lines, so line breaks would end it, and a long message is cut.
func headerSafe(s string) string {
	s = strings.Map(func(r rune) rune {
		if r == '\r' || r == '\n' || r < ' ' {
			return ' '
		}
		return r
	}, s)
	const maxLen = 1024
	if len(s) > maxLen {
		s = strings.ToValidUTF8(s[:maxLen], "")
	}
	return s
}
