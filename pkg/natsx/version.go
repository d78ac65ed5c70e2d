package natsx

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"

	"github.com/nats-io/nats.go"
	"go.uber.org/zap"
)

// BuiltServerVersion is the nats-server release go.mod requires: the
// server the embedded mode, every test, benchmark and fault suite runs.
// It is written out rather than read from nats-server's package, which this
// package does not link (see embeddednats); TestBuiltServerVersion holds it
// equal to go.mod's.
const BuiltServerVersion = "2.15.2"

// ServerImage is the nats-server container image of that same release,
// which the StatefulSet, the Helm chart and docker-compose.yaml pin
// (deploy/natsversion_test.go holds them equal), so that what is installed
// is the server the tests ran.
const ServerImage = "nats:" + BuiltServerVersion + "-alpine"

// MinResetVersion is the oldest nats-server that answers a consumer reset
// ($JS.API.CONSUMER.RESET, jetstream.ResetConsumer), which a graceful
// partition handover sends (pkg/jsbus, reset). An older server never
// answers it: each handover then waits for the request's timeout and what
// the old owner held pending is delivered again only after AckWait,
// counted as a redelivery.
const MinResetVersion = "2.14.0"

// ServerVersion is a nats-server version: MAJOR.MINOR.PATCH with an
// optional pre-release (2.14.0-RC.1) and build metadata, as a server
// announces it in its INFO.
type ServerVersion struct {
	Major, Minor, Patch int
	// Pre is the pre-release without its "-" ("" for a release).
	Pre string
}

// String is the version as the server writes it (without build metadata).
func (v ServerVersion) String() string {
	s := fmt.Sprintf("%d.%d.%d", v.Major, v.Minor, v.Patch)
	if v.Pre != "" {
		s += "-" + v.Pre
	}
	return s
}

// Less orders versions as SemVer does for what a server announces: by
// number, then a pre-release before its release. Pre-releases of the same
// number are compared as strings (enough to be consistent; no decision
// here depends on their order).
func (v ServerVersion) Less(w ServerVersion) bool {
	if v.Major != w.Major {
		return v.Major < w.Major
	}
	if v.Minor != w.Minor {
		return v.Minor < w.Minor
	}
	if v.Patch != w.Patch {
		return v.Patch < w.Patch
	}
	switch {
	case v.Pre == w.Pre:
		return false
	case v.Pre == "":
		return false
	case w.Pre == "":
		return true
	}
	return v.Pre < w.Pre
}

// ParseServerVersion parses a version a nats-server announces.
func ParseServerVersion(s string) (ServerVersion, error) {
	if s == "" {
		return ServerVersion{}, errors.New("empty nats-server version (not connected?)")
	}
	core, _, _ := strings.Cut(s, "+")
	core, pre, hasPre := strings.Cut(core, "-")
	if hasPre && pre == "" {
		return ServerVersion{}, fmt.Errorf("nats-server version %q: empty pre-release after '-'", s)
	}
	parts := strings.Split(core, ".")
	if len(parts) != 3 {
		return ServerVersion{}, fmt.Errorf("nats-server version %q: want MAJOR.MINOR.PATCH", s)
	}
	var n [3]int
	for i, p := range parts {
		v, err := strconv.Atoi(p)
		if err != nil { // no sign gets here: '+' and '-' were cut above
			return ServerVersion{}, fmt.Errorf("nats-server version %q: %q is not a number", s, p)
		}
		n[i] = v
	}
	return ServerVersion{Major: n[0], Minor: n[1], Patch: n[2], Pre: pre}, nil
}

// ConsumerResetSupported says whether a server of the given version answers
// a consumer reset: whether it is MinResetVersion or later. A pre-release
// of MinResetVersion (2.14.0-RC.1) sorts before it and counts as too old:
// which release candidate first carried the reset is not something a
// version string tells. An unparsable version is an error.
func ConsumerResetSupported(version string) (bool, error) {
	v, err := ParseServerVersion(version)
	if err != nil {
		return false, err
	}
	return !v.Less(minReset), nil
}

var minReset = func() ServerVersion {
	v, err := ParseServerVersion(MinResetVersion)
	if err != nil {
		panic(err) // a constant: a typo is a programming error
	}
	return v
}()

// loggedVersions are the server versions a warning was logged for, so that
// a process with several connections (the all-in-one binary) and a
// connection reconnecting to servers of the same release say it once.
var loggedVersions sync.Map

// CheckServer checks the server nc is connected to can reset consumers,
// and logs an error naming its version, the minimum and what degrades if
// it cannot (once per version and process). It returns the answer; a
// version that cannot be read is logged and reported unsupported.
func CheckServer(nc *nats.Conn, log *zap.Logger) bool {
	return checkServerVersion(nc.ConnectedServerVersion(), nc.ConnectedServerName(), log, &loggedVersions)
}

// checkServerVersion is CheckServer for a server's announced version and
// name, logging once per version recorded in logged.
func checkServerVersion(version, name string, log *zap.Logger, logged *sync.Map) bool {
	ok, err := ConsumerResetSupported(version)
	if ok {
		return true
	}
	if log == nil {
		return false
	}
	if _, seen := logged.LoadOrStore(version, true); seen {
		return false
	}
	fields := []zap.Field{zap.String("serverVersion", version), zap.String("server", name),
		zap.String("minimumVersion", MinResetVersion), zap.String("testedVersion", BuiltServerVersion)}
	if err != nil {
		fields = append(fields, zap.Error(err))
	}
	log.Error("NATS server too old to reset consumers: every partition handover will wait for the reset to time out, "+
		"and what the previous owner held is delivered again only after AckWait, counted as redelivered; upgrade NATS to "+
		MinResetVersion+" or later ("+ServerImage+" is the tested release)", fields...)
	return false
}
