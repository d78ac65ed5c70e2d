package dispatcher

import (
	"context"
	"testing"
	"time"

	"github.com/metabus/metabus/pkg/bus"
	"github.com/metabus/metabus/pkg/echo"
)

// TestFailureCountsForgetStaleParents (issue #13, defect 13): a parent
// whose retries another replica took over (or that was deleted while
// failing) is forgotten; before, the map only shrank on a success here.
func TestFailureCountsForgetStaleParents(t *testing.T) {
	var f failureCounts
	t0 := time.Unix(1000, 0)
	f.record("moved-away", 3, t0)
	f.record("still-failing", 1, t0)
	f.record("still-failing", 2, t0.Add(8*time.Minute))
	if got := f.get("moved-away"); got != 3 {
		t.Fatalf("count %d, want 3", got)
	}
	f.record("other", 1, t0.Add(11*time.Minute))
	if got := f.get("moved-away"); got != 0 {
		t.Errorf("a parent untouched for 11 min still counts %d failures", got)
	}
	if got := f.get("still-failing"); got != 2 {
		t.Errorf("a parent failing 3 min ago lost its count: %d", got)
	}
	if f.len() != 2 {
		t.Errorf("%d entries, want 2", f.len())
	}
	f.forget("still-failing")
	if f.get("still-failing") != 0 {
		t.Error("forget kept the count")
	}
}

// TestEchoNotSkippedAfterFailure: an event item that would be an echo of
// the hook's last answer still calls the hook when the parent's latest
// call failed here: the failure's retry may have been folded into this
// item (the parent's queue was full), and skipping it lost the retry.
func TestEchoNotSkippedAfterFailure(t *testing.T) {
	item := bus.WorkItem{Controller: bus.ControllerRef{Kind: "CompositeController", Name: "c"}, Parent: bus.ObjectRef{UID: "p1"}, Reason: bus.ReasonEvent}
	inputs := map[string]string{"p1": "10", "child": "11"}
	for _, tc := range []struct {
		reason   string
		failures int
		itemWhy  string
		want     bool
	}{
		{reason: "nothing failed: the event only echoes the last answer", itemWhy: bus.ReasonEvent, want: true},
		{reason: "the last call failed: call the hook", failures: 1, itemWhy: bus.ReasonEvent, want: false},
		{reason: "a retry always calls the hook", itemWhy: bus.ReasonRetry, want: false},
	} {
		t.Run(tc.reason, func(t *testing.T) {
			d := &Dispatcher{echoes: echo.NewBook(0)}
			d.echoes.Called(item.Controller.ID(), item.Parent.UID, item.MapKey, 1, inputs)
			it := item
			it.Reason = tc.itemWhy
			if tc.failures > 0 {
				d.failures.record(d.failureKey(it), tc.failures, time.Now())
			}
			if got := d.echoed(context.Background(), it, inputs); got != tc.want {
				t.Errorf("echoed = %v, want %v", got, tc.want)
			}
		})
	}
}
