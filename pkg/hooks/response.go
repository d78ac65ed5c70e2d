package hooks

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"time"

	kjson "sigs.k8s.io/json"

	"github.com/metabus/metabus/pkg/api/v1alpha1"
)

// strictMode returns whether unknown and duplicate fields are errors: responseUnMarshallMode,
// else strict for hook version v2 and loose for v1 (the default), as upstream.
func strictMode(h *v1alpha1.Hook) (bool, error) {
	var m *v1alpha1.ResponseUnMarshallMode
	switch {
	case h.Webhook != nil:
		m = h.Webhook.ResponseUnMarshallMode
	case h.NATS != nil:
		m = h.NATS.ResponseUnMarshallMode
	}
	if m != nil && *m != "" {
		switch *m {
		case v1alpha1.ResponseUnMarshallModeStrict:
			return true, nil
		case v1alpha1.ResponseUnMarshallModeLoose:
			return false, nil
		default:
			return false, fmt.Errorf("unknown responseUnMarshallMode %q (want loose or strict)", *m)
		}
	}
	if h.Version == nil || *h.Version == "" || *h.Version == v1alpha1.HookVersionV1 {
		return false, nil
	}
	if *h.Version == v1alpha1.HookVersionV2 {
		return true, nil
	}
	return false, fmt.Errorf("unknown hook version %q (want v1 or v2)", *h.Version)
}

// decode unmarshals a reply. Both modes decode case-sensitively and keep integers as int64
// (sigs.k8s.io/json), as upstream; strict mode also fails on unknown and duplicate fields.
func decode(data []byte, strict bool, resp any, target string) error {
	trimmed := bytes.TrimSpace(data)
	if len(trimmed) == 0 {
		return &DecodeError{Err: errors.New("empty response body"), URL: target}
	}
	if bytes.Equal(trimmed, []byte("null")) {
		return &DecodeError{Err: errors.New("response is null"), Body: "null", URL: target}
	}
	if resp == nil {
		if !json.Valid(trimmed) {
			return &DecodeError{Err: errors.New("malformed JSON"), Body: snippet(data), URL: target}
		}
		return nil
	}
	if containers, values := jsonShape(data); containers > maxResponseContainers || values > maxResponseValues {
		return &DecodeError{Err: fmt.Errorf("%w: %d JSON objects and arrays and %d values, at most %d and %d are decoded "+
			"(decoded, a reply of many small values takes tens of times its size)",
			ErrResponseTooLarge, containers, values, maxResponseContainers, maxResponseValues), Body: snippet(data), URL: target}
	}
	strictErrs, err := kjson.UnmarshalStrict(data, resp)
	if err != nil {
		return &DecodeError{Err: err, Body: snippet(data), URL: target}
	}
	if strict && len(strictErrs) > 0 {
		return &DecodeError{Err: fmt.Errorf("strict decoding: %w", errors.Join(strictErrs...)), Body: snippet(data), URL: target}
	}
	return nil
}

// The shape limits of a reply. The byte limit alone does not bound what decoding costs: 8 MiB
// of empty objects decode to 2.8 million maps, about 260 MiB live (400 MiB allocated), and a
// dispatcher runs many calls at once. A realistic reply is far below both: 8 MiB of Pods is
// some 100k objects and arrays and 600k values.
const (
	maxResponseContainers = 256 << 10
	maxResponseValues     = 1 << 20
)

// jsonShape counts the objects and arrays of a JSON text, and (an upper bound of) its values,
// without decoding it: a pass over the bytes that allocates nothing.
func jsonShape(data []byte) (containers, values int) {
	commas := 0
	for i := 0; i < len(data); i++ {
		switch data[i] {
		case '"':
			// Skip the string: its contents are not structure.
			for i++; i < len(data); i++ {
				if data[i] == '\\' {
					i++
				} else if data[i] == '"' {
					break
				}
			}
		case '{', '[':
			containers++
		case ',':
			commas++
		}
	}
	return containers, containers + commas + 1
}

// readBody reads at most limit bytes; more is ErrResponseTooLarge (with the start of the body).
func readBody(r io.Reader, contentLength, limit int64) ([]byte, error) {
	if contentLength > limit {
		return nil, fmt.Errorf("%w: Content-Length %d > %d bytes", ErrResponseTooLarge, contentLength, limit)
	}
	size := int64(512)
	if contentLength >= 0 {
		size = contentLength + 1 // +1: the read that reports EOF needs no growth
	}
	buf := make([]byte, 0, size)
	lr := io.LimitReader(r, limit+1)
	for {
		if len(buf) == cap(buf) {
			buf = append(buf, 0)[:len(buf)]
		}
		n, err := lr.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if err == io.EOF {
			break
		}
		if err != nil {
			return buf, err
		}
	}
	if int64(len(buf)) > limit {
		return buf, fmt.Errorf("%w: more than %d bytes", ErrResponseTooLarge, limit)
	}
	return buf, nil
}

// retryAfter parses a Retry-After value: delay-seconds or an HTTP-date. Missing, malformed and
// past values mean 0.
func retryAfter(v string, now time.Time) time.Duration {
	if v == "" {
		return 0
	}
	if secs, err := strconv.ParseInt(v, 10, 64); err == nil {
		if secs <= 0 {
			return 0
		}
		if secs > int64(maxRetryAfter/time.Second) {
			return maxRetryAfter
		}
		return time.Duration(secs) * time.Second
	}
	if t, err := http.ParseTime(v); err == nil {
		if d := t.Sub(now); d > 0 {
			return d
		}
	}
	return 0
}

// maxRetryAfter only prevents overflow; capping the delay is the caller's policy.
const maxRetryAfter = time.Duration(1<<63 - 1)
