// Package apply emulates `kubectl apply` for the objects that metabus hooks return,
// without needing any schema: it is a pure, convention-based three-way merge.
//
// A hook returns the short form of each child ("desired"): only the fields it cares about.
// The live object ("observed") also carries fields filled in by the API server, admission
// plugins and other controllers. The desired object written last time ("lastApplied",
// kept in the LastAppliedAnnotation) tells which fields metabus owns, so the merge is
//
//	result = observed + (desired - lastApplied)
//
// Objects merge field by field:
//   - a field in lastApplied that desired no longer has is removed, whatever its live value;
//   - a field set only by others (absent from lastApplied and desired) is kept;
//   - a field in desired takes the desired value, merging recursively when both the live and
//     the desired values are objects (or both are lists, see below);
//   - when the live and desired values have different JSON types, the desired value wins.
//     (Upstream Metacontroller silently kept the old object for object→scalar and wrote null
//     for list→scalar; we do what the hook asked for.)
//   - a null in desired deletes the field, as with `kubectl apply`, also for object-valued
//     fields (upstream left an empty object). Because a null means "absent", nulls in a
//     desired value that is copied wholesale (a new field, a new list item, an atomic list)
//     are dropped from the objects inside it, so applying the same desired twice is stable.
//   - a null recorded in lastApplied marks a deletion, not ownership: if desired later omits
//     that field, a value somebody else has set since is left alone.
//
// Lists are either associative ("list-maps") or atomic. A list is associative when every item
// of the observed, lastApplied and desired lists is an object and all of them have a scalar
// value for one conventional key. The key is taken from the fixed precedence
// containerPort, port, mountPath, name, uid, ip, path. Key values are compared as strings, so
// the number 80 and the string "80" name the same item (as upstream's fmt %v did); numbers are
// compared by value, so int64(80), float64(80) and json.Number("80") are the same key.
// Associative lists are merged item by item: items only in observed (an injected sidecar) are
// kept, items that were in lastApplied but left desired are dropped, matching items merge as
// objects. The result keeps the observed order, followed by new desired items in desired order.
// Any other list, including every list of scalars, is replaced by desired.
//
// Duplicate key values. Upstream collapsed items sharing a key value into one merged item
// written twice, losing data (e.g. containerPort 53 for both TCP and UDP). Here a key whose
// values repeat cannot identify items, so among the conventional keys every item has, the
// first one (in precedence order) that is unique in all three lists is used; failing that,
// the first one unique in desired; failing that, the first one. The DNS ports above thus merge
// by name when they are named. When the chosen key still repeats, items with the same key
// value are matched by occurrence: the n-th observed item with value v pairs with the n-th
// desired item with value v (and the n-th lastApplied one). An unpaired observed occurrence is
// dropped only if lastApplied had that many occurrences, otherwise kept; unpaired desired
// occurrences are appended. Without duplicates this is exactly the plain precedence rule. No
// item is ever merged twice or silently dropped. (Contrived inputs mixing repeated keys with
// items that gain a key between applies can still need a second apply to settle.)
//
// Values are the unstructured JSON forms: map[string]any, []any, string, bool, nil, and
// numbers as int64, float64 or json.Number (other Go integer and float kinds are accepted
// too). Any other Go type, a malformed json.Number, or a NaN/Inf float is reported as an
// error; nothing in this package panics on its input.
//
// The package also holds the pure part of the other strategy, server-side
// apply (Strategy, ssa.go): the configuration sent for a child
// (Configuration), whether a child already holds its values (Settled),
// whether a dry run changes it (Changes), and when the applier's memory of
// its last apply makes the next one a repeat (Applied).
package apply

import "fmt"

// conventionalKeys is the fixed precedence used to detect associative lists. It comes from
// a survey of the associative lists of built-in Kubernetes resources.
var conventionalKeys = [...]string{"containerPort", "port", "mountPath", "name", "uid", "ip", "path"}

