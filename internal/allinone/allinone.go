// Package allinone composes the watcher, dispatcher, applier and revisions
// Run functions into one process, with an embedded JetStream server unless an
// external NATS URL is given. It serves `metabus` (the all-in-one binary),
// `make run` and the e2e tests, which start extra dispatcher and applier
// replicas with their own NATS connections to exercise multi-replica
// behaviour.
package allinone

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"k8s.io/client-go/rest"

	"github.com/metabus/metabus/pkg/apply"
	"github.com/metabus/metabus/pkg/bus"
	"github.com/metabus/metabus/pkg/echo"
	"github.com/metabus/metabus/pkg/embeddednats"
	"github.com/metabus/metabus/pkg/jsbus"
	"github.com/metabus/metabus/pkg/natsx"
	"github.com/metabus/metabus/pkg/obs"
	"github.com/metabus/metabus/pkg/revstore"
	"github.com/metabus/metabus/pkg/snapshot"
	"github.com/metabus/metabus/services/applier"
	"github.com/metabus/metabus/services/dispatcher"
	"github.com/metabus/metabus/services/revisions"
	"github.com/metabus/metabus/services/watcher"
)

// Config configures the composed process.
type Config struct {
	Watcher    watcher.Config
	Dispatcher dispatcher.Config
	Applier    applier.Config
	Revisions  revisions.Config
	// Dispatchers and Appliers are how many replicas of each stage to run
	// in this process (default 1), each with its own NATS connection.
	Dispatchers int
	Appliers    int
	// NATS is the external server to use; with an empty URL an embedded
	// server is started.
	NATS natsx.ConnOptions
	// StoreDir is the embedded server's JetStream directory ("" → a
	// temporary directory removed at exit).
	StoreDir string
	// Listen is the embedded server's client address ("" → random loopback
	// port, "-" → in-process only).
	Listen string
	// SnapshotsOverNATS makes dispatchers and appliers use the NATS
	// snapshot and revisions services instead of calling the watcher and
	// the revisions service directly.
	SnapshotsOverNATS bool
	// HookConnection gives each dispatcher a second NATS connection, used
	// for hook requests only (as --hook-nats-* does for a dispatcher
	// process), instead of sending them over its bus connection, which
	// also carries its JetStream traffic. BenchmarkHookTransport compares
	// the two.
	HookConnection bool
}

// Deps are shared by every component.
type Deps struct {
	REST *rest.Config
	// ServiceREST, if set, gives services their own API configuration
	// instead of REST, keyed by service name (ServiceWatcher...): the e2e
	// tests run each under its production RBAC by impersonating its
	// ServiceAccount, so a rule missing from deploy/rbac fails a test
	// rather than a user's installation.
	ServiceREST map[string]*rest.Config
	// ServiceNATS, if set, gives services their own NATS connection options
	// instead of Config.NATS, keyed by service name: the e2e tests connect
	// each to a server loaded from the shipped nats-server.conf as its own
	// nkey user, so that a subject missing from a user's permissions fails
	// a test. Name, Logger and the inbox prefix are set here still.
	ServiceNATS map[string]natsx.ConnOptions
	Log         *zap.Logger
	Metrics     prometheus.Registerer
	Health      *obs.Health
	Trace       obs.Tracer
	// Started, if set, is called once everything runs, with the embedded
	// server (nil with external NATS) and the client URL.
	Started func(s *server.Server, url string)
}

// The services' names in Deps.ServiceREST.
const (
	ServiceWatcher    = "watcher"
	ServiceDispatcher = "dispatcher"
	ServiceApplier    = "applier"
	ServiceRevisions  = "revisions"
)

// ReadyCheck names the readiness check Run registers: pending until every
// stage is built (each then reports its own).
const ReadyCheck = "metabus"

// EmbeddedKeepConsumersEvery is how often the watcher of an all-in-one
// with an embedded server checks its streams and partition consumers.
const EmbeddedKeepConsumersEvery = time.Minute

