package apply

import (
	"encoding/json"
	"fmt"
	"math"
	"strconv"
)

// valueError reports an input value that is not unstructured JSON, with the path to it.
type valueError struct {
	path string // built while the recursion unwinds, e.g. ".spec.ports[1]"
	msg  string
}

func (e *valueError) Error() string {
	path := e.path
	if path == "" {
		path = "."
	}
	return fmt.Sprintf("%s at %s", e.msg, path)
}

func atPath(err error, segment string) error {
	if ve, ok := err.(*valueError); ok {
		ve.path = segment + ve.path
	}
	return err
}

// validate checks that v only holds unstructured JSON values, so the merge itself can assume
// them and never has to fail (or panic) halfway through.
func validate(v any) error {
	switch t := v.(type) {
	case nil, string, bool:
		return nil
	case map[string]any:
		for k, e := range t {
			if err := validate(e); err != nil {
				return atPath(err, "."+k)
			}
		}
		return nil
	case []any:
		for i, e := range t {
			if err := validate(e); err != nil {
				return atPath(err, "["+strconv.Itoa(i)+"]")
			}
		}
		return nil
	case json.Number:
		if !validNumberLiteral(string(t)) {
			return &valueError{msg: fmt.Sprintf("malformed json.Number %q", string(t))}
		}
		return nil
	case float64:
		return checkFinite(t)
	case float32:
		return checkFinite(float64(t))
	case int, int8, int16, int32, int64, uint, uint8, uint16, uint32, uint64:
		return nil
	default:
		return &valueError{msg: fmt.Sprintf("unsupported value of type %T", v)}
	}
}

func checkFinite(f float64) error {
	if math.IsNaN(f) || math.IsInf(f, 0) {
		return &valueError{msg: fmt.Sprintf("number %v cannot be encoded as JSON", f)}
	}
	return nil
}

// validNumberLiteral accepts exactly the JSON number grammar. strconv.ParseFloat alone is too
// lenient ("0x1p3", "Inf", "1_0"), and encoding/json would refuse those when writing.
func validNumberLiteral(s string) bool {
	if s == "" || (s[0] != '-' && (s[0] < '0' || s[0] > '9')) {
		return false
	}
	return json.Valid([]byte(s))
}

// cloneObject deep-copies a validated object; nil becomes an empty object.
func cloneObject(m map[string]any) map[string]any {
	out := make(map[string]any, len(m))
	for k, v := range m {
		out[k] = clone(v)
	}
	return out
}

// clone deep-copies a validated value. Scalars are immutable and shared.
func clone(v any) any {
	switch t := v.(type) {
	case map[string]any:
		return cloneObject(t)
	case []any:
		out := make([]any, len(t))
		for i, e := range t {
			out[i] = clone(e)
		}
		return out
	default:
		return v
	}
}

// cloneDesired deep-copies a desired value that is being written wholesale, dropping
// null-valued object fields: null means "field absent", and keeping them would make the next
// apply (which deletes them) differ from this one. Null list items are values and are kept.
func cloneDesired(v any) any {
	switch t := v.(type) {
	case map[string]any:
		out := make(map[string]any, len(t))
		for k, e := range t {
			if e != nil {
				out[k] = cloneDesired(e)
			}
		}
		return out
	case []any:
		out := make([]any, len(t))
		for i, e := range t {
			out[i] = cloneDesired(e)
		}
		return out
	default:
		return v
	}
}

// equalJSON is deep equality of JSON meaning: numbers compare by value whatever their Go type
// (the API returns int64 where a hook decoded float64), and a nil object or list equals an
// empty one.
func equalJSON(a, b any) bool {
	switch at := a.(type) {
	case nil:
		return b == nil
	case string:
		bt, ok := b.(string)
		return ok && at == bt
	case bool:
		bt, ok := b.(bool)
		return ok && at == bt
	case map[string]any:
		bt, ok := b.(map[string]any)
		if !ok || len(at) != len(bt) {
			return false
		}
		for k, av := range at {
			bv, ok := bt[k]
			if !ok || !equalJSON(av, bv) {
				return false
			}
		}
		return true
	case []any:
		bt, ok := b.([]any)
		if !ok || len(at) != len(bt) {
			return false
		}
		for i := range at {
			if !equalJSON(at[i], bt[i]) {
				return false
			}
		}
		return true
	default:
		an, ok1 := toNumber(a)
		bn, ok2 := toNumber(b)
		return ok1 && ok2 && an.equal(bn)
	}
}

// number is a JSON number held exactly: an int64 when integral and in range, else a float64.
type number struct {
	isInt bool
	i     int64
	f     float64
}

// toNumber converts any supported numeric Go value; false for non-numbers.
func toNumber(v any) (number, bool) {
	switch n := v.(type) {
	case int64:
		return number{isInt: true, i: n}, true
	case float64:
		return number{f: n}, true
	case int:
		return number{isInt: true, i: int64(n)}, true
	case int32:
		return number{isInt: true, i: int64(n)}, true
	case int16:
		return number{isInt: true, i: int64(n)}, true
	case int8:
		return number{isInt: true, i: int64(n)}, true
	case uint8:
		return number{isInt: true, i: int64(n)}, true
	case uint16:
		return number{isInt: true, i: int64(n)}, true
	case uint32:
		return number{isInt: true, i: int64(n)}, true
	case uint:
		return uintNumber(uint64(n)), true
	case uint64:
		return uintNumber(n), true
	case float32:
		return number{f: float64(n)}, true
	case json.Number:
		if i, err := n.Int64(); err == nil {
			return number{isInt: true, i: i}, true
		}
		f, err := n.Float64()
		if err != nil && !isRangeError(err) {
			return number{}, false
		}
		return number{f: f}, true // out of range gives ±Inf, still ordered consistently
	default:
		return number{}, false
	}
}

func uintNumber(u uint64) number {
	if u <= math.MaxInt64 {
		return number{isInt: true, i: int64(u)}
	}
	return number{f: float64(u)}
}

func isRangeError(err error) bool {
	ne, ok := err.(*strconv.NumError)
	return ok && ne.Err == strconv.ErrRange
}

// asInt returns the integer value of n if it has one that fits in int64.
func (n number) asInt() (int64, bool) {
	if n.isInt {
		return n.i, true
	}
	// -2^63 is exact as a float64; 2^63 is the first value out of range.
	if n.f != math.Trunc(n.f) || n.f < -9223372036854775808.0 || n.f >= 9223372036854775808.0 {
		return 0, false
	}
	return int64(n.f), true
}

func (n number) equal(m number) bool {
	if !n.isInt && !m.isInt {
		return n.f == m.f
	}
	ni, ok1 := n.asInt()
	mi, ok2 := m.asInt()
	return ok1 && ok2 && ni == mi
}

// keyString renders a scalar list-map key value as a string; false for null, objects and
// lists, which cannot identify an item. Integral numbers print as integers whatever their Go
// type, so 80, 80.0 and "80" are the same key.
func keyString(v any) (string, bool) {
	switch t := v.(type) {
	case string:
		return t, true
	case bool:
		return strconv.FormatBool(t), true
	}
	n, ok := toNumber(v)
	if !ok {
		return "", false
	}
	if i, ok := n.asInt(); ok {
		return strconv.FormatInt(i, 10), true
	}
	return strconv.FormatFloat(n.f, 'g', -1, 64), true
}
