package apply

import (
	"encoding/json"
	"math"
	"math/rand/v2"
	"reflect"
	"strconv"
	"strings"
	"testing"

	utiljson "k8s.io/apimachinery/pkg/util/json"
)

// apiJSON decodes like the API machinery does: integers become int64.
func apiJSON(t testing.TB, s string) map[string]any {
	t.Helper()
	if s == "" {
		return nil
	}
	var m map[string]any
	if err := utiljson.Unmarshal([]byte(s), &m); err != nil {
		t.Fatalf("bad test JSON %s: %v", s, err)
	}
	return m
}

// hookJSON decodes like a hook response parsed with encoding/json: every number is float64.
func hookJSON(t testing.TB, s string) map[string]any {
	t.Helper()
	if s == "" {
		return nil
	}
	var m map[string]any
	if err := json.Unmarshal([]byte(s), &m); err != nil {
		t.Fatalf("bad test JSON %s: %v", s, err)
	}
	return m
}

// normalize re-decodes a value through JSON so comparisons ignore Go number types but keep
// list order. It is deliberately independent of the package's own equality.
func normalize(t testing.TB, v any) any {
	t.Helper()
	raw, err := json.Marshal(v)
	if err != nil {
		t.Fatalf("result does not encode as JSON: %v", err)
	}
	var out any
	if err := utiljson.Unmarshal(raw, &out); err != nil {
		t.Fatalf("re-decoding %s: %v", raw, err)
	}
	return out
}

func mustJSON(t testing.TB, v any) string {
	t.Helper()
	raw, err := json.Marshal(v)
	if err != nil {
		t.Fatalf("encoding: %v", err)
	}
	return string(raw)
}

