package informers

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// child is a ConfigMap controlled by an object of kind (apiVersion
// apiVersion) when kind is set, with the given annotations.
func child(apiVersion, kind string, ann map[string]string) *unstructured.Unstructured {
	u := &unstructured.Unstructured{}
	u.SetAPIVersion("v1")
	u.SetKind("ConfigMap")
	u.SetNamespace("ns")
	u.SetName("c")
	if kind != "" {
		yes := true
		u.SetOwnerReferences([]metav1.OwnerReference{
			{APIVersion: "v1", Kind: "Node", Name: "n", UID: "not-controller"},
			{APIVersion: apiVersion, Kind: kind, Name: "p", UID: "p-uid", Controller: &yes},
		})
	}
	u.SetAnnotations(ann)
	return u
}

func TestRoutesReceivers(t *testing.T) {
	gk := func(g, k string) schema.GroupKind { return schema.GroupKind{Group: g, Kind: k} }
	bench, other, apps := gk("ex.io", "Bench"), gk("ex.io", "Other"), gk("apps", "Deployment")
	const ann = "metacontroller.k8s.io/decorator-controller"
	// The registered subscribers, by position.
	interests := []*Interest{
		0: {OwnerKinds: []schema.GroupKind{bench}, Orphans: true}, // composite of Bench, adopts
		1: {OwnerKinds: []schema.GroupKind{bench}},                // composite of Bench (or a map controller's outputs)
		2: {OwnerKinds: []schema.GroupKind{other}, Orphans: true}, // composite of Other, adopts
		3: {OwnerKinds: []schema.GroupKind{bench, other}, Attachment: &Attachment{Annotation: ann, Value: "d1"}},
		4: {OwnerKinds: []schema.GroupKind{bench}, Attachment: &Attachment{Annotation: ann, Value: "d2"}},
		5: nil, // no interest given: every event
		6: {OwnerKinds: []schema.GroupKind{apps}},
	}
	for _, tc := range []struct {
		name   string
		reason string
		old    *unstructured.Unstructured
		cur    *unstructured.Unstructured
		want   []int
	}{{
		name:   "owned by K",
		reason: "a child of a Bench concerns the Bench controllers only (and the catch-all), adopters included",
		cur:    child("ex.io/v1", "Bench", nil),
		want:   []int{0, 1, 5},
	}, {
		name:   "owner version ignored",
		reason: "the owner's group and kind decide, whatever version the reference names",
		cur:    child("ex.io/v2beta1", "Bench", nil),
		want:   []int{0, 1, 5},
	}, {
		name:   "ownership changed K1 to K2",
		reason: "the old owner must hear that it lost the child and the new one that it has it",
		old:    child("ex.io/v1", "Bench", nil),
		cur:    child("ex.io/v1", "Other", nil),
		want:   []int{0, 1, 2, 5},
	}, {
		name:   "released to an orphan",
		reason: "the old owner's controllers hear of the release and the adopters of an orphan",
		old:    child("ex.io/v1", "Bench", nil),
		cur:    child("", "", nil),
		want:   []int{0, 1, 2, 5},
	}, {
		name:   "orphan",
		reason: "an object with no controller concerns every controller that adopts",
		cur:    child("", "", nil),
		want:   []int{0, 2, 5},
	}, {
		name:   "orphan adopted",
		reason: "adopted by an Other, it concerns the Other controllers; a Bench adopter did nothing with it (its owner is no Bench, it is no orphan)",
		old:    child("", "", nil),
		cur:    child("ex.io/v1", "Other", nil),
		want:   []int{2, 5},
	}, {
		name:   "owner kind nobody has",
		reason: "an object controlled by a kind no subscriber names is offered to nobody (it is no orphan)",
		cur:    child("ex.io/v1", "Stranger", nil),
		want:   []int{5},
	}, {
		name:   "owner in the core group",
		reason: "an empty group is a group like any other",
		cur:    child("v1", "Bench", nil),
		want:   []int{5},
	}, {
		name:   "unparseable owner apiVersion",
		reason: "no kind can be read from it, so only the catch-all gets it",
		cur:    child("a/b/c", "Bench", nil),
		want:   []int{5},
	}, {
		name:   "decorator attachment",
		reason: "an attachment of d1 to a Bench reaches d1 and the Bench controllers, not d2",
		cur:    child("ex.io/v1", "Bench", map[string]string{ann: "d1"}),
		want:   []int{0, 1, 3, 5},
	}, {
		name:   "attachment of another kind's target",
		reason: "d1 decorates Others too, d2 does not",
		cur:    child("ex.io/v1", "Other", map[string]string{ann: "d1"}),
		want:   []int{2, 3, 5},
	}, {
		name:   "attachment moved d1 to d2",
		reason: "both decorators hear of it",
		old:    child("ex.io/v1", "Bench", map[string]string{ann: "d1"}),
		cur:    child("ex.io/v1", "Bench", map[string]string{ann: "d2"}),
		want:   []int{0, 1, 3, 4, 5},
	}, {
		name:   "annotation without a controller",
		reason: "an attachment is marked and controlled: the mark alone concerns no decorator",
		cur:    child("", "", map[string]string{ann: "d1"}),
		want:   []int{0, 2, 5},
	}, {
		name:   "deletion",
		reason: "a delete carries the last state only, routed like an add",
		cur:    child("apps/v1", "Deployment", nil),
		want:   []int{5, 6},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			var old, cur metav1.Object
			if tc.old != nil {
				old = tc.old
			}
			if tc.cur != nil {
				cur = tc.cur
			}
			got := buildRoutes(interests).receivers(old, cur)
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("%s\nreceivers (-want +got):\n%s", tc.reason, diff)
			}
		})
	}
}

func TestRoutesNoSubscribers(t *testing.T) {
	if got := buildRoutes(nil).receivers(nil, child("", "", nil)); len(got) != 0 {
		t.Errorf("no subscribers, got receivers %v", got)
	}
}
