package bus

import (
	"sort"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/metabus/metabus/docs"
)

// TestBusEventAttributesDocumented: every CloudEvents attribute and
// extension the bus's events for consumers carry is in the table of
// docs/events.md, and the table lists nothing they never carry. The sent
// set comes from real events of every kind, including the optional
// extensions (a weighted controller, a known parent resourceVersion, a map
// key, a redacted Secret).
func TestBusEventAttributesDocumented(t *testing.T) {
	ctrl := ControllerRef{Kind: "MapController", Name: "m", UID: "cuid", Weight: 3}
	parent := ObjectRef{APIVersion: "example.com/v1", Kind: "Site", Resource: "sites", Namespace: "ns", Name: "a", UID: "puid", ResourceVersion: "12"}
	secret := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "v1", "kind": "Secret",
		"metadata": map[string]any{"name": "s"}, "data": map[string]any{"k": "dg=="}}}
	var events []*Event
	for _, build := range []func() (*Event, error){
		func() (*Event, error) {
			return NewDesiredEvent(&DesiredState{Controller: ctrl, Parent: parent, MapKey: "k", WorkSeq: 1, Children: []*unstructured.Unstructured{secret}})
		},
		func() (*Event, error) {
			return NewAppliedEvent(&AppliedEvent{Controller: ctrl, Parent: parent, MapKey: "k", WorkSeq: 1, Outcome: OutcomeApplied})
		},
		func() (*Event, error) {
			return NewAppliedEvent(&AppliedEvent{Controller: ControllerRef{Kind: "CompositeController", Name: "c"}, Parent: ObjectRef{Name: "b", UID: "u"}, WorkSeq: 2})
		},
	} {
		ev, err := build()
		if err != nil {
			t.Fatal(err)
		}
		events = append(events, ev)
	}
	sent := map[string]bool{}
	for _, ev := range events {
		for h := range ev.Header {
			if strings.HasPrefix(h, "ce-") {
				sent[strings.TrimPrefix(h, "ce-")] = true
			}
		}
	}

	documented, err := docs.TableNames("../../docs/events.md", "CloudEvents attributes")
	if err != nil {
		t.Fatal(err)
	}
	if len(sent) < 10 {
		t.Fatalf("only %d attributes on real events (%v): the derivation is broken", len(sent), sent)
	}
	sorted := func(m map[string]bool) []string {
		out := make([]string, 0, len(m))
		for k := range m {
			out = append(out, k)
		}
		sort.Strings(out)
		return out
	}
	if diff := cmp.Diff(sorted(documented), sorted(sent)); diff != "" {
		t.Errorf("attributes (-documented in docs/events.md +sent on the bus's events):\n%s", diff)
	}
}
