package leader

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func ptr[T any](v T) *T { return &v }

func stamp(t time.Time) *metav1.MicroTime {
	m := metav1.NewMicroTime(t)
	return &m
}

func TestClaim(t *testing.T) {
	t0 := time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)
	now := t0.Add(20 * time.Second)
	// A Lease another replica holds, as written at t0 (by its clock).
	other := func(duration int32, transitions int32) *coordinationv1.LeaseSpec {
		return &coordinationv1.LeaseSpec{
			HolderIdentity: ptr("b"), LeaseDurationSeconds: ptr(duration),
			AcquireTime: stamp(t0), RenewTime: stamp(t0), LeaseTransitions: ptr(transitions),
		}
	}
	// What "a" writes when it takes the Lease now with n transitions.
	taken := func(n int32) coordinationv1.LeaseSpec {
		return coordinationv1.LeaseSpec{
			HolderIdentity: ptr("a"), LeaseDurationSeconds: ptr(int32(15)),
			AcquireTime: stamp(now), RenewTime: stamp(now), LeaseTransitions: ptr(n),
		}
	}
	type result struct {
		Spec coordinationv1.LeaseSpec
		OK   bool
	}
	tests := []struct {
		reason    string
		observed  *coordinationv1.LeaseSpec
		changedAt time.Time
		want      result
	}{
		{
			reason: "no Lease: create it, no transition yet",
			want:   result{Spec: taken(0), OK: true},
		},
		{
			reason:   "held by me: renew, keeping the acquire time and the count",
			observed: &coordinationv1.LeaseSpec{HolderIdentity: ptr("a"), LeaseDurationSeconds: ptr(int32(15)), AcquireTime: stamp(t0), RenewTime: stamp(t0), LeaseTransitions: ptr(int32(3))},
			// Even long after the last renewal: the holder may always try;
			// the resourceVersion precondition catches a takeover.
			changedAt: t0,
			want: result{Spec: coordinationv1.LeaseSpec{
				HolderIdentity: ptr("a"), LeaseDurationSeconds: ptr(int32(15)),
				AcquireTime: stamp(t0), RenewTime: stamp(now), LeaseTransitions: ptr(int32(3)),
			}, OK: true},
		},
		{
			reason:    "held by another, seen changing within its duration: keep off",
			observed:  other(15, 2),
			changedAt: now.Add(-14 * time.Second),
			want:      result{},
		},
		{
			reason:    "held by another, unchanged for exactly its duration: expired, take it",
			observed:  other(15, 2),
			changedAt: now.Add(-15 * time.Second),
			want:      result{Spec: taken(3), OK: true},
		},
		{
			reason:    "held by another, unchanged for longer than its duration: take it",
			observed:  other(15, 2),
			changedAt: now.Add(-time.Minute),
			want:      result{Spec: taken(3), OK: true},
		},
		{
			reason: "expiry is the Lease's own duration, not mine",
			// 60s written by the holder: 20s without change is not enough.
			observed:  other(60, 2),
			changedAt: now.Add(-20 * time.Second),
			want:      result{},
		},
		{
			reason: "a renewTime long past by my clock does not matter, only when I saw it change",
			// The holder's clock is 10 minutes behind; I saw this content 1s ago.
			observed:  &coordinationv1.LeaseSpec{HolderIdentity: ptr("b"), LeaseDurationSeconds: ptr(int32(15)), RenewTime: stamp(now.Add(-10 * time.Minute))},
			changedAt: now.Add(-time.Second),
			want:      result{},
		},
		{
			reason:    "released (no holder): take it at once",
			observed:  &coordinationv1.LeaseSpec{HolderIdentity: ptr(""), LeaseDurationSeconds: ptr(int32(1)), AcquireTime: stamp(now), RenewTime: stamp(now), LeaseTransitions: ptr(int32(4))},
			changedAt: now,
			want:      result{Spec: taken(5), OK: true},
		},
		{
			reason:    "an empty spec (no holder, no count): take it, first transition",
			observed:  &coordinationv1.LeaseSpec{},
			changedAt: now,
			want:      result{Spec: taken(1), OK: true},
		},
		{
			reason:    "held by another without a duration: expired at once",
			observed:  &coordinationv1.LeaseSpec{HolderIdentity: ptr("b")},
			changedAt: now,
			want:      result{Spec: taken(1), OK: true},
		},
	}
	for _, tt := range tests {
		t.Run(tt.reason, func(t *testing.T) {
			spec, ok := claim(tt.observed, tt.changedAt, now, "a", 15*time.Second)
			if diff := cmp.Diff(tt.want, result{Spec: spec, OK: ok}); diff != "" {
				t.Errorf("claim (-want +got):\n%s", diff)
			}
		})
	}
}

func TestReleased(t *testing.T) {
	now := time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)
	tests := []struct {
		reason   string
		observed *coordinationv1.LeaseSpec
		want     coordinationv1.LeaseSpec
	}{
		{
			reason:   "no holder, one second, the count kept",
			observed: &coordinationv1.LeaseSpec{HolderIdentity: ptr("a"), LeaseDurationSeconds: ptr(int32(15)), LeaseTransitions: ptr(int32(7))},
			want:     coordinationv1.LeaseSpec{HolderIdentity: ptr(""), LeaseDurationSeconds: ptr(int32(1)), AcquireTime: stamp(now), RenewTime: stamp(now), LeaseTransitions: ptr(int32(7))},
		},
		{
			reason:   "no count to keep",
			observed: &coordinationv1.LeaseSpec{HolderIdentity: ptr("a")},
			want:     coordinationv1.LeaseSpec{HolderIdentity: ptr(""), LeaseDurationSeconds: ptr(int32(1)), AcquireTime: stamp(now), RenewTime: stamp(now)},
		},
	}
	for _, tt := range tests {
		t.Run(tt.reason, func(t *testing.T) {
			if diff := cmp.Diff(tt.want, released(tt.observed, now)); diff != "" {
				t.Errorf("released (-want +got):\n%s", diff)
			}
			// Whoever reads a released Lease takes it at once.
			if _, ok := claim(&tt.want, now, now, "b", 15*time.Second); !ok {
				t.Errorf("a released Lease cannot be claimed")
			}
		})
	}
}
