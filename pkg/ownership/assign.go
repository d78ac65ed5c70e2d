package ownership

import (
	"hash/fnv"
	"sort"
)

// Assign maps each of n partitions to one of members by rendezvous
// hashing with bounded load: each partition goes to the member that
// scores highest for it among those holding fewer than ceil(n/members).
// Every replica computes the same answer from the same member set; a
// member joining or leaving moves few partitions besides its own share.
// Plain rendezvous hashing was lumpy: with 8 members the busiest held 12
// of 64 partitions (1.5x its share), and with 16 some held none, so a
// burst waited on the busiest replica. It returns nil without members.
func Assign(members []string, n int) []string {
	if len(members) == 0 {
		return nil
	}
	ms := append([]string(nil), members...)
	sort.Strings(ms) // the same order whatever order members came in
	limit := (n + len(ms) - 1) / len(ms)
	load := make(map[string]int, len(ms))
	out := make([]string, n)
	type scored struct {
		m string
		s uint64
	}
	ranked := make([]scored, len(ms))
	for p := 0; p < n; p++ {
		for i, m := range ms {
			h := fnv.New64a()
			_, _ = h.Write([]byte(m))
			_, _ = h.Write([]byte{byte(p), byte(p >> 8)})
			ranked[i] = scored{m, mix(h.Sum64())}
		}
		sort.Slice(ranked, func(i, j int) bool {
			if ranked[i].s != ranked[j].s {
				return ranked[i].s > ranked[j].s
			}
			return ranked[i].m < ranked[j].m
		})
		for _, r := range ranked {
			if load[r.m] < limit {
				out[p] = r.m
				load[r.m]++
				break
			}
		}
	}
	return out
}

// mix is a 64-bit finalizer (splitmix64): FNV alone spreads similar
// member names poorly across partitions.
func mix(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}
