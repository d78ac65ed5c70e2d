package dispatcher

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"

	"github.com/metabus/metabus/pkg/api/v1alpha1"
	"github.com/metabus/metabus/pkg/apply"
	"github.com/metabus/metabus/pkg/bus"
	"github.com/metabus/metabus/pkg/echo"
	"github.com/metabus/metabus/pkg/outcome"
	"github.com/metabus/metabus/pkg/snapshot"
)

// TestUnchangedAnswer: a sync answer that would write nothing against the
// snapshot its hook was shown is settled without a desired state (no bus
// message, no applier snapshot, no Done note), its resyncAfterSeconds
// still arranged; any answer that would write, or whose judgment this
// dispatcher cannot make alone, is published as before.
func TestUnchangedAnswer(t *testing.T) {
	h := newHookServer(t)
	snaps := &scriptedSnapshots{}
	d, js, _ := testDispatcher(t, snaps, nil)

	// converged is a parent at spec.x "a" whose status and child already
	// are what the hook answers for it.
	converged := func(uid string) (*unstructured.Unstructured, []*unstructured.Unstructured) {
		p := thing(uid, "a")
		p.Object["status"] = map[string]any{"x": "a", "observedGeneration": int64(0)}
		c := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "v1", "kind": "ConfigMap"}}
		c.SetNamespace("ns")
		c.SetName("c-a")
		c.SetUID(types.UID("child-" + uid))
		c.SetResourceVersion("11")
		isController := true
		c.SetOwnerReferences([]metav1.OwnerReference{{APIVersion: "example.com/v1", Kind: "Thing", Name: p.GetName(), UID: p.GetUID(), Controller: &isController}})
		return p, []*unstructured.Unstructured{c}
	}
	tests := []struct {
		reason   string
		strategy apply.Strategy
		// notes are the strategies the appliers' Done notes reported
		// before the sync (a separate dispatcher's only knowledge of it).
		notes []string
		path  string // the sync hook's path on the hook server
		echo  bool   // the controller opted into echo suppression
		// applying: an earlier answer of this dispatcher for the parent
		// is still being applied.
		applying bool
		// change alters the converged parent and children before the sync.
		change        func(p *unstructured.Unstructured, cs []*unstructured.Unstructured) []*unstructured.Unstructured
		wantResult    string
		wantPublished bool
		wantResync    bool
	}{
		{
			reason:     "an answer that changes nothing is settled unpublished",
			strategy:   apply.DynamicApply,
			path:       "/sync",
			wantResult: resultUnchanged,
		},
		{
			reason:     "an unpublished answer's resyncAfterSeconds is still scheduled",
			strategy:   apply.DynamicApply,
			path:       "/resync",
			wantResult: resultUnchanged,
			wantResync: true,
		},
		{
			reason:   "a status that differs is published",
			strategy: apply.DynamicApply,
			path:     "/sync",
			change: func(p *unstructured.Unstructured, cs []*unstructured.Unstructured) []*unstructured.Unstructured {
				p.Object["status"] = map[string]any{"x": "old", "observedGeneration": int64(0)}
				return cs
			},
			wantResult: "ok", wantPublished: true,
		},
		{
			reason:   "a missing child is published (it must be created)",
			strategy: apply.DynamicApply,
			path:     "/sync",
			change: func(*unstructured.Unstructured, []*unstructured.Unstructured) []*unstructured.Unstructured {
				return nil
			},
			wantResult: "ok", wantPublished: true,
		},
		{
			reason:   "an undesired child is published (it must be deleted)",
			strategy: apply.DynamicApply,
			path:     "/sync",
			change: func(_ *unstructured.Unstructured, cs []*unstructured.Unstructured) []*unstructured.Unstructured {
				extra := cs[0].DeepCopy()
				extra.SetName("c-stale")
				extra.SetUID(types.UID("stale"))
				return append(cs, extra)
			},
			wantResult: "ok", wantPublished: true,
		},
		{
			reason:        "with the appliers' strategy unknown every answer is published",
			path:          "/sync",
			wantResult:    "ok",
			wantPublished: true,
		},
		{
			reason:        "under server-side apply every answer is published (upstream applies every child each sync)",
			strategy:      apply.ServerSideApply,
			path:          "/sync",
			wantResult:    "ok",
			wantPublished: true,
		},
		{
			reason:        "with echo suppression opted in the answer is published (its Done note carries the inputs)",
			strategy:      apply.DynamicApply,
			path:          "/sync",
			echo:          true,
			wantResult:    "ok",
			wantPublished: true,
		},
		{
			reason:     "a separate dispatcher learns dynamic apply from the appliers' Done notes and settles the answer unpublished",
			notes:      []string{"dynamic-apply", "dynamic-apply"},
			path:       "/sync",
			wantResult: "unchanged",
		},
		{
			reason:        "appliers reporting two strategies (one being moved to another): every answer is published",
			notes:         []string{"dynamic-apply", "server-side-apply"},
			path:          "/sync",
			wantResult:    "ok",
			wantPublished: true,
		},
		{
			reason:        "an applier too old to report its strategy makes it unknown: every answer is published",
			notes:         []string{"dynamic-apply", ""},
			path:          "/sync",
			wantResult:    "ok",
			wantPublished: true,
		},
		{
			reason:        "appliers reporting server-side apply: every answer is published",
			notes:         []string{"server-side-apply"},
			path:          "/sync",
			wantResult:    "ok",
			wantPublished: true,
		},
		{
			reason:        "while an earlier answer is still being applied the answer is published",
			strategy:      apply.DynamicApply,
			path:          "/sync",
			applying:      true,
			wantResult:    "ok",
			wantPublished: true,
		},
	}
	for i, tc := range tests {
		t.Run(tc.reason, func(t *testing.T) {
			uid := fmt.Sprintf("n%d", i)
			d.cfg.ApplyStrategy = tc.strategy
			// A book of its own per case: what appliers reported is
			// process-wide.
			d.echoes = echo.NewBook(0)
			for j, st := range tc.notes {
				d.echoes.Record(&bus.Applied{Controller: bus.ControllerRef{Kind: "CompositeController", Name: "other", UID: "other"},
					ParentUID: fmt.Sprintf("other-%d", j), WorkSeq: uint64(j + 1), Done: true, Strategy: st})
			}
			ctrl := controllerObject(t, v1alpha1.CompositeControllerKind, "cc-"+uid, "ctrl-"+uid, map[string]any{
				"parentResource": map[string]any{"apiVersion": "example.com/v1", "resource": "things"},
				"childResources": []any{map[string]any{"apiVersion": "v1", "resource": "configmaps"}}, "generateSelector": true,
				"hooks": map[string]any{"sync": map[string]any{"webhook": map[string]any{"url": h.srv.URL + tc.path}}},
			})
			if tc.echo {
				ctrl.SetAnnotations(map[string]string{bus.SuppressEchoesAnnotation: "true"})
			}
			parent, children := converged(uid)
			if tc.change != nil {
				children = tc.change(parent, children)
			}
			snaps.mu.Lock()
			snaps.answer = func(snapshot.Request) (*snapshot.Response, error) {
				return &snapshot.Response{Result: snapshot.OK, Controller: ctrl, Parent: parent, ParentResource: "things",
					Children: []snapshot.Group{{APIVersion: "v1", Kind: "ConfigMap", Resource: "configmaps", Namespaced: true, Objects: children}}}, nil
			}
			snaps.mu.Unlock()
			item := bus.WorkItem{
				Controller: bus.ControllerRef{Kind: v1alpha1.CompositeControllerKind, Name: "cc-" + uid, UID: "ctrl-" + uid},
				Parent: bus.ObjectRef{APIVersion: "example.com/v1", Kind: "Thing", Resource: "things", Namespace: "ns",
					Name: "p-" + uid, UID: uid},
				Reason: bus.ReasonEvent,
			}
			if tc.applying {
				d.echoes.Expect(item.Controller.ID(), item.Parent.UID, "", 1)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			result, out := d.resolve(ctx, item, d.syncParent(ctx, item, 42))
			got := struct {
				Result            string
				Outcome           outcome.Outcome
				Hooks             []string
				Published, Resync bool
			}{Result: result, Outcome: out, Hooks: h.taken(), Published: lastDesired(t, js, item) != nil}
			if r := lastRetry(t, js, item); r != nil {
				got.Resync = r.Reason == bus.ReasonResyncAfter
			}
			want := got
			want.Result, want.Outcome, want.Hooks = tc.wantResult, outcome.Done(), []string{"sync p-" + uid + " x=a"}
			want.Published, want.Resync = tc.wantPublished, tc.wantResync
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("sync (-want +got):\n%s", diff)
			}
			// The call is recorded either way: an event that would show
			// the hook the same again is merged into it.
			shown, _ := snaps.answer(snapshot.Request{})
			if !d.echoes.Shown(item.Controller.ID(), uid, "", echo.Inputs(shown)) {
				t.Error("the hook call was not recorded as shown")
			}
		})
	}
}
