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
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"

	"github.com/metabus/metabus/pkg/apply"
	"github.com/metabus/metabus/pkg/bus"
	"github.com/metabus/metabus/pkg/discovery"
	"github.com/metabus/metabus/pkg/echo"
	"github.com/metabus/metabus/pkg/events"
	"github.com/metabus/metabus/pkg/events/recorder"
	ctlid "github.com/metabus/metabus/pkg/identity"
	"github.com/metabus/metabus/pkg/inspect"
	"github.com/metabus/metabus/pkg/jsbus"
	"github.com/metabus/metabus/pkg/kubeapi"
	"github.com/metabus/metabus/pkg/natsx"
	"github.com/metabus/metabus/pkg/obs"
	// Aliased: the package's tests name a helper outcome.
	busoutcome "github.com/metabus/metabus/pkg/outcome"
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
	// Strategy is how children are written: upstream's --apply-strategy,
	// apply.DynamicApply (default) or apply.ServerSideApply.
	Strategy apply.Strategy
	// FieldManager is the field manager of server-side applies
	// (--apply-strategy-ssa-field-manager, default "metacontroller" as
	// upstream).
	FieldManager string
	// BusEvents publishes the consumer-facing events (package bus,
	// busevents.go) of every desired state settled, and keeps their stream
	// with BusEventsMaxAge and BusEventsMaxBytes (0: the defaults).
	BusEvents         bool
	BusEventsMaxAge   time.Duration
	BusEventsMaxBytes int64
	// BusEventsReplicas is the events stream's replica count (0: Bus's).
	BusEventsReplicas int
	// DefaultServiceAccount is the identity of a controller that names
	// none (--default-service-account); none: the applier's own authority,
	// as upstream. See impersonate.go.
	DefaultServiceAccount ctlid.Identity
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
	if c.Strategy == "" {
		c.Strategy = apply.DynamicApply
	}
	if c.FieldManager == "" {
		c.FieldManager = apply.DefaultFieldManager
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
	cfg   Config
	log   *zap.Logger
	js    jetstream.JetStream
	sched scheduler
	// dyn (and raw) are the applier's own clients, which the writes of a
	// controller acting as no identity go through (identities: the others).
	dyn dynamic.Interface
	// raw makes the hot writes without decoding their answers (nil: the
	// dynamic client makes them, as in unit tests with a fake one).
	raw     *rawClient
	disc    *discovery.Map
	snaps   snapshot.Source
	revs    revstore.Store
	rec     *recorder.Recorder
	health  *obs.Health
	metrics *metrics
	trace   obs.Tracer
	nc      *nats.Conn
	echoes  *echo.Book

	// identities are the clients impersonating each controller identity
	// (nil: none can be built, as in unit tests).
	identities *identityClients

	// written is this replica's last write of each parent (read your
	// writes), by controller/parent.
	wmu     sync.Mutex
	written map[string]ownWrite
	// applied is this replica's memory of its server-side applies.
	applied appliedMemory

	streamOnce sync.Once
	stream     jetstream.Stream
	streamErr  error

	// member is this replica's stage member id (its leases' value), and
	// book its record of recent applies for the operator CLI.
	member string
	book   *inspect.Book
}

