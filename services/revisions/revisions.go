// Package revisions is the metabus service that owns metacontroller.k8s.io
// ControllerRevision objects: it loads a parent's revisions with a
// consistent read, or from the API server's watch cache when the caller
// allows a stale answer (adopting matching orphans on request), and commits the
// creates, updates and deletes a rolling update computes, each with
// optimistic concurrency (protocol: package revstore).
//
// It does no revision bookkeeping of its own (that is package revision's
// pure History, run by the dispatcher and the applier); it only reads and
// writes. It is stateless: over NATS it is a micro service in a queue group,
// so any number of replicas serve the same subject, and in one process the
// same Service is called directly as a revstore.Store.
package revisions

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"

	"github.com/metabus/metabus/pkg/bus"
	"github.com/metabus/metabus/pkg/jsbus"
	"github.com/metabus/metabus/pkg/natsx"
	"github.com/metabus/metabus/pkg/obs"
	"github.com/metabus/metabus/pkg/revstore"
)

// Config is the revisions service's configuration (flags).
type Config struct {
	// Timeout bounds the API calls of one request. It should stay below the
	// callers' request timeout (jsbus.RevisionsClient: 10s) so that they get an
	// answer rather than a timeout.
	Timeout time.Duration
	// Concurrency bounds the requests one replica serves at once over NATS;
	// further requests wait in the subscription.
	Concurrency int
}

// Defaults fills unset fields.
func (c *Config) Defaults() {
	if c.Timeout <= 0 {
		c.Timeout = 8 * time.Second
	}
	if c.Concurrency <= 0 {
		c.Concurrency = 32
	}
}

// Deps are the service's connections. NC is only needed by Run.
type Deps struct {
	REST    *rest.Config
	NC      *nats.Conn
	Log     *zap.Logger
	Metrics prometheus.Registerer
	Health  *obs.Health
}

// Service serves revision requests; it implements revstore.Store.
type Service struct {
	cfg     Config
	log     *zap.Logger
	dyn     dynamic.Interface
	nc      *nats.Conn
	health  *obs.Health
	metrics *metrics
	// controllers reads the controllers requests name (checkServes).
	controllers *controllers
}

var _ revstore.Store = (*Service)(nil)

// New builds the service; Run serves it over NATS.
func New(cfg Config, deps Deps) (*Service, error) {
	cfg.Defaults()
	if deps.REST == nil {
		return nil, errors.New("revisions: REST config is required")
	}
	log := deps.Log
	if log == nil {
		log = zap.NewNop()
	}
	dyn, err := dynamic.NewForConfig(deps.REST)
	if err != nil {
		return nil, fmt.Errorf("dynamic client: %w", err)
	}
	health := deps.Health
	if health == nil {
		health = &obs.Health{}
	}
	// Not ready until Run serves.
	health.Pending(readyCheck, "starting")
	s := &Service{
		cfg:     cfg,
		log:     log.Named("revisions"),
		dyn:     dyn,
		nc:      deps.NC,
		health:  health,
		metrics: newMetrics(deps.Metrics),
		// The controllers of the requests: see checkServes.
		controllers: newControllers(dyn),
	}
	if err := s.metrics.registerProcess(deps.Metrics, deps.NC); err != nil {
		s.log.Warn("some metrics are not exported", zap.Error(err))
	}
	return s, nil
}

// Revisions serves one request. API failures are answers (Result Error),
// not errors: the returned error is always nil.
func (s *Service) Revisions(ctx context.Context, req revstore.Request) (*revstore.Response, error) {
	start := time.Now()
	ctx, cancel := context.WithTimeout(ctx, s.cfg.Timeout)
	defer cancel()
	var resp *revstore.Response
	switch req.Op {
	case revstore.OpLoad:
		resp = s.load(ctx, req)
	case revstore.OpCommit:
		resp = s.commit(ctx, req)
	default:
		resp = invalid("unknown op %q (want %q or %q)", req.Op, revstore.OpLoad, revstore.OpCommit)
	}
	op := req.Op
	if op != revstore.OpLoad && op != revstore.OpCommit {
		op = "unknown" // bounded label values
	}
	s.metrics.requests.WithLabelValues(op, resp.Result).Inc()
	s.metrics.seconds.WithLabelValues(op).Observe(time.Since(start).Seconds())
	if resp.Result == revstore.Error || resp.Result == revstore.Invalid {
		s.log.Warn("revisions request failed", zap.String("op", req.Op), zap.String("result", resp.Result),
			zap.String("controller", req.Controller.ID()), zap.String("parent", parentKey(req.Parent)),
			zap.String("message", resp.Message))
	}
	return resp, nil
}

// readyCheck names the revisions service's readiness check.
const readyCheck = "revisions"

// Run serves the revisions micro service on NATS until ctx is done. Then it
// stops taking requests and returns once those it took are answered; they
// run to completion (bounded by Timeout) rather than being cut off.
func (s *Service) Run(ctx context.Context) error {
	if s.nc == nil {
		return errors.New("revisions: a NATS connection is required to serve")
	}
	reqCtx := context.WithoutCancel(ctx)
	sem := make(chan struct{}, s.cfg.Concurrency)
	var (
		mu       sync.Mutex
		stopping bool
		inflight sync.WaitGroup
	)
	// micro calls the handler serially: each request gets its own
	// goroutine (at most Concurrency), so a slow API call does not hold up
	// the others. Once stopping, requests still delivered by the draining
	// subscription are answered inline, so the drain (and a connection
	// drain after it) waits for them.
	handler := func(r micro.Request) {
		sem <- struct{}{}
		mu.Lock()
		if stopping {
			mu.Unlock()
			<-sem
			s.serve(reqCtx, r)
			return
		}
		inflight.Add(1)
		mu.Unlock()
		go func() {
			defer inflight.Done()
			defer func() { <-sem }()
			s.serve(reqCtx, r)
		}()
	}
	svc, err := micro.AddService(s.nc, micro.Config{
		Name:        bus.RevisionsServiceName,
		Version:     "0.1.0",
		Description: "metacontroller.k8s.io ControllerRevisions: consistent load with adoption, commit with optimistic concurrency",
		QueueGroup:  bus.RevisionsQueue,
		Endpoint: &micro.EndpointConfig{
			Subject: bus.RevisionsSubject,
			Handler: micro.HandlerFunc(handler),
		},
	})
	if err != nil {
		return fmt.Errorf("register revisions service: %w", err)
	}
	s.health.SetReady(readyCheck, natsx.Check(s.nc))
	s.log.Info("revisions service started", zap.String("subject", bus.RevisionsSubject), zap.Int("concurrency", s.cfg.Concurrency))
	<-ctx.Done()
	stopErr := svc.Stop()
	mu.Lock()
	stopping = true
	mu.Unlock()
	inflight.Wait()
	if stopErr != nil {
		return fmt.Errorf("stop revisions service: %w", stopErr)
	}
	return nil
}

// serve answers one NATS request.
func (s *Service) serve(ctx context.Context, r micro.Request) {
	err := jsbus.RespondJSON(r, "revisions", func(req revstore.Request) any {
		resp, _ := s.Revisions(ctx, req)
		return resp
	})
	if err != nil {
		s.log.Warn("revisions request not answered", zap.Error(err))
	}
}
