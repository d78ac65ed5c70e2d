package bus

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

func secretChild(name string) *unstructured.Unstructured {
	return &unstructured.Unstructured{Object: map[string]any{"apiVersion": "v1", "kind": "Secret",
		"metadata": map[string]any{"name": name}, "data": map[string]any{"password": "aHVudGVyMg=="}, "stringData": map[string]any{"user": "admin"}}}
}

// TestConsumerEvents: the bus's events for consumers carry their subject,
// type, id and extensions as documented, and no Secret data value
// anywhere in the body (names and keys kept).
func TestConsumerEvents(t *testing.T) {
	ctrl := ControllerRef{Kind: "CompositeController", Name: "web.v2", UID: "cuid"}
	parent := ObjectRef{APIVersion: "example.com/v1", Kind: "Site", Resource: "sites", Namespace: "prod", Name: "shop.example", UID: "puid"}
	cluster := parent
	cluster.Namespace = ""
	cm := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "v1", "kind": "ConfigMap",
		"metadata": map[string]any{"name": "c"}, "data": map[string]any{"k": "v"}}}
	tests := []struct {
		reason      string
		event       func() (*Event, error)
		wantSubject string
		wantHeader  map[string]string // ce-* headers checked ("" means absent)
		wantBody    string            // JSON, compared as values (only the keys given)
	}{
		{
			reason: "a desired state with a Secret child: its data and stringData values emptied, its name and keys kept, the note in redacted",
			event: func() (*Event, error) {
				return NewDesiredEvent(&DesiredState{Controller: ctrl, Parent: parent, WorkSeq: 42, Hook: HookSync,
					Children: []*unstructured.Unstructured{secretChild("db"), cm}})
			},
			wantSubject: "metabus.events.desired.cc-web_v2.prod.shop_example",
			wantHeader: map[string]string{"ce-type": TypeDesired, "ce-id": "desired:puid:00000000000000000042", "ce-workseq": "00000000000000000042",
				"ce-redacted": "data and stringData values of 1 Secrets", "ce-subject": "apis/example.com/v1/namespaces/prod/sites/shop.example",
				"ce-source": "/apis/metacontroller.k8s.io/v1alpha1/compositecontrollers/web.v2", "ce-datacontenttype": "application/json"},
			wantBody: `{"children":[{"apiVersion":"v1","kind":"Secret","metadata":{"name":"db"},"data":{"password":""},"stringData":{"user":""}},` +
				`{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"c"},"data":{"k":"v"}}]}`,
		},
		{
			reason: "a rolling desired state: Secrets of older revisions are redacted too",
			event: func() (*Event, error) {
				return NewDesiredEvent(&DesiredState{Controller: ctrl, Parent: parent, WorkSeq: 43, Hook: HookSync,
					Revisions: []RevisionChildren{{Name: "r1", Children: []*unstructured.Unstructured{secretChild("old")}}}})
			},
			wantSubject: "metabus.events.desired.cc-web_v2.prod.shop_example",
			wantHeader:  map[string]string{"ce-redacted": "data and stringData values of 1 Secrets"},
			wantBody:    `{"revisions":[{"name":"r1","children":[{"apiVersion":"v1","kind":"Secret","metadata":{"name":"old"},"data":{"password":""},"stringData":{"user":""}}]}]}`,
		},
		{
			reason: "no Secret: nothing removed, no redacted extension",
			event: func() (*Event, error) {
				return NewDesiredEvent(&DesiredState{Controller: ctrl, Parent: parent, WorkSeq: 44, Hook: HookSync, Children: []*unstructured.Unstructured{cm}})
			},
			wantSubject: "metabus.events.desired.cc-web_v2.prod.shop_example",
			wantHeader:  map[string]string{"ce-redacted": "", "ce-partitionkey": "cc-web_v2/puid"},
			wantBody:    `{"children":[{"apiVersion":"v1","kind":"ConfigMap","metadata":{"name":"c"},"data":{"k":"v"}}]}`,
		},
		{
			reason: "an applied event of a cluster-scoped parent: namespace token _, what changed and the outcome in the body",
			event: func() (*Event, error) {
				return NewAppliedEvent(&AppliedEvent{Controller: ctrl, Parent: cluster, WorkSeq: 45, Hook: HookSync, Outcome: OutcomeApplied,
					Created: []ChildChange{{APIVersion: "v1", Kind: "Secret", Namespace: "prod", Name: "db", UID: "u1", ResourceVersion: "9"}}})
			},
			wantSubject: "metabus.events.applied.cc-web_v2._.shop_example",
			wantHeader:  map[string]string{"ce-type": TypeApplied, "ce-id": "applied:puid:00000000000000000045", "ce-redacted": ""},
			wantBody:    `{"workSeq":45,"outcome":"applied","created":[{"apiVersion":"v1","kind":"Secret","namespace":"prod","name":"db","uid":"u1","resourceVersion":"9"}]}`,
		},
		{
			reason: "a map key's event: the key in the id and the partition key",
			event: func() (*Event, error) {
				return NewAppliedEvent(&AppliedEvent{Controller: ctrl, Parent: parent, MapKey: "k1", WorkSeq: 46, Hook: HookMap, Outcome: OutcomeFailed, Reason: "error", Message: "boom"})
			},
			wantSubject: "metabus.events.applied.cc-web_v2.prod.shop_example",
			wantHeader:  map[string]string{"ce-id": "applied:puid:00000000000000000046:k1", "ce-partitionkey": ItemKey("cc-web_v2", "puid", "k1")},
			wantBody:    `{"mapKey":"k1","outcome":"failed","reason":"error","message":"boom"}`,
		},
	}
	for _, tt := range tests {
		t.Run(tt.reason, func(t *testing.T) {
			ev, err := tt.event()
			if err != nil {
				t.Fatal(err)
			}
			if ev.Subject != tt.wantSubject {
				t.Errorf("subject %q, want %q", ev.Subject, tt.wantSubject)
			}
			for k, want := range tt.wantHeader {
				if got := ev.Header.Get(k); got != want {
					t.Errorf("%s = %q, want %q", k, got, want)
				}
			}
			if strings.Contains(string(ev.Data), "aHVudGVyMg==") || strings.Contains(string(ev.Data), "admin") {
				t.Errorf("Secret data in the body: %s", ev.Data)
			}
			var got, want map[string]any
			if err := json.Unmarshal(ev.Data, &got); err != nil {
				t.Fatalf("body %s: %v", ev.Data, err)
			}
			if err := json.Unmarshal([]byte(tt.wantBody), &want); err != nil {
				t.Fatal(err)
			}
			picked := map[string]any{}
			for k := range want {
				picked[k] = got[k]
			}
			if diff := cmp.Diff(want, picked); diff != "" {
				t.Errorf("body (-want +got):\n%s", diff)
			}
		})
	}
}

