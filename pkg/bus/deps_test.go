package bus

import (
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// TestContractsLinkNoNATSClient: the wire contracts, and the pure cores and
// kind cores that import them, link neither the NATS client nor the
// CloudEvents NATS binding (issue 24): package jsbus runs the bus.
func TestContractsLinkNoNATSClient(t *testing.T) {
	goBin, err := exec.LookPath("go")
	if err != nil {
		goBin = filepath.Join(runtime.GOROOT(), "bin", "go")
	}
	pkgs := []string{"bus", "ownership", "fairq", "kinds", "kindtable", "composite", "decorator", "mapctl", "snapshot", "revstore"}
	for _, p := range pkgs {
		t.Run(p, func(t *testing.T) {
			out, err := exec.Command(goBin, "list", "-deps", "github.com/metabus/metabus/pkg/"+p).CombinedOutput()
			if err != nil {
				t.Fatalf("go list -deps: %v\n%s", err, out)
			}
			for _, dep := range strings.Fields(string(out)) {
				if strings.HasPrefix(dep, "github.com/nats-io/") || strings.HasPrefix(dep, "github.com/cloudevents/sdk-go/protocol/") {
					t.Errorf("pkg/%s links %s", p, dep)
				}
			}
		})
	}
}