func TestMerge(t *testing.T) {
	tests := []struct {
		name                    string
		observed, last, desired string // JSON; an empty last means "no last applied"
		want                    string
		reason                  string
	}{
		// --- upstream table (notes §3) ---
		{
			name:     "empty",
			observed: `{}`, last: `{}`, desired: `{}`,
			want:   `{}`,
			reason: "nothing observed, owned or wanted gives nothing",
		},
		{
			name:     "scalars keep remove replace add",
			observed: `{"keep":"other","remove":"other","replace":"other"}`,
			last:     `{"remove":"old","replace":"old"}`,
			desired:  `{"replace":"new","add":"new"}`,
			want:     `{"keep":"other","replace":"new","add":"new"}`,
			reason: "keep was never ours so it stays; remove was ours and left desired so it goes even " +
				"though its live value changed; replace and add take the desired value",
		},
		{
			name:     "nested object",
			observed: `{"other":1,"update":{"keep":"other","remove":"other","replace":"other"}}`,
			last:     `{"update":{"remove":"old","replace":"old"}}`,
			desired:  `{"update":{"replace":"new","add":"new"}}`,
			want:     `{"other":1,"update":{"keep":"other","replace":"new","add":"new"}}`,
			reason:   "objects merge recursively with the same three-way rules one level down",
		},
		{
			name:     "replace list",
			observed: `{"list":[1,"two",{"three":3}]}`,
			last:     `{"list":[1,2,3]}`,
			desired:  `{"list":[3,2,1,{"four":4}]}`,
			want:     `{"list":[3,2,1,{"four":4}]}`,
			reason:   "a list whose items are not all objects is atomic: desired replaces it wholesale",
		},
		{
			name: "merge list-maps keyed by name, port and containerPort",
			observed: `{
				"listMap":[
					{"name":"keep","value":"other"},
					{"name":"remove","value":"old"},
					{"name":"merge","nested":{"keep":"other","remove":"old"}}],
				"ports1":[{"port":80,"keep":"other","remove":"old"}],
				"ports2":[{"containerPort":80,"keep":"other"}]}`,
			last: `{
				"listMap":[{"name":"remove","value":"old"},{"name":"merge","nested":{"remove":"old"}}],
				"ports1":[{"port":80,"remove":"old"}]}`,
			desired: `{
				"listMap":[{"name":"merge","nested":{"add":"new"}},{"name":"add","value":"new"}],
				"ports1":[{"port":80,"add":"new"},{"port":90}],
				"ports2":[{"containerPort":80},{"containerPort":90}]}`,
			want: `{
				"listMap":[
					{"name":"keep","value":"other"},
					{"name":"merge","nested":{"keep":"other","add":"new"}},
					{"name":"add","value":"new"}],
				"ports1":[{"port":80,"keep":"other","add":"new"},{"port":90}],
				"ports2":[{"containerPort":80,"keep":"other"},{"containerPort":90}]}`,
			reason: "items merge by key: observed-only items stay, items dropped from desired go, matching " +
				"items merge as objects; observed order first, then new desired items; with no " +
				"lastApplied list (ports2) nothing is removed",
		},
		{
			name:     "not a list-map when an observed item lacks the key",
			observed: `{"list":[{"name":"a","x":"other"},{"value":"no name"}]}`,
			last:     `{"list":[{"name":"a"}]}`,
			desired:  `{"list":[{"name":"a","y":"new"}]}`,
			want:     `{"list":[{"name":"a","y":"new"}]}`,
			reason:   "the items share no conventional key, so the list is atomic and replaced by desired",
		},
		{
			name:     "list of scalars replaced even when others added items",
			observed: `{"finalizers":["ours","theirs"]}`,
			last:     `{"finalizers":["ours"]}`,
			desired:  `{"finalizers":["ours","new"]}`,
			want:     `{"finalizers":["ours","new"]}`,
			reason:   "scalar-valued associative lists are a documented limitation: scalar lists are atomic",
		},

		// --- reference/apply-semantics.txt ---
		{
			name: "motivation: re-apply with an added label keeps server-filled fields",
			observed: `{"apiVersion":"v1","kind":"Pod",
				"metadata":{"name":"my-pod","namespace":"default","uid":"27f1",
					"labels":{"app":"my-app"},
					"annotations":{"kubernetes.io/limit-ranger":"LimitRanger plugin set: cpu request"}},
				"spec":{"containers":[{"name":"nginx","image":"nginx","imagePullPolicy":"Always",
					"resources":{"requests":{"cpu":"100m"}},
					"terminationMessagePath":"/dev/termination-log"}]}}`,
			last: `{"apiVersion":"v1","kind":"Pod","metadata":{"name":"my-pod","labels":{"app":"my-app"}},
				"spec":{"containers":[{"name":"nginx","image":"nginx"}]}}`,
			desired: `{"apiVersion":"v1","kind":"Pod",
				"metadata":{"name":"my-pod","labels":{"app":"my-app","role":"staging"}},
				"spec":{"containers":[{"name":"nginx","image":"nginx"}]}}`,
			want: `{"apiVersion":"v1","kind":"Pod",
				"metadata":{"name":"my-pod","namespace":"default","uid":"27f1",
					"labels":{"app":"my-app","role":"staging"},
					"annotations":{"kubernetes.io/limit-ranger":"LimitRanger plugin set: cpu request"}},
				"spec":{"containers":[{"name":"nginx","image":"nginx","imagePullPolicy":"Always",
					"resources":{"requests":{"cpu":"100m"}},
					"terminationMessagePath":"/dev/termination-log"}]}}`,
			reason: "apply updates only the part that changed (the label) and leaves defaults and " +
				"admission-set fields alone, unlike replace",
		},
		{
			name: "sidecar injected by other automation survives a re-apply",
			observed: `{"apiVersion":"ctl.enisoc.com/v1","kind":"CatSet","metadata":{"name":"my-catset"},
				"spec":{"template":{"metadata":{"labels":{"app":"nginx"}},"spec":{"containers":[
					{"name":"nginx","image":"nginx","ports":[{"containerPort":80,"name":"web"}]},
					{"name":"sidecar","image":"log-uploader"}]}}}}`,
			last: `{"apiVersion":"ctl.enisoc.com/v1","kind":"CatSet","metadata":{"name":"my-catset"},
				"spec":{"template":{"metadata":{"labels":{"app":"nginx"}},"spec":{"containers":[
					{"name":"nginx","image":"nginx","ports":[{"containerPort":80,"name":"web"}]}]}}}}`,
			desired: `{"apiVersion":"ctl.enisoc.com/v1","kind":"CatSet","metadata":{"name":"my-catset"},
				"spec":{"template":{"metadata":{"labels":{"app":"nginx"}},"spec":{"containers":[
					{"name":"nginx","image":"nginx:1.27","ports":[{"containerPort":80,"name":"web"}]}]}}}}`,
			want: `{"apiVersion":"ctl.enisoc.com/v1","kind":"CatSet","metadata":{"name":"my-catset"},
				"spec":{"template":{"metadata":{"labels":{"app":"nginx"}},"spec":{"containers":[
					{"name":"nginx","image":"nginx:1.27","ports":[{"containerPort":80,"name":"web"}]},
					{"name":"sidecar","image":"log-uploader"}]}}}}`,
			reason: "containers is detected as a list-map keyed by name inside a CRD, so the item only " +
				"others added is kept instead of fighting the automation that added it",
		},
		{
			name:     "unconventional key is not merged",
			observed: `{"tolerations":[{"key":"a","effect":"NoSchedule"},{"key":"injected"}]}`,
			last:     `{"tolerations":[{"key":"a"}]}`,
			desired:  `{"tolerations":[{"key":"a","operator":"Exists"}]}`,
			want:     `{"tolerations":[{"key":"a","operator":"Exists"}]}`,
			reason:   "\"key\" is not a conventional merge key (documented limitation), so the list is atomic",
		},
		{
			name:     "mixed objects and scalars is atomic",
			observed: `{"l":[{"name":"a","x":1},"s"]}`,
			last:     `{"l":[{"name":"a"}]}`,
			desired:  `{"l":[{"name":"a"}]}`,
			want:     `{"l":[{"name":"a"}]}`,
			reason:   "all items of all three lists must be objects for a list-map",
		},
		{
			name:     "key with a non-scalar value does not identify items",
			observed: `{"l":[{"name":{"first":"a"},"x":1}]}`,
			last:     `{}`,
			desired:  `{"l":[{"name":{"first":"a"}}]}`,
			want:     `{"l":[{"name":{"first":"a"}}]}`,
			reason:   "an object-valued name cannot be compared as a key, so no key is common and the list is atomic",
		},
		{
			name:     "empty desired list-map keeps others' items and drops ours",
			observed: `{"env":[{"name":"OURS","value":"1"},{"name":"INJECTED","value":"2"}]}`,
			last:     `{"env":[{"name":"OURS","value":"1"}]}`,
			desired:  `{"env":[]}`,
			want:     `{"env":[{"name":"INJECTED","value":"2"}]}`,
			reason:   "an empty desired list is still merged by key: only items we applied are removed",
		},
		{
			name: "nested list-maps inside list-map items",
			observed: `{"containers":[{"name":"app","image":"a:1",
				"env":[{"name":"A","value":"1"},{"name":"PROXY","value":"injected"}],
				"volumeMounts":[{"name":"data","mountPath":"/data","readOnly":true}]}]}`,
			last: `{"containers":[{"name":"app","image":"a:1","env":[{"name":"A","value":"1"}],
				"volumeMounts":[{"name":"data","mountPath":"/data"}]}]}`,
			desired: `{"containers":[{"name":"app","image":"a:2","env":[{"name":"A","value":"2"},{"name":"B","value":"3"}],
				"volumeMounts":[{"name":"data2","mountPath":"/data"}]}]}`,
			want: `{"containers":[{"name":"app","image":"a:2",
				"env":[{"name":"A","value":"2"},{"name":"PROXY","value":"injected"},{"name":"B","value":"3"}],
				"volumeMounts":[{"name":"data2","mountPath":"/data","readOnly":true}]}]}`,
			reason: "merging recurses through list-map items; volumeMounts is keyed by mountPath (before name), " +
				"so renaming the volume updates the same mount in place",
		},

		// --- key precedence and key comparison ---
		{
			name:     "port wins over name",
			observed: `{"ports":[{"port":80,"name":"http","targetPort":8080}]}`,
			last:     `{"ports":[{"port":80,"name":"http"}]}`,
			desired:  `{"ports":[{"port":80,"name":"web"}]}`,
			want:     `{"ports":[{"port":80,"name":"web","targetPort":8080}]}`,
			reason:   "port precedes name in the fixed order, so a renamed port is the same item, updated in place",
		},
		{
			name:     "containerPort wins over port",
			observed: `{"l":[{"containerPort":1,"port":2,"x":"other"}]}`,
			last:     `{}`,
			desired:  `{"l":[{"containerPort":1,"port":3}]}`,
			want:     `{"l":[{"containerPort":1,"port":3,"x":"other"}]}`,
			reason:   "containerPort is first in the precedence, so a changed port does not make a new item",
		},
		{
			name:     "later key used when an earlier one is not common",
			observed: `{"l":[{"name":"a","path":"/p","x":"other"},{"path":"/q"}]}`,
			last:     `{}`,
			desired:  `{"l":[{"path":"/p","y":"new"}]}`,
			want:     `{"l":[{"name":"a","path":"/p","x":"other","y":"new"},{"path":"/q"}]}`,
			reason:   "name is missing from some items, path (last in precedence) is on all of them",
		},
		{
			name:     "key values compare as strings",
			observed: `{"ports":[{"port":"80","x":"other"}]}`,
			last:     `{"ports":[{"port":"80"}]}`,
			desired:  `{"ports":[{"port":80}]}`,
			want:     `{"ports":[{"port":80,"x":"other"}]}`,
			reason:   "like upstream's %v, the number 80 and the string \"80\" name the same item",
		},
		{
			name:     "float key equals integer key",
			observed: `{"ports":[{"containerPort":8080,"protocol":"TCP"}]}`,
			last:     `{}`,
			desired:  `{"ports":[{"containerPort":8080.0}]}`,
			want:     `{"ports":[{"containerPort":8080,"protocol":"TCP"}]}`,
			reason:   "desired numbers are float64 and observed ones int64; keys compare by value",
		},

		// --- type changes (upstream got these wrong) ---
		{
			name:     "object to string",
			observed: `{"a":{"x":1,"y":2}}`,
			last:     `{"a":{"x":1}}`,
			desired:  `{"a":"str"}`,
			want:     `{"a":"str"}`,
			reason:   "the desired value wins a type change; upstream silently kept {\"y\":2}",
		},
		{
			name:     "list to string",
			observed: `{"a":[1,2]}`,
			last:     `{"a":[1]}`,
			desired:  `{"a":"str"}`,
			want:     `{"a":"str"}`,
			reason:   "the desired value wins a type change; upstream wrote null",
		},
		{
			name:     "string to object",
			observed: `{"a":"str","b":1}`,
			last:     `{"a":"str"}`,
			desired:  `{"a":{"x":1}}`,
			want:     `{"a":{"x":1},"b":1}`,
			reason:   "a scalar cannot be merged into, so the desired object replaces it",
		},
		{
			name:     "object to list and list to object",
			observed: `{"a":{"x":1},"b":[{"name":"n"}]}`,
			last:     `{}`,
			desired:  `{"a":[{"name":"n"}],"b":{"x":1}}`,
			want:     `{"a":[{"name":"n"}],"b":{"x":1}}`,
			reason:   "objects and lists never merge with each other; desired wins",
		},
		{
			name:     "lastApplied of another type owns nothing inside",
			observed: `{"a":{"x":1,"y":2}}`,
			last:     `{"a":"str"}`,
			desired:  `{"a":{"x":3}}`,
			want:     `{"a":{"x":3,"y":2}}`,
			reason:   "when lastApplied held a scalar there, no field of the live object was ours to delete",
		},

		// --- null ---
		{
			name:     "null deletes a scalar",
			observed: `{"a":"other","b":1}`,
			last:     `{}`,
			desired:  `{"a":null}`,
			want:     `{"b":1}`,
			reason:   "like kubectl apply, an explicit null deletes the field even if others set it",
		},
		{
			name:     "null deletes an object",
			observed: `{"a":{"x":1},"b":1}`,
			last:     `{"a":{"x":1}}`,
			desired:  `{"a":null}`,
			want:     `{"b":1}`,
			reason:   "upstream left {} behind; null means the field is absent",
		},
		{
			name:     "null on a missing field",
			observed: `{"b":1}`,
			last:     `{}`,
			desired:  `{"a":null}`,
			want:     `{"b":1}`,
			reason:   "deleting an absent field leaves it absent, it does not create a null",
		},
		{
			name:     "nulls inside a new object are dropped",
			observed: `{"b":1}`,
			last:     `{}`,
			desired:  `{"a":{"x":null,"y":1},"l":[{"name":"n","v":null}],"s":[1,null]}`,
			want:     `{"a":{"y":1},"b":1,"l":[{"name":"n"}],"s":[1,null]}`,
			reason: "a null field is absent wherever it appears, so applying the same desired again is a " +
				"no-op; null list items are values and stay",
		},
		{
			name:     "null in a list-map item deletes the item's field",
			observed: `{"l":[{"name":"a","x":"other","y":1}]}`,
			last:     `{}`,
			desired:  `{"l":[{"name":"a","x":null}]}`,
			want:     `{"l":[{"name":"a","y":1}]}`,
			reason:   "list-map items merge as objects, so null deletes within them too",
		},
		{
			name:     "null in lastApplied is not ownership",
			observed: `{"a":"set later by others"}`,
			last:     `{"a":null}`,
			desired:  `{}`,
			want:     `{"a":"set later by others"}`,
			reason:   "a recorded null only deleted the field; it does not make us the owner of a value set since",
		},

		// --- no lastApplied ---
		{
			name:     "no lastApplied is a pure overlay",
			observed: `{"keep":1,"a":{"x":1,"z":9}}`,
			last:     ``,
			desired:  `{"a":{"x":2}}`,
			want:     `{"a":{"x":2,"z":9},"keep":1}`,
			reason:   "without a record of ownership nothing can be removed, only overlaid",
		},
		{
			name:     "no lastApplied still merges list-maps",
			observed: `{"l":[{"name":"a","x":1},{"name":"b"}]}`,
			last:     ``,
			desired:  `{"l":[{"name":"a","y":2}]}`,
			want:     `{"l":[{"name":"a","x":1,"y":2},{"name":"b"}]}`,
			reason:   "list-map detection uses whatever lists exist; b is kept because it was never ours",
		},

		// --- duplicate merge keys ---
		{
			name:     "duplicate key in observed: matched by occurrence, nothing collapsed",
			observed: `{"l":[{"name":"a","v":1},{"name":"a","v":2}]}`,
			last:     `{"l":[{"name":"a"}]}`,
			desired:  `{"l":[{"name":"a","x":1}]}`,
			want:     `{"l":[{"name":"a","v":1,"x":1},{"name":"a","v":2}]}`,
			reason: "the first observed a pairs with the only desired a; the second a was never applied " +
				"(lastApplied had one) so it is kept as is; upstream wrote the merged item twice",
		},
		{
			name:     "duplicate key dropped from desired",
			observed: `{"l":[{"name":"a","v":1},{"name":"a","v":2},{"name":"b"}]}`,
			last:     `{"l":[{"name":"a","v":1},{"name":"a","v":2}]}`,
			desired:  `{"l":[{"name":"a","v":1}]}`,
			want:     `{"l":[{"name":"a","v":1},{"name":"b"}]}`,
			reason:   "lastApplied had two a's and desired has one, so the second occurrence was ours and goes",
		},
		{
			name:     "duplicate key added by desired",
			observed: `{"l":[{"name":"a","v":1}]}`,
			last:     `{"l":[{"name":"a","v":1}]}`,
			desired:  `{"l":[{"name":"a","v":1},{"name":"a","v":2}]}`,
			want:     `{"l":[{"name":"a","v":1},{"name":"a","v":2}]}`,
			reason:   "the extra desired occurrence has no observed partner and is appended, not merged into the first",
		},
		{
			name: "repeated key skipped for a unique one",
			observed: `{"ports":[{"containerPort":53,"protocol":"TCP","name":"dns-tcp","hostIP":"other"},
				{"containerPort":53,"protocol":"UDP","name":"dns"}]}`,
			last: `{"ports":[{"containerPort":53,"protocol":"TCP","name":"dns-tcp"},
				{"containerPort":53,"protocol":"UDP","name":"dns"}]}`,
			desired: `{"ports":[{"containerPort":53,"protocol":"UDP","name":"dns"},
				{"containerPort":53,"protocol":"TCP","name":"dns-tcp"}]}`,
			want: `{"ports":[{"containerPort":53,"protocol":"TCP","name":"dns-tcp","hostIP":"other"},
				{"containerPort":53,"protocol":"UDP","name":"dns"}]}`,
			reason: "containerPort repeats so it cannot identify the items; name is unique and used instead, " +
				"so the TCP and UDP ports stay distinct even though desired lists them in another order",
		},
		{
			name:     "key unique everywhere beats an earlier key repeated in observed",
			observed: `{"ports":[{"port":1,"name":"z","x":"other"},{"port":1,"name":"x"}]}`,
			last:     `{}`,
			desired:  `{"ports":[{"port":1,"name":"x","y":"new"}]}`,
			want:     `{"ports":[{"port":1,"name":"z","x":"other"},{"port":1,"name":"x","y":"new"}]}`,
			reason: "port repeats in observed, so pairing by port would merge desired x into z and rename it; " +
				"name identifies every item uniquely and wins although it comes later in the precedence",
		},
		{
			name: "every common key repeats: occurrence matching",
			observed: `{"ports":[{"containerPort":53,"protocol":"TCP","x":"other"},
				{"containerPort":53,"protocol":"UDP","x":"other"}]}`,
			last: `{"ports":[{"containerPort":53,"protocol":"TCP"},{"containerPort":53,"protocol":"UDP"}]}`,
			desired: `{"ports":[{"containerPort":53,"protocol":"TCP"},{"containerPort":53,"protocol":"UDP"},
				{"containerPort":54}]}`,
			want: `{"ports":[{"containerPort":53,"protocol":"TCP","x":"other"},
				{"containerPort":53,"protocol":"UDP","x":"other"},{"containerPort":54}]}`,
			reason: "no key is unique, so containerPort is used and the n-th 53 pairs with the n-th 53; " +
				"both survive with their own protocol instead of collapsing into one",
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			observed, last, desired := apiJSON(t, tc.observed), apiJSON(t, tc.last), hookJSON(t, tc.desired)
			got, err := Merge(observed, last, desired)
			if err != nil {
				t.Fatalf("Merge: %v", err)
			}
			want := normalize(t, apiJSON(t, tc.want))
			if g := normalize(t, got); !reflect.DeepEqual(g, want) {
				t.Errorf("Merge result:\n got  %s\n want %s\nwhy: %s", mustJSON(t, g), mustJSON(t, want), tc.reason)
			}
		})
	}
}

