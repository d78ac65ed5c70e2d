package apply

import (
	"maps"
	"math/rand/v2"
	"reflect"
	"slices"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// The property tests use a small hand-rolled generator with a fixed seed, so failures
// reproduce. It builds related triples (desired and observed both derived from lastApplied)
// because independent random documents almost never share fields and would test little.

const propertyIterations = 3000

type gen struct{ r *rand.Rand }

func newGen(seed uint64) *gen { return &gen{r: rand.New(rand.NewPCG(seed, 0x6d657461))} }

func (g *gen) chance(p float64) bool  { return g.r.Float64() < p }
func (g *gen) pick(s []string) string { return s[g.r.IntN(len(s))] }

// Small domains on purpose: they produce shared fields, duplicate keys and type changes.
var (
	fieldNames    = []string{"a", "b", "c", "spec", "items", "name", "port", "image", "value", "status"}
	keyFieldNames = []string{"name", "port", "containerPort", "path", "mountPath"}
	strValues     = []string{"x", "y", "80", "web", ""}
)

func (g *gen) scalar() any {
	switch g.r.IntN(6) {
	case 0:
		return g.pick(strValues)
	case 1:
		return int64(g.r.IntN(4) + 79) // 79..82, overlapping "80"
	case 2:
		return float64(g.r.IntN(3)) + []float64{0, 0.5}[g.r.IntN(2)]
	case 3:
		return g.chance(0.5)
	case 4:
		return nil
	default:
		return g.pick(strValues)
	}
}

func (g *gen) value(depth int) any {
	if depth <= 0 {
		return g.scalar()
	}
	switch g.r.IntN(8) {
	case 0, 1:
		return g.object(depth - 1)
	case 2, 3:
		return g.keyedList(depth - 1)
	case 4:
		l := make([]any, g.r.IntN(4))
		for i := range l {
			l[i] = g.scalar()
		}
		return l
	case 5:
		return []any{g.object(depth - 1), g.scalar()} // mixed: atomic
	default:
		return g.scalar()
	}
}

func (g *gen) object(depth int) map[string]any {
	m := map[string]any{}
	for n := g.r.IntN(5); n > 0; n-- {
		m[g.pick(fieldNames)] = g.value(depth)
	}
	return m
}

func (g *gen) keyedItem(key string, depth int) map[string]any {
	item := g.object(depth)
	item[key] = g.keyValue()
	if g.chance(0.3) {
		item[g.pick(keyFieldNames)] = g.keyValue() // a second conventional key, to exercise precedence
	}
	return item
}

func (g *gen) keyValue() any {
	if g.chance(0.5) {
		return g.pick([]string{"a", "b", "c", "80"})
	}
	return int64(79 + g.r.IntN(3))
}

func (g *gen) keyedList(depth int) []any {
	key := g.pick(keyFieldNames)
	l := make([]any, g.r.IntN(4))
	for i := range l {
		l[i] = g.keyedItem(key, depth)
	}
	return l
}

// mutate returns a modified deep copy of v: the kind of drift other actors, the API server or
// a new hook answer introduce. nulls controls whether explicit nulls may appear.
func (g *gen) mutate(v any, depth int, nulls bool) any {
	switch t := v.(type) {
	case map[string]any:
		out := map[string]any{}
		for _, k := range sortedKeys(t) {
			e := t[k]
			switch {
			case g.chance(0.12):
				// dropped
			case nulls && g.chance(0.05):
				out[k] = nil
			case g.chance(0.1):
				out[k] = g.value(depth)
			default:
				out[k] = g.mutate(e, depth-1, nulls)
			}
		}
		if g.chance(0.3) {
			out[g.pick(fieldNames)] = g.value(depth)
		}
		return out
	case []any:
		out := make([]any, 0, len(t)+1)
		for _, e := range t {
			if g.chance(0.15) {
				continue
			}
			out = append(out, g.mutate(e, depth-1, nulls))
		}
		if g.chance(0.3) {
			if len(t) > 0 {
				if item, ok := t[0].(map[string]any); ok {
					for _, k := range keyFieldNames {
						if _, has := item[k]; has {
							out = append(out, g.keyedItem(k, depth-1))
							break
						}
					}
				}
			} else {
				out = append(out, g.value(depth))
			}
		}
		if g.chance(0.1) {
			g.r.Shuffle(len(out), func(i, j int) { out[i], out[j] = out[j], out[i] })
		}
		return out
	default:
		if g.chance(0.25) {
			return g.scalar()
		}
		return v
	}
}

// triple returns observed, lastApplied (nil sometimes) and desired documents.
func (g *gen) triple() (observed, last, desired map[string]any) {
	base := g.object(3)
	last = g.mutate(base, 3, true).(map[string]any)
	observed = g.mutate(last, 3, false).(map[string]any)
	desired = g.mutate(last, 3, true).(map[string]any)
	if g.chance(0.15) {
		last = nil
	}
	return observed, last, desired
}

func withMeta(t testing.TB, doc map[string]any, last map[string]any) *unstructured.Unstructured {
	t.Helper()
	obj := &unstructured.Unstructured{Object: cloneObject(doc)}
	obj.Object["metadata"] = map[string]any{"name": "child", "uid": "u1", "resourceVersion": "5"}
	if last != nil {
		if err := SetLastApplied(obj, last); err != nil {
			t.Fatal(err)
		}
	}
	return obj
}

// Applying the same desired twice changes nothing the second time, even after the first
// result went through the API server (JSON round trip, int64 numbers).
func TestPropertyIdempotent(t *testing.T) {
	g := newGen(1)
	for i := range propertyIterations {
		observedDoc, last, desiredDoc := g.triple()
		observed := withMeta(t, observedDoc, last)
		desired := &unstructured.Unstructured{Object: cloneObject(desiredDoc)}
		desired.Object["metadata"] = map[string]any{"name": "child"}

		first, _, err := UpdateChild(observed, desired)
		if err != nil {
			t.Fatalf("iteration %d: %v", i, err)
		}
		stored := unstructuredFrom(t, apiJSON, mustJSON(t, first.Object))
		again := unstructuredFrom(t, hookJSON, mustJSON(t, desired.Object))
		second, changed, err := UpdateChild(stored, again)
		if err != nil {
			t.Fatalf("iteration %d: %v", i, err)
		}
		if changed {
			t.Fatalf("iteration %d: second apply changed the object\n observed %s\n last     %s\n desired  %s\n first    %s\n second   %s",
				i, mustJSON(t, observedDoc), mustJSON(t, last), mustJSON(t, desiredDoc),
				mustJSON(t, stored.Object), mustJSON(t, second.Object))
		}
	}
}

// Fields set only by others (present in observed, absent from lastApplied and desired) are
// never touched. The marker is planted at every depth of objects reachable without lists and
// checked wherever nothing we own encloses it.
func TestPropertyOthersFieldsUntouched(t *testing.T) {
	g := newGen(2)
	checked := 0
	for i := range propertyIterations {
		observed, last, desired := g.triple()
		for _, path := range objectPaths(observed, nil) {
			if !othersOnly(path, last, desired) {
				continue
			}
			marker := g.value(2)
			obs := cloneObject(observed)
			objectAt(obs, path)["zz_other"] = marker

			got, err := Merge(obs, last, desired)
			if err != nil {
				t.Fatalf("iteration %d: %v", i, err)
			}
			parent := objectAt(got, path)
			if v, ok := parent["zz_other"]; parent == nil || !ok || !reflect.DeepEqual(v, marker) {
				t.Fatalf("iteration %d: field %v.zz_other = %v was touched\n observed %s\n last     %s\n desired  %s\n got      %s",
					i, path, marker, mustJSON(t, obs), mustJSON(t, last), mustJSON(t, desired), mustJSON(t, got))
			}
			checked++
		}
	}
	if checked < propertyIterations {
		t.Fatalf("only %d placements checked; the generator no longer exercises the property", checked)
	}
}

// Non-null scalars in desired (reached through objects only) end up in the result, and
// null fields end up absent.
func TestPropertyDesiredScalarsWin(t *testing.T) {
	g := newGen(3)
	for i := range propertyIterations {
		observed, last, desired := g.triple()
		got, err := Merge(observed, last, desired)
		if err != nil {
			t.Fatalf("iteration %d: %v", i, err)
		}
		if !desiredFieldsWin(got, desired) {
			t.Fatalf("iteration %d: a desired scalar or null was not applied\n observed %s\n last     %s\n desired  %s\n got      %s",
				i, mustJSON(t, observed), mustJSON(t, last), mustJSON(t, desired), mustJSON(t, got))
		}
	}
}

// objectPaths lists the paths of all objects reachable from m through object fields only.
func objectPaths(m map[string]any, prefix []string) [][]string {
	paths := [][]string{append([]string(nil), prefix...)}
	for _, k := range sortedKeys(m) {
		if child, ok := m[k].(map[string]any); ok {
			paths = append(paths, objectPaths(child, append(prefix, k))...)
		}
	}
	return paths
}

// sortedKeys gives map keys in a fixed order, so the seeded generator stays deterministic.
func sortedKeys(m map[string]any) []string {
	return slices.Sorted(maps.Keys(m))
}

func objectAt(m map[string]any, path []string) map[string]any {
	for _, k := range path {
		next, ok := m[k].(map[string]any)
		if !ok {
			return nil
		}
		m = next
	}
	return m
}

// othersOnly reports whether a field planted under path is outside anything metabus owns or
// replaces: at each level desired either continues with an object, or neither desired nor
// lastApplied mention the field (a recorded null is not ownership).
func othersOnly(path []string, last, desired map[string]any) bool {
	for _, k := range path {
		dv, inDesired := desired[k]
		if !inDesired {
			return last[k] == nil
		}
		d, ok := dv.(map[string]any)
		if !ok {
			return false
		}
		desired = d
		last, _ = last[k].(map[string]any)
	}
	return true
}

// Lists whose items are described consistently by several conventional keys (the name,
// port and containerPort of one logical item always agree), with duplicates on purpose.
// Key detection looks at observed items, which gain keys from desired when merged, so with
// repeated keys a second apply may pair items differently than the first; it must still
// settle quickly and never oscillate, which would be a hot loop of API writes.
func TestPropertyListMapsConverge(t *testing.T) {
	r := rand.New(rand.NewPCG(4, 4))
	item := func() any {
		id := r.IntN(4)
		m := map[string]any{"v": int64(r.IntN(3))}
		ids := map[string]any{"port": int64(id % 2), "name": []string{"a", "b", "c", "d"}[id], "containerPort": int64(id % 3)}
		for _, k := range []string{"port", "name", "containerPort"} {
			if r.Float64() < 0.8 {
				m[k] = ids[k]
			}
		}
		return m
	}
	list := func() map[string]any {
		l := make([]any, r.IntN(4))
		for i := range l {
			l[i] = item()
		}
		return map[string]any{"l": l}
	}
	const maxApplies = 5
	for i := range 10 * propertyIterations {
		observed, last, desired := list(), list(), list()
		if r.IntN(3) == 0 {
			last = nil
		}
		cur, err := Merge(observed, last, desired)
		if err != nil {
			t.Fatal(err)
		}
		for n := 2; ; n++ {
			next, err := Merge(cur, desired, desired)
			if err != nil {
				t.Fatal(err)
			}
			if equalJSON(next, cur) {
				break
			}
			if n == maxApplies {
				t.Fatalf("iteration %d: still changing after %d applies\n observed %s\n last     %s\n desired  %s\n latest   %s",
					i, n, mustJSON(t, observed), mustJSON(t, last), mustJSON(t, desired), mustJSON(t, next))
			}
			cur = next
		}
	}
}

func TestGeneratorIsDeterministic(t *testing.T) {
	a, b := newGen(7), newGen(7)
	for range 10 {
		o1, l1, d1 := a.triple()
		o2, l2, d2 := b.triple()
		if !reflect.DeepEqual([]any{o1, l1, d1}, []any{o2, l2, d2}) {
			t.Fatal("same seed gave different documents")
		}
	}
}