// New builds an applier.
func New(cfg Config, deps Deps) (*Applier, error) {
	cfg.Defaults()
	if deps.REST == nil || deps.JS == nil || deps.NC == nil {
		return nil, errors.New("applier: REST config and NATS connection are required")
	}
	if _, err := apply.ParseStrategy(string(cfg.Strategy)); err != nil {
		return nil, fmt.Errorf("applier: %w", err)
	}
	log := deps.Log
	if log == nil {
		log = zap.NewNop()
	}
	if cfg.Strategy == apply.ServerSideApply {
		log.Info("children are written with server-side apply", zap.String("fieldManager", cfg.FieldManager))
	}
	// Every write of a desired state is checked against the partition
	// lease of the handler making it, right before it is sent.
	writes := rest.CopyConfig(deps.REST)
	writes.Wrap(jsbus.LeaseGuard)
	own, err := newWriters(writes)
	if err != nil {
		return nil, err
	}
	if !cfg.DefaultServiceAccount.None() {
		log.Info("controllers that name no identity act as the default one", zap.String("serviceAccount", cfg.DefaultServiceAccount.String()))
	}
	kube, err := kubeapi.NewForConfig(deps.REST)
	if err != nil {
		return nil, fmt.Errorf("kubernetes client: %w", err)
	}
	snaps := deps.Snapshots
	if snaps == nil {
		snaps = jsbus.SnapshotClient{NC: deps.NC}
	}
	revs := deps.Revisions
	if revs == nil {
		revs = jsbus.RevisionsClient{NC: deps.NC}
	}
	health := deps.Health
	if health == nil {
		health = &obs.Health{}
	}
	// Not ready until Run has found the streams and consumes.
	health.Pending(readyCheck, "starting")
	member := jsbus.NewMemberID()
	a := &Applier{
		member:  member,
		book:    inspect.New(bus.DesiredStage, member, 0),
		cfg:     cfg,
		log:     log.Named("applier"),
		js:      deps.JS,
		sched:   jsbus.Publisher{JS: deps.JS},
		dyn:     own.dyn,
		raw:     own.raw,
		disc:    discovery.New(discovery.APIServer{API: kube}),
		snaps:   snaps,
		revs:    revs,
		rec:     recorder.New(kube, recorder.Options{QPS: cfg.EventsQPS, Burst: cfg.EventsBurst, Component: "metabus-applier"}),
		health:  health,
		metrics: newMetrics(deps.Metrics),
		trace:   deps.Trace,
		nc:      deps.NC,
		echoes:  deps.Echoes,
		written: map[string]ownWrite{},
	}
	// The writes of a controller that names an identity, impersonating it.
	a.identities = newIdentityClients(writes, newWriters)
	a.metrics.watchNATS(deps.Metrics, deps.NC)
	if a.metrics.err != nil {
		a.log.Warn("some metrics are not exported", zap.Error(a.metrics.err))
	}
	return a, nil
}

// readyCheck names the applier's readiness check.
const readyCheck = "applier"

// Run consumes desired states until ctx is done.
func (a *Applier) Run(ctx context.Context) error {
	defer a.rec.Shutdown(ctx)
	a.health.Pending(readyCheck, "waiting for the streams and consumers")
	if err := jsbus.WaitReady(ctx, a.js); err != nil {
		return err
	}
	if a.cfg.BusEvents {
		o := a.cfg.Bus
		if a.cfg.BusEventsReplicas > 0 {
			o.Replicas = a.cfg.BusEventsReplicas
		}
		if err := jsbus.EnsureEventsStream(ctx, a.js, bus.EventsStreamConfig(o, a.cfg.BusEventsMaxAge, a.cfg.BusEventsMaxBytes)); err != nil {
			return fmt.Errorf("--bus-events: %w", err)
		}
	}
	if err := a.disc.Refresh(ctx); err != nil {
		a.log.Warn("initial discovery incomplete", zap.Error(err))
	}
	go a.disc.Run(ctx, a.cfg.DiscoveryInterval, func(err error) { a.log.Warn("discovery refresh", zap.Error(err)) })
	ackWait := a.cfg.Bus.DesiredAckWait
	if ackWait <= 0 {
		ackWait = bus.DesiredAckWait
	}
	stopInspect, err := a.book.Serve(a.nc)
	if err != nil {
		return fmt.Errorf("serve inspect requests: %w", err)
	}
	defer stopInspect()
	// The consumer is restarted with backoff whenever it cannot start (a
	// partition read timing out while a cluster elects its leaders) or
	// stops, never the process; the replica is not ready meanwhile.
	var (
		mu   sync.Mutex
		down = errors.New("desired-state consumer starting")
	)
	connected := natsx.Check(a.nc)
	a.health.SetReady(readyCheck, func() error {
		if err := connected(); err != nil {
			return err
		}
		mu.Lock()
		defer mu.Unlock()
		return down
	})
	a.log.Info("applier started", zap.Int("workers", a.cfg.Workers))
	jsbus.Supervise(ctx, jsbus.SuperviseOptions{}, func(ctx context.Context) error {
		return jsbus.Consume(ctx, a.js, jsbus.ConsumeConfig{
			Stream: bus.DesiredStream, Prefix: bus.DesiredConsumerPrefix, Stage: bus.DesiredStage,
			PerController: a.cfg.Workers, Total: a.cfg.MaxInFlight, AckWait: ackWait, Ordered: true, Member: a.member, FixedLayout: a.cfg.Bus.FixedLayout,
			KeepOlder: isRelease,
			OnError:   obs.ConsumerErrors(a.log, "desired-state consumer"),
			Ownership: a.metrics.partitions,
		}, a.handle)
	}, func(err error) {
		mu.Lock()
		defer mu.Unlock()
		if err != nil {
			a.log.Error("desired-state consumer stopped, restarting", zap.Error(err))
			down = fmt.Errorf("desired-state consumer down: %w", err)
			return
		}
		down = nil
	})
	return nil
}

