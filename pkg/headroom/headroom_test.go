package headroom

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// op is one step of a scenario, times in seconds after t0:
//
//	offer P G ID T    records "take" or "off +S" (S: seconds after T)
//	take P G ID T     a message that could not be put off, held anyway
//	release P G ID T
//	held P G          records "held N"
//	slots             records "slots N"
type op string

var t0 = time.Date(2026, 11, 28, 23, 0, 0, 0, time.UTC)

func at(t *testing.T, s string) time.Time {
	t.Helper()
	f, err := strconv.ParseFloat(s, 64)
	if err != nil {
		t.Fatalf("bad time %q", s)
	}
	return t0.Add(time.Duration(f * float64(time.Second)))
}

func play(t *testing.T, cfg Config, ops []op) []string {
	t.Helper()
	b := New(cfg)
	var got []string
	for _, o := range ops {
		f := strings.Fields(string(o))
		id := func() uint64 {
			n, err := strconv.ParseUint(f[3], 10, 64)
			if err != nil {
				t.Fatalf("bad id in %q", o)
			}
			return n
		}
		switch f[0] {
		case "offer":
			now := at(t, f[4])
			d := b.Offer(Slot{f[1], f[2]}, id(), now)
			if d.Take {
				got = append(got, "take")
			} else {
				got = append(got, fmt.Sprintf("off +%gs", d.At.Sub(now).Seconds()))
			}
		case "take":
			b.Take(Slot{f[1], f[2]}, id(), at(t, f[4]))
		case "release":
			b.Release(Slot{f[1], f[2]}, id(), at(t, f[4]))
		case "held":
			got = append(got, fmt.Sprintf("held %d", b.Held(Slot{f[1], f[2]})))
		case "slots":
			got = append(got, fmt.Sprintf("slots %d", b.Slots()))
		case "part":
			got = append(got, fmt.Sprintf("part %d", b.PartHeld(f[1])))
		default:
			t.Fatalf("bad op %q", o)
		}
	}
	return got
}

