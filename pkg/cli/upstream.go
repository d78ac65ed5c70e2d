package cli

import (
	"errors"
	"flag"
	"fmt"
	"strconv"
	"time"
)

// Stage is what a binary runs: one service, or all of them (the all-in-one
// `metabus`). Its value also names the readiness check that stays pending
// until the service registers its own under the same name (the watcher's
// "watcher", internal/allinone's "metabus").
type Stage string

// The stages.
const (
	AllInOne   Stage = "metabus"
	Watcher    Stage = "watcher"
	Dispatcher Stage = "dispatcher"
	Applier    Stage = "applier"
	Revisions  Stage = "revisions"
)

// flagKind is the type of an upstream flag, so that a stage that does not
// use the flag still parses its value as upstream would (a bool takes no
// value, a duration must be one).
type flagKind int

const (
	kindString flagKind = iota
	kindBool
	kindInt
	kindFloat
	kindDuration
)

// upstreamFlag is one flag of upstream Metacontroller v4.17 (its main
// package, controller-runtime's --kubeconfig and zap options).
type upstreamFlag struct {
	name string
	kind flagKind
	def  string
}

// UpstreamFlags are upstream Metacontroller v4.17's flags, every one
// accepted by every metabus binary: a manifest written for upstream runs
// unchanged. Where metabus has the flag it keeps upstream's meaning; where
// a stage has no use for it, the stage says so once at start (ignored).
var upstreamFlags = []upstreamFlag{
	{"kubeconfig", kindString, ""},
	{"discovery-interval", kindDuration, "30s"},
	{"cache-flush-interval", kindDuration, "30m"},
	{"metrics-address", kindString, ":9999"},
	{"client-go-qps", kindFloat, "5"},
	{"client-go-burst", kindInt, "10"},
	{"workers", kindInt, "5"},
	{"events-qps", kindFloat, "0.0033333333333333335"},
	{"events-burst", kindInt, "25"},
	{"pprof-address", kindString, "0"},
	{"leader-election", kindBool, "false"},
	{"leader-election-resource-lock", kindString, LeaseLock},
	{"leader-election-namespace", kindString, ""},
	{"leader-election-id", kindString, "metacontroller"},
	{"health-probe-bind-address", kindString, ":8081"},
	{"target-label-selector", kindString, ""},
	{"apply-strategy", kindString, ApplyDynamic},
	{"apply-strategy-ssa-field-manager", kindString, "metacontroller"},
	{"zap-devel", kindBool, "false"},
	{"zap-encoder", kindString, ""},
	{"zap-log-level", kindString, ""},
	{"zap-stacktrace-level", kindString, ""},
	{"zap-time-encoding", kindString, ""},
}

// UpstreamFlagNames lists upstream's flags in upstream's order.
func UpstreamFlagNames() []string {
	names := make([]string, len(upstreamFlags))
	for i, f := range upstreamFlags {
		names[i] = f.name
	}
	return names
}

// Why a stage has no use for a flag, shared by the stages it applies to.
const (
	whyWatcherResyncs = "the watcher resyncs every parent at this interval; set it there"
	whyLeases         = "its replicas share the work through partition leases on NATS, all of them working; only the watcher elects a leader"
	whyQueueGroup     = "every replica answers requests (a NATS queue group); only the watcher elects a leader"
	whyWatcherSelects = "the watcher selects the controllers and publishes work only for those; set it there"
	whyApplier        = "the applier applies children and writes parent status; set it there"
)

