package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"

	"github.com/metabus/metabus/internal/testing/kubeenv"
)

// parentCRD is a parent type of the workloads: a namespaced kind in
// bench.metabus.dev with the status subresource and free-form spec and
// status (Bench for B1-B5, Stall and Quick for B6, Slow for B7).
func parentCRD(kind, plural string) string {
	return kubeenv.FreeformCRD("bench.metabus.dev", kind, plural)
}

// cluster is one fresh control plane (etcd + kube-apiserver, no
// kube-controller-manager, so nothing else talks to the API server) and the
// harness's clients of it.
type cluster struct {
	env *kubeenv.Env
	// own counts the harness's requests so they can be subtracted from the
	// API server's counter.
	own *counter
	// harness is the harness's own, counted, client (creates, updates,
	// informers); ctrl is an uncounted client for the raw contender, whose
	// requests are the controller's.
	harness, ctrl dynamic.Interface
	metrics       *http.Client
	host          string
}

// startCluster starts a control plane and installs the metacontroller CRDs
// from crdDir and the Bench CRD.
func startCluster(ctx context.Context, crdDir, workDir string, logf func(string, ...any)) (*cluster, error) {
	env, err := kubeenv.Start(ctx, kubeenv.Options{NoControllerManager: true, Log: logf})
	if err != nil {
		return nil, err
	}
	c := &cluster{env: env, own: &counter{counts: reqCounts{}}}
	ok := false
	defer func() {
		if !ok {
			_ = env.Stop()
		}
	}()
	crdFile := filepath.Join(workDir, "bench-crd.yaml")
	if err := os.WriteFile(crdFile, []byte(parentCRD("Bench", "benches")), 0o644); err != nil {
		return nil, err
	}
	if err := kubeenv.ApplyManifests(ctx, env.Config, crdDir, crdFile); err != nil {
		return nil, err
	}

	base := rest.CopyConfig(env.Config)
	// The harness must never wait on its own client-side rate limiter.
	base.QPS, base.Burst = 1e6, 1e6
	if c.ctrl, err = dynamic.NewForConfig(base); err != nil {
		return nil, err
	}
	counted := rest.CopyConfig(base)
	counted.Wrap(func(rt http.RoundTripper) http.RoundTripper { return countingRT{next: rt, c: c.own} })
	if c.harness, err = dynamic.NewForConfig(counted); err != nil {
		return nil, err
	}
	if c.metrics, err = rest.HTTPClientFor(base); err != nil {
		return nil, err
	}
	c.host = base.Host
	ok = true
	return c, nil
}

func (c *cluster) stop() error { return c.env.Stop() }

// pid returns the PID of a control-plane component ("kube-apiserver", "etcd").
func (c *cluster) pid(name string) int { return c.env.PIDs()[name] }

// requestTotals scrapes the API server's request counter.
func (c *cluster) requestTotals(ctx context.Context) (reqCounts, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.host+"/metrics", nil)
	if err != nil {
		return nil, err
	}
	resp, err := c.metrics.Do(req)
	if err != nil {
		return nil, fmt.Errorf("scrape /metrics: %w", err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("scrape /metrics: %w", err)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("scrape /metrics: %s", resp.Status)
	}
	return parseRequestTotals(string(body))
}

// counter counts requests by API server verb and resource.
type counter struct {
	mu     sync.Mutex
	counts reqCounts
}

func (c *counter) snapshot() reqCounts {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make(reqCounts, len(c.counts))
	for k, v := range c.counts {
		out[k] = v
	}
	return out
}

// countingRT counts each request that got a response, i.e. that the API
// server saw and counted too.
type countingRT struct {
	next http.RoundTripper
	c    *counter
}

func (rt countingRT) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := rt.next.RoundTrip(req)
	if err == nil {
		if k, ok := classifyRequest(req.Method, req.URL, req.Header.Get("Content-Type")); ok {
			rt.c.mu.Lock()
			rt.c.counts[k]++
			rt.c.mu.Unlock()
		}
	}
	return resp, err
}

// apiSnapshot is everything a figure needs at one instant: the API server's
// request counter, the harness's share of it and the CPU time of the
// processes.
type apiSnapshot struct {
	at     time.Time
	server reqCounts
	own    reqCounts
	cpu    map[string]float64 // role -> CPU seconds
}

// snapshot reads the counters and the CPU time of the given processes
// (role -> pid; a pid of 0 is skipped).
func (c *cluster) snapshot(ctx context.Context, pids map[string]int) (apiSnapshot, error) {
	s := apiSnapshot{at: time.Now(), cpu: map[string]float64{}}
	for role, pid := range pids {
		if pid == 0 {
			continue
		}
		t, err := procCPU(pid)
		if err != nil {
			return s, fmt.Errorf("%s: %w", role, err)
		}
		s.cpu[role] = t
	}
	// Own first: a request of ours in flight during the scrape then counts
	// on neither side or only on ours, never only on the server's.
	s.own = c.own.snapshot()
	var err error
	s.server, err = c.requestTotals(ctx)
	return s, err
}

// controllerRequests is what the API server served between a and b for
// anyone but the harness, by series, without the background resources.
func controllerRequests(a, b apiSnapshot) reqCounts {
	d := b.server.sub(a.server)
	for k, v := range b.own.sub(a.own) {
		d[k] -= v
		if d[k] == 0 {
			delete(d, k)
		}
	}
	for k := range d {
		if backgroundResources[k.Resource] {
			delete(d, k)
		}
	}
	return d
}

// backgroundResources are written by the API server itself, whatever the
// controllers do (its identity lease is renewed every 10s), and are used by
// no contender (none runs with leader election).
var backgroundResources = map[string]bool{"leases": true}

// procCPU returns the CPU time (user+system) of a process in seconds.
func procCPU(pid int) (float64, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, err
	}
	t, err := parseStatCPU(string(b))
	if err != nil {
		return 0, fmt.Errorf("/proc/%d/stat: %w", pid, err)
	}
	return float64(t) / clockTicks, nil
}

// procCPUExact returns the CPU time of a process in seconds to the
// nanosecond: the sum of its threads' schedstat run times. A thread that
// exits takes its time with it, so it is for windows in which a process's
// threads live on (idle figures: the Go runtime keeps its threads, and so
// does nats-server); procCPU counts exited threads but ticks every 10 ms.
func procCPUExact(pid int) (float64, error) {
	dir := "/proc/" + strconv.Itoa(pid) + "/task"
	tasks, err := os.ReadDir(dir)
	if err != nil {
		return 0, err
	}
	var ns uint64
	for _, t := range tasks {
		b, err := os.ReadFile(dir + "/" + t.Name() + "/schedstat")
		if errors.Is(err, fs.ErrNotExist) {
			continue // the thread has exited since the listing
		}
		if err != nil {
			return 0, err
		}
		n, err := parseSchedstat(string(b))
		if err != nil {
			return 0, fmt.Errorf("%s/%s: %w", dir, t.Name(), err)
		}
		ns += n
	}
	return float64(ns) / 1e9, nil
}

// procRSS returns the resident set size of a process in bytes.
func procRSS(pid int) (int64, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return 0, err
	}
	return parseVmRSS(string(b))
}
