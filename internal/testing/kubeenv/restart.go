package kubeenv

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"path/filepath"
	"strconv"
	"syscall"
	"time"
)

// RestartAPIServer stops kube-apiserver and starts it again on the same
// port, so the kubeconfig and every client keep working once it is back;
// it returns when /readyz answers again. With kill the apiserver gets
// SIGKILL (a crash: clients see connections reset, watches break and are
// resumed or relisted), otherwise SIGTERM and after 10s SIGKILL. etcd and
// kube-controller-manager keep running. Do not call it concurrently with
// Stop.
func (e *Env) RestartAPIServer(ctx context.Context, kill bool) error {
	e.mu.Lock()
	stopped, old := e.stopped, e.apiserver
	e.mu.Unlock()
	if stopped || old == nil {
		return errors.New("restart kube-apiserver: environment is stopped")
	}
	u, err := url.Parse(e.url)
	if err != nil {
		return fmt.Errorf("restart kube-apiserver: %w", err)
	}
	port, err := strconv.Atoi(u.Port())
	if err != nil {
		return fmt.Errorf("restart kube-apiserver: port of %s: %w", e.url, err)
	}
	t := time.Now()
	if kill {
		_ = old.cmd.Process.Signal(syscall.SIGKILL)
		select {
		case <-old.done:
		case <-time.After(10 * time.Second):
			return fmt.Errorf("restart kube-apiserver: pid %d still running 10s after SIGKILL", old.pid)
		}
	} else if _, err := old.stop(stopGrace); err != nil {
		return fmt.Errorf("restart kube-apiserver: %w", err)
	}
	e.logf("kube-apiserver stopped (kill=%v) in %s", kill, since(t))

	logPath := filepath.Join(e.Dir, "apiserver.log")
	// The port was just released; a TIME_WAIT socket does not block a new
	// listener, but another process may grab it in between: retry a few
	// times before giving up (the URL cannot change).
	var last error
	for attempt := 1; attempt <= apiserverAttempts; attempt++ {
		off := fileSize(logPath)
		p, err := startProcess("kube-apiserver", filepath.Join(e.binDir, apiserverBin), e.apiserverArgs(port), logPath)
		if err != nil {
			return fmt.Errorf("restart kube-apiserver: %w", err)
		}
		e.setProc(&e.apiserver, p)
		err = waitReady(ctx, p, apiserverTimeout, e.apiserverReady)
		if err == nil {
			e.logf("kube-apiserver restarted on %s in %s", e.url, since(t))
			return nil
		}
		last = withTail(err, p)
		if !p.exited() || !logContainsAfter(logPath, off, "address already in use") {
			break
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("restart kube-apiserver: %w", ctx.Err())
		case <-time.After(time.Second):
		}
	}
	return fmt.Errorf("restart kube-apiserver: %w", last)
}
