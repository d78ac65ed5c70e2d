// Package dispatcher is the metabus stage that turns work items into desired
// states: for each work item it fetches the parent's observed state from the
// snapshot service, calls the controller's hook, and publishes the hook's
// answer as a CloudEvent to MC_DESIRED before acking the work item.
//
// Every replica pulls from every MC_WORK partition consumer; each partition
// has one message in flight, so a parent is never synced by two replicas at
// once. Hook failures never hold a partition: the item is acked and a retry
// with per-parent exponential backoff is scheduled through MC_SCHED.
package dispatcher

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"

	"github.com/metabus/metabus/pkg/api/v1alpha1"
	"github.com/metabus/metabus/pkg/apply"
	"github.com/metabus/metabus/pkg/bus"
	"github.com/metabus/metabus/pkg/echo"
	"github.com/metabus/metabus/pkg/events"
	"github.com/metabus/metabus/pkg/events/recorder"
	"github.com/metabus/metabus/pkg/hooks"
	"github.com/metabus/metabus/pkg/inspect"
	"github.com/metabus/metabus/pkg/jsbus"
	"github.com/metabus/metabus/pkg/kubeapi"
	"github.com/metabus/metabus/pkg/natsx"
	"github.com/metabus/metabus/pkg/obs"
	"github.com/metabus/metabus/pkg/outcome"
	"github.com/metabus/metabus/pkg/related"
	"github.com/metabus/metabus/pkg/revstore"
	"github.com/metabus/metabus/pkg/snapshot"
)

// Config is the dispatcher's configuration (flags).
type Config struct {
	// Workers bounds the concurrent syncs of one controller in this
	// replica; MaxInFlight bounds them across controllers.
	Workers, MaxInFlight int
	// SnapshotWait bounds how long a sync waits for a fresh snapshot before
	// rescheduling itself.
	SnapshotWait time.Duration
	// RunRelay moves fired schedules into MC_WORK in this replica.
	RunRelay bool
	// ResyncAfterBacklog paces the resyncs hooks ask for
	// (resyncAfterSeconds): one goes into MC_WORK only while its controller
	// has fewer than this many items there, and waits otherwise (≤ 0:
	// unpaced, as upstream). See resyncGate.
	ResyncAfterBacklog int
	// Headroom bounds the work items of one controller this replica holds
	// in hand from one MC_WORK partition (--max-held-per-controller) once
	// it holds HeadroomBusy of that partition; one beyond it is put off: scheduled again in MC_SCHED, then acked
	// (jsbus.ConsumeConfig.Headroom). 0 means DefaultHeadroom; negative,
	// no bound.
	Headroom int
	// RunDLQ moves poison messages to MC_DLQ in this replica.
	RunDLQ      bool
	EventsQPS   float32
	EventsBurst int
	Bus         bus.Options
	// Namespace is the dispatcher's own namespace, whose Secrets and ConfigMaps webhook
	// TLS/auth options may always reference ("": POD_NAMESPACE, else DefaultNamespace).
	Namespace string
	// SecretNamespaces are the other namespaces they may reference (--secret-namespaces):
	// nil allows every namespace, as upstream does (the shipped RBAC grants a cluster-wide
	// get); a non-nil list allows those besides the own one, and an empty one the own one
	// alone (the hardened profile); AllNamespaces in it allows every namespace. A reference
	// elsewhere fails the sync with a SyncError Event before anything is read or sent.
	// metabus's own NATS credentials are refused wherever they are (natsx.CredentialsLabel).
	SecretNamespaces []string
	// HookCredentialSecrets are the Secrets of the own namespace that
	// webhook TLS/auth options may reference (--hook-credential-secrets);
	// by default none: that namespace holds metabus's own keys. metabus's
	// NATS credentials and TLS material and Helm's release Secrets are
	// refused even when listed.
	HookCredentialSecrets []string
	// RelatedResources says which resources customize hooks' related rules
	// may name, as entries "<group>/<resource>" with "*" wildcards and a
	// leading "-" to deny (related.ParsePolicy); nil means
	// related.DefaultPolicy, everything, as upstream (the hardened profile
	// sets related.HardenedPolicy). A refused rule fails the sync with a
	// SyncError Event before the watcher starts watching anything for it.
	RelatedResources []string
	// HookDestinations is where hooks may be called (hooks.ParseDestinations
	// entries, "apiserver" naming the API server's addresses); nil allows
	// every destination, as upstream. A denied call fails the sync with a
	// SyncError Event naming the rule, nothing sent.
	HookDestinations []string
	// RefuseInsecureCredentials ignores webhooks' allowInsecureCredentials:
	// credentials are never sent over plain http.
	RefuseInsecureCredentials bool
	// MergeWait bounds how long a sync of an item waits for the item's
	// previous answer (published by this replica) to be applied before it
	// takes its snapshot (--merge-wait; 0 means DefaultMergeWait, a
	// negative value does not wait). Waiting lets the hook see all the
	// writes of its previous answer in one call instead of one call per
	// write; a change by anyone else that arrives meanwhile waits at most
	// this long.
	MergeWait time.Duration
	// ApplyStrategy is the appliers' --apply-strategy, when this
	// dispatcher knows it (the all-in-one process, whose one flag sets
	// both stages). A sync answer that would write nothing against the
	// snapshot its hook was shown, under that strategy, is settled here,
	// unpublished (kinds.WritesNothing). "" (a dispatcher of its own,
	// whose appliers may be started with another strategy) learns the
	// strategy from the appliers' Done notes (echo.Book.ApplierStrategy)
	// and publishes every answer while they do not agree on one.
	ApplyStrategy apply.Strategy
	// HookNATS is the connection NATS hooks are called through (main dials
	// it into Deps.HookNC when set); HookSubjectPrefix is the prefix their
	// subjects must start with ("": hooks.DefaultSubjectPrefix).
	HookNATS          HookNATS
	HookSubjectPrefix string
}

