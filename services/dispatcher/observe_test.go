package dispatcher

import (
	"context"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/rest"

	"github.com/metabus/metabus/internal/testing/natstest"
	"github.com/metabus/metabus/pkg/bus"
	"github.com/metabus/metabus/pkg/jsbus"
	"github.com/metabus/metabus/pkg/kinds"
	"github.com/metabus/metabus/pkg/outcome"
	"github.com/metabus/metabus/pkg/snapshot"
)

// fakeSnapshots answers Invalid when asked with related rules (as the
// watcher does when it cannot register them) and OK otherwise.
type fakeSnapshots struct{ asked []*bus.RelatedRules }

func (f *fakeSnapshots) Snapshot(_ context.Context, req snapshot.Request) (*snapshot.Response, error) {
	f.asked = append(f.asked, req.Related)
	if req.Related != nil {
		return &snapshot.Response{Result: snapshot.Invalid, Message: "no resource widgets.gone.example"}, nil
	}
	return &snapshot.Response{Result: snapshot.OK, Parent: &unstructured.Unstructured{}, Controller: &unstructured.Unstructured{}}, nil
}

// TestUnservableCachedRelatedRules (issue 13 #9): cached related rules the
// watcher can no longer serve must not wedge the parent. The sync fails
// with a retry scheduled (not acked quietly), and the cache is dropped so
// the retry asks the customize hook again.
func TestUnservableCachedRelatedRules(t *testing.T) {
	nc, js := natstest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := jsbus.Ensure(ctx, js, bus.Options{}); err != nil {
		t.Fatal(err)
	}
	snaps := &fakeSnapshots{}
	// No API server: the Event recorder's writes fail in the background,
	// which is all this test needs of it.
	d, err := New(Config{}, Deps{REST: &rest.Config{Host: "http://127.0.0.1:1"}, NC: nc, JS: js, Snapshots: snaps})
	if err != nil {
		t.Fatal(err)
	}
	item := bus.WorkItem{
		Controller: bus.ControllerRef{Kind: "CompositeController", Name: "c"},
		Parent:     bus.ObjectRef{APIVersion: "example.com/v1", Kind: "Thing", Resource: "things", Namespace: "ns", Name: "a", UID: "u1"},
		Reason:     bus.ReasonEvent,
	}
	d.customize[relatedKey(item)] = customizeEntry{generation: 1, rules: &bus.RelatedRules{Controller: item.Controller, ParentUID: "u1"}}

	_, _, err = d.observe(ctx, item, 7, kinds.Kind{})
	if err == nil {
		t.Fatal("observe succeeded with related rules the watcher cannot serve")
	}
	if result, out := d.resolve(ctx, item, err); result != "error" || out != outcome.Done() {
		t.Errorf("settled as %q (%s), want a failed sync with a retry scheduled (done)", result, out)
	}
	if _, cached := d.customize[relatedKey(item)]; cached {
		t.Error("the unservable rules are still cached: every retry would fail the same way")
	}
	st, err := js.Stream(ctx, bus.SchedStream)
	if err != nil {
		t.Fatal(err)
	}
	subject, err := bus.SchedSubject(item.Controller.ID(), item.Parent.UID)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.GetLastMsgForSubject(ctx, subject); err != nil {
		t.Errorf("no retry scheduled for the parent: %v", err)
	}
}
