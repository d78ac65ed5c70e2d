package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/metabus/metabus/internal/testing/testnats"
	"github.com/metabus/metabus/pkg/bus"
)

// The clustered mode's faults on the NATS side (-cluster): the production
// topology of deploy/nats (three nodes, R3 streams, the services' nkey
// users) from internal/testing/testnats, whose TCP proxies in front of every route and
// every service's client connections make partitions possible without
// privileges.

// ownersStream is the stream of the partition-lease bucket.
const ownersStream = "KV_" + bus.OwnersBucket

// startCluster starts the 3-node test bed from the shipped configuration.
func (s *suite) startCluster(ctx context.Context, root, bin string) error {
	dir := filepath.Join(s.dir, "nats")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	cctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	c, err := testnats.NewCluster(cctx, testnats.ClusterOptions{
		Conf:    filepath.Join(root, "deploy", "nats", "nats-server.conf"),
		Dir:     dir,
		Bin:     filepath.Join(bin, "nats-server"),
		Profile: s.cfg.natsProfile > 0,
		Logf:    s.logf,
	})
	if err != nil {
		return fmt.Errorf("start the NATS cluster: %w", err)
	}
	s.cluster = c
	if s.admin, err = c.Connect(testnats.AdminUser); err != nil {
		return err
	}
	if s.js, err = jetstream.New(s.admin); err != nil {
		return err
	}
	s.logf("NATS cluster up: %d nodes (%s), logs in %s", len(c.Nodes), c.URLs(), dir)
	return nil
}

// rq is a context for one JetStream API request: during a leader move a
// request may go unanswered, and must then fail, not hold the suite.
func rq(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, 5*time.Second)
}

// waitClusterHealthy waits until every node passes its full /healthz (meta
// group, streams and consumers current) and returns how long that took.
func (s *suite) waitClusterHealthy(ctx context.Context, timeout time.Duration) (time.Duration, error) {
	t := time.Now()
	wctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	err := s.cluster.WaitHealthy(wctx)
	return time.Since(t), err
}

// leaderOf returns the node index leading what target names: "meta", a
// stream name, or "" for a random node.
func (s *suite) leaderOf(ctx context.Context, target string) (int, string, error) {
	var name string
	var err error
	for range 20 {
		rctx, cancel := rq(ctx)
		switch target {
		case "":
			i := rand.IntN(len(s.cluster.Nodes))
			cancel()
			return i, s.cluster.Nodes[i].Name, nil
		case "meta":
			name, err = s.cluster.MetaLeader(rctx)
		default:
			name, err = s.cluster.StreamLeader(rctx, s.js, target)
		}
		cancel()
		if err == nil {
			return s.cluster.NodeIndex(name), name, nil
		}
		time.Sleep(500 * time.Millisecond)
	}
	return -1, "", fmt.Errorf("leader of %s: %w", target, err)
}

// nodeKillTargets are what the n-th NATS node SIGKILL aims at, in turn.
var nodeKillTargets = []string{"meta", bus.WorkStream, bus.DesiredStream, ownersStream, ""}

func targetLabel(target string) string {
	switch target {
	case "meta":
		return "meta leader"
	case "":
		return "random node"
	}
	return target + " leader"
}

// killNode SIGKILLs the node leading target and starts it again a second
// later, on the same store, then waits for the cluster to be healthy.
func (s *suite) killNode(ctx context.Context, target string, wipe bool) {
	i, name, err := s.leaderOf(ctx, target)
	if err != nil {
		s.faultErr("NATS node kill: %v", err)
		return
	}
	t := time.Now()
	if err := s.cluster.Kill(i); err != nil {
		s.faultErr("SIGKILL %s: %v", name, err)
		return
	}
	what := "NATS node SIGKILL+restart: " + targetLabel(target)
	if wipe {
		if err := s.cluster.Wipe(i); err != nil {
			s.faultErr("wipe %s: %v", name, err)
		}
		what = "NATS node SIGKILL, store wiped, restart"
	}
	time.Sleep(time.Second)
	if err := s.cluster.Start(i); err != nil {
		s.faultErr("start %s: %v", name, err)
		return
	}
	s.fault(what)
	took, err := s.waitClusterHealthy(ctx, 3*time.Minute)
	if err != nil {
		s.rejoinFail("%s: the cluster not current 3m after %s restarted: %v", what, name, err)
		return
	}
	s.recordCatchUp(what, took)
	s.logf("%s (%s): SIGKILLed, back and caught up in %s (healthy %s after its start)", what, name, since(t), took.Round(10*time.Millisecond))
}

