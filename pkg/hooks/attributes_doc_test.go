package hooks

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/url"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/metabus/metabus/docs"
	"github.com/metabus/metabus/pkg/api/v1alpha1"
	"github.com/metabus/metabus/pkg/bus"
)

// sentAttributes returns the CloudEvents attributes and extensions of the
// requests metabus really builds (Item's calls of every hook kind, through
// newRequest, in both content modes): the ce-* headers of binary mode and
// the members other than data of structured mode.
func sentAttributes(t *testing.T) map[string]bool {
	t.Helper()
	u, _ := url.Parse("http://hook.example/")
	it := Item{
		Controller: bus.ControllerRef{Kind: "MapController", Name: "m", UID: "cuid"},
		Parent:     bus.ObjectRef{APIVersion: "example.com/v1", Resource: "things", Namespace: "ns", Name: "a", UID: "puid", ResourceVersion: "7"},
		MapKey:     "k", WorkSeq: 9,
	}
	var calls []Call
	for _, mode := range []v1alpha1.CloudEventsMode{v1alpha1.CloudEventsBinary, v1alpha1.CloudEventsStructured} {
		hook := &v1alpha1.Hook{Webhook: &v1alpha1.Webhook{URL: ptr(u.String()), CloudEvents: ptr(mode)}}
		for _, kind := range []string{bus.HookSync, bus.HookFinalize, bus.HookMap, bus.HookTombstone} {
			calls = append(calls, it.SyncCall(hook, kind, "", map[string]any{"parent": map[string]any{}}))
		}
		calls = append(calls, it.CustomizeCall(hook, map[string]any{"parent": map[string]any{}}))
	}
	sent := map[string]bool{}
	for i := range calls {
		body, _ := json.Marshal(calls[i].Request)
		req, err := newRequest(context.Background(), u, &calls[i], body, time.Now())
		if err != nil {
			t.Fatalf("%s call: %v", calls[i].Kind, err)
		}
		for name := range req.Header {
			if n := strings.ToLower(name); strings.HasPrefix(n, "ce-") {
				sent[strings.TrimPrefix(n, "ce-")] = true
			}
		}
		if req.Header.Get("Content-Type") != "application/cloudevents+json" {
			continue
		}
		raw, _ := io.ReadAll(req.Body)
		var doc map[string]json.RawMessage
		if err := json.NewDecoder(bytes.NewReader(raw)).Decode(&doc); err != nil {
			t.Fatalf("structured %s request: %v", calls[i].Kind, err)
		}
		for name := range doc {
			if name != "data" {
				sent[name] = true
			}
		}
	}
	return sent
}

// TestHookAttributesDocumented: every attribute and extension a hook
// request carries is in the table of docs/contract.md, and the table lists
// nothing that is never sent.
func TestHookAttributesDocumented(t *testing.T) {
	sent := sentAttributes(t)
	documented, err := docs.TableNames("../../docs/contract.md", "CloudEvents")
	if err != nil {
		t.Fatal(err)
	}
	if len(sent) < 8 {
		t.Fatalf("only %d attributes found in real requests (%v): the derivation is broken", len(sent), sent)
	}
	if diff := cmp.Diff(keys(documented), keys(sent)); diff != "" {
		t.Errorf("attributes (-documented in docs/contract.md +sent to hooks):\n%s", diff)
	}
}

func keys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