func TestBook(t *testing.T) {
	two := Config{Limit: 2, MinDelay: time.Second, MaxDelay: 60 * time.Second}
	cases := []struct {
		reason string
		cfg    Config
		ops    []op
		want   []string
	}{
		{
			reason: "no limit: every message is taken",
			cfg:    Config{},
			ops:    []op{"offer p a 1 0", "offer p a 2 0", "offer p a 3 0", "held p a"},
			want:   []string{"take", "take", "take", "held 3"},
		},
		{
			reason: "a controller at its limit has the next message put off, the minimum delay while what it holds is young",
			cfg:    two,
			ops:    []op{"offer p a 1 0", "offer p a 2 0", "offer p a 3 0", "held p a"},
			want:   []string{"take", "take", "off +1s", "held 2"},
		},
		{
			reason: "the limit is per controller: another controller of the same partition is taken",
			cfg:    two,
			ops:    []op{"offer p a 1 0", "offer p a 2 0", "offer p a 3 0", "offer p b 4 0", "offer p b 5 0", "held p b"},
			want:   []string{"take", "take", "off +1s", "take", "take", "held 2"},
		},
		{
			reason: "the limit is per partition: the same controller's message of another partition is taken",
			cfg:    two,
			ops:    []op{"offer p a 1 0", "offer p a 2 0", "offer p a 3 0", "offer q a 4 0"},
			want:   []string{"take", "take", "off +1s", "take"},
		},
		{
			reason: "a release makes room for the next message",
			cfg:    two,
			ops:    []op{"offer p a 1 0", "offer p a 2 0", "release p a 1 0.5", "offer p a 3 0.5", "offer p a 4 0.5", "held p a"},
			want:   []string{"take", "take", "take", "off +1s", "held 2"},
		},
		{
			reason: "put-off messages come back in waves of at most the limit, one spacing apart",
			cfg:    two,
			ops: []op{"offer p a 1 0", "offer p a 2 0",
				"offer p a 3 0", "offer p a 4 0", "offer p a 5 0", "offer p a 6 0", "offer p a 7 0"},
			want: []string{"take", "take", "off +1s", "off +1s", "off +2s", "off +2s", "off +3s"},
		},
		{
			reason: "the spacing is the age of the oldest message held: how long the controller takes to work through what it holds",
			cfg:    two,
			ops: []op{"offer p a 1 0", "offer p a 2 5",
				"offer p a 3 10", "offer p a 4 10", "offer p a 5 10"},
			want: []string{"take", "take", "off +10s", "off +10s", "off +20s"},
		},
		{
			reason: "the oldest held is the oldest not yet released, whatever order they are released in",
			cfg:    two,
			ops: []op{"offer p a 1 0", "offer p a 2 4", "release p a 1 6", "offer p a 3 6",
				"offer p a 4 10"},
			want: []string{"take", "take", "take", "off +6s"},
		},
		{
			reason: "a wave that has come is not joined: the next starts one spacing after now",
			cfg:    two,
			ops: []op{"offer p a 1 0", "offer p a 2 0", "offer p a 3 0",
				"offer p a 4 3"},
			want: []string{"take", "take", "off +1s", "off +3s"},
		},
		{
			reason: "no wave is further off than the maximum delay: the last one grows instead",
			cfg:    Config{Limit: 1, MinDelay: time.Second, MaxDelay: 4 * time.Second},
			ops: []op{"offer p a 1 0", "offer p a 2 3", "offer p a 3 3", "offer p a 4 3",
				"offer p a 5 3"},
			want: []string{"take", "off +3s", "off +4s", "off +4s", "off +4s"},
		},
		{
			reason: "a hung controller's spacing is capped at the maximum delay",
			cfg:    Config{Limit: 1, MinDelay: time.Second, MaxDelay: 4 * time.Second},
			ops:    []op{"offer p a 1 0", "offer p a 2 100"},
			want:   []string{"take", "off +4s"},
		},
		{
			reason: "a message that could not be put off is counted anyway, over the limit",
			cfg:    two,
			ops:    []op{"offer p a 1 0", "offer p a 2 0", "take p a 3 0", "held p a", "release p a 3 1", "held p a"},
			want:   []string{"take", "take", "held 3", "held 2"},
		},
		{
			reason: "a message counted twice is held once",
			cfg:    two,
			ops:    []op{"offer p a 1 0", "take p a 1 0", "held p a"},
			want:   []string{"take", "held 1"},
		},
		{
			reason: "a release of a message never counted changes nothing",
			cfg:    two,
			ops:    []op{"offer p a 1 0", "release p a 9 0", "release q a 9 0", "held p a", "slots"},
			want:   []string{"take", "held 1", "slots 1"},
		},
		{
			reason: "a slot with nothing held and no wave to come is forgotten",
			cfg:    two,
			ops:    []op{"offer p a 1 0", "offer p b 2 0", "release p a 1 1", "slots", "release p b 2 1", "slots"},
			want:   []string{"take", "take", "slots 1", "slots 0"},
		},
		{
			reason: "below Busy the partition has room: a controller over its limit is taken",
			cfg:    Config{Limit: 1, Busy: 3, MinDelay: time.Second, MaxDelay: time.Minute},
			ops:    []op{"offer p a 1 0", "offer p a 2 0", "offer p a 3 0", "offer p a 4 0", "part p"},
			want:   []string{"take", "take", "take", "off +1s", "part 3"},
		},
		{
			reason: "Busy counts every controller of the partition: once it is reached, one over its limit is put off and one under it taken",
			cfg:    Config{Limit: 1, Busy: 3, MinDelay: time.Second, MaxDelay: time.Minute},
			ops:    []op{"offer p a 1 0", "offer p a 2 0", "offer p b 3 0", "offer p a 4 0", "offer p c 5 0", "part p"},
			want:   []string{"take", "take", "take", "off +1s", "take", "part 4"},
		},
		{
			reason: "Busy is per partition: another partition's messages do not count",
			cfg:    Config{Limit: 1, Busy: 2, MinDelay: time.Second, MaxDelay: time.Minute},
			ops:    []op{"offer q b 1 0", "offer q b 2 0", "offer p a 3 0", "offer p a 4 0", "offer p a 5 0", "part q"},
			want:   []string{"take", "take", "take", "take", "off +1s", "part 2"},
		},
		{
			reason: "releases lower the partition's count below Busy again, and a message counted twice or a release never counted leave it alone",
			cfg:    Config{Limit: 1, Busy: 2, MinDelay: time.Second, MaxDelay: time.Minute},
			ops: []op{"offer p a 1 0", "offer p a 2 0", "take p a 2 0", "release p a 9 0", "part p", "offer p a 3 0",
				"release p a 1 1", "part p", "offer p a 4 1", "part p"},
			want: []string{"take", "take", "part 2", "off +1s", "part 1", "take", "part 2"},
		},
		{
			reason: "a slot whose wave is still to come is remembered once empty, so the wave is joined",
			cfg:    two,
			ops: []op{"offer p a 1 0", "offer p a 2 0", "offer p a 3 5", "release p a 1 6", "release p a 2 6", "slots",
				"offer p a 4 6", "offer p a 5 6", "offer p a 6 6"},
			want: []string{"take", "take", "off +5s", "slots 1", "take", "take", "off +4s"},
		},
	}
	for _, c := range cases {
		t.Run(c.reason, func(t *testing.T) {
			if diff := cmp.Diff(c.want, play(t, c.cfg, c.ops)); diff != "" {
				t.Errorf("%s (-want +got):\n%s", c.reason, diff)
			}
		})
	}
}

// TestReleasedOrderStaysBounded: a controller whose oldest message never
// ends while others come and go keeps no more than about twice what it
// holds.
func TestReleasedOrderStaysBounded(t *testing.T) {
	b := New(Config{Limit: 4})
	s := Slot{"p", "a"}
	b.Offer(s, 0, t0) // the one that hangs
	for i := uint64(1); i < 10000; i++ {
		if d := b.Offer(s, i, t0); !d.Take {
			t.Fatalf("message %d put off with 1 held", i)
		}
		b.Release(s, i, t0)
	}
	if n := len(b.slots[s].order); n > 2*b.Held(s)+16 {
		t.Errorf("%d ids remembered for %d held", n, b.Held(s))
	}
	if b.Held(s) != 1 {
		t.Errorf("held %d, want 1", b.Held(s))
	}
}
