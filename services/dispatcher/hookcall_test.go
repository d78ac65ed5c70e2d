package dispatcher

import (
	"math"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestResyncDelay(t *testing.T) {
	type result struct {
		Delay time.Duration
		OK    bool
	}
	tests := []struct {
		reason  string
		seconds float64
		want    result
	}{
		{reason: "0 asks for no resync", seconds: 0, want: result{}},
		{reason: "a negative value asks for no resync", seconds: -5, want: result{}},
		{reason: "NaN asks for no resync", seconds: math.NaN(), want: result{}},
		{reason: "-Inf asks for no resync", seconds: math.Inf(-1), want: result{}},
		{reason: "fractions of a second are kept", seconds: 0.25, want: result{250 * time.Millisecond, true}},
		{reason: "seconds", seconds: 30, want: result{30 * time.Second, true}},
		{reason: "exactly the maximum", seconds: maxResyncAfter.Seconds(), want: result{maxResyncAfter, true}},
		{reason: "above the maximum is clamped", seconds: maxResyncAfter.Seconds() + 1, want: result{maxResyncAfter, true}},
		{reason: "a year is clamped", seconds: 365 * 24 * 3600, want: result{maxResyncAfter, true}},
		{reason: "just below the overflow of time.Duration is clamped", seconds: 9.2e9, want: result{maxResyncAfter, true}},
		{reason: "beyond the overflow of time.Duration is clamped, not negative", seconds: 9.3e9, want: result{maxResyncAfter, true}},
		{reason: "the largest float is clamped", seconds: math.MaxFloat64, want: result{maxResyncAfter, true}},
		{reason: "+Inf is clamped", seconds: math.Inf(1), want: result{maxResyncAfter, true}},
	}
	for _, tt := range tests {
		t.Run(tt.reason, func(t *testing.T) {
			var got result
			got.Delay, got.OK = resyncDelay(tt.seconds)
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("resyncDelay(%v) (-want +got):\n%s", tt.seconds, diff)
			}
		})
	}
}
