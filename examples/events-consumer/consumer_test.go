package eventsconsumer

import (
	"encoding/json"
	"testing"

	cloudevents "github.com/cloudevents/sdk-go/v2"
	"github.com/google/go-cmp/cmp"

	"github.com/metabus/metabus/pkg/bus"
)

func TestDescribe(t *testing.T) {
	event := func(ceType string, body any) cloudevents.Event {
		e := cloudevents.NewEvent()
		e.SetID("id-1")
		e.SetType(ceType)
		e.SetSubject("apis/example.com/v1/namespaces/ns/sites/a")
		data, _ := json.Marshal(body)
		_ = e.SetData(cloudevents.ApplicationJSON, json.RawMessage(data))
		return e
	}
	parent := bus.ObjectRef{Kind: "Site", Namespace: "ns", Name: "a"}
	ctrl := bus.ControllerRef{Kind: "CompositeController", Name: "web"}
	for _, tc := range []struct {
		reason, want string
		event        cloudevents.Event
	}{
		{"an apply that changed children and status", "web Site ns/a seq=7 applied created: ConfigMap a-x; deleted: Secret a-old; status written",
			event(bus.TypeApplied, bus.AppliedEvent{Controller: ctrl, Parent: parent, WorkSeq: 7, Outcome: bus.OutcomeApplied, StatusWritten: true,
				Created: []bus.ChildChange{{Kind: "ConfigMap", Name: "a-x"}}, Deleted: []bus.ChildChange{{Kind: "Secret", Name: "a-old"}}})},
		{"a failure with its reason", "web Site ns/a seq=8 failed (ApplyForbidden)",
			event(bus.TypeApplied, bus.AppliedEvent{Controller: ctrl, Parent: parent, WorkSeq: 8, Outcome: bus.OutcomeFailed, Reason: "ApplyForbidden"})},
		{"another type: its type and subject", bus.TypeDesired + " apis/example.com/v1/namespaces/ns/sites/a (id id-1)",
			event(bus.TypeDesired, map[string]any{})},
	} {
		t.Run(tc.reason, func(t *testing.T) {
			got, err := Describe(tc.event)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
	bad := cloudevents.NewEvent()
	bad.SetType(bus.TypeApplied)
	_ = bad.SetData(cloudevents.ApplicationJSON, []byte(`[1]`))
	if _, err := Describe(bad); err == nil {
		t.Error("an applied event whose data is not an AppliedEvent: no error")
	}
}
