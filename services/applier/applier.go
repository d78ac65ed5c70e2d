// Package applier is the metabus stage that converges the cluster towards
// desired states: it consumes MC_DESIRED (per-parent order, any number of
// replicas), validates the hook's desired children, creates, updates and
// deletes children with optimistic concurrency, and writes the parent's
// status only when it changed.
//
// It reads observed state from the watcher's snapshot service, never with a
// GET: a no-op apply costs no API call at all.
package applier

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/metabus/metabus/pkg/bus"
	"github.com/metabus/metabus/pkg/discovery"
	"github.com/metabus/metabus/pkg/echo"
	"github.com/metabus/metabus/pkg/events"
	"github.com/metabus/metabus/pkg/obs"
	"github.com/metabus/metabus/pkg/revstore"
	"github.com/metabus/metabus/pkg/snapshot"
)

// Config is the applier's configuration (flags).
type Config struct {
	// Workers bounds the concurrent applies of one controller in this
	// replica; MaxInFlight bounds them across controllers.
	Workers, MaxInFlight int
	SnapshotWait         time.Duration
	DiscoveryInterval    time.Duration
	EventsQPS            float32
	EventsBurst          int
	Bus                  bus.Options
}

// Defaults fills unset fields.
func (c *Config) Defaults() {
	if c.Workers <= 0 {
		c.Workers = 16
	}
	if c.SnapshotWait <= 0 {
		c.SnapshotWait = 5 * time.Second
	}
	if c.DiscoveryInterval <= 0 {
		c.DiscoveryInterval = 30 * time.Second
	}
}

// Deps are the applier's connections.
type Deps struct {
	REST      *rest.Config
	NC        *nats.Conn
	JS        jetstream.JetStream
	Snapshots snapshot.Source
	// Revisions reaches the revisions service; nil means over NATS (Client on NC).
	Revisions revstore.Store
	Log       *zap.Logger
	Metrics   prometheus.Registerer
	Health    *obs.Health
	Trace     obs.Tracer
	// Echoes, if set, is the Book of the dispatchers and watcher in this
	// process: applied notes are recorded in it at once, before the
	// broadcast, so that an echo never outruns its note in-process.
	Echoes *echo.Book
}

// Applier is a running applier.
type Applier struct {
	cfg     Config
	log     *zap.Logger
	js      jetstream.JetStream
	pub     bus.Publisher
	dyn     dynamic.Interface
	disc    *discovery.Map
	snaps   snapshot.Source
	revs    revstore.Store
	rec     *events.Recorder
	health  *obs.Health
	metrics *metrics
	trace   obs.Tracer
	nc      *nats.Conn
	echoes  *echo.Book

	// written is this replica's last write of each parent (read your
	// writes), "<group>/<resource>=<resourceVersion>" by controller/parent.
	wmu     sync.Mutex
	written map[string]string

	streamOnce sync.Once
	stream     jetstream.Stream
	streamErr  error
}

// New builds an applier.
func New(cfg Config, deps Deps) (*Applier, error) {
	cfg.Defaults()
	if deps.REST == nil || deps.JS == nil || deps.NC == nil {
		return nil, errors.New("applier: REST config and NATS connection are required")
	}
	log := deps.Log
	if log == nil {
		log = zap.NewNop()
	}
	dyn, err := dynamic.NewForConfig(deps.REST)
	if err != nil {
		return nil, fmt.Errorf("dynamic client: %w", err)
	}
	kube, err := kubernetes.NewForConfig(deps.REST)
	if err != nil {
		return nil, fmt.Errorf("kubernetes client: %w", err)
	}
	snaps := deps.Snapshots
	if snaps == nil {
		snaps = snapshot.Client{NC: deps.NC}
	}
	revs := deps.Revisions
	if revs == nil {
		revs = revstore.Client{NC: deps.NC}
	}
	health := deps.Health
	if health == nil {
		health = &obs.Health{}
	}
	return &Applier{
		cfg:     cfg,
		log:     log.Named("applier"),
		js:      deps.JS,
		pub:     bus.Publisher{JS: deps.JS},
		dyn:     dyn,
		disc:    discovery.New(kube.Discovery()),
		snaps:   snaps,
		revs:    revs,
		rec:     events.New(kube, events.Options{QPS: cfg.EventsQPS, Burst: cfg.EventsBurst, Component: "metabus-applier"}),
		health:  health,
		metrics: newMetrics(deps.Metrics),
		trace:   deps.Trace,
		nc:      deps.NC,
		echoes:  deps.Echoes,
		written: map[string]string{},
	}, nil
}

// Run consumes desired states until ctx is done.
func (a *Applier) Run(ctx context.Context) error {
	defer a.rec.Shutdown(ctx)
	if err := bus.WaitReady(ctx, a.js); err != nil {
		return err
	}
	if err := a.disc.Refresh(ctx); err != nil {
		a.log.Warn("initial discovery incomplete", zap.Error(err))
	}
	go a.disc.Run(ctx, a.cfg.DiscoveryInterval, func(err error) { a.log.Warn("discovery refresh", zap.Error(err)) })
	ackWait := a.cfg.Bus.DesiredAckWait
	if ackWait <= 0 {
		ackWait = bus.DesiredAckWait
	}
	a.health.SetReady("applier", func() error { return nil })
	a.log.Info("applier started", zap.Int("workers", a.cfg.Workers))
	return bus.Consume(ctx, a.js, bus.ConsumeConfig{
		Stream: bus.DesiredStream, Prefix: bus.DesiredConsumerPrefix, Stage: bus.DesiredStage,
		PerController: a.cfg.Workers, Total: a.cfg.MaxInFlight, AckWait: ackWait, Ordered: true,
		OnError: func(err error) { a.log.Warn("desired-state consumer", zap.Error(err)) },
	}, a.handle)
}

