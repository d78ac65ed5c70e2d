package obs

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

func TestParseLevel(t *testing.T) {
	cases := []struct {
		reason  string
		in      string
		want    zapcore.Level
		wantErr string
	}{
		{reason: "level name", in: "debug", want: zapcore.DebugLevel},
		{reason: "level name", in: "info", want: zapcore.InfoLevel},
		{reason: "level name", in: "warn", want: zapcore.WarnLevel},
		{reason: "level name", in: "error", want: zapcore.ErrorLevel},
		{reason: "names are case-insensitive", in: "DEBUG", want: zapcore.DebugLevel},
		{reason: "names are case-insensitive", in: "Error", want: zapcore.ErrorLevel},
		{reason: "empty is zap's zero value, info", in: "", want: zapcore.InfoLevel},
		{reason: "verbosity 0 is info", in: "0", want: zapcore.InfoLevel},
		{reason: "verbosity 1 is debug", in: "1", want: zapcore.DebugLevel},
		{reason: "verbosity 4 logs upstream's V(4) API actions", in: "4", want: zapcore.Level(-4)},
		{reason: "verbosity 5 logs diffs", in: "5", want: zapcore.Level(-5)},
		{reason: "verbosity 6 logs hook bodies", in: "6", want: zapcore.Level(-6)},
		{reason: "verbosity 10", in: "10", want: zapcore.Level(-10)},
		{reason: "the most verbose level zap can represent", in: "128", want: zapcore.Level(-128)},
		{reason: "a negative verbosity is rejected", in: "-1", wantErr: "must not be negative"},
		{reason: "unknown names are rejected, quoted", in: "verbose", wantErr: `unknown log level "verbose"`},
		{reason: "a fraction is not a verbosity", in: "1.5", wantErr: `unknown log level "1.5"`},
		{reason: "padding is not accepted", in: " info", wantErr: "unknown log level"},
	}
	for _, tc := range cases {
		t.Run(tc.reason+"/"+tc.in, func(t *testing.T) {
			got, err := ParseLevel(tc.in)
			if tc.wantErr != "" {
				if err == nil {
					t.Fatalf("%s: ParseLevel(%q) = %v, want error containing %q", tc.reason, tc.in, got, tc.wantErr)
				}
				if !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("%s: ParseLevel(%q) error %q does not contain %q", tc.reason, tc.in, err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("%s: ParseLevel(%q): %v", tc.reason, tc.in, err)
			}
			if got != tc.want {
				t.Errorf("%s: ParseLevel(%q) = %d, want %d", tc.reason, tc.in, got, tc.want)
			}
		})
	}
}

// A verbosity must only ever make logging more verbose: whatever n is, error
// messages stay enabled.
func TestParseLevelLargeVerbosityKeepsErrors(t *testing.T) {
	for _, in := range []string{"127", "128", "129", "200", "255", "1000"} {
		l, err := ParseLevel(in)
		if err != nil {
			// Rejecting out-of-range verbosities would be fine too.
			continue
		}
		if !l.Enabled(zapcore.ErrorLevel) || !l.Enabled(zapcore.DebugLevel) {
			t.Errorf("ParseLevel(%q) = %d: error/debug logging disabled by a high verbosity", in, l)
		}
	}
}

func TestLogFlagsRegister(t *testing.T) {
	var f LogFlags
	fs := flag.NewFlagSet("test", flag.ContinueOnError)
	f.Register(fs)
	// An empty level means "the mode's default": info, or debug with
	// --zap-devel.
	if f.Level != "" || f.Devel || f.Encoder != "" || f.TimeEnc != "iso8601" {
		t.Fatalf("defaults = %+v, want no level override, no devel, no encoder, iso8601", f)
	}
	if err := fs.Parse([]string{"--zap-log-level=5", "--zap-devel", "--zap-encoder=json", "--zap-time-encoding=rfc3339", "--zap-stacktrace-level=error"}); err != nil {
		t.Fatal(err)
	}
	want := LogFlags{Level: "5", Devel: true, Encoder: "json", TimeEnc: "rfc3339", Stacktrace: "error"}
	if f != want {
		t.Fatalf("parsed = %+v, want %+v", f, want)
	}
}

// captureLogger builds a logger with NewLogger while os.Stderr is a file
// (zap resolves "stderr" when the logger is built), and returns a function
// that syncs the logger and returns what it wrote.
func captureLogger(t *testing.T, f LogFlags) (*zap.Logger, func() string) {
	t.Helper()
	out, err := os.CreateTemp(t.TempDir(), "stderr")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = out.Close() })
	orig := os.Stderr
	os.Stderr = out
	l, err := NewLogger(f)
	os.Stderr = orig
	if err != nil {
		t.Fatalf("NewLogger(%+v): %v", f, err)
	}
	return l, func() string {
		_ = l.Sync()
		data, err := os.ReadFile(out.Name())
		if err != nil {
			t.Fatal(err)
		}
		return string(data)
	}
}

