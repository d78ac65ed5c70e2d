package ujson

import (
	"fmt"
	"strconv"
	"unicode"
	"unicode/utf16"
	"unicode/utf8"

	sigsjson "sigs.k8s.io/json"
)

// Decode parses data into an unstructured tree (map[string]any, []any,
// string, int64, float64, bool, nil): exactly what
// sigs.k8s.io/json.UnmarshalCaseSensitivePreserveInts gives into an any,
// the decoder of the API machinery (integers that fit an int64 and are
// written without a '.' stay int64, every other number is a float64), but
// without its reflection. Input that parses here is parsed once; anything
// else (a syntax error, a number out of range, nesting too deep) is handed
// to that decoder, so the result and the error are its own.
func Decode(data []byte) (any, error) {
	r := NewReader(data, true)
	if v, ok := r.Value(); ok && r.End() {
		return v, nil
	}
	var v any
	if err := sigsjson.UnmarshalCaseSensitivePreserveInts(data, &v); err != nil {
		return nil, fmt.Errorf("decode JSON: %w", err)
	}
	return v, nil
}

// DecodeMap parses a JSON object as sigs.k8s.io/json's
// UnmarshalCaseSensitivePreserveInts does into a map[string]any (what
// unstructured.Unstructured's UnmarshalJSON decodes an object into); like
// it, a null gives a nil map and anything else that is not an object is an
// error.
func DecodeMap(data []byte) (map[string]any, error) {
	r := NewReader(data, true)
	if r.Peek() == '{' {
		if m, ok := r.Map(); ok && r.End() {
			return m, nil
		}
	}
	var m map[string]any
	if err := sigsjson.UnmarshalCaseSensitivePreserveInts(data, &m); err != nil {
		return nil, fmt.Errorf("decode JSON object: %w", err)
	}
	return m, nil
}

// maxNesting is the nesting of objects and arrays the decoders of
// encoding/json and sigs.k8s.io/json accept (their scanner's
// maxNestingDepth), counted from the document's top: a Reader refuses
// deeper input, which they reject.
const maxNesting = 10000

// Reader parses one JSON document held in memory, value by value, for
// decoders that build their own types (a struct's fields, a watch event's
// envelope) without reflection.
//
// Its methods return ok false for anything they do not take: malformed
// JSON, but also valid JSON they leave to a reflective decoder (a number
// out of range, a type other than the one asked for). After ok false the
// Reader's position is unspecified: the caller gives up on the document
// and hands all of it to the decoder it stands in for, which then gives
// the result, or the error, the input deserves. So every method accepts
// only what encoding/json's scanner accepts, and produces what its
// decoding produces.
type Reader struct {
	data  []byte
	off   int
	depth int
	// PreserveInts decodes numbers in Value and Map as sigs.k8s.io/json's
	// PreserveInts option does (int64 when the literal has no '.' and
	// fits); false decodes them as encoding/json does into an any
	// (float64 always).
	PreserveInts bool
	// Keys, if set, gives the string of a map key Map stores, for keys
	// the Reader has no constant of: a caller that keeps the maps (an
	// informer's cache) can hand out one shared copy per key instead of
	// an allocation each (the bytes are valid only during the call).
	Keys func(key []byte) string
}

// NewReader returns a Reader at the start of data.
func NewReader(data []byte, preserveInts bool) *Reader {
	return &Reader{data: data, PreserveInts: preserveInts}
}

func (r *Reader) skipSpace() {
	for r.off < len(r.data) {
		switch r.data[r.off] {
		case ' ', '\t', '\n', '\r':
			r.off++
		default:
			return
		}
	}
}

// Peek returns the first byte of the next value (0 at the end).
func (r *Reader) Peek() byte {
	r.skipSpace()
	if r.off >= len(r.data) {
		return 0
	}
	return r.data[r.off]
}

// End reports whether only whitespace is left.
func (r *Reader) End() bool {
	r.skipSpace()
	return r.off == len(r.data)
}

