package testnats

import (
	"net"
	"strconv"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestFreePortOutsideEphemeralRange: where the kernel says which ports it
// hands out on its own, FreePort chooses below them, and the port can be
// bound.
func TestFreePortOutsideEphemeralRange(t *testing.T) {
	low, ok := ephemeralLow()
	if !ok || low <= fixedPortFloor+1000 {
		t.Skipf("no room below the ephemeral range here (low bound %d, known %v)", low, ok)
	}
	for range 20 {
		port, err := FreePort()
		if err != nil {
			t.Fatal(err)
		}
		if port < fixedPortFloor || port >= low {
			t.Fatalf("FreePort gave %d, want a port in [%d, %d): the kernel may hand an ephemeral one to anyone", port, fixedPortFloor, low)
		}
		l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port))
		if err != nil {
			t.Fatalf("bind the port FreePort gave: %v", err)
		}
		_ = l.Close()
	}
}

func TestParsePortRangeLow(t *testing.T) {
	for _, c := range []struct {
		reason, in string
		low        int
		ok         bool
	}{
		{"Linux's default, tab-separated with a newline", "32768\t60999\n", 32768, true},
		{"spaces", "1024 65535", 1024, true},
		{"one number", "32768", 0, false},
		{"not a number", "low high", 0, false},
		{"out of range", "70000 80000", 0, false},
		{"empty", "", 0, false},
	} {
		t.Run(c.reason, func(t *testing.T) {
			low, ok := parsePortRangeLow(c.in)
			if diff := cmp.Diff([2]any{c.low, c.ok}, [2]any{low, ok}); diff != "" {
				t.Errorf("parsePortRangeLow(%q) (-want +got):\n%s", c.in, diff)
			}
		})
	}
}
