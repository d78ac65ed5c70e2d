package leader

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.uber.org/zap"
	coordinationv1 "k8s.io/api/coordination/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/metabus/metabus/pkg/kubeapi"
)

// Config configures an Elector.
type Config struct {
	// Namespace and Name name the Lease.
	Namespace, Name string
	// Identity names this replica in the Lease; unique among replicas.
	Identity string
	// LeaseDuration is how long others wait, after they last saw the Lease
	// change, before they take it over.
	LeaseDuration time.Duration
	// RenewDeadline is how long the holder keeps leading without a
	// successful renewal; shorter than LeaseDuration.
	RenewDeadline time.Duration
	// RetryPeriod is the pause between attempts to take or renew the Lease
	// (acquisition attempts are jittered by up to 120% of it).
	RetryPeriod time.Duration
	// ReleaseOnCancel gives the Lease up when leading ends, so another
	// replica takes over without waiting for it to expire.
	ReleaseOnCancel bool
	// OnStartedLeading runs on a goroutine of its own when this replica
	// becomes the holder; its context ends when leading ends.
	OnStartedLeading func(context.Context)
	// OnStoppedLeading runs when leading ends, after OnStartedLeading has
	// returned and before the Lease is released. Only a replica that led
	// calls it.
	OnStoppedLeading func()
	// Log receives failures to read or write the Lease (nil: none).
	Log *zap.Logger
}

// leaseStore reads and writes the one Lease.
type leaseStore interface {
	// get returns the Lease, or nil if it does not exist.
	get(ctx context.Context) (*coordinationv1.Lease, error)
	create(ctx context.Context, l *coordinationv1.Lease) (*coordinationv1.Lease, error)
	// update writes l if its resourceVersion is still current.
	update(ctx context.Context, l *coordinationv1.Lease) (*coordinationv1.Lease, error)
}

// Elector campaigns for a Lease and leads while it holds it.
type Elector struct {
	cfg   Config
	store leaseStore
	now   func() time.Time
	log   *zap.Logger

	// observed is the Lease as last read or written (nil: none seen),
	// changedAt the local time its spec was first seen as it is.
	observed  *coordinationv1.Lease
	changedAt time.Time
}

// New returns an elector for the Lease cfg names, read and written through
// api.
func New(api *kubeapi.Client, cfg Config) (*Elector, error) {
	return newElector(apiLeases{api: api, namespace: cfg.Namespace, name: cfg.Name}, cfg)
}

func newElector(store leaseStore, cfg Config) (*Elector, error) {
	switch {
	case cfg.Name == "" || cfg.Namespace == "":
		return nil, errors.New("leader election: the Lease needs a namespace and a name")
	case cfg.Identity == "":
		return nil, errors.New("leader election: empty identity")
	case cfg.RetryPeriod <= 0:
		return nil, fmt.Errorf("leader election: retry period %s must be positive", cfg.RetryPeriod)
	case cfg.RenewDeadline <= cfg.RetryPeriod:
		return nil, fmt.Errorf("leader election: renew deadline %s must exceed the retry period %s", cfg.RenewDeadline, cfg.RetryPeriod)
	case cfg.LeaseDuration <= cfg.RenewDeadline:
		return nil, fmt.Errorf("leader election: lease duration %s must exceed the renew deadline %s", cfg.LeaseDuration, cfg.RenewDeadline)
	case cfg.LeaseDuration%time.Second != 0:
		return nil, fmt.Errorf("leader election: lease duration %s is not whole seconds (a Lease stores seconds)", cfg.LeaseDuration)
	case cfg.OnStartedLeading == nil || cfg.OnStoppedLeading == nil:
		return nil, errors.New("leader election: both callbacks are required")
	}
	log := cfg.Log
	if log == nil {
		log = zap.NewNop()
	}
	return &Elector{cfg: cfg, store: store, now: time.Now, log: log}, nil
}