// DefaultMergeWait is Config.MergeWait's default: an apply normally takes
// a few milliseconds per write, and a backlogged applier should not hold
// anyone else's change for long.
const DefaultMergeWait = 2 * time.Second

// DefaultHeadroom is Config.Headroom's default: a quarter of an MC_WORK
// partition's MaxAckPending. It applies only above HeadroomBusy, so a
// controller alone in a partition holds up to half its window before
// anything of it is put off (with 16 partitions, some 8,000 changes at
// once), and while the partition is that busy every controller holding
// fewer than this many items is still taken.
const DefaultHeadroom = bus.WorkMaxAckPending / 4

// HeadroomBusy is how many work items of one MC_WORK partition (every
// controller together) a replica holds before Config.Headroom applies:
// half the partition's window. Below it there is room for every
// controller, and putting off a burst of one (a well-behaved controller's
// new parents, mostly waiting their turn for --max-in-flight) would only
// slow it down; above it, the other half stays open to the controllers
// that hold fewer than Headroom.
const HeadroomBusy = bus.WorkMaxAckPending / 2

// Defaults fills unset fields.
func (c *Config) Defaults() {
	if c.Workers <= 0 {
		c.Workers = 16
	}
	if c.SnapshotWait <= 0 {
		c.SnapshotWait = 5 * time.Second
	}
	if c.MergeWait == 0 {
		c.MergeWait = DefaultMergeWait
	}
	if c.Headroom == 0 {
		c.Headroom = DefaultHeadroom
	}
	if c.Namespace == "" {
		c.Namespace = ownNamespace()
	}
}

// Deps are the dispatcher's connections.
type Deps struct {
	REST *rest.Config
	NC   *nats.Conn
	JS   jetstream.JetStream
	// Snapshots is the observed-state source; nil uses the NATS service.
	Snapshots snapshot.Source
	// Revisions reaches the revisions service; nil means over NATS (Client on NC).
	Revisions revstore.Store
	Log       *zap.Logger
	Metrics   prometheus.Registerer
	Health    *obs.Health
	Trace     obs.Tracer
	// Echoes, if set, is a Book shared in this process (fed by its
	// composer); nil makes the dispatcher keep and feed its own.
	Echoes *echo.Book
	// HookNC is the connection hooks served over NATS are called through;
	// nil uses NC.
	HookNC *nats.Conn
}

