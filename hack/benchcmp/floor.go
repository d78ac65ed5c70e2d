package main

// The contract-floor contender (issue 31): floorctl (./floorctl), the
// least controller that keeps upstream's calling contract, as a process
// of its own like metabus and upstream, so that its CPU per parent, RSS
// and idle CPU are measured the same way. What it bounds: the controller
// CPU per parent of any controller that watches parents and children,
// calls the hook on every change (its own writes included: three calls
// for a new B1 parent) and makes the contract's three writes. raw-contract
// bounds the rate; this bounds the CPU.

import (
	"context"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"

	"github.com/metabus/metabus/pkg/childproc"
)

// floorctlPkg is floorctl's package, relative to the repository root.
const floorctlPkg = "./hack/benchcmp/floorctl"

// buildFloorctl builds floorctl into dir, as `make build` builds metabus
// (static, -trimpath, no symbol table: the same kind of binary pages in
// RSS), and returns the binary's path.
func buildFloorctl(ctx context.Context, dir string) (string, error) {
	bin := filepath.Join(dir, "floorctl")
	cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-ldflags", "-s -w", "-o", bin, floorctlPkg)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOFLAGS=-buildvcs=false")
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build %s: %w\n%s", floorctlPkg, err, out)
	}
	return bin, nil
}

// startFloor runs floorctl against the cluster of kubeconfig: the bench's
// CompositeController ("bench", read from the API server as metabus and
// upstream read it: its hook URL, and the request's controller), Bench
// parents, ConfigMap children.
func startFloor(ctx context.Context, bin, kubeconfig, logPath string) (*proc, error) {
	health, err := childproc.FreeAddr()
	if err != nil {
		return nil, err
	}
	args := []string{
		"--kubeconfig", kubeconfig,
		"--health-address", health,
		"--controller", "bench",
		"--parent", benchGVR.Group + "/" + benchGVR.Version + "/" + benchGVR.Resource + "/Bench",
		"--child", configMapGVR.Version + "/" + configMapGVR.Resource,
		"--child-kind", "ConfigMap",
	}
	return childproc.Start(ctx, "contract-floor", bin, args, nil, logPath, "http://"+health+"/readyz")
}

// floorSummary sets the controllers' B1 CPU per parent (ms, by contender)
// against the floor's: how far above the contract's bound each one is,
// and where half of upstream's figure (issue 31's target) falls against
// it. Empty without a floor figure.
func floorSummary(cpu map[string]float64) string {
	f, ok := cpu["contract-floor"]
	if !ok || math.IsNaN(f) || f <= 0 {
		return ""
	}
	s := fmt.Sprintf("; controller CPU/parent: contract-floor %.2f ms", f)
	for _, c := range []string{"metabus", "upstream"} {
		if v, ok := cpu[c]; ok && !math.IsNaN(v) {
			s += fmt.Sprintf(", %s %.2f ms (%.2f× the floor)", c, v, v/f)
		}
	}
	if u, ok := cpu["upstream"]; ok && !math.IsNaN(u) {
		verdict := "above the floor"
		if u/2 < f {
			verdict = "below the floor: beyond the contract"
		}
		s += fmt.Sprintf("; half of upstream's %.2f ms is %.2f× the floor (%s)", u/2, u/2/f, verdict)
	}
	return s
}