func lines(s string) []string {
	var out []string
	sc := bufio.NewScanner(strings.NewReader(s))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		if strings.TrimSpace(sc.Text()) != "" {
			out = append(out, sc.Text())
		}
	}
	return out
}

func decodeJSONLine(t *testing.T, line string) map[string]any {
	t.Helper()
	var m map[string]any
	d := json.NewDecoder(strings.NewReader(line))
	d.UseNumber()
	if err := d.Decode(&m); err != nil {
		t.Fatalf("log line %q is not JSON: %v", line, err)
	}
	return m
}

func TestNewLoggerLevels(t *testing.T) {
	cases := []struct {
		reason   string
		flags    LogFlags
		enabled  []zapcore.Level
		disabled []zapcore.Level
	}{
		{reason: "zero flags: production info", flags: LogFlags{}, enabled: []zapcore.Level{zapcore.InfoLevel, zapcore.ErrorLevel}, disabled: []zapcore.Level{zapcore.DebugLevel}},
		{reason: "debug", flags: LogFlags{Level: "debug"}, enabled: []zapcore.Level{zapcore.DebugLevel}, disabled: []zapcore.Level{zapcore.Level(-2)}},
		{reason: "error hides info", flags: LogFlags{Level: "error"}, enabled: []zapcore.Level{zapcore.ErrorLevel}, disabled: []zapcore.Level{zapcore.InfoLevel, zapcore.WarnLevel}},
		{reason: "verbosity 4 enables V(4) but not V(5)", flags: LogFlags{Level: "4"}, enabled: []zapcore.Level{zapcore.Level(-4), zapcore.DebugLevel, zapcore.InfoLevel}, disabled: []zapcore.Level{zapcore.Level(-5)}},
		{reason: "devel without a level is debug", flags: LogFlags{Devel: true}, enabled: []zapcore.Level{zapcore.DebugLevel}, disabled: []zapcore.Level{zapcore.Level(-2)}},
		{reason: "an explicit level wins over devel", flags: LogFlags{Devel: true, Level: "error"}, enabled: []zapcore.Level{zapcore.ErrorLevel}, disabled: []zapcore.Level{zapcore.InfoLevel}},
	}
	for _, tc := range cases {
		t.Run(tc.reason, func(t *testing.T) {
			l, err := NewLogger(tc.flags)
			if err != nil {
				t.Fatalf("%s: NewLogger: %v", tc.reason, err)
			}
			for _, lvl := range tc.enabled {
				if !l.Core().Enabled(lvl) {
					t.Errorf("%s: level %d disabled", tc.reason, lvl)
				}
			}
			for _, lvl := range tc.disabled {
				if l.Core().Enabled(lvl) {
					t.Errorf("%s: level %d enabled", tc.reason, lvl)
				}
			}
		})
	}
}