// Observed holds an injected duplicate name and an item that gains a port from desired. The
// first apply merges by name (port is not on every item); afterwards port is on every item but
// repeats in desired, while name is unique there, so the second apply must keep using name.
func TestMergeDuplicateKeysStableAcrossApplies(t *testing.T) {
	observed := apiJSON(t, `{"l":[{"name":"b","x":1},{"name":"a","x":2},{"name":"a","port":1,"x":3}]}`)
	desired := hookJSON(t, `{"l":[{"name":"a","port":1},{"name":"b","port":1}]}`)
	want := apiJSON(t, `{"l":[{"name":"b","port":1,"x":1},{"name":"a","port":1,"x":2},{"name":"a","port":1,"x":3}]}`)

	first, err := Merge(observed, nil, desired)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(normalize(t, first), normalize(t, want)) {
		t.Fatalf("first apply: got %s, want %s", mustJSON(t, first), mustJSON(t, want))
	}
	second, err := Merge(first, desired, desired)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(normalize(t, second), normalize(t, first)) {
		t.Errorf("second apply re-paired items:\n first  %s\n second %s", mustJSON(t, first), mustJSON(t, second))
	}
}

func TestMergeDoesNotMutateInputs(t *testing.T) {
	observed := apiJSON(t, `{"a":{"x":1,"y":2},"l":[{"name":"a","v":1},{"name":"s"}],"n":[1,2]}`)
	last := apiJSON(t, `{"a":{"x":1},"l":[{"name":"a","v":1}],"n":[1]}`)
	desired := hookJSON(t, `{"a":{"x":null,"z":3},"l":[{"name":"a","v":2},{"name":"b"}],"n":[3],"new":{"k":null}}`)
	before := []string{mustJSON(t, observed), mustJSON(t, last), mustJSON(t, desired)}

	got, err := Merge(observed, last, desired)
	if err != nil {
		t.Fatal(err)
	}
	after := []string{mustJSON(t, observed), mustJSON(t, last), mustJSON(t, desired)}
	if !reflect.DeepEqual(before, after) {
		t.Fatalf("inputs changed:\n before %v\n after  %v", before, after)
	}
	// The result must share no mutable state with the inputs.
	got["a"].(map[string]any)["y"] = "mutated"
	got["l"].([]any)[2].(map[string]any)["name"] = "mutated"
	if again := []string{mustJSON(t, observed), mustJSON(t, last), mustJSON(t, desired)}; !reflect.DeepEqual(before, again) {
		t.Fatalf("result aliases an input:\n before %v\n after  %v", before, again)
	}
}