// isRelease reports whether a desired state's body is a finalizer release:
// a newer desired state of the same parent never supersedes one (see
// handle), so the bus keeps it when a newer one runs first.
func isRelease(_ nats.Header, data []byte) bool {
	var ds struct {
		Hook string `json:"hook"`
	}
	return json.Unmarshal(data, &ds) == nil && ds.Hook == bus.HookRelease
}

func (a *Applier) desiredStream(ctx context.Context) (jetstream.Stream, error) {
	a.streamOnce.Do(func() { a.stream, a.streamErr = a.js.Stream(ctx, bus.DesiredStream) })
	return a.stream, a.streamErr
}

// superseded reports whether a newer desired state for the same item (the
// parent, or the same map key of it) is already in the stream: applying
// this one would only be undone. Another key's, or the per-parent one's,
// says nothing about this one.
func (a *Applier) superseded(ctx context.Context, ds *bus.DesiredState, seq uint64) bool {
	st, err := a.desiredStream(ctx)
	if err != nil {
		return false
	}
	last, err := st.GetLastMsgForSubject(ctx, bus.StoredDesiredSubjectKey(ds.Controller.ID(), ds.Parent.UID, ds.MapKey))
	if err != nil {
		return false // apply: correctness does not depend on skipping
	}
	return last.Sequence > seq
}

// handle applies one desired state and returns the message's outcome,
// which jsbus.Consume settles.
func (a *Applier) handle(ctx context.Context, m jetstream.Msg) busoutcome.Outcome {
	var ds bus.DesiredState
	if err := jsbus.Decode(m, bus.TypeDesired, &ds); err != nil {
		a.log.Error("dropping malformed desired state", zap.Error(err))
		return busoutcome.Terminal("malformed desired state")
	}
	md, err := m.Metadata()
	if err != nil {
		return retrySoon
	}
	seq := md.Sequence.Stream
	// A newer desired state of this parent already in hand, or in the
	// stream: this one would only be undone. Nothing pending behind this
	// message in its partition means nothing newer in the stream either:
	// skip the lookup then.
	// A finalizer release is never skipped: a newer desired state of the
	// same parent need not release it (a stale sync from before the
	// finalize hook was removed), and the release is idempotent.
	if ds.Hook != bus.HookRelease && (jsbus.NewerQueued(ctx) || (md.NumPending > 0 && a.superseded(ctx, &ds, seq))) {
		return a.settle(ctx, &ds, nil, time.Time{}, done(resultSuperseded))
	}
	start := time.Now()
	wl := a.newWriteLog(&ds)
	err = a.traced(withWriteLog(ctx, wl), &ds)
	return a.settle(ctx, &ds, wl, start, err)
}

