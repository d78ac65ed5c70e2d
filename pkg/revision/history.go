package revision

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/metabus/metabus/pkg/api/v1alpha1"
)

// ChildRef names a child in a revision: its API group (no version), kind and name. Children
// live in the parent's namespace, like the parent's revisions.
type ChildRef struct {
	APIGroup, Kind, Name string
}

// RefOf returns the ChildRef of a child with the given apiVersion ("apps/v1", or "v1" for core).
func RefOf(apiVersion, kind, name string) ChildRef {
	group, _, found := strings.Cut(apiVersion, "/")
	if !found {
		group = ""
	}
	return ChildRef{APIGroup: group, Kind: kind, Name: name}
}

func (c ChildRef) String() string {
	if c.APIGroup == "" {
		return c.Kind + " " + c.Name
	}
	return c.Kind + "." + c.APIGroup + " " + c.Name
}

// Parent describes the parent whose revisions a History keeps; the metadata fields only shape
// the revisions the History creates.
type Parent struct {
	Resource string // plural resource name, e.g. "catsets"
	Group    string // API group, "" for core
	UID      string
	// Namespace, Labels (see the Labels function) and OwnerReferences (normally the
	// controller reference to the parent) are put on created revisions.
	Namespace       string
	Labels          map[string]string
	OwnerReferences []metav1.OwnerReference
}

// Revision is a live revision of the parent.
type Revision struct {
	Name   string
	Patch  map[string]any // the parent patch; callers must not modify it
	Latest bool
}

// History is the set of revisions of one parent and which children belong to which, as loaded
// from the parent's ControllerRevisions and then edited by a sync. It is not safe for
// concurrent use.
type History struct {
	parent   Parent
	latest   string
	live     map[string]*entry                      // by name
	owner    map[ChildRef]string                    // child → revision; unlisted children belong to the latest
	existing map[string]v1alpha1.ControllerRevision // as given to NewHistory, to diff against
}

type entry struct {
	patch map[string]any
	obj   v1alpha1.ControllerRevision // the object to create, for a new revision
}

// NewHistory loads the history of a parent from the ControllerRevisions it owns (adoption is
// the caller's business) and the parent's current patch (ParentPatch). Neither input is
// modified.
//
// The latest revision is the one whose patch equals the current patch (as canonical JSON); it
// is created when there is none. Revisions are matched by patch rather than by name because
// revisions adopted from a deleted parent carry that parent's UID in their names. Revisions
// sharing a patch are merged into one (the latest keeps its conventional Name when present,
// otherwise the lowest name wins) and the others are deleted: they would render the same
// children. A child listed in several revisions, as a crash between the writes of a move can
// leave it, belongs to the latest when that is one of them, otherwise to the lowest name.
//
// It fails when a stored parentPatch is not a JSON object: guessing would silently roll out or
// roll back the children of that revision.
func NewHistory(parent Parent, existing []v1alpha1.ControllerRevision, current map[string]any) (*History, error) {
	canonical, err := canonicalJSON(current)
	if err != nil {
		return nil, err
	}
	if parent.Resource == "" {
		return nil, fmt.Errorf("revision: empty parent resource")
	}
	h := &History{
		parent:   parent,
		latest:   nameFor(parent.Resource, parent.Group, parent.UID, canonical),
		live:     map[string]*entry{},
		owner:    map[ChildRef]string{},
		existing: make(map[string]v1alpha1.ControllerRevision, len(existing)),
	}

	// Decode, then group by patch: the first name of each group (sorted) keeps it, except that
	// the conventional name of the latest revision is preferred.
	sorted := slices.SortedFunc(slices.Values(existing), func(a, b v1alpha1.ControllerRevision) int {
		return cmp.Compare(a.Name, b.Name)
	})
	keeper := map[string]string{}  // canonical patch → name of the revision kept for it
	patchOf := map[string]string{} // revision name → canonical patch
	for _, r := range sorted {
		patch, c, err := decodePatch(r.ParentPatch)
		if err != nil {
			return nil, fmt.Errorf("revision: ControllerRevision %s: parentPatch: %w", r.Name, err)
		}
		if r.Name == h.latest && string(c) != string(canonical) {
			return nil, fmt.Errorf("revision: ControllerRevision %s has another parentPatch than its name says", r.Name)
		}
		h.existing[r.Name] = r
		key := string(c)
		k, seen := keeper[key]
		if !seen || r.Name == h.latest {
			if seen {
				delete(h.live, k)
			}
			k = r.Name
			keeper[key] = k
			h.live[k] = &entry{patch: patch}
		}
		patchOf[r.Name] = key
	}
	if k, ok := keeper[string(canonical)]; ok {
		h.latest = k
	} else {
		h.live[h.latest] = &entry{patch: cloneMap(current), obj: v1alpha1.ControllerRevision{
			TypeMeta: metav1.TypeMeta{APIVersion: v1alpha1.GroupVersion.String(), Kind: v1alpha1.ControllerRevisionKind},
			ObjectMeta: metav1.ObjectMeta{
				Name:            h.latest,
				Namespace:       parent.Namespace,
				Labels:          maps.Clone(parent.Labels),
				OwnerReferences: slices.Clone(parent.OwnerReferences),
			},
			ParentPatch: canonical,
		}}
	}

	for _, r := range sorted {
		to := keeper[patchOf[r.Name]]
		for _, group := range r.Children {
			for _, name := range group.Names {
				ref := ChildRef{APIGroup: group.APIGroup, Kind: group.Kind, Name: name}
				if _, taken := h.owner[ref]; !taken || to == h.latest {
					h.owner[ref] = to
				}
			}
		}
	}
	return h, nil
}