// Run campaigns until this replica holds the Lease, leads until a renewal
// fails for the renew deadline (or another replica is seen holding the
// Lease) or ctx ends, and returns. Call it again to campaign again.
func (e *Elector) Run(ctx context.Context) {
	renewed, ok := e.acquire(ctx)
	if !ok {
		return
	}
	leadCtx, stop := context.WithCancel(ctx)
	started := make(chan struct{})
	go func() {
		defer close(started)
		e.cfg.OnStartedLeading(leadCtx)
	}()
	e.lead(ctx, renewed)
	stop()
	<-started
	e.cfg.OnStoppedLeading()
	if e.cfg.ReleaseOnCancel {
		e.release(ctx)
	}
}

// acquire tries to take the Lease every retry period (jittered, so
// replicas started together spread out) until it succeeds or ctx ends. It
// returns when the Lease was last written. An attempt gets the renew
// deadline at most, so a hanging request does not stall the campaign.
func (e *Elector) acquire(ctx context.Context) (time.Time, bool) {
	for {
		tctx, cancel := context.WithTimeout(ctx, e.cfg.RenewDeadline)
		at, ok := e.try(tctx)
		cancel()
		if ok {
			return at, true
		}
		if !sleep(ctx, wait.Jitter(e.cfg.RetryPeriod, 1.2)) {
			return time.Time{}, false
		}
	}
}

// lead renews the Lease every retry period until a renewal has failed for
// the renew deadline since the last success at renewed, another replica
// is seen holding the Lease, or ctx ends. Every attempt is cut off at the
// deadline, so a hanging request cannot keep this replica leading.
func (e *Elector) lead(ctx context.Context, renewed time.Time) {
	for sleep(ctx, e.cfg.RetryPeriod) {
		deadline := renewed.Add(e.cfg.RenewDeadline)
		for {
			tctx, cancel := context.WithDeadline(ctx, deadline)
			at, ok := e.try(tctx)
			cancel()
			if ok {
				renewed = at
				break
			}
			if ctx.Err() != nil || holder(e.spec()) != e.cfg.Identity {
				return
			}
			if !e.now().Before(deadline) {
				e.log.Warn("leader election: could not renew the Lease within the renew deadline; stepping down",
					zap.String("lease", e.cfg.Namespace+"/"+e.cfg.Name), zap.Duration("renewDeadline", e.cfg.RenewDeadline))
				return
			}
			if !sleep(ctx, min(e.cfg.RetryPeriod, deadline.Sub(e.now()))) {
				return
			}
		}
	}
}

// try takes or renews the Lease once. It returns whether this replica
// holds it now and the local time just before the successful write (the
// most the Lease can be credited with: others start their wait when they
// read the write, later).
func (e *Elector) try(ctx context.Context) (time.Time, bool) {
	now := e.now()
	if e.observed != nil && holder(&e.observed.Spec) == e.cfg.Identity {
		// The holder's fast path: renew what it wrote last without
		// reading it first. Anything else (a conflict...) falls back to
		// reading the Lease.
		spec, _ := claim(&e.observed.Spec, e.changedAt, now, e.cfg.Identity, e.cfg.LeaseDuration)
		l := e.observed.DeepCopy()
		l.Spec = spec
		if out, err := e.store.update(ctx, l); err == nil {
			e.observe(out, now)
			return now, true
		}
	}
	cur, err := e.store.get(ctx)
	if err != nil {
		e.log.Warn("leader election: read the Lease", zap.Error(err))
		return time.Time{}, false
	}
	if cur == nil {
		spec, _ := claim(nil, now, now, e.cfg.Identity, e.cfg.LeaseDuration)
		out, err := e.store.create(ctx, &coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{Namespace: e.cfg.Namespace, Name: e.cfg.Name},
			Spec:       spec,
		})
		if err != nil {
			e.writeFailed("create", err)
			return time.Time{}, false
		}
		e.observe(out, now)
		return now, true
	}
	e.observe(cur, now)
	spec, ok := claim(&cur.Spec, e.changedAt, now, e.cfg.Identity, e.cfg.LeaseDuration)
	if !ok {
		return time.Time{}, false
	}
	l := cur.DeepCopy()
	l.Spec = spec
	out, err := e.store.update(ctx, l)
	if err != nil {
		e.writeFailed("update", err)
		return time.Time{}, false
	}
	e.observe(out, now)
	return now, true
}

