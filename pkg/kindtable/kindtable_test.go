package kindtable

import (
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"

	"github.com/metabus/metabus/pkg/api/v1alpha1"
	"github.com/metabus/metabus/pkg/bus"
)

// TestKindsDistinct: two kinds with the same name, resource or bus ID
// prefix would share subjects and work items.
func TestKindsDistinct(t *testing.T) {
	names, resources, prefixes := map[string]bool{}, map[string]bool{}, map[string]bool{}
	for _, k := range Kinds {
		p := bus.KindIDPrefix(k.Name)
		if names[k.Name] || resources[k.GVR.String()] || prefixes[p] {
			t.Errorf("kind %s (resource %s, ID prefix %q) collides with an earlier row", k.Name, k.GVR, p)
		}
		names[k.Name], resources[k.GVR.String()], prefixes[p] = true, true, true
		if k.Decode == nil || k.Finalizer == nil {
			t.Errorf("kind %s has no decoder or no finalizer name", k.Name)
		}
	}
}

func controllerObject(kind, name, uid, rv string, spec map[string]any) *unstructured.Unstructured {
	u := &unstructured.Unstructured{Object: map[string]any{"spec": spec}}
	u.SetAPIVersion(v1alpha1.GroupVersion.String())
	u.SetKind(kind)
	u.SetName(name)
	u.SetUID(typesUID(uid))
	u.SetResourceVersion(rv)
	return u
}

func TestDecode(t *testing.T) {
	spec := map[string]any{"parentResource": map[string]any{"apiVersion": "v1", "resource": "configmaps"}}
	for _, tc := range []struct {
		reason  string
		obj     *unstructured.Unstructured
		wantErr bool
	}{
		{"a composite controller", controllerObject(v1alpha1.CompositeControllerKind, "c", "u1", "1", spec), false},
		{"a decorator controller", controllerObject(v1alpha1.DecoratorControllerKind, "d", "u2", "1", map[string]any{}), false},
		{"an unknown kind is an error, not a panic", controllerObject("FooController", "f", "u3", "1", spec), true},
		{"a spec that does not decode is an error", controllerObject(v1alpha1.CompositeControllerKind, "bad", "u4", "1",
			map[string]any{"parentResource": "not an object"}), true},
	} {
		t.Run(tc.reason, func(t *testing.T) {
			c, err := Decode(tc.obj)
			if (err != nil) != tc.wantErr {
				t.Fatalf("Decode: err = %v, want error %v", err, tc.wantErr)
			}
			if err != nil {
				return
			}
			if got := c.Ref(); got.Kind != tc.obj.GetKind() || got.Name != tc.obj.GetName() || got.UID != string(tc.obj.GetUID()) {
				t.Errorf("Ref() = %+v, does not name %s %s", got, tc.obj.GetKind(), tc.obj.GetName())
			}
		})
	}
}

// TestDecodeShared: a version is decoded once; a new resourceVersion is
// decoded again.
func TestDecodeShared(t *testing.T) {
	spec := map[string]any{"parentResource": map[string]any{"apiVersion": "v1", "resource": "configmaps"}}
	a, err := Decode(controllerObject(v1alpha1.CompositeControllerKind, "s", "us", "5", spec))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := Decode(controllerObject(v1alpha1.CompositeControllerKind, "s", "us", "5", spec))
	if a != b {
		t.Error("the same version was decoded twice")
	}
	c, _ := Decode(controllerObject(v1alpha1.CompositeControllerKind, "s", "us", "6", spec))
	if c == a {
		t.Error("a new resourceVersion was served from the cache")
	}
}

func typesUID(s string) types.UID { return types.UID(s) }
