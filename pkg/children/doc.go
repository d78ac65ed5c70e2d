// Package children turns the desired objects returned by a sync or finalize hook into the
// create, update and delete actions that converge the observed children towards them. It serves
// CompositeController children and DecoratorController attachments alike.
//
// It is pure (no I/O) so that the rules that decide which objects metabus writes or deletes are
// testable on their own: Normalize validates and completes the hook's desired set, and Plan
// compares it with the observed children the owner already controls. Executing the actions
// (with a UID precondition on deletes, swallowing AlreadyExists on creates and NotFound/Conflict
// on updates, as upstream does) is the caller's job.
//
// Both functions treat their inputs as untrusted hook output: they never panic and never modify
// what they are given.
package children
