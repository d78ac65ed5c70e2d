package outcome

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestWait(t *testing.T) {
	now := time.Date(2026, 11, 28, 12, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		reason  string
		o       Outcome
		counted int
		want    time.Duration
	}{
		{reason: "a first retry waits its delay", o: Retry(time.Second, 0), counted: 1, want: time.Second},
		{reason: "the runtime's count doubles the wait per retry", o: Retry(time.Second, 0), counted: 3, want: 4 * time.Second},
		{reason: "the handler's attempt wins over the runtime's count", o: Retry(time.Second, 2), counted: 7, want: 2 * time.Second},
		{reason: "a growing wait stops at MaxRetryWait", o: Retry(time.Second, 0), counted: 40, want: MaxRetryWait},
		{reason: "a delay above MaxRetryWait is kept, not cut", o: Retry(time.Minute, 3), want: time.Minute},
		{reason: "a retry counted by nobody waits its delay", o: Retry(10*time.Millisecond, 0), want: 10 * time.Millisecond},
		{reason: "a retry without a delay grows from 100 ms", o: Retry(0, 2), want: 200 * time.Millisecond},
		{reason: "a retry at a time waits until then", o: RetryAt(now.Add(3 * time.Second)), counted: 5, want: 3 * time.Second},
		{reason: "a retry at a time already past waits 100 ms", o: RetryAt(now.Add(-time.Second)), want: 100 * time.Millisecond},
		{reason: "a throttled message waits exactly its delay, whatever the count", o: Throttled(7 * time.Second), counted: 5, want: 7 * time.Second},
		{reason: "done does not wait", o: Done(), counted: 3, want: 0},
		{reason: "terminal does not wait", o: Terminal("malformed"), want: 0},
		{reason: "no outcome does not wait", o: Outcome{}, want: 0},
	} {
		t.Run(tc.reason, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, tc.o.Wait(now, tc.counted)); diff != "" {
				t.Errorf("Wait (-want +got):\n%s", diff)
			}
		})
	}
}

func TestRetriesAndString(t *testing.T) {
	at := time.Date(2026, 11, 28, 12, 0, 0, 0, time.UTC)
	type got struct {
		Retries bool
		String  string
	}
	for _, tc := range []struct {
		reason string
		o      Outcome
		want   got
	}{
		{reason: "done", o: Done(), want: got{false, "done"}},
		{reason: "retry without attempt", o: Retry(time.Second, 0), want: got{true, "retry after 1s"}},
		{reason: "retry with attempt", o: Retry(2*time.Second, 2), want: got{true, "retry after 2s (attempt 2)"}},
		{reason: "retry at", o: RetryAt(at), want: got{true, "retry at 2026-11-28T12:00:00Z"}},
		{reason: "terminal", o: Terminal("malformed work item"), want: got{false, "terminal: malformed work item"}},
		{reason: "throttled", o: Throttled(5 * time.Second), want: got{true, "throttled for 5s"}},
		{reason: "the zero outcome is none", o: Outcome{}, want: got{false, "none"}},
		{reason: "an unknown kind says its number", o: Outcome{Kind: 99}, want: got{false, "outcome kind 99"}},
	} {
		t.Run(tc.reason, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, got{tc.o.Retries(), tc.o.String()}); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}
