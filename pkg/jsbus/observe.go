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
}

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

// queued tells the publisher's Queued hook about a stored work item.
func (p Publisher) queued(item bus.WorkItem) {
	if p.Queued != nil {
		p.Queued(item)
	}
}
