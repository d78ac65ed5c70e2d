// Package childproc runs a controller as a child process of a harness or a
// test (upstream Metacontroller, a metabus binary): started with its output
// in a log file, waited for until its readiness URL answers, stopped with
// SIGTERM and, if it ignores that, SIGKILL. A child never outlives the
// process that started it.
package childproc

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"syscall"
	"time"
)

// Proc is a controller running as a child process.
type Proc struct {
	name    string
	logPath string
	cmd     *exec.Cmd
	done    chan struct{}
	waitErr error
	// MetricsURL, if set, is scraped into <log without .log>.metrics just
	// before Stop signals the process, so a run can be explained
	// afterwards (syncs by result, echoes...).
	MetricsURL string
}

// readyTimeout bounds how long Start waits for the readiness URL: a
// controller's start-up includes its first discovery and informer syncs,
// which take seconds on a loaded machine.
const readyTimeout = 2 * time.Minute

// Start starts path with args (and env added to this process's
// environment), its stdout and stderr appended to logPath, and waits until
// GET readyURL answers 200. The child is killed by the kernel if this
// process dies (Pdeathsig), so a crashed run leaves no controller behind.
func Start(ctx context.Context, name, path string, args, env []string, logPath, readyURL string) (*Proc, error) {
	logFile, err := os.OpenFile(logPath, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("log of %s: %w", name, err)
	}
	cmd := exec.Command(path, args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
	p := &Proc{name: name, logPath: logPath, cmd: cmd, done: make(chan struct{})}
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
	if err := p.waitReady(ctx, readyURL, readyTimeout); err != nil {
		_ = p.Stop()
		return nil, fmt.Errorf("%s: %w (log: %s)", name, err, logPath)
	}
	return p, nil
}

func (p *Proc) waitReady(ctx context.Context, url string, timeout time.Duration) error {
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

// PID is the child's process id.
func (p *Proc) PID() int { return p.cmd.Process.Pid }

// LogPath is the file holding the child's output.
func (p *Proc) LogPath() string { return p.logPath }

// Exited reports whether the child has exited, and how.
func (p *Proc) Exited() (bool, error) {
	select {
	case <-p.done:
		return true, p.waitErr
	default:
		return false, nil
	}
}

// Stop saves the final metrics (if MetricsURL is set), sends SIGTERM and,
// after 15s, SIGKILL. It returns an error only when the child had to be
// killed; stopping a child that has already exited does nothing.
func (p *Proc) Stop() error {
	if done, _ := p.Exited(); done {
		return nil
	}
	if p.MetricsURL != "" {
		client := &http.Client{Timeout: 5 * time.Second}
		if resp, err := client.Get(p.MetricsURL); err == nil {
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

// FreeAddr returns 127.0.0.1:<a port free right now>.
func FreeAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", fmt.Errorf("find a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().String(), nil
}

// StartUpstream runs upstream Metacontroller's binary bin against the
// cluster of kubeconfig (which it reads from $KUBECONFIG:
// controller-runtime's GetConfig), with its metrics and health probes on
// free loopback ports, pprof off, and args added (e.g. --workers,
// --target-label-selector, --apply-strategy). It returns once upstream's
// /readyz answers.
func StartUpstream(ctx context.Context, bin, kubeconfig, logPath string, args []string) (*Proc, error) {
	metrics, err := FreeAddr()
	if err != nil {
		return nil, err
	}
	health, err := FreeAddr()
	if err != nil {
		return nil, err
	}
	all := append([]string{
		"--metrics-address=" + metrics,
		"--health-probe-bind-address=" + health,
		"--pprof-address=0",
	}, args...)
	return Start(ctx, "upstream", bin, all, []string{"KUBECONFIG=" + kubeconfig}, logPath, "http://"+health+"/readyz")
}
