package bus

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestKeysMatchTheirDefinition: the one-allocation builders give what
// the definitions say: ControllerID is the kind's initials, "-" and the
// name with "." as "_"; an item's Key is ItemKey of its controller's ID.
func TestKeysMatchTheirDefinition(t *testing.T) {
	for _, c := range []struct {
		reason            string
		kind, name        string
		parentUID, mapKey string
	}{
		{"a composite controller", "CompositeController", "web", "u-1", ""},
		{"a dotted name", "DecoratorController", "a.b.c", "u-2", ""},
		{"a map key", "MapController", "m", "u-3", "ns/cm"},
		{"a kind without capitals", "thing", "n", "u", "k"},
		{"an empty kind", "", "n", "u", ""},
		{"non-ASCII in kind and name", "ÄbcDé", "ü.x", "u", "ü"},
	} {
		t.Run(c.reason, func(t *testing.T) {
			wantID := KindIDPrefix(c.kind) + "-" + strings.ReplaceAll(c.name, ".", "_")
			ref := ControllerRef{Kind: c.kind, Name: c.name}
			if diff := cmp.Diff(wantID, ref.ID()); diff != "" {
				t.Errorf("ControllerID (-want +got):\n%s", diff)
			}
			want := wantID + "/" + c.parentUID
			if c.mapKey != "" {
				want += MapKeySep + c.mapKey
			}
			for name, got := range map[string]string{
				"ItemKey":          ItemKey(ref.ID(), c.parentUID, c.mapKey),
				"WorkItem.Key":     WorkItem{Controller: ref, Parent: ObjectRef{UID: c.parentUID}, MapKey: c.mapKey}.Key(),
				"DesiredState.Key": DesiredState{Controller: ref, Parent: ObjectRef{UID: c.parentUID}, MapKey: c.mapKey}.Key(),
				"Applied.Key":      Applied{Controller: ref, ParentUID: c.parentUID, MapKey: c.mapKey}.Key(),
			} {
				if diff := cmp.Diff(want, got); diff != "" {
					t.Errorf("%s (-want +got):\n%s", name, diff)
				}
			}
			if c.mapKey == "" {
				if diff := cmp.Diff(want, ParentKey(ref.ID(), c.parentUID)); diff != "" {
					t.Errorf("ParentKey (-want +got):\n%s", diff)
				}
			}
		})
	}
}

func BenchmarkWorkItemKey(b *testing.B) {
	w := WorkItem{Controller: ControllerRef{Kind: "CompositeController", Name: "bench"}, Parent: ObjectRef{UID: "0d4c4b58-1d4c-4b58-9d4c-4b581d4c4b58"}}
	b.ReportAllocs()
	for b.Loop() {
		_ = w.Key()
	}
}
