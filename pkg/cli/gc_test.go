package cli

import (
	"os"
	"runtime/debug"
	"testing"
)

// TestSetGCPercent: the default applies only when $GOGC is unset. The
// runtime reads $GOGC at start, so the test sets the percent itself first
// (50) to see whether setGCPercent changed it.
func TestSetGCPercent(t *testing.T) {
	cases := []struct {
		reason string
		env    string
		unset  bool
		want   int
	}{
		{reason: "no GOGC: the default", unset: true, want: DefaultGCPercent},
		{reason: "a user's GOGC is left alone", env: "200", want: 50},
		{reason: "an empty GOGC is the user's too", env: "", want: 50},
	}
	for _, c := range cases {
		t.Run(c.reason, func(t *testing.T) {
			old, had := os.LookupEnv("GOGC")
			t.Cleanup(func() {
				if had {
					os.Setenv("GOGC", old)
				} else {
					os.Unsetenv("GOGC")
				}
			})
			if c.unset {
				os.Unsetenv("GOGC")
			} else {
				os.Setenv("GOGC", c.env)
			}
			before := debug.SetGCPercent(50)
			setGCPercent()
			if got := debug.SetGCPercent(before); got != c.want {
				t.Errorf("GC percent %d, want %d", got, c.want)
			}
		})
	}
}