// observe records l as the Lease last seen, at now if its spec changed.
func (e *Elector) observe(l *coordinationv1.Lease, now time.Time) {
	if e.observed == nil || !equality.Semantic.DeepEqual(e.observed.Spec, l.Spec) {
		e.changedAt = now
	}
	e.observed = l
}

// spec is the Lease's spec as last seen (nil: none).
func (e *Elector) spec() *coordinationv1.LeaseSpec {
	if e.observed == nil {
		return nil
	}
	return &e.observed.Spec
}

// writeFailed logs a failed write; losing a race is the normal way to
// lose an election and not worth a warning.
func (e *Elector) writeFailed(verb string, err error) {
	if apierrors.IsConflict(err) || apierrors.IsAlreadyExists(err) {
		e.log.Debug("leader election: another replica wrote the Lease first", zap.String("verb", verb), zap.Error(err))
		return
	}
	e.log.Warn("leader election: "+verb+" the Lease", zap.Error(err))
}

// release gives the Lease up if this replica still holds it as last seen.
// ctx has usually ended (shutdown), so the write gets a deadline of its
// own.
func (e *Elector) release(ctx context.Context) {
	if e.observed == nil || holder(&e.observed.Spec) != e.cfg.Identity {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), e.cfg.RenewDeadline)
	defer cancel()
	l := e.observed.DeepCopy()
	l.Spec = released(&e.observed.Spec, e.now())
	out, err := e.store.update(ctx, l)
	if err != nil {
		e.writeFailed("release", err)
		return
	}
	e.observe(out, e.now())
}

// sleep waits for d or the end of ctx; it reports whether ctx is still
// live.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// leasesGVR is where Leases live.
var leasesGVR = coordinationv1.SchemeGroupVersion.WithResource("leases")

// apiLeases is the Lease in the API server.
type apiLeases struct {
	api             *kubeapi.Client
	namespace, name string
}

func (a apiLeases) get(ctx context.Context) (*coordinationv1.Lease, error) {
	out := &coordinationv1.Lease{}
	err := a.api.Get(ctx, out, kubeapi.Path(leasesGVR, a.namespace, a.name, "")...)
	if apierrors.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("get lease %s/%s: %w", a.namespace, a.name, err)
	}
	return out, nil
}

func (a apiLeases) create(ctx context.Context, l *coordinationv1.Lease) (*coordinationv1.Lease, error) {
	out := &coordinationv1.Lease{}
	if err := a.api.Create(ctx, kubeapi.Path(leasesGVR, a.namespace, "", ""), typed(l), out); err != nil {
		return nil, fmt.Errorf("create lease %s/%s: %w", a.namespace, a.name, err)
	}
	return out, nil
}

func (a apiLeases) update(ctx context.Context, l *coordinationv1.Lease) (*coordinationv1.Lease, error) {
	out := &coordinationv1.Lease{}
	if err := a.api.Update(ctx, kubeapi.Path(leasesGVR, a.namespace, a.name, ""), typed(l), out); err != nil {
		return nil, fmt.Errorf("update lease %s/%s: %w", a.namespace, a.name, err)
	}
	return out, nil
}

// typed is l with the apiVersion and kind a typed client would send.
func typed(l *coordinationv1.Lease) *coordinationv1.Lease {
	c := *l
	c.APIVersion, c.Kind = coordinationv1.SchemeGroupVersion.String(), "Lease"
	return &c
}
