package childproc

import (
	"context"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// helperEnv makes the test binary, started as a child, serve readiness
// on the address it names instead of running the tests.
const helperEnv = "CHILDPROC_TEST_SERVE"

func TestMain(m *testing.M) {
	if addr := os.Getenv(helperEnv); addr != "" {
		http.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok")) })
		_ = http.ListenAndServe(addr, nil)
		os.Exit(2)
	}
	os.Exit(m.Run())
}

// TestStartReadyAndStop: a child whose readiness URL answers is returned
// running, and Stop ends it with SIGTERM.
func TestStartReadyAndStop(t *testing.T) {
	addr, err := FreeAddr()
	if err != nil {
		t.Fatal(err)
	}
	log := filepath.Join(t.TempDir(), "child.log")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	p, err := Start(ctx, "helper", os.Args[0], nil, []string{helperEnv + "=" + addr}, log, "http://"+addr+"/readyz")
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	if done, err := p.Exited(); done {
		t.Fatalf("exited right after start: %v", err)
	}
	if p.PID() <= 0 || p.LogPath() != log {
		t.Errorf("PID %d, log %q", p.PID(), p.LogPath())
	}
	if err := p.Stop(); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	if done, _ := p.Exited(); !done {
		t.Error("still running after Stop")
	}
	if err := p.Stop(); err != nil {
		t.Errorf("second Stop: %v", err)
	}
}

// TestStartExitsEarly: a child that exits before it is ready is an error
// naming its log, returned at once rather than after the ready timeout.
func TestStartExitsEarly(t *testing.T) {
	addr, err := FreeAddr()
	if err != nil {
		t.Fatal(err)
	}
	log := filepath.Join(t.TempDir(), "child.log")
	start := time.Now()
	_, err = Start(context.Background(), "failing", "/bin/sh", []string{"-c", "echo broken flag >&2; exit 3"}, nil, log, "http://"+addr+"/readyz")
	if err == nil || !strings.Contains(err.Error(), "exited during startup") || !strings.Contains(err.Error(), log) {
		t.Fatalf("err = %v, want an exit during startup naming %s", err, log)
	}
	if took := time.Since(start); took > 20*time.Second {
		t.Errorf("took %s to notice the exit", took)
	}
	if data, _ := os.ReadFile(log); !strings.Contains(string(data), "broken flag") {
		t.Errorf("log %q lacks the child's output", data)
	}
}

// TestStartMissingBinary: a path that is no program is an error.
func TestStartMissingBinary(t *testing.T) {
	_, err := Start(context.Background(), "missing", filepath.Join(t.TempDir(), "nope"), nil, nil,
		filepath.Join(t.TempDir(), "x.log"), "http://127.0.0.1:1/readyz")
	if err == nil || !strings.Contains(err.Error(), "start missing") {
		t.Fatalf("err = %v", err)
	}
}
