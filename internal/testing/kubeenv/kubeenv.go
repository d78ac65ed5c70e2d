// Package kubeenv starts a throwaway local Kubernetes control plane for
// integration and end-to-end tests: a real etcd, kube-apiserver and
// kube-controller-manager running as child processes of the test.
//
// The binaries are built from Go modules by hack/kubeenv/build.sh (see
// BinDir), so no container runtime, kind cluster or network access is needed
// once they are cached. Each Env is isolated: etcd listens on a unix socket
// in the state directory, the apiserver on a free loopback port, and the
// controller manager serves no port at all, so several clusters can run in
// parallel. There are no nodes and no kubelet: Pods stay unscheduled, but
// their status can be written through the status subresource, and the
// garbage collector, namespace, serviceaccount and clusterrole-aggregation
// controllers work (the last one fills aggregated ClusterRoles such as the
// applier's production role).
//
// Children are killed by the kernel if the test process dies (Pdeathsig),
// so a crashed test cannot leak a control plane. Linux only.
package kubeenv

import (
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// Options configures Start. The zero value is usable.
type Options struct {
	// BinDir holds etcd, kube-apiserver and kube-controller-manager;
	// "" means BinDir().
	BinDir string
	// Dir is the state directory (etcd data, certificates, logs,
	// kubeconfig); "" means a new temporary directory. Stop removes it only
	// if Start created it.
	Dir string
	// CRDs are manifest files or directories (see Env.Apply) applied, and
	// their CRDs waited for until Established, BEFORE kube-controller-manager
	// starts. This matters because its garbage collector discovers new
	// resource types only every 30s: dependents of custom resources whose
	// CRD appeared later are collected up to ~45s late.
	CRDs []string
	// NoControllerManager skips kube-controller-manager: no garbage
	// collection, namespace deletion or default ServiceAccounts (Pods are
	// then rejected unless the test creates the ServiceAccount itself).
	NoControllerManager bool
	// Log receives progress lines, including how long each phase took;
	// nil discards them. t.Logf fits.
	Log func(format string, args ...any)
}

// Env is a running control plane. Stop it when done.
type Env struct {
	// Dir is the state directory; the components' logs are etcd.log,
	// apiserver.log and kcm.log in it.
	Dir string
	// Kubeconfig is the path of an admin kubeconfig (bearer token of a
	// system:masters user, server certificate verified).
	Kubeconfig string
	// Config is the admin client configuration, with QPS and Burst raised
	// far above client-go's defaults so tests are not throttled.
	Config *rest.Config

	binDir     string
	createdDir bool
	token      string
	url        string // https://127.0.0.1:<port>
	logf       func(format string, args ...any)

	mu        sync.Mutex // guards the process handles and stop state
	etcd      *process
	apiserver *process
	kcm       *process
	stopped   bool
	stopErr   error
}

const (
	// stopGrace is how long a component gets between SIGTERM and SIGKILL.
	stopGrace = 10 * time.Second
	// probeTimeout bounds each readiness request: a listener that accepts
	// but never answers must not stall startup.
	probeTimeout = 5 * time.Second
	// Per-component startup limits; generous because a loaded 2-core CI
	// machine can be several times slower than the usual ~1-3s.
	etcdTimeout      = 60 * time.Second
	apiserverTimeout = 120 * time.Second
	kcmTimeout       = 90 * time.Second
	// apiserverAttempts bounds retries when the chosen port got taken
	// between picking it and the apiserver binding it.
	apiserverAttempts = 5
	// tailLines is how much of a failing component's log goes into errors.
	tailLines = 20
	// gcReadyLine is what kube-controller-manager logs once its garbage
	// collector has synced its informers for all resource types it
	// discovered; before that, deleted owners' dependents are not collected.
	gcReadyLine = "Proceeding to collect garbage"
)

var serviceAccountGVR = schema.GroupVersionResource{Version: "v1", Resource: "serviceaccounts"}

// pickPort returns a loopback TCP port that is free right now. A variable so
// tests can hand out a taken port to exercise the retry.
var pickPort = freePort

// Start starts etcd, kube-apiserver, applies opts.CRDs and then starts
// kube-controller-manager (unless disabled), returning once all are ready:
// the apiserver answers /readyz, and the controller manager's garbage
// collector has synced and the default ServiceAccount in "default" exists.
// ctx bounds only the startup; the processes run until Stop. On failure,
// everything already started is stopped, a state directory Start created is
// removed, and the error contains the tail of the failing component's log.
func Start(ctx context.Context, opts Options) (*Env, error) {
	begin := time.Now()
	logf := opts.Log
	if logf == nil {
		logf = func(string, ...any) {}
	}

	binDir := opts.BinDir
	if binDir == "" {
		t := time.Now()
		d, err := BinDir()
		if err != nil {
			return nil, fmt.Errorf("kubeenv: %w", err)
		}
		binDir = d
		logf("kubeenv: binaries in %s (%s)", binDir, since(t))
	}
	for _, n := range []string{etcdBin, apiserverBin, kcmBin} {
		if n == kcmBin && opts.NoControllerManager {
			continue
		}
		if err := checkExecutable(filepath.Join(binDir, n)); err != nil {
			return nil, fmt.Errorf("kubeenv: %w", err)
		}
	}

	e := &Env{binDir: binDir}
	if opts.Dir == "" {
		d, err := os.MkdirTemp("", "kubeenv-")
		if err != nil {
			return nil, fmt.Errorf("kubeenv: create state dir: %w", err)
		}
		e.Dir, e.createdDir = d, true
	} else {
		d, err := filepath.Abs(opts.Dir)
		if err != nil {
			return nil, fmt.Errorf("kubeenv: state dir: %w", err)
		}
		if _, err := os.Stat(d); errors.Is(err, fs.ErrNotExist) {
			e.createdDir = true
		}
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, fmt.Errorf("kubeenv: create state dir: %w", err)
		}
		e.Dir = d
	}
	name := filepath.Base(e.Dir)
	// The prefix tells parallel clusters apart in a shared test log.
	e.logf = func(format string, args ...any) { logf("kubeenv[%s] "+format, append([]any{name}, args...)...) }

	if err := e.start(ctx, opts); err != nil {
		if stopErr := e.Stop(); stopErr != nil {
			err = errors.Join(err, fmt.Errorf("cleanup: %w", stopErr))
		}
		return nil, fmt.Errorf("kubeenv: %w", err)
	}
	e.logf("control plane ready in %s (state dir %s)", since(begin), e.Dir)
	return e, nil
}

