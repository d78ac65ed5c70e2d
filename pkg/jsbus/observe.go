package jsbus

import "github.com/metabus/metabus/pkg/bus"

// OwnershipObserver (ConsumeConfig.Ownership) is told when this replica
// starts and stops consuming a partition of a stage: metrics of partition
// ownership and rebalances (package obs's PartitionMetrics). Its methods
// are called with the owner's lock held: they must not block.
type OwnershipObserver interface {
	// PartitionClaimed: this replica took a partition's lease.
	PartitionClaimed(stage string)
	// PartitionReleased: it stopped consuming one, having handed it back
	// (rebalance, shutdown, partition-count change) or, lost, because its
	// lease was not renewed in time.
	PartitionReleased(stage string, lost bool)
	// ConsumerResetFailed: a reset of a partition's consumer at a
	// handover failed, for reason ResetUnsupported, ResetNoAnswer or
	// ResetError.
	ConsumerResetFailed(stage, reason string)
}

// Why a consumer reset failed (OwnershipObserver.ConsumerResetFailed).
const (
	// ResetUnsupported: the consumer cannot be reset at all (a server
	// before natsx.MinResetVersion, a user without the permission); the
	// handover goes on without, what was pending comes back after
	// AckWait.
	ResetUnsupported = "unsupported"
	// ResetNoAnswer: no answer, nor from the consumer's info; tried again
	// while the lease holds.
	ResetNoAnswer = "no_answer"
	// ResetError: another error (no consumer leader yet); tried again.
	ResetError = "error"
)

func (c *ConsumeConfig) claimed() {
	if c.Ownership != nil {
		c.Ownership.PartitionClaimed(c.Stage)
	}
}

func (c *ConsumeConfig) released(lost bool) {
	if c.Ownership != nil {
		c.Ownership.PartitionReleased(c.Stage, lost)
	}
}

func (c *ConsumeConfig) resetFailed(reason string) {
	if c.Ownership != nil {
		c.Ownership.ConsumerResetFailed(c.Stage, reason)
	}
}

// queued tells the publisher's Queued hook about a stored work item.
func (p Publisher) queued(item bus.WorkItem) {
	if p.Queued != nil {
		p.Queued(item)
	}
}