// Latest returns the name of the revision for the parent's current patch.
func (h *History) Latest() string { return h.latest }

// Revisions returns the latest revision and every other revision that holds children (the ones
// whose desired state the sync hook must be asked for), latest first, then by name.
func (h *History) Revisions() []Revision {
	out := []Revision{{Name: h.latest, Patch: h.live[h.latest].patch, Latest: true}}
	for _, name := range slices.Sorted(maps.Keys(h.holding())) {
		if name != h.latest {
			out = append(out, Revision{Name: name, Patch: h.live[name].patch})
		}
	}
	return out
}

// holding returns the names of the revisions that hold at least one child.
func (h *History) holding() map[string]bool {
	names := map[string]bool{}
	for _, r := range h.owner {
		names[r] = true
	}
	return names
}

// RevisionOf returns the revision a child belongs to. A child listed in no revision is new and
// belongs to the latest.
func (h *History) RevisionOf(apiGroup, kind, name string) string {
	if r, ok := h.owner[ChildRef{APIGroup: apiGroup, Kind: kind, Name: name}]; ok {
		return r
	}
	return h.latest
}

// Track records the children the latest revision desires (the rolling ones only: children of
// other update methods always take the latest desired state and are not tracked). A child
// listed in no revision is recorded on the latest; a child no longer desired is forgotten,
// so if it comes back it is new and starts at the latest revision.
func (h *History) Track(desired []ChildRef) {
	want := make(map[ChildRef]bool, len(desired))
	for _, c := range desired {
		want[c] = true
		if _, ok := h.owner[c]; !ok {
			h.owner[c] = h.latest
		}
	}
	for c := range h.owner {
		if !want[c] {
			delete(h.owner, c)
		}
	}
}

// Move records that child now belongs to the revision named to (normally the latest): it
// leaves its old revision's children and joins the new one's.
func (h *History) Move(child ChildRef, to string) error {
	if _, ok := h.live[to]; !ok {
		return fmt.Errorf("revision: move %s: no revision %q", child, to)
	}
	h.owner[child] = to
	return nil
}

// Prune drops the revisions that hold no children, except the latest: no rollback history is
// kept, as upstream.
func (h *History) Prune() {
	holding := h.holding()
	for name := range h.live {
		if name != h.latest && !holding[name] {
			delete(h.live, name)
		}
	}
}