func TestMergeNumbers(t *testing.T) {
	observed := map[string]any{"replicas": int64(3), "ratio": 0.5, "big": int64(1) << 62}
	desired := map[string]any{"replicas": float64(3), "ratio": json.Number("0.5"), "big": json.Number("4611686018427387904")}
	got, err := Merge(observed, observed, desired)
	if err != nil {
		t.Fatal(err)
	}
	// Equal values keep the live representation, so unstructured content stays as the API gave it.
	if v, ok := got["replicas"].(int64); !ok || v != 3 {
		t.Errorf("replicas = %#v, want int64(3) kept from observed", got["replicas"])
	}
	if v, ok := got["big"].(int64); !ok || v != 1<<62 {
		t.Errorf("big = %#v, want int64(1<<62) kept from observed", got["big"])
	}
	if _, ok := got["ratio"].(float64); !ok {
		t.Errorf("ratio = %#v, want float64 kept from observed", got["ratio"])
	}

	desired = map[string]any{"replicas": float64(4)}
	got, err = Merge(observed, nil, desired)
	if err != nil {
		t.Fatal(err)
	}
	if got["replicas"] != float64(4) {
		t.Errorf("replicas = %#v, want the changed desired value float64(4)", got["replicas"])
	}
}

func TestMergeRejectsNonJSONValues(t *testing.T) {
	tests := []struct {
		name     string
		observed map[string]any
		last     map[string]any
		desired  map[string]any
		wantMsg  string
	}{
		{"channel", map[string]any{"a": make(chan int)}, nil, nil, "at .a"},
		{"typed map", nil, map[string]any{"spec": map[string]any{"labels": map[string]string{"a": "b"}}}, nil, "at .spec.labels"},
		{"struct in list", nil, nil, map[string]any{"l": []any{1, struct{}{}}}, "at .l[1]"},
		{"typed slice", nil, nil, map[string]any{"l": []string{"a"}}, "[]string"},
		{"NaN", map[string]any{"f": math.NaN()}, nil, nil, "cannot be encoded"},
		{"bad json.Number", nil, nil, map[string]any{"n": json.Number("0x10")}, "malformed json.Number"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Merge(tc.observed, tc.last, tc.desired)
			if err == nil {
				t.Fatalf("Merge accepted a non-JSON value, returned %v", got)
			}
			if !strings.Contains(err.Error(), tc.wantMsg) {
				t.Errorf("error %q does not mention %q", err, tc.wantMsg)
			}
		})
	}
}

