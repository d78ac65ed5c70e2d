package e2e

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/metabus/metabus/examples/helloworld"
	"github.com/metabus/metabus/internal/testing/testnats"
	"github.com/metabus/metabus/pkg/bus"
)

// TestClusterR3 runs every stage as its own process (two dispatchers and
// two appliers, as deploy/ ships them) against the production NATS
// topology: three nats-server processes from the shipped nats-server.conf
// and cluster.conf, R3 streams (--stream-replicas=3), each service behind
// its own proxy. HelloWorld converges; then, with the MC_WORK leader's node
// SIGKILLed, MC_DESIRED's and the owners bucket's leaders moved and a
// dispatcher cut from NATS, a second parent converges too, the stopped node
// catches up, and NATS refused nothing any service did.
func TestClusterR3(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the service binaries and runs three nats-servers")
	}
	waitsInParallel(t)
	ctx := context.Background()
	b := startClusterBed(t)
	c, admin, js, url := b.c, b.admin, b.js, b.url
	label := "cluster-r3"
	logs := startServices(t, url, c.Seeds, []serviceSpec{
		{"watcher", []string{"--target-label-selector=metabus.dev/e2e=" + label, "--discovery-interval=5s", "--stream-replicas=3"}},
		{"dispatcher", nil},
		{"dispatcher", nil},
		{"applier", []string{"--discovery-interval=5s"}},
		{"applier", []string{"--discovery-interval=5s"}},
		{"revisions", nil},
	})

	eventually(t, 2*time.Minute, "R3 streams", func() error {
		for _, name := range []string{bus.WorkStream, bus.DesiredStream, bus.SchedStream, bus.AdvisoryStream, bus.DLQStream, "KV_" + bus.OwnersBucket} {
			rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			s, err := js.Stream(rctx, name)
			cancel()
			if err != nil {
				return fmt.Errorf("%s: %w", name, err)
			}
			info := s.CachedInfo()
			if info.Config.Replicas != 3 || info.Cluster == nil || len(info.Cluster.Replicas) != 2 {
				return fmt.Errorf("%s: %d replicas configured, cluster %+v", name, info.Config.Replicas, info.Cluster)
			}
		}
		return nil
	})

	ns := newNamespace(t)
	hook := hookServer(t, helloworld.Handler())
	cc := manifest(t, "controller.yaml")
	unstructured.SetNestedField(cc, hook+"/sync", "spec", "hooks", "sync", "webhook", "url")
	createController(t, &instance{selector: label}, cc["kind"].(string), "hello-cluster", cc["spec"].(map[string]any))
	hello := func(name, who string) {
		t.Helper()
		createHello(t, ns, name, who)
		helloConverged(t, ns, name, who, 2*time.Minute)
	}
	hello("first", "First")

	// Faults: the node leading MC_WORK is killed, the other leaders move,
	// a dispatcher loses NATS.
	rq := func() context.Context {
		rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		t.Cleanup(cancel)
		return rctx
	}
	leader, err := c.StreamLeader(rq(), js, bus.WorkStream)
	if err != nil {
		t.Fatal(err)
	}
	down := c.NodeIndex(leader)
	if err := c.Kill(down); err != nil {
		t.Fatal(err)
	}
	t.Logf("SIGKILLed %s, the leader of %s", leader, bus.WorkStream)
	for _, stream := range []string{bus.DesiredStream, "KV_" + bus.OwnersBucket} {
		eventually(t, time.Minute, "a leader of "+stream+" to step down", func() error {
			return testnats.StepDownStream(rq(), admin, stream)
		})
	}
	cut, err := c.Service("dispatcher")
	if err != nil {
		t.Fatal(err)
	}
	cut.Cut()
	hello("second", "Second")
	cut.Heal()
	if err := c.Start(down); err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	if err := c.WaitHealthy(wctx); err != nil {
		t.Fatalf("the cluster after %s came back: %v", leader, err)
	}
	hello("third", "Third")
	checkNoPermissionDenied(t, logs)
}