// Changes returns the writes that persist the history: revisions to create, to update
// (children changed; metadata, including resourceVersion, is kept from the loaded object for
// optimistic concurrency) and to delete. Children are grouped by API group and kind, sorted.
//
// Write creates first, then updates in the order given (the latest first), then deletes: a
// move then reaches its new revision before it leaves the old one, so a crash in between
// leaves the child in both, which NewHistory resolves in favour of the latest.
//
// Changes is idempotent: a History loaded from the persisted result, with the same current
// patch, has no changes. A revision whose children are equal as sets is not rewritten.
func (h *History) Changes() (creates, updates, deletes []v1alpha1.ControllerRevision) {
	lists := map[string]map[[2]string][]string{}
	for c, r := range h.owner {
		if lists[r] == nil {
			lists[r] = map[[2]string][]string{}
		}
		gk := [2]string{c.APIGroup, c.Kind}
		lists[r][gk] = append(lists[r][gk], c.Name)
	}
	for _, name := range slices.Sorted(maps.Keys(h.live)) {
		want := childrenList(lists[name])
		old, existed := h.existing[name]
		switch {
		case !existed:
			obj := h.live[name].obj
			obj.ObjectMeta = *obj.ObjectMeta.DeepCopy()
			obj.ParentPatch = slices.Clone(obj.ParentPatch)
			obj.Children = want
			creates = append(creates, obj)
		case !slices.EqualFunc(normalize(old.Children), want, equalChildren):
			obj := old
			obj.ObjectMeta = *old.ObjectMeta.DeepCopy()
			obj.ParentPatch = slices.Clone(old.ParentPatch)
			obj.Children = want
			updates = append(updates, obj)
		}
	}
	slices.SortStableFunc(updates, func(a, b v1alpha1.ControllerRevision) int {
		return cmp.Compare(rank(a.Name != h.latest), rank(b.Name != h.latest))
	})
	for _, name := range slices.Sorted(maps.Keys(h.existing)) {
		if _, ok := h.live[name]; !ok {
			old := h.existing[name]
			old.ObjectMeta = *old.ObjectMeta.DeepCopy()
			deletes = append(deletes, old)
		}
	}
	return creates, updates, deletes
}

func rank(b bool) int {
	if b {
		return 1
	}
	return 0
}

// normalize turns stored children into the form Changes writes: one entry per group and kind,
// names deduplicated and sorted, empty entries dropped.
func normalize(stored []v1alpha1.ControllerRevisionChildren) []v1alpha1.ControllerRevisionChildren {
	byGK := map[[2]string][]string{}
	for _, g := range stored {
		gk := [2]string{g.APIGroup, g.Kind}
		byGK[gk] = append(byGK[gk], g.Names...)
	}
	return childrenList(byGK)
}

func childrenList(byGK map[[2]string][]string) []v1alpha1.ControllerRevisionChildren {
	var out []v1alpha1.ControllerRevisionChildren
	for _, gk := range slices.SortedFunc(maps.Keys(byGK), func(a, b [2]string) int {
		return cmp.Or(cmp.Compare(a[0], b[0]), cmp.Compare(a[1], b[1]))
	}) {
		names := slices.Compact(slices.Sorted(slices.Values(byGK[gk])))
		if len(names) > 0 {
			out = append(out, v1alpha1.ControllerRevisionChildren{APIGroup: gk[0], Kind: gk[1], Names: names})
		}
	}
	return out
}

func equalChildren(a, b v1alpha1.ControllerRevisionChildren) bool {
	return a.APIGroup == b.APIGroup && a.Kind == b.Kind && slices.Equal(a.Names, b.Names)
}

func cloneMap(m map[string]any) map[string]any {
	out, _ := deepCopy(m).(map[string]any)
	if out == nil {
		out = map[string]any{}
	}
	return out
}
