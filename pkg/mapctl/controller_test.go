package mapctl

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/metabus/metabus/pkg/bus"
)

// newController decodes a controller object of spec (see validSpec) as
// the kind table would.
func newController(t *testing.T, spec map[string]any) *Controller {
	t.Helper()
	kc, err := New(controllerObject(spec))
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	return kc.(*Controller)
}

// specWith is validSpec changed by mod.
func specWith(mod func(spec map[string]any)) map[string]any {
	s := validSpec()
	mod(s)
	return s
}

func errText(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

func TestNew(t *testing.T) {
	type result struct {
		Ref           bus.ControllerRef
		FinalizerName string
		Finalizer     string
		Resync        *int32
		SameObject    bool
		Err           string
	}
	five := int32(5)
	cases := []struct {
		reason string
		obj    *unstructured.Unstructured
		want   result
	}{
		{
			reason: "a valid controller: named on the bus as a MapController, no finalizer, its resync period",
			obj:    controllerObject(validSpec()),
			want:   result{Ref: bus.ControllerRef{Kind: "MapController", Name: "snap", UID: "c-1"}, Resync: &five, SameObject: true},
		},
		{
			reason: "no resync period: none",
			obj:    controllerObject(specWith(func(s map[string]any) { delete(s, "resyncPeriodSeconds") })),
			want:   result{Ref: bus.ControllerRef{Kind: "MapController", Name: "snap", UID: "c-1"}, SameObject: true},
		},
		{
			reason: "an invalid spec cannot be served: decoding fails",
			obj:    controllerObject(specWith(func(s map[string]any) { delete(s, "hooks") })),
			want:   result{Err: "MapController snap: invalid spec: spec.hooks.map is required"},
		},
		{
			reason: "no object",
			want:   result{Err: "no MapController object"},
		},
	}
	for _, c := range cases {
		t.Run(c.reason, func(t *testing.T) {
			kc, err := New(c.obj)
			got := result{Err: errText(err)}
			if err == nil {
				got.Ref = kc.Ref()
				got.FinalizerName = kc.FinalizerName()
				got.Finalizer = kc.Finalizer()
				got.Resync = kc.ResyncPeriodSeconds()
				got.SameObject = kc.Object() == c.obj
			} else if kc != nil {
				t.Errorf("New returned %v with its error", kc)
			}
			if diff := cmp.Diff(c.want, got); diff != "" {
				t.Errorf("controller (-want +got):\n%s", diff)
			}
		})
	}
}
