package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"
)

// controlPlanePackages are what hack/kubeenv/build.sh builds.
var controlPlanePackages = []string{"k8s.io/kubernetes/cmd/kube-apiserver", "k8s.io/kubernetes/cmd/kube-controller-manager", "go.etcd.io/etcd/server/v3"}

// progressEvery is how often a running build reports.
const progressEvery = 15 * time.Second

// controlPlaneBinaries returns the directory of etcd, kube-apiserver and
// kube-controller-manager: $KUBE_BIN_DIR if it holds them, else what
// hack/kubeenv/build.sh prints, which is a cache lookup once they are
// built and a build of several minutes the first time. While it builds,
// the packages it compiles are counted against those left to compile, and
// the count and the elapsed time are printed every progressEvery.
func controlPlaneBinaries(ctx context.Context) (string, error) {
	if d := os.Getenv("KUBE_BIN_DIR"); d != "" && hasControlPlane(d) {
		say("    using KUBE_BIN_DIR=%s", d)
		return d, nil
	}
	cmd := exec.CommandContext(ctx, "bash", "hack/kubeenv/build.sh")
	// -v makes go build name each package as it compiles it (cached ones
	// are not named): the progress count.
	cmd.Env = append(os.Environ(), "GOFLAGS="+strings.TrimSpace(os.Getenv("GOFLAGS")+" -v"))
	var stdout bytes.Buffer
	cmd.Stdout = &stdout
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return "", err
	}
	start := time.Now()
	if err := cmd.Start(); err != nil {
		return "", fmt.Errorf("run hack/kubeenv/build.sh: %w", err)
	}
	var (
		mu sync.Mutex
		p  = progress{start: start}
	)
	done := make(chan struct{})
	defer close(done)
	tail := &lastLines{n: 20}
	linesDone := make(chan struct{})
	go func() {
		defer close(linesDone)
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			line := sc.Text()
			tail.add(line)
			if isPackageLine(line) {
				mu.Lock()
				p.compiled++
				p.last = line
				mu.Unlock()
				continue
			}
			say("    %s", line)
			if strings.HasPrefix(line, "building kubernetes") {
				// Only a real build is worth counting what is left.
				go func() {
					n, err := stalePackages(ctx)
					mu.Lock()
					defer mu.Unlock()
					if err == nil {
						p.total = n
					}
				}()
				go func() {
					t := time.NewTicker(progressEvery)
					defer t.Stop()
					for {
						select {
						case <-done:
							return
						case <-t.C:
							mu.Lock()
							say("    %s", p.line(time.Now()))
							mu.Unlock()
						}
					}
				}()
			}
		}
	}()
	<-linesDone
	if err := cmd.Wait(); err != nil {
		return "", fmt.Errorf("hack/kubeenv/build.sh: %w\n%s", err, tail.String())
	}
	dir := strings.TrimSpace(lastLine(stdout.String()))
	if !hasControlPlane(dir) {
		return "", fmt.Errorf("hack/kubeenv/build.sh printed %q, which does not hold the control plane binaries", dir)
	}
	say("    control plane binaries in %s", dir)
	return dir, nil
}

// progress is a running build's count of compiled packages.
type progress struct {
	start    time.Time
	compiled int
	// total is how many packages needed compiling when the build began
	// (0: not known yet).
	total int
	last  string
}

// line is the progress report at now.
func (p progress) line(now time.Time) string {
	s := fmt.Sprintf("building: %s elapsed, %d packages compiled", now.Sub(p.start).Round(time.Second), p.compiled)
	if p.total > 0 {
		left := max(p.total-p.compiled, 0)
		s = fmt.Sprintf("building: %s elapsed, %d of %d packages compiled, %d left", now.Sub(p.start).Round(time.Second), min(p.compiled, p.total), p.total, left)
		if p.compiled > 0 && left > 0 {
			// A rough guide: packages differ a lot in size.
			perPkg := now.Sub(p.start) / time.Duration(p.compiled)
			s += fmt.Sprintf(" (about %s more)", (perPkg * time.Duration(left)).Round(time.Minute))
		}
	}
	if p.last != "" {
		s += "; last: " + p.last
	}
	return s
}

// isPackageLine tells go build -v's package lines (an import path alone)
// from build.sh's messages and compiler errors, which have spaces.
func isPackageLine(line string) bool {
	return line != "" && !strings.ContainsAny(line, " \t:") && strings.Contains(line, "/")
}

// stalePackages counts the packages of the control plane that a build has
// to compile (those not in Go's build cache).
func stalePackages(ctx context.Context) (int, error) {
	args := append([]string{"list", "-deps", "-f", "{{if .Stale}}stale{{end}}"}, controlPlanePackages...)
	cmd := exec.CommandContext(ctx, "go", args...)
	cmd.Dir = filepath.Join("hack", "kubeenv", "tools")
	out, err := cmd.Output()
	if err != nil {
		return 0, err
	}
	return strings.Count(string(out), "stale"), nil
}

func hasControlPlane(dir string) bool {
	if dir == "" {
		return false
	}
	for _, n := range []string{"etcd", "kube-apiserver", "kube-controller-manager"} {
		st, err := os.Stat(filepath.Join(dir, n))
		if err != nil || st.IsDir() || st.Mode()&0o111 == 0 {
			return false
		}
	}
	return true
}

func lastLine(s string) string {
	s = strings.TrimRight(s, "\n")
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		return s[i+1:]
	}
	return s
}

// lastLines keeps the last n lines written, for an error's context.
type lastLines struct {
	mu    sync.Mutex
	n     int
	lines []string
}

func (l *lastLines) add(line string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lines = append(l.lines, line)
	if len(l.lines) > l.n {
		l.lines = l.lines[len(l.lines)-l.n:]
	}
}

func (l *lastLines) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Join(l.lines, "\n")
}
