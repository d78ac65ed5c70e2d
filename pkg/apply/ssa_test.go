package apply

import (
	"encoding/json"
	"testing"

	"github.com/google/go-cmp/cmp"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
)

func TestParseStrategy(t *testing.T) {
	cases := []struct {
		reason, in string
		want       Strategy
		wantErr    bool
	}{
		{reason: "unset is upstream's default", in: "", want: DynamicApply},
		{reason: "upstream's default by name", in: "dynamic-apply", want: DynamicApply},
		{reason: "upstream's server-side apply", in: "server-side-apply", want: ServerSideApply},
		{reason: "anything else is refused, not guessed", in: "ssa", wantErr: true},
	}
	for _, tc := range cases {
		t.Run(tc.reason, func(t *testing.T) {
			got, err := ParseStrategy(tc.in)
			if (err != nil) != tc.wantErr || got != tc.want {
				t.Errorf("ParseStrategy(%q) = %q, %v; want %q, error %v", tc.in, got, err, tc.want, tc.wantErr)
			}
		})
	}
}

func TestConfiguration(t *testing.T) {
	cases := []struct {
		reason, desired, want string
	}{
		{
			reason:  "the hook's object as it is",
			desired: `{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"a","labels":{"app":"x"}},"data":{"k":"v"}}`,
			want:    `{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"a","labels":{"app":"x"}},"data":{"k":"v"}}`,
		},
		{
			reason: "status, server-owned metadata and the last-applied annotation the hook echoed are left out, as upstream sanitizes",
			desired: `{"apiVersion":"v1","kind":"Pod","metadata":{"name":"a","uid":"u","resourceVersion":"7","generation":2,
				"creationTimestamp":"2024-01-01T00:00:00Z","managedFields":[{"manager":"x"}],
				"annotations":{"metacontroller.k8s.io/last-applied-configuration":"{}","keep":"me"}},
				"spec":{"x":1},"status":{"phase":"Running"}}`,
			want: `{"apiVersion":"v1","kind":"Pod","metadata":{"name":"a","annotations":{"keep":"me"}},"spec":{"x":1}}`,
		},
		{
			reason:  "an annotations map that only carried the echoed annotation goes, and nulls (absent) are not sent",
			desired: `{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"a","annotations":{"metacontroller.k8s.io/last-applied-configuration":"{}"}},"data":{"k":null,"j":"v"}}`,
			want:    `{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"a"},"data":{"j":"v"}}`,
		},
	}
	for _, tc := range cases {
		t.Run(tc.reason, func(t *testing.T) {
			desired := &unstructured.Unstructured{Object: hookJSON(t, tc.desired)}
			before := mustJSON(t, desired.Object)
			got, err := Configuration(desired)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(normalize(t, hookJSON(t, tc.want)), normalize(t, got.Object)); diff != "" {
				t.Errorf("configuration (-want +got):\n%s", diff)
			}
			if mustJSON(t, desired.Object) != before {
				t.Errorf("desired was modified")
			}
		})
	}
}