// Dispatcher is a running dispatcher.
type Dispatcher struct {
	cfg     Config
	log     *zap.Logger
	js      jetstream.JetStream
	pub     jsbus.Publisher
	snaps   snapshot.Source
	revs    revstore.Store
	hooks   hooks.Caller
	rec     *recorder.Recorder
	health  *obs.Health
	metrics *metrics
	trace   obs.Tracer

	failures failureCounts

	nc *nats.Conn

	// customize caches related-resource rules per parent and generation.
	cmu       sync.Mutex
	customize map[string]customizeEntry
	// relatedPolicy is what related rules may name (Config.RelatedResources).
	relatedPolicy related.Policy

	// echoes knows the appliers' Applied notes, to skip syncs that would
	// only show a hook its own answer.
	echoes *echo.Book

	// timers are pending sub-second resyncs, one per parent.
	tmu    sync.Mutex
	timers map[string]*time.Timer
	// gate paces hook-asked resyncs per controller
	// (Config.ResyncAfterBacklog).
	gate *resyncGate

	// member is this replica's stage member id (its leases' value), and
	// book its record of recent syncs for the operator CLI.
	member string
	book   *inspect.Book
}

// New builds a dispatcher.
func New(cfg Config, deps Deps) (*Dispatcher, error) {
	cfg.Defaults()
	if deps.REST == nil || deps.JS == nil || deps.NC == nil {
		return nil, errors.New("dispatcher: REST config and NATS connection are required")
	}
	log := deps.Log
	if log == nil {
		log = zap.NewNop()
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
	d := &Dispatcher{
		cfg:       cfg,
		log:       log.Named("dispatcher"),
		js:        deps.JS,
		pub:       jsbus.Publisher{JS: deps.JS}, // Queued: set below
		snaps:     snaps,
		revs:      revs,
		rec:       recorder.New(kube, recorder.Options{QPS: cfg.EventsQPS, Burst: cfg.EventsBurst, Component: "metabus-dispatcher"}),
		health:    health,
		metrics:   newMetrics(deps.Metrics),
		trace:     deps.Trace,
		timers:    map[string]*time.Timer{},
		customize: map[string]customizeEntry{},
		nc:        deps.NC,
		echoes:    deps.Echoes,
		member:    jsbus.NewMemberID(),
	}
	d.pub.Queued = d.metrics.queued
	d.gate = newResyncGate(cfg.ResyncAfterBacklog, streamCounter(deps.JS))
	d.metrics.watchNATS(deps.Metrics, deps.NC)
	if d.metrics.err != nil {
		d.log.Warn("some metrics are not exported", zap.Error(d.metrics.err))
	}
	d.book = inspect.New(bus.WorkStage, d.member, 0)
	relatedEntries := cfg.RelatedResources
	if relatedEntries == nil {
		relatedEntries = related.DefaultPolicy
	}
	if d.relatedPolicy, err = related.ParsePolicy(relatedEntries); err != nil {
		return nil, fmt.Errorf("--related-resources: %w", err)
	}
	scope := newSecretScope(cfg.Namespace, cfg.SecretNamespaces)
	scope.ownSecrets = cfg.HookCredentialSecrets
	apiServer := apiServerAddrs(context.Background(), deps.REST, os.Getenv)
	dest, err := hookDestinations(cfg.HookDestinations, apiServer)
	if err != nil {
		return nil, err
	}
	subjectPrefix, err := cfg.hookSubjectPrefix()
	if err != nil {
		return nil, err
	}
	hookNC := deps.HookNC
	if hookNC == nil {
		hookNC = deps.NC
	}
	opts := hooks.Options{
		Secrets:                kubeSecrets{kube: kube, scope: scope},
		SecretNamespaceAllowed: scope.check,
		SecretAllowed:          scope.checkSecretName,
		Registerer:             deps.Metrics,
		Logger:                 d.log,
		Destinations:           dest,
		NATS:                   hookNC,
		SubjectPrefix:          subjectPrefix,
		SubjectPrefixSetting:   HookSubjectPrefixSetting,
	}
	if cfg.RefuseInsecureCredentials {
		opts.InsecureCredentialsRefused = InsecureCredentialsSetting
	}
	d.hooks = hooks.New(opts)
	d.log.Info("webhook TLS/auth options may reference Secrets and ConfigMaps in", zap.String("namespaces", scope.String()))
	d.log.Info("hooks may be called at", zap.String("destinations", dest.String()),
		zap.Stringers("apiserver", apiServer),
		zap.Bool("refuseInsecureCredentials", cfg.RefuseInsecureCredentials),
		zap.String("natsSubjectPrefix", subjectPrefix), zap.Bool("ownHookConnection", deps.HookNC != nil))
	d.log.Info("customize hooks' related rules may name", zap.Strings("resources", relatedEntries))
	return d, nil
}

// readyCheck names the dispatcher's readiness check.
const readyCheck = "dispatcher"

// errStarting is a supervised worker's state before its first run settled.
var errStarting = errors.New("starting")

// Run consumes work items until ctx is done.
func (d *Dispatcher) Run(ctx context.Context) error {
	defer d.rec.Shutdown(ctx)
	d.health.Pending(readyCheck, "waiting for the streams and consumers")
	if err := jsbus.WaitReady(ctx, d.js); err != nil {
		return err
	}
	if d.echoes == nil {
		d.echoes = echo.NewBook(0)
		sub, err := d.echoes.Subscribe(d.nc)
		if err != nil {
			return fmt.Errorf("subscribe to applied notes: %w", err)
		}
		defer func() { _ = sub.Unsubscribe() }()
	}
	stopInspect, err := d.book.Serve(d.nc)
	if err != nil {
		return fmt.Errorf("serve inspect requests: %w", err)
	}
	defer stopInspect()
	ackWait := d.cfg.Bus.WorkAckWait
	if ackWait <= 0 {
		ackWait = bus.WorkAckWait
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	logErr := func(err error) { d.log.Warn("bus", zap.Error(err)) }
	// The relay and the dead-letter worker are restarted with backoff
	// whenever they stop (consumer lost, NATS away), and the replica is
	// not ready while one of them is down: without the relay no retry or
	// resync fires, without the DLQ worker poison messages block parents.
	var bgMu sync.Mutex
	bgDown := map[string]error{}
	background := func(name string, run func(context.Context) error) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			jsbus.Supervise(ctx, jsbus.SuperviseOptions{}, run, func(err error) {
				bgMu.Lock()
				defer bgMu.Unlock()
				if err == nil {
					if was := bgDown[name]; was != nil && was != errStarting {
						d.log.Info(name + " running again")
					}
					delete(bgDown, name)
					return
				}
				d.log.Error(name+" stopped, restarting", zap.Error(err))
				bgDown[name] = err
			})
		}()
	}
	// The work consumer itself is supervised the same way: a consumer
	// that cannot start (a partition read timing out while a cluster
	// elects its leaders) or stops is restarted, never the process.
	bgDown["work consumer"] = errStarting
	background("work consumer", func(ctx context.Context) error {
		return jsbus.Consume(ctx, d.js, jsbus.ConsumeConfig{
			Stream: bus.WorkStream, Prefix: bus.WorkConsumerPrefix, Stage: bus.WorkStage,
			PerController: d.cfg.Workers, Total: d.cfg.MaxInFlight, AckWait: ackWait, Member: d.member, FixedLayout: d.cfg.Bus.FixedLayout,
			OnError:   obs.ConsumerErrors(d.log, "work consumer"),
			Ownership: d.metrics.partitions,
			Headroom:  d.cfg.Headroom, HeadroomBusy: HeadroomBusy, PutOff: d.putOff,
		}, d.handle)
	})
	if d.cfg.RunRelay {
		gate := func(ctx context.Context, item bus.WorkItem) (time.Duration, error) {
			return d.gate.admit(ctx, item.Controller.ID(), time.Now())
		}
		background("schedule relay", func(ctx context.Context) error { return jsbus.RunRelayGated(ctx, d.pub, gate, logErr) })
	}
	if d.cfg.RunDLQ {
		background("dead-letter worker", func(ctx context.Context) error {
			return jsbus.RunDLQ(ctx, d.js, d.onDeadLetter, logErr)
		})
	}
	connected := natsx.Check(d.nc)
	d.health.SetReady(readyCheck, func() error {
		if err := connected(); err != nil {
			return err
		}
		bgMu.Lock()
		defer bgMu.Unlock()
		var errs []error
		for name, err := range bgDown {
			errs = append(errs, fmt.Errorf("%s down: %w", name, err))
		}
		return errors.Join(errs...)
	})
	d.log.Info("dispatcher started", zap.Int("workers", d.cfg.Workers))
	<-ctx.Done()
	return nil
}