// clusterBed is the 3-node test bed of a test, the test bed's admin
// connection, and the proxied NATS URL of each service.
type clusterBed struct {
	c     *testnats.Cluster
	admin *nats.Conn
	js    jetstream.JetStream
	url   func(service string) string
}

func startClusterBed(t *testing.T) *clusterBed {
	t.Helper()
	c := testnats.StartCluster(t, "../deploy/nats/nats-server.conf")
	admin, err := c.Connect(testnats.AdminUser)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(admin.Close)
	js, err := jetstream.New(admin)
	if err != nil {
		t.Fatal(err)
	}
	return &clusterBed{c: c, admin: admin, js: js, url: func(name string) string {
		u, err := c.ServiceURL(name)
		if err != nil {
			t.Fatal(err)
		}
		return u
	}}
}

// helloConverged waits for a HelloWorld parent's Pod and status.
func helloConverged(t *testing.T, ns, name, who string, timeout time.Duration) {
	t.Helper()
	ctx := context.Background()
	eventually(t, timeout, "the child Pod and status of "+name, func() error {
		pod, err := dyn.Resource(podsGVR).Namespace(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if got, want := podCommand(pod), "echo Hello, "+who+"!"; got != want {
			return fmt.Errorf("command %q, want %q", got, want)
		}
		p, err := dyn.Resource(helloGVR).Namespace(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if n, ok := nestedInt(p, "status", "pods"); !ok || n != 1 {
			return fmt.Errorf("status %v", p.Object["status"])
		}
		return nil
	})
}

// TestClusterLostBusResync: the whole NATS cluster loses its data (every
// node SIGKILLed, every store wiped) while a parent's work item waits in
// MC_WORK. Kubernetes still has the parent; the watcher notices that the
// streams were created anew and resyncs every parent, so the parent
// converges within seconds instead of at the next cache flush (30 min).
func TestClusterLostBusResync(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the service binaries and runs three nats-servers")
	}
	waitsInParallel(t)
	ctx := context.Background()
	b := startClusterBed(t)
	c, js, url := b.c, b.js, b.url
	label := "cluster-lost"
	// No dispatcher yet: work items wait in MC_WORK.
	logs := startServices(t, url, c.Seeds, []serviceSpec{
		{"watcher", []string{"--target-label-selector=metabus.dev/e2e=" + label, "--discovery-interval=5s", "--stream-replicas=3"}},
		{"revisions", nil},
	})
	ns := newNamespace(t)
	hook := hookServer(t, helloworld.Handler())
	cc := manifest(t, "controller.yaml")
	unstructured.SetNestedField(cc, hook+"/sync", "spec", "hooks", "sync", "webhook", "url")
	createController(t, &instance{selector: label}, cc["kind"].(string), "hello-lost", cc["spec"].(map[string]any))
	createHello(t, ns, "lost", "Lost")
	eventually(t, 2*time.Minute, "the work item of the parent in MC_WORK", func() error {
		rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		s, err := js.Stream(rctx, bus.WorkStream)
		if err != nil {
			return err
		}
		if n := s.CachedInfo().State.Msgs; n == 0 {
			return fmt.Errorf("MC_WORK holds %d messages", n)
		}
		return nil
	})

	for i := range c.Nodes {
		if err := c.Kill(i); err != nil {
			t.Fatal(err)
		}
		if err := c.Wipe(i); err != nil {
			t.Fatal(err)
		}
	}
	for i := range c.Nodes {
		if err := c.Start(i); err != nil {
			t.Fatal(err)
		}
	}
	wctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	if err := c.WaitHealthy(wctx); err != nil {
		t.Fatal(err)
	}
	t.Log("the NATS cluster lost every store and started empty")
	for name, path := range startServices(t, url, c.Seeds, []serviceSpec{
		{"dispatcher", nil},
		{"applier", []string{"--discovery-interval=5s"}},
	}) {
		logs[name] = path
	}
	helloConverged(t, ns, "lost", "Lost", time.Minute)
	checkNoPermissionDenied(t, logs)
}
