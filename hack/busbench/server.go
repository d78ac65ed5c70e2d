package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// server is a nats-server child process with JetStream on file.
type server struct {
	cmd    *exec.Cmd
	pid    int
	url    string
	monURL string
	exited chan struct{}
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func startServer(ctx context.Context, bin, dir string) (*server, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	mon, err := freePort()
	if err != nil {
		return nil, err
	}
	logf, err := os.Create(filepath.Join(dir, "nats-server.log"))
	if err != nil {
		return nil, err
	}
	defer logf.Close()
	cmd := exec.Command(bin, "-n", "busbench", "-js", "-sd", filepath.Join(dir, "store"),
		"-a", "127.0.0.1", "-p", strconv.Itoa(port), "-m", strconv.Itoa(mon))
	cmd.Stdout, cmd.Stderr = logf, logf
	// The server dies with the bench, whatever happens to it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start nats-server: %w", err)
	}
	s := &server{cmd: cmd, pid: cmd.Process.Pid, url: fmt.Sprintf("nats://127.0.0.1:%d", port),
		monURL: fmt.Sprintf("http://127.0.0.1:%d", mon), exited: make(chan struct{})}
	go func() { _ = cmd.Wait(); close(s.exited) }()
	deadline := time.Now().Add(20 * time.Second)
	for {
		resp, err := http.Get(s.monURL + "/healthz?js-enabled-only=true")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return s, nil
			}
		}
		select {
		case <-s.exited:
			return nil, fmt.Errorf("nats-server exited at start (log: %s)", filepath.Join(dir, "nats-server.log"))
		case <-ctx.Done():
			s.stop()
			return nil, ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			s.stop()
			return nil, fmt.Errorf("nats-server not healthy after 20s (log: %s)", filepath.Join(dir, "nats-server.log"))
		}
	}
}

// stop asks the server to exit, then kills it.
func (s *server) stop() {
	if s == nil {
		return
	}
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.exited:
	case <-time.After(10 * time.Second):
		_ = s.cmd.Process.Kill()
		<-s.exited
	}
}

type varz struct {
	InMsgs  uint64 `json:"in_msgs"`
	OutMsgs uint64 `json:"out_msgs"`
}

func (s *server) varz() (varz, error) {
	var v varz
	c := http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get(s.monURL + "/varz")
	if err != nil {
		return v, err
	}
	defer resp.Body.Close()
	err = json.NewDecoder(resp.Body).Decode(&v)
	return v, err
}

// userHZ is the unit of /proc/<pid>/stat times (USER_HZ, 100 on Linux).
const userHZ = 100

// procStat returns a process's CPU time (user + system), RSS and peak RSS.
func procStat(pid int) (cpu time.Duration, rss, hwm uint64) {
	if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid)); err == nil {
		s := string(b)
		if i := strings.LastIndexByte(s, ')'); i >= 0 {
			f := strings.Fields(s[i+1:])
			if len(f) > 12 {
				u, _ := strconv.ParseUint(f[11], 10, 64)
				k, _ := strconv.ParseUint(f[12], 10, 64)
				cpu = time.Duration(u+k) * time.Second / userHZ
			}
		}
	}
	if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid)); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			k, v, ok := strings.Cut(line, ":")
			if !ok {
				continue
			}
			var dst *uint64
			switch k {
			case "VmRSS":
				dst = &rss
			case "VmHWM":
				dst = &hwm
			default:
				continue
			}
			if f := strings.Fields(v); len(f) > 0 {
				n, _ := strconv.ParseUint(f[0], 10, 64)
				*dst = n << 10
			}
		}
	}
	return cpu, rss, hwm
}

func numCPU() int { return runtime.NumCPU() }
