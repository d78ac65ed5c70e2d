package revision

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/metabus/metabus/pkg/api/v1alpha1"
)

var testParent = Parent{
	Resource: "catsets", Group: "ctl.example.com", UID: "uid-1", Namespace: "ns",
	Labels:          map[string]string{"app": "web", LabelResource: "catsets"},
	OwnerReferences: []metav1.OwnerReference{{APIVersion: "ctl.example.com/v1", Kind: "CatSet", Name: "web", UID: "uid-1"}},
}

// tmpl is the parent patch of template image img.
func tmpl(img string) map[string]any {
	return map[string]any{"spec": map[string]any{"template": map[string]any{"image": img}}}
}

// conv is the conventional revision name for image img (see alias).
func conv(t testing.TB, img string) string {
	t.Helper()
	n, err := Name(testParent.Resource, testParent.Group, testParent.UID, tmpl(img))
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// alias turns conventional names back into the image they stand for, for readable expectations.
func alias(t testing.TB, name string) string {
	for _, img := range []string{"v1", "v2", "v3"} {
		if name == conv(t, img) {
			return img
		}
	}
	return name
}

// rev builds a stored revision. name "" means the conventional name of img; children are
// "Kind/name" (core) or "group/Kind/name".
func rev(t testing.TB, name, img string, children ...string) v1alpha1.ControllerRevision {
	if name == "" {
		name = conv(t, img)
	}
	r := v1alpha1.ControllerRevision{
		ObjectMeta:  metav1.ObjectMeta{Name: name, Namespace: "ns", ResourceVersion: "7"},
		ParentPatch: []byte(encode(t, tmpl(img))),
	}
	for _, c := range children {
		ref := parseRef(c)
		r.Children = append(r.Children, v1alpha1.ControllerRevisionChildren{APIGroup: ref.APIGroup, Kind: ref.Kind, Names: []string{ref.Name}})
	}
	return r
}

func parseRef(s string) ChildRef {
	parts := strings.Split(s, "/")
	if len(parts) == 2 {
		return ChildRef{Kind: parts[0], Name: parts[1]}
	}
	return ChildRef{APIGroup: parts[0], Kind: parts[1], Name: parts[2]}
}

func refs(ss ...string) []ChildRef {
	out := make([]ChildRef, len(ss))
	for i, s := range ss {
		out[i] = parseRef(s)
	}
	return out
}

// summarize renders revisions as "alias group/Kind:name,name ..." in the order given.
func summarize(t testing.TB, revs []v1alpha1.ControllerRevision) []string {
	var out []string
	for _, r := range revs {
		s := alias(t, r.Name)
		for _, c := range r.Children {
			s += fmt.Sprintf(" %s:%s", strings.TrimPrefix(c.APIGroup+"/"+c.Kind, "/"), strings.Join(c.Names, ","))
		}
		out = append(out, s)
	}
	return out
}

// persist returns the stored revisions after writing the changes.
func persist(existing, create, update, del []v1alpha1.ControllerRevision) []v1alpha1.ControllerRevision {
	byName := map[string]v1alpha1.ControllerRevision{}
	for _, set := range [][]v1alpha1.ControllerRevision{existing, create, update} {
		for _, r := range set {
			byName[r.Name] = r
		}
	}
	for _, r := range del {
		delete(byName, r.Name)
	}
	return slices.Collect(maps.Values(byName))
}

func TestHistory(t *testing.T) {
	type edit func(t *testing.T, h *History) error
	track := func(children ...string) edit {
		return func(_ *testing.T, h *History) error { h.Track(refs(children...)); return nil }
	}
	move := func(child string) edit {
		return func(_ *testing.T, h *History) error { return h.Move(parseRef(child), h.Latest()) }
	}
	prune := func(_ *testing.T, h *History) error { h.Prune(); return nil }

	cases := []struct {
		reason   string
		existing func(t testing.TB) []v1alpha1.ControllerRevision
		current  string // image of the current template
		edits    []edit
		// expectations, with conventional names shown as their image
		wantLatest    string
		wantOf        map[string]string // child → revision
		wantRevisions []string          // Revisions(), in order
		wantCreate    []string
		wantUpdate    []string
		wantDelete    []string
		wantErr       string
	}{
		{
			reason:  "no history: everything is on a new latest revision",
			current: "v1", edits: []edit{track("Pod/web-0", "Pod/web-1")},
			wantLatest: "v1", wantOf: map[string]string{"Pod/web-0": "v1", "Pod/web-1": "v1"},
			wantRevisions: []string{"v1"},
			wantCreate:    []string{"v1 Pod:web-0,web-1"},
		},
		{
			reason:     "no history and no children: the latest revision is still created",
			current:    "v1",
			wantLatest: "v1", wantRevisions: []string{"v1"}, wantCreate: []string{"v1"},
		},
		{
			reason: "steady state: nothing to write",
			existing: func(t testing.TB) []v1alpha1.ControllerRevision {
				return []v1alpha1.ControllerRevision{rev(t, "", "v1", "Pod/web-0", "Pod/web-1")}
			},
			current: "v1", edits: []edit{track("Pod/web-0", "Pod/web-1"), prune},
			wantLatest: "v1", wantOf: map[string]string{"Pod/web-0": "v1"}, wantRevisions: []string{"v1"},
		},
		{
			reason: "a template change creates a second revision; children stay on the old one",
			existing: func(t testing.TB) []v1alpha1.ControllerRevision {
				return []v1alpha1.ControllerRevision{rev(t, "", "v1", "Pod/web-0", "Pod/web-1")}
			},
			current: "v2", edits: []edit{track("Pod/web-0", "Pod/web-1"), prune},
			wantLatest: "v2", wantOf: map[string]string{"Pod/web-0": "v1", "Pod/web-1": "v1"},
			wantRevisions: []string{"v2", "v1"},
			wantCreate:    []string{"v2"},
		},
		{
			reason: "moving a child into a new latest revision: create it with the child, then remove it from the old one",
			existing: func(t testing.TB) []v1alpha1.ControllerRevision {
				return []v1alpha1.ControllerRevision{rev(t, "", "v1", "Pod/web-0", "Pod/web-1")}
			},
			current: "v2", edits: []edit{track("Pod/web-0", "Pod/web-1"), move("Pod/web-0"), prune},
			wantLatest: "v2", wantOf: map[string]string{"Pod/web-0": "v2", "Pod/web-1": "v1"},
			wantCreate: []string{"v2 Pod:web-0"}, wantUpdate: []string{"v1 Pod:web-1"},
		},
		{
			reason: "moving between stored revisions: the latest is written first",
			existing: func(t testing.TB) []v1alpha1.ControllerRevision {
				return []v1alpha1.ControllerRevision{rev(t, "", "v1", "Pod/web-1", "Pod/web-2"), rev(t, "", "v2", "Pod/web-0")}
			},
			current: "v2", edits: []edit{track("Pod/web-0", "Pod/web-1", "Pod/web-2"), move("Pod/web-1")},
			wantLatest: "v2", wantOf: map[string]string{"Pod/web-1": "v2", "Pod/web-2": "v1"},
			wantUpdate: []string{"v2 Pod:web-0,web-1", "v1 Pod:web-2"},
		},
		{
			reason: "pruning: the old revision goes once its last child has moved",
			existing: func(t testing.TB) []v1alpha1.ControllerRevision {
				return []v1alpha1.ControllerRevision{rev(t, "", "v1", "Pod/web-1"), rev(t, "", "v2", "Pod/web-0")}
			},
			current: "v2", edits: []edit{track("Pod/web-0", "Pod/web-1"), move("Pod/web-1"), prune},
			wantLatest: "v2", wantRevisions: []string{"v2"},
			wantUpdate: []string{"v2 Pod:web-0,web-1"}, wantDelete: []string{"v1 Pod:web-1"},
		},
		{
			reason: "without Prune an emptied revision is kept",
			existing: func(t testing.TB) []v1alpha1.ControllerRevision {
				return []v1alpha1.ControllerRevision{rev(t, "", "v1", "Pod/web-1"), rev(t, "", "v2", "Pod/web-0")}
			},
			current: "v2", edits: []edit{track("Pod/web-0", "Pod/web-1"), move("Pod/web-1")},
			wantLatest: "v2", wantRevisions: []string{"v2"},
			wantUpdate: []string{"v2 Pod:web-0,web-1", "v1"},
		},
		{
			reason: "the latest revision is never pruned, even when scaled to zero",
			existing: func(t testing.TB) []v1alpha1.ControllerRevision {
				return []v1alpha1.ControllerRevision{rev(t, "", "v1", "Pod/web-0")}
			},
			current: "v1", edits: []edit{track(), prune},
			wantLatest: "v1", wantRevisions: []string{"v1"}, wantUpdate: []string{"v1"},
		},
		{
			reason: "scaling during a rollout: a new child belongs to the latest, a removed one leaves its revision",
			existing: func(t testing.TB) []v1alpha1.ControllerRevision {
				return []v1alpha1.ControllerRevision{rev(t, "", "v1", "Pod/web-1", "Pod/web-2"), rev(t, "", "v2", "Pod/web-0")}
			},
			current: "v2", edits: []edit{track("Pod/web-0", "Pod/web-1", "Pod/web-3"), prune},
			wantLatest: "v2", wantOf: map[string]string{"Pod/web-1": "v1", "Pod/web-2": "v2", "Pod/web-3": "v2"},
			wantRevisions: []string{"v2", "v1"},
			wantUpdate:    []string{"v2 Pod:web-0,web-3", "v1 Pod:web-1"},
		},
		{
			reason: "scaling down the last child of an old revision prunes it",
			existing: func(t testing.TB) []v1alpha1.ControllerRevision {
				return []v1alpha1.ControllerRevision{rev(t, "", "v1", "Pod/web-1"), rev(t, "", "v2", "Pod/web-0")}
			},
			current: "v2", edits: []edit{track("Pod/web-0"), prune},
			wantLatest: "v2", wantRevisions: []string{"v2"}, wantDelete: []string{"v1 Pod:web-1"},
		},
		{
			reason: "a child deleted mid-rollout stays on its revision while it is still desired",
			existing: func(t testing.TB) []v1alpha1.ControllerRevision {
				return []v1alpha1.ControllerRevision{rev(t, "", "v1", "Pod/web-1"), rev(t, "", "v2", "Pod/web-0")}
			},
			current: "v2", edits: []edit{track("Pod/web-0", "Pod/web-1"), prune},
			wantLatest: "v2", wantOf: map[string]string{"Pod/web-1": "v1"}, wantRevisions: []string{"v2", "v1"},
		},
		{
			reason: "reverting the template makes the old revision the latest again, without creating one",
			existing: func(t testing.TB) []v1alpha1.ControllerRevision {
				return []v1alpha1.ControllerRevision{rev(t, "", "v1", "Pod/web-1"), rev(t, "", "v2", "Pod/web-0")}
			},
			current: "v1", edits: []edit{track("Pod/web-0", "Pod/web-1")},
			wantLatest: "v1", wantOf: map[string]string{"Pod/web-0": "v2", "Pod/web-1": "v1"},
			wantRevisions: []string{"v1", "v2"},
		},
		{
			reason: "a child in two revisions (crash between the writes of a move) belongs to the latest",
			existing: func(t testing.TB) []v1alpha1.ControllerRevision {
				return []v1alpha1.ControllerRevision{rev(t, "", "v1", "Pod/web-0", "Pod/web-1"), rev(t, "", "v2", "Pod/web-0")}
			},
			current: "v2", edits: []edit{track("Pod/web-0", "Pod/web-1")},
			wantLatest: "v2", wantOf: map[string]string{"Pod/web-0": "v2", "Pod/web-1": "v1"},
			wantUpdate: []string{"v1 Pod:web-1"},
		},
		{
			reason: "a child in two old revisions belongs to the lowest name",
			existing: func(t testing.TB) []v1alpha1.ControllerRevision {
				return []v1alpha1.ControllerRevision{rev(t, "rev-b", "v2", "Pod/web-0"), rev(t, "rev-a", "v1", "Pod/web-0")}
			},
			current: "v3", edits: []edit{track("Pod/web-0"), prune},
			wantLatest: "v3", wantOf: map[string]string{"Pod/web-0": "rev-a"},
			wantCreate: []string{"v3"}, wantDelete: []string{"rev-b Pod:web-0"},
		},
		{
			reason: "an adopted revision is matched by patch, not by name",
			existing: func(t testing.TB) []v1alpha1.ControllerRevision {
				return []v1alpha1.ControllerRevision{rev(t, "catsets.ctl.example.com-oldparent", "v1", "Pod/web-0")}
			},
			current: "v1", edits: []edit{track("Pod/web-0", "Pod/web-1")},
			wantLatest: "catsets.ctl.example.com-oldparent", wantOf: map[string]string{"Pod/web-1": "catsets.ctl.example.com-oldparent"},
			wantUpdate: []string{"catsets.ctl.example.com-oldparent Pod:web-0,web-1"},
		},
		{
			reason: "revisions with the same patch as the latest merge into the conventionally named one",
			existing: func(t testing.TB) []v1alpha1.ControllerRevision {
				return []v1alpha1.ControllerRevision{rev(t, "a-adopted", "v1", "Pod/web-0"), rev(t, "", "v1", "Pod/web-1")}
			},
			current: "v1", edits: []edit{track("Pod/web-0", "Pod/web-1")},
			wantLatest: "v1", wantOf: map[string]string{"Pod/web-0": "v1"},
			wantUpdate: []string{"v1 Pod:web-0,web-1"}, wantDelete: []string{"a-adopted Pod:web-0"},
		},
		{
			reason: "old revisions with the same patch merge into the lowest name",
			existing: func(t testing.TB) []v1alpha1.ControllerRevision {
				return []v1alpha1.ControllerRevision{rev(t, "old-b", "v1", "Pod/web-1"), rev(t, "old-a", "v1", "Pod/web-0")}
			},
			current: "v2", edits: []edit{track("Pod/web-0", "Pod/web-1")},
			wantLatest: "v2", wantOf: map[string]string{"Pod/web-1": "old-a"},
			wantRevisions: []string{"v2", "old-a"},
			wantCreate:    []string{"v2"}, wantUpdate: []string{"old-a Pod:web-0,web-1"}, wantDelete: []string{"old-b Pod:web-1"},
		},
		{
			reason: "kinds and groups are kept apart and sorted; unsorted, split or duplicate stored names are not rewritten",
			existing: func(t testing.TB) []v1alpha1.ControllerRevision {
				r := rev(t, "", "v1")
				r.Children = []v1alpha1.ControllerRevisionChildren{
					{APIGroup: "apps", Kind: "StatefulSet", Names: []string{"web-0"}},
					{Kind: "Pod", Names: []string{"web-1", "web-0"}},
					{Kind: "Pod", Names: []string{"web-0"}},
					{Kind: "ConfigMap", Names: []string{}},
				}
				return []v1alpha1.ControllerRevision{r}
			},
			current: "v1", edits: []edit{track("Pod/web-0", "Pod/web-1", "apps/StatefulSet/web-0")},
			wantLatest: "v1", wantOf: map[string]string{"apps/StatefulSet/web-0": "v1", "Pod/web-0": "v1"},
		},
		{
			reason: "a new child kind is grouped and sorted with the others",
			existing: func(t testing.TB) []v1alpha1.ControllerRevision {
				return []v1alpha1.ControllerRevision{rev(t, "", "v1", "apps/StatefulSet/web-0", "Pod/web-1")}
			},
			current: "v1", edits: []edit{track("Pod/web-1", "apps/StatefulSet/web-0", "ConfigMap/web-0", "Pod/web-0")},
			wantLatest: "v1",
			wantUpdate: []string{"v1 ConfigMap:web-0 Pod:web-0,web-1 apps/StatefulSet:web-0"},
		},
		{
			reason: "a stored patch that differs only in formatting and number spelling is the same revision",
			existing: func(t testing.TB) []v1alpha1.ControllerRevision {
				r := rev(t, "", "v1", "Pod/web-0")
				r.ParentPatch = []byte(`{ "spec" : { "template": {"image":"v1", "n": 2.0} } }`)
				return []v1alpha1.ControllerRevision{r}
			},
			current: "", // see the special case below
			edits:   []edit{track("Pod/web-0")},
			wantOf:  map[string]string{"Pod/web-0": "v1"},
		},
		{
			reason:  "moving to an unknown revision is an error",
			current: "v1",
			edits: []edit{func(_ *testing.T, h *History) error {
				return h.Move(parseRef("Pod/web-0"), "nope")
			}},
			wantErr: `no revision "nope"`,
		},
		{
			reason: "a stored parentPatch that is not an object is an error",
			existing: func(t testing.TB) []v1alpha1.ControllerRevision {
				r := rev(t, "broken", "v1")
				r.ParentPatch = []byte(`[1]`)
				return []v1alpha1.ControllerRevision{r}
			},
			current: "v1", wantErr: "ControllerRevision broken: parentPatch",
		},
		{
			reason: "a conventionally named revision with another patch is an error, not a silent takeover",
			existing: func(t testing.TB) []v1alpha1.ControllerRevision {
				r := rev(t, "", "v1", "Pod/web-0")
				r.ParentPatch = []byte(`{"spec":{}}`)
				return []v1alpha1.ControllerRevision{r}
			},
			current: "v1", wantErr: "another parentPatch",
		},
	}
	for _, tc := range cases {
		t.Run(tc.reason, func(t *testing.T) {
			var existing []v1alpha1.ControllerRevision
			if tc.existing != nil {
				existing = tc.existing(t)
			}
			current := tmpl(tc.current)
			if tc.current == "" { // the formatting case: same content as the stored patch
				current = map[string]any{"spec": map[string]any{"template": map[string]any{"n": int64(2), "image": "v1"}}}
				existing[0].Name = mustName(t, current)
				tc.wantLatest = existing[0].Name
				tc.wantOf = map[string]string{"Pod/web-0": existing[0].Name}
			}
			before := summarize(t, existing)
			h, err := NewHistory(testParent, existing, current)
			for _, e := range tc.edits {
				if err != nil {
					break
				}
				err = e(t, h)
			}
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := alias(t, h.Latest()); got != tc.wantLatest {
				t.Errorf("Latest = %s, want %s", got, tc.wantLatest)
			}
			for child, want := range tc.wantOf {
				ref := parseRef(child)
				if got := alias(t, h.RevisionOf(ref.APIGroup, ref.Kind, ref.Name)); got != want {
					t.Errorf("RevisionOf(%s) = %s, want %s", child, got, want)
				}
			}
			if tc.wantRevisions != nil {
				var got []string
				for _, r := range h.Revisions() {
					got = append(got, alias(t, r.Name))
					if r.Latest != (r.Name == h.Latest()) {
						t.Errorf("Revision %s: Latest = %v", r.Name, r.Latest)
					}
				}
				if !slices.Equal(got, tc.wantRevisions) {
					t.Errorf("Revisions = %v, want %v", got, tc.wantRevisions)
				}
			}
			create, update, del := h.Changes()
			for _, c := range []struct {
				what      string
				got, want []string
			}{{"create", summarize(t, create), tc.wantCreate}, {"update", summarize(t, update), tc.wantUpdate}, {"delete", summarize(t, del), tc.wantDelete}} {
				if !slices.Equal(c.got, c.want) {
					t.Errorf("%s = %q, want %q", c.what, c.got, c.want)
				}
			}
			if after := summarize(t, existing); !slices.Equal(after, before) {
				t.Errorf("the stored revisions were modified: %v", after)
			}

			// Idempotence: the persisted result, loaded again, needs no writes.
			again, err := NewHistory(testParent, persist(existing, create, update, del), current)
			if err != nil {
				t.Fatal(err)
			}
			if again.Latest() != h.Latest() {
				t.Errorf("reloaded Latest = %s, want %s", again.Latest(), h.Latest())
			}
			if c, u, d := again.Changes(); len(c)+len(u)+len(d) > 0 {
				t.Errorf("not idempotent: create %v update %v delete %v", summarize(t, c), summarize(t, u), summarize(t, d))
			}
		})
	}
}

func mustName(t testing.TB, patch map[string]any) string {
	t.Helper()
	n, err := Name(testParent.Resource, testParent.Group, testParent.UID, patch)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestHistoryObjects checks the objects Changes returns, beyond their children.
func TestHistoryObjects(t *testing.T) {
	old := rev(t, "", "v1", "Pod/web-0", "Pod/web-1")
	old.Labels = map[string]string{"keep": "me"}
	h, err := NewHistory(testParent, []v1alpha1.ControllerRevision{old}, tmpl("v2"))
	if err != nil {
		t.Fatal(err)
	}
	if err := h.Move(ChildRef{Kind: "Pod", Name: "web-0"}, h.Latest()); err != nil {
		t.Fatal(err)
	}
	create, update, _ := h.Changes()
	if len(create) != 1 || len(update) != 1 {
		t.Fatalf("create %d, update %d; want 1 and 1", len(create), len(update))
	}
	c := create[0]
	if c.APIVersion != "metacontroller.k8s.io/v1alpha1" || c.Kind != "ControllerRevision" {
		t.Errorf("TypeMeta = %+v", c.TypeMeta)
	}
	if c.Name != conv(t, "v2") || c.Namespace != "ns" || !maps.Equal(c.Labels, testParent.Labels) ||
		len(c.OwnerReferences) != 1 || c.OwnerReferences[0].UID != "uid-1" {
		t.Errorf("created metadata = %+v", c.ObjectMeta)
	}
	if string(c.ParentPatch) != `{"spec":{"template":{"image":"v2"}}}` {
		t.Errorf("created parentPatch = %s", c.ParentPatch)
	}
	u := update[0]
	if u.ResourceVersion != "7" || u.Labels["keep"] != "me" || string(u.ParentPatch) != string(old.ParentPatch) {
		t.Errorf("an update must keep the stored metadata and patch: %+v %s", u.ObjectMeta, u.ParentPatch)
	}
	// The outputs share no metadata with the inputs or the parent description.
	c.Labels["x"], u.Labels["x"] = "y", "y"
	if _, ok := testParent.Labels["x"]; ok || old.Labels["x"] != "" {
		t.Errorf("Changes shares label maps with its inputs")
	}
	// Revisions exposes each revision's patch, to render the parent as of it.
	revs := h.Revisions()
	if len(revs) != 2 || encode(t, revs[0].Patch) != encode(t, tmpl("v2")) || encode(t, revs[1].Patch) != encode(t, tmpl("v1")) {
		t.Errorf("Revisions = %+v", revs)
	}
}

// TestHistoryCrashMidMove writes only the first write of a move (the new revision with the
// child) and checks that the move stands when the history is loaded again.
func TestHistoryCrashMidMove(t *testing.T) {
	existing := []v1alpha1.ControllerRevision{rev(t, "", "v1", "Pod/web-0", "Pod/web-1")}
	h, _ := NewHistory(testParent, existing, tmpl("v2"))
	_ = h.Move(ChildRef{Kind: "Pod", Name: "web-0"}, h.Latest())
	create, _, _ := h.Changes()
	crashed := persist(existing, create, nil, nil)
	again, err := NewHistory(testParent, crashed, tmpl("v2"))
	if err != nil {
		t.Fatal(err)
	}
	if got := again.RevisionOf("", "Pod", "web-0"); got != again.Latest() {
		t.Fatalf("web-0 on %s after the crash, want the latest", alias(t, got))
	}
	if _, update, _ := again.Changes(); !slices.Equal(summarize(t, update), []string{"v1 Pod:web-1"}) {
		t.Fatalf("the repair should finish the move: %v", summarize(t, update))
	}
}

func TestRefOf(t *testing.T) {
	for _, tc := range []struct {
		reason, apiVersion string
		want               ChildRef
	}{
		{"core", "v1", ChildRef{Kind: "Pod", Name: "a"}},
		{"named group, version dropped", "apps/v1", ChildRef{APIGroup: "apps", Kind: "Pod", Name: "a"}},
	} {
		if got := RefOf(tc.apiVersion, "Pod", "a"); got != tc.want {
			t.Errorf("%s: got %+v, want %+v", tc.reason, got, tc.want)
		}
	}
}
