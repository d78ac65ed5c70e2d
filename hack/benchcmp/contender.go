package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/util/retry"
)

// controller is a contender under test: a separate process (metabus,
// upstream Metacontroller) or the harness's own raw writer.
type controller interface {
	// pid of the controller process; 0 when it runs inside the harness.
	pid() int
	stop() error
}

// proc is a controller running as a child process, its output in a log file.
type proc struct {
	name    string
	logPath string
	cmd     *exec.Cmd
	done    chan struct{}
	waitErr error
	// metricsURL, if set, is scraped into <log>.metrics just before stop,
	// so a run can be explained afterwards (syncs by result, echoes...).
	metricsURL string
}

// startProc starts path with args (and extra environment) and waits until
// GET readyURL answers 200. The child is killed by the kernel if the harness
// dies (Pdeathsig), so a crashed run leaves no controller behind.
func startProc(ctx context.Context, name, path string, args, env []string, logPath, readyURL string) (*proc, error) {
	logFile, err := os.OpenFile(logPath, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(path, args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
	p := &proc{name: name, logPath: logPath, cmd: cmd, done: make(chan struct{})}
	started := make(chan error, 1)
	go func() {
		// Pdeathsig fires when the forking *thread* exits, so fork on a
		// locked thread that stays blocked in Wait while the child lives.
		runtime.LockOSThread()
		defer logFile.Close()
		if err := cmd.Start(); err != nil {
			started <- err
			close(p.done)
			return
		}
		started <- nil
		p.waitErr = cmd.Wait()
		close(p.done)
	}()
	if err := <-started; err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	if err := p.waitReady(ctx, readyURL, 2*time.Minute); err != nil {
		_ = p.stop()
		return nil, fmt.Errorf("%s: %w (log: %s)", name, err, logPath)
	}
	return p, nil
}

func (p *proc) waitReady(ctx context.Context, url string, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	client := &http.Client{Timeout: 5 * time.Second}
	var last error
	for {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		resp, err := client.Do(req)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			err = errors.New(resp.Status)
		}
		last = err
		select {
		case <-p.done:
			return fmt.Errorf("exited during startup: %v", p.waitErr)
		case <-ctx.Done():
			return fmt.Errorf("not ready at %s: %v", url, last)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func (p *proc) pid() int { return p.cmd.Process.Pid }

// stop saves the final metrics, sends SIGTERM and, after 15s, SIGKILL.
func (p *proc) stop() error {
	select {
	case <-p.done:
		return nil
	default:
	}
	if p.metricsURL != "" {
		client := &http.Client{Timeout: 5 * time.Second}
		if resp, err := client.Get(p.metricsURL); err == nil {
			if data, err := io.ReadAll(resp.Body); err == nil {
				_ = os.WriteFile(strings.TrimSuffix(p.logPath, ".log")+".metrics", data, 0o644)
			}
			resp.Body.Close()
		}
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
		return nil
	case <-time.After(15 * time.Second):
	}
	_ = p.cmd.Process.Kill()
	<-p.done
	return fmt.Errorf("%s ignored SIGTERM for 15s and was killed", p.name)
}

// freeAddr returns 127.0.0.1:<a port free right now>.
func freeAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}

// startMetabus runs the all-in-one binary at its defaults, with an
// in-process-only embedded JetStream and loopback metrics/health ports.
func startMetabus(ctx context.Context, bin, kubeconfig, dir, logPath string, extra []string) (*proc, error) {
	metrics, err := freeAddr()
	if err != nil {
		return nil, err
	}
	health, err := freeAddr()
	if err != nil {
		return nil, err
	}
	args := []string{
		"--kubeconfig", kubeconfig,
		"--nats-store-dir", filepath.Join(dir, "nats"),
		"--nats-listen", "-",
		"--metrics-address", metrics,
		"--health-probe-bind-address", health,
	}
	args = append(args, extra...)
	p, err := startProc(ctx, "metabus", bin, args, nil, logPath, "http://"+health+"/readyz")
	if p != nil {
		p.metricsURL = "http://" + metrics + "/metrics"
	}
	return p, err
}

// upstreamTuned are the flags of "upstream tuned": 50 workers and a
// client-side rate limit far above what the workload needs.
var upstreamTuned = []string{"--workers=50", "--client-go-qps=500", "--client-go-burst=1000"}

// startUpstream runs upstream Metacontroller, tuned. It reads its
// kubeconfig from $KUBECONFIG (controller-runtime's GetConfig).
func startUpstream(ctx context.Context, bin, kubeconfig, logPath string) (*proc, error) {
	metrics, err := freeAddr()
	if err != nil {
		return nil, err
	}
	health, err := freeAddr()
	if err != nil {
		return nil, err
	}
	args := append(slices.Clone(upstreamTuned),
		"--metrics-address="+metrics,
		"--health-probe-bind-address="+health,
		"--pprof-address=0",
	)
	return startProc(ctx, "upstream", bin, args, []string{"KUBECONFIG=" + kubeconfig}, logPath, "http://"+health+"/readyz")
}

// rawWorkers is how many concurrent writers the raw contender runs.
const rawWorkers = 64

// rawController is the physical limit: the harness itself does only the
// writes the workload needs, on each parent's add event: create the
// ConfigMap (owned by the parent), then PUT the parent's status.
type rawController struct {
	dyn    dynamic.Interface
	ns     string
	queue  chan *unstructured.Unstructured
	wg     sync.WaitGroup
	cancel context.CancelFunc

	mu   sync.Mutex
	errs []error
}

func newRawController(dyn dynamic.Interface, ns string) *rawController {
	return &rawController{dyn: dyn, ns: ns, queue: make(chan *unstructured.Unstructured, 1<<16)}
}

// enqueue is the tracker's onAdd.
func (r *rawController) enqueue(u *unstructured.Unstructured) { r.queue <- u.DeepCopy() }

func (r *rawController) start() {
	ctx, cancel := context.WithCancel(context.Background())
	r.cancel = cancel
	for range rawWorkers {
		r.wg.Go(func() {
			for {
				select {
				case <-ctx.Done():
					return
				case u := <-r.queue:
					if err := r.sync(ctx, u); err != nil && ctx.Err() == nil {
						r.mu.Lock()
						r.errs = append(r.errs, err)
						r.mu.Unlock()
					}
				}
			}
		})
	}
}

func (r *rawController) sync(ctx context.Context, parent *unstructured.Unstructured) error {
	gen, _, _ := unstructured.NestedInt64(parent.Object, "spec", "gen")
	cm := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "v1",
		"kind":       "ConfigMap",
		"metadata": map[string]any{
			"name":      parent.GetName(),
			"namespace": r.ns,
			"ownerReferences": []any{map[string]any{
				"apiVersion": parent.GetAPIVersion(),
				"kind":       parent.GetKind(),
				"name":       parent.GetName(),
				"uid":        string(parent.GetUID()),
				"controller": true,
			}},
		},
		"data": map[string]any{"gen": strconv.FormatInt(gen, 10)},
	}}
	if _, err := r.dyn.Resource(configMapGVR).Namespace(r.ns).Create(ctx, cm, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create ConfigMap %s: %w", parent.GetName(), err)
	}
	obj := parent
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		if err := unstructured.SetNestedField(obj.Object, map[string]any{"childCount": int64(1), "observedGen": gen}, "status"); err != nil {
			return err
		}
		_, err := r.dyn.Resource(benchGVR).Namespace(r.ns).UpdateStatus(ctx, obj, metav1.UpdateOptions{})
		if apierrors.IsConflict(err) {
			fresh, gerr := r.dyn.Resource(benchGVR).Namespace(r.ns).Get(ctx, parent.GetName(), metav1.GetOptions{})
			if gerr != nil {
				return gerr
			}
			obj = fresh
		}
		return err
	})
}

func (r *rawController) pid() int { return 0 }

func (r *rawController) stop() error {
	if r.cancel != nil {
		r.cancel()
	}
	r.wg.Wait()
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.errs) > 0 {
		return fmt.Errorf("raw controller: %d errors, first: %w", len(r.errs), r.errs[0])
	}
	return nil
}

// splitArgs splits a -metabus-args value on white space.
func splitArgs(s string) []string { return strings.Fields(s) }