// start runs the startup phases in order; Start cleans up if it fails.
func (e *Env) start(ctx context.Context, opts Options) error {
	if err := e.writeCredentials(); err != nil {
		return err
	}
	if err := e.startEtcd(ctx); err != nil {
		return fmt.Errorf("start etcd: %w", err)
	}
	if err := e.startAPIServer(ctx); err != nil {
		return fmt.Errorf("start kube-apiserver: %w", err)
	}
	if err := e.writeKubeconfig(); err != nil {
		return err
	}
	if len(opts.CRDs) > 0 {
		t := time.Now()
		objs, err := readManifests(opts.CRDs...)
		if err != nil {
			return fmt.Errorf("apply CRDs: %w", err)
		}
		n, err := applyObjects(ctx, e.Config, objs)
		if err != nil {
			return fmt.Errorf("apply CRDs: %w", err)
		}
		e.logf("applied %d objects from %s in %s", n, strings.Join(opts.CRDs, ", "), since(t))
	}
	if !opts.NoControllerManager {
		if err := e.startKCM(ctx); err != nil {
			return fmt.Errorf("start kube-controller-manager: %w", err)
		}
	}
	return nil
}

// writeCredentials creates the admin token file and the service-account
// signing key. The key is generated here rather than by openssl so tests
// depend on nothing but the three binaries.
func (e *Env) writeCredentials() error {
	tok := make([]byte, 16)
	if _, err := rand.Read(tok); err != nil {
		return fmt.Errorf("generate token: %w", err)
	}
	e.token = hex.EncodeToString(tok)
	// Format: token,user,uid,"group,...". system:masters bypasses RBAC.
	line := e.token + ",admin,admin,system:masters\n"
	if err := writeFile0600(filepath.Join(e.Dir, "tokens.csv"), []byte(line)); err != nil {
		return fmt.Errorf("write token file: %w", err)
	}
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return fmt.Errorf("generate service-account key: %w", err)
	}
	keyPEM := pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(key)})
	if err := writeFile0600(filepath.Join(e.Dir, "sa.key"), keyPEM); err != nil {
		return fmt.Errorf("write service-account key: %w", err)
	}
	return nil
}

