package main

import (
	"bytes"
	"context"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestFaultsShort is the fault suite on a short budget, as part of `make
// test`: 100 parents, 75s of churn with a SIGKILL of a random service every
// ~2.5s, two nats-server and one kube-apiserver SIGKILL+restart, and a
// misbehaving hook for 10% of the parents. It fails if any invariant is
// violated. The full run is `make faults` (2,000 parents, 5 minutes).
func TestFaultsShort(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the services, nats-server and a control plane")
	}
	cfg := defaultConfig()
	cfg.parents = 100
	cfg.faultPeriod = 75 * time.Second
	cfg.initialTimeout = 5 * time.Minute
	cfg.out = &lineWriter{t: t}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	start := time.Now()
	rep, err := run(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("fault suite took %s", time.Since(start).Round(time.Second))
	if rep.failed > 0 {
		t.Errorf("%d invariant(s) violated (see above; logs kept in %s)", rep.failed, rep.logDir)
	}
}

// lineWriter sends whole lines to t.Log.
type lineWriter struct {
	t   *testing.T
	mu  sync.Mutex
	buf bytes.Buffer
}

func (w *lineWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf.Write(p)
	for {
		line, err := w.buf.ReadString('\n')
		if err != nil {
			w.buf.WriteString(line)
			return len(p), nil
		}
		w.t.Log(strings.TrimRight(line, "\n"))
	}
}