func TestMergeAcceptsOtherGoNumbers(t *testing.T) {
	observed := map[string]any{"a": 1, "b": uint64(math.MaxUint64), "c": float32(1.5), "d": int32(7)}
	desired := map[string]any{"a": float64(1), "b": uint64(math.MaxUint64), "c": 1.5, "d": int64(8)}
	got, err := Merge(observed, nil, desired)
	if err != nil {
		t.Fatal(err)
	}
	if got["a"] != 1 || got["c"] != float32(1.5) || got["d"] != int64(8) {
		t.Errorf("got %#v", got)
	}
}

func TestKeyString(t *testing.T) {
	tests := []struct {
		in   any
		want string
		ok   bool
	}{
		{"80", "80", true},
		{int64(80), "80", true},
		{float64(80), "80", true},
		{json.Number("80.0"), "80", true},
		{1.5, "1.5", true},
		{1e21, "1e+21", true},
		{true, "true", true},
		{nil, "", false},
		{map[string]any{}, "", false},
		{[]any{}, "", false},
	}
	for _, tc := range tests {
		got, ok := keyString(tc.in)
		if got != tc.want || ok != tc.ok {
			t.Errorf("keyString(%#v) = %q, %v; want %q, %v", tc.in, got, ok, tc.want, tc.ok)
		}
	}
}