// ignoredBy says, per stage, which upstream flags mean nothing to it and
// why. The all-in-one runs every stage, so it uses them all.
var ignoredBy = map[Stage]map[string]string{
	Watcher: {
		"workers":                          "the watcher publishes work items rather than syncing (--publish-workers sets its publishers); the dispatcher and applier use it",
		"apply-strategy":                   whyApplier,
		"apply-strategy-ssa-field-manager": whyApplier,
	},
	Dispatcher: {
		"discovery-interval":               "the dispatcher resolves no resources (the watcher and the applier do)",
		"cache-flush-interval":             whyWatcherResyncs,
		"leader-election":                  whyLeases,
		"leader-election-resource-lock":    whyLeases,
		"leader-election-namespace":        whyLeases,
		"leader-election-id":               whyLeases,
		"target-label-selector":            whyWatcherSelects,
		"apply-strategy":                   whyApplier,
		"apply-strategy-ssa-field-manager": whyApplier,
	},
	Applier: {
		"cache-flush-interval":          whyWatcherResyncs,
		"leader-election":               whyLeases,
		"leader-election-resource-lock": whyLeases,
		"leader-election-namespace":     whyLeases,
		"leader-election-id":            whyLeases,
		"target-label-selector":         whyWatcherSelects,
	},
	Revisions: {
		"discovery-interval":               "the revisions service only reads and writes ControllerRevisions, whose resource is fixed",
		"cache-flush-interval":             whyWatcherResyncs,
		"workers":                          "the revisions service answers --revisions-concurrency requests at once",
		"events-qps":                       "the revisions service records no Events",
		"events-burst":                     "the revisions service records no Events",
		"leader-election":                  whyQueueGroup,
		"leader-election-resource-lock":    whyQueueGroup,
		"leader-election-namespace":        whyQueueGroup,
		"leader-election-id":               whyQueueGroup,
		"target-label-selector":            whyWatcherSelects,
		"apply-strategy":                   whyApplier,
		"apply-strategy-ssa-field-manager": whyApplier,
	},
}

// ignoredReason is why stage ignores flag ("" if it uses it).
func ignoredReason(stage Stage, name string) string { return ignoredBy[stage][name] }

// acceptUpstream defines, on fs, every upstream flag the stage's own
// registration left undefined, typed as upstream's, so that it parses as
// it did there. Each must be one the stage ignores: a flag the stage needs
// but nobody defined is a programming error.
func acceptUpstream(fs *flag.FlagSet, stage Stage) error {
	for _, f := range upstreamFlags {
		if fs.Lookup(f.name) != nil {
			continue
		}
		why := ignoredReason(stage, f.name)
		if why == "" {
			return fmt.Errorf("upstream flag --%s is neither defined nor ignored by the %s stage", f.name, stage)
		}
		usage := "accepted as upstream Metacontroller's flag; ignored: " + why
		switch f.kind {
		case kindBool:
			v, _ := strconv.ParseBool(f.def)
			fs.Bool(f.name, v, usage)
		case kindInt:
			v, _ := strconv.Atoi(f.def)
			fs.Int(f.name, v, usage)
		case kindFloat:
			v, _ := strconv.ParseFloat(f.def, 64)
			fs.Float64(f.name, v, usage)
		case kindDuration:
			v, _ := time.ParseDuration(f.def)
			fs.Duration(f.name, v, usage)
		default:
			fs.String(f.name, f.def, usage)
		}
	}
	return nil
}

// UpstreamDefault is upstream Metacontroller v4.17's default of its flag
// name, as upstream registers it ("" for a flag whose unset value leaves
// the choice to the library behind it); ok is false for a flag upstream
// does not have.
func UpstreamDefault(name string) (def string, ok bool) {
	for _, f := range upstreamFlags {
		if f.name == name {
			return f.def, true
		}
	}
	return "", false
}

// SameAsUpstreamDefault says whether value, a default as a metabus flag
// set prints it, is upstream's default of the upstream flag name,
// compared as upstream's type: 30m and 30m0s are one duration, 5 and 5.0
// one rate.
func SameAsUpstreamDefault(name, value string) (bool, error) {
	for _, f := range upstreamFlags {
		if f.name != name {
			continue
		}
		switch f.kind {
		case kindBool:
			a, err1 := strconv.ParseBool(f.def)
			b, err2 := strconv.ParseBool(value)
			return a == b, errors.Join(err1, err2)
		case kindInt:
			a, err1 := strconv.Atoi(f.def)
			b, err2 := strconv.Atoi(value)
			return a == b, errors.Join(err1, err2)
		case kindFloat:
			a, err1 := strconv.ParseFloat(f.def, 64)
			b, err2 := strconv.ParseFloat(value, 64)
			return a == b, errors.Join(err1, err2)
		case kindDuration:
			a, err1 := time.ParseDuration(f.def)
			b, err2 := time.ParseDuration(value)
			return a == b, errors.Join(err1, err2)
		default:
			return f.def == value, nil
		}
	}
	return false, fmt.Errorf("--%s is not an upstream flag", name)
}

// Ignores says whether the stage has no use for the upstream flag name
// (and so accepts it with upstream's default and logs that it ignores it).
func (s Stage) Ignores(name string) bool { return ignoredReason(s, name) != "" }