// Value reads any value into an unstructured tree.
func (r *Reader) Value() (any, bool) {
	switch r.Peek() {
	case '{':
		m, ok := r.Map()
		return m, ok
	case '[':
		return r.array()
	case '"':
		return r.String()
	case 't':
		return true, r.literal("true")
	case 'f':
		return false, r.literal("false")
	case 'n':
		return nil, r.literal("null")
	default:
		lit, ok := r.number()
		if !ok {
			return nil, false
		}
		return r.convertNumber(lit)
	}
}

// Skip reads a value without keeping it: what a decoder does with the
// value of a field it does not know (no number is converted, so none is
// out of range).
func (r *Reader) Skip() bool {
	switch r.Peek() {
	case '{':
		return r.Object(func([]byte) bool { return r.Skip() })
	case '[':
		return r.Array(r.Skip)
	case '"':
		_, ok := r.RawString()
		return ok
	case 't':
		return r.literal("true")
	case 'f':
		return r.literal("false")
	case 'n':
		return r.literal("null")
	default:
		_, ok := r.number()
		return ok
	}
}

// Null reads a null if one is next.
func (r *Reader) Null() bool {
	return r.Peek() == 'n' && r.literal("null")
}

func (r *Reader) literal(word string) bool {
	if len(r.data)-r.off < len(word) || string(r.data[r.off:r.off+len(word)]) != word {
		return false
	}
	r.off += len(word)
	return true
}

// Bool reads true or false.
func (r *Reader) Bool() (bool, bool) {
	switch r.Peek() {
	case 't':
		return true, r.literal("true")
	case 'f':
		return false, r.literal("false")
	}
	return false, false
}

// Map reads an object into a map[string]any; duplicate keys keep the last
// value, as both decoders do.
func (r *Reader) Map() (map[string]any, bool) {
	m := make(map[string]any)
	ok := r.Object(func(key []byte) bool {
		v, ok := r.Value()
		m[r.keyString(key)] = v
		return ok
	})
	return m, ok
}

// keyString is string(key), without an allocation for the keys most
// Kubernetes objects repeat (a switch on string(b) compares in place; a
// Pod has some 150 keys, most of them these), else from r.Keys.
func (r *Reader) keyString(key []byte) string {
	if s, ok := knownKey(key); ok {
		return s
	}
	if r.Keys != nil {
		return r.Keys(key)
	}
	return string(key)
}

// knownKey returns the constant equal to key, if it has one.
func knownKey(key []byte) (string, bool) {
	switch string(key) {
	case "apiVersion":
		return "apiVersion", true
	case "kind":
		return "kind", true
	case "metadata":
		return "metadata", true
	case "name":
		return "name", true
	case "namespace":
		return "namespace", true
	case "uid":
		return "uid", true
	case "resourceVersion":
		return "resourceVersion", true
	case "generation":
		return "generation", true
	case "generateName":
		return "generateName", true
	case "creationTimestamp":
		return "creationTimestamp", true
	case "deletionTimestamp":
		return "deletionTimestamp", true
	case "labels":
		return "labels", true
	case "annotations":
		return "annotations", true
	case "finalizers":
		return "finalizers", true
	case "ownerReferences":
		return "ownerReferences", true
	case "controller":
		return "controller", true
	case "blockOwnerDeletion":
		return "blockOwnerDeletion", true
	case "managedFields":
		return "managedFields", true
	case "manager":
		return "manager", true
	case "operation":
		return "operation", true
	case "time":
		return "time", true
	case "fieldsType":
		return "fieldsType", true
	case "fieldsV1":
		return "fieldsV1", true
	case "subresource":
		return "subresource", true
	case "f:metadata":
		return "f:metadata", true
	case "f:spec":
		return "f:spec", true
	case "f:status":
		return "f:status", true
	case "f:data":
		return "f:data", true
	case "f:labels":
		return "f:labels", true
	case "f:annotations":
		return "f:annotations", true
	case "f:ownerReferences":
		return "f:ownerReferences", true
	case ".":
		return ".", true
	case "spec":
		return "spec", true
	case "status":
		return "status", true
	case "data":
		return "data", true
	case "type":
		return "type", true
	case "observedGeneration":
		return "observedGeneration", true
	case "conditions":
		return "conditions", true
	case "lastTransitionTime":
		return "lastTransitionTime", true
	case "reason":
		return "reason", true
	case "message":
		return "message", true
	case "selector":
		return "selector", true
	case "matchLabels":
		return "matchLabels", true
	case "template":
		return "template", true
	case "containers":
		return "containers", true
	case "image":
		return "image", true
	case "ports":
		return "ports", true
	case "resources":
		return "resources", true
	case "replicas":
		return "replicas", true
	}
	return "", false
}