// rejoinFail records a NATS fault the cluster did not recover from in time.
func (s *suite) rejoinFail(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	s.logf("NATS did not recover: %s", msg)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.rejoinFails = append(s.rejoinFails, msg)
}

// recordCatchUp remembers how long a node took to rejoin and catch up.
func (s *suite) recordCatchUp(what string, d time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.catchUp[what] = append(s.catchUp[what], d)
}

// loseCluster loses the whole NATS cluster with its data: every node
// SIGKILLed, every store deleted, every node started again. Kubernetes
// keeps the truth; what the bus held (work items, desired states,
// schedules, leases) is gone and must be derived again.
func (s *suite) loseCluster(ctx context.Context) {
	t := time.Now()
	// Work sequences start again with the new MC_WORK: the order check
	// stops here.
	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	list, err := s.dyn.Resource(parentGVR).Namespace(ns).List(rctx, metav1.ListOptions{Limit: 1})
	cancel()
	if err != nil {
		s.faultErr("cluster loss: read the resourceVersion: %v", err)
		return
	}
	rv, err := strconv.ParseInt(list.GetResourceVersion(), 10, 64)
	if err != nil {
		s.faultErr("cluster loss: resourceVersion %q: %v", list.GetResourceVersion(), err)
		return
	}
	s.applied.stopAt(rv)
	for i, n := range s.cluster.Nodes {
		if err := s.cluster.Kill(i); err != nil {
			s.faultErr("cluster loss: SIGKILL %s: %v", n.Name, err)
		}
	}
	for i, n := range s.cluster.Nodes {
		if err := s.cluster.Wipe(i); err != nil {
			s.faultErr("cluster loss: wipe %s: %v", n.Name, err)
		}
	}
	time.Sleep(time.Second)
	for i, n := range s.cluster.Nodes {
		if err := s.cluster.Start(i); err != nil {
			s.faultErr("cluster loss: start %s: %v", n.Name, err)
			return
		}
	}
	s.fault("whole NATS cluster lost (every node SIGKILLed, every store wiped)")
	took, err := s.waitClusterHealthy(ctx, 3*time.Minute)
	if err != nil {
		s.rejoinFail("cluster loss: the new cluster not healthy 3m after its start: %v", err)
		return
	}
	s.logf("whole NATS cluster lost and started empty in %s (healthy %s after the start)", since(t), took.Round(10*time.Millisecond))
}

// rollingRestart restarts every node in turn the way the StatefulSet's
// rolling update does: lame-duck mode (the preStop hook), exit, start, and
// the next node once this one passes the readiness probe
// (/healthz?js-server-only=true).
func (s *suite) rollingRestart(ctx context.Context) {
	t := time.Now()
	for i, n := range s.cluster.Nodes {
		if err := s.cluster.Stop(i, 60*time.Second); err != nil {
			s.faultErr("rolling restart: stop %s: %v", n.Name, err)
		}
		if err := s.cluster.Start(i); err != nil {
			s.faultErr("rolling restart: start %s: %v", n.Name, err)
			return
		}
		wctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
		err := s.cluster.WaitNode(wctx, i, "js-server-only=true")
		cancel()
		if err != nil {
			s.faultErr("rolling restart: %s not ready: %v", n.Name, err)
			return
		}
		s.logf("rolling restart: %s restarted and ready (%s so far)", n.Name, since(t))
	}
	s.fault("NATS rolling restart (lame duck, node by node)")
	took, err := s.waitClusterHealthy(ctx, 3*time.Minute)
	if err != nil {
		s.rejoinFail("rolling restart: the cluster not current 3m after: %v", err)
		return
	}
	s.logf("rolling restart done in %s (every node current %s after the last one was ready)", since(t), took.Round(10*time.Millisecond))
}