// startEtcd starts etcd with its client endpoint on a unix socket (no port
// to collide with other clusters) and waits for /health.
func (e *Env) startEtcd(ctx context.Context) error {
	t := time.Now()
	sock := e.etcdSocket()
	// sun_path holds 108 bytes including the terminating NUL.
	if len(sock) > 107 {
		return fmt.Errorf("state dir %s is too long for a unix socket path; use a shorter Options.Dir", e.Dir)
	}
	// A socket left by an earlier run in the same Dir would make etcd fail to listen.
	if err := os.Remove(sock); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("remove stale socket: %w", err)
	}
	args := []string{
		"--name=default",
		"--data-dir=" + filepath.Join(e.Dir, "etcd-data"),
		"--listen-peer-urls=http://127.0.0.1:0",
		"--listen-client-urls=unix://" + sock,
		// Required alongside listen-client-urls but never dialled: the
		// apiserver is given the socket directly.
		"--advertise-client-urls=http://127.0.0.111:0",
		// Test data is disposable; fsync dominates etcd latency on slow disks.
		"--unsafe-no-fsync",
		"--log-level=warn",
		"--quota-backend-bytes=" + strconv.FormatInt(4<<30, 10),
	}
	p, err := startProcess("etcd", filepath.Join(e.binDir, etcdBin), args, filepath.Join(e.Dir, "etcd.log"))
	if err != nil {
		return err
	}
	e.setProc(&e.etcd, p)

	client := &http.Client{
		Timeout: probeTimeout,
		Transport: &http.Transport{
			DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
				var d net.Dialer
				return d.DialContext(ctx, "unix", sock)
			},
		},
	}
	defer client.CloseIdleConnections()
	err = waitReady(ctx, p, etcdTimeout, func(ctx context.Context) error {
		body, err := httpGet(ctx, client, "http://etcd/health", "")
		if err != nil {
			return err
		}
		if !strings.Contains(strings.ReplaceAll(body, " ", ""), `"health":"true"`) {
			return fmt.Errorf("unhealthy: %s", strings.TrimSpace(body))
		}
		return nil
	})
	if err != nil {
		return withTail(err, p)
	}
	e.logf("etcd ready in %s", since(t))
	return nil
}

func (e *Env) etcdSocket() string { return filepath.Join(e.Dir, "etcd.sock") }

// startAPIServer starts kube-apiserver on a free loopback port and waits for
// /readyz, retrying with another port if the chosen one was taken meanwhile.
func (e *Env) startAPIServer(ctx context.Context) error {
	t := time.Now()
	logPath := filepath.Join(e.Dir, "apiserver.log")
	for attempt := 1; ; attempt++ {
		port, err := pickPort()
		if err != nil {
			return fmt.Errorf("pick port: %w", err)
		}
		off := fileSize(logPath)
		p, err := startProcess("kube-apiserver", filepath.Join(e.binDir, apiserverBin), e.apiserverArgs(port), logPath)
		if err != nil {
			return err
		}
		e.setProc(&e.apiserver, p)
		e.url = "https://127.0.0.1:" + strconv.Itoa(port)
		err = waitReady(ctx, p, apiserverTimeout, e.apiserverReady)
		if err == nil {
			e.logf("kube-apiserver ready on %s in %s", e.url, since(t))
			return nil
		}
		if p.exited() && attempt < apiserverAttempts && logContainsAfter(logPath, off, "address already in use") {
			e.logf("port %d was taken, retrying kube-apiserver on another port (attempt %d)", port, attempt+1)
			continue
		}
		return withTail(err, p)
	}
}