// traced runs the apply inside the tracer's begin/end, closed before the
// message is settled (the ack releases the partition to other replicas).
func (a *Applier) traced(ctx context.Context, ds *bus.DesiredState) error {
	if a.trace != nil {
		// The unit that must never be applied twice at once is the item:
		// the keys of one parent are applied in parallel.
		defer a.trace("applier", bus.ParentToken(ds.Parent.UID, ds.MapKey))()
	}
	return a.apply(ctx, ds)
}

// Results of an apply, the values of the result label of
// metabus_applier_applies_total and metabus_applier_apply_duration_seconds.
const (
	resultOK             = "ok"
	resultNoop           = "noop"
	resultSuperseded     = "superseded"
	resultNotFound       = "notfound"
	resultInvalid        = "invalid"
	resultUnsupported    = "unsupported"
	resultParentDeleting = "parent_deleting"
	resultFinalized      = "finalized"
	resultReleased       = "released"
	resultConflict       = "conflict"
	resultError          = "error"
	resultCancelled      = "cancelled"
)

// done ends an apply without a failure; its value is the result label
// (noop, notfound, parent_deleting, finalized...). A nil error is "ok".
type done string

func (d done) Error() string { return "apply ended: " + string(d) }

// applyError is an apply that failed: the parent is synced again with
// backoff, since a fresh sync (new observed state, a new hook answer) is
// what a changed world calls for. reason, if set, is the Warning Event
// reason on the parent; "" is a transient failure not worth an Event.
type applyError struct {
	reason string
	err    error
}

func (e *applyError) Error() string { return e.err.Error() }
func (e *applyError) Unwrap() error { return e.err }

// retryAfter fails an apply with the Event reason ("" for none).
func retryAfter(reason string, err error) error { return &applyError{reason: reason, err: err} }

// requeueError re-runs the parent's sync at once: the cluster changed
// under the apply (a 409), or the desired state was computed from a view
// that has moved on. attempt is the work item's retry count.
type requeueError struct{ attempt int }

func (e *requeueError) Error() string { return "the parent changed under the apply; syncing again" }

// requeue asks for another sync at once, with the desired state's attempt.
func requeue(ds *bus.DesiredState) error { return &requeueError{attempt: ds.Attempt} }

// scheduler is where settle schedules a parent's next sync (MC_SCHED
// through jsbus.Publisher).
type scheduler interface {
	Schedule(ctx context.Context, item bus.WorkItem, at time.Time) error
}

// workItem is the work item that re-runs the sync of ds's item (the
// parent, or its map key). A conflict requeue names the sync it repeats
// (AfterSeq), so that a dispatcher that has called the hook for a later
// change of the same item since can skip it.
func workItem(ds *bus.DesiredState, reason string, attempt int) bus.WorkItem {
	item := bus.WorkItem{Controller: ds.Controller, Parent: ds.Parent, MapKey: ds.MapKey, Reason: reason, Attempt: attempt}
	if reason == bus.ReasonConflict {
		item.AfterSeq = ds.WorkSeq
	}
	return item
}

