package readaccess

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/metabus/metabus/pkg/identity"
)

var (
	tenant = identity.Identity{Namespace: "tenant-a", Name: "reader"}
	podsA  = Scope{Identity: tenant, Resource: "pods", Namespace: "tenant-a"}
	podsB  = Scope{Identity: tenant, Resource: "pods", Namespace: "tenant-b"}
	pods   = podsA.Cluster()
	nsRes  = Scope{Identity: tenant, Resource: "namespaces"}
)

// answers is a Lookup of fixed answers.
func answers(m map[Scope]Verdict) Lookup { return func(s Scope) Verdict { return m[s] } }

func TestDecideAndNext(t *testing.T) {
	for _, c := range []struct {
		reason   string
		answers  map[Scope]Verdict
		scope    Scope
		want     Verdict
		wantNext *Scope
	}{
		{reason: "nothing asked yet: the cluster-wide review first, it may answer every namespace",
			scope: podsA, want: Unknown, wantNext: &pods},
		{reason: "allowed cluster-wide covers every namespace, with no namespace review",
			answers: map[Scope]Verdict{pods: Allowed}, scope: podsB, want: Allowed},
		{reason: "denied cluster-wide says nothing of a namespace: its own review is next",
			answers: map[Scope]Verdict{pods: Denied}, scope: podsA, want: Unknown, wantNext: &podsA},
		{reason: "a namespace's own answer decides when the cluster-wide one is a denial",
			answers: map[Scope]Verdict{pods: Denied, podsA: Allowed, podsB: Denied}, scope: podsA, want: Allowed},
		{reason: "another namespace of the same identity stays denied",
			answers: map[Scope]Verdict{pods: Denied, podsA: Allowed, podsB: Denied}, scope: podsB, want: Denied},
		{reason: "a namespace answer is not used while the cluster-wide one is unknown (it failed, or expired)",
			answers: map[Scope]Verdict{podsA: Allowed}, scope: podsA, want: Unknown, wantNext: &pods},
		{reason: "a cluster-scoped resource is decided by its cluster-wide answer alone",
			answers: map[Scope]Verdict{nsRes: Denied}, scope: nsRes, want: Denied},
		{reason: "a cluster-scoped resource never asked",
			scope: nsRes, want: Unknown, wantNext: &nsRes},
		{reason: "another identity's answers do not count",
			answers: map[Scope]Verdict{{Resource: "pods"}: Allowed}, scope: podsA, want: Unknown, wantNext: &pods},
	} {
		t.Run(c.reason, func(t *testing.T) {
			lookup := answers(c.answers)
			next, ok := Next(lookup, c.scope)
			var gotNext *Scope
			if ok {
				gotNext = &next
			}
			if diff := cmp.Diff([]any{c.want, c.wantNext}, []any{Decide(lookup, c.scope), gotNext}); diff != "" {
				t.Errorf("Decide, Next (-want +got):\n%s", diff)
			}
		})
	}
}

func TestCombine(t *testing.T) {
	for _, c := range []struct {
		reason string
		in     []Verdict
		want   Verdict
	}{
		{reason: "list and watch allowed", in: []Verdict{Allowed, Allowed}, want: Allowed},
		{reason: "list without watch is a denial: the watcher's informer watches", in: []Verdict{Allowed, Denied}, want: Denied},
		{reason: "a denial wins over an unknown", in: []Verdict{Unknown, Denied}, want: Denied},
		{reason: "an unknown verb leaves the scope unknown", in: []Verdict{Allowed, Unknown}, want: Unknown},
		{reason: "no answer at all is unknown", want: Unknown},
	} {
		t.Run(c.reason, func(t *testing.T) {
			if got := Combine(c.in...); got != c.want {
				t.Errorf("Combine(%v) = %v, want %v", c.in, got, c.want)
			}
		})
	}
}

// fakeReviews answers reviews from grants (scope → verbs allowed) and
// records each one asked.
type fakeReviews struct {
	mu     sync.Mutex
	grants map[Scope][]string
	fail   error
	asked  []Scope
}

func (f *fakeReviews) review(_ context.Context, s Scope, verb string) (bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.asked = append(f.asked, s)
	if f.fail != nil {
		return false, f.fail
	}
	return slices.Contains(f.grants[s], verb), nil
}

func (f *fakeReviews) take() []Scope {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := f.asked
	f.asked = nil
	return out
}

func (f *fakeReviews) set(grants map[Scope][]string, fail error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.grants, f.fail = grants, fail
}

func TestCacheEnsure(t *testing.T) {
	ctx := context.Background()
	f := &fakeReviews{grants: map[Scope][]string{podsA: {"list", "watch"}, podsB: {"list"}}}
	c := NewCache(f.review, Options{})
	got := []Verdict{}
	for _, s := range []Scope{podsA, podsB, podsA, podsB} {
		v, err := c.Ensure(ctx, s)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, v)
	}
	if diff := cmp.Diff([]Verdict{Allowed, Denied, Allowed, Denied}, got); diff != "" {
		t.Errorf("verdicts (-want +got):\n%s", diff)
	}
	// Each scope reviewed once, verb by verb up to the first denied one,
	// and never again for a cached answer.
	want := []Scope{pods, podsA, podsA, podsB, podsB}
	if diff := cmp.Diff(want, f.take()); diff != "" {
		t.Errorf("reviews asked (-want +got):\n%s", diff)
	}
	if v := c.Verdict(podsA); v != Allowed {
		t.Errorf("cached verdict %v, want allowed", v)
	}
}

