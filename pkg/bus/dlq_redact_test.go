package bus

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

func TestRedactSecretData(t *testing.T) {
	tests := []struct {
		reason   string
		in       string
		want     string // JSON, compared as values
		wantNote string
	}{
		{
			reason: "no Secret child: unchanged, byte for byte",
			in:     `{"children":[{"apiVersion":"v1","kind":"ConfigMap","data":{"k":"v"}}],"workSeq":12345678901234567}`,
			want:   `{"children":[{"apiVersion":"v1","kind":"ConfigMap","data":{"k":"v"}}],"workSeq":12345678901234567}`,
		},
		{
			reason: "a Secret child: data and stringData emptied, keys, metadata and the rest kept",
			in: `{"parent":{"name":"p"},"workSeq":12345678901234567,"children":[` +
				`{"apiVersion":"v1","kind":"Secret","metadata":{"name":"db"},"type":"Opaque","data":{"password":"aHVudGVyMg=="},"stringData":{"user":"admin"}},` +
				`{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"c"},"data":{"k":"v"}}]}`,
			want: `{"parent":{"name":"p"},"workSeq":12345678901234567,"children":[` +
				`{"apiVersion":"v1","kind":"Secret","metadata":{"name":"db"},"type":"Opaque","data":{"password":""},"stringData":{"user":""}},` +
				`{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"c"},"data":{"k":"v"}}]}`,
			wantNote: "data and stringData values of 1 Secrets",
		},
		{
			reason:   "a Secret-like custom kind is not a Secret",
			in:       `{"children":[{"apiVersion":"example.com/v1","kind":"Secret","data":{"k":"v"}}]}`,
			want:     `{"children":[{"apiVersion":"example.com/v1","kind":"Secret","data":{"k":"v"}}]}`,
			wantNote: "",
		},
		{
			reason: "a rolling parent's older revision: Secrets under revisions[].children are redacted too",
			in: `{"children":[],"revisions":[{"name":"r1","children":[` +
				`{"apiVersion":"v1","kind":"Secret","metadata":{"name":"old"},"data":{"password":"aHVudGVyMg=="}}]}]}`,
			want: `{"children":[],"revisions":[{"name":"r1","children":[` +
				`{"apiVersion":"v1","kind":"Secret","metadata":{"name":"old"},"data":{"password":""}}]}]}`,
			wantNote: "data and stringData values of 1 Secrets",
		},
		{
			reason: "anywhere else: a Secret in a status, a List, and the items of a SecretList (which omit kind)",
			in: `{"status":{"copy":{"apiVersion":"v1","kind":"Secret","stringData":{"k":"s3cr3t"}}},` +
				`"children":[{"apiVersion":"v1","kind":"List","items":[{"apiVersion":"v1","kind":"Secret","data":{"a":"czE="}}]},` +
				`{"apiVersion":"v1","kind":"SecretList","items":[{"metadata":{"name":"x"},"data":{"b":"czI="}}]}]}`,
			want: `{"status":{"copy":{"apiVersion":"v1","kind":"Secret","stringData":{"k":""}}},` +
				`"children":[{"apiVersion":"v1","kind":"List","items":[{"apiVersion":"v1","kind":"Secret","data":{"a":""}}]},` +
				`{"apiVersion":"v1","kind":"SecretList","items":[{"metadata":{"name":"x"},"data":{"b":""}}]}]}`,
			wantNote: "data and stringData values of 3 Secrets",
		},
		{
			reason:   "a Secret whose data is not a map: the field is dropped",
			in:       `{"children":[{"apiVersion":"v1","kind":"Secret","data":"aHVudGVyMg=="}]}`,
			want:     `{"children":[{"apiVersion":"v1","kind":"Secret","data":null}]}`,
			wantNote: "data and stringData values of 1 Secrets",
		},
		{
			reason:   "undecodable: the body is dropped",
			in:       `{"children":[{"kind":"Secret","data":{"password":"aHVudGVyMg=="}`,
			want:     `{}`,
			wantNote: "body removed: not a decodable message",
		},
	}
	for _, tt := range tests {
		t.Run(tt.reason, func(t *testing.T) {
			out, note := redactSecretData([]byte(tt.in))
			if diff := cmp.Diff(tt.wantNote, note); diff != "" {
				t.Errorf("note (-want +got):\n%s", diff)
			}
			if tt.wantNote == "" && string(out) != tt.in {
				t.Errorf("body changed though nothing was redacted: %s", out)
			}
			var got, want any
			if err := json.Unmarshal(out, &got); err != nil {
				t.Fatalf("redacted body is not JSON: %v: %s", err, out)
			}
			if err := json.Unmarshal([]byte(tt.want), &want); err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("body (-want +got):\n%s", diff)
			}
			if strings.Contains(string(out), "workSeq") && !strings.Contains(string(out), "12345678901234567") {
				t.Errorf("a large number lost precision: %s", out)
			}
		})
	}
}

// A desired state that exhausts its deliveries is parked in MC_DLQ (kept a
// week) without the data of any Secret it carries, children or an older
// revision's children, and says so in a header.
func TestDeadLetterRedactsSecretChildren(t *testing.T) {
	js := startBus(t, Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	secret := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "v1", "kind": "Secret", "metadata": map[string]any{"name": "db"},
		"data": map[string]any{"password": "aHVudGVyMg=="}, // hunter2
	}}
	ds := DesiredState{
		Controller: ControllerRef{Kind: "CompositeController", Name: "c", UID: "ctrl-uid"},
		Parent:     ObjectRef{APIVersion: "example.com/v1", Kind: "Thing", Resource: "things", Namespace: "ns", Name: "a", UID: "parent-uid"},
		Hook:       "sync", WorkSeq: 1, Children: []*unstructured.Unstructured{secret},
		Revisions: []RevisionChildren{{Name: "r1", Children: []*unstructured.Unstructured{{Object: map[string]any{
			"apiVersion": "v1", "kind": "Secret", "metadata": map[string]any{"name": "db-old"},
			"data": map[string]any{"password": "b2xkLWh1bnRlcjI="}, // old-hunter2
		}}}}},
	}
	if err := (Publisher{JS: js}).PublishDesired(ctx, ds); err != nil {
		t.Fatal(err)
	}
	desired, err := js.Stream(ctx, DesiredStream)
	if err != nil {
		t.Fatal(err)
	}
	info, err := desired.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	adv, err := json.Marshal(maxDeliveriesAdvisory{Stream: DesiredStream, StreamSeq: info.State.LastSeq, Deliveries: 5})
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
	dlq, err := js.Stream(ctx, DLQStream)
	if err != nil {
		t.Fatal(err)
	}
	parked, err := dlq.GetLastMsgForSubject(ctx, "mc.dlq.>")
	if err != nil {
		t.Fatalf("no message in %s: %v", DLQStream, err)
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