func TestEqualJSONNumbers(t *testing.T) {
	tests := []struct {
		a, b any
		want bool
	}{
		{int64(1), float64(1), true},
		{int64(1), json.Number("1"), true},
		{json.Number("1.0"), int64(1), true},
		{int64(1), float64(1.5), false},
		{int64(1<<53 + 1), float64(1 << 53), false}, // float64(1<<53+1) rounds; must not compare equal
		{uint64(math.MaxUint64), float64(math.MaxUint64), true},
		{int64(1), "1", false},
		{map[string]any(nil), map[string]any{}, true},
		{nil, map[string]any{}, false},
	}
	for _, tc := range tests {
		if got := equalJSON(tc.a, tc.b); got != tc.want {
			t.Errorf("equalJSON(%#v, %#v) = %v, want %v", tc.a, tc.b, got, tc.want)
		}
		if got := equalJSON(tc.b, tc.a); got != tc.want {
			t.Errorf("equalJSON(%#v, %#v) = %v, want %v (reversed)", tc.b, tc.a, got, tc.want)
		}
	}
}

// Lists longer than smallList use maps instead of scans; both paths must agree.
func TestKeyIndexHelpersLargeAndSmall(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 5))
	for range 500 {
		keys := make([]string, r.IntN(3*smallList))
		for i := range keys {
			keys[i] = strconv.Itoa(r.IntN(len(keys) + 1))
		}
		x := newKeyIndex(keys)
		occ := occurrences(keys)
		distinct := true
		for i, k := range keys {
			n := 0
			for _, prev := range keys[:i] {
				if prev == k {
					n++
					distinct = false
				}
			}
			if occ[i] != n {
				t.Fatalf("occurrences(%v)[%d] = %d, want %d", keys, i, occ[i], n)
			}
			if got := x.nth(k, n); got != i {
				t.Fatalf("nth(%q, %d) over %v = %d, want %d", k, n, keys, got, i)
			}
		}
		if got := allDistinct(keys); got != distinct {
			t.Fatalf("allDistinct(%v) = %v, want %v", keys, got, distinct)
		}
		if got := x.nth("absent", 0); got != -1 {
			t.Fatalf("nth of an absent key = %d", got)
		}
	}
}

