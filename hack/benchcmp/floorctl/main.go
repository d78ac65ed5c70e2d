// Command floorctl is benchcmp's contract-floor contender: the least a
// controller can do and still keep upstream Metacontroller's calling
// contract for one CompositeController with one child type. It is the
// bound of controller CPU per parent that metabus and upstream are
// measured against, not a controller to run: no generality (one
// controller, one parent type, one child type, namespaced parents, no
// finalize, customize or rolling updates, no adoption of orphans, no
// resync), no bus, no revisions, no cache but the informers'.
//
// What it keeps of the contract: the hook sees every change, its own
// writes included. It watches the parents, the children and the
// CompositeController (the request's "controller", and the hook's URL)
// with metabus's shared informers (pkg/informers: watch events decoded in
// one pass straight into the cached objects, what metabus pays); a work
// queue keyed by parent coalesces the events of a parent (its own, and
// its children's, mapped by controller ownerReference); each sync builds
// the sync request as upstream sends it (controller, parent, children by
// Kind.apiVersion, related {}, finalizing false) with metabus's encoder
// (pkg/hookapi), POSTs it to the hook, and applies the answer with no
// request it can do without: a child created if missing, updated if it
// differs, deleted if no longer desired; the parent's status PUT if it
// differs. No GETs, no LISTs but the informers' first, no patches.
//
// A parent whose last sync wrote something waits until the informers have
// delivered those writes (see expectation) before its next sync: without
// that wait a sync can see its child and not its first status, or the
// reverse, and the hook answers a state that never was whole.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/util/workqueue"

	"github.com/metabus/metabus/pkg/hookapi"
	"github.com/metabus/metabus/pkg/informers"
	"github.com/metabus/metabus/pkg/kubeapi"
)

var ccGVR = schema.GroupVersionResource{Group: "metacontroller.k8s.io", Version: "v1alpha1", Resource: "compositecontrollers"}

func main() {
	var (
		kubeconfig, controller, parent, child, childKind, health string
		workers                                                  int
		qps                                                      float64
		burst                                                    int
	)
	flag.StringVar(&kubeconfig, "kubeconfig", "", "kubeconfig of the cluster")
	flag.StringVar(&controller, "controller", "bench", "the CompositeController whose hook is called and which is sent as the request's controller")
	flag.StringVar(&parent, "parent", "bench.metabus.dev/v1/benches/Bench", "the parent resource: group/version/resource/Kind")
	flag.StringVar(&child, "child", "v1/configmaps", "the child resource: [group/]version/resource")
	flag.StringVar(&childKind, "child-kind", "ConfigMap", "the child resource's kind")
	flag.StringVar(&health, "health-address", "127.0.0.1:0", "where /readyz answers once the informers have synced")
	flag.IntVar(&workers, "workers", 50, "parents synced at once")
	flag.Float64Var(&qps, "qps", -1, "client-side rate limit, requests per second (<= 0: none, as metabus's default)")
	flag.IntVar(&burst, "burst", 200, "client-side rate limit burst (with -qps > 0)")
	flag.Parse()
	if err := run(kubeconfig, controller, parent, child, childKind, health, workers, qps, burst); err != nil {
		fmt.Fprintln(os.Stderr, "floorctl:", err)
		os.Exit(1)
	}
}

func run(kubeconfig, controller, parent, child, childKind, health string, workers int, qps float64, burst int) error {
	pg, pkind, err := parseParent(parent)
	if err != nil {
		return err
	}
	cg, err := parseResource(child)
	if err != nil {
		return fmt.Errorf("-child: %w", err)
	}
	if workers < 1 {
		return errors.New("-workers must be positive")
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return fmt.Errorf("kubeconfig: %w", err)
	}
	cfg.QPS, cfg.Burst = float32(qps), burst
	if qps <= 0 {
		cfg.QPS = -1 // client-go's "no limiter"; 0 would be its default of 5
	}
	reg, err := informers.NewForConfig(cfg, 0)
	if err != nil {
		return err
	}
	rc, err := kubeapi.NewREST(cfg)
	if err != nil {
		return err
	}
	ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer cancel()

	f := &floor{
		rc:         rc,
		parentGVR:  pg,
		parentKind: pkind,
		childGVR:   cg,
		childKind:  childKind,
		ccName:     controller,
		hook: &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
			MaxIdleConnsPerHost: workers, IdleConnTimeout: 90 * time.Second,
		}},
		queue:  workqueue.NewTypedRateLimitingQueue(workqueue.DefaultTypedControllerRateLimiter[string]()),
		expect: map[string]expectation{},
	}
	f.ccs = reg.Acquire(ccGVR)
	f.parents = reg.Acquire(pg)
	f.children = reg.Acquire(cg)
	for _, h := range []struct {
		h  *informers.Handle
		fn func(obj any)
	}{{f.ccs, f.onController}, {f.parents, f.onParent}, {f.children, f.onChild}} {
		fn := h.fn
		if err := h.h.AddHandler(cache.ResourceEventHandlerFuncs{
			AddFunc:    fn,
			UpdateFunc: func(old, cur any) { f.onUpdate(fn, old, cur) },
			DeleteFunc: fn,
		}); err != nil {
			return err
		}
	}
	for _, h := range []*informers.Handle{f.ccs, f.parents, f.children} {
		if !h.WaitForSync(ctx) {
			return fmt.Errorf("informer of %s did not sync", h.GVR())
		}
	}

	l, err := net.Listen("tcp", health)
	if err != nil {
		return fmt.Errorf("health address: %w", err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/readyz" && r.URL.Path != "/healthz" {
			http.NotFound(w, r)
			return
		}
		_, _ = w.Write([]byte("ok"))
	})}
	go func() { _ = srv.Serve(l) }()
	log.Printf("floorctl: %d workers, parents %s (%s), children %s (%s), controller %s; ready at http://%s/readyz", workers, pg, pkind, cg, childKind, controller, l.Addr())

	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for f.next(ctx) {
			}
		})
	}
	<-ctx.Done()
	f.queue.ShutDown()
	_ = srv.Close()
	wg.Wait()
	log.Printf("floorctl: %d syncs, %d failed", f.syncs.Load(), f.failed.Load())
	return nil
}

