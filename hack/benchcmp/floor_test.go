package main

import (
	"math"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestFloorSummary(t *testing.T) {
	nan := math.NaN()
	cases := []struct {
		name, reason string
		cpu          map[string]float64
		want         string
	}{
		{
			name: "all three", reason: "each controller against the floor, and half of upstream's against it",
			cpu:  map[string]float64{"contract-floor": 2, "metabus": 5, "upstream": 5},
			want: "; controller CPU/parent: contract-floor 2.00 ms, metabus 5.00 ms (2.50× the floor), upstream 5.00 ms (2.50× the floor); half of upstream's 2.50 ms is 1.25× the floor (above the floor)",
		},
		{
			name: "half below the floor", reason: "a target under the floor is beyond the contract, and says so",
			cpu:  map[string]float64{"contract-floor": 3, "metabus": 5, "upstream": 5},
			want: "; controller CPU/parent: contract-floor 3.00 ms, metabus 5.00 ms (1.67× the floor), upstream 5.00 ms (1.67× the floor); half of upstream's 2.50 ms is 0.83× the floor (below the floor: beyond the contract)",
		},
		{
			name: "no upstream", reason: "without upstream only metabus is set against the floor",
			cpu:  map[string]float64{"contract-floor": 2, "metabus": 5},
			want: "; controller CPU/parent: contract-floor 2.00 ms, metabus 5.00 ms (2.50× the floor)",
		},
		{
			name: "upstream failed", reason: "a failed contender (NaN) is left out, not printed as NaN",
			cpu:  map[string]float64{"contract-floor": 2, "metabus": 5, "upstream": nan},
			want: "; controller CPU/parent: contract-floor 2.00 ms, metabus 5.00 ms (2.50× the floor)",
		},
		{
			name: "no floor", reason: "without the floor contender there is nothing to set against",
			cpu:  map[string]float64{"metabus": 5, "upstream": 5},
			want: "",
		},
		{
			name: "floor failed", reason: "a failed floor gives no ratios",
			cpu:  map[string]float64{"contract-floor": nan, "metabus": 5},
			want: "",
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if diff := cmp.Diff(c.want, floorSummary(c.cpu)); diff != "" {
				t.Errorf("%s: (-want +got)\n%s", c.reason, diff)
			}
		})
	}
}
