package jsbus

import "github.com/metabus/metabus/pkg/ownership"

// Assign maps each of n partitions to one of members (ownership.Assign).
func Assign(members []string, n int) []string { return ownership.Assign(members, n) }
