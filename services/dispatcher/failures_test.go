package dispatcher

import (
	"testing"
	"time"
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
