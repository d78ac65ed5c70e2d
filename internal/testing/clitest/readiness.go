package clitest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/spf13/cobra"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/metabus/metabus/internal/testing/kubeenv"
	"github.com/metabus/metabus/internal/testing/testnats"
	"github.com/metabus/metabus/pkg/bus"
	"github.com/metabus/metabus/pkg/cli"
	"github.com/metabus/metabus/pkg/jsbus"
	"github.com/metabus/metabus/pkg/natsx"
)

// Readiness describes one binary for CheckReadiness.
type Readiness struct {
	// New builds the binary's command.
	New func() *cobra.Command
	// Args are its own flags, besides the connection and probe flags.
	Args []string
	// EnsureStreams makes the test create the streams and consumers as the
	// watcher would, for stages that wait for them.
	EnsureStreams bool
}

// wait bounds every eventual condition: generous, since the machine may be
// loaded; nothing is asserted on how fast.
const wait = 90 * time.Second

// CheckReadiness runs the binary in this process, started while the API
// server is unreachable (its kubeconfig points at a closed port) and NATS
// does not exist yet, and checks /readyz along the way (issues #23, #25):
// not ready, and still running, while either is missing; ready once both
// are there; not ready again while the API server is cut off or NATS is
// lost, and ready again when they are back. It needs a real kube-apiserver
// (internal/testing/kubeenv) and runs a real nats-server in process.
func CheckReadiness(t *testing.T, r Readiness) {
	if testing.Short() {
		t.Skip("starts a real kube-apiserver and nats-server")
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	env, err := kubeenv.Start(ctx, kubeenv.Options{NoControllerManager: true, CRDs: []string{repoPath(t, "deploy/crds")}, Log: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Stop() })

	api := newProxy(t, strings.TrimPrefix(env.Config.Host, "https://"))
	kubeconfig := proxiedKubeconfig(t, env.Kubeconfig, api.addr)
	nats := &natsServer{port: freePort(t), dir: t.TempDir()}
	t.Cleanup(nats.stop)
	health := fmt.Sprintf("127.0.0.1:%d", freePort(t))

	args := append([]string{
		"--kubeconfig=" + kubeconfig, fmt.Sprintf("--nats-url=nats://127.0.0.1:%d", nats.port),
		"--metrics-address=0", "--health-probe-bind-address=" + health, "--zap-log-level=error",
	}, r.Args...)
	cmd := r.New()
	done := make(chan int, 1)
	var stderr syncBuffer
	go func() { done <- cli.Run(ctx, cmd, args, io.Discard, &stderr) }()
	running := func() {
		t.Helper()
		select {
		case code := <-done:
			t.Fatalf("%s exited with %d; stderr:\n%s", cmd.Name(), code, stderr.String())
		default:
		}
	}
	// expect waits for /readyz to answer ready (or not), its body naming
	// every one of mentions and none of absent.
	expect := func(what string, ready bool, mentions []string, absent ...string) {
		t.Helper()
		deadline := time.Now().Add(wait)
		var code int
		var body string
		for time.Now().Before(deadline) {
			running()
			code, body = get("http://" + health + "/readyz")
			ok := (code == http.StatusOK) == ready && code != 0
			for _, m := range mentions {
				ok = ok && strings.Contains(body, m)
			}
			for _, m := range absent {
				ok = ok && !strings.Contains(body, m)
			}
			if ok {
				t.Logf("%s: /readyz %d %q", what, code, body)
				return
			}
			time.Sleep(100 * time.Millisecond)
		}
		t.Fatalf("%s: /readyz %d %q, want ready=%v mentioning %q", what, code, body, ready, mentions)
	}

	const natsDown, apiDown = "NATS", "kubernetes: API server"
	expect("NATS down, API server unreachable", false, []string{natsDown, apiDown})
	// The service keeps waiting: several NATS dials and API probes fail.
	time.Sleep(4 * time.Second)
	expect("still waiting", false, []string{natsDown, apiDown})

	nats.start(t)
	if r.EnsureStreams {
		ensureStreams(ctx, t, nats.url())
	}
	expect("NATS up, API server unreachable", false, []string{apiDown}, natsDown)

	api.open(t)
	expect("NATS and API server up", true, nil)

	api.close()
	expect("API server cut off", false, []string{apiDown})
	api.open(t)
	expect("API server back", true, nil)

	nats.stop()
	expect("NATS lost", false, []string{natsDown})
	nats.start(t)
	if r.EnsureStreams {
		// A restarted server has lost the partition consumers, which
		// live in memory; the watcher recreates them.
		ensureStreams(ctx, t, nats.url())
	}
	expect("NATS back", true, nil)

	cancel()
	select {
	case code := <-done:
		if code != cli.ExitOK {
			t.Errorf("%s exited with %d after its context ended; stderr:\n%s", cmd.Name(), code, stderr.String())
		}
	case <-time.After(wait):
		t.Errorf("%s did not stop", cmd.Name())
	}
}

func get(url string) (int, string) {
	c := http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get(url)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(data)
}

// ensureStreams does what the watcher does at start.
func ensureStreams(ctx context.Context, t *testing.T, url string) {
	t.Helper()
	nc, js, err := natsx.Connect(natsx.ConnOptions{URL: url, Name: "clitest"})
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	if err := jsbus.Ensure(ctx, js, bus.Options{}); err != nil {
		t.Fatalf("ensure streams: %v", err)
	}
}

// natsServer is a JetStream server on a fixed port and store, so that it
// can be stopped and started again where the services expect it.
type natsServer struct {
	port int
	dir  string
	mu   sync.Mutex
	s    *server.Server
}

func (n *natsServer) url() string { return fmt.Sprintf("nats://127.0.0.1:%d", n.port) }

func (n *natsServer) start(t *testing.T) {
	t.Helper()
	s, err := server.NewServer(&server.Options{
		Host: "127.0.0.1", Port: n.port, JetStream: true, StoreDir: n.dir,
		MaxPayload: bus.MaxPayload, NoLog: true, NoSigs: true,
	})
	if err != nil {
		t.Fatal(err)
	}
	go s.Start()
	if !s.ReadyForConnections(30 * time.Second) {
		s.Shutdown()
		// The server logs nothing here; say whether it is the port.
		if ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", n.port)); err != nil {
			t.Fatalf("nats-server did not start: port %d: %v", n.port, err)
		} else {
			_ = ln.Close()
		}
		t.Fatalf("nats-server did not start on port %d within 30s", n.port)
	}
	n.mu.Lock()
	n.s = s
	n.mu.Unlock()
}