func TestMergeLargeListMap(t *testing.T) {
	const n = 3 * smallList
	item := func(name string, fields ...any) map[string]any {
		m := map[string]any{"name": name}
		for i := 0; i+1 < len(fields); i += 2 {
			m[fields[i].(string)] = fields[i+1]
		}
		return m
	}
	var observed, last, desired, want []any
	for i := range n {
		name := "n" + strconv.Itoa(i)
		observed = append(observed, item(name, "default", "d"))
		last = append(last, item(name))
		switch i {
		case 3: // removed by desired
		case 7:
			desired = append(desired, item(name, "v", "changed"))
			want = append(want, item(name, "default", "d", "v", "changed"))
		default:
			desired = append(desired, item(name))
			want = append(want, item(name, "default", "d"))
		}
	}
	observed = append(observed, item("sidecar"), item("n5", "dup", "theirs"))
	want = append(want, item("sidecar"), item("n5", "dup", "theirs"), item("new"))
	desired = append(desired, item("new"))

	got, err := Merge(map[string]any{"l": observed}, map[string]any{"l": last}, map[string]any{"l": desired})
	if err != nil {
		t.Fatal(err)
	}
	if g, w := normalize(t, got), normalize(t, map[string]any{"l": want}); !reflect.DeepEqual(g, w) {
		t.Errorf("got  %s\nwant %s", mustJSON(t, g), mustJSON(t, w))
	}
}
