// Package testbin builds the binaries a test process runs as processes
// once, however many of its tests run them: each link costs seconds of
// CPU, and linking the same binaries again per test only measures the
// linker.
package testbin

import (
	"os"
	"sync"
	"testing"
	"time"
)

// Once builds binaries once per test process, into a temporary directory
// that Remove deletes (from TestMain, after m.Run).
type Once struct {
	// What names the binaries in the log and in errors.
	What string
	// Build builds them into dir.
	Build func(dir string) error

	once sync.Once
	dir  string
	err  error
}

// Dir builds the binaries the first time it is called and returns the
// directory holding them; a failed build fails every test that asks.
func (o *Once) Dir(t testing.TB) string {
	t.Helper()
	o.once.Do(func() {
		if o.dir, o.err = os.MkdirTemp("", "testbin-"); o.err != nil {
			return
		}
		start := time.Now()
		if o.err = o.Build(o.dir); o.err == nil {
			t.Logf("built %s in %s", o.What, time.Since(start).Round(time.Millisecond))
		}
	})
	if o.err != nil {
		t.Fatalf("build %s: %v", o.What, o.err)
	}
	return o.dir
}

// Remove deletes the directory, if Dir made one.
func (o *Once) Remove() {
	if o.dir != "" {
		_ = os.RemoveAll(o.dir)
	}
}