func (a *Applier) desiredStream(ctx context.Context) (jetstream.Stream, error) {
	a.streamOnce.Do(func() { a.stream, a.streamErr = a.js.Stream(ctx, bus.DesiredStream) })
	return a.stream, a.streamErr
}

// superseded reports whether a newer desired state for the same parent is
// already in the stream: applying this one would only be undone.
func (a *Applier) superseded(ctx context.Context, ds *bus.DesiredState, seq uint64) bool {
	st, err := a.desiredStream(ctx)
	if err != nil {
		return false
	}
	last, err := st.GetLastMsgForSubject(ctx, bus.StoredDesiredSubject(ds.Controller.ID(), ds.Parent.UID))
	if err != nil {
		return false // apply: correctness does not depend on skipping
	}
	return last.Sequence > seq
}

func (a *Applier) handle(ctx context.Context, m jetstream.Msg) {
	var ds bus.DesiredState
	if err := bus.Decode(m, bus.TypeDesired, &ds); err != nil {
		a.log.Error("dropping malformed desired state", zap.Error(err))
		_ = m.TermWithReason("malformed desired state")
		return
	}
	md, err := m.Metadata()
	if err != nil {
		_ = m.NakWithDelay(time.Second)
		return
	}
	seq := md.Sequence.Stream
	// A newer desired state of this parent already in hand, or in the
	// stream: this one would only be undone. Nothing pending behind this
	// message in its partition means nothing newer in the stream either:
	// skip the lookup then.
	// A finalizer release is never skipped: a newer desired state of the
	// same parent need not release it (a stale sync from before the
	// finalize hook was removed), and the release is idempotent.
	if ds.Hook != bus.HookRelease && (bus.NewerQueued(ctx) || (md.NumPending > 0 && a.superseded(ctx, &ds, seq))) {
		a.metrics.applies.WithLabelValues("superseded").Inc()
		_ = m.Ack()
		return
	}
	start := time.Now()
	wl := a.newWriteLog(&ds)
	res := a.traced(withWriteLog(ctx, wl), &ds)
	a.metrics.applies.WithLabelValues(res.result).Inc()
	a.metrics.applySeconds.WithLabelValues(res.result).Observe(time.Since(start).Seconds())
	if res.infra {
		_ = m.NakWithDelay(time.Second)
		return
	}
	if res.result == "ok" || res.result == "noop" {
		a.noteApplied(&ds, wl)
	}
	_ = m.Ack()
}

// traced runs the apply inside the tracer's begin/end, closed before the
// message is settled (the ack releases the partition to other replicas).
func (a *Applier) traced(ctx context.Context, ds *bus.DesiredState) result {
	if a.trace != nil {
		defer a.trace("applier", ds.Parent.UID)()
	}
	return a.apply(ctx, ds)
}

type result struct {
	result string
	infra  bool
}

// workItem is the work item that re-runs this parent's sync.
func workItem(ds *bus.DesiredState, reason string, attempt int) bus.WorkItem {
	return bus.WorkItem{Controller: ds.Controller, Parent: ds.Parent, Reason: reason, Attempt: attempt}
}

// retry schedules another sync of the parent with backoff, after an apply
// failure. The sync reads fresh state and calls the hook again, which is
// what a changed world calls for.
func (a *Applier) retry(ctx context.Context, ds *bus.DesiredState, reason string, err error) result {
	if ctx.Err() != nil {
		// Shutting down: leave the message unacked for another replica.
		return result{result: "cancelled", infra: true}
	}
	n := ds.Attempt + 1
	delay := bus.Backoff(n)
	msg := err.Error()
	if denied := denials(err); len(denied) > 0 {
		// Missing RBAC: only an admin can fix it. Say what to grant, and
		// wait long enough not to hammer the API server meanwhile.
		reason, delay = events.ReasonApplyForbidden, forbiddenBackoff(n)
		msg = forbiddenMessage(denied, delay)
	}
	a.log.Warn("apply failed; retrying with backoff", zap.String("controller", ds.Controller.Name),
		zap.String("parent", ds.Parent.Namespace+"/"+ds.Parent.Name), zap.Int("attempt", n),
		zap.Duration("retryIn", delay), zap.String("reason", reason), zap.Error(err))
	if reason != "" {
		a.rec.Warning(ds.Parent.Stub(), reason, msg)
	}
	if serr := a.pub.Schedule(ctx, workItem(ds, bus.ReasonRetry, n), time.Now().Add(delay)); serr != nil {
		a.log.Error("schedule retry", zap.Error(serr))
		return result{result: "error", infra: true}
	}
	return result{result: "error"}
}

// requeue re-runs the sync within a second: the cluster changed under us
// (409). The change that caused the conflict has an event of its own, which
// normally syncs the parent at once; this is the safety net for a change the
// watcher drops as our own write (a cache that lagged it). It goes through
// the parent's schedule rather than straight to MC_WORK so that a parent
// being changed in a burst, whose applies keep conflicting, costs at most
// one extra sync a second instead of one per conflict.
func (a *Applier) requeue(ctx context.Context, ds *bus.DesiredState) result {
	if err := a.pub.Schedule(ctx, workItem(ds, bus.ReasonConflict, ds.Attempt), time.Now()); err != nil {
		a.log.Warn("requeue after conflict", zap.Error(err))
		return result{result: "conflict", infra: true}
	}
	return result{result: "conflict"}
}
