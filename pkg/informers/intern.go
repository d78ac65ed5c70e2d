package informers

import (
	"sync"
	"unsafe"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// Limits of an interner: strings longer than internMaxLen are kept as they
// are (a key that long is rarely repeated), and a table that holds
// internMaxEntries strings takes no more (keys of users' data, such as a
// ConfigMap's, are unbounded), though it still serves those it has.
const (
	internMaxLen     = 64
	internMaxEntries = 8192
)

// interner makes the short map keys of cached objects (and the values of
// apiVersion, kind and namespace) share one copy per informer.
//
// Why: a JSON decoder allocates every key of every object anew, so 4,000
// cached objects hold "metadata", "name", "creationTimestamp",
// "ownerReferences"... 4,000 times over (an estimate: some 40 keys of 16-24
// bytes each in an object that takes about 3 KB as maps), and the garbage
// collector's headroom multiplies whatever the heap holds. Interning after
// the decode leaves the decoder as it is and costs a map lookup per key.
type interner struct {
	mu sync.Mutex
	m  map[string]string
}

func newInterner() *interner { return &interner{m: map[string]string{}} }

// str returns the table's copy of s (adding s when there is room).
func (in *interner) str(s string) string {
	if len(s) > internMaxLen || s == "" {
		return s
	}
	in.mu.Lock()
	c, ok := in.m[s]
	if !ok && len(in.m) < internMaxEntries {
		in.m[s] = s
		c, ok = s, true
	}
	in.mu.Unlock()
	if !ok {
		return s
	}
	return c
}

// key is str(string(b)) for a decoder's map keys (ujson.Reader.Keys),
// without allocating a key the table has: the watch decoder of the
// informer hands out the shared copies directly, and object finds them
// in place.
func (in *interner) key(b []byte) string {
	if len(b) > internMaxLen || len(b) == 0 {
		return string(b)
	}
	in.mu.Lock()
	c, ok := in.m[string(b)] // a lookup by string(b) does not allocate
	if !ok && len(in.m) < internMaxEntries {
		c = string(b)
		in.m[c] = c
		ok = true
	}
	in.mu.Unlock()
	if !ok {
		return string(b)
	}
	return c
}

// internedValue is whether the string value of key is worth interning:
// few distinct values, repeated in every object.
func internedValue(key string) bool {
	return key == "apiVersion" || key == "kind" || key == "namespace"
}

// object interns the keys of m and of everything below it, in place.
func (in *interner) object(m map[string]any) {
	for k, v := range m {
		c := in.str(k)
		swap := !same(c, k)
		if s, ok := v.(string); ok && internedValue(k) {
			if cs := in.str(s); !same(cs, s) {
				v, swap = cs, true
			}
		}
		// Assigning to an existing string key stores the key given, so
		// this swaps the decoder's copies for the shared ones without
		// changing the map's shape (no entry is added during the range).
		if swap {
			m[c] = v
		}
		in.value(v)
	}
}

// same is whether a and b are the same copy, not merely equal.
func same(a, b string) bool { return unsafe.StringData(a) == unsafe.StringData(b) }

func (in *interner) value(v any) {
	switch t := v.(type) {
	case map[string]any:
		in.object(t)
	case []any:
		for _, e := range t {
			in.value(e)
		}
	}
}

// transform is the cache transform of an informer: it drops what hooks
// never need (stripManagedFields) and interns the rest's keys.
func (in *interner) transform(obj any) (any, error) {
	obj, err := stripManagedFields(obj)
	if u, ok := obj.(*unstructured.Unstructured); ok && err == nil {
		in.object(u.Object)
	}
	return obj, err
}