// settle is the one place an apply's end becomes its effects: the Event
// on the parent, the parent's next sync (backoff or at once), the result
// metric, the applied note, and the message's outcome (outcomeOf), which
// the bus settles.
//
//   - nil is "ok", a done its own result: Done (ok and noop also note that
//     the desired state was applied, so watchers and dispatchers can drop
//     the echoes of its writes; every Done outcome ends with a Done note,
//     which the dispatcher that published it may be waiting for);
//   - a requeueError ("conflict") schedules the sync now. It goes through
//     the parent's schedule rather than straight to MC_WORK so that a
//     parent changed in a burst, whose applies keep conflicting, costs at
//     most one extra sync a second instead of one per conflict; the change
//     that caused the conflict normally has an event of its own, and this
//     is the safety net for one the watcher dropped as our own write;
//   - any other error ("error") schedules the sync with per-parent
//     exponential backoff, and records the Event of an applyError with a
//     reason. Writes refused by RBAC become ApplyForbidden, with what to
//     grant and a longer backoff: only an admin can fix them.
//
// A failure to schedule, or a shutdown during a failed apply, retries the
// message instead (in place, or by another replica once this one has lost
// its lease).
func (a *Applier) settle(ctx context.Context, ds *bus.DesiredState, wl *writeLog, start time.Time, err error) busoutcome.Outcome {
	result := resultOK
	var requeue error // why the sync a failed apply owes was not scheduled
	var (
		finished done
		requeued *requeueError
	)
	switch {
	case err == nil:
	case errors.As(err, &finished):
		result = string(finished)
	case errors.As(err, &requeued):
		result = resultConflict
		if serr := a.sched.Schedule(ctx, workItem(ds, bus.ReasonConflict, requeued.attempt), time.Now()); serr != nil {
			a.log.Warn("requeue after conflict", zap.Error(serr))
			requeue = serr
		}
	case ctx.Err() != nil:
		// Shutting down: leave the message unacked for another replica.
		result, requeue = resultCancelled, ctx.Err()
	default:
		result = resultError
		n := ds.Attempt + 1
		delay := bus.Backoff(n)
		reason, msg := "", err.Error()
		var failed *applyError
		if errors.As(err, &failed) {
			reason = failed.reason
		}
		if denied := denials(err); len(denied) > 0 {
			reason, delay = events.ReasonApplyForbidden, forbiddenBackoff(n)
			var id ctlid.Identity
			if wl != nil {
				id = wl.identity
			}
			msg = forbiddenMessage(denied, delay, id)
		}
		a.log.Warn("apply failed; retrying with backoff", zap.String("controller", ds.Controller.Name),
			zap.String("parent", ds.Parent.Namespace+"/"+ds.Parent.Name), zap.String("mapKey", ds.MapKey), zap.Int("attempt", n),
			zap.Duration("retryIn", delay), zap.String("reason", reason), zap.Error(err))
		if reason != "" {
			a.rec.Warning(ds.Parent.Stub(), reason, msg)
		}
		if serr := a.sched.Schedule(ctx, workItem(ds, bus.ReasonRetry, n), time.Now().Add(delay)); serr != nil {
			a.log.Error("schedule retry", zap.Error(serr))
			requeue = serr
		}
	}
	a.metrics.applies.WithLabelValues(ds.Controller.Kind, ds.Controller.Name, result).Inc()
	if !start.IsZero() {
		a.metrics.applySeconds.WithLabelValues(result).Observe(time.Since(start).Seconds())
	}
	a.record(ds, wl, start, result, err)
	out := outcomeOf(err, requeue)
	if out.Retries() {
		return out
	}
	a.publishEvents(ds, wl, result, err)
	a.noteDone(ds, wl, result == resultOK || result == resultNoop)
	return out
}

// retrySoon is the outcome of a desired state that could not be handled
// for want of the bus: retried in place after a second (growing while it
// keeps failing), keeping its parent's turn.
var retrySoon = busoutcome.Retry(time.Second, 0)

// outcomeOf is the outcome of a desired state whose apply ended with err,
// once settle has done what err asks for; requeue is why the sync a
// conflict or a failure owes could not be scheduled (nil: it was), the
// applier shutting down included.
//
// An apply that ended (nil, or a done: ok, noop, superseded, notfound...)
// owes nothing: Done. A conflict (requeueError) or a failure (applyError,
// or any other error) is Done once the parent's next sync is scheduled
// through MC_SCHED: that sync, a new work item, is the retry. One that
// could not be scheduled is retried in place soon, so that the message
// comes back rather than the parent being forgotten.
func outcomeOf(err, requeue error) busoutcome.Outcome {
	var finished done
	if err == nil || errors.As(err, &finished) || requeue == nil {
		return busoutcome.Done()
	}
	return retrySoon
}

// record keeps the apply's outcome in the replica's inspect book: a done
// result is an outcome, not a failure, so it carries no error.
func (a *Applier) record(ds *bus.DesiredState, wl *writeLog, start time.Time, result string, err error) {
	var finished done
	if errors.As(err, &finished) {
		err = nil
	}
	var writes []bus.Write
	if wl != nil {
		writes = wl.writes
	}
	a.book.Applied(ds, start, result, err, writes)
}