// Merge computes observed + (desired - lastApplied) over unstructured JSON values
// (map[string]any, []any, string, float64/int64/bool, nil as produced by encoding/json or
// unstructured). It never mutates its inputs and returns a new object.
//
// A nil lastApplied makes the merge a pure overlay of desired onto observed; a nil observed or
// desired is treated as an empty object.
func Merge(observed, lastApplied, desired map[string]any) (map[string]any, error) {
	if err := validate(observed); err != nil {
		return nil, fmt.Errorf("apply: observed object: %w", err)
	}
	if err := validate(lastApplied); err != nil {
		return nil, fmt.Errorf("apply: last applied object: %w", err)
	}
	if err := validate(desired); err != nil {
		return nil, fmt.Errorf("apply: desired object: %w", err)
	}
	return merge(observed, lastApplied, desired), nil
}

// merge is Merge on validated inputs.
func merge(observed, lastApplied, desired map[string]any) map[string]any {
	out := cloneObject(observed)
	mergeObject(out, lastApplied, desired)
	return out
}

// mergeObject applies (desired - last) to dst in place. dst must be owned by the caller
// (a clone); last and desired are only read.
func mergeObject(dst, last, desired map[string]any) {
	for k, lv := range last {
		if lv == nil {
			continue // a recorded deletion does not make us the owner of the field
		}
		if _, stillWanted := desired[k]; !stillWanted {
			delete(dst, k)
		}
	}
	for k, dv := range desired {
		if dv == nil {
			delete(dst, k)
			continue
		}
		ov, ok := dst[k]
		if !ok {
			dst[k] = cloneDesired(dv)
			continue
		}
		dst[k] = mergeValue(ov, last[k], dv)
	}
}

// mergeValue merges one non-null desired value into the owned live value ov and returns the
// value to store.
func mergeValue(ov, lv, dv any) any {
	switch d := dv.(type) {
	case map[string]any:
		o, ok := ov.(map[string]any)
		if !ok {
			return cloneDesired(d) // type change: the desired object replaces the live value
		}
		l, _ := lv.(map[string]any) // a lastApplied of another type owns nothing inside
		mergeObject(o, l, d)
		return o
	case []any:
		o, ok := ov.([]any)
		if !ok {
			return cloneDesired(d) // type change
		}
		l, _ := lv.([]any)
		return mergeList(o, l, d)
	default:
		// Keep the live representation when the values are equal (int64(3) vs float64(3)),
		// so a no-op apply leaves the object exactly as the API server returned it.
		if equalJSON(ov, dv) {
			return ov
		}
		return dv
	}
}

// mergeList merges an owned live list with desired, as a list-map when a conventional key
// applies, atomically otherwise.
func mergeList(observed, last, desired []any) []any {
	keys, ok := detectListMap(observed, last, desired)
	if !ok {
		return cloneDesired(desired).([]any)
	}
	return mergeListMap(observed, last, desired, keys)
}

// mergeListMap merges the items of an associative list; keys holds every item's key value.
// Items sharing a key value are matched by occurrence (see the package comment).
func mergeListMap(observed, last, desired []any, keys listKeys) []any {
	desiredAt := newKeyIndex(keys.desired)
	lastAt := newKeyIndex(keys.last)
	occurrence := occurrences(keys.observed)
	used := make([]bool, len(desired))
	out := make([]any, 0, len(observed)+len(desired))

	for i, item := range observed {
		k, n := keys.observed[i], occurrence[i]
		if j := desiredAt.nth(k, n); j >= 0 {
			used[j] = true
			var lastItem map[string]any
			if l := lastAt.nth(k, n); l >= 0 {
				lastItem = last[l].(map[string]any)
			}
			mergeObject(item.(map[string]any), lastItem, desired[j].(map[string]any))
			out = append(out, item)
			continue
		}
		if lastAt.nth(k, n) >= 0 {
			continue // we applied this item before and desired no longer has it
		}
		out = append(out, item) // set by someone else, e.g. an injected sidecar
	}
	for j, item := range desired {
		if !used[j] {
			out = append(out, cloneDesired(item))
		}
	}
	return out
}

// smallList is the size up to which scanning a list beats building a map over it.
const smallList = 16

// keyIndex finds the n-th item (0-based) with a given key value.
type keyIndex struct {
	keys  []string
	byKey map[string][]int // only for lists longer than smallList
}

