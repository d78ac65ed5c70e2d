package dispatcher

import (
	"sync"
	"time"
)

// failureCounts counts consecutive failed syncs per parent, so that items
// that did not come from a retry still back off. Entries not touched for
// failureMemory are forgotten: the parent's retries moved to another
// replica (its partition was handed over), or it was deleted while
// failing. The retry item carries its attempt anyway, so forgetting only
// restarts a backoff that nothing here continues.
type failureCounts struct {
	mu        sync.Mutex
	m         map[string]failureCount
	nextPrune time.Time
}

type failureCount struct {
	n    int
	last time.Time
}

// failureMemory is twice the longest backoff (bus.Backoff caps at 5 min).
const failureMemory = 10 * time.Minute

func (f *failureCounts) get(key string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.m[key].n
}

func (f *failureCounts) forget(key string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.m, key)
}

// record sets the count of key and prunes stale entries now and then.
func (f *failureCounts) record(key string, n int, now time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.m == nil {
		f.m = map[string]failureCount{}
	}
	f.m[key] = failureCount{n: n, last: now}
	if now.Before(f.nextPrune) {
		return
	}
	for k, c := range f.m {
		if now.Sub(c.last) > failureMemory {
			delete(f.m, k)
		}
	}
	f.nextPrune = now.Add(time.Minute)
}

func (f *failureCounts) len() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.m)
}
