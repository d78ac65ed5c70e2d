package bus

import (
	"hash/fnv"
	"math"
	"strconv"
	"time"
)

// WithItemKey sets the partitionkey extension of a keyed item to its
// ItemKey: NewEvent's default is the parent's ParentKey, which is right,
// and left byte for byte as it was, for a per-parent item.
func WithItemKey(ext map[string]string, mapKey, itemKey string) map[string]string {
	if mapKey != "" {
		ext[ExtPartitionKey] = itemKey
	}
	return ext
}

// DesiredMsgID names the desired state of a work item (the hook request's
// CloudEvent id). The Nats-Msg-Id of the published desired state adds a
// hash of its body (DesiredDedupID).
func DesiredMsgID(parentUID string, workSeq uint64) string {
	return parentUID + ":" + WorkSeqString(workSeq)
}

// DesiredDedupID is the Nats-Msg-Id of a desired state: its work item and
// a hash of its content. The stream drops an identical republish (a
// publish retried after a lost acknowledgement), but not the answer of a
// re-run of the same work item (a dispatcher that crashed after publishing
// and before acking): that run observed the cluster later, possibly after
// a change the first answer did not see. With the work item alone as id,
// the newer answer was dropped as a duplicate and the change was lost
// until something else touched the parent.
func DesiredDedupID(id string, body []byte) string {
	h := fnv.New64a()
	_, _ = h.Write(body)
	return id + ":" + strconv.FormatUint(h.Sum64(), 36)
}

// Backoff is the per-parent retry delay after attempt consecutive failures:
// 1s doubling to 5 minutes, like a workqueue's exponential limiter but
// bounded for hooks that are down for a while.
func Backoff(attempt int) time.Duration {
	if attempt < 1 {
		attempt = 1
	}
	d := time.Duration(float64(time.Second) * math.Pow(2, float64(attempt-1)))
	if d > 5*time.Minute || d <= 0 {
		return 5 * time.Minute
	}
	return d
}

// OwnFailureAttempts bounds how far failures of metabus's own services (the
// watcher's snapshots or the revisions service not answering, as while a
// watcher restarts or hands over its lease) raise a parent's retry count:
// Backoff(5) is 16 s. Counted like a hook's failures, a watcher outage of a
// few minutes left parents retried 5 minutes apart long after it ended, and
// a hook failure right after inherited the 5 minutes (a clustered fault run:
// a parent whose change came 14 minutes into such retries converged only
// after the suite's 5-minute bound).
const OwnFailureAttempts = 5

// NextAttempt is a parent's retry count after one more failed sync, from
// prev: one more for a hook's (or any other) failure, and for a failure of
// metabus's own (ours) one more only up to OwnFailureAttempts, never
// lowering a count the hook's failures raised.
func NextAttempt(prev int, ours bool) int {
	if prev < 0 {
		prev = 0
	}
	if ours && prev >= OwnFailureAttempts {
		return prev
	}
	return prev + 1
}
