package kubeenv

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// running reports whether pid is a live (not zombie) process.
func running(pid int) bool {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	// "pid (comm) S ...": comm may contain spaces or parentheses.
	s := string(data)
	i := strings.LastIndexByte(s, ')')
	if i < 0 || i+2 >= len(s) {
		return false
	}
	state := s[i+2]
	return state != 'Z' && state != 'X'
}

// waitGone polls until pid is no longer running.
func waitGone(pid int, timeout time.Duration) bool {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		if !running(pid) {
			return true
		}
		time.Sleep(20 * time.Millisecond)
	}
	return !running(pid)
}

// processesMentioning lists live processes whose command line contains s
// (used with a state dir: every child gets paths inside it as arguments).
func processesMentioning(s string) []string {
	var found []string
	entries, _ := os.ReadDir("/proc")
	for _, ent := range entries {
		pid, err := strconv.Atoi(ent.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join("/proc", ent.Name(), "cmdline"))
		if err != nil || !strings.Contains(string(cmdline), s) || !running(pid) {
			continue
		}
		found = append(found, fmt.Sprintf("%d: %s", pid, strings.ReplaceAll(string(cmdline), "\x00", " ")))
	}
	return found
}

func sleepBinary(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("sleep")
	if err != nil {
		t.Skipf("no sleep binary: %v", err)
	}
	return p
}

// onDisposableThread runs f on an OS thread that the runtime destroys when
// f returns, and returns that thread's id. It avoids the main thread, which
// the runtime never destroys.
func onDisposableThread(f func()) int {
	tidc := make(chan int, 1)
	var attempt func()
	attempt = func() {
		runtime.LockOSThread()
		if syscall.Gettid() == syscall.Getpid() {
			// Keep the main thread occupied so the retry lands on another
			// thread, then give it back.
			done := make(chan struct{})
			go func() { attempt(); close(done) }()
			<-done
			runtime.UnlockOSThread()
			return
		}
		f()
		tidc <- syscall.Gettid()
		// Returning while locked makes the runtime end this thread.
	}
	go attempt()
	return <-tidc
}

// waitThreadGone waits until thread tid of this process has exited.
func waitThreadGone(t *testing.T, tid int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		if _, err := os.Stat(fmt.Sprintf("/proc/self/task/%d", tid)); err != nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("thread %d did not exit", tid)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestChildSurvivesStarterThreadExit checks the property that makes
// Pdeathsig usable: a child must not be killed when the OS thread of the
// goroutine that called startProcess goes away. The control case shows the
// hazard is real, so the test can fail.
func TestChildSurvivesStarterThreadExit(t *testing.T) {
	sleep := sleepBinary(t)

	// Control: a plain exec with Pdeathsig on a thread that then exits.
	var cmd *exec.Cmd
	var startErr error
	tid := onDisposableThread(func() {
		cmd = exec.Command(sleep, "60")
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		startErr = cmd.Start()
	})
	if startErr != nil {
		t.Fatalf("start control child: %v", startErr)
	}
	waitThreadGone(t, tid)
	waited := make(chan error, 1)
	go func() { waited <- cmd.Wait() }()
	select {
	case err := <-waited:
		t.Logf("control: plain child died with its starter thread, as expected (%v)", err)
	case <-time.After(5 * time.Second):
		_ = cmd.Process.Kill()
		<-waited
		t.Fatalf("control: plain child outlived its starter thread; the kernel does not behave as this test assumes")
	}

	// The same situation with startProcess.
	var p *process
	tid = onDisposableThread(func() {
		p, startErr = startProcess("sleep", sleep, []string{"60"}, filepath.Join(t.TempDir(), "sleep.log"))
	})
	if startErr != nil {
		t.Fatal(startErr)
	}
	waitThreadGone(t, tid)
	// Thread churn: goroutines that lock a thread and exit make the runtime
	// destroy whatever idle threads they land on, the way a library using
	// LockOSThread would.
	var wg sync.WaitGroup
	for range 50 {
		wg.Go(func() { runtime.LockOSThread() })
	}
	wg.Wait()
	time.Sleep(500 * time.Millisecond)
	if p.exited() || !running(p.pid) {
		t.Fatalf("child %d died when the starting goroutine's thread exited (%s)", p.pid, p.exitStatus())
	}
	killed, err := p.stop(5 * time.Second)
	if err != nil || killed {
		t.Fatalf("stop: killed=%v err=%v", killed, err)
	}
	if running(p.pid) {
		t.Fatalf("child %d still running after stop", p.pid)
	}
}

const helperEnv = "KUBEENV_TEST_HELPER"

// TestHelperProcess is not a test: TestChildDiesWithParent runs the test
// binary with it as a stand-in for a test process that crashes.
func TestHelperProcess(t *testing.T) {
	if os.Getenv(helperEnv) == "" {
		t.Skip("helper for TestChildDiesWithParent")
	}
	p, err := startProcess("sleep", os.Getenv(helperEnv), []string{"300"}, filepath.Join(os.TempDir(), fmt.Sprintf("kubeenv-helper-%d.log", os.Getpid())))
	if err != nil {
		fmt.Println("ERROR", err)
		os.Exit(1)
	}
	_ = os.Remove(p.logPath) // the open descriptor in the child keeps it usable
	fmt.Println("PID", p.pid)
	time.Sleep(5 * time.Minute) // killed by the parent test long before
	os.Exit(0)
}

// TestChildDiesWithParent SIGKILLs a process that started a child through
// startProcess (no cleanup can run) and checks the child dies too.
func TestChildDiesWithParent(t *testing.T) {
	sleep := sleepBinary(t)
	helper := exec.Command(os.Args[0], "-test.run=^TestHelperProcess$", "-test.count=1")
	helper.Env = append(os.Environ(), helperEnv+"="+sleep)
	out, err := helper.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := helper.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = helper.Process.Kill(); _ = helper.Wait() }()

	pidc := make(chan int, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if rest, ok := strings.CutPrefix(sc.Text(), "PID "); ok {
				pid, _ := strconv.Atoi(rest)
				pidc <- pid
				return
			}
			t.Logf("helper: %s", sc.Text())
		}
		pidc <- 0
	}()
	var child int
	select {
	case child = <-pidc:
	case <-time.After(30 * time.Second):
		t.Fatal("helper did not report its child's PID")
	}
	if child <= 0 || !running(child) {
		t.Fatalf("helper's child %d is not running", child)
	}
	if err := helper.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = helper.Wait()
	if !waitGone(child, 5*time.Second) {
		_ = syscall.Kill(child, syscall.SIGKILL)
		t.Fatalf("child %d survived its SIGKILLed parent", child)
	}
}
