package applier

import (
	"encoding/json"
	"testing"

	"github.com/metabus/metabus/pkg/bus"
)

// TestIsRelease: which older desired states the bus keeps when a newer
// one of the same item runs first (all others it deletes as superseded).
func TestIsRelease(t *testing.T) {
	body := func(hook string) []byte {
		b, err := json.Marshal(bus.DesiredState{Hook: hook})
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	cases := []struct {
		reason string
		data   []byte
		want   bool
	}{
		{"a finalizer release is kept: its effect does not depend on order", body(bus.HookRelease), true},
		{"a sync answer is superseded", body(bus.HookSync), false},
		{"a finalize answer is superseded", body(bus.HookFinalize), false},
		{"a map key's answer is superseded", body(bus.HookMap), false},
		{"an unreadable body is superseded (it could never apply)", []byte("{"), false},
	}
	for _, c := range cases {
		t.Run(c.reason, func(t *testing.T) {
			if got := isRelease(nil, c.data); got != c.want {
				t.Errorf("isRelease = %v, want %v", got, c.want)
			}
		})
	}
}
