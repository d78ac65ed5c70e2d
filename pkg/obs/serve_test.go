package obs

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/zap"
)

// freeAddr returns a loopback address that was free a moment ago (Serve
// takes addresses, not listeners).
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	if err := ln.Close(); err != nil {
		t.Fatal(err)
	}
	return addr
}

var httpClient = &http.Client{Timeout: 5 * time.Second}

// get returns the status and body of GET http://addr/path, or status 0 if
// the request failed.
func get(t *testing.T, addr, path string) (int, string) {
	t.Helper()
	resp, err := httpClient.Get("http://" + addr + path)
	if err != nil {
		return 0, err.Error()
	}
	defer func() { _ = resp.Body.Close() }()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("read %s%s: %v", addr, path, err)
	}
	return resp.StatusCode, string(body)
}

// waitServing polls until addr answers HTTP at all.
func waitServing(t *testing.T, addr string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		resp, err := httpClient.Get("http://" + addr + "/")
		if err == nil {
			_ = resp.Body.Close()
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s is not serving: %v", addr, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// startServe runs Serve in the background and returns a function that
// cancels it and returns its result, failing if it does not return in time.
func startServe(t *testing.T, metricsAddr, healthAddr string, h *Health) (stop func() error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- Serve(ctx, zap.NewNop(), metricsAddr, healthAddr, NewRegistry(), h) }()
	var stopped atomic.Bool
	stop = func() error {
		if !stopped.CompareAndSwap(false, true) {
			return nil
		}
		cancel()
		select {
		case err := <-done:
			return err
		case <-time.After(10 * time.Second):
			t.Fatal("Serve did not return within 10s of ctx cancel")
			return nil
		}
	}
	t.Cleanup(func() { _ = stop() })
	return stop
}

func TestServeSeparateAddresses(t *testing.T) {
	metricsAddr, healthAddr := freeAddr(t), freeAddr(t)
	var h Health
	stop := startServe(t, metricsAddr, healthAddr, &h)
	waitServing(t, metricsAddr)
	waitServing(t, healthAddr)

	cases := []struct {
		reason     string
		addr, path string
		wantCode   int
		wantBody   string
	}{
		{reason: "metrics in Prometheus text format", addr: metricsAddr, path: "/metrics", wantCode: 200, wantBody: "go_goroutines"},
		{reason: "the probes are not on the metrics port", addr: metricsAddr, path: "/healthz", wantCode: 404},
		{reason: "the probes are not on the metrics port", addr: metricsAddr, path: "/readyz", wantCode: 404},
		{reason: "liveness", addr: healthAddr, path: "/healthz", wantCode: 200, wantBody: "ok"},
		{reason: "not ready before any component reported", addr: healthAddr, path: "/readyz", wantCode: 503, wantBody: "no component has reported"},
		{reason: "metrics are not on the probe port", addr: healthAddr, path: "/metrics", wantCode: 404},
	}
	for _, tc := range cases {
		code, body := get(t, tc.addr, tc.path)
		if code != tc.wantCode || !strings.Contains(body, tc.wantBody) {
			t.Errorf("%s: GET %s%s = %d %q, want %d containing %q", tc.reason, tc.addr, tc.path, code, body, tc.wantCode, tc.wantBody)
		}
	}

	// Readiness follows the checks at each request.
	var natsUp atomic.Bool
	h.SetReady("nats", func() error {
		if natsUp.Load() {
			return nil
		}
		return errors.New("not connected")
	})
	if code, body := get(t, healthAddr, "/readyz"); code != http.StatusServiceUnavailable || !strings.Contains(body, "nats: not connected") {
		t.Errorf("readyz with a failing check = %d %q, want 503 naming the check", code, body)
	}
	if code, body := get(t, healthAddr, "/healthz"); code != 200 || body != "ok" {
		t.Errorf("healthz must not depend on readiness: %d %q", code, body)
	}
	natsUp.Store(true)
	if code, body := get(t, healthAddr, "/readyz"); code != 200 || body != "ok" {
		t.Errorf("readyz after recovery = %d %q, want 200 ok", code, body)
	}
	natsUp.Store(false)
	if code, _ := get(t, healthAddr, "/readyz"); code != http.StatusServiceUnavailable {
		t.Errorf("readyz after failing again = %d, want 503", code)
	}

	if err := stop(); err != nil {
		t.Fatalf("Serve returned %v after ctx cancel, want nil", err)
	}
	for _, addr := range []string{metricsAddr, healthAddr} {
		if code, body := get(t, addr, "/healthz"); code != 0 {
			t.Errorf("%s still answers after Serve returned: %d %q", addr, code, body)
		}
	}
}

func TestServeSharedAddress(t *testing.T) {
	addr := freeAddr(t)
	var h Health
	h.SetReady("x", func() error { return errors.New("warming up") })
	stop := startServe(t, addr, addr, &h)
	waitServing(t, addr)
	cases := []struct {
		path     string
		wantCode int
		wantBody string
	}{
		{path: "/metrics", wantCode: 200, wantBody: "process_cpu_seconds_total"},
		{path: "/healthz", wantCode: 200, wantBody: "ok"},
		{path: "/readyz", wantCode: 503, wantBody: "x: warming up"},
		{path: "/other", wantCode: 404},
	}
	for _, tc := range cases {
		code, body := get(t, addr, tc.path)
		if code != tc.wantCode || !strings.Contains(body, tc.wantBody) {
			t.Errorf("one address serves all: GET %s = %d %q, want %d containing %q", tc.path, code, body, tc.wantCode, tc.wantBody)
		}
	}
	if err := stop(); err != nil {
		t.Fatalf("Serve: %v", err)
	}
}

func TestServeDisabledEndpoints(t *testing.T) {
	cases := []struct {
		reason          string
		metrics, health bool   // which is enabled
		disabled        string // how the other is disabled
	}{
		{reason: "metrics disabled with 0", metrics: false, health: true, disabled: "0"},
		{reason: "metrics disabled with empty", metrics: false, health: true, disabled: ""},
		{reason: "probes disabled with 0", metrics: true, health: false, disabled: "0"},
		{reason: "probes disabled with empty", metrics: true, health: false, disabled: ""},
	}
	for _, tc := range cases {
		t.Run(tc.reason, func(t *testing.T) {
			addr := freeAddr(t)
			metricsAddr, healthAddr := tc.disabled, tc.disabled
			if tc.metrics {
				metricsAddr = addr
			}
			if tc.health {
				healthAddr = addr
			}
			var h Health
			h.SetReady("x", func() error { return nil })
			stop := startServe(t, metricsAddr, healthAddr, &h)
			waitServing(t, addr)
			wantMetrics, wantHealth := 404, 404
			if tc.metrics {
				wantMetrics = 200
			}
			if tc.health {
				wantHealth = 200
			}
			if code, _ := get(t, addr, "/metrics"); code != wantMetrics {
				t.Errorf("%s: /metrics = %d, want %d", tc.reason, code, wantMetrics)
			}
			if code, _ := get(t, addr, "/readyz"); code != wantHealth {
				t.Errorf("%s: /readyz = %d, want %d", tc.reason, code, wantHealth)
			}
			if err := stop(); err != nil {
				t.Fatalf("Serve: %v", err)
			}
		})
	}
}

func TestServeAllDisabledReturns(t *testing.T) {
	done := make(chan error, 1)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { done <- Serve(ctx, zap.NewNop(), "0", "", NewRegistry(), &Health{}) }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Serve with nothing to serve = %v, want nil", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Serve with nothing to serve did not return")
	}
}

func TestServeListenError(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = ln.Close() }()
	taken := ln.Addr().String()
	done := make(chan error, 1)
	go func() { done <- Serve(context.Background(), zap.NewNop(), taken, taken, NewRegistry(), &Health{}) }()
	select {
	case err := <-done:
		if err == nil || !strings.Contains(err.Error(), "listen on "+taken) {
			t.Fatalf("Serve on a taken address = %v, want a listen error naming %s", err, taken)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Serve on a taken address did not return")
	}
}

func TestServeReturnsOnCancelWithOpenConnection(t *testing.T) {
	// An idle keep-alive connection must not hold Serve up after cancel.
	addr := freeAddr(t)
	stop := startServe(t, addr, addr, &Health{})
	waitServing(t, addr)
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	c := &http.Client{Transport: tr, Timeout: 5 * time.Second}
	resp, err := c.Get("http://" + addr + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	_ = resp.Body.Close()
	begin := time.Now()
	if err := stop(); err != nil {
		t.Fatalf("Serve: %v", err)
	}
	if d := time.Since(begin); d > 3*time.Second {
		t.Errorf("Serve took %s to return after cancel", d)
	}
}
