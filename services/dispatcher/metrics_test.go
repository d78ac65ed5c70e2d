package dispatcher

import "testing"

// A run of a work item is a new delivery unless the previous run of the
// same delivery asked for an in-place retry.
func TestDelivered(t *testing.T) {
	m := newMetrics(nil)
	for _, step := range []struct {
		reason         string
		seq, delivered uint64
		retryAfter     bool
		want           bool
	}{
		{reason: "a first delivery", seq: 7, delivered: 1, retryAfter: true, want: true},
		{reason: "its in-place retry is not a new delivery", seq: 7, delivered: 1, want: false},
		{reason: "a later run of the same delivery, not retried in place, is", seq: 7, delivered: 1, want: true},
		{reason: "a redelivery after an in-place retry mark is a new delivery", seq: 8, delivered: 1, retryAfter: true, want: true},
		{reason: "the server's redelivery (delivered 2) is new", seq: 8, delivered: 2, want: true},
	} {
		if got := m.delivered(step.seq, step.delivered); got != step.want {
			t.Errorf("%s: delivered(%d, %d) = %v, want %v", step.reason, step.seq, step.delivered, got, step.want)
		}
		if step.retryAfter {
			m.retryInPlace(step.seq, step.delivered)
		}
	}
	for i := range uint64(maxRetrying + 10) {
		m.retryInPlace(1000+i, 1)
	}
	if n := len(m.retrying); n > maxRetrying {
		t.Errorf("%d in-place retries remembered, want at most %d", n, maxRetrying)
	}
}