func TestCacheEnsureFailure(t *testing.T) {
	f := &fakeReviews{fail: errors.New("apiserver down")}
	c := NewCache(f.review, Options{})
	v, err := c.Ensure(context.Background(), podsA)
	if err == nil || v != Unknown {
		t.Fatalf("Ensure = %v, %v; want unknown and an error", v, err)
	}
	f.set(map[Scope][]string{pods: {"list", "watch"}}, nil)
	if v, err := c.Ensure(context.Background(), podsA); err != nil || v != Allowed {
		t.Errorf("Ensure after the API server answers = %v, %v; want allowed", v, err)
	}
}

func TestCacheRecheck(t *testing.T) {
	ctx := context.Background()
	now := time.Unix(0, 0)
	f := &fakeReviews{grants: map[Scope][]string{podsA: {"list", "watch"}}}
	var changed []identity.Identity
	c := NewCache(f.review, Options{Recheck: time.Minute, Idle: 2 * time.Minute, Now: func() time.Time { return now },
		OnChange: func(id identity.Identity) { changed = append(changed, id) }})
	if v, _ := c.Ensure(ctx, podsA); v != Allowed {
		t.Fatalf("Ensure = %v", v)
	}
	f.take()

	// The grant is revoked: the next round sees it and says so.
	f.set(nil, nil)
	now = now.Add(time.Minute)
	c.recheck(ctx, nil)
	if diff := cmp.Diff([]any{Denied, []identity.Identity{tenant}}, []any{c.Verdict(podsA), changed}); diff != "" {
		t.Errorf("after revocation (-want +got):\n%s", diff)
	}

	// Reviews fail: the last answer holds for three rechecks, then turns
	// unknown rather than be trusted for ever.
	f.set(map[Scope][]string{podsA: {"list", "watch"}}, errors.New("down"))
	var failures int
	for i := range 4 {
		now = now.Add(time.Minute)
		c.lookup(pods) // in use
		c.lookup(podsA)
		c.recheck(ctx, func(Scope, error) { failures++ })
		want := Denied
		if i == 3 {
			want = Unknown
		}
		if got := c.Verdict(podsA); got != want {
			t.Errorf("round %d of failures: %v, want %v", i, got, want)
		}
	}
	if failures == 0 {
		t.Error("failed rechecks were not reported")
	}

	// Unused for Idle: dropped, and no longer reviewed.
	f.set(nil, nil)
	for range 3 {
		c.recheck(ctx, nil)
	}
	f.take()
	c.recheck(ctx, nil)
	if diff := cmp.Diff([]any{0, []Scope(nil)}, []any{c.Len(), f.take()}); diff != "" {
		t.Errorf("idle answers (-want +got):\n%s", diff)
	}
}

func TestCacheRefreshAndBound(t *testing.T) {
	ctx := context.Background()
	f := &fakeReviews{grants: map[Scope][]string{pods: {"list", "watch"}}}
	c := NewCache(f.review, Options{Max: 2})
	other := Scope{Identity: identity.Identity{Namespace: "x", Name: "y"}, Resource: "pods"}
	for _, s := range []Scope{podsA, other} {
		if _, err := c.Ensure(ctx, s); err != nil {
			t.Fatal(err)
		}
	}
	f.take()
	// A spec change re-asks the identity's cached answers and the plan's
	// scopes, not another identity's.
	if err := c.Refresh(ctx, tenant, []Scope{nsRes}); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]Scope{nsRes, pods, pods}, f.take()); diff != "" {
		t.Errorf("refreshed (-want +got):\n%s", diff)
	}
	if n := c.Len(); n != 2 {
		t.Errorf("%d answers cached, want the bound 2", n)
	}
}

func TestScopeString(t *testing.T) {
	got := []string{podsA.String(), Scope{Group: "apps", Resource: "deployments"}.String()}
	want := []string{"pods in namespace tenant-a", "deployments.apps (cluster-wide)"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
}

// TestCacheRun: Run re-checks on its own, within a Recheck, and tells of
// a change; it ends with its context.
func TestCacheRun(t *testing.T) {
	f := &fakeReviews{grants: map[Scope][]string{pods: {"list", "watch"}}}
	changed := make(chan identity.Identity, 1)
	c := NewCache(f.review, Options{Recheck: 10 * time.Millisecond, OnChange: func(id identity.Identity) { changed <- id }})
	if v, _ := c.Ensure(context.Background(), podsA); v != Allowed {
		t.Fatalf("Ensure = %v", v)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { c.Run(ctx, nil); close(done) }()
	f.set(nil, nil)
	select {
	case id := <-changed:
		if id != tenant {
			t.Errorf("change of %v, want %v", id, tenant)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no re-check saw the revocation")
	}
	cancel()
	<-done
	if v := c.Verdict(pods); v != Denied {
		t.Errorf("after revocation: %v, want denied", v)
	}
}
