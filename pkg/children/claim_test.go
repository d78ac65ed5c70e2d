package children

import (
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
)

func claimObj(ns, name string, lbls map[string]string, deleting bool) *unstructured.Unstructured {
	u := &unstructured.Unstructured{}
	u.SetAPIVersion("v1")
	u.SetKind("ConfigMap")
	u.SetNamespace(ns)
	u.SetName(name)
	u.SetLabels(lbls)
	if deleting {
		now := metav1.Now()
		u.SetDeletionTimestamp(&now)
	}
	return u
}

func names(objs []*unstructured.Unstructured) string {
	var s []string
	for _, o := range objs {
		s = append(s, o.GetName())
	}
	return strings.Join(s, ",")
}

func TestClaim(t *testing.T) {
	sel := labels.SelectorFromSet(labels.Set{"app": "w"})
	owner := Owner{Namespace: "ns", Namespaced: true, Selector: sel}
	match := map[string]string{"app": "w"}
	other := map[string]string{"app": "x"}
	cases := []struct {
		reason               string
		owner                Owner
		deleting             bool
		owned, orphans       []*unstructured.Unstructured
		keep, adopt, release string
	}{
		{
			reason: "owned children that match are kept, ones that stopped matching are released",
			owner:  owner,
			owned:  []*unstructured.Unstructured{claimObj("ns", "a", match, false), claimObj("ns", "b", other, false)},
			keep:   "a", release: "b",
		},
		{
			reason:  "matching orphans are adopted, others ignored",
			owner:   owner,
			orphans: []*unstructured.Unstructured{claimObj("ns", "o1", match, false), claimObj("ns", "o2", other, false)},
			adopt:   "o1",
		},
		{
			reason:  "an orphan being deleted is never adopted",
			owner:   owner,
			orphans: []*unstructured.Unstructured{claimObj("ns", "o1", match, true)},
		},
		{
			reason:   "while the owner is being deleted nothing is adopted or released",
			owner:    owner,
			deleting: true,
			owned:    []*unstructured.Unstructured{claimObj("ns", "b", other, false)},
			orphans:  []*unstructured.Unstructured{claimObj("ns", "o1", match, false)},
			keep:     "b",
		},
		{
			reason:  "a namespaced owner never adopts from another namespace",
			owner:   owner,
			orphans: []*unstructured.Unstructured{claimObj("elsewhere", "o1", match, false)},
		},
		{
			reason:  "without a selector (decorators) only owned objects count",
			owner:   Owner{Namespace: "ns", Namespaced: true},
			owned:   []*unstructured.Unstructured{claimObj("ns", "a", other, false)},
			orphans: []*unstructured.Unstructured{claimObj("ns", "o1", match, false)},
			keep:    "a",
		},
		{
			reason:  "an empty selector would claim everything, so it adopts nothing",
			owner:   Owner{Namespace: "ns", Namespaced: true, Selector: labels.Everything()},
			orphans: []*unstructured.Unstructured{claimObj("ns", "o1", match, false)},
		},
		{
			reason:  "nil entries are skipped",
			owner:   owner,
			owned:   []*unstructured.Unstructured{nil},
			orphans: []*unstructured.Unstructured{nil},
		},
	}
	for _, tc := range cases {
		keep, adopt, release := Claim(tc.owner, tc.deleting, tc.owned, tc.orphans)
		if names(keep) != tc.keep || names(adopt) != tc.adopt || names(release) != tc.release {
			t.Errorf("%s: keep=%q adopt=%q release=%q, want %q %q %q", tc.reason,
				names(keep), names(adopt), names(release), tc.keep, tc.adopt, tc.release)
		}
	}
}
