package informers

import (
	"slices"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// Interest says which events of a resource a subscriber can act on, so the
// registry hands it only those instead of every event: with 1,000
// controllers owning ConfigMaps, one ConfigMap event otherwise ran 1,000
// handlers that each found it was none of their business.
//
// An event concerns a subscriber when the object, before or after the
// event, matches it: before and after both count so that a change of
// controller or of attachment reaches the old owner and the new one.
type Interest struct {
	// OwnerKinds are the group/kinds of controllers whose objects concern
	// the subscriber: an object whose controller ownerReference (the one
	// with controller: true) names one of them matches.
	OwnerKinds []schema.GroupKind
	// Attachment, if set, narrows OwnerKinds to the objects that also
	// carry this annotation with this value (a DecoratorController's
	// attachments, marked with its name).
	Attachment *Attachment
	// Orphans: an object with no controller ownerReference after the
	// event (or, for a delete, when it was deleted) matches, whatever
	// OwnerKinds say (a controller that adopts orphans).
	Orphans bool
}

// Attachment is an annotation and the value that marks an object as a
// subscriber's.
type Attachment struct {
	Annotation string
	Value      string
}

// attachKey indexes subscribers by their controller kind and attachment.
type attachKey struct {
	gk         schema.GroupKind
	annotation string
	value      string
}

// routes is the index from an event to the subscribers (by position in the
// subscriber list it was built from) it concerns. It is built once per
// change of subscribers and read without locks (copy on write).
type routes struct {
	// all are subscribers without an Interest: they get every event.
	all      []int
	byOwner  map[schema.GroupKind][]int
	byAttach map[attachKey][]int
	// annotations are the distinct Attachment annotations, to look up.
	annotations []string
	orphans     []int
}

// buildRoutes indexes interests (nil: every event) by position.
func buildRoutes(interests []*Interest) *routes {
	r := &routes{byOwner: map[schema.GroupKind][]int{}, byAttach: map[attachKey][]int{}}
	for i, in := range interests {
		if in == nil {
			r.all = append(r.all, i)
			continue
		}
		if in.Orphans {
			r.orphans = append(r.orphans, i)
		}
		for _, gk := range in.OwnerKinds {
			if in.Attachment == nil {
				r.byOwner[gk] = appendOnce(r.byOwner[gk], i)
				continue
			}
			k := attachKey{gk: gk, annotation: in.Attachment.Annotation, value: in.Attachment.Value}
			r.byAttach[k] = appendOnce(r.byAttach[k], i)
			if !slices.Contains(r.annotations, k.annotation) {
				r.annotations = append(r.annotations, k.annotation)
			}
		}
	}
	return r
}

func appendOnce(s []int, i int) []int {
	if len(s) > 0 && s[len(s)-1] == i {
		return s
	}
	return append(s, i)
}

// receivers returns, in ascending order and once each, the positions of
// the subscribers an event concerns. old is the object before an update
// (nil for an add or a delete), cur the object after it (for a delete, its
// last known state). Its cost depends on the subscribers the event
// concerns, not on how many there are.
func (r *routes) receivers(old, cur metav1.Object) []int {
	out := slices.Clone(r.all)
	for _, o := range [...]metav1.Object{old, cur} {
		if o == nil {
			continue
		}
		ref := metav1.GetControllerOfNoCopy(o)
		if ref == nil {
			continue
		}
		gv, err := schema.ParseGroupVersion(ref.APIVersion)
		if err != nil {
			// No subscriber can match an unparseable owner: the watcher
			// finds no parent for it either.
			continue
		}
		gk := schema.GroupKind{Group: gv.Group, Kind: ref.Kind}
		out = append(out, r.byOwner[gk]...)
		if len(r.byAttach) == 0 {
			continue
		}
		ann := o.GetAnnotations()
		for _, a := range r.annotations {
			if v, ok := ann[a]; ok {
				out = append(out, r.byAttach[attachKey{gk: gk, annotation: a, value: v}]...)
			}
		}
	}
	if cur != nil && metav1.GetControllerOfNoCopy(cur) == nil {
		out = append(out, r.orphans...)
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// Matches reports whether an event concerns a subscriber with this
// interest (nil: every event): old is the object before an update (nil
// otherwise), cur the object after it or, for a delete, its last state.
func (in *Interest) Matches(old, cur metav1.Object) bool {
	return len(buildRoutes([]*Interest{in}).receivers(old, cur)) > 0
}
