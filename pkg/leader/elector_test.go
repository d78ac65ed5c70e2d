package leader

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// memLeases is an API server holding one Lease: resourceVersion
// preconditions as the real one has them, and failures on demand.
type memLeases struct {
	mu    sync.Mutex
	lease *coordinationv1.Lease
	rv    int
	down  bool // every request fails
	hang  bool // every request waits for the end of its context
}

// enter starts a request: it fails if the server is down, waits for the
// end of ctx if it hangs, and else returns with m.mu held.
func (m *memLeases) enter(ctx context.Context) error {
	m.mu.Lock()
	switch {
	case m.down:
		m.mu.Unlock()
		return errors.New("connection refused")
	case m.hang:
		m.mu.Unlock()
		<-ctx.Done()
		return ctx.Err()
	}
	return nil
}

var leaseGR = schema.GroupResource{Group: "coordination.k8s.io", Resource: "leases"}

func (m *memLeases) get(ctx context.Context) (*coordinationv1.Lease, error) {
	if err := m.enter(ctx); err != nil {
		return nil, err
	}
	defer m.mu.Unlock()
	if m.lease == nil {
		return nil, nil
	}
	return m.lease.DeepCopy(), nil
}

func (m *memLeases) create(ctx context.Context, l *coordinationv1.Lease) (*coordinationv1.Lease, error) {
	if err := m.enter(ctx); err != nil {
		return nil, err
	}
	defer m.mu.Unlock()
	if m.lease != nil {
		return nil, apierrors.NewAlreadyExists(leaseGR, l.Name)
	}
	return m.store(l), nil
}

func (m *memLeases) update(ctx context.Context, l *coordinationv1.Lease) (*coordinationv1.Lease, error) {
	if err := m.enter(ctx); err != nil {
		return nil, err
	}
	defer m.mu.Unlock()
	if m.lease == nil {
		return nil, apierrors.NewNotFound(leaseGR, l.Name)
	}
	if l.ResourceVersion != m.lease.ResourceVersion {
		return nil, apierrors.NewConflict(leaseGR, l.Name, errors.New("the object has been modified"))
	}
	return m.store(l), nil
}

// store keeps l at a new resourceVersion; m.mu is held.
func (m *memLeases) store(l *coordinationv1.Lease) *coordinationv1.Lease {
	m.rv++
	m.lease = l.DeepCopy()
	m.lease.ResourceVersion = strconv.Itoa(m.rv)
	return m.lease.DeepCopy()
}

func (m *memLeases) set(down, hang bool) {
	m.mu.Lock()
	m.down, m.hang = down, hang
	m.mu.Unlock()
}

// spec is the stored Lease's spec.
func (m *memLeases) spec() coordinationv1.LeaseSpec {
	m.mu.Lock()
	defer m.mu.Unlock()
	return *m.lease.Spec.DeepCopy()
}

// candidate is one replica campaigning on a memLeases.
type candidate struct {
	started, stopped chan struct{}
	// order is "started", "started returned", "stopped" as they happen.
	mu    sync.Mutex
	order []string
	// leading is set while OnStartedLeading's context is live.
	leading atomic.Bool
	cancel  context.CancelFunc
	done    chan struct{}
}

func (c *candidate) note(s string) {
	c.mu.Lock()
	c.order = append(c.order, s)
	c.mu.Unlock()
}