// putOff stores again a work item beyond its controller's headroom
// (jsbus.PutOff): scheduled in MC_SCHED for at, where a sooner schedule of
// the parent wins (jsbus.Publisher.Schedule), and relayed into MC_WORK
// when due. The item is the same, its reason and attempt kept: a
// hook-asked resync is still paced when it comes back, a retry keeps its
// backoff.
func (d *Dispatcher) putOff(ctx context.Context, m jetstream.Msg, at time.Time) error {
	var item bus.WorkItem
	if err := jsbus.Decode(m, bus.TypeSyncRequested, &item); err != nil {
		return err // the handler terms it
	}
	if err := d.pub.Schedule(ctx, item, at); err != nil {
		return err
	}
	d.metrics.putOff.WithLabelValues(item.Controller.Kind, item.Controller.Name).Inc()
	return nil
}

// onDeadLetter reports a poison message on its parent.
func (d *Dispatcher) onDeadLetter(dl jsbus.DeadLetter) {
	d.log.Error("message moved to dead-letter queue", zap.String("stream", dl.Stream), zap.String("subject", dl.Subject),
		zap.String("mapKey", dl.MapKey), zap.Uint64("deliveries", dl.Deliveries))
	if dl.Parent.UID != "" {
		d.rec.Warning(dl.Parent.Stub(), events.ReasonDeadLetter,
			fmt.Sprintf("a %s message for this object failed %d deliveries and was moved to %s", dl.Stream, dl.Deliveries, bus.DLQStream))
	}
}