// TestEventSubjectRefusesBadTokens: a name no NATS token can carry is an
// error, not a subject that matches other parents' filters.
func TestEventSubjectRefusesBadTokens(t *testing.T) {
	ctrl := ControllerRef{Kind: "CompositeController", Name: "web"}
	for _, tc := range []struct {
		reason string
		parent ObjectRef
	}{
		{"a wildcard in the name", ObjectRef{Namespace: "ns", Name: "a*"}},
		{"a space in the name", ObjectRef{Namespace: "ns", Name: "a b"}},
		{"no name", ObjectRef{Namespace: "ns"}},
		{"a full wildcard as namespace", ObjectRef{Namespace: ">", Name: "a"}},
	} {
		t.Run(tc.reason, func(t *testing.T) {
			if s, err := EventSubject(EventKindApplied, ctrl, tc.parent); err == nil {
				t.Errorf("subject %q, want an error", s)
			}
		})
	}
}

// TestEventsStreamConfig: limits retention (reading consumes nothing),
// bounded by age and size, the defaults for zero values.
func TestEventsStreamConfig(t *testing.T) {
	for _, tc := range []struct {
		reason           string
		age              int64
		bytes            int64
		wantAge, wantMax int64
	}{
		{"zero values take the defaults", 0, 0, int64(DefaultEventsMaxAge), DefaultEventsMaxBytes},
		{"set values are kept", int64(90e9), 1 << 20, int64(90e9), 1 << 20},
	} {
		t.Run(tc.reason, func(t *testing.T) {
			c := EventsStreamConfig(Options{}, durationOf(tc.age), tc.bytes)
			got := []any{c.Name, c.Subjects, c.WorkQueue, int64(c.MaxAge), c.MaxBytes, c.Replicas}
			want := []any{EventsStream, []string{"metabus.events.>"}, false, tc.wantAge, tc.wantMax, 1}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}

func durationOf(ns int64) time.Duration { return time.Duration(ns) }