// Object reads an object, calling field with each key (unescaped, valid
// only during the call) and the Reader at its value, which field must read
// (false stops the read).
func (r *Reader) Object(field func(key []byte) bool) bool {
	return r.container('{', '}', func() bool {
		if r.Peek() != '"' {
			return false
		}
		key, ok := r.stringBytes()
		if !ok || r.Peek() != ':' {
			return false
		}
		r.off++
		return field(key)
	})
}

// Array reads an array, calling elem with the Reader at each element,
// which elem must read (false stops the read).
func (r *Reader) Array(elem func() bool) bool {
	return r.container('[', ']', elem)
}

// container reads an object or an array: open, then elem's members
// separated by commas, then close; each counts towards the nesting limit.
func (r *Reader) container(open, close byte, elem func() bool) bool {
	if r.Peek() != open {
		return false
	}
	if r.depth++; r.depth > maxNesting {
		return false
	}
	r.off++
	if r.Peek() == close {
		r.off++
		r.depth--
		return true
	}
	for {
		if !elem() {
			return false
		}
		switch r.Peek() {
		case ',':
			r.off++
		case close:
			r.off++
			r.depth--
			return true
		default:
			return false
		}
	}
}

func (r *Reader) array() ([]any, bool) {
	a := make([]any, 0)
	ok := r.Array(func() bool {
		v, ok := r.Value()
		a = append(a, v)
		return ok
	})
	return a, ok
}

// String reads a string, unescaped as the decoders do: invalid UTF-8 and
// lone surrogates become U+FFFD.
func (r *Reader) String() (string, bool) {
	b, ok := r.stringBytes()
	return string(b), ok
}

// RawString reads a string and returns its literal, quotes included (what
// a field's UnmarshalJSON is given, e.g. time.Time's).
func (r *Reader) RawString() ([]byte, bool) {
	start := r.off
	if _, ok := r.stringBytes(); !ok {
		return nil, false
	}
	return r.data[start:r.off], true
}

// stringBytes reads the string at r.off (its opening quote): a slice of
// the input when it has nothing to unescape, else a new slice.
func (r *Reader) stringBytes() ([]byte, bool) {
	if r.Peek() != '"' {
		return nil, false
	}
	start := r.off + 1
	i := start
	for i < len(r.data) {
		c := r.data[i]
		if c == '"' {
			r.off = i + 1
			return r.data[start:i], true
		}
		if c == '\\' || c < 0x20 {
			break
		}
		if c < utf8.RuneSelf {
			i++
			continue
		}
		rr, size := utf8.DecodeRune(r.data[i:])
		if rr == utf8.RuneError && size == 1 {
			break
		}
		i += size
	}
	return r.unquoteSlow(start, i)
}

// unquoteSlow unescapes the string that began at start, copying the clean
// prefix up to i, with the rules of the decoders' unquote: the escapes
// JSON allows, \u surrogate pairs combined, a lone or mismatched surrogate
// as U+FFFD (the escape after a mismatched one read on its own), invalid
// UTF-8 bytes each as U+FFFD; control characters are a syntax error.
func (r *Reader) unquoteSlow(start, i int) ([]byte, bool) {
	b := make([]byte, 0, i-start+16)
	b = append(b, r.data[start:i]...)
	s := r.data
	for i < len(s) {
		c := s[i]
		switch {
		case c == '"':
			r.off = i + 1
			return b, true
		case c < 0x20:
			return nil, false
		case c == '\\':
			if i+1 >= len(s) {
				return nil, false
			}
			switch e := s[i+1]; e {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				b = append(b, unescape[e])
				i += 2
			case 'u':
				rr := hex4(s[i:])
				if rr < 0 {
					return nil, false
				}
				i += 6
				if utf16.IsSurrogate(rr) {
					if dec := utf16.DecodeRune(rr, hex4(s[i:])); dec != unicode.ReplacementChar {
						b = utf8.AppendRune(b, dec)
						i += 6
						break
					}
					rr = unicode.ReplacementChar
				}
				b = utf8.AppendRune(b, rr)
			default:
				return nil, false
			}
		case c < utf8.RuneSelf:
			b = append(b, c)
			i++
		default:
			rr, size := utf8.DecodeRune(s[i:])
			b = utf8.AppendRune(b, rr)
			i += size
		}
	}
	return nil, false
}

