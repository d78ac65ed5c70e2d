package hook_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/cloudevents/sdk-go/v2/binding"
	cehttp "github.com/cloudevents/sdk-go/v2/protocol/http"
	"github.com/google/go-cmp/cmp"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/metabus/metabus/pkg/api/v1alpha1"
	"github.com/metabus/metabus/pkg/hookapi"
	"github.com/metabus/metabus/pkg/hooks"
	"github.com/metabus/metabus/sdk/hook"
	"github.com/metabus/metabus/sdk/hook/hooktest"
)

func obj(apiVersion, kind, ns, name string) *unstructured.Unstructured {
	m := map[string]any{"name": name, "uid": "uid-" + name, "labels": map[string]any{"app": "x"}}
	if ns != "" {
		m["namespace"] = ns
	}
	return &unstructured.Unstructured{Object: map[string]any{"apiVersion": apiVersion, "kind": kind, "metadata": m,
		"spec": map[string]any{"replicas": int64(3), "ratio": 0.5, "tags": []any{"a", "b"}}}}
}

// wireCase is one hook kind: the request metabus encodes (pkg/hookapi),
// the SDK's types, the SDK handler's answer, and where pkg/hookapi
// decodes it.
type wireCase struct {
	reason  string
	kind    string
	request any          // a pkg/hookapi request
	sdkReq  func() any   // a new SDK request
	sdkResp any          // the SDK response the handler answers
	apiResp func() any   // a new pkg/hookapi response
	handler hook.Handler // answers sdkResp
}

func wireCases() []wireCase {
	ctrl := obj("metacontroller.k8s.io/v1alpha1", "CompositeController", "", "c")
	parent := obj("example.com/v1", "Thing", "ns", "p")
	pods := hookapi.ObjectMap{"Pod.v1": {"p-0": obj("v1", "Pod", "ns", "p-0")}, "Secret.v1": nil}
	child := obj("v1", "Pod", "ns", "p-1")
	s := "v"
	answer := func(v any) hook.Handler {
		return hook.HandlerFunc(func(ctx context.Context, call *hook.Call) ([]byte, error) { return json.Marshal(v) })
	}
	composite := &hook.CompositeResponse{Status: map[string]any{"n": int64(1)}, Children: []*unstructured.Unstructured{child}, ResyncAfterSeconds: 2.5, Finalized: true}
	decorator := &hook.DecoratorResponse{Labels: map[string]*string{"a": &s, "b": nil}, Annotations: map[string]*string{"c": &s},
		Status: map[string]any{"ok": true}, Attachments: []*unstructured.Unstructured{child}, ResyncAfterSeconds: 1, Finalized: true}
	customize := &hook.CustomizeResponse{RelatedResources: []hook.RelatedResourceRule{{APIVersion: "v1", Resource: "configmaps", Names: []string{"a"}, Namespace: "ns"}}}
	mapResp := &hook.MapResponse{Outputs: []*unstructured.Unstructured{child}, ResyncAfterSeconds: 3}
	tomb := &hook.TombstoneResponse{Outputs: []*unstructured.Unstructured{child}}
	return []wireCase{
		{reason: "composite sync", kind: hook.KindSync,
			request: hookapi.CompositeSyncRequest{Controller: ctrl, Parent: parent, Children: pods, Related: nil},
			sdkReq:  func() any { return new(hook.CompositeRequest) }, sdkResp: composite,
			apiResp: func() any { return new(hookapi.CompositeSyncResponse) }, handler: answer(composite)},
		{reason: "decorator finalize", kind: hook.KindFinalize,
			request: hookapi.DecoratorSyncRequest{Controller: ctrl, Object: parent, Attachments: pods, Related: pods, Finalizing: true},
			sdkReq:  func() any { return new(hook.DecoratorRequest) }, sdkResp: decorator,
			apiResp: func() any { return new(hookapi.DecoratorSyncResponse) }, handler: answer(decorator)},
		{reason: "customize", kind: hook.KindCustomize,
			request: hookapi.CustomizeRequest{Controller: ctrl, Parent: parent},
			sdkReq:  func() any { return new(hook.CustomizeRequest) }, sdkResp: customize,
			apiResp: func() any { return new(hookapi.CustomizeResponse) }, handler: answer(customize)},
		{reason: "map", kind: hook.KindMap,
			request: hookapi.MapRequest{Controller: ctrl, Parent: parent, MapKey: "k", Input: obj("v1", "ConfigMap", "ns", "in"), Outputs: pods},
			sdkReq:  func() any { return new(hook.MapRequest) }, sdkResp: mapResp,
			apiResp: func() any { return new(hookapi.MapResponse) }, handler: answer(mapResp)},
		{reason: "tombstone", kind: hook.KindTombstone,
			request: hookapi.TombstoneRequest{Controller: ctrl, Parent: parent, MapKey: "k", Outputs: pods},
			sdkReq:  func() any { return new(hook.TombstoneRequest) }, sdkResp: tomb,
			apiResp: func() any { return new(hookapi.TombstoneResponse) }, handler: answer(tomb)},
	}
}