func TestSettled(t *testing.T) {
	// observed is a live ConfigMap-like object with server and other
	// writers' fields.
	const observed = `{"apiVersion":"v1","kind":"Pod","metadata":{"name":"a","namespace":"ns","uid":"u","resourceVersion":"9",
		"labels":{"app":"x","other":"y"},"ownerReferences":[{"apiVersion":"v1","kind":"Other","name":"o","uid":"o1"},
		{"apiVersion":"example.com/v1","kind":"Thing","name":"p","uid":"p1","controller":true,"blockOwnerDeletion":true}]},
		"spec":{"replicas":3,"dnsPolicy":"ClusterFirst","args":["a","b"],
		"containers":[{"name":"sidecar","image":"s"},{"name":"main","image":"m:1","imagePullPolicy":"IfNotPresent",
		"ports":[{"containerPort":80,"protocol":"TCP"}]}],"tolerations":[{"key":"k","operator":"Exists","effect":"NoSchedule"}]},
		"status":{"phase":"Running"}}`
	cases := []struct {
		reason string
		cfg    string
		want   bool
	}{
		{reason: "every value present: settled, whatever others and the server added",
			cfg: `{"apiVersion":"v1","kind":"Pod","metadata":{"name":"a","namespace":"ns","labels":{"app":"x"},
				"ownerReferences":[{"apiVersion":"example.com/v1","kind":"Thing","name":"p","uid":"p1","controller":true,"blockOwnerDeletion":true}]},
				"spec":{"replicas":3.0,"args":["a","b"],"containers":[{"name":"main","image":"m:1","ports":[{"containerPort":80}]}],
				"tolerations":[{"key":"k","operator":"Exists"}]}}`,
			want: true},
		{reason: "a changed scalar", cfg: `{"spec":{"replicas":4}}`},
		{reason: "a value of another type", cfg: `{"spec":{"replicas":"3"}}`},
		{reason: "a field the object lacks", cfg: `{"spec":{"hostNetwork":true}}`},
		{reason: "a changed item of an associative list", cfg: `{"spec":{"containers":[{"name":"main","image":"m:2"}]}}`},
		{reason: "an item the associative list lacks", cfg: `{"spec":{"containers":[{"name":"init","image":"i"}]}}`},
		{reason: "associative items in another order than observed: left to the API server",
			cfg: `{"spec":{"containers":[{"name":"main"},{"name":"sidecar"}]}}`},
		{reason: "an atomic list of another length", cfg: `{"spec":{"args":["a"]}}`},
		{reason: "a list of scalars in another order", cfg: `{"spec":{"args":["b","a"]}}`},
		{reason: "empty objects and lists, and nulls, set nothing", cfg: `{"spec":{"affinity":{},"volumes":[],"x":null}}`, want: true},
		{reason: "an object where observed has a scalar", cfg: `{"spec":{"replicas":{"a":1}}}`},
		{reason: "the controller reference of another parent", cfg: `{"metadata":{"ownerReferences":[{"uid":"p2","name":"p","kind":"Thing","apiVersion":"example.com/v1","controller":true}]}}`},
	}
	obs := apiJSON(t, observed)
	for _, tc := range cases {
		t.Run(tc.reason, func(t *testing.T) {
			if got := Settled(obs, hookJSON(t, tc.cfg)); got != tc.want {
				t.Errorf("Settled = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestChanges(t *testing.T) {
	const observed = `{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"a","uid":"u","resourceVersion":"9",
		"annotations":{"metacontroller.k8s.io/last-applied-configuration":"{}","x":"y"}},"data":{"k":"v"}}`
	cases := []struct {
		reason, dryRun string
		want           bool
	}{
		{reason: "only managedFields, resourceVersion and the annotation differ: a change of ownership is no change",
			dryRun: `{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"a","uid":"u","resourceVersion":"10",
				"managedFields":[{"manager":"metacontroller","operation":"Apply"}],"annotations":{"x":"y"}},"data":{"k":"v"}}`},
		{reason: "a value differs",
			dryRun: `{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"a","annotations":{"x":"y"}},"data":{"k":"w"}}`,
			want:   true},
		{reason: "a field the apply removes",
			dryRun: `{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"a","annotations":{"x":"y"}}}`,
			want:   true},
	}
	obs := apiJSON(t, observed)
	for _, tc := range cases {
		t.Run(tc.reason, func(t *testing.T) {
			before := mustJSON(t, obs)
			if got := Changes(obs, apiJSON(t, tc.dryRun)); got != tc.want {
				t.Errorf("Changes = %v, want %v", got, tc.want)
			}
			if mustJSON(t, obs) != before {
				t.Errorf("observed was modified")
			}
		})
	}
}

func TestEncode(t *testing.T) {
	cfg := &unstructured.Unstructured{Object: hookJSON(t, `{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"a"},"data":{"k":"v"}}`)}
	plain, h1, err := Encode(cfg, "", "")
	if err != nil {
		t.Fatal(err)
	}
	pre, h2, err := Encode(cfg, "u1", "42")
	if err != nil {
		t.Fatal(err)
	}
	if h1 != h2 {
		t.Errorf("the preconditions changed the hash: the same configuration must hash the same at every resourceVersion")
	}
	var body map[string]any
	if err := json.Unmarshal(pre, &body); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(map[string]any{"name": "a", "uid": "u1", "resourceVersion": "42"}, body["metadata"]); diff != "" {
		t.Errorf("preconditions (-want +got):\n%s", diff)
	}
	if _, ok := cfg.Object["metadata"].(map[string]any)["resourceVersion"]; ok {
		t.Errorf("Encode modified the configuration")
	}
	other := cfg.DeepCopy()
	other.Object["data"] = map[string]any{"k": "w"}
	if _, h3, _ := Encode(other, "", ""); h3 == h1 {
		t.Errorf("another configuration hashes the same")
	}
	if string(plain) != `{"apiVersion":"v1","data":{"k":"v"},"kind":"ConfigMap","metadata":{"name":"a"}}` {
		t.Errorf("body %s", plain)
	}
}

func TestAppliedCovers(t *testing.T) {
	obj := func(uid, rv string, gen int64) *unstructured.Unstructured {
		o := &unstructured.Unstructured{Object: map[string]any{}}
		o.SetUID(types.UID(uid))
		o.SetResourceVersion(rv)
		o.SetGeneration(gen)
		return o
	}
	withGen := Applied{UID: "u", Hash: 7, Generation: 2, ResourceVersion: "10"}
	noGen := Applied{UID: "u", Hash: 7, ResourceVersion: "10"}
	cases := []struct {
		reason   string
		applied  Applied
		observed *unstructured.Unstructured
		hash     uint64
		want     bool
	}{
		{"the same configuration at the same generation: a repeat", withGen, obj("u", "15", 2), 7, true},
		{"another configuration", withGen, obj("u", "10", 2), 8, false},
		{"the spec changed since (generation)", withGen, obj("u", "15", 3), 7, false},
		{"another object of the same name", withGen, obj("v", "10", 2), 7, false},
		{"without a generation, any write since counts", noGen, obj("u", "11", 0), 7, false},
		{"without a generation, the same resourceVersion", noGen, obj("u", "10", 0), 7, true},
		{"nothing remembered", Applied{}, obj("", "", 0), 0, false},
	}
	for _, tc := range cases {
		t.Run(tc.reason, func(t *testing.T) {
			if got := tc.applied.Covers(tc.observed, tc.hash); got != tc.want {
				t.Errorf("Covers = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestAppliedRepeats(t *testing.T) {
	obj := func(uid, rv string) *unstructured.Unstructured {
		o := &unstructured.Unstructured{Object: map[string]any{}}
		o.SetUID(types.UID(uid))
		o.SetResourceVersion(rv)
		o.SetGeneration(2)
		return o
	}
	applied := Applied{UID: "u", Hash: 7, Generation: 2, ResourceVersion: "10"}
	cases := []struct {
		reason   string
		observed *unstructured.Unstructured
		hash     uint64
		want     bool
	}{
		{"untouched since, the same configuration", obj("u", "10"), 7, true},
		{"any write since, even one that left the generation", obj("u", "11"), 7, false},
		{"another configuration", obj("u", "10"), 8, false},
		{"another object", obj("v", "10"), 7, false},
	}
	for _, tc := range cases {
		t.Run(tc.reason, func(t *testing.T) {
			if got := applied.Repeats(tc.observed, tc.hash); got != tc.want {
				t.Errorf("Repeats = %v, want %v", got, tc.want)
			}
		})
	}
}