func (n *natsServer) stop() {
	n.mu.Lock()
	s := n.s
	n.s = nil
	n.mu.Unlock()
	if s != nil {
		s.Shutdown()
		s.WaitForShutdown()
	}
}

// proxy forwards TCP connections from a loopback port to target while
// open; closed, the port refuses connections and the open ones are cut, as
// when the API server is unreachable.
type proxy struct {
	addr, target string
	mu           sync.Mutex
	ln           net.Listener
	conns        map[net.Conn]struct{}
}

func newProxy(t *testing.T, target string) *proxy {
	p := &proxy{addr: fmt.Sprintf("127.0.0.1:%d", freePort(t)), target: target, conns: map[net.Conn]struct{}{}}
	t.Cleanup(p.close)
	return p
}

func (p *proxy) open(t *testing.T) {
	t.Helper()
	ln, err := net.Listen("tcp", p.addr)
	if err != nil {
		t.Fatal(err)
	}
	p.mu.Lock()
	p.ln = ln
	p.mu.Unlock()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go p.forward(c)
		}
	}()
}

func (p *proxy) forward(c net.Conn) {
	u, err := net.Dial("tcp", p.target)
	if err != nil {
		c.Close()
		return
	}
	p.mu.Lock()
	if p.ln == nil {
		p.mu.Unlock()
		c.Close()
		u.Close()
		return
	}
	p.conns[c], p.conns[u] = struct{}{}, struct{}{}
	p.mu.Unlock()
	go func() { _, _ = io.Copy(u, c); u.Close() }()
	_, _ = io.Copy(c, u)
	c.Close()
}

func (p *proxy) close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ln != nil {
		p.ln.Close()
		p.ln = nil
	}
	for c := range p.conns {
		c.Close()
		delete(p.conns, c)
	}
}

// proxiedKubeconfig is the kubeconfig at path with its server moved to
// addr (the API server's certificate is for 127.0.0.1, so TLS still
// verifies).
func proxiedKubeconfig(t *testing.T, path, addr string) string {
	t.Helper()
	cfg, err := clientcmd.LoadFromFile(path)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range cfg.Clusters {
		c.Server = "https://" + addr
	}
	out := filepath.Join(t.TempDir(), "kubeconfig")
	if err := clientcmd.WriteToFile(*cfg, out); err != nil {
		t.Fatal(err)
	}
	return out
}

// freePort is a port this test binds later, and again after closing it:
// the NATS server's, the API proxy's, the probe's. It comes from
// testnats.FreePort, below the kernel's ephemeral range, because a port
// of that range freed here may be handed to any outgoing connection of
// the tests running alongside before it is bound again (a CI run's NATS
// server could not start that way).
func freePort(t *testing.T) int {
	t.Helper()
	port, err := testnats.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	return port
}

// repoPath is rel in the repository holding the working directory.
func repoPath(t *testing.T, rel string) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return filepath.Join(dir, filepath.FromSlash(rel))
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal(errors.New("no go.mod above the working directory"))
		}
		dir = parent
	}
}

// syncBuffer is a bytes.Buffer safe for the service's goroutine and the
// test's.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