// unescape maps the letter of a one-letter escape to its byte.
var unescape = [256]byte{'"': '"', '\\': '\\', '/': '/', 'b': '\b', 'f': '\f', 'n': '\n', 'r': '\r', 't': '\t'}

// hex4 decodes the \uXXXX at the start of s, or returns -1.
func hex4(s []byte) rune {
	if len(s) < 6 || s[0] != '\\' || s[1] != 'u' {
		return -1
	}
	var v rune
	for _, c := range s[2:6] {
		switch {
		case '0' <= c && c <= '9':
			c -= '0'
		case 'a' <= c && c <= 'f':
			c = c - 'a' + 10
		case 'A' <= c && c <= 'F':
			c = c - 'A' + 10
		default:
			return -1
		}
		v = v*16 + rune(c)
	}
	return v
}

// number reads a number literal of JSON's grammar:
// -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?
func (r *Reader) number() ([]byte, bool) {
	r.skipSpace()
	s, start := r.data, r.off
	i := start
	if i < len(s) && s[i] == '-' {
		i++
	}
	switch {
	case i < len(s) && s[i] == '0':
		i++
	case i < len(s) && '1' <= s[i] && s[i] <= '9':
		i = digits(s, i+1)
	default:
		return nil, false
	}
	if i < len(s) && s[i] == '.' {
		j := digits(s, i+1)
		if j == i+1 {
			return nil, false
		}
		i = j
	}
	if i < len(s) && (s[i] == 'e' || s[i] == 'E') {
		i++
		if i < len(s) && (s[i] == '+' || s[i] == '-') {
			i++
		}
		j := digits(s, i)
		if j == i {
			return nil, false
		}
		i = j
	}
	r.off = i
	return s[start:i], true
}

func digits(s []byte, i int) int {
	for i < len(s) && '0' <= s[i] && s[i] <= '9' {
		i++
	}
	return i
}

// convertNumber is the decoders' conversion of a number into an any.
func (r *Reader) convertNumber(lit []byte) (any, bool) {
	if r.PreserveInts {
		if n, ok := parseInt(lit); ok {
			return n, true
		}
	}
	f, err := strconv.ParseFloat(string(lit), 64)
	return f, err == nil
}

// parseInt is strconv.ParseInt(lit, 10, 64) for a JSON number literal:
// false when it has a fraction or an exponent, or overflows. Up to 18
// digits cannot overflow and are summed here; longer ones go to strconv.
func parseInt(lit []byte) (int64, bool) {
	neg := lit[0] == '-'
	d := lit
	if neg {
		d = lit[1:]
	}
	if len(d) > 18 {
		for _, c := range d {
			if c < '0' || c > '9' {
				return 0, false
			}
		}
		n, err := strconv.ParseInt(string(lit), 10, 64)
		return n, err == nil
	}
	var n int64
	for _, c := range d {
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + int64(c-'0')
	}
	if neg {
		n = -n
	}
	return n, true
}

// Int reads a number into an int64 as encoding/json does into an integer
// field: only a literal strconv.ParseInt takes (no fraction, no exponent).
func (r *Reader) Int() (int64, bool) {
	lit, ok := r.number()
	if !ok {
		return 0, false
	}
	return parseInt(lit)
}

// Uint reads a number into a uint64 as encoding/json does into an
// unsigned field.
func (r *Reader) Uint() (uint64, bool) {
	lit, ok := r.number()
	if !ok || lit[0] == '-' {
		return 0, false
	}
	n, err := strconv.ParseUint(string(lit), 10, 64)
	return n, err == nil
}

// Float reads a number into a float64.
func (r *Reader) Float() (float64, bool) {
	lit, ok := r.number()
	if !ok {
		return 0, false
	}
	f, err := strconv.ParseFloat(string(lit), 64)
	return f, err == nil
}
