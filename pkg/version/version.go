// Package version says which build of metabus is running: the version and
// git revision stamped at link time (`make build`, `make image`, the
// Dockerfile; the version is the repository's VERSION file), or, for
// a plain `go build`/`go install`, what the Go toolchain recorded in the
// binary. Every binary prints it for --version, logs it at start and exports
// it as metabus_build_info.
package version

import (
	"fmt"
	"runtime"
	"runtime/debug"

	"github.com/prometheus/client_golang/prometheus"
)

// Version and Revision are set at link time:
//
//	go build -ldflags "-X github.com/metabus/metabus/pkg/version.Version=v0.2.0 \
//	  -X github.com/metabus/metabus/pkg/version.Revision=$(git rev-parse HEAD)"
//
// Left empty, Get falls back to the build information Go embeds.
var (
	Version  string
	Revision string
)

// Unknown is reported for a field neither the linker nor the build
// information gave.
const Unknown = "unknown"

// Info is one build's identity.
type Info struct {
	Version   string `json:"version"`
	Revision  string `json:"revision"`
	GoVersion string `json:"goVersion"`
}

// String is the one-line form --version prints.
func (i Info) String() string {
	return fmt.Sprintf("%s (revision %s, %s)", i.Version, i.Revision, i.GoVersion)
}

// Get returns this binary's identity.
func Get() Info {
	bi, _ := debug.ReadBuildInfo()
	return resolve(Version, Revision, bi)
}

// resolve prefers the link-time stamps and falls back to the build
// information: the main module's version (set by `go install
// module@version`; "(devel)" for a build in a work tree) and the VCS
// revision `go build` records unless -buildvcs=false, marked "-dirty" when
// the work tree had changes.
func resolve(version, revision string, bi *debug.BuildInfo) Info {
	i := Info{Version: version, Revision: revision, GoVersion: runtime.Version()}
	if bi != nil {
		if bi.GoVersion != "" {
			i.GoVersion = bi.GoVersion
		}
		if i.Version == "" && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
			i.Version = bi.Main.Version
		}
		if i.Revision == "" {
			var rev string
			var dirty bool
			for _, s := range bi.Settings {
				switch s.Key {
				case "vcs.revision":
					rev = s.Value
				case "vcs.modified":
					dirty = s.Value == "true"
				}
			}
			if rev != "" && dirty {
				rev += "-dirty"
			}
			i.Revision = rev
		}
	}
	if i.Version == "" {
		i.Version = "dev"
	}
	if i.Revision == "" {
		i.Revision = Unknown
	}
	return i
}

// BuildInfoName is the metric Register exports.
const BuildInfoName = "metabus_build_info"

// Register exports metabus_build_info{version,revision,goversion} 1 on reg,
// the usual Prometheus idiom to join a build's identity onto other series.
func Register(reg prometheus.Registerer) error {
	return reg.Register(Collector(Get()))
}

// Collector is the metabus_build_info gauge of i.
func Collector(i Info) prometheus.Collector {
	g := prometheus.NewGauge(prometheus.GaugeOpts{
		Name:        BuildInfoName,
		Help:        "A metric with a constant '1' value labeled by the version, git revision and Go version metabus was built from.",
		ConstLabels: prometheus.Labels{"version": i.Version, "revision": i.Revision, "goversion": i.GoVersion},
	})
	g.Set(1)
	return g
}
