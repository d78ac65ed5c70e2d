package main

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/metabus/metabus/internal/testing/testnats"
)

// proc is one process the suite runs (a metabus service or nats-server) and
// may SIGKILL and start again. Every exit the suite did not cause is
// recorded, and the process is started again so the run can go on.
type proc struct {
	name    string
	path    string
	args    []string
	logPath string
	logf    func(string, ...any)
	// readyURL is the service's /readyz ("" for none).
	readyURL string

	mu        sync.Mutex
	cmd       *exec.Cmd
	done      <-chan struct{}
	waitErr   error
	expecting bool // the suite is killing or stopping it: the exit is expected
	closing   bool // no more restarts after an unexpected exit
	starts    int
	kills     int
	cpuExited time.Duration // CPU time of the runs that ended
	alive     bool          // cmd runs
	startedAt time.Time
	// unexpected describes each exit the suite did not cause.
	unexpected []exitRecord
}

// exitRecord is an exit the suite did not cause.
type exitRecord struct {
	started, at time.Time
	desc        string
	tail        string // the end of the log at exit
}

func newProc(name, path string, args []string, logDir string, logf func(string, ...any)) *proc {
	return &proc{name: name, path: path, args: args, logPath: filepath.Join(logDir, name+".log"), logf: logf}
}

// start starts the process; its output is appended to its log.
func (p *proc) start() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.startLocked()
}