func (e *Env) apiserverArgs(port int) []string {
	return []string{
		"--etcd-servers=unix://" + e.etcdSocket(),
		"--bind-address=127.0.0.1",
		"--advertise-address=127.0.0.1",
		// The default reconciler rejects a loopback advertise address for
		// the kubernetes Endpoints and logs errors forever.
		"--endpoint-reconciler-type=none",
		"--secure-port=" + strconv.Itoa(port),
		// Self-signed serving certificate; apiserver.crt holds leaf and CA.
		"--cert-dir=" + filepath.Join(e.Dir, "certs"),
		"--token-auth-file=" + filepath.Join(e.Dir, "tokens.csv"),
		"--authorization-mode=RBAC",
		"--service-cluster-ip-range=10.0.0.0/24",
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file=" + filepath.Join(e.Dir, "sa.key"),
		"--service-account-signing-key-file=" + filepath.Join(e.Dir, "sa.key"),
	}
}

// caFile is the apiserver's generated serving certificate, which is followed
// by its self-signed CA, so it doubles as the trust bundle.
func (e *Env) caFile() string { return filepath.Join(e.Dir, "certs", "apiserver.crt") }

// apiserverReady probes /readyz with the admin token over verified TLS.
func (e *Env) apiserverReady(ctx context.Context) error {
	// Re-read each time: the file appears only once the apiserver created it.
	caPEM, err := os.ReadFile(e.caFile())
	if err != nil {
		return err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		return fmt.Errorf("no certificates in %s yet", e.caFile())
	}
	client := &http.Client{
		Timeout:   probeTimeout,
		Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}},
	}
	defer client.CloseIdleConnections()
	body, err := httpGet(ctx, client, e.url+"/readyz", e.token)
	if err != nil {
		return err
	}
	if strings.TrimSpace(body) != "ok" {
		return fmt.Errorf("/readyz: %s", strings.TrimSpace(body))
	}
	return nil
}

// writeKubeconfig writes Dir/kubeconfig and builds Config from it, so tests
// and out-of-process tools (kubectl, the project's binaries) use the same
// credentials.
func (e *Env) writeKubeconfig() error {
	caPEM, err := os.ReadFile(e.caFile())
	if err != nil {
		return fmt.Errorf("read apiserver CA: %w", err)
	}
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["kubeenv"] = &clientcmdapi.Cluster{Server: e.url, CertificateAuthorityData: caPEM}
	cfg.AuthInfos["admin"] = &clientcmdapi.AuthInfo{Token: e.token}
	cfg.Contexts["kubeenv"] = &clientcmdapi.Context{Cluster: "kubeenv", AuthInfo: "admin", Namespace: metav1.NamespaceDefault}
	cfg.CurrentContext = "kubeenv"
	data, err := clientcmd.Write(*cfg)
	if err != nil {
		return fmt.Errorf("encode kubeconfig: %w", err)
	}
	path := filepath.Join(e.Dir, "kubeconfig")
	if err := writeFile0600(path, data); err != nil {
		return fmt.Errorf("write kubeconfig: %w", err)
	}
	rc, err := clientcmd.RESTConfigFromKubeConfig(data)
	if err != nil {
		return fmt.Errorf("load kubeconfig: %w", err)
	}
	// client-go's default 5 QPS / 10 burst would make tests wait on the
	// client-side rate limiter instead of the server.
	rc.QPS, rc.Burst = 200, 400
	e.Kubeconfig, e.Config = path, rc
	return nil
}

