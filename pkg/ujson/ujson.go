// Package ujson encodes unstructured Kubernetes objects (the map[string]any
// trees of unstructured.Unstructured) to JSON, and decodes them: exactly
// the bytes encoding/json's Marshal gives for them, and the trees
// sigs.k8s.io/json's decoder gives (decode.go, stream.go), without their
// reflection.
//
// json.Marshal walks a map[string]any through package reflect, which
// allocates a copy of every key and value it visits, and sorts the keys
// through a slice of its own: on the hot path (hook bodies, writes to the
// API server, status comparison) that was about a third of the bytes
// allocated per parent and, through the garbage collector, a tenth of the
// CPU. Append writes the types JSON decoding produces (maps, slices,
// strings, float64, int64, bool, nil) directly and hands anything else to
// json.Marshal, so the output is json.Marshal's for every value; errors
// (a NaN, an unsupported type, a cycle) are json.Marshal's own, produced
// by it.
package ujson

import (
	"encoding/json"
	"math"
	"slices"
	"strconv"
	"sync"
	"unicode/utf8"
)

// maxDepth bounds the nesting written here; deeper values go to
// json.Marshal, which detects cycles (a cyclic map must be an error, not a
// stack overflow).
const maxDepth = 256

// Marshal returns the JSON encoding of v, as json.Marshal does.
func Marshal(v any) ([]byte, error) {
	bp := pool.Get().(*[]byte)
	b, ok := appendValue((*bp)[:0], v, 0)
	if !ok {
		pool.Put(bp)
		return json.Marshal(v)
	}
	out := make([]byte, len(b))
	copy(out, b)
	if cap(b) <= maxPooled {
		*bp = b
		pool.Put(bp)
	}
	return out, nil
}

// Build returns what fn appends to an empty buffer, in a slice of its
// own: the buffer is pooled, so a caller that keeps the bytes pays one
// allocation of their exact size. ok false is fn's.
func Build(fn func(b []byte) ([]byte, bool)) (data []byte, ok bool) {
	bp := pool.Get().(*[]byte)
	b, ok := fn((*bp)[:0])
	if ok {
		data = make([]byte, len(b))
		copy(data, b)
	}
	if cap(b) <= maxPooled {
		*bp = b[:0]
		pool.Put(bp)
	}
	return data, ok
}

// Append appends the JSON encoding of v to b, as json.Marshal writes it.
// On error b is returned unchanged.
func Append(b []byte, v any) ([]byte, error) {
	out, ok := appendValue(b, v, 0)
	if ok {
		return out, nil
	}
	data, err := json.Marshal(v)
	if err != nil {
		return b, err
	}
	return append(b, data...), nil
}

// maxPooled keeps an occasional huge object's buffer out of the pool.
const maxPooled = 64 << 10

var pool = sync.Pool{New: func() any { b := make([]byte, 0, 1024); return &b }}

// keysPool holds the slices map keys are sorted in.
var keysPool = sync.Pool{New: func() any { k := make([]string, 0, 16); return &k }}

// appendValue appends v; false means json.Marshal must encode the whole
// value (it failed or would fail here), and b's contents past its
// original length are garbage.
func appendValue(b []byte, v any, depth int) ([]byte, bool) {
	switch x := v.(type) {
	case nil:
		return append(b, "null"...), true
	case string:
		return appendString(b, x), true
	case bool:
		return strconv.AppendBool(b, x), true
	case int64:
		return strconv.AppendInt(b, x, 10), true
	case int:
		return strconv.AppendInt(b, int64(x), 10), true
	case int32:
		return strconv.AppendInt(b, int64(x), 10), true
	case float64:
		return appendFloat(b, x)
	case map[string]any:
		if x == nil {
			return append(b, "null"...), true
		}
		if depth >= maxDepth {
			return appendMarshal(b, x)
		}
		return appendMap(b, x, depth+1)
	case []any:
		if x == nil {
			return append(b, "null"...), true
		}
		if depth >= maxDepth {
			return appendMarshal(b, x)
		}
		b = append(b, '[')
		for i, e := range x {
			if i > 0 {
				b = append(b, ',')
			}
			var ok bool
			if b, ok = appendValue(b, e, depth+1); !ok {
				return b, false
			}
		}
		return append(b, ']'), true
	default:
		return appendMarshal(b, v)
	}
}

// appendMarshal appends json.Marshal's encoding of v (what it writes for
// v nested in a larger value too).
func appendMarshal(b []byte, v any) ([]byte, bool) {
	data, err := json.Marshal(v)
	if err != nil {
		return b, false
	}
	return append(b, data...), true
}

func appendMap(b []byte, m map[string]any, depth int) ([]byte, bool) {
	kp := keysPool.Get().(*[]string)
	keys := (*kp)[:0]
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys) // json.Marshal orders by the key's bytes
	b = append(b, '{')
	ok := true
	for i, k := range keys {
		if i > 0 {
			b = append(b, ',')
		}
		b = appendString(b, k)
		b = append(b, ':')
		if b, ok = appendValue(b, m[k], depth); !ok {
			break
		}
	}
	clear(keys)
	*kp = keys[:0]
	keysPool.Put(kp)
	if !ok {
		return b, false
	}
	return append(b, '}'), true
}

// appendFloat writes a float64 as json.Marshal does: the shortest
// representation, in exponent form only below 1e-6 or from 1e21, with a
// one-digit negative exponent not zero-padded. NaN and infinities are
// errors there.
func appendFloat(b []byte, f float64) ([]byte, bool) {
	if math.IsNaN(f) || math.IsInf(f, 0) {
		return b, false
	}
	format := byte('f')
	if a := math.Abs(f); a != 0 && (a < 1e-6 || a >= 1e21) {
		format = 'e'
	}
	b = strconv.AppendFloat(b, f, format, -1, 64)
	if format == 'e' {
		// e-07 → e-7
		if n := len(b); n >= 4 && b[n-4] == 'e' && b[n-3] == '-' && b[n-2] == '0' {
			b[n-2] = b[n-1]
			b = b[:n-1]
		}
	}
	return b, true
}

// AppendString appends s as a JSON string, as json.Marshal writes it.
func AppendString(b []byte, s string) []byte { return appendString(b, s) }

const hexDigits = "0123456789abcdef"

// appendString writes s quoted as json.Marshal does: with HTML escaping
// (<, > and & as \u00XX), control characters escaped, invalid UTF-8 as
// \ufffd, and U+2028 and U+2029 escaped.
func appendString(b []byte, s string) []byte {
	b = append(b, '"')
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if c >= 0x20 && c != '"' && c != '\\' && c != '<' && c != '>' && c != '&' {
				i++
				continue
			}
			b = append(b, s[start:i]...)
			switch c {
			case '"', '\\':
				b = append(b, '\\', c)
			case '\b':
				b = append(b, '\\', 'b')
			case '\f':
				b = append(b, '\\', 'f')
			case '\n':
				b = append(b, '\\', 'n')
			case '\r':
				b = append(b, '\\', 'r')
			case '\t':
				b = append(b, '\\', 't')
			default:
				b = append(b, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xf])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			b = append(b, s[start:i]...)
			b = append(b, `\ufffd`...)
			i++
			start = i
			continue
		}
		if r == '\u2028' || r == '\u2029' {
			b = append(b, s[start:i]...)
			b = append(b, '\\', 'u', '2', '0', '2', hexDigits[r&0xf])
			i += size
			start = i
			continue
		}
		i += size
	}
	b = append(b, s[start:]...)
	return append(b, '"')
}