// campaign starts one Run of an elector named id.
func campaign(t *testing.T, store *memLeases, id string, cfg Config) *candidate {
	t.Helper()
	c := &candidate{started: make(chan struct{}), stopped: make(chan struct{}), done: make(chan struct{})}
	cfg.Namespace, cfg.Name, cfg.Identity = "metabus", "lock", id
	cfg.OnStartedLeading = func(ctx context.Context) {
		c.note("started")
		c.leading.Store(true)
		close(c.started)
		<-ctx.Done()
		// Slow to wind down: OnStoppedLeading must still come after.
		time.Sleep(20 * time.Millisecond)
		c.leading.Store(false)
		c.note("started returned")
	}
	cfg.OnStoppedLeading = func() {
		c.note("stopped")
		close(c.stopped)
	}
	e, err := newElector(store, cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	c.cancel = cancel
	go func() {
		defer close(c.done)
		e.Run(ctx)
	}()
	t.Cleanup(func() {
		cancel()
		<-c.done
	})
	return c
}

func (c *candidate) stop(t *testing.T) {
	t.Helper()
	c.cancel()
	select {
	case <-c.done:
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not return after its context ended")
	}
}

func (c *candidate) checkOrder(t *testing.T) {
	t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	if diff := cmp.Diff([]string{"started", "started returned", "stopped"}, c.order); diff != "" {
		t.Errorf("callback order (-want +got):\n%s", diff)
	}
}

// within waits for ch for at most d and reports whether it came.
func within(ch chan struct{}, d time.Duration) bool {
	select {
	case <-ch:
		return true
	case <-time.After(d):
		return false
	}
}

// fast is a configuration for tests: a short retry period and renew
// deadline, a lease duration long enough that a handover within it cannot
// have come from expiry.
var fast = Config{RetryPeriod: 10 * time.Millisecond, RenewDeadline: 300 * time.Millisecond, LeaseDuration: 30 * time.Second}

func TestElectorOneLeaderThenHandoverOnRelease(t *testing.T) {
	store := &memLeases{}
	cfg := fast
	cfg.ReleaseOnCancel = true
	a := campaign(t, store, "a", cfg)
	if !within(a.started, 5*time.Second) {
		t.Fatal("the only candidate never led")
	}
	b := campaign(t, store, "b", cfg)
	if within(b.started, 200*time.Millisecond) {
		t.Fatal("a second candidate led while the first renews")
	}
	a.stop(t)
	a.checkOrder(t)
	if got := store.spec(); holder(&got) == "a" {
		t.Errorf("the Lease still names a after a released it: %+v", got)
	}
	// Long before the 30s lease duration: the release hands over.
	if !within(b.started, 5*time.Second) {
		t.Fatal("the second candidate did not take the released Lease")
	}
	if got := store.spec(); holder(&got) != "b" || *got.LeaseTransitions != 1 {
		t.Errorf("after the handover: holder %q, %d transitions; want b, 1", holder(&got), *got.LeaseTransitions)
	}
}

func TestElectorTakesOverOnlyAfterExpiry(t *testing.T) {
	store := &memLeases{}
	cfg := fast
	cfg.LeaseDuration = time.Second
	a := campaign(t, store, "a", cfg) // no release: as if it crashed
	if !within(a.started, 5*time.Second) {
		t.Fatal("the only candidate never led")
	}
	a.stop(t)
	begin := time.Now()
	b := campaign(t, store, "b", cfg)
	if !within(b.started, 10*time.Second) {
		t.Fatal("the second candidate never took the abandoned Lease")
	}
	if waited := time.Since(begin); waited < cfg.LeaseDuration {
		t.Errorf("took an unreleased Lease after %s, before its %s duration", waited, cfg.LeaseDuration)
	}
}

func TestElectorStepsDownWhenRenewalsFail(t *testing.T) {
	tests := []struct {
		reason     string
		down, hang bool
	}{
		{reason: "the API server refuses every request", down: true},
		// Each attempt is cut off at the renew deadline.
		{reason: "every request hangs", hang: true},
	}
	for _, tt := range tests {
		t.Run(tt.reason, func(t *testing.T) {
			store := &memLeases{}
			a := campaign(t, store, "a", fast)
			if !within(a.started, 5*time.Second) {
				t.Fatal("never led")
			}
			store.set(tt.down, tt.hang)
			lost := time.Now()
			// The last renewal was at most a retry period before the outage.
			if !within(a.stopped, 5*time.Second) {
				t.Fatal("kept leading without renewing")
			}
			if d := time.Since(lost); d > fast.RenewDeadline+200*time.Millisecond {
				t.Errorf("stepped down %s after renewals began to fail; renew deadline %s", d, fast.RenewDeadline)
			}
			a.checkOrder(t)
			if a.leading.Load() {
				t.Error("OnStartedLeading's context still live after OnStoppedLeading")
			}
		})
	}
}

func TestElectorStepsDownWhenTakenOver(t *testing.T) {
	store := &memLeases{}
	cfg := fast
	cfg.RenewDeadline = 20 * time.Second
	cfg.LeaseDuration = 30 * time.Second
	a := campaign(t, store, "a", cfg)
	if !within(a.started, 5*time.Second) {
		t.Fatal("never led")
	}
	// Another replica writes itself in (as if it had judged the Lease
	// expired): a's next renewal conflicts, it reads the Lease and must
	// step down at once, not at the renew deadline.
	store.mu.Lock()
	l := store.lease.DeepCopy()
	l.Spec.HolderIdentity = ptr("z")
	store.store(l)
	store.mu.Unlock()
	if !within(a.stopped, 2*time.Second) {
		t.Fatal("kept leading after another replica took the Lease")
	}
	if got := store.spec(); holder(&got) != "z" {
		t.Errorf("the Lease names %q, want z (a must not overwrite it)", holder(&got))
	}
}

func TestNewElectorValidates(t *testing.T) {
	noop := func(context.Context) {}
	valid := Config{Namespace: "ns", Name: "n", Identity: "a", RetryPeriod: 2 * time.Second, RenewDeadline: 10 * time.Second, LeaseDuration: 15 * time.Second,
		OnStartedLeading: noop, OnStoppedLeading: func() {}}
	tests := []struct {
		reason string
		change func(*Config)
		want   bool // valid
	}{
		{reason: "the watcher's settings", change: func(*Config) {}, want: true},
		{reason: "no name", change: func(c *Config) { c.Name = "" }},
		{reason: "no identity", change: func(c *Config) { c.Identity = "" }},
		{reason: "renew deadline not above the retry period", change: func(c *Config) { c.RenewDeadline = c.RetryPeriod }},
		{reason: "lease duration not above the renew deadline", change: func(c *Config) { c.LeaseDuration = c.RenewDeadline }},
		{reason: "lease duration not whole seconds", change: func(c *Config) { c.LeaseDuration = 15500 * time.Millisecond }},
		{reason: "no retry period", change: func(c *Config) { c.RetryPeriod = 0 }},
		{reason: "a callback missing", change: func(c *Config) { c.OnStoppedLeading = nil }},
	}
	for _, tt := range tests {
		t.Run(tt.reason, func(t *testing.T) {
			cfg := valid
			tt.change(&cfg)
			_, err := newElector(&memLeases{}, cfg)
			if got := err == nil; got != tt.want {
				t.Errorf("valid = %v (%v), want %v", got, err, tt.want)
			}
		})
	}
}
