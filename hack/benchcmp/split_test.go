package main

import (
	"math"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// TestNatsConfig: the dev server's configuration gets the run's loopback
// ports and store and keeps every other setting; a layout without exactly
// one of the three settings is refused rather than run at nats-server's
// defaults.
func TestNatsConfig(t *testing.T) {
	const dev = `server_name: metabus-dev
listen: 0.0.0.0:4222
http_port: 8222
max_payload: 8MB

jetstream {
  store_dir: "/data"
  max_memory_store: 64MB
}
`
	for _, tc := range []struct {
		reason, base, want, err string
	}{
		{"the three settings replaced, indentation and the rest kept", dev, `server_name: metabus-dev
listen: 127.0.0.1:1
http: 127.0.0.1:2
max_payload: 8MB

jetstream {
  store_dir: "/tmp/x $y/nats"
  max_memory_store: 64MB
}
`, ""},
		{"no store_dir: refused", "listen: a\nhttp_port: 1\njetstream {}\n", "", "want one store_dir setting, found 0"},
		{"two listen lines: refused", "listen: a\nlisten: b\nhttp_port: 1\nstore_dir: x\n", "", "want one listen setting, found 2"},
		{"a setting's name inside another's is not it", "listen: a\nhttp_port: 1\nstore_dir: x\nmy_listen: c\n", "listen: 127.0.0.1:1\nhttp: 127.0.0.1:2\nstore_dir: \"/tmp/x $y/nats\"\nmy_listen: c\n", ""},
	} {
		t.Run(tc.reason, func(t *testing.T) {
			got, err := natsConfig(tc.base, "127.0.0.1:1", "127.0.0.1:2", "/tmp/x $y/nats")
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("error %v, want one containing %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("configuration (-want +got):\n%s", diff)
			}
		})
	}
}

// TestNatsConfigOfCompose: the file docker-compose.yaml runs is one
// natsConfig can rewrite, so metabus-split runs what ships.
func TestNatsConfigOfCompose(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("..", "..", natsDevConf))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := natsConfig(string(b), "127.0.0.1:1", "127.0.0.1:2", "/tmp/nats"); err != nil {
		t.Fatal(err)
	}
}

func TestStageFigures(t *testing.T) {
	for _, tc := range []struct {
		reason string
		values map[string]float64
		want   figures
	}{
		{"one process: its value under the key alone", map[string]float64{"controller": 3}, figures{"k": 3}},
		{"no process (the raw writer): no figure", nil, figures{}},
		{"the split deployment: the sum under the key, each stage under key.<stage>",
			map[string]float64{"watcher": 1, "dispatcher": 2, "nats-server": 4.5},
			figures{"k": 7.5, "k.watcher": 1, "k.dispatcher": 2, "k.nats-server": 4.5}},
	} {
		t.Run(tc.reason, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, stageFigures("k", tc.values)); diff != "" {
				t.Errorf("figures (-want +got):\n%s", diff)
			}
		})
	}
}

// TestStageRows: the rows of per-stage figures are followed by one row per
// stage; the others are left alone.
func TestStageRows(t *testing.T) {
	rows := []row{
		{key: "b1.rate", label: "rate", prec: 1},
		{key: "b1.cpu.controller", label: "B1 CPU ms / parent: controller", prec: 2},
		{key: "b1.cpu.etcd", label: "etcd", prec: 2},
		{key: "idle.cpu", label: "idle", prec: 1},
	}
	want := []row{
		{key: "b1.rate", label: "rate", prec: 1},
		{key: "b1.cpu.controller", label: "B1 CPU ms / parent: controller", prec: 2},
		{key: "b1.cpu.controller.watcher", label: "B1 CPU ms / parent: controller, of which watcher", prec: 2},
		{key: "b1.cpu.controller.nats-server", label: "B1 CPU ms / parent: controller, of which nats-server", prec: 2},
		{key: "b1.cpu.etcd", label: "etcd", prec: 2},
		{key: "idle.cpu", label: "idle", prec: 1},
		{key: "idle.cpu.watcher", label: "idle, of which watcher", prec: 1},
		{key: "idle.cpu.nats-server", label: "idle, of which nats-server", prec: 1},
	}
	if diff := cmp.Diff(want, stageRows(rows, []string{"watcher", "nats-server"}), cmp.AllowUnexported(row{})); diff != "" {
		t.Errorf("rows (-want +got):\n%s", diff)
	}
}

// fakeCtrl is a single-process contender (pid) or the raw writer (0).
type fakeCtrl int

func (f fakeCtrl) PID() int             { return int(f) }
func (f fakeCtrl) Stop() error          { return nil }
func (fakeSplit) PID() int              { return 0 }
func (fakeSplit) Stop() error           { return nil }
func (f fakeSplit) Stages() []stageProc { return f }

type fakeSplit []stageProc

