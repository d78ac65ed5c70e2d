package mapctl

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/validation"
)

func TestInputRefOf(t *testing.T) {
	cases := []struct {
		reason     string
		apiVersion string
		kind       string
		input      *unstructured.Unstructured
		want       InputRef
		wantErr    string
	}{
		{
			reason: "core group, namespaced", apiVersion: "v1", kind: "PersistentVolumeClaim",
			input: object("v1", "PersistentVolumeClaim", "ns", "data-0", "u-1"),
			want:  InputRef{Kind: "PersistentVolumeClaim", Namespace: "ns", Name: "data-0", UID: "u-1"},
		},
		{
			reason: "named group, cluster-scoped; the version is dropped", apiVersion: "storage.k8s.io/v1", kind: "StorageClass",
			input: object("storage.k8s.io/v1", "StorageClass", "", "fast", "u-2"),
			want:  InputRef{Group: "storage.k8s.io", Kind: "StorageClass", Name: "fast", UID: "u-2"},
		},
		{
			reason: "the resource's type wins over the object's (cache objects may lack it)", apiVersion: "v1", kind: "ConfigMap",
			input: object("", "", "ns", "c", "u-3"),
			want:  InputRef{Kind: "ConfigMap", Namespace: "ns", Name: "c", UID: "u-3"},
		},
		{reason: "no object", apiVersion: "v1", kind: "ConfigMap", wantErr: "no input object"},
		{reason: "bad apiVersion", apiVersion: "a/b/c", kind: "ConfigMap", input: object("v1", "ConfigMap", "ns", "c", "u"), wantErr: "apiVersion"},
		{reason: "no UID: a recreated input would inherit the old one's outputs", apiVersion: "v1", kind: "ConfigMap", input: object("v1", "ConfigMap", "ns", "c", ""), wantErr: "needs kind, name and UID"},
		{reason: "no kind", apiVersion: "v1", input: object("v1", "ConfigMap", "ns", "c", "u"), wantErr: "needs kind, name and UID"},
		{reason: "no name", apiVersion: "v1", kind: "ConfigMap", input: object("v1", "ConfigMap", "ns", "", "u"), wantErr: "needs kind, name and UID"},
	}
	for _, c := range cases {
		t.Run(c.reason, func(t *testing.T) {
			got, err := InputRefOf(c.apiVersion, c.kind, c.input)
			if c.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), c.wantErr) {
					t.Fatalf("error %v, want one containing %q", err, c.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(c.want, got); diff != "" {
				t.Errorf("ref (-want +got):\n%s", diff)
			}
		})
	}
}

func TestKey(t *testing.T) {
	pvc := InputRef{Kind: "PersistentVolumeClaim", Namespace: "ns", Name: "data-0", UID: "0b5c6a36-7f1e-4a8e-9a57-3f4c1c2d9e10"}
	long := InputRef{Group: strings.Repeat("g", 200) + ".example.com", Kind: strings.Repeat("K", 100),
		Namespace: strings.Repeat("n", 63), Name: strings.Repeat("x.", 120) + "y", UID: "u"}
	other := func(mod func(*InputRef)) InputRef { r := pvc; mod(&r); return r }

	t.Run("the encoding is frozen: a change would detach every output", func(t *testing.T) {
		// SHA-256 of ["","PersistentVolumeClaim","ns","data-0","0b5c6a36-..."] in lower-case
		// base32, computed apart from this code (Python hashlib and base64).
		const want = "rlfj2f62gd7v2hlgr34hij3jcryl4hsj3iqprdeckkb5g2sk5jpq"
		if diff := cmp.Diff(want, pvc.Key()); diff != "" {
			t.Errorf("key (-want +got):\n%s", diff)
		}
	})

	for _, c := range []struct {
		reason string
		ref    InputRef
	}{
		{reason: "an ordinary input", ref: pvc},
		{reason: "identities far beyond 63 characters, with dots", ref: long},
		{reason: "the zero ref", ref: InputRef{}},
	} {
		t.Run("fits a label value and a subject token: "+c.reason, func(t *testing.T) {
			k := c.ref.Key()
			if errs := validation.IsValidLabelValue(k); len(errs) > 0 {
				t.Errorf("key %q is not a label value: %v", k, errs)
			}
			if strings.ContainsAny(k, ".*> \t\r\n") || k == "" {
				t.Errorf("key %q is not a NATS subject token", k)
			}
			if diff := cmp.Diff(KeyLength, len(k)); diff != "" {
				t.Errorf("length (-want +got):\n%s", diff)
			}
			if !ValidKey(k) {
				t.Errorf("ValidKey(%q) is false", k)
			}
		})
	}

	distinct := []struct {
		reason string
		a, b   InputRef
	}{
		{reason: "a recreated input (new UID) is a new input", a: pvc, b: other(func(r *InputRef) { r.UID = "another" })},
		{reason: "another namespace", a: pvc, b: other(func(r *InputRef) { r.Namespace = "ns2" })},
		{reason: "another kind of the same name", a: pvc, b: other(func(r *InputRef) { r.Kind = "ConfigMap" })},
		{reason: "another group", a: pvc, b: other(func(r *InputRef) { r.Group = "example.com" })},
		{
			reason: "fields cannot bleed into each other",
			a:      InputRef{Kind: "K", Namespace: "a", Name: "b/c", UID: "u"},
			b:      InputRef{Kind: "K", Namespace: "a/b", Name: "c", UID: "u"},
		},
	}
	for _, c := range distinct {
		t.Run("distinct: "+c.reason, func(t *testing.T) {
			if c.a.Key() == c.b.Key() {
				t.Errorf("%+v and %+v share key %s", c.a, c.b, c.a.Key())
			}
		})
	}

	t.Run("stable: the same input through another API version has the same key", func(t *testing.T) {
		in := object("example.com/v1", "Thing", "ns", "t", "u-1")
		a, errA := InputRefOf("example.com/v1", "Thing", in)
		b, errB := InputRefOf("example.com/v1beta1", "Thing", in)
		if errA != nil || errB != nil {
			t.Fatal(errA, errB)
		}
		if diff := cmp.Diff(a.Key(), b.Key()); diff != "" {
			t.Errorf("keys (-v1 +v1beta1):\n%s", diff)
		}
	})
}

