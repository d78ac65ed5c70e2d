package echo

import "time"

// StrategyWindow is how long a Done note's apply strategy counts as the
// strategy of a live applier (Book.ApplierStrategy). Appliers settle
// desired states all the time while anything changes; one that settled
// nothing for this long has no answer in flight that a dispatcher could
// misjudge, and its next note counts again.
const StrategyWindow = 10 * time.Minute

// Strategies is what the Done notes say about the appliers' apply
// strategy: when each strategy was last reported. It is a pure core (the
// caller passes the time), read by Agreed.
type Strategies struct {
	seen map[string]time.Time
}

// Saw records that a Done note reported strategy s at time at. A note
// without one (s == "", an applier older than the field) is recorded as
// a strategy of its own: it is unknown, so it never agrees.
func (s *Strategies) Saw(strategy string, at time.Time) {
	if s.seen == nil {
		s.seen = map[string]time.Time{}
	}
	if prev, ok := s.seen[strategy]; !ok || at.After(prev) {
		s.seen[strategy] = at
	}
}

// Agreed is the apply strategy every applier heard from within window
// before now reported, and false while there is none (no note yet), more
// than one (appliers being moved from one strategy to another, or
// misconfigured), or an unknown one. A dispatcher settles answers that
// would write nothing only under a strategy known this way, so a change
// of strategy, or an applier it cannot judge, costs only desired states,
// never a write.
func (s *Strategies) Agreed(now time.Time, window time.Duration) (string, bool) {
	var agreed string
	n := 0
	for strategy, at := range s.seen {
		if now.Sub(at) > window {
			continue
		}
		n++
		agreed = strategy
	}
	if n != 1 || agreed == "" {
		return "", false
	}
	return agreed, true
}
