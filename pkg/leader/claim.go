// Package leader elects one holder of a coordination.k8s.io/v1 Lease among
// replicas: the semantics of client-go's leaderelection with a LeaseLock,
// which metabus cannot import without client-go's informers and typed
// clientset (and the scheme of every API group they register, megabytes of
// RSS in every process).
//
// The rules: a replica takes a Lease that does not exist, that nobody
// holds (released), or whose holder it has not seen renew it for the
// Lease's duration. Expiry is judged by the replica's own clock, from the
// moment it observed the Lease's current content, never by comparing the
// renewTime written by another machine with its own clock, so clock skew
// between replicas does not matter. Every write is conditional on the
// resourceVersion read (a conflict means another replica won the race).
// The holder renews every retry period and stops acting as soon as it has
// not renewed within the renew deadline, which is shorter than the lease
// duration, so it has stopped before anyone else may take over.
package leader

import (
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// holder is the identity holding spec ("": nobody).
func holder(spec *coordinationv1.LeaseSpec) string {
	if spec == nil || spec.HolderIdentity == nil {
		return ""
	}
	return *spec.HolderIdentity
}

// claim is the election's decision: whether identity may take or keep the
// Lease now, and the spec to write if it may.
//
// observed is the Lease's spec as identity last read it (nil: no Lease
// exists) and changedAt the local time identity first read that content.
// Another holder's Lease is valid for its own leaseDurationSeconds after
// changedAt; duration is what identity writes when it holds it.
func claim(observed *coordinationv1.LeaseSpec, changedAt, now time.Time, identity string, duration time.Duration) (coordinationv1.LeaseSpec, bool) {
	stamp := metav1.NewMicroTime(now)
	seconds := int32(duration / time.Second)
	spec := coordinationv1.LeaseSpec{
		HolderIdentity:       &identity,
		LeaseDurationSeconds: &seconds,
		AcquireTime:          &stamp,
		RenewTime:            &stamp,
		LeaseTransitions:     new(int32),
	}
	if observed == nil {
		return spec, true
	}
	transitions := int32(0)
	if observed.LeaseTransitions != nil {
		transitions = *observed.LeaseTransitions
	}
	switch h := holder(observed); {
	case h == identity:
		// A renewal: the holder keeps its acquire time and the count.
		if observed.AcquireTime != nil {
			spec.AcquireTime = observed.AcquireTime.DeepCopy()
		}
		*spec.LeaseTransitions = transitions
		return spec, true
	case h != "" && !expired(observed, changedAt, now):
		return coordinationv1.LeaseSpec{}, false
	}
	// Released, or its holder stopped renewing: a new holder.
	*spec.LeaseTransitions = transitions + 1
	return spec, true
}

// expired reports whether a Lease whose content was first seen at
// changedAt has gone unrenewed for its duration by now.
func expired(spec *coordinationv1.LeaseSpec, changedAt, now time.Time) bool {
	var d time.Duration
	if spec.LeaseDurationSeconds != nil {
		d = time.Duration(*spec.LeaseDurationSeconds) * time.Second
	}
	return !changedAt.Add(d).After(now)
}

// released is the spec a holder writes to give the Lease up: no holder, so
// others take it at once, and a one-second duration for electors that
// only look at the time. The transition count is kept.
func released(observed *coordinationv1.LeaseSpec, now time.Time) coordinationv1.LeaseSpec {
	stamp := metav1.NewMicroTime(now)
	nobody, second := "", int32(1)
	spec := coordinationv1.LeaseSpec{
		HolderIdentity:       &nobody,
		LeaseDurationSeconds: &second,
		AcquireTime:          &stamp,
		RenewTime:            &stamp,
	}
	if observed != nil && observed.LeaseTransitions != nil {
		t := *observed.LeaseTransitions
		spec.LeaseTransitions = &t
	}
	return spec
}