// handle syncs the parent of one work item and returns the item's outcome,
// which jsbus.Consume settles.
func (d *Dispatcher) handle(ctx context.Context, m jetstream.Msg) outcome.Outcome {
	var item bus.WorkItem
	if err := jsbus.Decode(m, bus.TypeSyncRequested, &item); err != nil {
		// Nothing can ever process it: drop it (the resync covers the
		// parent, whichever it was).
		d.log.Error("dropping malformed work item", zap.Error(err))
		return outcome.Terminal("malformed work item")
	}
	seq, delivered, err := jsbus.Meta(m)
	if err != nil {
		return retrySoon
	}
	start := time.Now()
	queue := queueOf(item.Controller)
	if d.metrics.delivered(seq, delivered) {
		d.metrics.queueLatency.Observe(start.Sub(item.EnqueuedAt).Seconds())
		d.metrics.queues.Waited(queue, start.Sub(item.EnqueuedAt))
		if delivered > 1 {
			d.metrics.queues.Retried(queue) // a redelivery
		}
	}
	workDone := d.metrics.queues.Started(queue)
	var endTrace func()
	if d.trace != nil {
		// The unit that must never be handled twice at once is the item:
		// the keys of one parent run in parallel (bus.ParentToken).
		endTrace = d.trace("dispatcher", bus.ParentToken(item.Parent.UID, item.MapKey))
	}
	end := func() {
		workDone()
		if endTrace != nil {
			endTrace()
		}
	}
	rec := d.book.StartSync(item, seq)
	err = d.syncParent(inspect.WithSync(ctx, rec), item, seq)
	result, out, inPlace := d.settle(ctx, item, start, err, end)
	if inPlace {
		d.metrics.retryInPlace(seq, delivered)
	}
	var done settled
	if errors.As(err, &done) {
		err = nil // an outcome, not a failure
	}
	d.book.Done(rec, result, err)
	return out
}

// The errors a sync ends with. syncParent and its helpers never decide a
// work item's fate themselves: they return one of these (or nil, a
// published desired state), resolve does what it asks for, and outcomeOf
// turns it into the item's outcome, which the bus settles.
type (
	// syncFailure is a failed sync: it counts as a failure of the parent
	// and is retried with exponential backoff through MC_SCHED. A reason
	// reports it with an Event on the parent; "" keeps it quiet, for
	// failures that are not the parent's (the snapshot is not fresh yet).
	// ours marks a failure of metabus's own services (snapshots,
	// revisions): it raises the parent's backoff only up to
	// bus.OwnFailureAttempts.
	syncFailure struct {
		reason string
		ours   bool
		err    error
	}
	// throttled is a hook's 429: retried after its Retry-After, without
	// counting as a failure.
	throttled struct {
		after time.Duration
		err   error
	}
	// infraFailure is the bus or the snapshot service being unreachable,
	// or the dispatcher shutting down: the item is retried in place soon
	// (a dispatcher shutting down has lost the item's lease, so the bus
	// leaves it to another replica), which is all that can be done. msg,
	// if set, is logged with err.
	infraFailure struct {
		result string
		msg    string
		err    error
	}
	// settled ends a sync without a desired state from a hook (skipped,
	// an echo, the parent gone, a finalizer release...). result is the
	// syncs metric's label; forget ends the parent's run of failures.
	settled struct {
		result string
		forget bool
	}
)