func TestNewLoggerErrors(t *testing.T) {
	cases := []struct {
		reason  string
		flags   LogFlags
		wantErr string
	}{
		{reason: "an unknown level", flags: LogFlags{Level: "loud"}, wantErr: `unknown log level "loud"`},
		{reason: "a negative verbosity", flags: LogFlags{Level: "-3"}, wantErr: "must not be negative"},
		{reason: "an unknown encoder", flags: LogFlags{Encoder: "xml"}, wantErr: "build logger"},
		{reason: "an unknown stacktrace level", flags: LogFlags{Stacktrace: "warn"}, wantErr: `unknown stacktrace level "warn"`},
	}
	for _, tc := range cases {
		t.Run(tc.reason, func(t *testing.T) {
			l, err := NewLogger(tc.flags)
			if err == nil {
				t.Fatalf("%s: NewLogger(%+v) = %v, want error", tc.reason, tc.flags, l)
			}
			if !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("%s: error %q does not contain %q", tc.reason, err, tc.wantErr)
			}
		})
	}
}

func TestNewLoggerOutput(t *testing.T) {
	cases := []struct {
		reason string
		flags  LogFlags
		check  func(t *testing.T, out string)
	}{
		{
			reason: "production: JSON with an ISO8601 time, level and message",
			flags:  LogFlags{},
			check: func(t *testing.T, out string) {
				ls := lines(out)
				if len(ls) == 0 {
					t.Fatal("no output")
				}
				m := decodeJSONLine(t, ls[0])
				if m["msg"] != "hello" || m["level"] != "info" || m["k"] != "v" {
					t.Errorf("entry = %v", m)
				}
				ts, ok := m["ts"].(string)
				if !ok {
					t.Fatalf("ts = %#v, want an ISO8601 string", m["ts"])
				}
				if _, err := time.Parse("2006-01-02T15:04:05.000Z0700", ts); err != nil {
					t.Errorf("ts %q is not ISO8601: %v", ts, err)
				}
			},
		},
		{
			reason: "production: errors carry no stack trace",
			flags:  LogFlags{},
			check: func(t *testing.T, out string) {
				for _, line := range lines(out) {
					m := decodeJSONLine(t, line)
					if _, ok := m["stacktrace"]; ok {
						t.Errorf("entry has a stack trace: %v", m)
					}
				}
			},
		},
		{
			reason: "no sampling: repeated messages are all written",
			flags:  LogFlags{},
			check: func(t *testing.T, out string) {
				n := 0
				for _, line := range lines(out) {
					if decodeJSONLine(t, line)["msg"] == "repeat" {
						n++
					}
				}
				if n != 250 {
					t.Errorf("%d of 250 repeated entries written", n)
				}
			},
		},
		{
			reason: "console encoder",
			flags:  LogFlags{Encoder: "console"},
			check: func(t *testing.T, out string) {
				ls := lines(out)
				if len(ls) == 0 || strings.HasPrefix(ls[0], "{") || !strings.Contains(ls[0], "hello") || !strings.Contains(ls[0], "info") {
					t.Errorf("first line %q is not a console entry", ls)
				}
			},
		},
		{
			reason: "devel: console, debug entries and stack traces on warnings",
			flags:  LogFlags{Devel: true},
			check: func(t *testing.T, out string) {
				if strings.HasPrefix(out, "{") {
					t.Errorf("devel output is JSON: %q", out)
				}
				if !strings.Contains(out, "dbg-entry") {
					t.Errorf("debug entry missing: %q", out)
				}
				i := strings.Index(out, "warn-entry")
				if i < 0 {
					t.Fatalf("warn entry missing: %q", out)
				}
				if !strings.Contains(out[i:], "obs.TestNewLoggerOutput") {
					t.Errorf("no stack trace after the warning: %q", out[i:])
				}
			},
		},
		{
			reason: "devel with the JSON encoder",
			flags:  LogFlags{Devel: true, Encoder: "json"},
			check: func(t *testing.T, out string) {
				// zap's development encoder config names the message "M".
				ls := lines(out)
				if len(ls) < 2 {
					t.Fatalf("output %q", out)
				}
				if m := decodeJSONLine(t, ls[0]); m["M"] != "dbg-entry" || m["L"] != "DEBUG" {
					t.Errorf("first entry = %v, want the debug entry", m)
				}
				if m := decodeJSONLine(t, ls[1]); m["M"] != "hello" || m["k"] != "v" {
					t.Errorf("second entry = %v, want hello", m)
				}
			},
		},
		{
			reason: "epoch time encoding: seconds as a number",
			flags:  LogFlags{TimeEnc: "epoch"},
			check: func(t *testing.T, out string) {
				m := decodeJSONLine(t, lines(out)[0])
				ts, err := m["ts"].(json.Number).Float64()
				if err != nil || ts < 1e9 || ts > 1e10 {
					t.Errorf("ts = %v, want epoch seconds", m["ts"])
				}
			},
		},
		{
			reason: "millis time encoding",
			flags:  LogFlags{TimeEnc: "millis"},
			check: func(t *testing.T, out string) {
				m := decodeJSONLine(t, lines(out)[0])
				ts, err := m["ts"].(json.Number).Float64()
				if err != nil || ts < 1e12 || ts > 1e13 {
					t.Errorf("ts = %v, want epoch milliseconds", m["ts"])
				}
			},
		},
		{
			reason: "rfc3339 time encoding",
			flags:  LogFlags{TimeEnc: "rfc3339"},
			check: func(t *testing.T, out string) {
				m := decodeJSONLine(t, lines(out)[0])
				ts, _ := m["ts"].(string)
				if _, err := time.Parse(time.RFC3339, ts); err != nil || strings.Contains(ts, ".") {
					t.Errorf("ts = %v, want RFC3339 without fraction", m["ts"])
				}
			},
		},
		{
			reason: "rfc3339nano time encoding",
			flags:  LogFlags{TimeEnc: "rfc3339nano"},
			check: func(t *testing.T, out string) {
				m := decodeJSONLine(t, lines(out)[0])
				ts, _ := m["ts"].(string)
				if _, err := time.Parse(time.RFC3339Nano, ts); err != nil {
					t.Errorf("ts = %v, want RFC3339Nano", m["ts"])
				}
			},
		},
		{
			reason: "--zap-stacktrace-level=info: stack traces from info up, as upstream's flag means",
			flags:  LogFlags{Stacktrace: "info"},
			check: func(t *testing.T, out string) {
				got := map[string]bool{}
				for _, line := range lines(out) {
					m := decodeJSONLine(t, line)
					if m["msg"] == "repeat" {
						continue
					}
					_, has := m["stacktrace"]
					got[m["msg"].(string)] = has
				}
				want := map[string]bool{"hello": true, "warn-entry": true, "err-entry": true}
				if diff := cmp.Diff(want, got); diff != "" {
					t.Errorf("entries with a stack trace (-want +got):\n%s", diff)
				}
			},
		},
		{
			reason: "--zap-stacktrace-level=panic with --zap-devel: no stack trace on errors",
			flags:  LogFlags{Devel: true, Encoder: "json", Stacktrace: "panic"},
			check: func(t *testing.T, out string) {
				for _, line := range lines(out) {
					if m := decodeJSONLine(t, line); m["stacktrace"] != nil {
						t.Errorf("entry has a stack trace: %v", m["msg"])
					}
				}
			},
		},
	}
	for _, tc := range cases {
		t.Run(tc.reason, func(t *testing.T) {
			l, read := captureLogger(t, tc.flags)
			l.Debug("dbg-entry")
			l.Info("hello", zap.String("k", "v"))
			l.Warn("warn-entry")
			l.Error("err-entry", zap.Error(errors.New("boom")))
			for range 250 {
				l.Info("repeat")
			}
			tc.check(t, read())
		})
	}
}

