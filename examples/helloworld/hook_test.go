package helloworld

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/metabus/metabus/sdk/hook"
	"github.com/metabus/metabus/sdk/hook/hooktest"
)

// TestSync calls the hook as metabus and a legacy caller would (plain
// JSON, binary and structured CloudEvents), from a fixture and from a
// typed request, without a cluster.
func TestSync(t *testing.T) {
	h := hook.Composite(Sync)
	parent := func(who string) *unstructured.Unstructured {
		u := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "example.com/v1", "kind": "HelloWorld"}}
		u.SetName("p")
		if who != "" {
			_ = unstructured.SetNestedField(u.Object, who, "spec", "who")
		}
		return u
	}
	cases := []struct {
		reason      string
		resp        func(t testing.TB) *hook.CompositeResponse
		wantPod     string
		wantCommand []any
		wantPods    int64
	}{
		{reason: "the fixture's parent greets its who, and status counts the observed Pod",
			resp: func(t testing.TB) *hook.CompositeResponse {
				return hooktest.CallFile[hook.CompositeResponse](t, h, hook.KindSync, "testdata/sync-request.json")
			},
			wantPod: "your-name", wantCommand: []any{"echo", "Hello, Your Name!"}, wantPods: 1},
		{reason: "a parent without spec.who greets the World, with no Pod observed yet",
			resp: func(t testing.TB) *hook.CompositeResponse {
				return hooktest.Call[hook.CompositeResponse](t, h, hook.KindSync, &hook.CompositeRequest{Parent: parent(""), Children: hook.ObjectMap{"Pod.v1": nil}})
			},
			wantPod: "p", wantCommand: []any{"echo", "Hello, World!"}, wantPods: 0},
	}
	for _, tc := range cases {
		t.Run(tc.reason, func(t *testing.T) {
			resp := tc.resp(t)
			if diff := cmp.Diff(map[string]any{"pods": tc.wantPods}, resp.Status); diff != "" {
				t.Errorf("status (-want +got):\n%s", diff)
			}
			if len(resp.Children) != 1 {
				t.Fatalf("%d children, want one Pod", len(resp.Children))
			}
			pod := resp.Children[0]
			cs, _, _ := unstructured.NestedSlice(pod.Object, "spec", "containers")
			var cmd any
			if len(cs) == 1 {
				cmd = cs[0].(map[string]any)["command"]
			}
			if diff := cmp.Diff([]any{pod.GetKind(), pod.GetName(), cmd}, []any{"Pod", tc.wantPod, tc.wantCommand}); diff != "" {
				t.Errorf("pod kind, name, command (-got +want):\n%s", diff)
			}
		})
	}
}

// TestSyncRefusesNoParent: a request without a parent is the caller's
// mistake (400), not a hook failure.
func TestSyncRefusesNoParent(t *testing.T) {
	for _, mode := range hooktest.Modes {
		reply, err := hooktest.Do(hook.Composite(Sync), mode, hook.KindSync, []byte(`{"children":{}}`))
		if err != nil {
			t.Fatal(err)
		}
		if reply.Code != 400 {
			t.Errorf("%s: code %d (%s), want 400", mode, reply.Code, reply.Message)
		}
	}
}