func (p *proc) startLocked() error {
	logFile, err := os.OpenFile(p.logPath, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	fmt.Fprintf(logFile, "=== faults: %s start #%d at %s\n", p.name, p.starts+1, time.Now().UTC().Format(time.RFC3339Nano))
	cmd := exec.Command(p.path, p.args...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	done, err := testnats.Spawn(cmd, func(err error) {
		p.exited(cmd, err, logFile)
		_ = logFile.Close()
	})
	if err != nil {
		_ = logFile.Close()
		return fmt.Errorf("start %s: %w", p.name, err)
	}
	p.cmd, p.done = cmd, done
	p.alive = true
	p.startedAt = time.Now()
	p.starts++
	p.expecting = false
	return nil
}

// exited runs when a process ends; an exit the suite did not ask for is
// recorded and the process started again a second later.
func (p *proc) exited(cmd *exec.Cmd, err error, logFile *os.File) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd != cmd {
		return
	}
	p.waitErr = err
	p.alive = false
	if st := cmd.ProcessState; st != nil {
		p.cpuExited += st.UserTime() + st.SystemTime()
	}
	status := "exit status 0"
	if err != nil {
		status = err.Error()
	}
	fmt.Fprintf(logFile, "=== faults: %s (pid %d) exited: %s at %s\n", p.name, cmd.Process.Pid, status, time.Now().UTC().Format(time.RFC3339Nano))
	if p.expecting {
		return
	}
	tail := testnats.LogTail(p.logPath, 15)
	desc := fmt.Sprintf("%s (pid %d, started %s) exited on its own at %s: %s; last lines of %s:\n%s",
		p.name, cmd.Process.Pid, p.startedAt.UTC().Format("15:04:05.000"), time.Now().UTC().Format("15:04:05.000"), status, p.logPath, indent(tail))
	p.unexpected = append(p.unexpected, exitRecord{started: p.startedAt, at: time.Now(), desc: desc, tail: tail})
	p.logf("UNEXPECTED EXIT: %s (pid %d): %s; %s", p.name, cmd.Process.Pid, status, lastError(tail))
	if p.closing {
		return
	}
	go func() {
		time.Sleep(time.Second)
		p.mu.Lock()
		defer p.mu.Unlock()
		if p.closing || p.cmd != cmd {
			return
		}
		if err := p.startLocked(); err != nil {
			p.unexpected = append(p.unexpected, exitRecord{at: time.Now(), desc: fmt.Sprintf("%s could not be restarted: %v", p.name, err)})
		}
	}()
}

// kill SIGKILLs the process and waits until it is gone.
func (p *proc) kill() error {
	p.mu.Lock()
	cmd, done := p.cmd, p.done
	p.expecting = true
	p.mu.Unlock()
	if cmd == nil {
		return fmt.Errorf("%s not running", p.name)
	}
	_ = cmd.Process.Signal(syscall.SIGKILL)
	select {
	case <-done:
	case <-time.After(15 * time.Second):
		return fmt.Errorf("%s (pid %d) still running 15s after SIGKILL", p.name, cmd.Process.Pid)
	}
	p.mu.Lock()
	p.kills++
	p.mu.Unlock()
	return nil
}

// restart SIGKILLs the process and starts it again at once.
func (p *proc) restart() error {
	if err := p.kill(); err != nil {
		return err
	}
	return p.start()
}

// stop sends SIGTERM and waits up to grace (then SIGKILL). It returns how
// the process ended ("" when it exited with status 0 on SIGTERM) and stops
// restarts.
func (p *proc) stop(grace time.Duration) string {
	p.mu.Lock()
	p.closing, p.expecting = true, true
	cmd, done := p.cmd, p.done
	p.mu.Unlock()
	if cmd == nil {
		return "never started"
	}
	select {
	case <-done:
		return ""
	default:
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-done:
	case <-time.After(grace):
		_ = cmd.Process.Kill()
		<-done
		return fmt.Sprintf("ignored SIGTERM for %s and was killed", grace)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.waitErr != nil {
		return fmt.Sprintf("on SIGTERM: %v; last lines of %s:\n%s", p.waitErr, p.logPath, indent(testnats.LogTail(p.logPath, 15)))
	}
	return ""
}

// waitReady waits until the process's /readyz answers 200.
func (p *proc) waitReady(ctx context.Context, timeout time.Duration) error {
	if p.readyURL == "" {
		return nil
	}
	deadline := time.Now().Add(timeout)
	client := &http.Client{Timeout: 2 * time.Second}
	for {
		resp, err := client.Get(p.readyURL)
		if err == nil {
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			err = fmt.Errorf("HTTP %d", resp.StatusCode)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s not ready within %s: %v", p.name, timeout, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// cpu is the CPU time of every run so far.
func (p *proc) cpu() time.Duration {
	p.mu.Lock()
	cpu := p.cpuExited
	var pid int
	if p.alive {
		pid = p.cmd.Process.Pid
	}
	p.mu.Unlock()
	if pid != 0 {
		used, _, _ := testnats.ProcUsage(pid)
		cpu += used
	}
	return cpu
}

func (p *proc) pid() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil || p.cmd.Process == nil {
		return 0
	}
	return p.cmd.Process.Pid
}

func (p *proc) unexpectedExits() []exitRecord {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]exitRecord(nil), p.unexpected...)
}

func (p *proc) killCount() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.kills
}

// natsConf is the nats-server configuration: the 8MB max_payload of the
// production configuration (deploy/nats). Port and store dir are flags.
const natsConf = `max_payload: 8MB
jetstream {
  max_memory_store: 256MB
}
`

// newNATS prepares a nats-server with JetStream on a file store in dir,
// listening on a fixed port so that restarts keep its URL.
func newNATS(bin, dir, logDir string, port int, logf func(string, ...any)) (*proc, string, error) {
	conf := filepath.Join(dir, "nats.conf")
	if err := os.WriteFile(conf, []byte(natsConf), 0o644); err != nil {
		return nil, "", err
	}
	store := filepath.Join(dir, "jetstream")
	args := []string{"-c", conf, "-js", "-sd", store, "-a", "127.0.0.1", "-p", fmt.Sprint(port)}
	return newProc("nats-server", bin, args, logDir, logf), fmt.Sprintf("nats://127.0.0.1:%d", port), nil
}

// waitNATS waits until the server at url answers JetStream requests.
func waitNATS(ctx context.Context, url string, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var last error
	for {
		nc, err := nats.Connect(url, nats.Timeout(2*time.Second), nats.NoReconnect())
		if err == nil {
			js, jerr := nc.JetStream()
			if jerr == nil {
				_, jerr = js.AccountInfo(nats.MaxWait(2 * time.Second))
			}
			nc.Close()
			if jerr == nil {
				return nil
			}
			err = jerr
		}
		last = err
		select {
		case <-ctx.Done():
			return fmt.Errorf("nats-server at %s not ready: %v", url, last)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// lastError is the last line of a log tail that reports an error (the
// whole line), or its last line.
func lastError(tail string) string {
	lines := strings.Split(tail, "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		if strings.Contains(lines[i], `"level":"error"`) || strings.Contains(lines[i], "panic:") {
			return strings.TrimSpace(lines[i])
		}
	}
	return strings.TrimSpace(lines[len(lines)-1])
}

func indent(s string) string { return "    " + strings.ReplaceAll(s, "\n", "\n    ") }

// repoRoot is the nearest directory at or above the working directory whose
// go.mod declares this module.
func repoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		data, err := os.ReadFile(filepath.Join(dir, "go.mod"))
		if err == nil && strings.Contains(string(data), "module github.com/metabus/metabus\n") {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("not inside the metabus repository (no go.mod of github.com/metabus/metabus above the working directory)")
		}
		dir = parent
	}
}

// buildBinaries builds the four services and nats-server into dir.
func buildBinaries(ctx context.Context, root, dir string) error {
	// One build: the five links run side by side. nats-server's binary is
	// named after the path's element before its major version, /v2.
	args := []string{"build", "-o", dir + "/", "./cmd/watcher", "./cmd/dispatcher", "./cmd/applier", "./cmd/revisions", "github.com/nats-io/nats-server/v2"}
	cmd := exec.CommandContext(ctx, "go", args...)
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	if _, err := os.Stat(filepath.Join(dir, "nats-server")); err != nil {
		return fmt.Errorf("go %s made no nats-server: %w", strings.Join(args, " "), err)
	}
	return nil
}