// --zap-time-encoding documents "nano" (upstream controller-runtime's name
// for epoch nanoseconds).
func TestNewLoggerNanoTimeEncoding(t *testing.T) {
	l, read := captureLogger(t, LogFlags{TimeEnc: "nano"})
	l.Info("hello")
	m := decodeJSONLine(t, lines(read())[0])
	ts, err := m["ts"].(json.Number).Int64()
	if err != nil || ts < 1e18 {
		t.Errorf("ts = %v, want integer epoch nanoseconds", m["ts"])
	}
}

// --zap-devel documents "debug level"; with the flag defaults Register sets,
// passing only --zap-devel must give debug logging.
func TestZapDevelFlagEnablesDebug(t *testing.T) {
	var f LogFlags
	fs := flag.NewFlagSet("test", flag.ContinueOnError)
	f.Register(fs)
	if err := fs.Parse([]string{"--zap-devel"}); err != nil {
		t.Fatal(err)
	}
	l, err := NewLogger(f)
	if err != nil {
		t.Fatal(err)
	}
	if !l.Core().Enabled(zapcore.DebugLevel) {
		t.Error("--zap-devel: debug level disabled")
	}
}

func TestNewRegistry(t *testing.T) {
	mfs, err := NewRegistry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	for _, mf := range mfs {
		names[mf.GetName()] = true
	}
	// go_sched_goroutines_goroutines comes from runtime/metrics, which
	// upstream's Go collector exports in full.
	for _, want := range []string{"go_goroutines", "go_memstats_alloc_bytes", "go_sched_goroutines_goroutines", "process_cpu_seconds_total"} {
		if !names[want] {
			t.Errorf("registry lacks %s", want)
		}
	}
}