// embeddedWatcher is the watcher's configuration when the bus is the
// process's embedded server; what the command line set is kept.
func embeddedWatcher(wcfg watcher.Config) watcher.Config {
	// The embedded server lives and dies with this process, whose watcher
	// resyncs every parent when it starts: the work queues need no disk.
	wcfg.Bus.MemoryQueues = true
	// Its memory streams are new at every start, so this is their layout
	// (bus.EmbeddedPartitions says why it is smaller).
	if wcfg.Bus.Partitions == 0 {
		wcfg.Bus.Partitions = bus.EmbeddedPartitions
	}
	// Nor can they be lost while it runs, or change their layout: the
	// periodic check (a stream and a consumer info per stream) only guards
	// against a client deleting them, which a minute bounds well enough.
	if wcfg.KeepConsumersEvery == 0 {
		wcfg.KeepConsumersEvery = EmbeddedKeepConsumersEvery
	}
	// For the same reason the stages, which share these options, need not
	// read the partition count on every lease tick.
	wcfg.Bus.FixedLayout = true
	return wcfg
}

// restFor is the API configuration of service.
func (d Deps) restFor(service string) *rest.Config {
	if rc := d.ServiceREST[service]; rc != nil {
		return rc
	}
	return d.REST
}

// Run runs everything until ctx is done.
func Run(ctx context.Context, cfg Config, deps Deps) error {
	log := deps.Log
	if log == nil {
		log = zap.NewNop()
	}
	if deps.Health == nil {
		deps.Health = &obs.Health{}
	}
	// Not ready until every stage is built; each stage then reports its
	// own readiness.
	deps.Health.Pending(ReadyCheck, "starting")
	var srv *server.Server
	url := cfg.NATS.URL
	if url == "" {
		dir := cfg.StoreDir
		if dir == "" {
			tmp, err := os.MkdirTemp("", "metabus-nats-")
			if err != nil {
				return fmt.Errorf("nats store dir: %w", err)
			}
			defer os.RemoveAll(tmp)
			dir = tmp
		}
		s, err := embeddednats.Start(embeddednats.Options{StoreDir: filepath.Clean(dir), Listen: cfg.Listen})
		if err != nil {
			return err
		}
		defer func() { s.Shutdown(); s.WaitForShutdown() }()
		srv = s
		if cfg.Listen != "-" {
			url = s.ClientURL()
		}
		log.Info("embedded NATS JetStream started", zap.String("url", url), zap.String("storeDir", dir))
	}
	// An external server that is not up yet is waited for. Each service
	// replies on its own inbox prefix, as when deployed, so that a server
	// with per-service permissions serves this process too.
	connect := func(service, name string) (*nats.Conn, jetstream.JetStream, error) {
		o := cfg.NATS
		if so, ok := deps.ServiceNATS[service]; ok {
			o = so
		}
		o.Name, o.Logger, o.InboxPrefix = name, log, natsx.ServiceInboxPrefix(service)
		if srv != nil {
			o.InProcess = srv
		}
		return natsx.Dial(ctx, o, natsx.DefaultBackoff, func(err error, next time.Duration) {
			log.Warn("NATS not reachable yet; retrying", zap.String("connection", name), zap.Error(err), zap.Duration("retryIn", next))
			deps.Health.Pending(ReadyCheck, "waiting for NATS: "+err.Error())
		})
	}
	var conns []*nats.Conn
	defer func() {
		for _, nc := range conns {
			nc.Close()
		}
	}()

	nc, js, err := connect(ServiceWatcher, "metabus-watcher")
	if err != nil {
		return err
	}
	conns = append(conns, nc)
	wcfg := cfg.Watcher
	wcfg.EnsureStreams = true
	if srv != nil {
		wcfg = embeddedWatcher(wcfg)
	}
	// Separate-process replicas (and the tests) reach it over NATS.
	wcfg.ServeSnapshots = true
	// One echo book for the whole process, fed by every applier in it
	// directly and by the broadcasts of appliers elsewhere.
	var book *echo.Book
	if !cfg.SnapshotsOverNATS {
		book = echo.NewBook(0)
		sub, err := book.Subscribe(nc)
		if err != nil {
			return fmt.Errorf("subscribe to applied notes: %w", err)
		}
		defer func() { _ = sub.Unsubscribe() }()
	}
	w, err := watcher.New(wcfg, watcher.Deps{REST: deps.restFor(ServiceWatcher), NC: nc, JS: js, Log: log, Metrics: deps.Metrics, Health: deps.Health, Echoes: book})
	if err != nil {
		return err
	}
	var src snapshot.Source = w
	rnc, _, err := connect(ServiceRevisions, "metabus-revisions")
	if err != nil {
		return err
	}
	conns = append(conns, rnc)
	revs, err := revisions.New(cfg.Revisions, revisions.Deps{REST: deps.restFor(ServiceRevisions), NC: rnc, Log: log, Metrics: deps.Metrics, Health: deps.Health})
	if err != nil {
		return err
	}
	var store revstore.Store = revs
	// Create the streams before anyone consumes them, waiting for a
	// server that cannot create them yet.
	err = natsx.Retry(ctx, natsx.DefaultBackoff, func(ctx context.Context) error { return jsbus.Ensure(ctx, js, wcfg.Bus) },
		func(err error, next time.Duration) {
			log.Warn("streams and consumers not ready yet; retrying", zap.Error(err), zap.Duration("retryIn", next))
			deps.Health.Pending(ReadyCheck, "creating the streams and consumers: "+err.Error())
		})
	if err != nil {
		return nil // ctx is done
	}
	deps.Health.Pending(ReadyCheck, "starting the stages")
	// The watcher creates the streams; the others wait for them.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	errc := make(chan error, 2+max(cfg.Dispatchers, 1)+max(cfg.Appliers, 1))
	runIt := func(name string, f func(context.Context) error) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := f(ctx); err != nil && ctx.Err() == nil {
				errc <- fmt.Errorf("%s: %w", name, err)
				cancel()
			}
		}()
	}
	runIt("watcher", w.Run)
	// Served over NATS too, so that separate-process replicas (and the
	// tests) reach it.
	runIt("revisions", revs.Run)
	for i := 0; i < max(cfg.Dispatchers, 1); i++ {
		nc, js, err := connect(ServiceDispatcher, fmt.Sprintf("metabus-dispatcher-%d", i))
		if err != nil {
			cancel()
			wg.Wait()
			return err
		}
		conns = append(conns, nc)
		d := dispatcher.Deps{REST: deps.restFor(ServiceDispatcher), NC: nc, JS: js, Log: log.With(zap.Int("replica", i)), Health: deps.Health, Trace: deps.Trace, Echoes: book}
		if cfg.HookConnection {
			hnc, _, err := connect(ServiceDispatcher, fmt.Sprintf("metabus-dispatcher-%d-hooks", i))
			if err != nil {
				cancel()
				wg.Wait()
				return err
			}
			conns = append(conns, hnc)
			d.HookNC = hnc
		}
		if !cfg.SnapshotsOverNATS {
			d.Snapshots, d.Revisions = src, store
		}
		if i == 0 {
			d.Metrics = deps.Metrics
		}
		dcfg := cfg.Dispatcher
		dcfg.Bus = wcfg.Bus
		// The appliers below run in this process with this strategy.
		dcfg.ApplyStrategy = cfg.Applier.Strategy
		if dcfg.ApplyStrategy == "" {
			dcfg.ApplyStrategy = apply.DynamicApply
		}
		// One relay and one DLQ worker are enough in one process.
		dcfg.RunRelay, dcfg.RunDLQ = i == 0, i == 0
		disp, err := dispatcher.New(dcfg, d)
		if err != nil {
			cancel()
			wg.Wait()
			return err
		}
		runIt(fmt.Sprintf("dispatcher-%d", i), disp.Run)
	}
	for i := 0; i < max(cfg.Appliers, 1); i++ {
		nc, js, err := connect(ServiceApplier, fmt.Sprintf("metabus-applier-%d", i))
		if err != nil {
			cancel()
			wg.Wait()
			return err
		}
		conns = append(conns, nc)
		a := applier.Deps{REST: deps.restFor(ServiceApplier), NC: nc, JS: js, Log: log.With(zap.Int("replica", i)), Health: deps.Health, Trace: deps.Trace, Echoes: book}
		if !cfg.SnapshotsOverNATS {
			a.Snapshots, a.Revisions = src, store
		}
		if i == 0 {
			a.Metrics = deps.Metrics
		}
		acfg := cfg.Applier
		acfg.Bus = wcfg.Bus
		app, err := applier.New(acfg, a)
		if err != nil {
			cancel()
			wg.Wait()
			return err
		}
		runIt(fmt.Sprintf("applier-%d", i), app.Run)
	}
	deps.Health.SetReady(ReadyCheck, func() error { return nil })
	if deps.Started != nil {
		deps.Started(srv, url)
	}
	<-ctx.Done()
	wg.Wait()
	select {
	case err := <-errc:
		return err
	default:
	}
	return nil
}
