package bus

import (
	"time"
)

// OwnersBucket (KV_MC_OWNERS) holds the leases that give one replica of a
// stage the partitions it consumes, and the stage members that share them:
//
//	lease.<stage>.<N>-pNN  value: the owning member; renewed every Lease/5
//	member.<stage>.<id>    a live replica; renewed every Lease/5
//
// Every entry expires Lease after its last write (the bucket's TTL), so a
// replica that dies or loses NATS loses its leases after at most Lease, and
// a replica never consumes a partition whose lease it has not renewed
// within 3/5 of Lease: the old owner has stopped before a new one can
// create the expired lease.
const OwnersBucket = "MC_OWNERS"

// OwnerLease is the default lease duration. A replica killed without a
// shutdown leaves its partitions unconsumed for at most this long.
const OwnerLease = 10 * time.Second

// Lease stage names (the second token of lease and member keys).
const (
	WorkStage    = "work"
	DesiredStage = "desired"
)

// Per-partition in-flight bounds: how many messages of one partition a
// replica may hold (running or waiting its turn) before the server stops
// delivering more. They bound a replica's memory (work items are small,
// desired states up to the 8 MB payload limit) and how far one
// controller's backlog in a partition can delay others in it (a
// dispatcher holds at most --max-held-per-controller of one controller's
// work items from a partition and puts off the rest: package headroom).
const (
	WorkMaxAckPending    = 1024
	DesiredMaxAckPending = 256
)

func (o Options) ownerLease() time.Duration {
	if o.OwnerLease > 0 {
		return o.OwnerLease
	}
	return OwnerLease
}

// OwnersConfig is the lease bucket: one value per key, expiring Lease after
// its last write. File-stored, so leases outlive a server restart and
// owners keep their partitions across it; in memory with MemoryQueues,
// whose server (the all-in-one's embedded one) never restarts without its
// owners restarting too. Renewals are nearly all an idle process does (64
// partitions per stage, every Lease/5), and on file each one is a write.
func OwnersConfig(o Options) BucketConfig {
	return BucketConfig{
		Bucket:      OwnersBucket,
		Description: "metabus partition leases and stage members",
		History:     1,
		TTL:         o.ownerLease(),
		Memory:      o.MemoryQueues,
		Replicas:    o.replicas(),
	}
}

// MemberKey is the member key of replica id of a stage.
func MemberKey(stage, id string) string { return "member." + stage + "." + id }