func (e *syncFailure) Error() string  { return e.err.Error() }
func (e *syncFailure) Unwrap() error  { return e.err }
func (e *throttled) Error() string    { return e.err.Error() }
func (e *throttled) Unwrap() error    { return e.err }
func (e *infraFailure) Error() string { return fmt.Sprintf("%s: %v", e.result, e.err) }
func (e *infraFailure) Unwrap() error { return e.err }
func (e settled) Error() string       { return "settled: " + e.result }

// failure is a failed sync reported on the parent (a SyncError Event).
func failure(err error) error { return &syncFailure{reason: events.ReasonSyncError, err: err} }

// quietFailure is a failed sync the parent is not to blame for (metabus's
// own snapshot or revisions service did not answer, or not freshly enough):
// retried with a backoff of at most bus.Backoff(bus.OwnFailureAttempts), no
// Event.
func quietFailure(err error) error { return &syncFailure{ours: true, err: err} }

// cancelled is the dispatcher shutting down mid-sync: another replica
// takes the item.
func cancelled() error { return &infraFailure{result: "cancelled", err: context.Canceled} }

// published is a failed publish of a desired state (msg says which).
func published(msg string, err error) error {
	return &infraFailure{result: "error", msg: msg, err: err}
}

// settle is the one place a sync's end becomes the work item's fate: the
// Event, the retry schedule, the metric label and the outcome the bus
// settles the item with (outcomeOf). It returns the metric label, which the
// inspect record keeps too. The tracer's span (endTrace) closes before the
// outcome is returned: its ack lets the partition's next message go to
// another replica.
//
// It also reports whether the item runs again in place (jsbus.Consume's
// retry of a Retry outcome).
func (d *Dispatcher) settle(ctx context.Context, item bus.WorkItem, start time.Time, err error, endTrace func()) (result string, out outcome.Outcome, inPlace bool) {
	result, out = d.resolve(ctx, item, err)
	if endTrace != nil {
		endTrace()
	}
	d.metrics.syncs.WithLabelValues(item.Controller.Kind, item.Controller.Name, result).Inc()
	d.metrics.syncSeconds.WithLabelValues(result).Observe(time.Since(start).Seconds())
	retried := out.Retries()
	switch {
	case retried && ctx.Err() == nil && result != "cancelled":
		// Run again in place after the delay (jsbus.Consume); a dispatcher
		// shutting down leaves the item to another replica instead.
		inPlace = true
		d.metrics.queues.Retried(queueOf(item.Controller))
	case !retried && (result == "error" || result == "throttled"):
		// A retry scheduled through MC_SCHED (resolve).
		d.metrics.queues.Retried(queueOf(item.Controller))
	}
	return result, out, inPlace
}

// retrySoon is the outcome of a work item that could not be handled for
// want of the bus or of metabus's own services: retried in place after a
// second (growing while it keeps failing).
var retrySoon = outcome.Retry(time.Second, 0)

// outcomeOf is the outcome of a work item whose sync ended with err, once
// resolve has done what err asks for; requeue is why the follow-up sync a
// failed or throttled one owes could not be scheduled (nil: it was, or
// none was owed), a dispatcher shutting down included.
//
// A sync that published its answer, settled without one, or failed or was
// throttled with its retry scheduled through MC_SCHED is Done: the retry
// is a new work item, and the parent's turn passes meanwhile. A failure
// of the bus or the snapshot service, or a retry that could not be
// scheduled, is retried in place soon: the item must not be lost.
func outcomeOf(err, requeue error) outcome.Outcome {
	var infra *infraFailure
	if errors.As(err, &infra) || requeue != nil {
		return retrySoon
	}
	return outcome.Done()
}

// resolve does what err asks for (report, schedule a retry, forget the
// parent's failures) and returns the metric label and the item's outcome.
func (d *Dispatcher) resolve(ctx context.Context, item bus.WorkItem, err error) (result string, out outcome.Outcome) {
	result, requeue := d.follow(ctx, item, err)
	return result, outcomeOf(err, requeue)
}

