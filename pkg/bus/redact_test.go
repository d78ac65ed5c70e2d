package bus

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
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