// startKCM starts kube-controller-manager and waits until its garbage
// collector runs and the serviceaccount controller has created
// default/default.
func (e *Env) startKCM(ctx context.Context) error {
	t := time.Now()
	logPath := filepath.Join(e.Dir, "kcm.log")
	// Restarts append to kcm.log; readiness only counts this run's lines.
	off := fileSize(logPath)
	args := []string{
		"--kubeconfig=" + e.Kubeconfig,
		"--controllers=garbagecollector,namespace,serviceaccount,clusterrole-aggregation",
		// One instance per cluster: leader election would only add a lease
		// round trip to startup.
		"--leader-elect=false",
		"--use-service-account-credentials=false",
		// No serving port, so parallel clusters cannot collide.
		"--secure-port=0",
	}
	p, err := startProcess("kube-controller-manager", filepath.Join(e.binDir, kcmBin), args, logPath)
	if err != nil {
		return err
	}
	e.setProc(&e.kcm, p)
	dyn, err := dynamic.NewForConfig(e.Config)
	if err != nil {
		return fmt.Errorf("dynamic client: %w", err)
	}
	err = waitReady(ctx, p, kcmTimeout, func(ctx context.Context) error {
		if !logContainsAfter(logPath, off, gcReadyLine) {
			return fmt.Errorf("garbage collector not running yet (no %q in %s)", gcReadyLine, logPath)
		}
		_, err := dyn.Resource(serviceAccountGVR).Namespace(metav1.NamespaceDefault).Get(ctx, "default", metav1.GetOptions{})
		return err
	})
	if err != nil {
		return withTail(err, p)
	}
	e.logf("kube-controller-manager ready in %s", since(t))
	return nil
}

// RestartControllerManager stops kube-controller-manager (if running) and
// starts it again, waiting until its garbage collector has synced. Use it
// after installing CRDs on a running Env: the garbage collector otherwise
// notices new types only within 30s. It also starts a controller manager on
// an Env started with NoControllerManager. Do not call it concurrently with
// Stop.
func (e *Env) RestartControllerManager(ctx context.Context) error {
	e.mu.Lock()
	stopped, old := e.stopped, e.kcm
	e.mu.Unlock()
	if stopped {
		return errors.New("restart kube-controller-manager: environment is stopped")
	}
	if old != nil {
		t := time.Now()
		killed, err := old.stop(stopGrace)
		if err != nil {
			return fmt.Errorf("restart kube-controller-manager: %w", err)
		}
		if killed {
			e.logf("kube-controller-manager ignored SIGTERM for %s and was killed", stopGrace)
		}
		e.logf("kube-controller-manager stopped in %s", since(t))
	}
	if err := e.startKCM(ctx); err != nil {
		return fmt.Errorf("restart kube-controller-manager: %w", err)
	}
	return nil
}

// WaitForDefaultServiceAccount waits until namespace ns has the "default"
// ServiceAccount, which the serviceaccount controller creates shortly after
// the namespace: until then the apiserver rejects Pods in ns. Without a
// deadline on ctx it gives up after 60s.
func (e *Env) WaitForDefaultServiceAccount(ctx context.Context, ns string) error {
	e.mu.Lock()
	kcm := e.kcm
	e.mu.Unlock()
	if kcm == nil {
		return fmt.Errorf("wait for ServiceAccount %s/default: no kube-controller-manager is running to create it", ns)
	}
	dyn, err := dynamic.NewForConfig(e.Config)
	if err != nil {
		return fmt.Errorf("wait for ServiceAccount %s/default: %w", ns, err)
	}
	timeout := 60 * time.Second
	if dl, ok := ctx.Deadline(); ok {
		timeout = time.Until(dl)
	}
	err = poll(ctx, timeout, 50*time.Millisecond, func(ctx context.Context) error {
		if kcm.exited() {
			return fmt.Errorf("kube-controller-manager exited (%s)", kcm.exitStatus())
		}
		_, err := dyn.Resource(serviceAccountGVR).Namespace(ns).Get(ctx, "default", metav1.GetOptions{})
		return err
	})
	if err != nil {
		return fmt.Errorf("wait for ServiceAccount %s/default: %w", ns, err)
	}
	return nil
}