// follow does what err asks for and returns the metric label and why a
// retry it owed could not be scheduled (see outcomeOf).
func (d *Dispatcher) follow(ctx context.Context, item bus.WorkItem, err error) (result string, requeue error) {
	var (
		done  settled
		infra *infraFailure
		later *throttled
		fail  *syncFailure
	)
	switch {
	case err == nil:
		d.succeeded(item)
		return "ok", nil
	case errors.As(err, &done):
		if done.forget {
			d.succeeded(item)
		}
		return done.result, nil
	case errors.As(err, &infra):
		if infra.msg != "" {
			d.log.Warn(infra.msg, zap.Error(infra.err))
		}
		return infra.result, nil
	case errors.As(err, &later):
		// The hook asked us to come back later: not a failure.
		d.log.Info("hook throttled; retrying after Retry-After", zap.String("controller", item.Controller.Name),
			zap.String("parent", item.Parent.Namespace+"/"+item.Parent.Name), zap.Duration("retryAfter", later.after))
		return "throttled", d.retry(ctx, item, time.Now().Add(later.after))
	case errors.As(err, &fail):
		return d.failed(ctx, item, fail.reason, fail.ours, fail.err)
	default:
		// Not expected: anything untyped is the sync failing.
		return d.failed(ctx, item, events.ReasonSyncError, false, err)
	}
}

// failed records a failure, reports it, and schedules the retry (see
// follow). ours says the failure was metabus's own (see bus.NextAttempt).
func (d *Dispatcher) failed(ctx context.Context, item bus.WorkItem, reason string, ours bool, err error) (result string, requeue error) {
	if ctx.Err() != nil {
		// Shutting down: leave the item unacked for another replica.
		return "cancelled", ctx.Err()
	}
	n := bus.NextAttempt(d.attempt(item), ours)
	d.failures.record(d.failureKey(item), n, time.Now())
	delay := bus.Backoff(n)
	d.log.Warn("sync failed; retrying with backoff", zap.String("controller", item.Controller.Name),
		zap.String("parent", item.Parent.Namespace+"/"+item.Parent.Name), zap.String("mapKey", item.MapKey), zap.Int("attempt", n),
		zap.Duration("retryIn", delay), zap.Error(err))
	if reason != "" {
		d.rec.Warning(item.Parent.Stub(), reason, err.Error())
	}
	if controllerFault(err) {
		// The controller's configuration is at fault, not the parent: say so where its
		// author looks too.
		d.log.Error("hook call refused", zap.String("controller", item.Controller.Kind+"/"+item.Controller.Name),
			zap.String("parent", item.Parent.Namespace+"/"+item.Parent.Name), zap.Error(err))
		d.rec.Warning(controllerStub(item.Controller), events.ReasonSyncError,
			fmt.Sprintf("parent %s %s: %v", item.Parent.Kind, namespacedName(item.Parent), err))
	}
	next := item
	next.Attempt = n
	if serr := d.retry(ctx, next, time.Now().Add(delay)); serr != nil {
		d.log.Error("schedule retry", zap.Error(serr))
		return "error", serr
	}
	return "error", nil
}

// failureKey keys what is kept per unit of work (failure counts, resync
// timers): the item, so that one failing map key does not back off, or
// skip the echo check of, the parent's other keys.
func (d *Dispatcher) failureKey(item bus.WorkItem) string { return item.Key() }

// retry schedules the next attempt.
func (d *Dispatcher) retry(ctx context.Context, item bus.WorkItem, at time.Time) error {
	next := item
	next.Reason = bus.ReasonRetry
	next.EnqueuedAt = time.Time{}
	return d.pub.Schedule(ctx, next, at)
}

func (d *Dispatcher) attempt(item bus.WorkItem) int {
	return max(item.Attempt, d.failures.get(d.failureKey(item)))
}

func (d *Dispatcher) succeeded(item bus.WorkItem) {
	d.failures.forget(d.failureKey(item))
}

// controllerFault reports whether err is the controller's configuration's
// fault rather than the parent's: a refused hook call, a related rule the
// admin does not allow.
func controllerFault(err error) bool {
	var refused *hooks.RefusedError
	var relatedRefused *related.RefusedError
	return errors.As(err, &refused) || errors.As(err, &relatedRefused)
}

// controllerStub is an object reference for Events on a controller.
func controllerStub(c bus.ControllerRef) *unstructured.Unstructured {
	u := &unstructured.Unstructured{}
	u.SetAPIVersion(v1alpha1.GroupVersion.String())
	u.SetKind(c.Kind)
	u.SetName(c.Name)
	u.SetUID(types.UID(c.UID))
	return u
}

func namespacedName(o bus.ObjectRef) string {
	if o.Namespace == "" {
		return o.Name
	}
	return o.Namespace + "/" + o.Name
}