// TestWireEqualsHookapi holds the SDK's types equal on the wire to what
// metabus encodes and decodes: every request metabus encodes decodes into
// the SDK's type and encodes back to the same JSON, and every SDK response
// decodes through pkg/hookapi (strictly: no field the dispatcher does not
// know) to the same JSON.
func TestWireEqualsHookapi(t *testing.T) {
	var enc hookapi.Encoder
	for _, tc := range wireCases() {
		t.Run(tc.reason, func(t *testing.T) {
			sent, err := enc.Encode(tc.request)
			if err != nil {
				t.Fatal(err)
			}
			req := tc.sdkReq()
			if err := json.Unmarshal(sent, req); err != nil {
				t.Fatalf("the SDK cannot decode metabus's request: %v", err)
			}
			again, err := json.Marshal(req)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(jsonValue(t, sent), jsonValue(t, again)); diff != "" {
				t.Errorf("request changed through the SDK's type (-metabus +sdk):\n%s", diff)
			}

			answer, err := json.Marshal(tc.sdkResp)
			if err != nil {
				t.Fatal(err)
			}
			resp := tc.apiResp()
			if err := hookapi.Decode(answer, true, resp); err != nil {
				t.Fatalf("metabus refuses the SDK's response: %v", err)
			}
			back, err := json.Marshal(resp)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(jsonValue(t, answer), jsonValue(t, back), cmp.FilterPath(zeroOmitted, cmp.Ignore())); diff != "" {
				t.Errorf("response changed through pkg/hookapi (-sdk +metabus):\n%s", diff)
			}
		})
	}
}

// zeroOmitted ignores the fields the SDK leaves out when zero and
// pkg/hookapi writes (both read them as zero).
func zeroOmitted(p cmp.Path) bool {
	if len(p) == 0 {
		return false
	}
	mi, ok := p.Last().(cmp.MapIndex)
	if !ok {
		return false
	}
	k := mi.Key().String()
	return len(p) == 2 && (k == "resyncAfterSeconds" || k == "finalized")
}

// TestFieldsEqualHookapi fails when pkg/hookapi gains a field that the
// SDK's type lacks (or the reverse).
func TestFieldsEqualHookapi(t *testing.T) {
	pairs := []struct {
		reason   string
		sdk, api any
	}{
		{"composite request", hook.CompositeRequest{}, hookapi.CompositeSyncRequest{}},
		{"composite response", hook.CompositeResponse{}, hookapi.CompositeSyncResponse{}},
		{"decorator request", hook.DecoratorRequest{}, hookapi.DecoratorSyncRequest{}},
		{"decorator response", hook.DecoratorResponse{}, hookapi.DecoratorSyncResponse{}},
		{"customize request", hook.CustomizeRequest{}, hookapi.CustomizeRequest{}},
		{"customize response", hook.CustomizeResponse{}, hookapi.CustomizeResponse{}},
		{"related resource rule", hook.RelatedResourceRule{}, hookapi.RelatedResourceRule{}},
		{"map request", hook.MapRequest{}, hookapi.MapRequest{}},
		{"map response", hook.MapResponse{}, hookapi.MapResponse{}},
		{"tombstone request", hook.TombstoneRequest{}, hookapi.TombstoneRequest{}},
		{"tombstone response", hook.TombstoneResponse{}, hookapi.TombstoneResponse{}},
	}
	for _, p := range pairs {
		t.Run(p.reason, func(t *testing.T) {
			if diff := cmp.Diff(jsonNames(p.api), jsonNames(p.sdk)); diff != "" {
				t.Errorf("JSON fields differ (-hookapi +sdk):\n%s", diff)
			}
		})
	}
}

func jsonNames(v any) []string {
	t := reflect.TypeOf(v)
	var out []string
	for i := range t.NumField() {
		name, _, _ := strings.Cut(t.Field(i).Tag.Get("json"), ",")
		out = append(out, name)
	}
	slices.Sort(out)
	return out
}

func jsonValue(t *testing.T, data []byte) any {
	t.Helper()
	var v any
	if err := json.Unmarshal(data, &v); err != nil {
		t.Fatalf("%v: %s", err, data)
	}
	return v
}

