package ownership

import (
	"fmt"
	"math/rand"
	"testing"
)

// TestAssignBalanced: every partition has an owner, nobody holds more
// than ceil(64/members), the answer does not depend on the members'
// order, and a member joining moves about its share, not everything.
func TestAssignBalanced(t *testing.T) {
	rng := rand.New(rand.NewSource(1))
	for trial := 0; trial < 200; trial++ {
		r := 1 + rng.Intn(20)
		members := make([]string, r)
		for i := range members {
			members[i] = fmt.Sprintf("pod-%d-%x", i, rng.Uint32())
		}
		got := Assign(members, 64)
		limit := (64 + r - 1) / r
		load := map[string]int{}
		for p, m := range got {
			if m == "" {
				t.Fatalf("%d members: partition %d has no owner", r, p)
			}
			load[m]++
		}
		for m, n := range load {
			if n > limit {
				t.Errorf("%d members: %s holds %d partitions, more than %d", r, m, n, limit)
			}
		}
		shuffled := append([]string(nil), members...)
		rng.Shuffle(len(shuffled), func(i, j int) { shuffled[i], shuffled[j] = shuffled[j], shuffled[i] })
		if fmt.Sprint(Assign(shuffled, 64)) != fmt.Sprint(got) {
			t.Fatalf("%d members: the assignment depends on the members' order", r)
		}
		joined := Assign(append(members, "newcomer"), 64)
		moved := 0
		for p := range got {
			if got[p] != joined[p] && joined[p] != "newcomer" {
				moved++
			}
		}
		// Moves between old members stay a small part of the whole.
		if moved > 64/3 {
			t.Errorf("%d members: a join moved %d partitions between old members", r, moved)
		}
	}
}

func BenchmarkAssign64x8(b *testing.B) {
	members := []string{"a", "b", "c", "d", "e", "f", "g", "h"}
	for i := 0; i < b.N; i++ {
		_ = Assign(members, 64)
	}
}
