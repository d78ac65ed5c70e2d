package applier

import (
	"context"
	"testing"

	"github.com/google/go-cmp/cmp"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/metabus/metabus/pkg/bus"
	"github.com/metabus/metabus/pkg/snapshot"
)

// TestStaleAnswerAfterFinalize replays what a clustered fault run showed
// in etcd's history of one parent: a dispatcher cut from NATS in the
// middle of a sync published that sync's answer (generation 3, the child
// wanted) and gave up; another dispatcher finalized the parent (generation
// 5 after the deletion) and its answer was applied, deleting the child;
// then the cut healed and the held publish was stored, after the newer
// answer, so the bus ran it. Applied, it created the child again for a
// parent being finalized (a second ConfigMap for the same parent UID).
// The applier must take it for what it is, an answer the parent has moved
// past, and sync again instead of writing anything.
func TestStaleAnswerAfterFinalize(t *testing.T) {
	finalized := func(p *unstructured.Unstructured) {
		p.SetGeneration(5)
		p.Object["status"] = map[string]any{"observedGeneration": int64(5)}
	}
	tests := []struct {
		reason    string
		parent    *unstructured.Unstructured
		hook      string
		gen       int64
		want      string
		wantCalls []string
	}{
		{
			reason: "the held sync answer of generation 3, after the finalize answer of generation 5 deleted the child: nothing written, synced again",
			parent: thing(deletingNow, holding(ccFinalizer), finalized), hook: bus.HookSync, gen: 3,
			want: "conflict (attempt 0)",
		},
		{
			reason: "a sync answer held up while the parent was being deleted, before any finalize answer was applied: the finalize hook decides",
			parent: thing(deletingNow, holding(ccFinalizer)), hook: bus.HookSync, gen: 2,
			want: "conflict (attempt 0)",
		},
		{
			reason: "the finalize answer of the current generation is applied: the child stays deleted, the status records it",
			parent: thing(deletingNow, holding(ccFinalizer), finalized, func(p *unstructured.Unstructured) { p.Object["status"] = map[string]any{} }),
			hook:   bus.HookFinalize, gen: 5,
			want:      resultOK,
			wantCalls: []string{"update things/status web"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.reason, func(t *testing.T) {
			a, dyn := testApplier(t, tt.parent.DeepCopy())
			cc := compositeController(true)
			ds := bus.DesiredState{
				Controller: bus.ControllerRef{Kind: cc.GetKind(), Name: cc.GetName(), UID: string(cc.GetUID())},
				Parent:     bus.ObjectRef{APIVersion: "example.com/v1", Kind: "Thing", Resource: "things", Namespace: "ns", Name: "web", UID: "p-uid", Generation: tt.gen},
				Hook:       tt.hook,
			}
			if tt.hook == bus.HookSync {
				ds.Children = []*unstructured.Unstructured{desiredCM("a")}
				ds.Status = map[string]any{"childCount": float64(1)}
			}
			snap := &snapshot.Response{Result: snapshot.OK, Controller: cc, Parent: tt.parent, ParentResource: "things", ParentHasStatus: true,
				Children: []snapshot.Group{{APIVersion: "v1", Resource: "configmaps", Kind: "ConfigMap", Namespaced: true}}}
			if got := outcome(a.applyParent(context.Background(), &ds, snap)); got != tt.want {
				t.Errorf("outcome %q, want %q", got, tt.want)
			}
			if diff := cmp.Diff(tt.wantCalls, calls(dyn)); diff != "" {
				t.Errorf("API calls (-want +got):\n%s", diff)
			}
		})
	}
}