func TestHealth(t *testing.T) {
	errNATS := errors.New("nats down")
	errCache := errors.New("cache not synced")
	cases := []struct {
		reason string
		setup  func(h *Health)
		// want are substrings of the error; nil means ready.
		want   []string
		wantIs []error
	}{
		{reason: "no checks: not ready (nothing has started)", setup: func(*Health) {}, want: []string{"no component has reported"}, wantIs: []error{ErrNoChecks}},
		{reason: "a pending component is not ready", setup: func(h *Health) {
			h.SetReady("a", func() error { return nil })
			h.Pending("watcher", "starting: waiting for NATS")
		}, want: []string{"watcher: starting: waiting for NATS"}},
		{reason: "a pending check replaced once the component works", setup: func(h *Health) {
			h.Pending("watcher", "starting")
			h.SetReady("watcher", func() error { return nil })
		}},
		{reason: "all checks pass", setup: func(h *Health) {
			h.SetReady("a", func() error { return nil })
			h.SetReady("b", func() error { return nil })
		}},
		{reason: "one failing check is reported with its name", setup: func(h *Health) {
			h.SetReady("a", func() error { return nil })
			h.SetReady("nats", func() error { return errNATS })
		}, want: []string{"nats: nats down"}, wantIs: []error{errNATS}},
		{reason: "every failing check is reported", setup: func(h *Health) {
			h.SetReady("nats", func() error { return errNATS })
			h.SetReady("informers", func() error { return errCache })
			h.SetReady("ok", func() error { return nil })
		}, want: []string{"nats: nats down", "informers: cache not synced"}, wantIs: []error{errNATS, errCache}},
		{reason: "SetReady replaces a check of the same name", setup: func(h *Health) {
			h.SetReady("nats", func() error { return errNATS })
			h.SetReady("nats", func() error { return nil })
		}},
		{reason: "a replaced check can start failing", setup: func(h *Health) {
			h.SetReady("nats", func() error { return nil })
			h.SetReady("nats", func() error { return errNATS })
		}, want: []string{"nats: nats down"}, wantIs: []error{errNATS}},
	}
	for _, tc := range cases {
		t.Run(tc.reason, func(t *testing.T) {
			var h Health
			tc.setup(&h)
			err := h.Ready()
			if len(tc.want) == 0 {
				if err != nil {
					t.Fatalf("%s: Ready() = %v, want nil", tc.reason, err)
				}
				return
			}
			if err == nil {
				t.Fatalf("%s: Ready() = nil, want %v", tc.reason, tc.want)
			}
			for _, s := range tc.want {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("%s: Ready() = %q, lacks %q", tc.reason, err, s)
				}
			}
			for _, e := range tc.wantIs {
				if !errors.Is(err, e) {
					t.Errorf("%s: Ready() = %q does not wrap %v", tc.reason, err, e)
				}
			}
			if strings.Contains(err.Error(), "ok:") {
				t.Errorf("%s: passing check reported: %q", tc.reason, err)
			}
		})
	}
}