// partitionNode cuts a node from the other two (its clients still reach
// it) for the configured time.
func (s *suite) partitionNode(ctx context.Context, target string) {
	i, name, err := s.leaderOf(ctx, target)
	if err != nil {
		s.faultErr("partition: %v", err)
		return
	}
	s.cluster.Partition(i)
	s.fault("NATS node partitioned from the others")
	s.logf("partitioned %s (%s) from the other nodes for %s", name, targetLabel(target), s.cfg.partitionFor)
	select {
	case <-ctx.Done():
	case <-time.After(s.cfg.partitionFor):
	}
	s.cluster.Heal(i)
	took, err := s.waitClusterHealthy(ctx, 3*time.Minute)
	if err != nil {
		s.rejoinFail("partition of %s: the cluster not current 3m after the heal: %v", name, err)
		return
	}
	s.recordCatchUp("NATS node partitioned from the others", took)
	s.logf("healed %s; the cluster was current again %s later", name, took.Round(10*time.Millisecond))
}

// stepDown moves the leader of a random stream or partition consumer.
func (s *suite) stepDown(ctx context.Context) {
	streams := []string{bus.WorkStream, bus.DesiredStream, ownersStream, bus.SchedStream}
	stream := streams[rand.IntN(len(streams))]
	consumer := ""
	if rand.IntN(2) == 0 {
		stream = []string{bus.WorkStream, bus.DesiredStream}[rand.IntN(2)]
		var all []string
		var err error
		for range 6 { // a leader may be moving: retry
			rctx, cancel := rq(ctx)
			st, serr := s.js.Stream(rctx, stream)
			if err = serr; err == nil {
				names := st.ConsumerNames(rctx)
				for n := range names.Name() {
					all = append(all, n)
				}
				err = names.Err()
			}
			cancel()
			if len(all) > 0 {
				break
			}
			time.Sleep(time.Second)
		}
		if len(all) == 0 {
			s.faultErr("stepdown: no consumer of %s listed: %v", stream, err)
			return
		}
		consumer = all[rand.IntN(len(all))]
	}
	leader := func() (string, error) {
		rctx, cancel := rq(ctx)
		defer cancel()
		if consumer == "" {
			return s.cluster.StreamLeader(rctx, s.js, stream)
		}
		return s.cluster.ConsumerLeader(rctx, s.js, stream, consumer)
	}
	var before string
	var err error
	for range 6 { // a leader may be moving (or the consumer recreated): retry
		if before, err = leader(); err == nil {
			break
		}
		time.Sleep(time.Second)
	}
	if err != nil {
		s.faultErr("stepdown: %v", err)
		return
	}
	for range 3 { // an unanswered request (a node fault going on): retry
		rctx, cancel := rq(ctx)
		if consumer == "" {
			err = testnats.StepDownStream(rctx, s.admin, stream)
		} else {
			err = testnats.StepDownConsumer(rctx, s.admin, stream, consumer)
		}
		cancel()
		if !errors.Is(err, context.DeadlineExceeded) {
			break
		}
	}
	what, kind := stream, "stream leader stepdown"
	if consumer != "" {
		what, kind = stream+"/"+consumer, "consumer leader stepdown"
	}
	if err != nil {
		s.faultErr("%s of %s: %v", kind, what, err)
		return
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		after, err := leader()
		if err == nil && after != before {
			s.fault(kind)
			s.logf("%s of %s: %s -> %s", kind, what, before, after)
			return
		}
		if time.Now().After(deadline) {
			s.faultErr("%s of %s: the leader did not move from %s in 30s (last: %s, %v)", kind, what, before, after, err)
			return
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// Service cuts: which service, and the moment it is cut.
const (
	cutDispatcher = "dispatcher mid-hook-call"
	cutApplier    = "applier mid-apply"
	cutWatcher    = "watcher leader"
)

var cutKinds = []string{cutDispatcher, cutApplier, cutWatcher}

// cutService cuts a service from NATS (not from the API server) at a
// chosen moment, for the configured time:
//   - a dispatcher while the hook holds one of its sync calls: the parent
//     of the call is updated (and left alone by the churn until the heal)
//     and the hook answers once the dispatcher is cut,
//     so it has a desired state to publish, already out of date, and
//     leases to renew, and no NATS; the publish waits in the cut and is
//     stored at the heal, after the newer answer another dispatcher
//     published meanwhile;
//   - an applier in the middle of a desired state: just after one of its
//     writes (its Applied note is the first thing held) when the
//     controller suppresses echoes, otherwise after its writes and before
//     its acknowledgement;
//   - the watcher holding the Kubernetes Lease (it keeps the Lease: it
//     still reaches the API server).
func (s *suite) cutService(ctx context.Context, kind string) {
	var p *proc
	var release func()
	switch kind {
	case cutDispatcher:
		caught, err := s.hook.catchNext(30 * time.Second)
		if err != nil {
			s.faultErr("cut %s: %v", kind, err)
			return
		}
		release = caught.release
		if p = s.serviceByConn(caught.remote, "dispatcher"); p == nil {
			release()
			s.faultErr("cut %s: no dispatcher owns the hook call from %s", kind, caught.remote)
			return
		}
		s.proxies(p).Cut()
		// The parent moves on while its answer is held: another
		// dispatcher, once the cut one's lease ran out, applies the new
		// generation's answer before the heal delivers the held publish
		// of the old one, which must then not be applied (a child going
		// back a gen fails the order invariant). The churn leaves the
		// parent alone until the heal.
		defer s.changeDuringCut(ctx, caught.parent)()
		// The hook answers while the dispatcher is cut off.
		time.Sleep(500 * time.Millisecond)
		release()
	case cutApplier:
		appliers := s.servicesOf("applier")
		p = appliers[rand.IntN(len(appliers))]
		// Between two writes of a desired state the applier sends its
		// Applied note (only for a controller that suppresses echoes);
		// otherwise the cut comes after its writes, just before the
		// acknowledgement: applied, not acknowledged.
		pattern := "$JS.ACK." + bus.DesiredStream + "."
		if s.cfg.suppressEchoes {
			pattern = bus.AppliedSubject + " "
		}
		fired, disarm := s.proxies(p).CutOn([]byte(pattern))
		select {
		case <-fired:
		case <-time.After(60 * time.Second):
			disarm()
			s.faultErr("cut %s: %s applied nothing for 60s", kind, p.name)
			return
		case <-ctx.Done():
			disarm()
			return
		}
		disarm()
	case cutWatcher:
		var err error
		if p, err = s.watcherLeader(ctx); err != nil {
			s.faultErr("cut %s: %v", kind, err)
			return
		}
		s.proxies(p).Cut()
	}
	began := time.Now()
	s.markCut(p.name, began, time.Time{})
	s.fault("service cut from NATS: " + kind)
	s.logf("cut %s (%s) from NATS for %s", p.name, kind, s.cfg.partitionFor)
	select {
	case <-ctx.Done():
	case <-time.After(s.cfg.partitionFor):
	}
	s.proxies(p).Heal()
	s.markCut(p.name, began, time.Now())
	s.logf("healed %s's NATS connections", p.name)
}

// changeDuringCut updates the parent named name (a spec change, as the
// churn makes) and keeps the churn off it until the returned function is
// called (at the heal): a parent the churn deletes meanwhile may be gone
// by the heal, and the held answer with it. It waits up to 3s for the
// churn's operation on the name to end, since two updates at once could
// store their gens in the wrong order. An operation that holds on longer
// is a delete whose recreate waits for the finalizer, often for the very
// call held: the parent is being deleted then and no other update of it
// runs, so it is changed all the same.
func (s *suite) changeDuringCut(ctx context.Context, name string) (heal func()) {
	heal = func() {}
	i := slices.Index(s.work.names, name)
	if i < 0 {
		s.faultErr("cut %s: the held call is about %q, not a parent of the workload", cutDispatcher, name)
		return heal
	}
	uctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	locked := false
	for deadline := time.Now().Add(3 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if locked = s.work.locks[i].TryLock(); locked {
			heal = s.work.locks[i].Unlock
			break
		}
	}
	if !locked {
		p, err := s.dyn.Resource(parentGVR).Namespace(ns).Get(uctx, name, metav1.GetOptions{})
		if err != nil || p.GetDeletionTimestamp() == nil {
			s.logf("%s, whose hook call the cut dispatcher holds, is being changed by the churn (%v)", name, err)
			return heal
		}
	}
	if err := s.work.update(uctx, i); err != nil {
		s.faultErr("cut %s: update %s: %v", cutDispatcher, name, err)
		return heal
	}
	s.logf("updated %s, whose hook call the cut dispatcher holds, to gen %d", name, s.work.gen[i].Load())
	return heal
}

// markCut records a period p was cut from NATS (end zero: still cut).
func (s *suite) markCut(name string, from, to time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	ws := s.cutWindows[name]
	if to.IsZero() {
		s.cutWindows[name] = append(ws, [2]time.Time{from, from.Add(24 * time.Hour)})
		return
	}
	for i := range ws {
		if ws[i][0].Equal(from) {
			ws[i][1] = to
		}
	}
}

func (s *suite) proxies(p *proc) *testnats.ProxySet {
	ps, err := s.cluster.Service(p.name)
	if err != nil {
		s.faultErr("proxies of %s: %v", p.name, err)
		return &testnats.ProxySet{}
	}
	return ps
}

func (s *suite) servicesOf(kind string) []*proc {
	var out []*proc
	for _, p := range s.services {
		if kindOf(p.name) == kind {
			out = append(out, p)
		}
	}
	return out
}

// serviceByConn finds the service of a kind whose process owns the local
// end of a TCP connection (remote is the address the hook saw).
func (s *suite) serviceByConn(remote, kind string) *proc {
	candidates := s.servicesOf(kind)
	pids := map[int]*proc{}
	for _, p := range candidates {
		if pid := p.pid(); pid != 0 {
			pids[pid] = p
		}
	}
	pid, err := connOwner(remote, pids)
	if err != nil {
		s.logf("find the owner of %s: %v", remote, err)
		return nil
	}
	return pids[pid]
}

// watcherLeader returns the watcher holding the leader-election Lease: the
// one whose log announced the Lease's holder identity.
func (s *suite) watcherLeader(ctx context.Context) (*proc, error) {
	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	lease, err := s.cs.CoordinationV1().Leases(leaseNamespace).Get(rctx, leaseName, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("watcher Lease: %w", err)
	}
	if lease.Spec.HolderIdentity == nil || *lease.Spec.HolderIdentity == "" {
		return nil, fmt.Errorf("the watcher Lease has no holder")
	}
	id := *lease.Spec.HolderIdentity
	for _, p := range s.servicesOf("watcher") {
		data, err := os.ReadFile(p.logPath)
		if err == nil && strings.Contains(string(data), id) && p.pid() != 0 {
			return p, nil
		}
	}
	return nil, fmt.Errorf("no watcher log names the Lease holder %q", id)
}

// The watcher's leader-election Lease (services/watcher's defaults).
const (
	leaseNamespace = "metabus"
	leaseName      = "metabus-watcher"
)

// connectAdmin connects to NATS with full rights: the single server's
// URL, or the cluster's admin user on every node.
func (s *suite) connectAdmin() (*nats.Conn, error) {
	if s.cluster != nil {
		return s.cluster.Connect(testnats.AdminUser)
	}
	return nats.Connect(s.natsURL, nats.Timeout(5*time.Second))
}

// profileNATS saves a CPU profile of every node over the next d, in the
// work directory as <node>.<label>.cpu.pprof (go tool pprof -top <file>),
// in the background; wait waits for them.
func (s *suite) profileNATS(label string, d time.Duration) (wait func()) {
	var wg sync.WaitGroup
	for _, n := range s.cluster.Nodes {
		wg.Go(func() {
			path := filepath.Join(s.dir, n.Name+"."+label+".cpu.pprof")
			client := &http.Client{Timeout: d + 30*time.Second}
			resp, err := client.Get(fmt.Sprintf("http://127.0.0.1:%d/debug/pprof/profile?seconds=%d", n.ProfPort, int(d.Seconds())))
			if err != nil {
				s.logf("profile %s: %v", n.Name, err)
				return
			}
			defer resp.Body.Close()
			f, err := os.Create(path)
			if err != nil {
				s.logf("profile %s: %v", n.Name, err)
				return
			}
			defer f.Close()
			if _, err := io.Copy(f, resp.Body); err != nil {
				s.logf("profile %s: %v", n.Name, err)
				return
			}
			s.logf("CPU profile of %s over %s (%s): %s", n.Name, d, label, path)
		})
	}
	return wg.Wait
}
