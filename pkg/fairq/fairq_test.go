package fairq

import (
	"fmt"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// op is one step of a scenario: "push g k seq", "next" (records what ran
// as "g/k#seq" or "-"), "done k", "remove g" (records what was removed).
type op string

func run(t *testing.T, l Limits, weights map[string]int, ops []op) []string {
	t.Helper()
	q := New[string](l, func(g string) int { return weights[g] })
	var got []string
	for _, o := range ops {
		f := strings.Fields(string(o))
		switch f[0] {
		case "push":
			var seq uint64
			fmt.Sscan(f[3], &seq)
			q.Push(f[1], f[2], seq, fmt.Sprintf("%s/%s#%d", f[1], f[2], seq))
		case "next":
			_, _, _, v, ok := q.Next()
			if !ok {
				v = "-"
			}
			got = append(got, v)
		case "done":
			q.Done(f[1])
		case "remove":
			removed := q.Remove(func(g, _ string, _ string) bool { return g == f[1] })
			got = append(got, "removed:"+strings.Join(removed, ","))
		default:
			t.Fatalf("bad op %q", o)
		}
	}
	return got
}

func TestQueue(t *testing.T) {
	cases := []struct {
		reason  string
		limits  Limits
		weights map[string]int
		ops     []op
		want    []string
	}{
		{
			reason: "a key runs one message at a time, in order",
			limits: Limits{PerGroup: 4, Total: 4},
			ops:    []op{"push a k1 1", "push a k1 2", "next", "next", "done k1", "next", "done k1", "next"},
			want:   []string{"a/k1#1", "-", "a/k1#2", "-"},
		},
		{
			reason: "a late redelivery of an older message runs before the newer one",
			limits: Limits{PerGroup: 4, Total: 4},
			ops:    []op{"push a k1 7", "push a k1 3", "next", "done k1", "next"},
			want:   []string{"a/k1#3", "a/k1#7"},
		},
		{
			reason: "different keys of one group run side by side up to PerGroup",
			limits: Limits{PerGroup: 2, Total: 10},
			ops:    []op{"push a k1 1", "push a k2 2", "push a k3 3", "next", "next", "next", "done k1", "next"},
			want:   []string{"a/k1#1", "a/k2#2", "-", "a/k3#3"},
		},
		{
			reason: "a group at its cap (a hanging hook) does not hold another group back",
			limits: Limits{PerGroup: 2, Total: 10},
			ops: []op{"push hang h1 1", "push hang h2 2", "push hang h3 3", "push hang h4 4",
				"next", "next", "push fast f1 5", "next", "next", "done f1", "push fast f1 6", "next"},
			want: []string{"hang/h1#1", "hang/h2#2", "fast/f1#5", "-", "fast/f1#6"},
		},
		{
			reason: "when the total is reached, groups alternate in equal shares",
			limits: Limits{PerGroup: 10, Total: 1},
			ops: []op{"push a a1 1", "push a a2 2", "push a a3 3", "push b b1 4", "push b b2 5",
				"next", "done a1", "next", "done b1", "next", "done a2", "next", "done b2", "next"},
			want: []string{"a/a1#1", "b/b1#4", "a/a2#2", "b/b2#5", "a/a3#3"},
		},
		{
			reason:  "weights split a saturated total: weight 2 runs twice as often",
			limits:  Limits{PerGroup: 10, Total: 1},
			weights: map[string]int{"heavy": 2},
			ops: []op{"push heavy h1 1", "push heavy h2 2", "push heavy h3 3", "push heavy h4 4",
				"push light l1 5", "push light l2 6",
				"next", "done h1", "next", "done l1", "next", "done h2", "next", "done h3", "next", "done l2", "next"},
			want: []string{"heavy/h1#1", "light/l1#5", "heavy/h2#2", "heavy/h3#3", "light/l2#6", "heavy/h4#4"},
		},
		{
			reason: "a group that was idle starts level with the others, not ahead by its idle time",
			limits: Limits{PerGroup: 10, Total: 1},
			ops: []op{"push a a1 1", "next", "done a1", "push a a2 2", "next", "done a2", "push a a3 3", "next", "done a3",
				"push a a4 4", "push a a5 5", "push b b1 6", "push b b2 7", "push b b3 8",
				"next", "done a4", "next", "done b1", "next"},
			want: []string{"a/a1#1", "a/a2#2", "a/a3#3", "a/a4#4", "b/b1#6", "a/a5#5"},
		},
		{
			reason: "remove hands back waiting messages, never running ones, and the key can run again",
			limits: Limits{PerGroup: 10, Total: 10},
			ops:    []op{"push a k1 1", "push a k1 2", "push a k2 3", "push b k3 4", "next", "remove a", "done k1", "next", "next"},
			want:   []string{"a/k1#1", "removed:a/k1#2,a/k2#3", "b/k3#4", "-"},
		},
	}
	for _, c := range cases {
		t.Run(c.reason, func(t *testing.T) {
			got := run(t, c.limits, c.weights, c.ops)
			if diff := cmp.Diff(c.want, got); diff != "" {
				t.Errorf("%s (-want +got):\n%s", c.reason, diff)
			}
		})
	}
}

func TestQueueForgetsIdleState(t *testing.T) {
	q := New[int](Limits{PerGroup: 2, Total: 2}, nil)
	for i := 0; i < 100; i++ {
		q.Push(fmt.Sprint("g", i%7), fmt.Sprint("k", i), uint64(i), i)
	}
	for q.Waiting() > 0 || q.Running() > 0 {
		_, k, _, _, ok := q.Next()
		if !ok {
			t.Fatalf("stuck with %d waiting, %d running", q.Waiting(), q.Running())
		}
		q.Done(k)
	}
	if len(q.keys) != 0 || q.Groups() != 0 {
		t.Errorf("left %d keys and %d groups after everything ran", len(q.keys), q.Groups())
	}
}