func TestHealthIsLive(t *testing.T) {
	// Checks run at each Ready call, not when registered.
	var h Health
	var fail bool
	h.SetReady("x", func() error {
		if fail {
			return errors.New("broken")
		}
		return nil
	})
	if err := h.Ready(); err != nil {
		t.Fatal(err)
	}
	fail = true
	if err := h.Ready(); err == nil || err.Error() != "x: broken" {
		t.Fatalf("Ready() = %v, want x: broken", err)
	}
	fail = false
	if err := h.Ready(); err != nil {
		t.Fatal(err)
	}
}

// TestProbeOnAsk: nothing is probed until the check is asked; an ask
// waits for a quick probe and reports it; asks within maxAge reuse it; a
// slow probe is not waited for beyond wait, and asks while it runs start
// no other; the check follows the probe when it turns.
func TestProbeOnAsk(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var down atomic.Bool
	var probes atomic.Int64
	block := make(chan struct{}, 1)
	slow := atomic.Bool{}
	check := ProbeOnAsk(ctx, 50*time.Millisecond, 200*time.Millisecond, time.Minute, func(ctx context.Context) error {
		probes.Add(1)
		if slow.Load() {
			<-block
		}
		if down.Load() {
			return errors.New("refused")
		}
		return nil
	})
	time.Sleep(100 * time.Millisecond)
	if n := probes.Load(); n != 0 {
		t.Fatalf("%d probes before anyone asked, want 0", n)
	}
	if err := check(); err != nil {
		t.Fatalf("first ask: %v, want the quick probe's nil", err)
	}
	if err := check(); err != nil || probes.Load() != 1 {
		t.Fatalf("second ask within maxAge: %v after %d probes, want nil after 1", err, probes.Load())
	}

	// A slow probe: the ask returns after wait with the last result, and
	// asks meanwhile start no second probe.
	time.Sleep(60 * time.Millisecond)
	slow.Store(true)
	down.Store(true)
	begin := time.Now()
	if err := check(); err != nil {
		t.Fatalf("ask during a slow probe: %v, want the last result (nil)", err)
	}
	if waited := time.Since(begin); waited < 150*time.Millisecond || waited > 5*time.Second {
		t.Errorf("ask during a slow probe waited %v, want about 200ms", waited)
	}
	time.Sleep(60 * time.Millisecond)
	_ = check()
	if n := probes.Load(); n != 2 {
		t.Errorf("%d probes, want 2: asks during a running probe start none", n)
	}
	block <- struct{}{} // the slow probe returns "refused"
	slow.Store(false)
	waitFor := func(what string, ok func(error) bool) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for !ok(check()) {
			if time.Now().After(deadline) {
				t.Fatalf("%s: check still %v", what, check())
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	waitFor("down", func(err error) bool { return err != nil && err.Error() == "refused" })
	down.Store(false)
	waitFor("up", func(err error) bool { return err == nil })

	// Once ctx is done, no probe starts.
	cancel()
	n := probes.Load()
	time.Sleep(60 * time.Millisecond)
	_ = check()
	if got := probes.Load(); got != n {
		t.Errorf("a probe started after ctx was done (%d, then %d)", n, got)
	}
}

// TestProbeOnAskFirst: before a probe has returned the check fails with
// "not checked yet".
func TestProbeOnAskFirst(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	block := make(chan struct{})
	defer close(block)
	check := ProbeOnAsk(ctx, time.Second, 10*time.Millisecond, time.Minute, func(ctx context.Context) error {
		<-block
		return nil
	})
	if err := check(); err == nil || !strings.Contains(err.Error(), "not checked yet") {
		t.Fatalf("before the first probe returned: %v, want not checked yet", err)
	}
}
