package bus

import (
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestWeightPolicyGrant(t *testing.T) {
	cc := ControllerID("CompositeController", "tenant")
	other := ControllerID("CompositeController", "other")
	cases := []struct {
		reason string
		policy WeightPolicy
		ctrl   string
		asked  int
		want   int
	}{
		{reason: "no policy: the annotation's weight, as before", ctrl: cc, asked: 100, want: 100},
		{reason: "no weight asked is 1", ctrl: cc, asked: 0, want: 1},
		{reason: "a negative weight is 1", ctrl: cc, asked: -5, want: 1},
		{reason: "Max 1 ignores the annotation", policy: WeightPolicy{Max: 1}, ctrl: cc, asked: 100, want: 1},
		{reason: "Max bounds a larger weight", policy: WeightPolicy{Max: 4}, ctrl: cc, asked: 100, want: 4},
		{reason: "Max does not raise a smaller weight", policy: WeightPolicy{Max: 4}, ctrl: cc, asked: 2, want: 2},
		{reason: "a Max above MaxWeight is MaxWeight", policy: WeightPolicy{Max: 1000}, ctrl: cc, asked: 500, want: MaxWeight},
		{reason: "an allowed controller gets its weight", policy: WeightPolicy{Allowed: map[string]bool{cc: true}}, ctrl: cc, asked: 10, want: 10},
		{reason: "a controller the allow-list does not name gets 1", policy: WeightPolicy{Allowed: map[string]bool{cc: true}}, ctrl: other, asked: 10, want: 1},
		{reason: "an empty allow-list allows no weight", policy: WeightPolicy{Allowed: map[string]bool{}}, ctrl: cc, asked: 10, want: 1},
		{reason: "an allowed controller is still bounded by Max", policy: WeightPolicy{Max: 3, Allowed: map[string]bool{cc: true}}, ctrl: cc, asked: 10, want: 3},
	}
	for _, c := range cases {
		t.Run(c.reason, func(t *testing.T) {
			if got := c.policy.Grant(c.ctrl, c.asked); got != c.want {
				t.Errorf("%s: Grant(%s, %d) = %d, want %d", c.reason, c.ctrl, c.asked, got, c.want)
			}
		})
	}
}

func TestParseMaxWeight(t *testing.T) {
	cases := []struct {
		reason, in string
		want       int
		wantErr    bool
	}{
		{reason: "one", in: "1", want: 1},
		{reason: "the largest", in: "100", want: 100},
		{reason: "spaces around", in: " 8 ", want: 8},
		{reason: "zero", in: "0", wantErr: true},
		{reason: "above MaxWeight", in: "101", wantErr: true},
		{reason: "not a number", in: "high", wantErr: true},
		{reason: "trailing garbage", in: "5x", wantErr: true},
		{reason: "empty", in: "", wantErr: true},
	}
	for _, c := range cases {
		t.Run(c.reason, func(t *testing.T) {
			got, err := ParseMaxWeight(c.in)
			if (err != nil) != c.wantErr || got != c.want {
				t.Errorf("%s: ParseMaxWeight(%q) = %d, %v; want %d, error %v", c.reason, c.in, got, err, c.want, c.wantErr)
			}
		})
	}
}

func TestParseWeightedControllers(t *testing.T) {
	cases := []struct {
		reason, in string
		want       []string
		wantErr    bool
	}{
		{reason: "both kinds", in: "CompositeController/a,DecoratorController/b.c",
			want: []string{ControllerID("CompositeController", "a"), ControllerID("DecoratorController", "b.c")}},
		{reason: "spaces and empty entries", in: " CompositeController/a ,,", want: []string{ControllerID("CompositeController", "a")}},
		{reason: "empty", in: ""},
		{reason: "no kind", in: "a", wantErr: true},
		{reason: "unknown kind", in: "Deployment/a", wantErr: true},
		{reason: "no name", in: "CompositeController/", wantErr: true},
		{reason: "a namespace-like path", in: "CompositeController/ns/a", wantErr: true},
	}
	for _, c := range cases {
		t.Run(c.reason, func(t *testing.T) {
			got, err := ParseWeightedControllers(c.in)
			if (err != nil) != c.wantErr {
				t.Fatalf("%s: error %v, want error %v", c.reason, err, c.wantErr)
			}
			if diff := cmp.Diff(c.want, got); diff != "" {
				t.Errorf("%s (-want +got):\n%s", c.reason, diff)
			}
		})
	}
}

func TestHeaderWeight(t *testing.T) {
	cases := []struct {
		reason, in string
		want       int
	}{
		{reason: "no header is 1", in: "", want: 1},
		{reason: "a weight", in: "7", want: 7},
		{reason: "the largest", in: "100", want: MaxWeight},
		{reason: "above MaxWeight is MaxWeight", in: "1000", want: MaxWeight},
		{reason: "zero is 1", in: "0", want: 1},
		{reason: "negative is 1", in: "-3", want: 1},
		{reason: "not a number is 1", in: "heavy", want: 1},
	}
	for _, c := range cases {
		t.Run(c.reason, func(t *testing.T) {
			if got := HeaderWeight(c.in); got != c.want {
				t.Errorf("%s: HeaderWeight(%q) = %d, want %d", c.reason, c.in, got, c.want)
			}
		})
	}
}