func TestProcessesOf(t *testing.T) {
	split := fakeSplit{{"nats-server", 10}, {"watcher", 11}}
	for _, tc := range []struct {
		reason string
		c      controller
		want   []stageProc
	}{
		{"the raw writer runs in the harness", fakeCtrl(0), nil},
		{"one process is the controller", fakeCtrl(42), []stageProc{{"controller", 42}}},
		{"the split deployment lists its stages, though it has no single PID", split, []stageProc(split)},
	} {
		t.Run(tc.reason, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, processesOf(tc.c), cmp.AllowUnexported(stageProc{})); diff != "" {
				t.Errorf("processes (-want +got):\n%s", diff)
			}
		})
	}
}

// TestSplitAndLateIdleRows: the late idle row is there unless -late-idle
// is 0, and the per-stage rows only when metabus-split runs.
func TestSplitAndLateIdleRows(t *testing.T) {
	keys := func(late time.Duration, contenders ...string) []string {
		cfg := &config{parents: 10, b8Controllers: 1, lateIdle: late, contenders: contenders, scenarios: map[string]bool{"B1": true, "B5": true}}
		var out []string
		for _, r := range tableRows(cfg) {
			if strings.Contains(r.key, "idle") || strings.HasPrefix(r.key, "b5.") || strings.HasPrefix(r.key, "b1.cpu.controller") {
				out = append(out, r.key)
			}
		}
		return out
	}
	for _, tc := range []struct {
		reason     string
		late       time.Duration
		contenders []string
		want       []string
	}{
		{"defaults without split: one row each", time.Minute, []string{"metabus"},
			[]string{"b1.cpu.controller", "b5.rss", "b1.idle", "b1.idlelate", "idle.cpu"}},
		{"-late-idle 0: no late row", 0, []string{"metabus"},
			[]string{"b1.cpu.controller", "b5.rss", "b1.idle", "idle.cpu"}},
		{"with split: each followed by its stages", time.Minute, []string{"metabus", "metabus-split"}, func() []string {
			var out []string
			for _, k := range []string{"b1.cpu.controller", "b5.rss", "b1.idle", "b1.idlelate", "idle.cpu"} {
				out = append(out, k)
				for _, s := range splitStages {
					out = append(out, k+"."+s)
				}
			}
			return out
		}()},
	} {
		t.Run(tc.reason, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, keys(tc.late, tc.contenders...)); diff != "" {
				t.Errorf("rows (-want +got):\n%s", diff)
			}
		})
	}
}

func TestParseSchedstat(t *testing.T) {
	for _, tc := range []struct {
		reason, in string
		want       uint64
		err        bool
	}{
		{"run time, wait time, timeslices: the first", "123456789 2000 17\n", 123456789, false},
		{"too few fields", "1 2\n", 0, true},
		{"not a number", "x 2 3\n", 0, true},
	} {
		t.Run(tc.reason, func(t *testing.T) {
			got, err := parseSchedstat(tc.in)
			if (err != nil) != tc.err {
				t.Fatalf("error %v, want error: %v", err, tc.err)
			}
			if got != tc.want {
				t.Errorf("got %d, want %d", got, tc.want)
			}
		})
	}
}

// TestCPUReadingSince: an idle window counts the nanosecond figure, and
// the ticks' when that is missing or fell (a thread exited with its time).
func TestCPUReadingSince(t *testing.T) {
	for _, tc := range []struct {
		reason string
		a, b   cpuReading
		want   float64
	}{
		{"both exact: the exact difference", cpuReading{ticks: 2, exact: 1.25, exactOK: true}, cpuReading{ticks: 1, exact: 1, exactOK: true}, 0.25},
		{"the earlier reading not exact: ticks", cpuReading{ticks: 2, exact: 1.25, exactOK: true}, cpuReading{ticks: 1.5}, 0.5},
		{"exact fell (a thread exited): ticks", cpuReading{ticks: 2, exact: 0.5, exactOK: true}, cpuReading{ticks: 1.9, exact: 1, exactOK: true}, 0.1},
	} {
		t.Run(tc.reason, func(t *testing.T) {
			if got := tc.a.since(tc.b); math.Abs(got-tc.want) > 1e-9 {
				t.Errorf("got %v, want %v", got, tc.want)
			}
		})
	}
}

// TestProcCPUExact: this process's threads add up to what getrusage says
// it used, however loaded the machine (it spins for CPU time, not for wall
// time).
func TestProcCPUExact(t *testing.T) {
	rusage := func() float64 {
		var ru syscall.Rusage
		if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
			t.Fatal(err)
		}
		return float64(ru.Utime.Nano()+ru.Stime.Nano()) / 1e9
	}
	a, err := procCPUExact(os.Getpid())
	if err != nil {
		t.Skipf("no schedstat here: %v", err)
	}
	r0 := rusage()
	for rusage()-r0 < 0.03 {
	}
	used := rusage() - r0
	b, err := procCPUExact(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if b-a < 0.9*used {
		t.Errorf("%.6f s of CPU (getrusage) counted as %.6f s", used, b-a)
	}
}