func newKeyIndex(keys []string) keyIndex {
	x := keyIndex{keys: keys}
	if len(keys) > smallList {
		x.byKey = make(map[string][]int, len(keys))
		for i, k := range keys {
			x.byKey[k] = append(x.byKey[k], i)
		}
	}
	return x
}

// nth returns the position of the n-th item whose key value is k, or -1.
func (x keyIndex) nth(k string, n int) int {
	if x.byKey != nil {
		if at := x.byKey[k]; n < len(at) {
			return at[n]
		}
		return -1
	}
	for i, key := range x.keys {
		if key == k {
			if n == 0 {
				return i
			}
			n--
		}
	}
	return -1
}

// occurrences returns, for every item, how many earlier items share its key value.
func occurrences(keys []string) []int {
	occ := make([]int, len(keys))
	if len(keys) > smallList {
		seen := make(map[string]int, len(keys))
		for i, k := range keys {
			occ[i] = seen[k]
			seen[k]++
		}
		return occ
	}
	for i, k := range keys {
		for _, prev := range keys[:i] {
			if prev == k {
				occ[i]++
			}
		}
	}
	return occ
}

// listKeys holds the key value of every item of the three lists, index for index.
type listKeys struct {
	observed, last, desired []string
}

// detectListMap decides whether the three lists form an associative list and, if so, returns
// the key value of every item for the chosen conventional key. Among the keys every item has,
// it prefers, in precedence order within each tier: a key unique in all three lists, then a
// key unique in desired, then any key (matched by occurrence).
//
// Why the tiers: a repeated key cannot tell items apart, and the choice must not flip between
// two applies of the same desired, or the second apply would pair items differently and undo
// the first. Desired is the one input that is the same on both applies, so a key unique in
// desired beats one that repeats there.
func detectListMap(observed, last, desired []any) (listKeys, bool) {
	if len(observed)+len(last)+len(desired) == 0 {
		return listKeys{}, false
	}
	if !allObjects(observed) || !allObjects(last) || !allObjects(desired) {
		return listKeys{}, false
	}
	var uniqueInDesired, common listKeys
	var haveUniqueInDesired, haveCommon bool
	for _, key := range conventionalKeys {
		o, oUnique, ok1 := keyValues(observed, key)
		if !ok1 {
			continue
		}
		l, lUnique, ok2 := keyValues(last, key)
		if !ok2 {
			continue
		}
		d, dUnique, ok3 := keyValues(desired, key)
		if !ok3 {
			continue
		}
		lk := listKeys{observed: o, last: l, desired: d}
		switch {
		case oUnique && lUnique && dUnique:
			return lk, true
		case dUnique && !haveUniqueInDesired:
			uniqueInDesired, haveUniqueInDesired = lk, true
		case !haveCommon:
			common, haveCommon = lk, true
		}
	}
	if haveUniqueInDesired {
		return uniqueInDesired, true
	}
	return common, haveCommon
}

func allObjects(list []any) bool {
	for _, item := range list {
		if _, ok := item.(map[string]any); !ok {
			return false
		}
	}
	return true
}

// keyValues returns the key value of every item, whether those values are unique, and false
// if some item has no scalar value for key.
func keyValues(list []any, key string) (values []string, unique, ok bool) {
	for _, item := range list { // cheap rejection first: most keys are absent
		switch item.(map[string]any)[key].(type) {
		case nil, map[string]any, []any:
			return nil, false, false
		}
	}
	values = make([]string, len(list))
	for i, item := range list {
		v, ok := keyString(item.(map[string]any)[key])
		if !ok {
			return nil, false, false // not reached for validated input
		}
		values[i] = v
	}
	return values, allDistinct(values), true
}

// allDistinct reports whether no string repeats.
func allDistinct(values []string) bool {
	if len(values) <= smallList {
		for i, v := range values {
			for _, prev := range values[:i] {
				if prev == v {
					return false
				}
			}
		}
		return true
	}
	set := make(map[string]struct{}, len(values))
	for _, v := range values {
		if _, dup := set[v]; dup {
			return false
		}
		set[v] = struct{}{}
	}
	return true
}
