package testnats

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/nats-io/nkeys"
)

// BuildServer builds nats-server, at the version go.mod requires, into dir
// and returns its path. It runs go build from the module root above the
// working directory.
func BuildServer(ctx context.Context, dir string) (string, error) {
	root, err := moduleRoot()
	if err != nil {
		return "", err
	}
	bin := filepath.Join(dir, "nats-server")
	cmd := exec.CommandContext(ctx, "go", "build", "-o", bin, "github.com/nats-io/nats-server/v2")
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build nats-server: %v\n%s", err, out)
	}
	return bin, nil
}

// moduleRoot is the nearest directory at or above the working directory
// with a go.mod.
func moduleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("no go.mod above the working directory")
		}
		dir = parent
	}
}

func newUser() (pub string, seed []byte, err error) {
	kp, err := nkeys.CreateUser()
	if err != nil {
		return "", nil, err
	}
	if pub, err = kp.PublicKey(); err != nil {
		return "", nil, err
	}
	seed, err = kp.Seed()
	return pub, seed, err
}

// Spawn starts cmd so that it dies with this process (Pdeathsig: a
// crashed test leaves nothing behind) in a process group of its own (a
// Ctrl-C reaches only the test), and calls exited with Wait's result when
// it ends; done is closed once exited returned. Pdeathsig fires when the
// forking thread exits, so the fork happens on a goroutine locked to its
// thread that stays in Wait while the child lives.
func Spawn(cmd *exec.Cmd, exited func(error)) (done <-chan struct{}, err error) {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Pdeathsig, cmd.SysProcAttr.Setpgid = syscall.SIGKILL, true
	ch := make(chan struct{})
	started := make(chan error, 1)
	go func() {
		defer close(ch)
		runtime.LockOSThread()
		if err := cmd.Start(); err != nil {
			started <- err
			return
		}
		started <- nil
		exited(cmd.Wait())
	}()
	if err := <-started; err != nil {
		return nil, err
	}
	return ch, nil
}

// process is one nats-server process of a Cluster, started again on the
// same configuration as often as asked. Exits that kill, stop or stopNow
// did not cause are recorded.
type process struct {
	name, bin, logPath string
	args, env          []string

	mu         sync.Mutex
	cmd        *exec.Cmd
	done       <-chan struct{}
	expecting  bool
	starts     int
	exitedCPU  time.Duration // CPU time of the processes that ended
	unexpected []string
}

func (p *process) start() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd != nil {
		return fmt.Errorf("%s is already running", p.name)
	}
	logFile, err := os.OpenFile(p.logPath, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	p.starts++
	fmt.Fprintf(logFile, "=== testnats: %s start #%d at %s\n", p.name, p.starts, time.Now().UTC().Format(time.RFC3339Nano))
	cmd := exec.Command(p.bin, p.args...)
	cmd.Env = append(os.Environ(), p.env...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	done, err := Spawn(cmd, func(err error) {
		p.exited(cmd, err, logFile)
		_ = logFile.Close()
	})
	if err != nil {
		_ = logFile.Close()
		return fmt.Errorf("start %s: %w", p.name, err)
	}
	p.cmd, p.done, p.expecting = cmd, done, false
	return nil
}

func (p *process) exited(cmd *exec.Cmd, err error, logFile *os.File) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if st := cmd.ProcessState; st != nil {
		p.exitedCPU += st.UserTime() + st.SystemTime()
	}
	status := "exit status 0"
	if err != nil {
		status = err.Error()
	}
	fmt.Fprintf(logFile, "=== testnats: %s (pid %d) exited: %s at %s\n", p.name, cmd.Process.Pid, status, time.Now().UTC().Format(time.RFC3339Nano))
	if !p.expecting {
		p.unexpected = append(p.unexpected, fmt.Sprintf("%s (pid %d) at %s: %s; last lines of %s:\n%s", p.name, cmd.Process.Pid,
			time.Now().UTC().Format("15:04:05.000"), status, p.logPath, "    "+strings.ReplaceAll(LogTail(p.logPath, 10), "\n", "\n    ")))
	}
	if p.cmd == cmd {
		p.cmd = nil
	}
}

func (p *process) running() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cmd != nil
}

// signal sends sig and waits up to wait for the exit (then SIGKILL).
func (p *process) signal(sig syscall.Signal, wait time.Duration) error {
	p.mu.Lock()
	cmd, done := p.cmd, p.done
	if cmd == nil {
		p.mu.Unlock()
		return nil
	}
	p.expecting = true
	p.mu.Unlock()
	_ = cmd.Process.Signal(sig)
	select {
	case <-done:
		return nil
	case <-time.After(wait):
	}
	_ = cmd.Process.Kill()
	select {
	case <-done:
		if sig == syscall.SIGKILL {
			return nil
		}
		return fmt.Errorf("%s did not exit within %s of %s and was killed", p.name, wait, sig)
	case <-time.After(15 * time.Second):
		return fmt.Errorf("%s (pid %d) still running 15s after SIGKILL", p.name, cmd.Process.Pid)
	}
}

func (p *process) kill() error { return p.signal(syscall.SIGKILL, 15*time.Second) }

// stop puts the server in lame-duck mode (SIGUSR2, what `nats-server
// --signal ldm` sends) and waits up to grace for it to exit.
func (p *process) stop(grace time.Duration) error { return p.signal(syscall.SIGUSR2, grace) }

func (p *process) stopNow() error { return p.signal(syscall.SIGTERM, 10*time.Second) }

func (p *process) unexpectedExits() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.unexpected...)
}

// usage returns the CPU time of every run so far and the running
// process's resident and peak resident memory in bytes.
func (p *process) usage() (cpu time.Duration, rss, peak int64) {
	p.mu.Lock()
	cpu = p.exitedCPU
	var pid int
	if p.cmd != nil && p.cmd.Process != nil {
		pid = p.cmd.Process.Pid
	}
	p.mu.Unlock()
	if pid == 0 {
		return cpu, 0, 0
	}
	used, rss, peak := ProcUsage(pid)
	return cpu + used, rss, peak
}

// ProcUsage reads a running process's CPU time (user and system) and its
// resident and peak resident memory in bytes from /proc (Linux; zeros
// elsewhere or once it is gone).
func ProcUsage(pid int) (cpu time.Duration, rss, peak int64) {
	if data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid)); err == nil {
		// Fields after the parenthesised command: state is field 3, utime
		// and stime are 14 and 15, in clock ticks (100 per second on
		// Linux).
		s := string(data)
		if i := strings.LastIndexByte(s, ')'); i > 0 {
			f := strings.Fields(s[i+1:])
			if len(f) > 12 {
				ut, _ := strconv.ParseInt(f[11], 10, 64)
				st, _ := strconv.ParseInt(f[12], 10, 64)
				cpu = time.Duration(ut+st) * 10 * time.Millisecond
			}
		}
	}
	if data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid)); err == nil {
		for _, line := range strings.Split(string(data), "\n") {
			k, v, ok := strings.Cut(line, ":")
			if !ok {
				continue
			}
			kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			switch k {
			case "VmRSS":
				rss = kb << 10
			case "VmHWM":
				peak = kb << 10
			}
		}
	}
	return cpu, rss, peak
}

// LogTail returns the last n lines of a file (from its last 64 KiB), or
// why it cannot be read.
func LogTail(path string, n int) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return fmt.Sprintf("(cannot read %s: %v)", path, err)
	}
	if len(data) > 64<<10 {
		data = data[len(data)-64<<10:]
	}
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
