package e2e

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"

	"github.com/metabus/metabus/examples/helloworld"
	"github.com/metabus/metabus/internal/allinone"
	"github.com/metabus/metabus/pkg/bus"
	"github.com/metabus/metabus/pkg/embeddednats"
	"github.com/metabus/metabus/pkg/natsx"
	"github.com/metabus/metabus/services/applier"
	"github.com/metabus/metabus/services/dispatcher"
	"github.com/metabus/metabus/services/watcher"
)

// TestWatcherLeaderElection: two watcher replicas with --leader-election;
// only the leader publishes work items, and when it stops the other takes
// over and changes keep converging.
func TestWatcherLeaderElection(t *testing.T) {
	ctx := context.Background()
	ns := newNamespace(t)
	srv, err := embeddednats.Start(embeddednats.Options{StoreDir: t.TempDir(), Listen: "-"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Shutdown(); srv.WaitForShutdown() })
	log := zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel))
	// Each service under its production RBAC, the watchers' Lease in the
	// namespace its Role covers.
	rc := asServiceAccounts(env.Config)
	const label = "leader-election"
	type replica struct {
		cancel context.CancelFunc
		done   chan struct{} // closed when run returns
		reg    *prometheus.Registry
	}
	start := func(name string, run func(context.Context, *prometheus.Registry) error) *replica {
		r := &replica{done: make(chan struct{}), reg: prometheus.NewRegistry()}
		var rctx context.Context
		rctx, r.cancel = context.WithCancel(ctx)
		go func() {
			defer close(r.done)
			if err := run(rctx, r.reg); err != nil && rctx.Err() == nil {
				t.Errorf("%s: %v", name, err)
			}
		}()
		t.Cleanup(func() {
			r.cancel()
			select {
			case <-r.done:
			case <-time.After(30 * time.Second):
				t.Errorf("%s did not stop", name)
			}
		})
		return r
	}
	connect := func(name string) (*natsx.ConnOptions, error) {
		return &natsx.ConnOptions{InProcess: srv, Name: name}, nil
	}
	newWatcher := func(name string) *replica {
		return start(name, func(rctx context.Context, reg *prometheus.Registry) error {
			o, _ := connect(name)
			nc, js, err := natsx.Connect(*o)
			if err != nil {
				return err
			}
			defer nc.Close()
			w, err := watcher.New(watcher.Config{
				TargetLabelSelector: "metabus.dev/e2e=" + label, LeaderElect: true,
				LeaderElectionNamespace: "metabus", LeaderElectionID: "watcher-" + label,
				ServeSnapshots: true, EnsureStreams: true, DiscoveryInterval: 5 * time.Second,
			}, watcher.Deps{REST: rc[allinone.ServiceWatcher], NC: nc, JS: js, Log: log.Named(name), Metrics: reg})
			if err != nil {
				return err
			}
			return w.Run(rctx)
		})
	}
	a := newWatcher("watcher-a")
	b := newWatcher("watcher-b")
	start("dispatcher", func(rctx context.Context, reg *prometheus.Registry) error {
		nc, js, err := natsx.Connect(natsx.ConnOptions{InProcess: srv, Name: "dispatcher"})
		if err != nil {
			return err
		}
		defer nc.Close()
		d, err := dispatcher.New(dispatcher.Config{RunRelay: true}, dispatcher.Deps{REST: rc[allinone.ServiceDispatcher], NC: nc, JS: js, Log: log, Metrics: reg})
		if err != nil {
			return err
		}
		return d.Run(rctx)
	})
	start("applier", func(rctx context.Context, reg *prometheus.Registry) error {
		nc, js, err := natsx.Connect(natsx.ConnOptions{InProcess: srv, Name: "applier"})
		if err != nil {
			return err
		}
		defer nc.Close()
		ap, err := applier.New(applier.Config{}, applier.Deps{REST: rc[allinone.ServiceApplier], NC: nc, JS: js, Log: log, Metrics: reg})
		if err != nil {
			return err
		}
		return ap.Run(rctx)
	})

	url := hookServer(t, helloworld.Handler())
	cc := manifest(t, "controller.yaml")
	unstructured.SetNestedField(cc, url+"/sync", "spec", "hooks", "sync", "webhook", "url")
	createController(t, &instance{selector: label}, cc["kind"].(string), "hello-leader", cc["spec"].(map[string]any))
	hello := &unstructured.Unstructured{Object: manifest(t, "hello.yaml")}
	if _, err := dyn.Resource(helloGVR).Namespace(ns).Create(ctx, hello, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	greeting := func(want string) func() error {
		return func() error {
			pod, err := dyn.Resource(podsGVR).Namespace(ns).Get(ctx, "your-name", metav1.GetOptions{})
			if err != nil {
				return err
			}
			if got := podCommand(pod); got != want {
				return fmt.Errorf("command %q", got)
			}
			return nil
		}
	}
	eventually(t, 60*time.Second, "the child Pod", greeting("echo Hello, Your Name!"))

	published := func(r *replica) float64 {
		mfs, _ := r.reg.Gather()
		var sum float64
		for _, mf := range mfs {
			if mf.GetName() == "metabus_watcher_work_items_total" {
				for _, m := range mf.GetMetric() {
					sum += m.GetCounter().GetValue()
				}
			}
		}
		return sum
	}
	pa, pb := published(a), published(b)
	t.Logf("work items published: watcher-a %v, watcher-b %v", pa, pb)
	if (pa > 0) == (pb > 0) {
		t.Fatalf("exactly one watcher must publish: a=%v b=%v", pa, pb)
	}
	leader, follower := a, b
	if pb > 0 {
		leader, follower = b, a
	}
	// Only the leader answers snapshot requests (issue #13, defect 6): a
	// follower's cache may lag the change behind a work item whose
	// MinResourceVersions were lost when it was refused as already queued.
	if n := snapshotResponders(t, srv); n != 1 {
		t.Errorf("%d snapshot service instances, want 1 (the leader's)", n)
	}
	leader.cancel()
	<-leader.done
	t.Log("stopped the leader; the follower must take over")
	if _, err := dyn.Resource(helloGVR).Namespace(ns).Patch(ctx, "your-name", types.MergePatchType,
		[]byte(`{"spec":{"who":"Failover"}}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 60*time.Second, "the change to converge through the new leader", greeting("echo Hello, Failover!"))
	if published(follower) == 0 {
		t.Errorf("the follower never published")
	}
}

// snapshotResponders counts the instances of the snapshot micro service
// that answer a discovery ping.
func snapshotResponders(t *testing.T, srv *server.Server) int {
	t.Helper()
	nc, _, err := natsx.Connect(natsx.ConnOptions{InProcess: srv, Name: "ping"})
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	inbox := nats.NewInbox()
	sub, err := nc.SubscribeSync(inbox)
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.PublishRequest("$SRV.PING."+bus.SnapshotServiceName, inbox, nil); err != nil {
		t.Fatal(err)
	}
	n := 0
	for {
		if _, err := sub.NextMsg(500 * time.Millisecond); err != nil {
			return n
		}
		n++
	}
}
