package e2e

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/watch"

	"github.com/metabus/metabus/pkg/bus"
	"github.com/metabus/metabus/pkg/embeddednats"
	"github.com/metabus/metabus/pkg/jsbus"
	"github.com/metabus/metabus/pkg/natsx"
)

// svcProcess is one metabus binary run as its own process, which the test can
// SIGKILL and start again.
type svcProcess struct {
	t    *testing.T
	name string
	path string
	args []string
	log  *os.File
	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{}
}

func newService(t *testing.T, bin, logs, name string, args []string) *svcProcess {
	t.Helper()
	logf, err := os.Create(filepath.Join(logs, name+".log"))
	if err != nil {
		t.Fatal(err)
	}
	s := &svcProcess{t: t, name: name, path: filepath.Join(bin, name), args: args, log: logf}
	if err := s.start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		s.stop()
		_ = logf.Close()
		if t.Failed() {
			data, _ := os.ReadFile(logf.Name())
			t.Logf("--- %s log:\n%s", name, tail(string(data), 60))
		}
	})
	return s
}

func (s *svcProcess) start() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	cmd := exec.Command(s.path, s.args...)
	cmd.Stdout, cmd.Stderr = s.log, s.log
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start %s: %w", s.name, err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	s.cmd, s.done = cmd, done
	return nil
}

// kill SIGKILLs the process and waits for it to be gone.
func (s *svcProcess) kill() {
	s.mu.Lock()
	defer s.mu.Unlock()
	_ = s.cmd.Process.Signal(syscall.SIGKILL)
	<-s.done
	fmt.Fprintf(s.log, "=== e2e: SIGKILLed %s (pid %d)\n", s.name, s.cmd.Process.Pid)
}

func (s *svcProcess) stop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.done:
	case <-time.After(20 * time.Second):
		_ = s.cmd.Process.Kill()
		<-s.done
		s.t.Errorf("%s did not stop on SIGTERM", s.name)
	}
}

// TestRollingSurvivesSIGKILL runs every stage as its own process and
// SIGKILLs the applier and the revisions service again and again in the
// middle of a rollout: right after each Pod deletion the rollout makes, and
// once at a random small delay after a Pod turns Ready (when the next move
// is being decided and recorded). The move is recorded in the
// ControllerRevision before the Pod is touched, so the rollout must still
// complete in order with no Pod updated twice and none skipped.
func TestRollingSurvivesSIGKILL(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the service binaries")
	}
	// Most of its minute is waiting for a desired state a killed applier
	// held to come back after its AckWait.
	waitsInParallel(t)
	ctx := context.Background()
	bin := serviceBinaries(t)

	srv, err := embeddednats.Start(embeddednats.Options{StoreDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Shutdown(); srv.WaitForShutdown() })
	// The test creates the streams itself, with a short desired-state
	// AckWait: a desired state a killed applier held is redelivered after
	// 6s instead of 30s. (The watcher is told not to reset them.)
	nc, js, err := natsx.Connect(natsx.ConnOptions{URL: srv.ClientURL(), Name: "e2e"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	if err := jsbus.Ensure(ctx, js, bus.Options{DesiredAckWait: 6 * time.Second}); err != nil {
		t.Fatal(err)
	}

	ns := newNamespace(t)
	h := recordPods(t, ns)
	const label = "rolling-sigkill"
	common := []string{
		"--nats-url=" + srv.ClientURL(),
		"--metrics-address=0", "--health-probe-bind-address=0", "--zap-log-level=info",
	}
	logs := t.TempDir()
	run := func(name string, args ...string) *svcProcess {
		// Each under its production RBAC, as deployed.
		kc := "--kubeconfig=" + serviceKubeconfig(t, name)
		return newService(t, bin, logs, name, append(append([]string{kc}, common...), args...))
	}
	run("watcher", "--target-label-selector=metabus.dev/e2e="+label, "--discovery-interval=5s", "--ensure-streams=false")
	run("dispatcher")
	revisions := run("revisions")
	applier := run("applier", "--discovery-interval=5s", "--snapshot-wait=2s")

	// The killer: SIGKILL the applier and the revisions service, then
	// start them again, once per trigger.
	const name = "crashy"
	names := podNames(name, 4)
	var (
		killMu sync.Mutex
		closed bool
		kills  []string
	)
	killc := make(chan string, 16)
	trigger := func(why string) {
		killMu.Lock()
		defer killMu.Unlock()
		if closed || len(kills)+len(killc) >= 8 {
			return
		}
		select {
		case killc <- why:
		default:
		}
	}
	killerDone := make(chan struct{})
	go func() {
		defer close(killerDone)
		for why := range killc {
			at := time.Since(h.start)
			applier.kill()
			revisions.kill()
			h.mark("SIGKILL "+why, rollImage(2))
			killMu.Lock()
			kills = append(kills, fmt.Sprintf("%.3fs %s", at.Seconds(), why))
			killMu.Unlock()
			if err := revisions.start(); err != nil {
				t.Error(err)
			}
			if err := applier.start(); err != nil {
				t.Error(err)
			}
		}
	}()
	t.Cleanup(func() {
		killMu.Lock()
		closed = true
		close(killc)
		killMu.Unlock()
		<-killerDone
	})

	rolling := false
	var rollingMu sync.Mutex
	h.subscribe(func(ev podEvent) {
		rollingMu.Lock()
		on := rolling
		rollingMu.Unlock()
		if on && ev.Type == watch.Deleted && ev.Image == rollImage(1) {
			trigger("after deleting " + ev.Name)
		}
	})
	randomAfter := names[1]
	autoReady(t, h, ns, 200*time.Millisecond, func(pod, image string) {
		if pod == randomAfter && image == rollImage(2) {
			// The next move follows within ~50-100ms.
			time.Sleep(time.Duration(rand.IntN(80)) * time.Millisecond)
			trigger(fmt.Sprintf("at random after %s turned Ready", pod))
		}
	})

	url := hookServer(t, jsonHook(rollsetHook))
	rollsetController(t, &instance{selector: label}, "rollsets-sigkill", url, "RollingRecreate")
	createRollSet(t, ns, name, int64(len(names)), 1)
	eventually(t, 60*time.Second, "the first Pods Ready", wantRolledOut(ns, name, int64(len(names))))

	rollingMu.Lock()
	rolling = true
	rollingMu.Unlock()
	h.mark("template v2", rollImage(2))
	setRollImage(t, ns, name, 2)
	start := time.Now()
	eventually(t, 120*time.Second, "the rollout to complete despite the crashes", wantRolledOut(ns, name, int64(len(names))))
	killMu.Lock()
	t.Logf("rollout completed in %s with %d crashes: %v", time.Since(start).Round(time.Millisecond), len(kills), kills)
	nkills := len(kills)
	killMu.Unlock()
	checkOneRevision(t, ns, name, names)

	checkRolledOnce(t, h.events(), names)
	if nkills < len(names) {
		t.Errorf("only %d crashes were injected; the test did not exercise what it claims", nkills)
	}
	if st, err := js.Stream(ctx, bus.DLQStream); err == nil {
		if info, err := st.Info(ctx); err == nil && info.State.Msgs != 0 {
			t.Errorf("%d messages were dead-lettered", info.State.Msgs)
		}
	}
}