// Stop stops kube-controller-manager, then kube-apiserver, then etcd: the
// apiserver does not exit on SIGTERM while it keeps retrying a vanished
// etcd. Each gets SIGTERM and, after 10s, SIGKILL. Stop then removes Dir if
// Start created it. It is safe to call more than once; later calls return
// the first call's result.
func (e *Env) Stop() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.stopped {
		return e.stopErr
	}
	e.stopped = true
	t := time.Now()
	var errs []error
	for _, p := range []*process{e.kcm, e.apiserver, e.etcd} {
		if p == nil {
			continue
		}
		killed, err := p.stop(stopGrace)
		if err != nil {
			errs = append(errs, err)
		}
		if killed {
			e.logf("%s ignored SIGTERM for %s and was killed", p.name, stopGrace)
		}
	}
	// Keep the directory if a process may still be using it: deleting an
	// open etcd data dir would hide the failure rather than fix it.
	if len(errs) == 0 && e.createdDir {
		if err := os.RemoveAll(e.Dir); err != nil {
			errs = append(errs, fmt.Errorf("remove state dir: %w", err))
		}
	}
	e.stopErr = errors.Join(errs...)
	if e.stopErr != nil {
		e.stopErr = fmt.Errorf("kubeenv: stop: %w", e.stopErr)
	}
	e.logf("stopped in %s", since(t))
	return e.stopErr
}

// setProc records a started process under the lock Stop takes.
func (e *Env) setProc(slot **process, p *process) {
	e.mu.Lock()
	defer e.mu.Unlock()
	*slot = p
}

// PIDs returns the process IDs of the components started for this Env,
// keyed by name ("etcd", "kube-apiserver", "kube-controller-manager"),
// including ones that already exited, so a caller can read their CPU time
// and memory from /proc.
func (e *Env) PIDs() map[string]int { return e.pids() }

// pids returns the PIDs of the processes started for this Env (including
// ones that already exited), for tests.
func (e *Env) pids() map[string]int {
	e.mu.Lock()
	defer e.mu.Unlock()
	m := map[string]int{}
	for _, p := range []*process{e.etcd, e.apiserver, e.kcm} {
		if p != nil {
			m[p.name] = p.pid
		}
	}
	return m
}

// waitReady polls probe every 100ms until it succeeds, the process exits,
// timeout passes or ctx ends. Each probe gets at most probeTimeout.
func waitReady(ctx context.Context, p *process, timeout time.Duration, probe func(context.Context) error) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		pctx, pcancel := context.WithTimeout(ctx, probeTimeout)
		err := probe(pctx)
		pcancel()
		if err == nil {
			return nil
		}
		select {
		case <-p.done:
			return fmt.Errorf("%s exited during startup (%s)", p.name, p.exitStatus())
		case <-ctx.Done():
			return fmt.Errorf("%s not ready: %w (last probe: %v)", p.name, ctx.Err(), err)
		case <-tick.C:
		}
	}
}

// withTail appends the end of p's log to err.
func withTail(err error, p *process) error {
	return fmt.Errorf("%w\n--- last %d lines of %s:\n%s", err, tailLines, p.logPath, p.logTail(tailLines))
}

// httpGet fetches url (with a bearer token if token != "") and returns the
// body of a 200 response.
func httpGet(ctx context.Context, client *http.Client, url, token string) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return "", err
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := client.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	// Readiness bodies are tiny; the limit only guards against a foreign
	// listener streaming garbage.
	body, err := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if err != nil {
		return "", fmt.Errorf("GET %s: %w", url, err)
	}
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("GET %s: %s: %s", url, resp.Status, strings.TrimSpace(string(body)))
	}
	return string(body), nil
}

// freePort asks the kernel for a free loopback port. Another process can
// take it before the apiserver binds it; startAPIServer retries then.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	port := l.Addr().(*net.TCPAddr).Port
	if err := l.Close(); err != nil {
		return 0, err
	}
	return port, nil
}

// writeFile0600 writes a secret file readable only by the owner, also
// tightening the mode of a file left by an earlier run.
func writeFile0600(path string, data []byte) error {
	if err := os.WriteFile(path, data, 0o600); err != nil {
		return err
	}
	return os.Chmod(path, 0o600)
}

// since formats the time elapsed since t for log lines.
func since(t time.Time) string {
	return time.Since(t).Round(10 * time.Millisecond).String()
}
