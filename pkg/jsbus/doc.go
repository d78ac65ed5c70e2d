// Package jsbus runs metabus's bus (package bus's contracts) on NATS
// JetStream: it creates and keeps the streams, consumers and lease bucket
// (Ensure, KeepConsumers, ReconcileLayout), publishes work items, desired
// states and schedules (Publisher), consumes a stage's partitions as their
// lease holder (Consume, the driver of package ownership's protocol),
// relays fired schedules (RunRelay), moves poison messages to MC_DLQ
// (RunDLQ), and calls the snapshot and revisions services over
// request/reply (SnapshotClient, RevisionsClient).
package jsbus
