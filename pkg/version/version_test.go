package version

import (
	"os"
	"regexp"
	"runtime/debug"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

func TestResolve(t *testing.T) {
	vcs := func(rev, modified string) *debug.BuildInfo {
		return &debug.BuildInfo{GoVersion: "go1.26.0", Main: debug.Module{Path: "github.com/metabus/metabus", Version: "(devel)"},
			Settings: []debug.BuildSetting{{Key: "vcs.revision", Value: rev}, {Key: "vcs.modified", Value: modified}}}
	}
	cases := []struct {
		reason            string
		version, revision string
		bi                *debug.BuildInfo
		want              Info
	}{
		{
			reason:  "link-time stamps win over the build information",
			version: "v0.2.0", revision: "abc123", bi: vcs("def456", "true"),
			want: Info{Version: "v0.2.0", Revision: "abc123", GoVersion: "go1.26.0"},
		},
		{
			reason: "a work-tree build: the VCS revision, dirty when the tree had changes",
			bi:     vcs("def456", "true"),
			want:   Info{Version: "dev", Revision: "def456-dirty", GoVersion: "go1.26.0"},
		},
		{
			reason: "a clean work-tree build",
			bi:     vcs("def456", "false"),
			want:   Info{Version: "dev", Revision: "def456", GoVersion: "go1.26.0"},
		},
		{
			reason: "go install module@version: the module version",
			bi:     &debug.BuildInfo{GoVersion: "go1.26.0", Main: debug.Module{Version: "v0.3.1"}},
			want:   Info{Version: "v0.3.1", Revision: Unknown, GoVersion: "go1.26.0"},
		},
		{
			reason:  "only a version stamped: the revision still comes from VCS",
			version: "v1.0.0", bi: vcs("def456", "false"),
			want: Info{Version: "v1.0.0", Revision: "def456", GoVersion: "go1.26.0"},
		},
	}
	for _, c := range cases {
		t.Run(c.reason, func(t *testing.T) {
			if diff := cmp.Diff(c.want, resolve(c.version, c.revision, c.bi)); diff != "" {
				t.Errorf("resolve (-want +got):\n%s", diff)
			}
		})
	}
	if got := resolve("", "", nil); got.Version != "dev" || got.Revision != Unknown || !strings.HasPrefix(got.GoVersion, "go") {
		t.Errorf("no build information: %+v", got)
	}
}

func TestBuildInfoMetric(t *testing.T) {
	reg := prometheus.NewRegistry()
	if err := reg.Register(Collector(Info{Version: "v0.2.0", Revision: "abc123", GoVersion: "go1.26.0"})); err != nil {
		t.Fatal(err)
	}
	want := `
# HELP metabus_build_info A metric with a constant '1' value labeled by the version, git revision and Go version metabus was built from.
# TYPE metabus_build_info gauge
metabus_build_info{goversion="go1.26.0",revision="abc123",version="v0.2.0"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), BuildInfoName); err != nil {
		t.Error(err)
	}
}

// TestStampTargets: the build files stamp variables this package declares
// (the Dockerfile once stamped main.version, which no main declared, so
// every image said nothing about its build).
func TestStampTargets(t *testing.T) {
	declared := map[string]bool{"Version": true, "Revision": true}
	const pkg = "github.com/metabus/metabus/pkg/version"
	for _, file := range []string{"../../Dockerfile", "../../Makefile"} {
		data, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		text := string(data)
		targets := regexp.MustCompile(`-X\s+(\S+?)\.(\w+)=`).FindAllStringSubmatch(text, -1)
		if len(targets) < 2 {
			t.Errorf("%s stamps %d variables, want Version and Revision", file, len(targets))
		}
		for _, m := range targets {
			p := m[1]
			// Indirections the files use for the package path.
			p = strings.NewReplacer("$(VERSION_PKG)", pkg, "$v", pkg).Replace(p)
			if p != pkg || !declared[m[2]] {
				t.Errorf("%s stamps %s.%s, which is not a variable of %s", file, m[1], m[2], pkg)
			}
		}
		if strings.Contains(text, "$(VERSION_PKG)") && !strings.Contains(text, "VERSION_PKG := "+pkg) {
			t.Errorf("%s: VERSION_PKG is not %s", file, pkg)
		}
		if !strings.Contains(text, "v="+pkg) && strings.Contains(text, "$v.") {
			t.Errorf("%s: $v is not %s", file, pkg)
		}
	}
}
