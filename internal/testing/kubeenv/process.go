package kubeenv

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"syscall"
	"time"
)

// process is one control-plane binary started by this package.
type process struct {
	name    string // component name used in messages ("etcd", "kube-apiserver", ...)
	logPath string
	pid     int
	cmd     *exec.Cmd
	done    chan struct{} // closed once the process has exited and been reaped
	waitErr error         // how it exited; only read after done is closed
}

// startProcess starts path with args, stdin on /dev/null and stdout+stderr
// appended to logPath. The child gets SIGKILL when this process dies, so a
// crashed or killed test run never leaves a control plane behind.
func startProcess(name, path string, args []string, logPath string) (*process, error) {
	logFile, err := os.OpenFile(logPath, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("open log of %s: %w", name, err)
	}
	cmd := exec.Command(path, args...)
	cmd.Stdin = nil // os/exec connects a nil Stdin to /dev/null
	cmd.Stdout = logFile
	cmd.Stderr = logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{
		// Pdeathsig: the kernel kills the child when its parent goes away,
		// even if the parent is SIGKILLed and never runs a cleanup.
		Pdeathsig: syscall.SIGKILL,
		// Own process group: a Ctrl-C on the terminal then reaches only the
		// test process; the children die through Pdeathsig instead of all
		// shutting down at once in an arbitrary order (the apiserver hangs
		// if etcd goes first).
		Setpgid: true,
	}
	p := &process{name: name, logPath: logPath, cmd: cmd, done: make(chan struct{})}
	started := make(chan error, 1)
	go p.run(logFile, started)
	if err := <-started; err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	return p, nil
}

// run forks the child and then waits for it, on one locked OS thread.
//
// Linux delivers Pdeathsig when the *thread* that forked the child exits,
// not when the process does. The Go runtime ends a thread whenever a
// goroutine that locked it returns, and any thread we merely happen to run
// on could later be locked by such a goroutine. So the fork happens on a
// thread this goroutine locks and keeps (blocked in Wait) for exactly as
// long as the child lives.
func (p *process) run(logFile *os.File, started chan<- error) {
	runtime.LockOSThread()
	// Deliberately never unlocked: when this goroutine returns, the runtime
	// throws the thread away, which is harmless because the child is gone.
	defer logFile.Close()
	if err := p.cmd.Start(); err != nil {
		started <- err
		return
	}
	p.pid = p.cmd.Process.Pid
	started <- nil
	p.waitErr = p.cmd.Wait()
	close(p.done)
}

// exited reports whether the process has terminated.
func (p *process) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// exitStatus describes how the process ended, e.g. "exit status 1".
// Only meaningful once exited() is true.
func (p *process) exitStatus() string {
	if p.waitErr == nil {
		return "exit status 0"
	}
	return p.waitErr.Error()
}

// stop sends SIGTERM, waits up to grace, then SIGKILLs. killed reports
// whether SIGKILL was needed.
func (p *process) stop(grace time.Duration) (killed bool, err error) {
	if p.exited() {
		return false, nil
	}
	// An error here means the process already exited; done will be closed.
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	timer := time.NewTimer(grace)
	defer timer.Stop()
	select {
	case <-p.done:
		return false, nil
	case <-timer.C:
	}
	if err := p.cmd.Process.Kill(); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return true, fmt.Errorf("kill %s (pid %d): %w", p.name, p.pid, err)
	}
	select {
	case <-p.done:
		return true, nil
	case <-time.After(10 * time.Second):
		return true, fmt.Errorf("%s (pid %d) still running 10s after SIGKILL", p.name, p.pid)
	}
}

// logTail returns the last n lines of the process's log file.
func (p *process) logTail(n int) string {
	return fileTail(p.logPath, n)
}

// fileTail returns the last n lines of a file (reading at most its last
// 64 KiB, which is plenty for n around 20 and keeps huge logs cheap).
func fileTail(path string, n int) string {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Sprintf("(cannot read %s: %v)", path, err)
	}
	defer f.Close()
	const maxRead = 64 << 10
	if st, err := f.Stat(); err == nil && st.Size() > maxRead {
		if _, err := f.Seek(st.Size()-maxRead, io.SeekStart); err != nil {
			return fmt.Sprintf("(cannot read %s: %v)", path, err)
		}
	}
	data, err := io.ReadAll(f)
	if err != nil {
		return fmt.Sprintf("(cannot read %s: %v)", path, err)
	}
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	if len(lines) == 1 && lines[0] == "" {
		return "(empty log)"
	}
	return strings.Join(lines, "\n")
}

// logContainsAfter reports whether the log file contains s at or after byte
// offset off. The offset lets a restarted process be judged by its own
// output only, since restarts append to the same log.
func logContainsAfter(path string, off int64, s string) bool {
	f, err := os.Open(path)
	if err != nil {
		return false
	}
	defer f.Close()
	if _, err := f.Seek(off, io.SeekStart); err != nil {
		return false
	}
	data, err := io.ReadAll(f)
	if err != nil {
		return false
	}
	return bytes.Contains(data, []byte(s))
}

// fileSize returns the size of path, or 0 if it does not exist.
func fileSize(path string) int64 {
	st, err := os.Stat(path)
	if err != nil {
		return 0
	}
	return st.Size()
}