// TestThroughMetabusClient calls an SDK handler through metabus's real
// hook client (pkg/hooks) for every hook kind. The client sends a
// binary-mode CloudEvent; to check that it also accepts the SDK's other
// answers, the request is rewritten on its way into plain JSON or a
// structured-mode CloudEvent, which the SDK answers in kind. In each mode
// the request reaches the handler decoded, with its CloudEvents attributes,
// and the client accepts the answer and decodes the same response.
func TestThroughMetabusClient(t *testing.T) {
	client := hooks.New(hooks.Options{})
	for _, tc := range wireCases() {
		for _, mode := range hooktest.Modes {
			t.Run(tc.reason+"/"+mode.String(), func(t *testing.T) {
				var got *hook.Call
				h := hook.HandlerFunc(func(ctx context.Context, call *hook.Call) ([]byte, error) {
					got = call
					return tc.handler.ServeHook(ctx, call)
				})
				srv := httptest.NewServer(asMode(t, mode, hook.HTTPHandler(h)))
				defer srv.Close()
				url := srv.URL + "/" + tc.kind
				callThroughClient(t, client, &v1alpha1.Hook{Webhook: &v1alpha1.Webhook{URL: &url}}, tc)
				if got == nil || got.Mode != mode {
					t.Fatalf("call %+v, want mode %s", got, mode)
				}
				if mode != hook.ModePlain && (got.Kind() != tc.kind || got.Extensions["parentuid"] != "uid-p" ||
					got.Extensions["workseq"] != "00000000000000000042" || got.Subject == "") {
					t.Errorf("call attributes %+v", got)
				}
				if err := json.Unmarshal(got.Data, tc.sdkReq()); err != nil {
					t.Errorf("the request data does not decode: %v", err)
				}
			})
		}
	}
}

// callThroughClient calls tc's hook kind at h with metabus's client, for
// controller c's parent ns/p (uid uid-p) at work sequence 42, and checks
// that the answer decodes as the SDK handler's response does.
func callThroughClient(t *testing.T, client *hooks.Client, h *v1alpha1.Hook, tc wireCase) {
	t.Helper()
	item := hooks.Item{ControllerName: "c", WorkSeq: 42}
	item.Controller.Kind, item.Controller.Name = "CompositeController", "c"
	item.Parent.Namespace, item.Parent.Name, item.Parent.UID = "ns", "p", "uid-p"
	call := item.SyncCall(h, tc.kind, "", tc.request)
	resp := tc.apiResp()
	if err := client.Do(context.Background(), call, resp); err != nil {
		t.Fatalf("metabus's client: %v", err)
	}
	want := tc.apiResp()
	answer, _ := json.Marshal(tc.sdkResp)
	if err := hookapi.Decode(answer, true, want); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(want, resp); diff != "" {
		t.Errorf("decoded answer (-want +got):\n%s", diff)
	}
}

// asMode rewrites the binary-mode request metabus's client sends into
// mode before next sees it.
func asMode(t *testing.T, mode hook.Mode, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if mode == hook.ModeBinary {
			next.ServeHTTP(w, r)
			return
		}
		ev, err := binding.ToEvent(r.Context(), cehttp.NewMessageFromHttpRequest(r))
		if err != nil {
			t.Errorf("metabus's request is not a CloudEvent: %v", err)
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		for k := range r.Header {
			if strings.HasPrefix(strings.ToLower(k), "ce-") {
				r.Header.Del(k)
			}
		}
		body := ev.Data()
		if mode == hook.ModeStructured {
			if body, err = json.Marshal(ev); err != nil {
				t.Error(err)
			}
			r.Header.Set("Content-Type", "application/cloudevents+json")
		}
		r.Body, r.ContentLength = io.NopCloser(bytes.NewReader(body)), int64(len(body))
		next.ServeHTTP(w, r)
	})
}

// TestThroughMetabusClientNATS: the same round trip as
// TestThroughMetabusClient over NATS, metabus's client requesting (in both
// CloudEvents modes a controller may ask for) and ServeNATS answering.
func TestThroughMetabusClientNATS(t *testing.T) {
	nc := natsConn(t)
	client := hooks.New(hooks.Options{NATS: nc})
	for _, tc := range wireCases() {
		var got *hook.Call
		subject := "hooks.wire." + tc.kind
		serveNATS(t, nc, subject, hook.HandlerFunc(func(ctx context.Context, call *hook.Call) ([]byte, error) {
			if call.Mode != hook.ModePlain { // serveNATS's readiness probe is plain
				got = call
			}
			return tc.handler.ServeHook(ctx, call)
		}))
		for _, mode := range []v1alpha1.CloudEventsMode{v1alpha1.CloudEventsBinary, v1alpha1.CloudEventsStructured} {
			t.Run(tc.reason+"/"+string(mode), func(t *testing.T) {
				got = nil
				callThroughClient(t, client, &v1alpha1.Hook{NATS: &v1alpha1.NATSHook{Subject: subject, CloudEvents: &mode}}, tc)
				wantMode := map[v1alpha1.CloudEventsMode]hook.Mode{v1alpha1.CloudEventsBinary: hook.ModeBinary, v1alpha1.CloudEventsStructured: hook.ModeStructured}[mode]
				if got == nil || got.Mode != wantMode {
					t.Fatalf("call %+v, want mode %s", got, wantMode)
				}
				if got.Kind() != tc.kind || got.Extensions["parentuid"] != "uid-p" || got.Extensions["workseq"] != "00000000000000000042" ||
					!strings.HasSuffix(got.Subject, "/namespaces/ns/p") && !strings.HasSuffix(got.Subject, "/p") {
					t.Errorf("call attributes %+v", got)
				}
				if err := json.Unmarshal(got.Data, tc.sdkReq()); err != nil {
					t.Errorf("the request data does not decode: %v", err)
				}
			})
		}
	}
}
