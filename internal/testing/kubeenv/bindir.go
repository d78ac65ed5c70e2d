package kubeenv

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
)

const modulePath = "github.com/metabus/metabus"

// Names of the binaries expected in a BinDir.
const (
	etcdBin      = "etcd"
	apiserverBin = "kube-apiserver"
	kcmBin       = "kube-controller-manager"
)

var (
	// binDirMu serialises build.sh runs within this process: two clusters
	// started in parallel must not start two multi-minute builds.
	binDirMu     sync.Mutex
	binDirCached string
)

// BinDir returns the directory holding etcd, kube-apiserver and
// kube-controller-manager: $KUBE_BIN_DIR if it holds all three, otherwise the
// directory printed (last stdout line) by <repo root>/hack/kubeenv/build.sh,
// which builds them on first use (several minutes) and is a quick cache check
// afterwards. The repo root is the nearest directory at or above the working
// directory whose go.mod declares module github.com/metabus/metabus.
func BinDir() (string, error) {
	if d := os.Getenv("KUBE_BIN_DIR"); d != "" && hasBinaries(d, true) {
		return d, nil
	}
	binDirMu.Lock()
	defer binDirMu.Unlock()
	if binDirCached != "" && hasBinaries(binDirCached, true) {
		return binDirCached, nil
	}
	root, err := repoRoot()
	if err != nil {
		return "", fmt.Errorf("find kubernetes binaries: %w", err)
	}
	script := filepath.Join(root, "hack", "kubeenv", "build.sh")

	// Test binaries of different packages run as parallel processes; a
	// machine-wide lock makes all but one wait for the build and then find
	// the binaries cached. If the lock cannot be taken, building without it
	// is still correct (build.sh moves finished binaries into place), only
	// wasteful.
	if unlock, err := lockFile(filepath.Join(os.TempDir(), "metabus-kubeenv-build.lock")); err == nil {
		defer unlock()
	}

	var stdout, stderr bytes.Buffer
	cmd := exec.Command("bash", script)
	cmd.Dir = root
	cmd.Stdout = &stdout
	// build.sh reports progress on stderr; pass it through so a first build
	// that takes minutes does not look like a hung test.
	cmd.Stderr = io.MultiWriter(os.Stderr, &stderr)
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("run %s: %w\n%s", script, err, lastLines(stderr.String(), 20))
	}
	dir := strings.TrimSpace(lastLines(stdout.String(), 1))
	if dir == "" {
		return "", fmt.Errorf("run %s: it printed no directory", script)
	}
	if !hasBinaries(dir, true) {
		return "", fmt.Errorf("run %s: %s does not hold %s, %s and %s", script, dir, etcdBin, apiserverBin, kcmBin)
	}
	binDirCached = dir
	return dir, nil
}

// hasBinaries reports whether dir holds executable etcd and kube-apiserver
// binaries and, if withKCM, kube-controller-manager.
func hasBinaries(dir string, withKCM bool) bool {
	names := []string{etcdBin, apiserverBin}
	if withKCM {
		names = append(names, kcmBin)
	}
	for _, n := range names {
		if checkExecutable(filepath.Join(dir, n)) != nil {
			return false
		}
	}
	return true
}

// checkExecutable returns an error unless path (after symlinks) is an
// executable regular file.
func checkExecutable(path string) error {
	st, err := os.Stat(path)
	if err != nil {
		return err
	}
	if !st.Mode().IsRegular() || st.Mode().Perm()&0o111 == 0 {
		return fmt.Errorf("%s is not an executable file", path)
	}
	return nil
}

// repoRoot walks up from the working directory to this module's root.
func repoRoot() (string, error) {
	wd, err := os.Getwd()
	if err != nil {
		return "", fmt.Errorf("get working directory: %w", err)
	}
	for dir := wd; ; {
		if name, err := moduleName(filepath.Join(dir, "go.mod")); err == nil && name == modulePath {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("no go.mod of module %s at or above %s", modulePath, wd)
		}
		dir = parent
	}
}

// moduleName returns the module path declared in a go.mod file.
func moduleName(gomod string) (string, error) {
	f, err := os.Open(gomod)
	if err != nil {
		return "", err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		rest, ok := strings.CutPrefix(line, "module")
		if !ok || (rest != "" && rest[0] != ' ' && rest[0] != '\t') {
			continue
		}
		if i := strings.Index(rest, "//"); i >= 0 {
			rest = rest[:i]
		}
		return strings.Trim(strings.TrimSpace(rest), `"`+"`"), nil
	}
	if err := sc.Err(); err != nil {
		return "", err
	}
	return "", errors.New("no module directive")
}

// lockFile takes an exclusive flock on path, creating it if needed.
func lockFile(path string) (unlock func(), err error) {
	f, err := os.OpenFile(path, os.O_RDONLY|os.O_CREATE, 0o666)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		f.Close()
		return nil, err
	}
	return func() {
		_ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
		f.Close()
	}, nil
}

// lastLines returns the last n lines of s, ignoring trailing newlines.
func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