// parseParent reads group/version/resource/Kind ("" group: the core).
func parseParent(s string) (schema.GroupVersionResource, string, error) {
	i := strings.LastIndexByte(s, '/')
	if i < 0 || s[i+1:] == "" {
		return schema.GroupVersionResource{}, "", fmt.Errorf("-parent %q: want group/version/resource/Kind", s)
	}
	gvr, err := parseResource(s[:i])
	if err != nil {
		return gvr, "", fmt.Errorf("-parent: %w", err)
	}
	return gvr, s[i+1:], nil
}

// parseResource reads [group/]version/resource.
func parseResource(s string) (schema.GroupVersionResource, error) {
	parts := strings.Split(s, "/")
	switch {
	case len(parts) == 2 && parts[0] != "" && parts[1] != "":
		return schema.GroupVersionResource{Version: parts[0], Resource: parts[1]}, nil
	case len(parts) == 3 && parts[0] != "" && parts[1] != "" && parts[2] != "":
		return schema.GroupVersionResource{Group: parts[0], Version: parts[1], Resource: parts[2]}, nil
	}
	return schema.GroupVersionResource{}, fmt.Errorf("%q: want [group/]version/resource", s)
}

// floor is the controller.
type floor struct {
	rc                    rest.Interface
	hook                  *http.Client
	enc                   hookapi.Encoder
	queue                 workqueue.TypedRateLimitingInterface[string]
	ccs, parents          *informers.Handle
	children              *informers.Handle
	parentGVR, childGVR   schema.GroupVersionResource
	parentKind, childKind string
	ccName                string
	cc                    atomic.Pointer[unstructured.Unstructured]

	mu     sync.Mutex
	expect map[string]expectation // by parent key

	syncs, failed atomic.Int64
}

// onUpdate calls fn for the old object too when it was another parent's
// (a child whose controller changed), else for the new one only.
func (f *floor) onUpdate(fn func(any), old, cur any) {
	fn(cur)
	if o, ok := old.(*unstructured.Unstructured); ok {
		if c, ok := cur.(*unstructured.Unstructured); ok && ownerKey(o) != ownerKey(c) {
			fn(old)
		}
	}
}

func ownerKey(u *unstructured.Unstructured) string {
	if ref := metav1.GetControllerOfNoCopy(u); ref != nil {
		return ref.Kind + "/" + ref.Name
	}
	return ""
}

// onController keeps the CompositeController and, when it appears or
// changes, syncs every parent.
func (f *floor) onController(obj any) {
	u, ok := objectOf(obj)
	if !ok || u.GetName() != f.ccName {
		return
	}
	// The cache's, not the event's: a delete event's object is gone.
	cur, exists, _ := f.ccs.Informer().GetIndexer().GetByKey(u.GetName())
	if !exists {
		f.cc.Store(nil)
		return
	}
	cc, ok := cur.(*unstructured.Unstructured)
	if !ok {
		return
	}
	f.cc.Store(cc)
	for _, p := range f.parents.List() {
		f.queue.Add(p.GetNamespace() + "/" + p.GetName())
	}
}

func (f *floor) onParent(obj any) {
	if u, ok := objectOf(obj); ok {
		f.queue.Add(u.GetNamespace() + "/" + u.GetName())
	}
}

// onChild syncs the parent controlling the child.
func (f *floor) onChild(obj any) {
	u, ok := objectOf(obj)
	if !ok {
		return
	}
	ref := metav1.GetControllerOfNoCopy(u)
	if ref == nil || ref.Kind != f.parentKind {
		return
	}
	if gv, err := schema.ParseGroupVersion(ref.APIVersion); err != nil || gv.Group != f.parentGVR.Group {
		return
	}
	f.queue.Add(u.GetNamespace() + "/" + ref.Name)
}

func objectOf(obj any) (*unstructured.Unstructured, bool) {
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = d.Obj
	}
	u, ok := obj.(*unstructured.Unstructured)
	return u, ok
}

// next syncs one parent; false once the queue is shut down.
func (f *floor) next(ctx context.Context) bool {
	key, shutdown := f.queue.Get()
	if shutdown {
		return false
	}
	defer f.queue.Done(key)
	f.syncs.Add(1)
	if err := f.sync(ctx, key); err != nil {
		f.failed.Add(1)
		if ctx.Err() == nil {
			log.Printf("sync %s: %v", key, err)
		}
		f.queue.AddRateLimited(key)
		return true
	}
	f.queue.Forget(key)
	return true
}