func TestInputAnnotation(t *testing.T) {
	cases := []struct {
		reason string
		ref    InputRef
		want   string
	}{
		{reason: "core group: empty first segment", ref: InputRef{Kind: "PersistentVolumeClaim", Namespace: "ns", Name: "data-0", UID: "u-1"}, want: "/PersistentVolumeClaim/ns/data-0/u-1"},
		{reason: "cluster-scoped: empty namespace", ref: InputRef{Group: "storage.k8s.io", Kind: "StorageClass", Name: "fast", UID: "u-2"}, want: "storage.k8s.io/StorageClass//fast/u-2"},
	}
	for _, c := range cases {
		t.Run(c.reason, func(t *testing.T) {
			got := c.ref.Annotation()
			if diff := cmp.Diff(c.want, got); diff != "" {
				t.Errorf("annotation (-want +got):\n%s", diff)
			}
			back, err := ParseInputAnnotation(got)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(c.ref, back); diff != "" {
				t.Errorf("round trip (-want +got):\n%s", diff)
			}
		})
	}
}

func TestParseInputAnnotationErrors(t *testing.T) {
	cases := []struct {
		reason, value, wantErr string
	}{
		{reason: "empty", value: "", wantErr: "want group/kind/namespace/name/uid"},
		{reason: "too few segments", value: "/ConfigMap/ns/c", wantErr: "want group/kind/namespace/name/uid"},
		{reason: "too many segments", value: "/ConfigMap/ns/c/u/x", wantErr: "want group/kind/namespace/name/uid"},
		{reason: "no uid", value: "/ConfigMap/ns/c/", wantErr: "kind, name and uid are required"},
		{reason: "no kind", value: "//ns/c/u", wantErr: "kind, name and uid are required"},
	}
	for _, c := range cases {
		t.Run(c.reason, func(t *testing.T) {
			_, err := ParseInputAnnotation(c.value)
			if err == nil || !strings.Contains(err.Error(), c.wantErr) {
				t.Errorf("error %v, want one containing %q", err, c.wantErr)
			}
		})
	}
}

func TestKeyOf(t *testing.T) {
	key := InputRef{Kind: "ConfigMap", Namespace: "ns", Name: "c", UID: "u"}.Key()
	cases := []struct {
		reason  string
		output  *unstructured.Unstructured
		wantKey string
		wantOK  bool
	}{
		{reason: "tagged", output: object("v1", "ConfigMap", "ns", "o", "", withKey(key)), wantKey: key, wantOK: true},
		{reason: "no labels", output: object("v1", "ConfigMap", "ns", "o", "")},
		{reason: "other labels only", output: object("v1", "ConfigMap", "ns", "o", "", withLabels(map[string]string{"a": "b"}))},
		{reason: "a hand-edited value is no key", output: object("v1", "ConfigMap", "ns", "o", "", withKey("mine")), wantKey: "mine"},
		{reason: "upper case is not the encoding", output: object("v1", "ConfigMap", "ns", "o", "", withKey(strings.ToUpper(key))), wantKey: strings.ToUpper(key)},
		{reason: "labels of the wrong JSON type do not panic", output: object("v1", "ConfigMap", "ns", "o", "", withField("x", "metadata", "labels"))},
		{reason: "nil output", output: nil},
	}
	for _, c := range cases {
		t.Run(c.reason, func(t *testing.T) {
			k, ok := KeyOf(c.output)
			if diff := cmp.Diff([]any{c.wantKey, c.wantOK}, []any{k, ok}); diff != "" {
				t.Errorf("KeyOf (-want +got):\n%s", diff)
			}
		})
	}
}
