package jsbus

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/metabus/metabus/pkg/bus"
)

// A desired state that exhausts its deliveries is parked in MC_DLQ (kept a
// week) without the data of any Secret it carries, children or an older
// revision's children, and says so in a header.
func TestDeadLetterRedactsSecretChildren(t *testing.T) {
	js := startBus(t, bus.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	secret := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "v1", "kind": "Secret", "metadata": map[string]any{"name": "db"},
		"data": map[string]any{"password": "aHVudGVyMg=="}, // hunter2
	}}
	ds := bus.DesiredState{
		Controller: bus.ControllerRef{Kind: "CompositeController", Name: "c", UID: "ctrl-uid"},
		Parent:     bus.ObjectRef{APIVersion: "example.com/v1", Kind: "Thing", Resource: "things", Namespace: "ns", Name: "a", UID: "parent-uid"},
		Hook:       "sync", WorkSeq: 1, Children: []*unstructured.Unstructured{secret},
		Revisions: []bus.RevisionChildren{{Name: "r1", Children: []*unstructured.Unstructured{{Object: map[string]any{
			"apiVersion": "v1", "kind": "Secret", "metadata": map[string]any{"name": "db-old"},
			"data": map[string]any{"password": "b2xkLWh1bnRlcjI="}, // old-hunter2
		}}}}},
	}
	if err := (Publisher{JS: js}).PublishDesired(ctx, ds); err != nil {
		t.Fatal(err)
	}
	desired, err := js.Stream(ctx, bus.DesiredStream)
	if err != nil {
		t.Fatal(err)
	}
	info, err := desired.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	adv, err := json.Marshal(maxDeliveriesAdvisory{Stream: bus.DesiredStream, StreamSeq: info.State.LastSeq, Deliveries: 5})
	if err != nil {
		t.Fatal(err)
	}
	dl, err := deadLetter(ctx, js, adv)
	if err != nil || dl == nil {
		t.Fatalf("deadLetter = %v, %v", dl, err)
	}
	if dl.Parent.UID != "parent-uid" {
		t.Errorf("reported parent %+v, want UID parent-uid", dl.Parent)
	}
	dlq, err := js.Stream(ctx, bus.DLQStream)
	if err != nil {
		t.Fatal(err)
	}
	parked, err := dlq.GetLastMsgForSubject(ctx, "mc.dlq.>")
	if err != nil {
		t.Fatalf("no message in %s: %v", bus.DLQStream, err)
	}
	if strings.Contains(string(parked.Data), "aHVudGVyMg==") || strings.Contains(string(parked.Data), "b2xkLWh1bnRlcjI=") {
		t.Errorf("MC_DLQ holds the Secret's data: %s", parked.Data)
	}
	if !strings.Contains(string(parked.Data), `"name":"db"`) || !strings.Contains(string(parked.Data), `"password":""`) {
		t.Errorf("MC_DLQ lost the Secret's reference or keys: %s", parked.Data)
	}
	if got := parked.Header.Get("Metabus-Redacted"); got != "data and stringData values of 2 Secrets" {
		t.Errorf("Metabus-Redacted header %q", got)
	}
}
